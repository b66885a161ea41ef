// The error table: every failure a work request can meet, and what each side sees.
// One row per situation; the engine looks outcomes up here instead of deciding inline.
// docs/errors.md is this table in prose (keep the two in step).
#pragma once

#include <infiniband/verbs.h>

namespace softverbs {

enum class Fault {
  LocalProtection,   // requester: bad lkey, SGE outside its MR, or missing LOCAL_WRITE
  LocalLength,       // requester: message longer than the port's max_msg_sz (UD: the MTU)
  RemoteAccess,      // responder: bad rkey, range outside the MR, or missing remote access
  RemoteInvalid,     // responder: operation the QP does not allow (READ/atomic with
                     // max_dest_rd_atomic 0, misaligned atomic)
  RecvProtection,    // responder: the receive WQE's SGEs fail the lkey/range check
  RecvTooSmall,      // responder: the message does not fit the receive WQE
  RnrExhausted,      // no receive WQE and rnr_retry RNR NAKs used up
  RetryExhausted,    // no answer (peer QP absent, not in RTR/RTS, port down) after retry_cnt
  MwBind,            // requester: a memory window bind breaks a rule (IBA 10.6.7)
  LocalInvalidate,   // requester: LOCAL_INV of a key that names no bound type 2 window
  RemoteInvalidate,  // responder: the same for the R_Key of a SEND_WITH_INV (IBA class J)
};

struct FaultRule {
  ibv_wc_status requester_status;  // completion of the failing send WQE (RC)
  ibv_wc_status responder_status;  // completion of the consumed receive WQE, if any
  bool responder_to_error;         // responder QP moves to ERR
  int responder_event;             // async event on the responder QP, or -1
};

constexpr FaultRule fault_rule(Fault f) {
  switch (f) {
    case Fault::LocalProtection:
      return {IBV_WC_LOC_PROT_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::LocalLength:
      return {IBV_WC_LOC_LEN_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::RemoteAccess:
      return {IBV_WC_REM_ACCESS_ERR, IBV_WC_SUCCESS, true, IBV_EVENT_QP_ACCESS_ERR};
    case Fault::RemoteInvalid:
      return {IBV_WC_REM_INV_REQ_ERR, IBV_WC_SUCCESS, true, IBV_EVENT_QP_REQ_ERR};
    case Fault::RecvProtection:
      return {IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR, true, -1};
    case Fault::RecvTooSmall:
      return {IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR, true, -1};
    case Fault::RnrExhausted:
      return {IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::RetryExhausted:
      return {IBV_WC_RETRY_EXC_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::MwBind:
      return {IBV_WC_MW_BIND_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::LocalInvalidate:
      return {IBV_WC_LOC_QP_OP_ERR, IBV_WC_SUCCESS, false, -1};
    case Fault::RemoteInvalidate:
      return {IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_INV_REQ_ERR, true, -1};
  }
  return {IBV_WC_GENERAL_ERR, IBV_WC_SUCCESS, false, -1};
}

// The requester QP after a failed send WQE: RC goes to ERR; UC and UD only stop their send
// queue (SQE) and keep receiving. Every WQE behind the failed one completes with
// IBV_WC_WR_FLUSH_ERR, signaled or not.
constexpr ibv_qp_state requester_state_after_error(ibv_qp_type type) {
  return type == IBV_QPT_RC ? IBV_QPS_ERR : IBV_QPS_SQE;
}

}  // namespace softverbs
