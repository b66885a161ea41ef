// UD between processes of this host through UD windows (wire/shm/ud_window.hpp), both ends:
//  - sender: a window per destination QP, asked of the target's agent on the first datagram
//    to it and kept; a datagram is copied into its next slot, and the target's CQ event is
//    fired only if that CQ is armed (as for RC/UC SENDs, shm_requester.cpp);
//  - target: a window per sender QP; ibv_poll_cq drains them into the posted receives (or
//    the SRQ) with the completions the responder writes for UD: the 40-byte GRH slot, src_qp,
//    IBV_WC_GRH, sl, IMM, solicited events; a wrong Q_Key, no receive or a QP that is not
//    listening drops the datagram, a receive too small completes with LOC_LEN_ERR.
// What a window cannot carry (a full ring, no window, multicast, this process's own QPs)
// keeps to the agent path, which answers as the responder does; the agent drains a QP's
// windows before it delivers, so one sender's datagrams arrive in order either way.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "core/core.hpp"
#include "core/device.hpp"
#include "core/errors.hpp"
#include "engine/engine.hpp"
#include "wire/registry.hpp"
#include "wire/roce/grh.hpp"
#include "wire/shm/agent.hpp"
#include "wire/shm/mcast.hpp"
#include "wire/shm/ud_window.hpp"

namespace softverbs::engine {

namespace {

constexpr uint32_t kGrhBytes = 40;
// Datagrams to a destination that had no window to give go through its agent; it is asked
// again after this many.
constexpr uint32_t kUdBackoff = 64;

// ---- sender side ---------------------------------------------------------------------------

void close_peer(wire::UdPeerWindow& p) {
  if (p.wake_fd >= 0) close(p.wake_fd);
  wire::unmap_peer_arena(p.arena);  // the last window into that process unmaps its memory
  uint32_t dst = p.dst_qpn;
  p = wire::UdPeerWindow{};
  p.dst_qpn = dst;
}

// Asks the agent of dst_qpn's process for a window of that QP for ours, into `p`; false
// when there is none to use (then `p` remembers that for a while).
bool open_peer(Qp* qp, uint32_t dst_qpn, wire::UdPeerWindow& p) {
  close_peer(p);
  wire::PeerArena arena;
  int wake_fd = -1;
  uint64_t off = wire::agent_open_window(wire::slot_of_qpn(dst_qpn), qp->qpn(), dst_qpn, &arena,
                                         &wake_fd);
  auto* hdr = off ? arena.at<wire::UdWindowHeader>(off, wire::ud_window_bytes()) : nullptr;
  // Read once and checked; never trusted again (the target may change any of it). The
  // process is the one the kernel named as the agent's, never the header's word for it.
  bool ok = hdr && hdr->magic == wire::kUdWindowMagic && hdr->qpn == dst_qpn &&
            hdr->peer_qpn == qp->qpn() && hdr->slots_offset == wire::ud_window_slots_at() &&
            hdr->owner_pid == arena.pid && arena.pid > 0;
  auto* cq = ok ? arena.at<wire::CqShared>(hdr->cq_offset) : nullptr;
  if (!cq) {
    if (wake_fd >= 0) close(wake_fd);
    wire::unmap_peer_arena(arena);
    p.backoff = kUdBackoff;
    return false;
  }
  if (wake_fd >= 0 && !usable_wake_fd(wake_fd)) {
    close(wake_fd);
    wake_fd = -1;
  }
  p.hdr = hdr;
  p.cq = cq;
  p.slots = reinterpret_cast<wire::UdSlot*>(reinterpret_cast<char*>(hdr) + wire::ud_window_slots_at());
  p.pid = arena.pid;
  p.wake_fd = wake_fd;
  p.ready = wire::ready_hint(arena, cq);
  p.rung = wire::rung_bit(arena, cq, hdr->rung_index);
  p.arena = arena;
  p.opened = ++qp->ud_opens;
  return true;
}

// The window of UD QP dst_qpn (another process of this host) for `qp`, opened the first
// time; nullptr: take the agent path. Caller holds qp->sq_mu.
wire::UdPeerWindow* ud_peer(Qp* qp, uint32_t dst_qpn) {
  auto& peers = qp->ud_peers;
  wire::UdPeerWindow* p = nullptr;
  for (auto& e : peers)
    if (e.dst_qpn == dst_qpn) {
      p = &e;
      break;
    }
  if (p && p->hdr) {  // the data path's case
    if (p->hdr->live.load(std::memory_order_acquire)) return p;
    close_peer(*p);  // the target closed it: ask for a new one
  } else if (p && p->backoff) {
    --p->backoff;
    return nullptr;
  }
  if (wire::slot_of_qpn(dst_qpn) == wire::my_slot()) return nullptr;  // ours: direct anyway
  if (!p) {
    if (peers.size() < wire::kUdMaxPeers) {
      p = &peers.emplace_back();
    } else {  // make room: the one opened longest ago goes
      p = &*std::min_element(peers.begin(), peers.end(), [](const auto& a, const auto& b) {
        return a.opened < b.opened;
      });
      close_peer(*p);
    }
    p->dst_qpn = dst_qpn;
  }
  return open_peer(qp, dst_qpn, *p) ? p : nullptr;
}

// The next slot of `p`, or nullptr when the ring is full. A target that stopped consuming
// may be gone (dead, or its registry slot taken over): then the window goes, and with the
// last one its memory.
wire::UdSlot* ud_slot(wire::UdPeerWindow* p) {
  if (p->tail - p->head >= wire::kWindowSlots) {
    p->head = p->hdr->head.load(std::memory_order_acquire);
    if (p->tail - p->head >= wire::kWindowSlots) {
      if (wire::slot_owner(p->arena.slot) != p->pid || (kill(p->pid, 0) != 0 && errno == ESRCH))
        close_peer(*p);
      return nullptr;
    }
  }
  return &p->slots[p->tail % wire::kWindowSlots];
}

// What a datagram carries besides its payload.
struct UdHeader {
  uint32_t len;
  ibv_wr_opcode opcode;
  unsigned flags;
  uint32_t imm;
  uint32_t qkey;
  const ibv_gid* sgid;
  const ibv_gid* dgid;
};

// Hands the datagram whose payload is already in `s` to the target.
void ud_commit(wire::UdPeerWindow* p, wire::UdSlot& s, const UdHeader& h) {
  s.length = static_cast<uint16_t>(h.len);
  s.opcode = h.opcode == IBV_WR_SEND_WITH_IMM ? wire::kUdSendImm : wire::kUdSend;
  bool solicited = h.flags & IBV_SEND_SOLICITED;
  s.flags = solicited ? wire::kUdSolicited : 0;
  s.imm = h.imm;
  s.qkey = h.qkey;
  std::memcpy(s.sgid, h.sgid->raw, 16);
  std::memcpy(s.dgid, h.dgid->raw, 16);
  s.seq.store(p->tail + 1, std::memory_order_release);
  ++p->tail;
  // As window_commit (shm_requester.cpp): an armed CQ may be asleep in ibv_get_cq_event.
  wire::ring_cq(p->cq, p->rung);
  int arm = p->cq->arm.load(std::memory_order_seq_cst);
  if (arm == wire::kArmNext || (arm == wire::kArmSolicited && solicited))
    wake_target(p->ready, p->wake_fd, p->arena.slot, p->dst_qpn);
}

// The Q_Key a datagram carries: the QP's own when the WR's has the high bit set (IBA
// 10.2.5; an application may not send a controlled Q_Key itself).
uint32_t effective_qkey(Qp* qp, uint32_t wr_qkey) {
  return (wr_qkey & 0x80000000u) ? qp->send_path.qkey : wr_qkey;
}

// The datagram of built WQE `w` (at most kUdPayload bytes) into the UD window of QP
// dst_qpn of another process; false: no window or a full ring (the agent path then).
bool window_datagram(Qp* qp, uint32_t dst_qpn, const SendWqe& w, const iovec* local,
                     int nlocal) {
  wire::UdPeerWindow* p = ud_peer(qp, dst_qpn);
  wire::UdSlot* s = p ? ud_slot(p) : nullptr;
  if (!s) return false;
  uint32_t len = static_cast<uint32_t>(w.total_length);
  iovec to{s->data, len};
  wire::copy_local(&to, 1, local, nlocal, len);
  ud_commit(p, *s, {len, w.opcode, w.flags, w.imm, effective_qkey(qp, w.remote_qkey), &w.sgid, &w.dgid});
  return true;
}

}  // namespace

std::optional<Outcome> send_ud_through_window(Qp* qp, const SendWqe& w, const iovec* local,
                                              int nlocal) {
  if (w.total_length > wire::kUdPayload || wire::route(w.dgid, w.remote_qpn) != wire::Route::Shm)
    return std::nullopt;
  if (!window_datagram(qp, w.remote_qpn, w, local, nlocal)) return std::nullopt;
  return Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(w.total_length)};
}

Outcome send_ud_to_group(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                         const wire::Request& req) {
  for (uint32_t qpn : wire::mcast_members(w.dgid)) {
    if (qpn == req.src_qpn && req.skip_self) continue;
    // Another process's member: its window, as a unicast datagram to it. The agent path
    // (no window, a full ring) drains its windows first, so the order holds either way.
    const bool ours = wire::slot_of_qpn(qpn) == wire::my_slot();
    if (!ours && w.total_length <= wire::kUdPayload && window_datagram(qp, qpn, w, local, nlocal))
      continue;
    wire::Request copy = req;
    copy.dst_qpn = qpn;
    wire::deliver(ours ? wire::Route::Loop : wire::Route::Shm, w.dgid, copy);
  }
  // As on a fabric: a member without a receive just misses it; the sender sees success.
  return {Outcome::Ack};
}

bool post_ud_now(Qp* qp, const ibv_send_wr* wr, uint64_t len) {
  if ((wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) || len > wire::kUdPayload ||
      !Device::instance().port_active())
    return false;
  const Ah* ah = Ah::from(wr->wr.ud.ah);  // checked by check_send_wr
  const auto& gids = Device::instance().gids();
  if (!ah || ah->attr.grh.sgid_index >= gids.size()) return false;
  const ibv_gid& dgid = ah->attr.grh.dgid;
  uint32_t dst_qpn = wr->wr.ud.remote_qpn;
  if (wire::route(dgid, dst_qpn) != wire::Route::Shm) return false;
  wire::UdPeerWindow* p = ud_peer(qp, dst_qpn);
  wire::UdSlot* s = p ? ud_slot(p) : nullptr;
  if (!s) return false;
  // Every key is resolved before the first byte lands in the line the target spins on
  // (post_now says why).
  iovec from[Limits::max_sge];
  std::shared_lock keys(MrTable::instance().lock(), std::defer_lock);
  if (!(wr->send_flags & IBV_SEND_INLINE)) keys.lock();
  int n = payload_iovecs(qp, wr, from);
  if (n < 0) return false;  // the general path reports the bad key
  iovec to{s->data, len};
  wire::copy_local(&to, 1, from, n, len);
  ud_commit(p, *s, {static_cast<uint32_t>(len), wr->opcode, wr->send_flags, wr->imm_data,
                    effective_qkey(qp, wr->wr.ud.remote_qkey), &gids[ah->attr.grh.sgid_index].gid, &dgid});
  if (keys.owns_lock()) keys.unlock();
  if (qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED)) {
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.opcode = IBV_WC_SEND;
    wc.byte_len = static_cast<uint32_t>(len);
    wc.qp_num = qp->qpn();
    cq_push(qp->send_cq, wc, false);
  }
  return true;
}

void drop_ud_peers(Qp* qp) {
  for (auto& p : qp->ud_peers) close_peer(p);
  qp->ud_peers.clear();
}

// ---- target side ---------------------------------------------------------------------------

namespace {

// Where drained datagrams' completions go: ibv_poll_cq's array (`out`, at most `max`), or
// without one the CQ's ring.
struct UdSink {
  Cq* cq;
  ibv_wc* out = nullptr;
  int max = 0;
  int n = 0;
  ibv_wc one{};
  bool room() const { return !out || n < max; }
  // Completions the agent holds back come first (see drain_window_into); straight into the
  // array only when the ring has none either.
  bool in_order() const {
    if (cq->held_back.load(std::memory_order_acquire) != 0) return !out && completions_deferred();
    return !out || cq->tail.load(std::memory_order_acquire) == cq->head.load(std::memory_order_relaxed);
  }
  ibv_wc& next() { return out ? (out[n] = {}) : (one = {}); }
  void put(bool solicited) {
    if (out) ++n;
    else cq_push(cq, one, solicited);
  }
};

// What the target QP is now, read once per drain.
struct UdTarget {
  Qp* t;
  bool listening;  // RTR and after, not ERR: else datagrams are dropped
  uint32_t qkey;
};

UdTarget ud_target(Qp* t) {
  int st = t->state.load();
  std::lock_guard<std::mutex> lock(t->attr_mu);
  return {t, st >= IBV_QPS_RTR && st != IBV_QPS_ERR, t->attr.qkey};
}

// One datagram read out of a slot (each field once: the sender may change them meanwhile).
struct UdMessage {
  uint32_t len;
  bool imm_present;
  bool solicited;
  uint32_t imm;
  uint32_t qkey;
  ibv_gid sgid, dgid;
  const uint8_t* data;
};

// Lands `d` in the next receive of t's queue (or SRQ), with its completion; none: dropped.
void deliver(const UdTarget& tg, uint32_t src_qpn, const UdMessage& d, UdSink& sink) {
  Qp* t = tg.t;
  Srq* srq = t->srq;
  std::lock_guard<QueueMutex> lock(srq ? srq->mu : t->rq_mu);
  RingQueue<RecvWqe>& q = srq ? srq->rq : t->rq;
  // UD has no RNR: the datagram is lost (also when what is there is promised to messages
  // in receive windows, an SRQ's).
  uint64_t number = 0;
  if (srq ? !srq_take_local(srq, &number) : q.empty()) return;
  const RecvWqe& r = srq ? srq_receive(srq, number) : q.front();
  ibv_wc& wc = sink.next();
  wc.wr_id = r.wr_id;
  wc.qp_num = t->qpn();
  wc.src_qp = src_qpn;
  wc.opcode = IBV_WC_RECV;
  iovec dst[Limits::max_sge];
  int n = 0;
  int64_t cap = resolve_recv(srq ? srq->pd : t->pd, r, dst, &n);
  const uint64_t need = uint64_t{d.len} + kGrhBytes;
  if (cap < 0 || static_cast<uint64_t>(cap) < need) {
    // The receive completes in error; a UD QP keeps running (as receive_fault).
    wc.status = fault_rule(cap < 0 ? Fault::RecvProtection : Fault::RecvTooSmall).responder_status;
  } else {
    uint8_t grh[kGrhBytes];
    build_grh(grh, d.sgid, d.dgid, d.len);
    if (n == 1) {  // one buffer (nearly every receive): GRH and payload back to back
      auto* at = static_cast<uint8_t*>(dst[0].iov_base);
      std::memcpy(at, grh, kGrhBytes);
      std::memcpy(at + kGrhBytes, d.data, d.len);
    } else {
      iovec src[2] = {{grh, kGrhBytes}, {const_cast<uint8_t*>(d.data), d.len}};
      wire::copy_local(dst, n, src, 2, need);
    }
    wc.status = IBV_WC_SUCCESS;
    wc.byte_len = static_cast<uint32_t>(need);
    wc.wc_flags = IBV_WC_GRH;
    wc.sl = wire::roce::grh_slot_l3_type(grh);  // as the responder says (what the slot holds)
    if (d.imm_present) {
      wc.imm_data = d.imm;
      wc.wc_flags |= IBV_WC_WITH_IMM;
    }
  }
  if (srq)
    srq_consume(srq, number);  // (also raises the SRQ limit event)
  else
    q.pop_front();
  sink.put(d.solicited && wc.status == IBV_WC_SUCCESS);
}

// Drains window `w` of tg.t; false when the window must close (its sender wrote garbage)
// or when draining must stop (no room, or completions held back come first).
bool drain_one(const UdTarget& tg, wire::UdInboundWindow& w, UdSink& sink, bool* bad) {
  for (uint64_t head = w.head; sink.room(); ++head) {
    wire::UdSlot& s = w.slots[head % wire::kWindowSlots];
    if (s.seq.load(std::memory_order_acquire) != head + 1) return true;
    if (!sink.in_order()) {
      tg.t->recv_cq->look_all.store(true, std::memory_order_relaxed);  // look again soon
      return false;
    }
    UdMessage d;
    d.len = s.length;
    uint8_t opcode = s.opcode, flags = s.flags;
    d.imm_present = opcode == wire::kUdSendImm;
    d.solicited = flags & wire::kUdSolicited;
    d.imm = s.imm;
    d.qkey = s.qkey;
    std::memcpy(d.sgid.raw, s.sgid, 16);
    std::memcpy(d.dgid.raw, s.dgid, 16);
    d.data = s.data;
    if (opcode > wire::kUdSendImm || d.len > wire::kUdPayload) {
      *bad = true;
      return false;
    }
    if (tg.listening && d.qkey == tg.qkey) deliver(tg, w.peer_qpn, d, sink);
    // The slot is the sender's again once head says so: after its payload was copied out.
    w.head = head + 1;
    w.hdr->head.store(w.head, std::memory_order_release);
    if (w.watch) w.watch->store(w.head, std::memory_order_release);
  }
  return false;
}

// The words a CQ's watch of a lone UD window reads for how far the target got
// (Cq::solo_head). Ours alone: the window's own head is the sender's to scribble on, and a
// head it moved would stall the watch. Never freed, so a CQ's stale pointer to one gives
// only a wrong hint.
std::mutex g_watch_mu;
std::vector<std::atomic<uint64_t>*>& g_watch_free = *new std::vector<std::atomic<uint64_t>*>;

std::atomic<uint64_t>* take_watch_word() {
  std::lock_guard<std::mutex> lock(g_watch_mu);
  if (g_watch_free.empty()) return new std::atomic<uint64_t>{0};
  std::atomic<uint64_t>* w = g_watch_free.back();
  g_watch_free.pop_back();
  return w;
}

void give_back_watch_word(std::atomic<uint64_t>* w) {
  if (!w) return;
  std::lock_guard<std::mutex> lock(g_watch_mu);
  g_watch_free.push_back(w);
}

void retire_window(const wire::UdInboundWindow& w) {
  w.hdr->live.store(0, std::memory_order_release);
  if (wire::Arena* arena = wire::Arena::self()) arena->retire(w.offset, wire::ud_window_bytes(), w.writer);
}

// Under t->ud_mu: the CQ's view of t's windows (Cq::solo_slots) follows their number.
// Returns t's rung index, for a new window's header.
uint32_t update_watch_locked(Qp* t) {
  auto& v = t->ud_inbound;
  bool one = v.size() == 1;
  for (auto& w : v) w.watch = nullptr;
  if (one) {
    if (!t->ud_watch) t->ud_watch = take_watch_word();
    t->ud_watch->store(v[0].head, std::memory_order_release);
    v[0].watch = t->ud_watch;
  }
  t->ud_solo_slots.store(one ? reinterpret_cast<const wire::WindowSlot*>(v[0].slots) : nullptr,
                         std::memory_order_release);
  t->ud_solo_head.store(one ? t->ud_watch : nullptr, std::memory_order_release);
  std::lock_guard<SpinLock> inbound(t->recv_cq->inbound_mu);
  uint32_t rung = wire::kRungNone;
  if (!v.empty()) {
    inbound_add_locked(t->recv_cq, t);
    rung = rung_attach_locked(t->recv_cq, t);
  }
  update_solo_locked(t->recv_cq);
  return rung;
}

// Drains every window of t into `sink`. Caller holds the key lock (shared) and t->ud_mu.
void drain_ud_locked(Qp* t, UdSink& sink) {
  auto& v = t->ud_inbound;
  if (v.empty()) return;
  UdTarget tg = ud_target(t);
  bool closed = false;
  for (size_t i = 0; i < v.size();) {
    bool bad = false;
    if (!drain_one(tg, v[i], sink, &bad)) {
      if (!bad) break;  // no room, or completions held back first
      retire_window(v[i]);  // its sender asks for a new one
      v.erase(v.begin() + static_cast<long>(i));
      closed = true;
      continue;
    }
    ++i;
  }
  if (closed) update_watch_locked(t);
}

// A window whose writer is gone (its sender's registry slot has another owner, or none).
bool writer_gone(const wire::UdInboundWindow& w) {
  return wire::slot_owner(wire::slot_of_qpn(w.peer_qpn)) != w.writer;
}

}  // namespace

uint64_t open_ud_window(Qp* t, uint32_t peer_qpn, pid_t peer_pid) {
  wire::Arena* arena = wire::Arena::self();
  if (!arena || !t->recv_cq->shared_offset || peer_pid <= 0 || (t->srq && t->srq->tm)) return 0;
  // Only the process that owns the sender QP's number may write as that QP.
  if (wire::slot_owner(wire::slot_of_qpn(peer_qpn)) != peer_pid) return 0;
  rung_prepare(t->recv_cq);  // before any lock: it may allocate
  uint64_t bytes = wire::ud_window_bytes();
  uint64_t off = arena->allocate(bytes);
  if (!off) return 0;
  auto* hdr = arena->at<wire::UdWindowHeader>(off);
  std::shared_lock keys(MrTable::instance().lock());
  std::lock_guard<QueueMutex> lock(t->ud_mu);
  int st = t->state.load();
  auto& v = t->ud_inbound;
  auto same = std::find_if(v.begin(), v.end(), [&](const auto& w) { return w.peer_qpn == peer_qpn; });
  if (same != v.end()) {
    // The sender lost its window (it closed it for room, or is a new QP of that number):
    // what it left there was sent before, so it lands first; then a fresh window.
    UdSink sink{t->recv_cq};
    UdTarget tg = ud_target(t);
    bool bad = false;
    drain_one(tg, *same, sink, &bad);
    retire_window(*same);
    v.erase(same);
  }
  if (v.size() >= wire::kUdMaxWindows) {
    for (auto it = v.begin(); it != v.end();) {
      if (!writer_gone(*it)) {
        ++it;
        continue;
      }
      retire_window(*it);
      it = v.erase(it);
    }
  }
  if (st < IBV_QPS_RTR || st == IBV_QPS_ERR || v.size() >= wire::kUdMaxWindows) {
    arena->release(off, bytes);
    update_watch_locked(t);
    return 0;
  }
  hdr->magic = wire::kUdWindowMagic;
  hdr->qpn = t->qpn();
  hdr->peer_qpn = peer_qpn;
  hdr->cq_offset = t->recv_cq->shared_offset;
  hdr->owner_pid = wire::self_pid();
  hdr->slots_offset = static_cast<uint32_t>(wire::ud_window_slots_at());
  hdr->head.store(0, std::memory_order_relaxed);
  hdr->live.store(1, std::memory_order_release);
  // The slots' seq words are 0 already (Arena::allocate gives zeros).
  auto* slots = reinterpret_cast<wire::UdSlot*>(reinterpret_cast<char*>(hdr) + wire::ud_window_slots_at());
  v.push_back({hdr, slots, peer_qpn, 0, nullptr, off, peer_pid});
  hdr->rung_index = update_watch_locked(t);  // before the agent hands the window out
  return off;
}

bool ud_window_waiting(Qp* t) {
  std::unique_lock<QueueMutex> lock(t->ud_mu, std::try_to_lock);
  if (!lock.owns_lock()) return true;  // in use: the drain decides
  for (const auto& w : t->ud_inbound)
    if (w.slots[w.head % wire::kWindowSlots].seq.load(std::memory_order_acquire) == w.head + 1) return true;
  return false;
}

void drain_ud(Qp* t, bool keys_held) {
  std::shared_lock keys(MrTable::instance().lock(), std::defer_lock);
  if (!keys_held) keys.lock();
  std::lock_guard<QueueMutex> lock(t->ud_mu);
  UdSink sink{t->recv_cq};
  drain_ud_locked(t, sink);
}

int drain_ud_solo_locked(Cq* cq, Qp* t, int max, ibv_wc* wc) {
  // As drain_solo_into: an armed CQ fires its event and a CQ in error says so, both
  // through the ring; more waiting than the CQ holds overruns it there.
  if (cq->armed.load(std::memory_order_relaxed) != wire::kArmNone ||
      cq->in_error.load(std::memory_order_relaxed) || t->ud_inbound.size() != 1)
    return 0;
  if (cq->capacity < wire::kWindowSlots) {
    const wire::UdInboundWindow& w = t->ud_inbound[0];
    uint64_t beyond = w.head + cq->capacity;
    if (w.slots[beyond % wire::kWindowSlots].seq.load(std::memory_order_acquire) == beyond + 1) return 0;
  }
  UdSink sink{cq, wc, max};
  drain_ud_locked(t, sink);
  return sink.n;
}

void close_ud_windows(Qp* t, bool deliver_first) {
  std::vector<wire::UdInboundWindow> closing;
  {
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<QueueMutex> lock(t->ud_mu);
    if (deliver_first) {
      UdSink sink{t->recv_cq};
      drain_ud_locked(t, sink);
    }
    for (const auto& w : t->ud_inbound) w.hdr->live.store(0, std::memory_order_release);
    closing.swap(t->ud_inbound);
    t->ud_solo_slots.store(nullptr, std::memory_order_release);
    t->ud_solo_head.store(nullptr, std::memory_order_release);
  }
  {
    std::lock_guard<SpinLock> inbound(t->recv_cq->inbound_mu);
    inbound_remove_locked(t->recv_cq, t);
    rung_detach_locked(t->recv_cq, t);
    update_solo_locked(t->recv_cq);
  }
  // A CQ's poll that found t before it left the list holds ud_mu until it is done.
  std::lock_guard<QueueMutex> lock(t->ud_mu);
  for (const auto& w : closing) retire_window(w);
  give_back_watch_word(t->ud_watch);
  t->ud_watch = nullptr;
}

}  // namespace softverbs::engine
