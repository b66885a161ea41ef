// The send path while `softverbs inject` or `softverbs trace` is in use (run_wqe_debug):
// a same-host WQE meets the faults armed on its QP (QpDebug) as a NIC would meet them on a
// real network, then runs as usual and is written to the trace.
//  - fail:  completes with the chosen status; the completer moves the QP on as for any such
//           error (RC: ERR, the rest flushed; UC/UD: SQE); IBV_WC_FATAL_ERR also raises
//           IBV_EVENT_QP_FATAL, as a catastrophic work queue error does;
//  - drop:  the request is lost: RC retransmits after the QP's timeout while retry_cnt
//           lasts (then IBV_WC_RETRY_EXC_ERR); UC/UD complete and the peer gets nothing;
//  - delay: the request leaves delay_ms later;
//  - dup:   it arrives twice: RC/UC responders drop the duplicate by its PSN (RC answers it
//           again), a UD responder delivers it twice.
// Each counter counts attempts: a retransmission meets the next one.
#include <chrono>
#include <mutex>

#include "core/core.hpp"
#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "engine/tm.hpp"

namespace softverbs::engine {

namespace {

// The outcome the armed faults give this attempt; nullopt: none applies, run it.
std::optional<Outcome> injected(Qp* qp, const SendWqe& w) {
  QpDebug& d = qp->debug;
  if (d.fail) {
    --d.fail;
    if (d.fail_status == IBV_WC_FATAL_ERR) raise_qp_event(qp, IBV_EVENT_QP_FATAL);
    return Outcome{Outcome::Error, d.fail_status};
  }
  if (is_local_op(w.opcode)) return std::nullopt;  // nothing goes on the wire
  const bool reliable = qp->type == IBV_QPT_RC || qp->type == IBV_QPT_XRC_SEND;
  if (d.drop) {
    --d.drop;
    // Unreliable transports never learn of the loss: the WQE completes as sent.
    return reliable ? Outcome{Outcome::NoResponse}
                    : Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, uint32_t(w.total_length)};
  }
  return std::nullopt;
}

}  // namespace

bool run_wqe_debug(Qp* qp, SendWqe& w, int st) {
  QpDebug& d = qp->debug;
  if (w.tm.kind != TmWork::kNone) return complete(qp, w, execute(qp, w), st);
  if (d.delay && !d.head_delayed && !is_local_op(w.opcode)) {
    --d.delay;
    d.head_delayed = true;
    qp->retry_at = Clock::now() + std::chrono::milliseconds(d.delay_ms);
    schedule_kick(qp->qpn(), qp->retry_at);
    return false;
  }
  std::optional<Outcome> fault = d.any_fault() ? injected(qp, w) : std::nullopt;
  Outcome o = fault ? *fault : execute(qp, w);
  trace_exchange(qp, w, o, false);
  if (!fault && d.dup && o.kind == Outcome::Ack && !is_local_op(w.opcode)) {
    --d.dup;
    // The copy: only a UD responder has no PSN to tell it from the first.
    if (qp->type == IBV_QPT_UD) execute(qp, w);
    trace_exchange(qp, w, o, true);
  }
  bool done = complete(qp, w, o, st);
  if (done) d.head_delayed = false;
  return done;
}

std::optional<bool> run_wqe_wire_faults(Qp* qp, SendWqe& w, int st) {
  QpDebug& d = qp->debug;
  if (w.tm.kind != TmWork::kNone || is_local_op(w.opcode)) return std::nullopt;
  if (d.head_delayed) {  // its delay is over: it goes now
    d.head_delayed = false;
    return std::nullopt;
  }
  if (d.delay) {
    --d.delay;
    d.head_delayed = true;
    qp->retry_at = Clock::now() + std::chrono::milliseconds(d.delay_ms);
    schedule_kick(qp->qpn(), qp->retry_at);
    return false;
  }
  if (d.fail) {
    // Completions come in WQE order: the WQEs already on the wire complete first (their
    // ACKs), then this one fails. Looked at again each millisecond.
    if (roce_in_flight(qp)) {
      qp->retry_at = Clock::now() + std::chrono::milliseconds(1);
      schedule_kick(qp->qpn(), qp->retry_at);
      return false;
    }
    --d.fail;
    if (d.fail_status == IBV_WC_FATAL_ERR) raise_qp_event(qp, IBV_EVENT_QP_FATAL);
    return complete(qp, w, Outcome{Outcome::Error, d.fail_status}, st);
  }
  return std::nullopt;
}

}  // namespace softverbs::engine
