// A CQ's ring from the producers' side: completions in, the arm state, the one-shot event.
#include <mutex>
#include <vector>

#include "common/fast_tls.hpp"
#include "core/check_hooks.hpp"
#include "core/completion_clock.hpp"
#include "core/core.hpp"

namespace softverbs {

namespace {
void (*g_overrun)(Cq* cq, bool first) = nullptr;
}  // namespace

void set_cq_overrun_handler(void (*handler)(Cq* cq, bool first)) { g_overrun = handler; }

namespace {
struct DeferredCqe {
  Cq* cq;
  ibv_wc wc;
  bool solicited;
  CqeStamp stamp;  // taken when it was generated, not when it is let through
};
// Read on every completion: initial-exec (common/fast_tls.hpp).
SV_FAST_TLS std::vector<DeferredCqe>* t_deferred = nullptr;

CqeStamp take_stamp(unsigned kinds) {
  CqeStamp s;
  if (kinds & CqeStamp::kRaw) s.raw = completion_clock_now();
  if (kinds & CqeStamp::kWall) s.wall = wallclock_now_ns();
  return s;
}

// `held`: the stamp of a completion that was held back (defer_completions), else nullptr:
// it is taken here, under the lock, so that stamps follow the ring's order.
bool push_now(Cq* cq, const ibv_wc& wc, bool solicited, const CqeStamp* held,
              const ibv_wc_tm_info* tm, uint32_t flow_tag) {
  bool failed = false, first_failure = false;
  ArmStep step;
  {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    uint64_t tail = cq->tail.load(std::memory_order_relaxed);
    uint64_t head = cq->head.load(std::memory_order_acquire);
    if (cq->in_error.load(std::memory_order_relaxed)) {
      failed = true;
    } else if (tail - head >= cq->capacity) {
      // IGNORE_OVERRUN: the CQ stays usable and the completion is lost, as on a NIC that
      // was told not to check (what is already queued is not overwritten).
      if (cq->ignore_overrun) return false;
      cq->in_error.store(true);
      failed = first_failure = true;
    } else {
      const uint64_t slot = tail & (cq->ring.size() - 1);
      cq->ring[slot] = wc;
      if (cq->stamp_kinds) {
        CqeStamp stamp = held ? *held : take_stamp(cq->stamp_kinds);
        if (!held) {
          stamp.tm = tm ? *tm : ibv_wc_tm_info{};
          stamp.flow_tag = flow_tag;
        }
        // A held-back completion was generated before others that went in meanwhile: its
        // raw stamp is raised to theirs, so that completion_ts never goes back in a CQ.
        if (stamp.raw < cq->last_raw) stamp.raw = cq->last_raw;
        cq->last_raw = stamp.raw;
        cq->stamps[slot] = stamp;
      }
      cq->tail.store(tail + 1, std::memory_order_release);
      step = cq_arm_step(cq, solicited, wc.status != IBV_WC_SUCCESS);
    }
  }
  if (failed) {
    if (first_failure && check_hooks::cq_overrun) check_hooks::cq_overrun(cq);
    if (g_overrun) g_overrun(cq, first_failure);
    return false;
  }
  if (step.fire) cq->channel->events.push(cq);
  if (step.sync_timer) cq_moderation_sync_timer(cq);
  return true;
}

}  // namespace

void defer_completions(bool on) {
  static thread_local std::vector<DeferredCqe> held;
  if (on) {
    held.clear();
    t_deferred = &held;
    return;
  }
  t_deferred = nullptr;
  for (const DeferredCqe& d : held) {
    push_now(d.cq, d.wc, d.solicited, &d.stamp, nullptr, 0);
    d.cq->held_back.fetch_sub(1, std::memory_order_release);
  }
  held.clear();
}

bool completions_deferred() { return t_deferred != nullptr; }

bool cq_push(Cq* cq, const ibv_wc& wc, bool solicited, const ibv_wc_tm_info* tm, uint32_t flow_tag) {
  if (t_deferred) {
    cq->held_back.fetch_add(1, std::memory_order_relaxed);
    CqeStamp stamp;
    if (cq->stamp_kinds) stamp = take_stamp(cq->stamp_kinds);
    if (tm) stamp.tm = *tm;
    stamp.flow_tag = flow_tag;
    t_deferred->push_back({cq, wc, solicited, stamp});
    return true;
  }
  return push_now(cq, wc, solicited, nullptr, tm, flow_tag);
}

void cq_purge_qp(Cq* cq, uint32_t qpn) {
  std::lock_guard<SpinLock> p(cq->produce_mu);
  std::lock_guard<SpinLock> c(cq->consume_mu);
  uint64_t head = cq->head.load(), tail = cq->tail.load();
  uint64_t mask = cq->ring.size() - 1;
  uint64_t kept = head;
  // The last event told of the ring up to `announced`: after the purge, of what is kept of
  // that part (else completions that come later would pass for told of).
  const uint64_t announced = cq->announced.load(std::memory_order_relaxed);
  uint64_t now_announced = announced;
  for (uint64_t i = head; i != tail; ++i) {
    if (i == announced) now_announced = kept;
    const ibv_wc& wc = cq->ring[i & mask];
    if (wc.qp_num == qpn) continue;
    if (cq->stamp_kinds) cq->stamps[kept & mask] = cq->stamps[i & mask];
    cq->ring[kept++ & mask] = wc;
  }
  if (announced - head >= tail - head) now_announced = announced > head ? kept : announced;
  cq->announced.store(now_announced, std::memory_order_relaxed);
  cq->tail.store(kept, std::memory_order_release);
}

}  // namespace softverbs
