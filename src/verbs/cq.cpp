// Completion queues, completion channels and the notification machinery.
#include <cerrno>
#include <algorithm>
#include <cstring>

#include "common/full_fence.hpp"
#include "core/slot_table.hpp"
#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "core/device.hpp"
#include "verbs/verbs.hpp"
#include "wire/shm/arena.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {
uint64_t ring_size_for(uint64_t cqe) {
  uint64_t size = 2;
  while (size < cqe + 1) size <<= 1;
  return size;
}
}  // namespace

Cq* Cq::from(ibv_cq* c) {
  auto* cq = reinterpret_cast<Cq*>(c);
  return c && cq->magic == kCqMagic ? cq : nullptr;
}

CompChannel* CompChannel::from(ibv_comp_channel* c) {
  auto* ch = reinterpret_cast<CompChannel*>(c);
  return c && ch->magic == kChanMagic ? ch : nullptr;
}

ibv_comp_channel* create_comp_channel(Context* ctx) {
  auto* ch = new (std::nothrow) CompChannel{};
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  if (int err = ch->events.open()) {
    delete ch;
    errno = err;
    return nullptr;
  }
  ch->ctx = ctx;
  ch->ibv.context = ctx->ibv();
  ch->ibv.fd = ch->events.fd();
  ch->ibv.refcnt = 0;
  // The bits requesters set to say which CQ they woke us for go to the shared arena.
  if (wire::Arena* arena = wire::Arena::self()) {
    if (uint64_t off = arena->allocate(sizeof(wire::ReadyBits))) {
      ch->peer_ready_offset = off;
      ch->peer_ready = arena->at<wire::ReadyBits>(off);
    }
  }
  stat::publish(ch);
  return &ch->ibv;
}

int destroy_comp_channel(CompChannel* ch) {
  pthread_mutex_t* mu = &ch->ctx->ibv()->mutex;
  pthread_mutex_lock(mu);
  bool busy = ch->ibv.refcnt > 0;
  pthread_mutex_unlock(mu);
  if (busy) return EBUSY;
  // As a CQ's shared block (destroy_cq): a requester that still wrote here only costs the
  // next owner a look.
  if (ch->peer_ready_offset)
    if (wire::Arena* arena = wire::Arena::self())
      arena->release(ch->peer_ready_offset, sizeof(wire::ReadyBits));
  stat::withdraw(ch);
  ch->magic = kDead;
  delete ch;
  return 0;
}

ibv_cq* create_cq(Context* ctx, int cqe, void* cq_context, CompChannel* ch, int comp_vector) {
  if (cqe < 1 || cqe > device_limits().max_cqe || comp_vector < 0 ||
      comp_vector >= ctx->ibv()->num_comp_vectors || (ch && ch->ctx != ctx)) {
    errno = EINVAL;
    return nullptr;
  }
  if (!count_object(Counted::Cq)) {  // device_limits().max_cq
    errno = ENOMEM;
    return nullptr;
  }
  auto* cq = new (std::nothrow) Cq{};
  if (!cq) {
    uncount_object(Counted::Cq);
    errno = ENOMEM;
    return nullptr;
  }
  uint64_t size = ring_size_for(static_cast<uint64_t>(cqe));
  cq->ring.resize(size);
  cq->capacity = size - 1;
  cq->ctx = ctx;
  cq->channel = ch;
  ibv_cq* c = cq->cq();
  c->context = ctx->ibv();
  c->channel = ch ? &ch->ibv : nullptr;
  c->cq_context = cq_context;
  c->cqe = static_cast<int>(cq->capacity);
  pthread_mutex_init(&c->mutex, nullptr);
  pthread_cond_init(&c->cond, nullptr);
  if (ch) {
    pthread_mutex_lock(&ctx->ibv()->mutex);
    ch->ibv.refcnt++;
    pthread_mutex_unlock(&ctx->ibv()->mutex);
    std::lock_guard<std::mutex> lock(ch->cqs_mu);
    ch->cqs.push_back(cq);
    cq->channel_slot = slot_take(ch->by_slot, ch->free_slots, cq);
  }
  // The arm word goes to the shared arena, where requesters in other processes can see it.
  if (wire::Arena* arena = wire::Arena::self()) {
    if (uint64_t off = arena->allocate(sizeof(wire::CqShared))) {
      cq->shared_offset = off;
      cq->shared = arena->at<wire::CqShared>(off);
      cq->arm = &cq->shared->arm;
      cq->arm->store(wire::kArmNone);
      cq->shared->ready_bit = cq->channel_slot % wire::kReadyBits;
      cq->shared->ready_offset = ch ? ch->peer_ready_offset : 0;
    }
  }
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    ctx->cqs.insert(cq);
  }
  stat::publish(cq);
  return c;
}

int resize_cq(Cq* cq, int cqe) {
  if (cqe < 1 || cqe > device_limits().max_cqe) return EINVAL;
  std::lock_guard<SpinLock> p(cq->produce_mu);
  std::lock_guard<SpinLock> c(cq->consume_mu);
  uint64_t head = cq->head.load(), tail = cq->tail.load();
  uint64_t used = tail - head;
  uint64_t size = ring_size_for(static_cast<uint64_t>(cqe));
  // ibv_resize_cq(3): the request itself must hold the unpolled completions.
  if (static_cast<uint64_t>(cqe) < used) return EINVAL;
  std::vector<ibv_wc> ring(size);
  std::vector<CqeStamp> stamps(cq->stamp_kinds ? size : 0);
  uint64_t old_mask = cq->ring.size() - 1;
  for (uint64_t i = 0; i < used; ++i) {
    ring[i] = cq->ring[(head + i) & old_mask];
    if (cq->stamp_kinds) stamps[i] = cq->stamps[(head + i) & old_mask];
  }
  cq->ring.swap(ring);
  cq->stamps.swap(stamps);
  cq->capacity = size - 1;
  cq->head.store(0);
  cq->tail.store(used);
  const uint64_t announced = cq->announced.load(std::memory_order_relaxed);
  cq->announced.store(announced > head ? std::min(announced - head, used) : 0,
                      std::memory_order_relaxed);
  cq->cq()->cqe = static_cast<int>(cq->capacity);
  return 0;
}

int destroy_cq(Cq* cq) {
  if (cq->users.load() != 0) return EBUSY;
  {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    cq->destroying = true;
    cq->armed.store(wire::kArmNone);
    cq->arm->store(wire::kArmNone);
  }
  if (CompChannel* ch = cq->channel) {
    std::lock_guard<std::mutex> lock(ch->cqs_mu);  // no waiter's refill reaches the CQ after
    ch->cqs.erase(std::remove(ch->cqs.begin(), ch->cqs.end(), cq), ch->cqs.end());
    slot_give_back(ch->by_slot, ch->free_slots, cq->channel_slot);
    if (cq->roce_fed.load()) ch->wire_cqs--;
    cq_moderation_close(cq);
  }
  // Events not yet handed out vanish; those handed out must be acked first.
  if (cq->channel) cq->channel->events.remove_if([cq](Cq* c) { return c == cq; });
  drop_async_events_of(cq->ctx, EventElement::Cq, cq->cq());
  ibv_cq* c = cq->cq();
  wait_acked(&c->mutex, &c->cond, &c->comp_events_completed, &cq->comp_events_reported);
  wait_acked(&c->mutex, &c->cond, &c->async_events_completed, &cq->async_events_reported);
  {
    std::lock_guard<std::mutex> lock(cq->ctx->objects_mu);
    cq->ctx->cqs.erase(cq);
  }
  if (CompChannel* ch = cq->channel) {
    pthread_mutex_lock(&cq->ctx->ibv()->mutex);
    ch->ibv.refcnt--;
    pthread_mutex_unlock(&cq->ctx->ibv()->mutex);
  }
  pthread_mutex_destroy(&c->mutex);
  pthread_cond_destroy(&c->cond);
  // The shared block goes back to the arena. A peer that still held its address (its QPs
  // are gone, so an honest one does not) can only ring the doorbell or rung bits, or read
  // the arm word, of the next CQ there: a spurious drain or wake-up, or (a stale leaf bit
  // that keeps an honest requester from setting its summary bit) a message found at the
  // next look at every window; never a lost event (Cq::armed).
  engine::rung_release(cq);
  if (cq->shared_offset)
    if (wire::Arena* arena = wire::Arena::self()) arena->release(cq->shared_offset, sizeof(wire::CqShared));
  stat::withdraw(cq);
  cq->magic = kDead;
  delete cq;
  uncount_object(Counted::Cq);
  return 0;
}

namespace {

enum class Inbound { None, Solo, Rang };

// Looks between two looks at every window of a CQ fed by several (~1-2 ms of a polling
// loop): how long a message whose rung bit a peer cleared can wait. Never, with
// SOFTVERBS_TEST_NO_QUIET_LOOKS (conformance.twoproc_many_windows: a lost bit hangs it).
uint32_t full_look_every() {
  static const uint32_t n = getenv("SOFTVERBS_TEST_NO_QUIET_LOOKS") ? UINT32_MAX : 1u << 16;
  return n;
}

// Whether messages wait in cq's receive windows, as ibv_poll_cq asks it: the one window's
// next slot, or the line of the CQ's doorbell and rung bits (wire::CqShared).
Inbound inbound_waiting(Cq* cq) {
  if (!cq->has_inbound.load(std::memory_order_relaxed)) return Inbound::None;
  if (const wire::WindowSlot* slots = cq->solo_slots.load(std::memory_order_acquire)) {
    uint64_t head = cq->solo_head.load(std::memory_order_acquire)->load(std::memory_order_relaxed);
    return slots[head % wire::kWindowSlots].seq.load(std::memory_order_acquire) == head + 1
               ? Inbound::Solo
               : Inbound::None;
  }
  // Every so many looks, busy or not, a look at every window: a peer may have cleared the
  // bit of a message (garbage) and keep others set. Counted without a lock-prefixed
  // instruction; a lost count only delays it.
  const uint32_t looks = cq->looks_since_full.load(std::memory_order_relaxed) + 1;
  cq->looks_since_full.store(looks, std::memory_order_relaxed);
  if (looks >= full_look_every()) {
    cq->look_all.store(true, std::memory_order_relaxed);
    return Inbound::Rang;
  }
  if (engine::rung_any(cq) || cq->look_all.load(std::memory_order_relaxed) ||
      cq->shared->doorbell.load(std::memory_order_acquire) != cq->doorbell_seen.load(std::memory_order_relaxed))
    return Inbound::Rang;
  return Inbound::None;
}

// Messages that peers left in receive windows become completions now (they ring the CQ
// after each one, so an idle CQ costs one more line), `what` from inbound_waiting. With
// `wc` (ibv_poll_cq's array), a CQ fed by one window may land them straight in it:
// returns how many did.
int take(Cq* cq, Inbound what, int max, ibv_wc* wc) {
  switch (what) {
    case Inbound::None:
      return 0;
    case Inbound::Solo:
      if (wc && max > 0)
        if (int n = engine::drain_solo_into(cq, max, wc)) return n;
      break;
    case Inbound::Rang:
      // The windows whose bits are set (and every one, when the doorbell or a look owed
      // says so).
      engine::drain_inbound(cq, false);
      return 0;
  }
  engine::drain_inbound(cq, true);
  return 0;
}

int take_inbound(Cq* cq, int max, ibv_wc* wc) { return take(cq, inbound_waiting(cq), max, wc); }

// The ring's tail, after packets from the wire were received here when the ring is empty
// and the caller wants completions (`want`).
uint64_t take_wire(Cq* cq, bool want) {
  // An empty CQ costs one shared load (tail) and one private one (head).
  uint64_t tail = cq->tail.load(std::memory_order_acquire);
  const bool roce = want && cq->roce_fed.load(std::memory_order_relaxed);
  if (roce && tail == cq->head.load(std::memory_order_relaxed) && engine::roce_poll())
    tail = cq->tail.load(std::memory_order_acquire);  // packets from the wire, received here
  // Frames for raw packet QPs, taken here rather than by the receiver thread (raw_packet.cpp).
  if (want && cq->raw_fed.load(std::memory_order_relaxed) &&
      tail == cq->head.load(std::memory_order_relaxed) && engine::raw_receiving() && engine::raw_poll())
    tail = cq->tail.load(std::memory_order_acquire);
  if (roce) engine::roce_poll_result(cq, tail != cq->head.load(std::memory_order_relaxed));
  else engine::roce_flush_held();  // not a CQ of the wire: the application moved on
  return tail;
}

// Armed for the next completion, with completions unpolled that no event told of: exact
// under cq->produce_mu, a hint without it.
bool unannounced(Cq* cq) {
  if (cq->armed.load(std::memory_order_relaxed) != wire::kArmNext) return false;
  const uint64_t seen = std::max(cq->head.load(std::memory_order_acquire),
                                 cq->announced.load(std::memory_order_relaxed));
  return cq->tail.load(std::memory_order_acquire) > seen;
}

// Arming a CQ that holds unpolled completions no event told of (they came while it was not
// armed, after its last event) queues its event at once, an early one: the channel's fd
// is readable, the CQ stays armed. NICs whose arm carries the consumer index (mlx4, mlx5)
// fire at once then, and programs rely on it: UCX takes an event, polls less than it
// brought (or nothing), arms and sleeps in its own epoll (ucx_perftest -E sleep hung;
// interop.twoproc.ucx.ud.tag_lat.sleep). A program that polls the CQ empty before it
// takes the event gets no event (take_back_early): ibv_rc_pingpong -e -t, which arms and
// then polls, takes an event with nothing behind it for an error.
void queue_early_event(Cq* cq) {
  CompChannel* ch = cq->channel;
  if (!ch || !unannounced(cq)) return;  // the common case, without a lock
  ch->events.push_if(cq, [cq] {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    // (Moderation holding an event back already tells of them, when its time comes.)
    if (cq->early_pending || cq->destroying || cq->mod_pending != 0 || !unannounced(cq))
      return false;
    cq->early_pending = true;
    cq->early_hint.store(true, std::memory_order_relaxed);
    return true;
  });
}

// After a poll: a CQ polled empty takes its early event back, if it is still queued.
void take_back_early(Cq* cq) {
  if (!cq->early_hint.load(std::memory_order_relaxed) ||
      cq->tail.load(std::memory_order_acquire) != cq->head.load(std::memory_order_relaxed))
    return;
  cq->channel->events.take_back_if(cq, [cq] {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    if (!cq->early_pending ||
        cq->tail.load(std::memory_order_acquire) != cq->head.load(std::memory_order_relaxed))
      return false;
    cq->early_pending = false;
    cq->early_hint.store(false, std::memory_order_relaxed);
    return true;
  });
}

}  // namespace

void cq_polled(Cq* cq) { take_back_early(cq); }

uint64_t cq_gather(Cq* cq) {
  take_inbound(cq, 0, nullptr);
  return take_wire(cq, true);
}

int poll_cq(Cq* cq, int num_entries, ibv_wc* wc) {
  if (int n = take_inbound(cq, num_entries, wc)) {
    take_back_early(cq);
    return n;
  }
  uint64_t tail = take_wire(cq, num_entries > 0);
  if (tail == cq->head.load(std::memory_order_relaxed) || num_entries <= 0) {
    if (num_entries < 0) return -1;
    take_back_early(cq);
    return cq->in_error.load(std::memory_order_relaxed) ? -1 : 0;
  }
  int n = 0;
  {
    std::lock_guard<SpinLock> lock(cq->consume_mu);
    uint64_t head = cq->head.load(std::memory_order_relaxed);
    tail = cq->tail.load(std::memory_order_acquire);
    uint64_t mask = cq->ring.size() - 1;
    while (n < num_entries && head != tail) wc[n++] = cq->ring[head++ & mask];
    cq->head.store(head, std::memory_order_release);
  }
  take_back_early(cq);
  return n;
}

int req_notify_cq(Cq* cq, int solicited_only) {
  // About to sleep until an event: the port's thread must receive the wire's packets again.
  if (cq->roce_fed.load(std::memory_order_relaxed)) engine::roce_poll_stop();
  else engine::roce_flush_held();
  if (cq->raw_fed.load(std::memory_order_relaxed)) engine::raw_poll_stop();
  {
    std::lock_guard<SpinLock> lock(cq->produce_mu);
    if (cq->in_error.load()) return EINVAL;
    int want = solicited_only ? wire::kArmSolicited : wire::kArmNext;
    // "Next completion" is the stronger request; a later solicited-only arm does not weaken it.
    int armed = std::max(cq->armed.load(std::memory_order_relaxed), want);
    cq->armed.store(armed, std::memory_order_relaxed);
    // Published (again, whatever a peer wrote there) before the caller looks for work and
    // sleeps: a requester rings the CQ (wire::ring_cq), then reads this word, so either it
    // sees us armed and wakes us, or our drain below sees its message.
    cq->arm->store(armed, std::memory_order_seq_cst);
    // And the fence that pairs with the requester's (wire::ring_cq) in the C++ model: our
    // later relaxed reads of the rung words and slots see its message, or it sees the arm.
    full_fence();
    // Messages that came before the arm woke nobody: a waiter in ibv_get_cq_event looks
    // (after the arm, so any message it misses finds the CQ armed and wakes it).
    if (CompChannel* ch = cq->channel) wire::ready_set(ch->looks, cq->channel_slot);
  }
  // A program may instead sleep in its own poll/epoll on the channel's fd without polling
  // the CQ after arming, as UCX does (ucp_worker_wait): the messages that came before the
  // arm become completions now, so the armed CQ's event makes the fd readable. Otherwise
  // such a message waited in its window with both sides asleep (ucx_perftest -E sleep
  // hung; conformance.twoproc_epoll_arm).
  take_inbound(cq, 0, nullptr);
  queue_early_event(cq);
  return 0;
}


namespace {

// A waiter's look at CQ c of ch (caller holds ch->cqs_mu, and took c's bits): the CQ's
// own check, as ibv_poll_cq makes it (one load when nothing came). Returns whether
// messages were waiting.
bool look_at(CompChannel* ch, Cq* c) {
  const Inbound what = inbound_waiting(c);
  if (what == Inbound::None) return false;
  take(c, what, 0, nullptr);
  // Messages left (completions held back come first, or too many windows at once): looked
  // at again at the next wake-up, as when every CQ was.
  if (inbound_waiting(c) != Inbound::None) wire::ready_set(ch->looks, c->channel_slot);
  return true;
}

uint64_t take_word(std::atomic<uint64_t>& w) {
  return w.load(std::memory_order_relaxed) ? w.exchange(0, std::memory_order_seq_cst) : 0;
}

// Before a waiter on `ch` sleeps (caller holds ch->cqs_mu), after `wakeups` from peers:
// looks at the CQs whose bits are set, in ours and the peers' ReadyBits, not at every CQ
// (issue 14: with 1,000 CQs on a channel that was most of the CPU of an event). Each bit
// a requester sets (0 -> 1) comes with one wake-up, before or after we take it, for a CQ
// with a message: more wake-ups than bits that led to messages (a peer wiped or moved
// bits, or has none to set) and every CQ is looked at.
void look_at_ready(CompChannel* ch, uint64_t wakeups) {
  constexpr uint32_t kWords = wire::kReadyBits / 64;
  // Bits that led to messages whose wake-ups are still to come: as many as requesters can
  // be between their bit and their write; beyond that it is garbage.
  constexpr uint64_t kMaxCredit = 64;
  uint64_t ours[kWords], theirs[kWords];
  for (uint32_t w = 0; w < kWords; ++w) {
    ours[w] = take_word(ch->looks.words[w]);
    theirs[w] = ch->peer_ready ? take_word(ch->peer_ready->words[w]) : 0;
  }
  // Taken, then looked at (seq_cst): a requester that found its bit set before we took it
  // left its message to this look.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t found = 0;
  for (uint32_t w = 0; w < kWords; ++w) {
    for (uint64_t b = ours[w] | theirs[w]; b; b &= b - 1) {
      const uint32_t bit = w * 64 + static_cast<uint32_t>(__builtin_ctzll(b));
      bool news = false;
      // A bit stands for every slot with its number modulo kReadyBits.
      for (size_t slot = bit; slot < ch->by_slot.size(); slot += wire::kReadyBits)
        if (Cq* c = ch->by_slot[slot]) news |= look_at(ch, c);
      if (news && (theirs[w] & (b & -b))) ++found;
    }
  }
  ch->ready_credit = std::min(ch->ready_credit + found, kMaxCredit);
  if (wakeups <= ch->ready_credit) {
    ch->ready_credit -= wakeups;
    return;
  }
  ch->ready_credit = 0;
  // Each CQ's every window too: a peer that wiped bits here may have wiped rung bits.
  for (Cq* c : ch->cqs) {
    if (c->has_inbound.load(std::memory_order_relaxed)) c->look_all.store(true, std::memory_order_relaxed);
    look_at(ch, c);
  }
}

}  // namespace

int get_cq_event(CompChannel* ch, ibv_cq** out_cq, void** out_context) {
  engine::roce_flush_held();  // may sleep: no ACK waits for this thread
  Cq* cq = nullptr;
  auto deliver = [ch](Cq* c) {
    bool sync_timer = false;
    // An early event handed out is the CQ's event: the arm is spent. An older event of the
    // CQ's may come out first (it was still queued when the CQ was armed again): then the
    // one left is the early one, still taken back by a poll that empties the CQ.
    if (c->early_hint.load(std::memory_order_relaxed) && !ch->events.queued_locked(c)) {
      std::lock_guard<SpinLock> lock(c->produce_mu);
      if (c->early_pending) sync_timer = cq_disarm_locked(c);
    }
    pthread_mutex_lock(&c->cq()->mutex);
    c->comp_events_reported++;
    pthread_mutex_unlock(&c->cq()->mutex);
    if (sync_timer) cq_moderation_sync_timer(c);
  };
  // A peer that finds one of our CQs armed after leaving a message in a receive window
  // wakes this channel directly: the messages become completions (and events) here.
  // a CQ of the channel is fed by QPs on the wire
  const bool wire = ch->wire_cqs.load(std::memory_order_relaxed) > 0;
  auto refill = [ch, wire](uint64_t wakeups) {
    {
      std::lock_guard<std::mutex> lock(ch->cqs_mu);
      look_at_ready(ch, wakeups);
      // Events that moderation held and whose period is over (their timerfd woke us).
      cq_moderation_expire_due(ch);
    }
    // Packets from the wire become completions (and the armed CQs' events) here.
    if (wire) engine::roce_poll(false);  // ACKs at once: this thread may sleep next
  };
  // Asleep, this thread also waits on the port's socket and receives what wakes it: one
  // wake-up per message instead of the port thread's and then this one.
  SleepAlso also;
  if (wire) also = {engine::roce_wait_fd(), &engine::roce_wait_begin, &engine::roce_wait_end};
  int rc = ch->events.wait_pop(&cq, deliver, refill, also);
  if (rc != 0) return rc;
  *out_cq = cq->cq();
  *out_context = cq->cq()->cq_context;
  return 0;
}

void ack_cq_events(Cq* cq, unsigned int nevents) {
  ibv_cq* c = cq->cq();
  pthread_mutex_lock(&c->mutex);
  c->comp_events_completed += nevents;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mutex);
}

}  // namespace softverbs
