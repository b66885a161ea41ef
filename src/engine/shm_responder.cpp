// The responder's same-host part: receive windows (wire/shm/window.hpp), target side.
// Opening one for the connected peer in another process, publishing posted receives, and
// draining what the peer left in it into the posted buffers, with the same receive
// completions the responder writes.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "engine/engine.hpp"
#include "core/device.hpp"
#include "core/core.hpp"
#include "wire/shm/arena.hpp"
#include "wire/registry.hpp"

namespace softverbs::engine {

namespace {

uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

void inbound_add_locked(Cq* cq, Qp* t) {
  if (t->inbound_pos != SIZE_MAX) return;
  t->inbound_pos = cq->inbound.size();
  cq->inbound.push_back(t);
}

void inbound_remove_locked(Cq* cq, Qp* t) {
  const size_t at = t->inbound_pos;
  if (at >= cq->inbound.size() || cq->inbound[at] != t) return;
  Qp* last = cq->inbound.back();
  cq->inbound[at] = last;
  last->inbound_pos = at;
  cq->inbound.pop_back();
  t->inbound_pos = SIZE_MAX;
}

// Under cq->inbound_mu, after its list changed: watch the one window's slot, or the doorbell.
void update_solo_locked(Cq* cq) {
  cq->has_inbound.store(!cq->inbound.empty());
  cq->solo_slots.store(nullptr, std::memory_order_release);
  if (cq->inbound.size() != 1) return;
  Qp* qp = cq->inbound.front();
  if (qp->type == IBV_QPT_UD) {  // a UD QP with one window (shm_ud.cpp)
    const wire::WindowSlot* slots = qp->ud_solo_slots.load(std::memory_order_acquire);
    const std::atomic<uint64_t>* head = qp->ud_solo_head.load(std::memory_order_acquire);
    if (!slots || !head) return;
    cq->solo_head.store(head, std::memory_order_release);
    cq->solo_slots.store(slots, std::memory_order_release);
    return;
  }
  wire::WindowHeader* hdr = qp->window.load(std::memory_order_acquire);
  const wire::WindowSlot* slots = qp->window_slots.load(std::memory_order_acquire);
  if (!hdr || !slots) return;
  cq->solo_head.store(&hdr->head, std::memory_order_release);
  cq->solo_slots.store(slots, std::memory_order_release);
}

namespace {

// Stops the window: the requester sees `live` drop and goes through the agent from now on.
void kill_window_locked(Qp* t) {
  wire::WindowHeader* hdr = t->window.load(std::memory_order_relaxed);
  if (!hdr) return;
  hdr->live.store(0, std::memory_order_release);
  t->window.store(nullptr, std::memory_order_relaxed);
  t->window_slots.store(nullptr, std::memory_order_relaxed);
}

// Whether a receive lands in an on-demand-paging MR (caller holds the key lock).
bool any_on_demand(const RecvWqe& r) {
  for (const Sge& s : r.sges) {
    const Mr* mr = MrTable::instance().find(s.lkey);
    if (mr && (mr->access & IBV_ACCESS_ON_DEMAND)) return true;
  }
  return false;
}

}  // namespace

uint32_t receive_capacity(Qp* t, RecvWqe& r) {
  iovec dst[Limits::max_sge];
  int n;
  int64_t cap = resolve_recv(t, r, dst, &n);
  r.place = nullptr;
  if (cap < 0) return 0;
  // An ODP buffer is resolved (its pages faulted in) again when the message lands.
  if (n == 1 && !any_on_demand(r)) {
    r.place = dst[0].iov_base;
    r.place_len = static_cast<uint32_t>(dst[0].iov_len);
    r.place_changes = MrTable::instance().changes();
  }
  return static_cast<uint32_t>(std::min<int64_t>(cap, UINT32_MAX));
}

uint64_t open_window(Qp* t, uint32_t peer_qpn, pid_t peer_pid) {
  if (t->type == IBV_QPT_UD) return open_ud_window(t, peer_qpn, peer_pid);  // shm_ud.cpp
  // ---- responder faults of `softverbs inject`: every request must reach the responder
  if (debug_hooks_armed() && t->debug.responder_faults()) return 0;
  // ---- end responder faults
  wire::Arena* arena = wire::Arena::self();
  // A basic SRQ's QP too (its receives claimed through wire::SrqShared); a tag-matching
  // SRQ matches in its own process.
  Srq* srq = t->srq;
  if (!arena || (srq && (srq->tm || srq->xrc_domain)) ||
      (t->type != IBV_QPT_RC && t->type != IBV_QPT_UC) || !t->recv_cq->shared_offset)
    return 0;
  {
    std::lock_guard<std::mutex> lock(t->attr_mu);
    if (t->attr.dest_qp_num != peer_qpn) return 0;
  }
  // Already open? (Checked again below, under the key lock: keys before queues.)
  {
    std::lock_guard<QueueMutex> lock(t->rq_mu);
    if (wire::WindowHeader* w = t->window.load(std::memory_order_relaxed))
      return reinterpret_cast<char*>(w) - arena->base();
  }
  uint64_t mr_table = MrTable::instance().shared_offset();  // before locking the keys
  rung_prepare(t->recv_cq);  // before any lock: it may allocate
  // Twice the queue depth: the entry we write for a new receive is then half a ring away
  // from the one the requester reads next, not on the same cache line.
  // (A QP of an SRQ publishes no receives of its own: the smallest block.)
  uint32_t rq_cap = srq ? 2 : 2 * round_up_pow2(std::max<uint32_t>(t->cap.max_recv_wr, 1));
  uint64_t bytes = wire::window_bytes(rq_cap);
  uint64_t off = arena->allocate(bytes);
  if (!off) return 0;
  auto* hdr = arena->at<wire::WindowHeader>(off);
  std::shared_lock keys(MrTable::instance().lock());
  std::lock_guard<QueueMutex> lock(t->rq_mu);
  int st = t->state.load();
  if (wire::WindowHeader* w = t->window.load(std::memory_order_relaxed)) {
    arena->release(off, bytes);
    return reinterpret_cast<char*>(w) - arena->base();
  }
  if (st < IBV_QPS_RTR || st > IBV_QPS_SQD) {
    arena->release(off, bytes);
    return 0;
  }
  hdr->magic = wire::kWindowMagic;
  hdr->qpn = t->qpn();
  hdr->peer_qpn = peer_qpn;
  hdr->cq_offset = t->recv_cq->shared_offset;
  uint32_t claimer = 0;
  if (srq) {
    std::lock_guard<QueueMutex> srq_lock(srq->mu);
    hdr->srq_offset = srq_shared_locked(srq, arena);
    hdr->srq_claimer = claimer = srq_new_claimer_locked(srq);
    if (!hdr->srq_offset || !claimer) {
      arena->release(off, bytes);
      return 0;
    }
  }
  {
    std::lock_guard<std::mutex> attrs(t->attr_mu);
    hdr->qp_access.store(t->attr.qp_access_flags, std::memory_order_relaxed);
    hdr->max_dest_rd_atomic = t->attr.max_dest_rd_atomic;
  }
  hdr->pd_token = reinterpret_cast<uint64_t>(t->pd->prot);
  hdr->mr_table_offset = mr_table;
  hdr->mr_table_cap = mr_table ? wire::kMrTableCap : 0;
  hdr->owner_pid = wire::self_pid();
  hdr->rq_cap = rq_cap;
  hdr->slots_offset = static_cast<uint32_t>(bytes - uint64_t{wire::kWindowSlots} * sizeof(wire::WindowSlot));
  uint64_t i = 0;
  t->inbound = {hdr->slots(), hdr->rq_len(), rq_cap, peer_qpn, 0, 0, off, bytes, peer_pid, claimer};
  for (; i < t->rq.size(); ++i) {
    uint32_t cap = receive_capacity(t, t->rq[i]);
    hdr->rq_len()[i & (rq_cap - 1)] = cap;
    publish_place(wire::window_places(hdr, rq_cap)[i & (rq_cap - 1)], t->rq[i], cap);
  }
  t->inbound.posted = i;
  hdr->rq_posted.store(i, std::memory_order_relaxed);
  hdr->rq_taken.store(0, std::memory_order_relaxed);
  hdr->head.store(0, std::memory_order_relaxed);
  // The slots' seq words are 0 already (Arena::allocate gives zeros): storing them would
  // touch every slot's page, 132 KiB of shared memory per window before any message.
  hdr->live.store(1, std::memory_order_release);
  t->window_slots.store(hdr->slots(), std::memory_order_release);
  t->window.store(hdr, std::memory_order_release);
  {
    std::lock_guard<SpinLock> inbound(t->recv_cq->inbound_mu);
    inbound_add_locked(t->recv_cq, t);  // once, if reopened
    hdr->rung_index = rung_attach_locked(t->recv_cq, t);
    update_solo_locked(t->recv_cq);
  }
  return off;
}

void publish_receive_locked(Qp* t, const RecvWqe& r, uint32_t capacity) {
  wire::WindowHeader* hdr = t->window.load(std::memory_order_relaxed);
  if (!hdr) return;
  wire::InboundWindow& in = t->inbound;
  in.rq_len[in.posted & (in.rq_cap - 1)] = capacity;
  publish_place(wire::window_places(hdr, in.rq_cap)[in.posted & (in.rq_cap - 1)], r, capacity);
  hdr->rq_posted.store(++in.posted, std::memory_order_release);
}

namespace {

// Where drained messages' completions go: the CQ's ring, or straight into ibv_poll_cq's
// array (ToArray stops taking messages when the array is full). A completion is built in
// next() and handed over by put().
struct ToCq {
  Cq* cq;
  ibv_wc wc;
  bool room() const { return true; }
  // After the agent's held-back completions (defer_completions), unless we are that agent,
  // whose list keeps the order.
  static bool in_order(Cq* c) {
    return c->held_back.load(std::memory_order_acquire) == 0 || completions_deferred();
  }
  ibv_wc& next() { return wc = {}; }
  void put(bool solicited) { cq_push(cq, wc, solicited); }
};
struct ToArray {
  ibv_wc* wc;
  int max;
  int n = 0;
  bool room() const { return n < max; }
  // Straight into the caller's array only when nothing is held back or in the ring.
  static bool in_order(Cq* c) {
    return c->held_back.load(std::memory_order_acquire) == 0 &&
           c->tail.load(std::memory_order_acquire) == c->head.load(std::memory_order_relaxed);
  }
  ibv_wc& next() { return wc[n] = {}; }
  void put(bool) { ++n; }
};

// Lands the messages waiting in t's window in its posted receives, in order. Caller holds
// the key lock (shared) and t->rq_mu.
template <class Sink>
void drain_window_into(Qp* t, Sink& sink) {
  wire::WindowHeader* hdr = t->window.load(std::memory_order_relaxed);
  if (!hdr) return;
  wire::InboundWindow& in = t->inbound;
  // A QP of an SRQ: each message lands in the SRQ receive its sender claimed (its number
  // in the slot's `receive`, srq_claims.cpp).
  Srq* srq = t->srq;
  std::unique_lock<QueueMutex> srq_lock;
  if (srq) srq_lock = std::unique_lock<QueueMutex>(srq->mu);
  // Message #head is there once its slot's seq says head + 1: stop at the first that is not.
  for (uint64_t head = in.head; sink.room(); ++head) {
    const wire::WindowSlot& slot = in.slots[head % wire::kWindowSlots];
    if (slot.seq.load(std::memory_order_acquire) != head + 1) break;
    // The requester wrote this after the answers to its earlier messages, so completions
    // those made are visible now (held back or already in the ring): they go first.
    if (!sink.in_order(t->recv_cq)) {
      // Soon, then: a CQ fed by many windows must look again though this one rang no more.
      t->recv_cq->look_all.store(true, std::memory_order_relaxed);
      return;
    }
    // Read each field once: the peer's memory may change under us.
    uint32_t opcode = slot.opcode, flags = slot.flags, imm = slot.imm, len = slot.length;
    // A placed message (shm_send_place.cpp) is in the receive already: the one it names
    // must be the one it completes.
    const bool placed = opcode & wire::kWindowPlaced;
    opcode &= ~wire::kWindowPlaced;
    // An SRQ receive this window's sender did not claim, or one we no longer hold: garbage.
    const uint64_t number = slot.receive;
    if (srq && !srq_claimed_by(srq, number, in.srq_claimer)) {
      kill_window_locked(t);
      return;
    }
    if (srq && opcode == wire::kWindowVoid && !placed) {  // claimed, then not used: back
      srq_give_back(srq, number);
      in.head = head + 1;
      hdr->head.store(in.head, std::memory_order_release);
      continue;
    }
    // (A placed message to an SRQ names its receive like any: checked above.)
    if ((opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM) || (!srq && t->rq.empty()) ||
        (placed ? !srq && slot.receive != in.posted - t->rq.size() : len > wire::kWindowPayload)) {
      kill_window_locked(t);
      return;
    }
    if (!t->comm_est_raised && t->state.load() == IBV_QPS_RTR) {
      t->comm_est_raised = true;
      raise_qp_event(t, IBV_EVENT_COMM_EST);
    }
    const RecvWqe& r = srq ? srq_receive(srq, number) : t->rq.front();
    ibv_wc& wc = sink.next();
    wc.wr_id = r.wr_id;
    wc.qp_num = t->qpn();
    wc.src_qp = in.peer_qpn;
    wc.opcode = IBV_WC_RECV;
    wc.byte_len = len;
    if (opcode == IBV_WR_SEND_WITH_IMM) {
      wc.imm_data = imm;
      wc.wc_flags = IBV_WC_WITH_IMM;
    }
    iovec dst[Limits::max_sge];
    int n = 1;
    int64_t cap;
    if (r.place && r.place_changes == MrTable::instance().changes()) {
      dst[0] = {r.place, r.place_len};  // resolved when posted, and no MR changed since
      cap = r.place_len;
    } else {
      cap = resolve_recv(srq ? srq->pd : t->pd, r, dst, &n);
    }
    bool ok = cap >= 0;
    if (srq)
      srq_consume(srq, number);
    else
      t->rq.pop_front();
    in.head = head + 1;
    // The requester checked the published capacity; the MR may have gone since.
    if (!ok || cap < len) {
      wc.status = ok ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR;
      wc.byte_len = 0;
      sink.put(false);
      hdr->head.store(in.head, std::memory_order_release);
      kill_window_locked(t);
      set_error(t, -1);
      return;
    }
    // One receive buffer (the common case): a plain memcpy. On the polled critical path
    // it measured ~0.05 µs per message faster than copy_local (ib_send_lat, pinned A/B).
    if (!placed && n == 1 && len <= dst[0].iov_len) {
      std::memcpy(dst[0].iov_base, slot.data, len);
    } else if (!placed) {
      iovec src{const_cast<uint8_t*>(slot.data), len};
      wire::copy_local(dst, n, &src, 1, len);
    }
    sink.put((flags & IBV_SEND_SOLICITED) != 0);
    hdr->head.store(in.head, std::memory_order_release);
  }
}

// Closing t's window (RESET, destroy, ERR after the drain): SRQ receives its sender claimed
// and no message in the ring will use (the sender died between claim and commit, or the
// messages are discarded) go back, to the next message. Caller holds t->rq_mu.
void release_srq_claims_locked(Qp* t) {
  Srq* srq = t->srq;
  if (!srq) return;
  std::lock_guard<QueueMutex> lock(srq->mu);
  srq_give_back_claimer(srq, t->inbound.srq_claimer);
}

}  // namespace

void drain_window_locked(Qp* t) {
  ToCq sink{t->recv_cq, {}};
  drain_window_into(t, sink);
}

int drain_solo_into(Cq* cq, int max, ibv_wc* wc) {
  std::shared_lock keys(MrTable::instance().lock());
  std::unique_lock<SpinLock> list(cq->inbound_mu);
  if (cq->inbound.size() != 1) return 0;
  Qp* t = cq->inbound.front();
  if (t->type == IBV_QPT_UD) {  // its UD windows (shm_ud.cpp), as below
    std::unique_lock<QueueMutex> ud(t->ud_mu, std::try_to_lock);
    if (!ud.owns_lock()) return 0;
    list.unlock();
    return drain_ud_solo_locked(cq, t, max, wc);
  }
  // Queues are locked before lists elsewhere: only try, and leave the rest to drain_inbound.
  std::unique_lock<QueueMutex> rq(t->rq_mu, std::try_to_lock);
  if (!rq.owns_lock()) return 0;
  list.unlock();  // destroying t passes through its rq_mu (close_window) first
  // An armed CQ must fire its event, and a CQ in error reports that: both take the ring
  // path. (The ring's own completions come first: ToArray::in_order.)
  if (cq->armed.load(std::memory_order_relaxed) != wire::kArmNone ||
      cq->in_error.load(std::memory_order_relaxed))
    return 0;
  // More messages waiting than the CQ holds: a NIC would have overrun the CQ by now. The
  // ring path finds out the same way a local producer does (CQ_ERR, its QPs to ERR).
  if (cq->capacity < wire::kWindowSlots && t->window.load(std::memory_order_relaxed)) {
    uint64_t beyond = t->inbound.head + cq->capacity;
    if (t->inbound.slots[beyond % wire::kWindowSlots].seq.load(std::memory_order_acquire) ==
        beyond + 1)
      return 0;
  }
  ToArray sink{wc, max};
  drain_window_into(t, sink);
  return sink.n;
}

bool window_waiting(Qp* t) {
  if (t->type == IBV_QPT_UD) return ud_window_waiting(t);  // shm_ud.cpp
  wire::WindowHeader* hdr = t->window.load(std::memory_order_acquire);
  const wire::WindowSlot* slots = t->window_slots.load(std::memory_order_acquire);
  if (!hdr || !slots) return false;
  const uint64_t head = hdr->head.load(std::memory_order_relaxed);
  return slots[head % wire::kWindowSlots].seq.load(std::memory_order_acquire) == head + 1;
}

void drain_inbound(Cq* cq, bool every_window) {
  // Pin the QPs with something waiting under the list lock; drain without it (queues are
  // locked before lists elsewhere).
  constexpr size_t kBatch = 16;
  Qp* busy[kBatch];
  size_t n = 0;
  {
    std::lock_guard<SpinLock> lock(cq->inbound_mu);
    // Every window when asked, when a look was owed, or when a window without a rung bit
    // rang the doorbell; always the windows whose bits are set.
    const uint64_t bell = cq->shared->doorbell.load(std::memory_order_acquire);
    // Plain loads and stores (written under this lock, or only ever set to true elsewhere):
    // a lock-prefixed exchange here would wait for the copies of the messages just landed.
    if (cq->look_all.load(std::memory_order_relaxed)) {
      cq->look_all.store(false, std::memory_order_relaxed);
      every_window = true;
    }
    if (cq->doorbell_seen.load(std::memory_order_relaxed) != bell) {
      cq->doorbell_seen.store(bell, std::memory_order_relaxed);
      every_window = true;
    }
    int named = rung_collect_locked(cq, busy, kBatch);
    for (int i = 0; i < named; ++i) busy[i]->users.fetch_add(1, std::memory_order_acq_rel);
    n = static_cast<size_t>(named);
    if (every_window) {
      cq->looks_since_full.store(0, std::memory_order_relaxed);
      rung_resync_locked(cq);
      // From where the last look stopped: a look that starts at the first window again and
      // again finds the same idle ones first (with 10,000 windows, most of a receiver's time).
      const size_t windows = cq->inbound.size();
      size_t at = cq->scan_cursor < windows ? cq->scan_cursor : 0;
      for (size_t looked = 0; looked < windows; ++looked, at = at + 1 == windows ? 0 : at + 1) {
        Qp* qp = cq->inbound[at];
        if (!window_waiting(qp)) continue;
        bool named_already = false;
        for (size_t i = 0; i < n && !named_already; ++i) named_already = busy[i] == qp;
        if (named_already) continue;
        if (n == kBatch) {
          cq->look_all.store(true, std::memory_order_relaxed);  // the next poll goes on
          break;
        }
        qp->users.fetch_add(1, std::memory_order_acq_rel);
        busy[n++] = qp;
      }
      cq->scan_cursor = at;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    wire::QpRef ref(busy[i], &busy[i]->users);
    if (busy[i]->type == IBV_QPT_UD) {  // its UD windows (shm_ud.cpp)
      drain_ud(busy[i], false);
      continue;
    }
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<QueueMutex> lock(busy[i]->rq_mu);
    drain_window_locked(busy[i]);
  }
}

void close_window(Qp* t, bool deliver) {
  if (t->type == IBV_QPT_UD) return close_ud_windows(t, deliver);  // shm_ud.cpp
  {
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<QueueMutex> lock(t->rq_mu);
    if (t->window.load(std::memory_order_relaxed)) {
      // Messages already in the ring were acknowledged to the sender: they land first.
      if (deliver) drain_window_locked(t);
      kill_window_locked(t);
    }
    release_srq_claims_locked(t);  // also when a drain killed the window before
  }
  // Also when the window is already dead (a drain killed it, e.g. over a peer's garbage):
  // the CQ must not keep a pointer to a QP that is about to be destroyed.
  {
    std::lock_guard<SpinLock> inbound(t->recv_cq->inbound_mu);
    inbound_remove_locked(t->recv_cq, t);
    rung_detach_locked(t->recv_cq, t);
    update_solo_locked(t->recv_cq);
  }
  // Nothing of ours points into the block any more; the peer may, until it is gone.
  std::lock_guard<QueueMutex> lock(t->rq_mu);
  wire::InboundWindow& in = t->inbound;
  if (in.offset && !t->window.load(std::memory_order_relaxed)) {
    if (wire::Arena* arena = wire::Arena::self()) arena->retire(in.offset, in.bytes, in.writer);
    in.offset = 0;
  }
}

}  // namespace softverbs::engine
