// The requester's local operations: work requests that act on this process's key table and
// send nothing, IBV_WR_BIND_MW and IBV_WR_LOCAL_INV. They run in send-queue order, on
// whatever path the QP takes (the same-host requester, or when posted to a RoCE v2 link,
// which completes them in order behind what it has on the wire).
#include <shared_mutex>

#include "core/core.hpp"
#include "core/errors.hpp"
#include "engine/engine.hpp"

namespace softverbs::engine {

ibv_wc_status run_local_op(Qp* qp, const SendWqe& w) {
  std::shared_lock keys(MrTable::instance().lock());
  if (w.opcode == IBV_WR_BIND_MW) return MrTable::instance().bind_window(w.bind, qp->pd, qp->qpn());
  // LOCAL_INV: of a type 2 window of the QP's PD. An MR's key cannot be invalidated (no
  // fast-registration MRs): a local operation error, as rxe reports it.
  if (MrTable::instance().invalidate(w.imm, qp->pd, qp->qpn(), false)) return IBV_WC_SUCCESS;
  return fault_rule(Fault::LocalInvalidate).requester_status;
}

}  // namespace softverbs::engine
