// CQ moderation (ibv_modify_cq with IBV_CQ_ATTR_MODERATE) and the arm decision it changes.
//
// Semantics, as mlx5 (the one provider with it) gives them: an armed CQ raises its event
// after cq_count CQEs that would fire it, or cq_period microseconds after the first of
// them, whichever comes first. Counting starts when the CQ is armed; the event resets it.
// A solicited-only arm is moderated too (mlx5 leaves the CQ context's
// scqe_break_moderation_en at 0: a solicited CQE does not break moderation); it counts the
// CQEs that fire it (solicited or in error). An error CQE fires at once: the QP behind it
// is dead, and a consumer waiting a period for it gains nothing. cq_count <= 1 or a period
// of 0 is no moderation (without a period a count alone could hold an event forever).
//
// The period is a timerfd per CQ in its channel's epoll set (core/event_queue.hpp): the
// channel fd becomes readable when it expires, and the waiter's refill (verbs/cq.cpp
// get_cq_event) calls cq_moderation_expire, which fires the held event. No thread, no
// spinning; an event is never lost, whoever sleeps on the channel fd.
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "core/completion_clock.hpp"
#include "core/core.hpp"

namespace softverbs {

namespace {

uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }

void set_timer(int fd, uint64_t at_ns) {
  itimerspec its{};
  its.it_value.tv_sec = static_cast<time_t>(at_ns / 1000000000u);
  its.it_value.tv_nsec = static_cast<long>(at_ns % 1000000000u);
  // at_ns 0 disarms it; disarming or setting also clears an expiry not yet read.
  (void)timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr);
}

}  // namespace

bool cq_disarm_locked(Cq* cq) {
  cq->armed.store(wire::kArmNone, std::memory_order_relaxed);
  // The event tells of everything in the ring now.
  cq->announced.store(cq->tail.load(std::memory_order_relaxed), std::memory_order_relaxed);
  cq->early_pending = false;
  cq->early_hint.store(false, std::memory_order_relaxed);
  cq->arm->store(wire::kArmNone, std::memory_order_relaxed);
  const bool held = cq->mod_pending != 0;
  cq->mod_pending = 0;
  cq->mod_deadline_ns.store(0, std::memory_order_relaxed);
  return held;
}

ArmStep cq_arm_step(Cq* cq, bool solicited, bool error) {
  const int cur = cq->armed.load(std::memory_order_relaxed);
  if (cur != wire::kArmNext && !(cur == wire::kArmSolicited && (solicited || error))) return {};
  // The early event the arm queued (req_notify_cq) becomes this completion's.
  if (cq->early_pending) return {false, cq_disarm_locked(cq)};
  const bool live = cq->channel != nullptr && !cq->destroying;
  if (live && cq->moderated && !error && ++cq->mod_pending < cq->mod_count) {
    if (cq->mod_pending > 1) return {};  // held; the deadline is already set
    cq->mod_first_ns = monotonic_ns();
    cq->mod_deadline_ns.store(cq->mod_first_ns + uint64_t{cq->mod_period_us} * 1000u,
                              std::memory_order_relaxed);
    return {false, true};
  }
  const bool held = cq_disarm_locked(cq);
  return {live, held};
}

void cq_moderation_sync_timer(Cq* cq) {
  // Whoever changed the deadline calls this after unlocking produce_mu; each applies the
  // deadline as it is now, in turn, so the last one leaves the timer as the deadline is.
  std::lock_guard<std::mutex> lock(cq->mod_timer_mu);
  if (cq->mod_timer_fd < 0) return;
  const uint64_t want = cq->mod_deadline_ns.load(std::memory_order_relaxed);
  if (want == cq->mod_timer_at.load(std::memory_order_relaxed)) return;
  set_timer(cq->mod_timer_fd, want);
  cq->mod_timer_at.store(want, std::memory_order_release);
  if (want == 0) return;  // the waiter drops it from `timed` when it next looks
  std::lock_guard<std::mutex> timed(cq->channel->timed_mu);
  if (!cq->timed) {
    cq->timed = true;
    cq->channel->timed.push_back(cq);
  }
}

bool cq_moderation_expire(Cq* cq, uint64_t now_ns) {
  uint64_t at = cq->mod_timer_at.load(std::memory_order_acquire);
  if (at == 0 || now_ns < at) return false;
  {
    // Expired (or about to be, by the kernel's slack): disarmed here rather than read, so
    // that it cannot become readable after we looked and keep the channel fd readable.
    std::lock_guard<std::mutex> lock(cq->mod_timer_mu);
    at = cq->mod_timer_at.load(std::memory_order_relaxed);
    if (at == 0 || now_ns < at) return false;
    set_timer(cq->mod_timer_fd, 0);
    cq->mod_timer_at.store(0, std::memory_order_relaxed);
  }
  bool fire = false;
  {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    const uint64_t due = cq->mod_deadline_ns.load(std::memory_order_relaxed);
    if (due != 0 && now_ns >= due) {
      fire = cq->channel != nullptr && !cq->destroying;
      cq_disarm_locked(cq);
    }
  }
  if (fire) cq->channel->events.push(cq);
  cq_moderation_sync_timer(cq);  // a deadline still ahead (the timer was set for an older one)
  return fire;
}

void cq_moderation_expire_due(CompChannel* ch) {
  std::vector<Cq*>& due = ch->timed_scratch;
  due.clear();
  {
    // Expired outside timed_mu: expiring may set a timer again (cq_moderation_sync_timer).
    std::lock_guard<std::mutex> lock(ch->timed_mu);
    for (size_t i = 0; i < ch->timed.size();) {
      Cq* cq = ch->timed[i];
      if (cq->mod_timer_at.load(std::memory_order_relaxed) != 0) {
        due.push_back(cq);
        ++i;
        continue;
      }
      cq->timed = false;
      ch->timed[i] = ch->timed.back();
      ch->timed.pop_back();
    }
  }
  if (due.empty()) return;
  const uint64_t now = monotonic_ns();
  for (Cq* cq : due) cq_moderation_expire(cq, now);
}

int cq_set_moderation(Cq* cq, uint16_t count, uint16_t period_us) {
  const bool want = count > 1 && period_us > 0 && cq->channel != nullptr;
  if (want) {
    std::lock_guard<std::mutex> lock(cq->mod_timer_mu);
    if (cq->mod_timer_fd < 0) {
      int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
      if (fd < 0) return errno;
      if (int err = cq->channel->events.watch(fd)) {
        ::close(fd);
        return err;
      }
      cq->mod_timer_fd = fd;
    }
  }
  bool fire = false;
  {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    cq->mod_count = count;
    cq->mod_period_us = period_us;
    cq->moderated = want;
    // Events held under the old setting: due now if the new one would not hold them.
    if (cq->mod_pending != 0) {
      if (!want || cq->mod_pending >= count) {
        fire = !cq->destroying;
        cq_disarm_locked(cq);
      } else {
        cq->mod_deadline_ns.store(cq->mod_first_ns + uint64_t{period_us} * 1000u,
                                  std::memory_order_relaxed);
      }
    }
  }
  if (fire) cq->channel->events.push(cq);
  cq_moderation_sync_timer(cq);
  return 0;
}

void cq_moderation_close(Cq* cq) {
  std::lock_guard<std::mutex> lock(cq->mod_timer_mu);
  if (cq->mod_timer_fd < 0) return;
  cq->channel->events.unwatch(cq->mod_timer_fd);
  ::close(cq->mod_timer_fd);
  cq->mod_timer_fd = -1;  // no cq_moderation_sync_timer puts it in `timed` again
  cq->mod_timer_at.store(0, std::memory_order_relaxed);
  std::lock_guard<std::mutex> timed(cq->channel->timed_mu);
  std::vector<Cq*>& list = cq->channel->timed;
  if (cq->timed) list.erase(std::find(list.begin(), list.end(), cq));
  cq->timed = false;
}

}  // namespace softverbs
