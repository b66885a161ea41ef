// Responder faults of `softverbs inject` (verbs/inject.cpp arms them in QpDebug): what the
// QP that receives does with its next requests, decided once here for both of its
// responders, the same-host one (responder.cpp's respond) and the RoCE link's
// (packet/responder.cpp through RoceLink). As on a NIC, the responder is where these are
// detected:
//  - rnr:  a message that needs a receive finds none: RNR NAK, the requester waits its
//          timer and retries while rnr_retry lasts; nothing happens to this QP;
//  - REM_ACCESS_ERR / REM_INV_REQ_ERR / REM_OP_ERR: the request is NAKed with that
//          syndrome and this QP goes to ERR with the affiliated async event of the error
//          class (IBA 11.6.3: QP_ACCESS_ERR, QP_REQ_ERR, QP_FATAL), its receives flushed;
//  - LOC_LEN_ERR / LOC_PROT_ERR: the message takes a receive that completes with that
//          status (the receive's buffer too small, its lkey bad); the QP goes to ERR with
//          no event (the completion is the report) and the requester gets the NAK the
//          error table says (REM_INV_REQ_ERR, REM_OP_ERR).
#include "core/errors.hpp"
#include "engine/engine.hpp"

namespace softverbs::engine {

bool consumes_receive(ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
         op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

ResponderFault take_responder_fault(Qp* t, bool needs_receive, uint8_t min_rnr_timer) {
  QpDebug& d = t->debug;
  ResponderFault f;
  if (needs_receive && take_one(d.resp_rnr)) {
    int timer = d.resp_rnr_timer.load(std::memory_order_relaxed);
    f.kind = ResponderFault::kRnr;
    f.rnr_timer = timer >= 0 ? uint8_t(timer) : min_rnr_timer;
    return f;
  }
  const auto status = ibv_wc_status(d.resp_status.load(std::memory_order_relaxed));
  const bool on_receive = status == IBV_WC_LOC_LEN_ERR || status == IBV_WC_LOC_PROT_ERR;
  if (on_receive && !needs_receive) return f;  // waits for a message that takes a receive
  if (!take_one(d.resp_fail)) return f;
  if (on_receive) {
    const FaultRule rule =
        fault_rule(status == IBV_WC_LOC_LEN_ERR ? Fault::RecvTooSmall : Fault::RecvProtection);
    f.kind = ResponderFault::kReceive;
    f.recv_status = rule.responder_status;
    f.requester_status = rule.requester_status;
    f.event = rule.responder_event;
    return f;
  }
  f.kind = ResponderFault::kNak;
  f.requester_status = status;
  if (status == IBV_WC_REM_ACCESS_ERR) f.event = fault_rule(Fault::RemoteAccess).responder_event;
  else if (status == IBV_WC_REM_INV_REQ_ERR) f.event = fault_rule(Fault::RemoteInvalid).responder_event;
  else f.event = IBV_EVENT_QP_FATAL;  // REM_OP_ERR: the responder's own work queue failed
  return f;
}

void give_back_responder_fault(Qp* t) { t->debug.resp_fail.fetch_add(1, std::memory_order_relaxed); }

}  // namespace softverbs::engine
