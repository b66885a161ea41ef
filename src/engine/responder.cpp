// Responder: executes an incoming request against the target QP's memory and receive
// queue, and writes the target's receive completions.
#include <arpa/inet.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "engine/engine.hpp"
#include "core/device.hpp"
#include "core/errors.hpp"
#include "common/verbs_ext.hpp"
#include "core/core.hpp"
#include "engine/tm.hpp"
#include "wire/roce/grh.hpp"
#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

namespace {

constexpr size_t kGrhSize = 40;

bool is_ipv4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

}  // namespace

void build_grh(uint8_t* grh, const ibv_gid& sgid, const ibv_gid& dgid, uint32_t payload) {
  std::memset(grh, 0, kGrhSize);
  if (is_ipv4_mapped(sgid) && is_ipv4_mapped(dgid)) {
    uint8_t* ip = grh + 20;
    ip[0] = 0x45;  // version 4, IHL 5
    uint16_t total = htons(static_cast<uint16_t>(20 + 8 + 12 + payload + 4));
    std::memcpy(ip + 2, &total, 2);
    ip[8] = 64;   // TTL
    ip[9] = 17;   // UDP
    std::memcpy(ip + 12, &sgid.raw[12], 4);
    std::memcpy(ip + 16, &dgid.raw[12], 4);
  } else {
    uint32_t vtf = htonl(6u << 28);
    std::memcpy(grh, &vtf, 4);
    uint16_t plen = htons(static_cast<uint16_t>(payload));
    std::memcpy(grh + 4, &plen, 2);
    grh[6] = 0x1b;  // next header: IBA
    grh[7] = 64;    // hop limit
    std::memcpy(grh + 8, sgid.raw, 16);
    std::memcpy(grh + 24, dgid.raw, 16);
  }
}

namespace {

// Where a request lands on target QP `qp`: its receive queue or SRQ, the PD its memory
// is checked against, the CQ of its receives. For an XRC TGT QP: the XRC SRQ the message
// names, that SRQ's PD and CQ (IBA 9.x: XRC checks memory against the XRC SRQ's PD).
// A message of another process's TGT QP for an XRC SRQ of ours has no `qp` here: what
// must happen to that QP goes back in *tgt_error (respond_xrc).
struct Target {
  Qp* qp;
  Srq* srq;
  Pd* pd;
  Cq* recv_cq;
  uint32_t qpn;
  ibv_qp_type type;
  int* tgt_error = nullptr;
  explicit Target(Qp* t, Srq* xrc = nullptr)
      : qp(t), srq(xrc ? xrc : t->srq), pd(xrc ? xrc->pd : t->pd),
        recv_cq(xrc ? xrc->xrc_cq : t->recv_cq), qpn(t->qpn()), type(t->type) {}
  Target(Srq* xrc, uint32_t tgt_qpn, int* error)
      : qp(nullptr), srq(xrc), pd(xrc->pd), recv_cq(xrc->xrc_cq), qpn(tgt_qpn),
        type(IBV_QPT_XRC_RECV), tgt_error(error) {}
  // The QP goes to ERR with `event` (-1: none): here, or in the TGT QP's process.
  void to_error(int event) const {
    if (qp) set_error(qp, event);
    else *tgt_error = event;
  }
};

// RC and XRC acknowledge; UC and UD do not.
bool reliable(ibv_qp_type type) { return type == IBV_QPT_RC || type == IBV_QPT_XRC_RECV; }
bool reliable(const Target& tg) { return reliable(tg.type); }

// The receive queue a message lands in: the QP's own or its SRQ. Holds its lock.
class RecvQueue {
 public:
  explicit RecvQueue(const Target& tg)  // tg.qp is there unless tg.srq is
      : t_(tg.qp), srq_(tg.srq), lock_(srq_ ? srq_->mu : t_->rq_mu), q_(srq_ ? srq_->rq : t_->rq) {}
  // An SRQ's receive is taken here (srq_claims.cpp: one promised to a message in a
  // receive window counts as not there) and given back when this goes unconsumed.
  bool empty() {
    if (!srq_) return q_.empty();
    if (!taken_ && !(taken_ = srq_take_local(srq_, &number_))) return true;
    return false;
  }
  ~RecvQueue() {
    if (taken_) srq_give_back(srq_, number_);
  }
  // Remember a sender that met an empty queue, to retry it once a receive is posted.
  void add_waiter(uint32_t qpn) { (srq_ ? srq_->rnr_waiters : t_->rnr_waiters).insert(qpn); }
  const RecvWqe& front() const { return srq_ ? srq_receive(srq_, number_) : q_.front(); }
  // Takes the front WQE for good (it is about to complete); until then a message that
  // does not arrive whole leaves it where it is, for the retry.
  void consume() {
    if (srq_) {  // (also raises the SRQ limit event)
      srq_consume(srq_, number_);
      taken_ = false;
      return;
    }
    q_.pop_front();
    // The peer's window counts receives spoken for; this one was taken off the ring path.
    if (wire::WindowHeader* w = t_ ? t_->window.load(std::memory_order_relaxed) : nullptr)
      w->rq_taken.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  Qp* t_;
  Srq* srq_;
  bool taken_ = false;
  uint64_t number_ = 0;
  std::lock_guard<QueueMutex> lock_;
  RingQueue<RecvWqe>& q_;
};

struct TargetAttrs {
  uint32_t dest_qpn;
  unsigned access;
  uint8_t min_rnr_timer;
  uint8_t max_dest_rd_atomic;
  uint32_t qkey;
};

TargetAttrs target_attrs(Qp* t) {
  std::lock_guard<std::mutex> lock(t->attr_mu);
  return {t->attr.dest_qp_num, t->attr.qp_access_flags, t->attr.min_rnr_timer,
          t->attr.max_dest_rd_atomic, t->attr.qkey};
}

// A responder-side fault: on RC the responder QP reacts as the error table says and the
// requester gets its NAK status. UC has no NAKs: the message is silently dropped.
Outcome fault(const Target& tg, Fault f) {
  if (!reliable(tg)) return {Outcome::Ack};
  const FaultRule rule = fault_rule(f);
  if (rule.responder_to_error) tg.to_error(rule.responder_event);
  return {Outcome::Error, rule.requester_status};
}
Outcome fault(Qp* t, Fault f) { return fault(Target(t), f); }

// A fault met while delivering into a receive WQE: the WQE completes in error, and a
// connected QP goes to ERR. UD keeps its QP running (the datagram is just lost).
Outcome receive_fault(const Target& tg, ibv_wc* wc, Fault f) {
  const FaultRule rule = fault_rule(f);
  wc->status = rule.responder_status;
  cq_push(tg.recv_cq, *wc, false);
  if (tg.type == IBV_QPT_UD || tg.type == IBV_QPT_RAW_PACKET) return {Outcome::Ack};
  if (rule.responder_to_error) tg.to_error(rule.responder_event);
  if (!reliable(tg)) return {Outcome::Ack};
  return {Outcome::Error, rule.requester_status};
}

// Delivers a SEND (or the immediate of a WRITE_WITH_IMM, when `payload` is false) into the
// next receive WQE and writes the receive completion.
Outcome deliver_receive(const wire::Request& req, const Target& tg, bool payload, uint8_t rnr_timer) {
  Qp* t = tg.qp;
  // A tag matching SRQ matches SENDs first (engine/tm_responder.cpp).
  if (payload && t && t->srq && t->srq->tm && req.opcode != IBV_WR_SEND_WITH_INV)
    return deliver_tagged(req, t, rnr_timer);
  const uint64_t len = req.length;
  RecvQueue rq(tg);
  if (rq.empty()) {
    if (!reliable(tg)) return {Outcome::Ack};  // UC/UD: dropped
    rq.add_waiter(req.src_qpn);
    return {Outcome::RnrNak, IBV_WC_SUCCESS, rnr_timer};
  }
  const RecvWqe& r = rq.front();  // stays in its slot until consumed: nothing is pushed meanwhile
  bool ud = tg.type == IBV_QPT_UD;
  ibv_wc wc{};
  wc.wr_id = r.wr_id;
  wc.qp_num = tg.qpn;
  wc.src_qp = req.src_qpn;
  wc.pkey_index = 0;
  wc.opcode = payload ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
  if (payload) {
    iovec dst[Limits::max_sge];
    int ndst;
    int64_t cap = resolve_recv(tg.pd, r, dst, &ndst);
    if (cap < 0) {
      rq.consume();
      return receive_fault(tg, &wc, Fault::RecvProtection);
    }
    uint64_t need = len + (ud ? kGrhSize : 0);
    if (static_cast<uint64_t>(cap) < need) {
      rq.consume();
      return receive_fault(tg, &wc, Fault::RecvTooSmall);
    }
    if (ud) {
      uint8_t grh[kGrhSize];
      build_grh(grh, req.sgid, req.dgid, static_cast<uint32_t>(len));
      iovec g{grh, kGrhSize};
      wire::copy_local(dst, ndst, &g, 1, kGrhSize);
      // Skip the GRH slot in the scatter list.
      size_t skip = kGrhSize;
      int i = 0;
      while (skip && i < ndst) {
        size_t k = std::min(skip, dst[i].iov_len);
        dst[i].iov_base = static_cast<char*>(dst[i].iov_base) + k;
        dst[i].iov_len -= k;
        skip -= k;
        if (dst[i].iov_len == 0) ++i;
      }
      // A message that does not arrive whole (the requester vanished mid-message) was
      // never received: the WQE stays for the retry, or for the flush.
      if (!wire::copy_from_requester(req, dst + i, ndst - i, len)) return {Outcome::NoResponse};
      wc.wc_flags |= IBV_WC_GRH;
      wc.sl = wire::roce::grh_slot_l3_type(grh);  // what the slot holds, as ConnectX says
    } else if (!wire::copy_from_requester(req, dst, ndst, len)) {
      return {Outcome::NoResponse};
    }
    wc.byte_len = static_cast<uint32_t>(need);
  } else {
    wc.byte_len = static_cast<uint32_t>(len);
  }
  if (req.opcode == IBV_WR_SEND_WITH_IMM || req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    wc.imm_data = req.imm;
    wc.wc_flags |= IBV_WC_WITH_IMM;
  }
  if (req.opcode == IBV_WR_SEND_WITH_INV) {
    // The data landed; then the named window of this QP goes (rxe's order). One that
    // cannot be invalidated fails the receive and the QP (IBA class J). XRC: no window is
    // ever bound to a TGT QP (it has no send queue); a type 2 window of the XRC SRQ's PD
    // goes, whichever of its QPs bound it (docs/xrc.md).
    const bool tgt_xrc = tg.type == IBV_QPT_XRC_RECV;
    if (!MrTable::instance().invalidate(req.imm, tg.pd, tg.qpn, !tgt_xrc)) {
      rq.consume();
      return receive_fault(tg, &wc, Fault::RemoteInvalidate);
    }
    wc.invalidated_rkey = req.imm;  // host order (ibv_poll_cq(3))
    wc.wc_flags |= IBV_WC_WITH_INV;
  }
  wc.status = IBV_WC_SUCCESS;
  rq.consume();
  cq_push(tg.recv_cq, wc, (req.flags & IBV_SEND_SOLICITED) != 0, nullptr, req.flow_tag);
  return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
}

// ---- responder faults of `softverbs inject`: the one the request meets, as the same
// responder would have met the real thing; nullopt: none, run it.
std::optional<Outcome> injected_response(const wire::Request& req, Qp* t, const TargetAttrs& ta) {
  const bool needs_receive = consumes_receive(req.opcode);
  const ResponderFault f = take_responder_fault(t, needs_receive, ta.min_rnr_timer);
  switch (f.kind) {
    case ResponderFault::kNone:
      return std::nullopt;
    case ResponderFault::kRnr:
      return Outcome{Outcome::RnrNak, IBV_WC_SUCCESS, f.rnr_timer};
    case ResponderFault::kNak:
      set_error(t, f.event);
      return Outcome{Outcome::Error, f.requester_status};
    case ResponderFault::kReceive:
      break;
  }
  const Target tg(t);
  RecvQueue rq(tg);
  if (rq.empty()) {  // no receive to fail: the message meets the RNR it would anyway
    give_back_responder_fault(t);
    return std::nullopt;
  }
  ibv_wc wc{};
  wc.wr_id = rq.front().wr_id;
  wc.qp_num = tg.qpn;
  wc.src_qp = req.src_qpn;
  wc.opcode = req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  rq.consume();
  return receive_fault(tg, &wc,
                       f.recv_status == IBV_WC_LOC_LEN_ERR ? Fault::RecvTooSmall : Fault::RecvProtection);
}
// ---- end responder faults

// FLUSH (IBA 1.5): it needs the flush access of its placement type from the QP and the MR.
Outcome run_request(const wire::Request& req, const Target& tg, const TargetAttrs& ta);
Outcome forward_xrc(const wire::Request& req, Qp* t, const TargetAttrs& ta);

Outcome respond_flush(const wire::Request& req, const Target& tg, const TargetAttrs& ta) {
  if (tg.type != IBV_QPT_RC || ta.max_dest_rd_atomic == 0) return fault(tg, Fault::RemoteInvalid);
  auto type = static_cast<uint8_t>(req.compare_add), level = static_cast<uint8_t>(req.swap);
  unsigned need = ((type & kFlushGlobal) ? kAccessFlushGlobal : 0) |
                  ((type & kFlushPersistent) ? kAccessFlushPersistent : 0);
  if ((ta.access & need) != need) return fault(tg, Fault::RemoteAccess);
  if (!flush_memory(tg.pd, req.rkey, req.remote_addr, req.length, type, level))
    return fault(tg, Fault::RemoteAccess);
  return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(req.length)};
}

}  // namespace

Outcome respond(const wire::Request& req, Qp* t) {
  // MRs of this process stay registered while we use them (keys before queues, always).
  std::shared_lock keys(MrTable::instance().lock());
  // A UD QP's windows (shm_ud.cpp) likewise: one sender's datagrams arrive in order.
  if (t->type == IBV_QPT_UD) drain_ud(t, true);
  if (t->window.load(std::memory_order_acquire)) {
    // What the peer left in the receive window came first: it lands before this request.
    std::lock_guard<QueueMutex> lock(t->rq_mu);
    drain_window_locked(t);
  }
  const bool xrc = t->type == IBV_QPT_XRC_RECV;
  if (xrc ? req.type != IBV_QPT_XRC_SEND : t->type != req.type) return {Outcome::NoResponse};
  int st = t->state.load();
  if (st < IBV_QPS_RTR || st == IBV_QPS_ERR) return {Outcome::NoResponse};  // not listening
  TargetAttrs ta = target_attrs(t);
  if (t->type == IBV_QPT_UD) {
    if (req.qkey != ta.qkey) return {Outcome::NoResponse};
  } else if (ta.dest_qpn != req.src_qpn) {
    return {Outcome::NoResponse};  // not this QP's connection
  }
  if (st == IBV_QPS_RTR && t->type != IBV_QPT_UD) {
    // First packet on a connected QP still in RTR: IBA's Communication Established.
    std::lock_guard<QueueMutex> lock(t->rq_mu);
    if (!t->comm_est_raised) {
      t->comm_est_raised = true;
      raise_qp_event(t, IBV_EVENT_COMM_EST);
    }
  }

  // ---- responder faults of `softverbs inject` (debug_respond.cpp)
  if (debug_hooks_armed() && t->type == IBV_QPT_RC && t->debug.responder_faults())
    if (auto o = injected_response(req, t, ta)) return *o;
  // ---- end responder faults

  // XRC: the message names an XRC SRQ, which must be one of the TGT QP's domain (else
  // the NAK an invalid request gets). It stays findable until we are done. One of
  // another process of this host takes the message there.
  std::shared_lock xrc_srqs(xrc_srq_lock(), std::defer_lock);
  Srq* xrc_srq = nullptr;
  if (xrc && wire::slot_of_qpn(req.xrc_srqn) != wire::my_slot()) {
    keys.unlock();  // nothing of ours is touched, and the other process may take a while
    return forward_xrc(req, t, ta);
  }
  if (xrc) {
    xrc_srqs.lock();
    xrc_srq = find_xrc_srq_locked(req.xrc_srqn, t->xrc_domain.get());
    if (!xrc_srq) return fault(t, Fault::RemoteInvalid);
  }
  return run_request(req, Target(t, xrc_srq), ta);
}

namespace {

// The operation itself, at target `tg` (the QP's checks are done).
Outcome run_request(const wire::Request& req, const Target& tg, const TargetAttrs& ta) {
  const uint64_t len = req.length;
  if (req.opcode == kWrFlush) return respond_flush(req, tg, ta);  // not in the 44 enum
  switch (req.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return deliver_receive(req, tg, true, ta.min_rnr_timer);
    case IBV_WR_SEND_WITH_INV:
      if (!reliable(tg)) return fault(tg, Fault::RemoteInvalid);  // RC and XRC have IETHs
      return deliver_receive(req, tg, true, ta.min_rnr_timer);

    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      if (!(ta.access & IBV_ACCESS_REMOTE_WRITE)) return fault(tg, Fault::RemoteAccess);
      iovec dst{};
      if (len && !resolve_rkey(tg.pd, tg.qpn, req.rkey, req.remote_addr, len,
                               IBV_ACCESS_REMOTE_WRITE, &dst))
        return fault(tg, Fault::RemoteAccess);
      if (req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        // The data must land before the receive completion says so; check for a receive
        // WQE first so that an RNR NAK leaves memory untouched.
        RecvQueue probe(tg);
        if (probe.empty()) {
          if (!reliable(tg)) return {Outcome::Ack};
          probe.add_waiter(req.src_qpn);
          return {Outcome::RnrNak, IBV_WC_SUCCESS, ta.min_rnr_timer};
        }
      }
      if (len && !wire::copy_from_requester(req, &dst, 1, len)) return {Outcome::NoResponse};
      if (req.opcode == IBV_WR_RDMA_WRITE)
        return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
      return deliver_receive(req, tg, false, ta.min_rnr_timer);
    }

    case IBV_WR_RDMA_READ: {
      if (!reliable(tg) || ta.max_dest_rd_atomic == 0) return fault(tg, Fault::RemoteInvalid);
      if (!(ta.access & IBV_ACCESS_REMOTE_READ)) return fault(tg, Fault::RemoteAccess);
      iovec src{};
      if (len && !resolve_rkey(tg.pd, tg.qpn, req.rkey, req.remote_addr, len,
                               IBV_ACCESS_REMOTE_READ, &src))
        return fault(tg, Fault::RemoteAccess);
      if (len && !wire::copy_to_requester(req, &src, 1, len)) return {Outcome::NoResponse};
      return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
    }

    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      if (!reliable(tg) || ta.max_dest_rd_atomic == 0) return fault(tg, Fault::RemoteInvalid);
      if (!(ta.access & IBV_ACCESS_REMOTE_ATOMIC)) return fault(tg, Fault::RemoteAccess);
      if (req.remote_addr % 8 != 0) return fault(tg, Fault::RemoteInvalid);
      iovec target{};
      if (!resolve_rkey(tg.pd, tg.qpn, req.rkey, req.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC,
                        &target))
        return fault(tg, Fault::RemoteAccess);
      // The responder runs in the process that owns the memory: a real CPU atomic.
      auto* word = static_cast<uint64_t*>(target.iov_base);
      uint64_t old;
      if (req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
        old = req.compare_add;
        __atomic_compare_exchange_n(word, &old, req.swap, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
      } else {
        old = __atomic_fetch_add(word, req.compare_add, __ATOMIC_SEQ_CST);
      }
      iovec result{&old, 8};
      if (!wire::copy_to_requester(req, &result, 1, 8)) return {Outcome::NoResponse};
      return {Outcome::Ack, IBV_WC_SUCCESS, 0, 8};
    }

    // IBA 1.5: 8 bytes stored at once, with REMOTE_WRITE (as rxe); RC only.
    case IBV_WR_ATOMIC_WRITE: {
      if (tg.type != IBV_QPT_RC || ta.max_dest_rd_atomic == 0) return fault(tg, Fault::RemoteInvalid);
      if (!(ta.access & IBV_ACCESS_REMOTE_WRITE)) return fault(tg, Fault::RemoteAccess);
      if (req.remote_addr % 8 != 0) return fault(tg, Fault::RemoteInvalid);
      iovec target{};
      if (!resolve_sge(tg.pd, req.rkey, req.remote_addr, 8, IBV_ACCESS_REMOTE_WRITE, &target))
        return fault(tg, Fault::RemoteAccess);
      uint64_t value = req.compare_add;  // the bytes as they lie in the requester's memory
      __atomic_store_n(static_cast<uint64_t*>(target.iov_base), value, __ATOMIC_SEQ_CST);
      return {Outcome::Ack, IBV_WC_SUCCESS, 0, 8};
    }

    default:
      return fault(tg, Fault::RemoteInvalid);
  }
}

}  // namespace

namespace {

// Anonymous memory for a message on its way through this process: pages cost only as
// they are written, and a length that cannot be had is a failed map, never an exception.
class StagedMessage {
 public:
  explicit StagedMessage(uint64_t bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) at_ = {p, bytes};
  }
  ~StagedMessage() {
    if (at_.iov_base) munmap(at_.iov_base, at_.iov_len);
  }
  StagedMessage(const StagedMessage&) = delete;
  StagedMessage& operator=(const StagedMessage&) = delete;
  bool ok(uint64_t bytes) const { return at_.iov_len >= bytes; }
  const iovec* iov() const { return &at_; }

 private:
  iovec at_{};
};

bool carries_payload(ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
         op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

uint64_t returned_bytes(const wire::Request& req) {
  if (req.opcode == IBV_WR_RDMA_READ) return req.length;
  if (req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || req.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) return 8;
  return 0;
}

// A message on our TGT QP `t` for an XRC SRQ of another process of this host. Only a
// domain shared through a file has SRQs elsewhere. The payload goes by way of our memory
// (that process reads only from the process the kernel says asked it), and that process's
// delivery thread runs the operation on its SRQ, its memory and its CQ; what our QP must
// do (ERR, an event) comes back. A process that is not there has no SRQ: invalid request.
Outcome forward_xrc(const wire::Request& req, Qp* t, const TargetAttrs& ta) {
  const uint64_t in = carries_payload(req.opcode) ? req.length : 0;
  const uint64_t back = returned_bytes(req);
  StagedMessage staged(std::max(in, back));
  if (!staged.ok(std::max(in, back))) return {Outcome::NoResponse};  // the requester retries
  if (in && !wire::copy_from_requester(req, staged.iov(), 1, in)) return {Outcome::NoResponse};
  wire::Request fwd = req;
  fwd.local = staged.iov();
  fwd.nlocal = std::max(in, back) ? 1 : 0;
  fwd.pid = wire::self_pid();
  wire::XrcTarget x;
  x.access = ta.access;
  x.min_rnr_timer = ta.min_rnr_timer;
  x.max_dest_rd_atomic = ta.max_dest_rd_atomic;
  int tgt_error = wire::kXrcTgtFine;
  Outcome out = deliver_xrc_elsewhere(fwd, t, x, &tgt_error);
  if (tgt_error != wire::kXrcTgtFine) set_error(t, tgt_error);
  if (out.kind == Outcome::Ack && back && !wire::copy_to_requester(req, staged.iov(), 1, back))
    return {Outcome::NoResponse};
  return out;
}

}  // namespace

Outcome deliver_xrc_elsewhere(const wire::Request& req, Qp* t, wire::XrcTarget x,
                              int* tgt_error) {
  *tgt_error = wire::kXrcTgtFine;
  const FaultRule invalid = fault_rule(Fault::RemoteInvalid);
  const Outcome invalid_request{Outcome::Error, invalid.requester_status};
  const int slot = wire::slot_of_qpn(req.xrc_srqn);
  const XrcDomain* d = t->xrc_domain.get();
  if (!d || !d->shared || slot <= 0 || slot >= wire::kSlots || wire::slot_owner(slot) <= 0) {
    *tgt_error = invalid.responder_event;
    return invalid_request;
  }
  x.tgt_qpn = t->qpn();
  x.dev = static_cast<uint64_t>(d->dev);
  x.ino = static_cast<uint64_t>(d->ino);
  Outcome out;
  if (!wire::agent_xrc_deliver(slot, req, x, &out, tgt_error)) {
    *tgt_error = invalid.responder_event;  // nobody there: the number names no SRQ
    return invalid_request;
  }
  return out;
}

Outcome respond_xrc(const wire::Request& req, const wire::XrcTarget& x, int* tgt_error) {
  *tgt_error = wire::kXrcTgtFine;
  std::shared_lock keys(MrTable::instance().lock());  // keys before queues, always
  std::shared_lock xrc_srqs(xrc_srq_lock());
  Srq* srq = find_shared_xrc_srq_locked(req.xrc_srqn, x.dev, x.ino);
  if (!srq) {  // none of that number, or of another domain: an invalid request
    const FaultRule rule = fault_rule(Fault::RemoteInvalid);
    *tgt_error = rule.responder_event;
    return {Outcome::Error, rule.requester_status};
  }
  const TargetAttrs ta{req.src_qpn, x.access, x.min_rnr_timer, x.max_dest_rd_atomic, 0};
  return run_request(req, Target(srq, x.tgt_qpn, tgt_error), ta);
}

namespace {

// A frame in this process's memory as the request its receive answers: copied, not fetched.
wire::Request frame_request(const iovec* frame, uint32_t flow_tag) {
  wire::Request req;
  req.flow_tag = flow_tag;
  req.type = IBV_QPT_RAW_PACKET;
  req.opcode = IBV_WR_SEND;
  req.length = frame->iov_len;
  req.local = frame;
  req.nlocal = 1;
  req.pid = wire::self_pid();
  return req;
}

}  // namespace

void deliver_frame(Qp* t, const uint8_t* frame, size_t len, uint32_t flow_tag) {
  // A raw QP receives from RTR on; a frame for one in RESET, INIT or ERR is lost.
  int st = t->state.load();
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) return;
  iovec v{const_cast<uint8_t*>(frame), len};
  deliver_receive(frame_request(&v, flow_tag), Target(t), true, 0);
}

void deliver_frame_to_wq(Qp* rss, Wq* wq, const uint8_t* frame, size_t len, uint32_t flow_tag) {
  // An RSS QP has no states of its own that matter (it is never moved out of RESET, as
  // on mlx5); its WQ receives when RDY.
  if (wq->state.load() != IBV_WQS_RDY) return;
  iovec v{const_cast<uint8_t*>(frame), len};
  Target tg(rss, wq->rq);  // the WQ's receives, its PD, its CQ
  tg.qpn = wq->ibv.wq_num;
  deliver_receive(frame_request(&v, flow_tag), tg, true, 0);
}

}  // namespace softverbs::engine
