// Requester: runs the send queue, executing each WQE along the QP's path (wire/router.hpp):
// on a connected QP of another process of this host through the same-host fast paths
// (shm_requester.cpp) when they can, else as a request to the route's transport. The
// completer (completer.cpp) turns each answer into a completion, a retry or an error.
#include <sys/uio.h>

#include <mutex>
#include <optional>
#include <shared_mutex>

#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "engine/tm.hpp"
#include "core/device.hpp"
#include "core/errors.hpp"
#include "core/core.hpp"
#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/shm/window.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

namespace {

bool writes_local(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
         op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

}  // namespace

// Executes the head WQE once: resolves the local buffers, then lets the responder act on
// the target, through its receive window when it has one for us, else directly or via
// the target's agent.
Outcome execute(Qp* qp, const SendWqe& w) {
  if (is_local_op(w.opcode)) {
    ibv_wc_status st = run_local_op(qp, w);
    return st == IBV_WC_SUCCESS ? Outcome{Outcome::Ack} : Outcome{Outcome::Error, st};
  }
  iovec local[Limits::max_sge + 1];
  int nlocal = 0;
  if (!w.inline_data.empty()) {
    local[nlocal++] = {const_cast<uint8_t*>(w.inline_data.data()), w.inline_data.size()};
  } else {
    // The key table is locked only to translate: the memory itself is the application's
    // and stays mapped; the responder takes its own process's key lock.
    std::shared_lock keys(MrTable::instance().lock());
    unsigned need = writes_local(w.opcode) ? IBV_ACCESS_LOCAL_WRITE : 0;
    for (const Sge& s : w.sges) {
      if (s.length == 0) continue;
      if (!resolve_sge(qp->pd, s.lkey, s.addr, s.length, need, &local[nlocal]))
        return {Outcome::Error, fault_rule(Fault::LocalProtection).requester_status};
      ++nlocal;
    }
  }
  if (w.total_length > kMaxMsgSize)
    return {Outcome::Error, fault_rule(Fault::LocalLength).requester_status};
  // A raw packet QP's WQE is one Ethernet frame for the port's interface.
  if (qp->type == IBV_QPT_RAW_PACKET) return send_raw(qp, local, nlocal, w.total_length);

  // A connected peer on this host: through its receive window, or straight into its memory.
  // (XRC always asks the target's agent: the XRC SRQ is named per message.)
  if ((qp->type == IBV_QPT_RC || qp->type == IBV_QPT_UC) && qp->send_path.route == wire::Route::Shm &&
      Device::instance().port_active()) {
    uint32_t dst_qpn = qp->send_path.dest_qpn;
    if ((w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM) &&
        w.total_length <= wire::kWindowPayload) {
      if (auto o = send_through_window(qp, w, local, nlocal, dst_qpn)) return *o;
      count_agent_send(qp);
    } else if (w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM) {
      if (auto o = send_placed(qp, w, local, nlocal, dst_qpn)) return *o;  // too large for it
      count_agent_send(qp);
    } else if (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_READ) {
      if (auto o = rdma_direct(qp, w, local, nlocal, dst_qpn)) return *o;
    } else if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      if (auto o = atomic_direct(qp, w, local, nlocal, dst_qpn)) return *o;
    }
  }

  // A datagram to a UD QP of another process of this host: through its UD window.
  if (qp->type == IBV_QPT_UD && (w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM) &&
      Device::instance().port_active())
    if (auto o = send_ud_through_window(qp, w, local, nlocal)) return *o;

  wire::Request req;
  req.src_qpn = qp->qpn();
  req.type = qp->type;
  req.opcode = w.opcode;
  req.flags = w.flags;
  req.imm = w.imm;
  req.remote_addr = w.remote_addr;
  req.rkey = w.rkey;
  req.compare_add = w.compare_add;
  req.swap = w.swap;
  req.length = w.total_length;
  req.xrc_srqn = w.xrc_srqn;
  req.local = local;
  req.nlocal = nlocal;
  ibv_gid dgid;
  wire::Route route = qp->send_path.route;
  if (qp->type == IBV_QPT_UD) {
    if (w.total_length > 4096)
      return {Outcome::Error, fault_rule(Fault::LocalLength).requester_status};
    dgid = w.dgid;
    req.dst_qpn = w.remote_qpn;
    req.sgid = w.sgid;
    req.dgid = w.dgid;
    // A remote_qkey with the high bit set means "use the QP's own Q_Key" (IBA 10.2.5).
    req.qkey = (w.remote_qkey & 0x80000000u) ? qp->send_path.qkey : w.remote_qkey;
    req.skip_self = qp->block_self_mcast;
    route = wire::route(dgid, req.dst_qpn);
  } else {
    dgid = qp->send_path.dgid;
    req.dst_qpn = qp->send_path.dest_qpn;
  }
  req.pid = wire::self_pid();
  // To a multicast group: each member of this host, through its UD window where it can.
  if (route == wire::Route::Multicast && Device::instance().port_active())
    return send_ud_to_group(qp, w, local, nlocal, req);
  // A port that is down sends nothing: to the requester that looks like silence.
  Outcome o = Device::instance().port_active() ? wire::deliver(route, dgid, req)
                                                : Outcome{Outcome::NoResponse};
  // Through the agent, the message may have used a receive the window counts.
  qp->peer_window.resync = true;
  // Only RC (and XRC) waits for an answer; for UC and UD an undelivered message is lost.
  if (o.kind == Outcome::NoResponse && qp->type != IBV_QPT_RC && qp->type != IBV_QPT_XRC_SEND)
    o = {Outcome::Ack};
  return o;
}

bool run_wqe(Qp* qp, SendWqe& w, int st) {
  AfterComplete tm_kicks;  // rendezvous work this WQE starts runs after it completes
  if (!w.started) {
    w.rnr_left = qp->send_path.rnr_retry;
    w.retry_left = qp->send_path.retry_cnt;
  }
  w.started = true;
  // To a multicast group: this host's members first, then, unless that failed, the other
  // hosts' on the wire (roce_post completes it then), decision 0008.
  if (qp->type == IBV_QPT_UD && wire::route(w.dgid, w.remote_qpn) == wire::Route::Multicast) {
    Outcome here = execute(qp, w);
    if (here.kind == Outcome::Ack && roce_post(qp, w)) return true;  // traced as it leaves
    // This host only: `softverbs trace` writes the one datagram to the group a NIC would.
    if (debug_hooks_armed()) trace_exchange(qp, w, here, false);
    return complete(qp, w, here, st);
  }
  // ---- `softverbs inject` on a connected QP of the wire: fail and delay act on the WQE
  // before it becomes packets (drop and dup on its datagrams, in the link)
  if (debug_hooks_armed() && qp->type != IBV_QPT_UD && qp->roce.load(std::memory_order_relaxed))
    if (std::optional<bool> done = run_wqe_wire_faults(qp, w, st)) return *done;
  // ---- end
  // To another host: the WQE goes out as RoCE v2 packets and completes through the link.
  if (roce_post(qp, w)) return true;
  // (A raw packet QP's frame is traced as it is sent, raw_packet.cpp; no IBA packets.)
  if (debug_hooks_armed() && qp->type != IBV_QPT_RAW_PACKET) return run_wqe_debug(qp, w, st);
  return complete(qp, w, execute(qp, w), st);
}

void run_send_queue(Qp* qp) {
  for (;;) {
    if (qp->has_tm_pending.load(std::memory_order_acquire)) take_tm_work_locked(qp);
    if (qp->sq.empty()) break;
    int st = qp->state.load();
    if (st == IBV_QPS_ERR || st == IBV_QPS_SQE) {
      flush_send_queue_locked(qp);
      break;
    }
    SendWqe& w = qp->sq.front();
    if (st == IBV_QPS_SQD && !w.started) break;  // draining: start nothing new
    if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) break;
    if (w.started && Clock::now() < qp->retry_at) break;  // a timer will kick us
    if (!run_wqe(qp, w, st)) break;
    qp->sq.pop_front();
  }
  check_drained(qp);
}

void kick(Qp* qp) {
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  run_send_queue(qp);
}

void kick_qpn(uint32_t qpn) { wire::kick(qpn); }

void start() {
  trace_writer();  // opens SOFTVERBS_TRACE's file now: the send path asks from its first WR
  wire::EngineHooks hooks;
  hooks.respond = &respond;
  hooks.respond_xrc = &respond_xrc;
  // Kicks that reach us (a peer posted a receive we were waiting for) run on the progress
  // thread, never on the caller's: the agent must not block on other processes.
  hooks.kick = [](Qp* qp) { schedule_kick(qp->qpn(), Clock::now()); };
  wire::set_engine(hooks);
  set_cq_overrun_handler(&cq_overrun);
  wire::ShmHooks shm;
  shm.open_window = &open_window;
  shm.defer_completions = &defer_completions;
  shm.wake_fd = [](Qp* qp) {
    return qp->recv_cq->channel ? qp->recv_cq->channel->events.write_fd() : -1;
  };
  shm.drain = [](Qp* qp) {
    if (qp->type == IBV_QPT_UD) return drain_ud(qp, false);  // its UD windows (shm_ud.cpp)
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<QueueMutex> lock(qp->rq_mu);
    drain_window_locked(qp);
  };
  wire::start_agent(shm);
}

}  // namespace softverbs::engine
