// Tag matching at the receiving end (rdma-core's Documentation/tag_matching.md, the
// ibv_create_srq_ex(3) and ibv_post_srq_ops(3) man pages; mlx5's completions as facts). A
// message to a QP on a TM-SRQ is an ordinary SEND whose payload starts with a TMH:
//  - EAGER whose tag matches a posted entry: the payload after the TMH lands in the tagged
//    buffer; IBV_WC_TM_RECV, wr_id the entry's recv_wr_id, TM_MATCH | TM_DATA_VALID, the
//    TMH's tag and app_ctx in ibv_wc_read_tm_info;
//  - RNDV (TMH, RVH) that matches: IBV_WC_TM_RECV with TM_MATCH at once; then this QP's
//    requester reads the sender's buffer (the RVH's va, rkey, len) into the tagged buffer,
//    completes TM_RECV with TM_DATA_VALID, and sends the sender a FIN (a TMH, op FIN). A
//    buffer too small for the RVH's length gets the request itself and status
//    IBV_WC_TM_RNDV_INCOMPLETE: software finishes that rendezvous;
//  - EAGER or RNDV that matches nothing: unexpected. The whole message, TMH included, goes
//    to the SRQ's next plain receive (IBV_WC_TM_RECV, no flags), and the list counts it;
//  - NO_TAG, FIN, or no valid TMH: the whole message to a plain receive, IBV_WC_TM_NO_TAG.
// Every receive of a TM-SRQ completes in its own CQ. Both paths (same host and RoCE v2)
// match here: the same-host responder through deliver_tagged, the packet responder through
// tm_take_receive with the first packet's payload.
#include <chrono>
#include <mutex>
#include <thread>

#include "core/device.hpp"
#include "core/errors.hpp"
#include "core/tag_list.hpp"
#include "engine/engine.hpp"
#include "engine/tm.hpp"

namespace softverbs::engine {

namespace {

// Kicks that wait until the requester on this thread has completed the WQE being run: the
// sender must see its SEND complete before the FIN of the rendezvous it started arrives (on
// a wire the ACK goes first). Only set while run_wqe runs a WQE on this thread.
thread_local std::vector<uint32_t>* t_after_complete = nullptr;

void kick_soon(Qp* qp) {
  if (t_after_complete)
    t_after_complete->push_back(qp->qpn());
  else
    schedule_kick(qp->qpn(), Clock::now());
}

// The receive's scatter list, resolved; -1 on a protection error. Key lock held (shared).
int64_t resolve_list(Qp* t, const SgeList& sges, iovec* out, int* n) {
  RecvWqe r;
  r.sges = sges;
  return resolve_recv(t, r, out, n);
}

Cq* tm_cq(Qp* t) { return t->srq && t->srq->tm ? t->srq->tm->cq : t->recv_cq; }

// A receive that failed: its completion in error and, on RC, the QP and its requester told.
Outcome receive_failed(Qp* t, ibv_wc* wc, Fault f) {
  const FaultRule rule = fault_rule(f);
  wc->status = rule.responder_status;
  wc->wc_flags = 0;
  cq_push(tm_cq(t), *wc, false);
  if (rule.responder_to_error) set_error(t, rule.responder_event);
  return {Outcome::Error, rule.requester_status};
}

// The request's gather list without its first `skip` bytes (in the requester's memory).
int skip_local(const wire::Request& req, uint64_t skip, iovec* out) {
  int n = 0;
  for (int i = 0; i < req.nlocal; ++i) {
    iovec v = req.local[i];
    uint64_t k = std::min<uint64_t>(skip, v.iov_len);
    skip -= k;
    if (k == v.iov_len) continue;
    out[n++] = {static_cast<char*>(v.iov_base) + k, v.iov_len - k};
  }
  return n;
}

void consume_plain(Srq* srq) {
  srq->rq.pop_front();
  if (srq->limit && srq->rq.size() < srq->limit) {
    srq->limit = 0;  // one-shot, re-armed by ibv_modify_srq(IBV_SRQ_LIMIT)
    raise_srq_event(srq, IBV_EVENT_SRQ_LIMIT_REACHED);
  }
}

}  // namespace

void queue_tm_work(Qp* qp, SendWqe w) {
  {
    std::lock_guard<SpinLock> lock(qp->tm_mu);
    qp->tm_pending.push_back(std::move(w));
    qp->has_tm_pending.store(true, std::memory_order_release);
  }
  kick_soon(qp);
}

void take_tm_work_locked(Qp* qp) {
  std::lock_guard<SpinLock> lock(qp->tm_mu);
  for (SendWqe& w : qp->tm_pending) qp->sq.push_back(std::move(w));
  qp->tm_pending.clear();
  qp->has_tm_pending.store(false, std::memory_order_relaxed);
}

void complete_tm_work(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len) {
  if (w.tm.kind != TmWork::kRndvRead) return;  // a FIN's fate shows in the QP's state only
  // The rendezvous' TM_MATCH completion may still be held back by the agent thread that
  // matched it (defer_completions, until its answer has left): TM_DATA_VALID must not
  // overtake it. The agent lets go within microseconds; the wait is bounded all the same,
  // because this thread may hold a lock that agent's next request needs.
  Cq* cq = tm_cq(qp);
  if (!completions_deferred()) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (cq->held_back.load(std::memory_order_acquire) != 0 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
  ibv_wc wc{};
  wc.wr_id = w.tm.recv_wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_TM_RECV;
  wc.qp_num = qp->qpn();
  wc.src_qp = qp->send_path.dest_qpn;
  if (status == IBV_WC_SUCCESS) {
    wc.wc_flags = IBV_WC_TM_DATA_VALID;
    wc.byte_len = byte_len;
  }
  cq_push(cq, wc, false);
  if (status != IBV_WC_SUCCESS) return;
  SendWqe fin;
  fin.opcode = IBV_WR_SEND;
  fin.inline_data.resize(kTmhBytes);
  write_tmh(fin.inline_data.data(), kTmhFin, w.tm.app_ctx, w.tm.tag);
  fin.total_length = kTmhBytes;
  fin.tm = {TmWork::kFin, w.tm.recv_wr_id, w.tm.tag, w.tm.app_ctx};
  std::lock_guard<SpinLock> lock(qp->tm_mu);  // the caller runs the queue: no kick needed
  qp->tm_pending.push_back(std::move(fin));
  qp->has_tm_pending.store(true, std::memory_order_release);
}

AfterComplete::AfterComplete() : outer_(t_after_complete) { t_after_complete = &kicks_; }
AfterComplete::~AfterComplete() {
  t_after_complete = outer_;
  for (uint32_t qpn : kicks_) schedule_kick(qpn, Clock::now());
}

TmDecision tm_decide(Qp* t, const uint8_t* head, uint32_t n) {
  Srq* srq = t->srq;
  TmDecision d;
  auto h = parse_tm_header(head, n);
  if (!h || (h->op != kTmhEager && h->op != kTmhRndv)) return d;  // NO_TAG: plain
  d.header = *h;
  if (auto handle = srq->tm->list.find_match(h->tag)) {
    d.kind = h->op == kTmhEager ? TmDecision::kEager : TmDecision::kRndv;
    d.handle = *handle;
  } else {
    d.kind = TmDecision::kUnexpected;
  }
  return d;
}

Outcome deliver_tagged(const wire::Request& req, Qp* t, uint8_t rnr_timer) {
  Srq* srq = t->srq;
  const uint64_t len = req.length;
  uint8_t head[kTmhBytes + kRvhBytes];
  const auto n = static_cast<uint32_t>(std::min<uint64_t>(len, sizeof(head)));
  if (n) {
    iovec h{head, n};
    if (!wire::copy_from_requester(req, &h, 1, n)) return {Outcome::NoResponse};
  }
  std::lock_guard<QueueMutex> lock(srq->mu);
  TmDecision d = tm_decide(t, head, n);
  ibv_wc wc{};
  wc.qp_num = t->qpn();
  wc.src_qp = req.src_qpn;
  if (req.opcode == IBV_WR_SEND_WITH_IMM) {
    wc.imm_data = req.imm;
    wc.wc_flags = IBV_WC_WITH_IMM;
  }
  iovec dst[Limits::max_sge];
  int ndst = 0;
  if (d.kind == TmDecision::kEager || d.kind == TmDecision::kRndv) {
    const TagEntry& e = srq->tm->list.entry(d.handle);
    const ibv_wc_tm_info info{d.header.tag, d.header.app_ctx};
    wc.wr_id = e.wr_id;
    wc.opcode = IBV_WC_TM_RECV;
    int64_t cap = resolve_list(t, e.sges, dst, &ndst);
    if (cap < 0) {
      srq->tm->list.take(d.handle);
      return receive_failed(t, &wc, Fault::RecvProtection);
    }
    if (d.kind == TmDecision::kEager) {
      const uint64_t payload = len - kTmhBytes;
      if (static_cast<uint64_t>(cap) < payload) {
        srq->tm->list.take(d.handle);
        return receive_failed(t, &wc, Fault::RecvTooSmall);
      }
      iovec src[Limits::max_sge + 1];
      wire::Request rest = req;
      rest.nlocal = skip_local(req, kTmhBytes, src);
      rest.local = src;
      if (!wire::copy_from_requester(rest, dst, ndst, payload)) return {Outcome::NoResponse};
      srq->tm->list.take(d.handle);
      wc.wc_flags |= IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
      wc.byte_len = static_cast<uint32_t>(payload);
      cq_push(srq->tm->cq, wc, (req.flags & IBV_SEND_SOLICITED) != 0, &info);
      return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
    }
    // Rendezvous: matched now, the data follows by RDMA READ.
    TagEntry entry = srq->tm->list.take(d.handle);
    wc.wc_flags |= IBV_WC_TM_MATCH;
    cq_push(srq->tm->cq, wc, false, &info);
    if (d.header.len > static_cast<uint64_t>(cap)) {
      // Software's to finish: it gets the request itself (as much as fits).
      const uint64_t k = std::min<uint64_t>(len, static_cast<uint64_t>(cap));
      if (k && !wire::copy_from_requester(req, dst, ndst, k)) return {Outcome::NoResponse};
      wc.status = IBV_WC_TM_RNDV_INCOMPLETE;
      wc.wc_flags = 0;
      wc.byte_len = static_cast<uint32_t>(k);
      cq_push(srq->tm->cq, wc, false);
      return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
    }
    queue_tm_work(t, rndv_read_wqe(entry, d.header));
    return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
  }
  // Unexpected or untagged: the whole message to the next plain receive.
  if (srq->rq.empty()) {
    srq->rnr_waiters.insert(req.src_qpn);
    return {Outcome::RnrNak, IBV_WC_SUCCESS, rnr_timer};
  }
  const RecvWqe& r = srq->rq.front();
  wc.wr_id = r.wr_id;
  wc.opcode = d.kind == TmDecision::kUnexpected ? IBV_WC_TM_RECV : IBV_WC_TM_NO_TAG;
  int64_t cap = resolve_recv(t, r, dst, &ndst);
  if (cap < 0 || static_cast<uint64_t>(cap) < len) {
    consume_plain(srq);
    return receive_failed(t, &wc, cap < 0 ? Fault::RecvProtection : Fault::RecvTooSmall);
  }
  if (!wire::copy_from_requester(req, dst, ndst, len)) return {Outcome::NoResponse};
  consume_plain(srq);
  if (d.kind == TmDecision::kUnexpected) srq->tm->list.note_unexpected();
  wc.byte_len = static_cast<uint32_t>(len);
  cq_push(srq->tm->cq, wc, (req.flags & IBV_SEND_SOLICITED) != 0);
  return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
}

SendWqe rndv_read_wqe(const TagEntry& entry, const TmHeader& h) {
  SendWqe w;
  w.opcode = IBV_WR_RDMA_READ;
  w.flags = IBV_SEND_SIGNALED;  // its completion becomes the TM-SRQ's (complete_tm_work)
  w.wr_id = entry.wr_id;
  w.remote_addr = h.va;
  w.rkey = h.rkey;
  w.total_length = h.len;
  // The tagged buffer, trimmed to the length the sender offers.
  uint64_t left = h.len;
  for (const Sge& s : entry.sges) {
    if (left == 0) break;
    const auto k = static_cast<uint32_t>(std::min<uint64_t>(left, s.length));
    w.sges.push_back({s.addr, k, s.lkey});
    left -= k;
  }
  w.tm = {TmWork::kRndvRead, entry.wr_id, h.tag, h.app_ctx};
  return w;
}

}  // namespace softverbs::engine
