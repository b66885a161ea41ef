// The IBA roles, run by whoever posts (the initiator acts as the NIC):
//  - requester (requester.cpp): turns send-queue WQEs into operations on the target QP;
//  - responder (responder.cpp): executes an incoming operation against the target's MRs
//    and RQ/SRQ and writes the target's receive completions;
//  - completer (requester.cpp): retires send WQEs, RNR/transport retries, error flushes.
// What cannot happen inline (timed retries, deferred flushes) goes to one progress
// thread (progress.cpp) that sleeps on a condition variable; it never spins.
#pragma once

#include <sys/uio.h>

#include "verbs/objects.hpp"

namespace softverbs::engine {

// How the responder answered one request (what a NIC would see as ACK/NAK/silence).
struct Outcome {
  enum Kind { Ack, RnrNak, NoResponse, Error } kind = Ack;
  ibv_wc_status status = IBV_WC_SUCCESS;  // for Error: the requester's completion status
  uint8_t rnr_timer = 0;                  // for RnrNak: the responder's min_rnr_timer
  uint32_t byte_len = 0;
};

// Runs `qp`'s send queue as far as it can. Caller holds qp->sq_mu.
void run_send_queue(Qp* qp);
// Locks the send queue and runs it (after a timer fired or a receive was posted).
void kick(Qp* qp);
void kick_qpn(uint32_t qpn);

// Executes one request on the target QP `t` on behalf of requester `s`. `local` is the
// requester's gather list (SEND/WRITE) or scatter list (READ/atomics).
Outcome respond(Qp* s, Qp* t, const SendWqe& w, const iovec* local, int nlocal, uint64_t len);

// Moves `qp` to ERR, raises `event` (if >= 0) and flushes its queues from the progress thread.
void set_error(Qp* qp, int event);
// Completes every outstanding WQE with IBV_WC_WR_FLUSH_ERR. Caller holds no QP lock.
void flush(Qp* qp);
void flush_send_queue_locked(Qp* qp);  // caller holds qp->sq_mu
// A CQ overran: raise CQ_ERR (first time) and move every QP feeding it to ERR.
void cq_overrun(Cq* cq, bool first);

void push_send_completion(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len);
void push_recv_completion(Qp* qp, uint64_t wr_id, ibv_wc_status status);

// Progress thread services.
void schedule_kick(uint32_t qpn, Clock::time_point when);
void schedule_flush(uint32_t qpn);

}  // namespace softverbs::engine
