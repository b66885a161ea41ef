// Tag matching on the RoCE v2 path (see tm_responder.cpp for the rules): the packet
// responder (engine/packet/) asks for a receive with a SEND's first packet, which holds the
// TMH and RVH; what the TM-SRQ decided goes with the receive (packet::TmMark) and becomes
// the TM-SRQ's completions when the message is complete. A matched rendezvous then gives
// this QP's requester its READ and FIN, as on the same host.
#include <mutex>

#include "core/core.hpp"
#include "core/tag_list.hpp"
#include "engine/tm.hpp"

namespace softverbs::engine {

namespace {

// Resolves a scatter list into r->sg with local write access; a key that fails leaves
// the receive holding nothing (IBV_WC_LOC_PROT_ERR once the message arrives).
void resolve_into(Qp* qp, const SgeList& sges, packet::RecvWqe* r) {
  for (const Sge& s : sges) {
    if (s.length == 0) continue;
    iovec at{};
    if (!resolve_sge(qp->pd, s.lkey, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, &at)) {
      r->sg.clear();
      r->key_error = true;
      return;
    }
    r->sg.push_back({static_cast<uint8_t*>(at.iov_base), static_cast<uint32_t>(at.iov_len)});
  }
}

uint64_t capacity(const packet::RecvWqe& r) {
  uint64_t n = 0;
  for (const packet::Iov& v : r.sg) n += v.len;
  return n;
}

}  // namespace

std::optional<packet::RecvWqe> tm_take_receive(Qp* qp, std::span<const uint8_t> first,
                                               TmArrival* arrival) {
  Srq* srq = qp->srq;
  std::lock_guard<QueueMutex> lock(srq->mu);
  const auto n = static_cast<uint32_t>(std::min<size_t>(first.size(), kTmhBytes + kRvhBytes));
  TmDecision d = tm_decide(qp, first.data(), n);
  packet::RecvWqe r;
  r.tm.tag = d.header.tag;
  r.tm.app_ctx = d.header.app_ctx;
  if (d.kind == TmDecision::kEager || d.kind == TmDecision::kRndv) {
    TagEntry e = srq->tm->list.take(d.handle);
    r.wr_id = e.wr_id;
    resolve_into(qp, e.sges, &r);
    if (d.kind == TmDecision::kEager) {
      r.skip = kTmhBytes;
      r.tm.kind = kTmRecvEager;
    } else if (!r.key_error && d.header.len > capacity(r)) {
      r.tm.kind = kTmRecvRndvIncomplete;  // the request itself, for software to finish
    } else {
      r.discard = true;
      r.tm.kind = kTmRecvRndv;
    }
    arrival->entry = std::move(e);
    arrival->header = d.header;
    return r;
  }
  if (srq->rq.empty()) return std::nullopt;  // RNR: the sender retries
  r.wr_id = srq->rq.front().wr_id;
  resolve_into(qp, srq->rq.front().sges, &r);
  srq->rq.pop_front();
  if (srq->limit && srq->rq.size() < srq->limit) {
    srq->limit = 0;
    raise_srq_event(srq, IBV_EVENT_SRQ_LIMIT_REACHED);
  }
  r.tm.kind = d.kind == TmDecision::kUnexpected ? kTmRecvUnexpected : kTmRecvPlain;
  return r;
}

void tm_complete_receive(Qp* qp, const packet::Completion& c, TmArrival* arrival) {
  Srq* srq = qp->srq;
  Cq* cq = srq->tm->cq;
  ibv_wc wc{};
  wc.wr_id = c.wr_id;
  wc.status = c.status;
  wc.qp_num = qp->qpn();
  wc.opcode = c.tm.kind == kTmRecvPlain ? IBV_WC_TM_NO_TAG : IBV_WC_TM_RECV;
  if (c.status != IBV_WC_SUCCESS) {  // ibv_poll_cq(3): on error only these are valid
    wc.opcode = {};
    cq_push(cq, wc, c.solicited);
    return;
  }
  wc.src_qp = c.src_qp;
  wc.byte_len = c.byte_len;
  wc.imm_data = c.imm_data;
  wc.wc_flags = c.wc_flags & IBV_WC_WITH_IMM;
  const ibv_wc_tm_info info{c.tm.tag, c.tm.app_ctx};
  switch (c.tm.kind) {
    case kTmRecvEager:
      wc.wc_flags |= IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
      cq_push(cq, wc, c.solicited, &info);
      return;
    case kTmRecvRndv:
    case kTmRecvRndvIncomplete:
      wc.wc_flags |= IBV_WC_TM_MATCH;
      wc.byte_len = 0;
      cq_push(cq, wc, false, &info);
      if (c.tm.kind == kTmRecvRndv) {
        queue_tm_work(qp, rndv_read_wqe(arrival->entry, arrival->header));
      } else {
        wc.status = IBV_WC_TM_RNDV_INCOMPLETE;
        wc.wc_flags = 0;
        wc.byte_len = c.byte_len;
        cq_push(cq, wc, false);
      }
      arrival->entry = {};
      return;
    case kTmRecvUnexpected: {
      std::lock_guard<QueueMutex> lock(srq->mu);
      srq->tm->list.note_unexpected();
      break;
    }
    default:
      break;
  }
  cq_push(cq, wc, c.solicited);
}

void tm_complete_work(Qp* qp, const packet::Completion& c) {
  SendWqe w;
  w.tm = {static_cast<TmWork::Kind>(c.tm.kind), c.wr_id, c.tm.tag, c.tm.app_ctx};
  complete_tm_work(qp, w, c.status, c.byte_len);
  schedule_kick(qp->qpn(), Clock::now());  // the FIN it may have queued
}

}  // namespace softverbs::engine
