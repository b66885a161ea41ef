// Completer: retires send WQEs. An answer becomes a send completion, a timed retry (RNR
// NAK: the responder's min_rnr_timer and the QP's rnr_retry; no answer: the QP's timeout and
// retry_cnt) or an error (the QP to SQE or ERR, what follows flushed); also the flushes and
// error moves every role needs.
#include <chrono>
#include <mutex>
#include <thread>

#include "engine/engine.hpp"
#include "core/errors.hpp"
#include "common/verbs_ext.hpp"
#include "core/check_hooks.hpp"
#include "core/core.hpp"
#include "engine/tm.hpp"

namespace softverbs::engine {

namespace {

// IBA min_rnr_timer encoding (table 45), in microseconds; code 0 means 655.36 ms.
constexpr uint32_t kRnrDelayUs[32] = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  if (op == kWrFlush) return kWcFlush;  // not in the 44 headers' enum
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE:
      return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;
  }
}

}  // namespace

void check_drained(Qp* qp) {
  if (qp->roce.load(std::memory_order_relaxed)) return;  // its RoCE link tells (roce.cpp)
  if (qp->state.load() != IBV_QPS_SQD || !qp->sq_drain_notify) return;
  if (!qp->sq.empty() && qp->sq.front().started) return;
  qp->sq_drain_notify = false;
  raise_qp_event(qp, IBV_EVENT_SQ_DRAINED);
}

// Local ACK timeout: 4.096 us * 2^timeout; 0 means "infinite" — we then retry every
// 100 ms without ever giving up, which is what a peer that never answers looks like.
Clock::duration ack_timeout(uint8_t timeout) {
  if (timeout == 0) return std::chrono::milliseconds(100);
  return std::chrono::nanoseconds(4096ull << std::min<uint8_t>(timeout, 31));
}

void push_send_completion(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len) {
  if (w.tm.kind != TmWork::kNone) {  // tag matching's own work, not the application's
    complete_tm_work(qp, w, status, byte_len);
    return;
  }
  bool signaled = qp->sq_sig_all || (w.flags & IBV_SEND_SIGNALED);
  if (status == IBV_WC_SUCCESS && !signaled) return;
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode(w.opcode);
  wc.byte_len = byte_len;
  wc.qp_num = qp->qpn();
  cq_push(qp->send_cq, wc, false);
}

bool complete(Qp* qp, SendWqe& w, Outcome o, int st) {
  if (o.kind == Outcome::RnrNak || o.kind == Outcome::NoResponse) {
    bool rnr = o.kind == Outcome::RnrNak;
    if (rnr && check_hooks::rnr_wait) check_hooks::rnr_wait(qp);
    int& left = rnr ? w.rnr_left : w.retry_left;
    uint8_t timeout = qp->send_path.timeout;
    bool infinite = rnr ? left == 7 : timeout == 0;
    if (!infinite && left == 0) {
      o = {Outcome::Error,
           fault_rule(rnr ? Fault::RnrExhausted : Fault::RetryExhausted).requester_status};
    } else {
      if (!infinite) --left;
      Clock::duration delay = rnr ? std::chrono::microseconds(kRnrDelayUs[o.rnr_timer & 31])
                                  : ack_timeout(timeout);
      qp->retry_at = Clock::now() + delay;
      schedule_kick(qp->qpn(), qp->retry_at);
      return false;
    }
  }
  if (o.kind == Outcome::Error) {
    push_send_completion(qp, w, o.status, 0);
    if (requester_state_after_error(qp->type) == IBV_QPS_ERR) {
      set_error(qp, -1);
    } else {
      int expect = st;
      qp->state.compare_exchange_strong(expect, IBV_QPS_SQE);
    }
    return true;  // what follows it is flushed
  }
  push_send_completion(qp, w, IBV_WC_SUCCESS, o.byte_len);
  return true;
}

void flush_send_queue_locked(Qp* qp) {
  while (!qp->sq.empty()) {
    push_send_completion(qp, qp->sq.front(), IBV_WC_WR_FLUSH_ERR, 0);
    qp->sq.pop_front();
  }
}

void push_recv_completion(Qp* qp, uint64_t wr_id, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->qpn();
  cq_push(qp->recv_cq, wc, false);
}

void flush(Qp* qp) {
  if (qp->state.load() == IBV_QPS_ERR) close_window(qp, true);
  {
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    if (qp->state.load() == IBV_QPS_ERR || qp->state.load() == IBV_QPS_SQE)
      flush_send_queue_locked(qp);
  }
  // The receive completion of the error that took the QP to ERR may still be held back by
  // the agent thread that answered it (defer_completions): the flushes must not overtake
  // it. As complete_tm_work waits, bounded (the agent lets go within microseconds).
  if (!completions_deferred()) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (qp->recv_cq->held_back.load(std::memory_order_acquire) != 0 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
  std::lock_guard<QueueMutex> lock(qp->rq_mu);
  // Checked under the lock: a reset and new receives may have come in meanwhile.
  if (qp->state.load() != IBV_QPS_ERR) return;
  while (!qp->rq.empty()) {
    push_recv_completion(qp, qp->rq.front().wr_id, IBV_WC_WR_FLUSH_ERR);
    qp->rq.pop_front();
  }
  // An SRQ-attached QP in error consumes no more SRQ WQEs: tell the application.
  if (qp->srq && !qp->last_wqe_raised) {
    qp->last_wqe_raised = true;
    raise_qp_event(qp, IBV_EVENT_QP_LAST_WQE_REACHED);
  }
}

void set_error(Qp* qp, int event) {
  if (qp->state.exchange(IBV_QPS_ERR) == IBV_QPS_ERR) return;
  // The receive window (if any) is closed when the progress thread flushes the QP.
  if (event >= 0) raise_qp_event(qp, static_cast<ibv_event_type>(event));
  schedule_flush(qp->qpn());
}

void cq_overrun(Cq* cq, bool first) {
  std::lock_guard<std::mutex> lock(cq->ctx->objects_mu);
  cq_overrun_locked(cq, first);
}

void cq_overrun_locked(Cq* cq, bool first) {
  if (first) raise_cq_event(cq, IBV_EVENT_CQ_ERR);
  for (Qp* qp : cq->ctx->qps)
    if (qp->send_cq == cq || qp->recv_cq == cq) set_error(qp, IBV_EVENT_QP_FATAL);
}

}  // namespace softverbs::engine

