// The IBA roles, one per file, run by whoever posts (the initiator acts as the NIC):
//  - requester (requester.cpp): turns send-queue WQEs into operations on the target QP,
//    along the QP's path (wire/router.hpp); its same-host fast paths are shm_requester.cpp;
//  - responder (responder.cpp): executes an incoming operation against the target's MRs
//    and RQ/SRQ and writes the target's receive completions; what a same-host peer left in
//    a receive window lands through shm_responder.cpp;
//  - completer (completer.cpp): retires send WQEs, RNR/transport retries, error flushes.
// What cannot happen inline (timed retries, deferred flushes) goes to one progress
// thread (progress.cpp) that sleeps on a condition variable; it never spins.
#pragma once

#include <sys/uio.h>

#include <optional>

#include "core/flow_rule.hpp"
#include "core/objects.hpp"
#include "core/core.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

// How the responder answered one request (what a NIC would see as ACK/NAK/silence).
using Outcome = wire::Reply;

// Connects the engine to the transport (responder, kicks); once per process.
void start();

// Runs `qp`'s send queue as far as it can. Caller holds qp->sq_mu.
void run_send_queue(Qp* qp);
// Runs one WQE, the head of the send queue or one about to be (post_send's fast path, when
// the queue is empty), in QP state `st` (RTS or SQD): true when it completed (successfully
// or not), false when it waits for a retry (a timer will kick the queue). Holds qp->sq_mu.
bool run_wqe(Qp* qp, SendWqe& w, int st);
// run_wqe when `softverbs inject` or `softverbs trace` is in use (debug_send.cpp): the
// QP's injected faults first, then the WQE as run_wqe runs it, recorded in the trace.
bool run_wqe_debug(Qp* qp, SendWqe& w, int st);
// ---- responder faults of `softverbs inject` (debug_respond.cpp), taken by both responders
// once per request while debug hooks are armed.
struct ResponderFault {
  enum Kind { kNone, kRnr, kNak, kReceive } kind = kNone;
  uint8_t rnr_timer = 0;                            // kRnr
  ibv_wc_status requester_status = IBV_WC_SUCCESS;  // kNak, kReceive: the NAK's status
  ibv_wc_status recv_status = IBV_WC_SUCCESS;       // kReceive: the receive's completion
  int event = -1;                                   // the QP's async event as it goes to ERR
};
// The fault the next request of QP `t` meets (`needs_receive`: it consumes a receive).
ResponderFault take_responder_fault(Qp* t, bool needs_receive, uint8_t min_rnr_timer);
// A kReceive fault that found no receive (the message is RNR NAKed instead): armed again.
void give_back_responder_fault(Qp* t);
bool consumes_receive(ibv_wr_opcode op);
// ---- end responder faults
// The same for a connected QP on the wire, before roce_post (debug_send.cpp): its `fail`
// and `delay`; nullopt: none applies, send it.
std::optional<bool> run_wqe_wire_faults(Qp* qp, SendWqe& w, int st);
// Writes a same-host exchange to the trace (trace_shm.cpp): the request packets of `w` and
// what the responder answered (`o`); `resend`: the same request again (a duplicate), with
// the PSNs of the last one. Caller holds qp->sq_mu.
void trace_exchange(Qp* qp, const SendWqe& w, const Outcome& o, bool resend);
// Requester: executes one WQE once along its QP's path; what the target answered.
Outcome execute(Qp* qp, const SendWqe& w);
// Completer: what answer `o` means for WQE `w` (QP state `st`): true when it completed,
// false when it waits for a retry (a timer will kick the queue). Holds qp->sq_mu.
bool complete(Qp* qp, SendWqe& w, Outcome o, int st);
// SQ_DRAINED once an SQD QP has nothing in flight. Holds qp->sq_mu.
void check_drained(Qp* qp);

// IBV_WR_BIND_MW and IBV_WR_LOCAL_INV (local_ops.cpp): what their completion says.
inline bool is_local_op(ibv_wr_opcode op) { return op == IBV_WR_LOCAL_INV || op == IBV_WR_BIND_MW; }
ibv_wc_status run_local_op(Qp* qp, const SendWqe& w);

// Same-host fast paths of the requester (shm_requester.cpp), to the connected peer QP
// `dst_qpn` in another process of this host; nullopt: not taken, ask the shm transport.
std::optional<Outcome> send_through_window(Qp* qp, const SendWqe& w, const iovec* local,
                                           int nlocal, uint32_t dst_qpn);
std::optional<Outcome> rdma_direct(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                   uint32_t dst_qpn);
std::optional<Outcome> atomic_direct(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                     uint32_t dst_qpn);
// Large SENDs placed by the requester (shm_send_place.cpp): a SEND too large for the
// peer's receive window, copied straight into the buffers of the receive it completes.
std::optional<Outcome> send_placed(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                   uint32_t dst_qpn);
// post_send's shortcut for a SEND, SEND_WITH_IMM or RDMA WRITE of `len` bytes that the
// caller checked (ibv_post_send(3)'s argument errors), to the connected peer in another
// process: straight into its receive window or its MR's shared pages, with no WQE built.
// False: not taken (nothing happened), build the WQE and run it. Caller holds qp->sq_mu;
// the send queue is empty and qp is in RTS.
bool post_now(Qp* qp, const ibv_send_wr* wr, uint64_t len);
// ibv_modify_qp took an RC/UC QP to RTS: on a same-host route, opens its peer's receive
// window now (within a short bound), in the application's setup, rather than at the first
// post, where the peer's agent may wait for a scheduler tick. No: the first post asks.
void open_window_at_rts(Qp* qp);
// A SEND to a same-host peer goes through the peer's agent: counts why (the window's last
// refusal) in qp->window_counts. Holds qp->sq_mu.
void count_agent_send(Qp* qp);
// Locks the send queue and runs it (after a timer fired or a receive was posted).
void kick(Qp* qp);
// Retries QP `qpn`'s send queue soon, wherever it lives (RNR waiters).
void kick_qpn(uint32_t qpn);

// Executes one request on the target QP `t` of this process (the responder role).
Outcome respond(const wire::Request& req, Qp* t);
// A message another process's TGT QP took for an XRC SRQ of ours (wire::EngineHooks).
Outcome respond_xrc(const wire::Request& req, const wire::XrcTarget& tgt, int* tgt_error);
// A message our TGT QP `t` took for an XRC SRQ of another process of this host, run there
// (its delivery thread): the payload, or room for READ data and an atomic's result, is in
// req.local of this process. `x` brings the TGT QP's access flags, RNR timer and
// max_dest_rd_atomic as the caller holds them (its locks, not qp->attr_mu); the rest is
// filled here. An SRQ number that names no process of the domain is an invalid request.
// *tgt_error: wire::kXrcTgtFine, or the event (-1: none) `t` goes to ERR with; the caller
// applies it.
Outcome deliver_xrc_elsewhere(const wire::Request& req, Qp* t, wire::XrcTarget x,
                              int* tgt_error);

// Raw packet QPs (raw_packet.cpp): Ethernet frames on the port's interface (wire/ether).
// A raw QP holds the sender from its creation (0 or an errno: EPERM without CAP_NET_RAW).
int raw_qp_created();
void raw_qp_create_failed();    // after raw_qp_created, when the QP could not be made
void raw_qp_destroyed(Qp* qp);  // qp->raw_owner: the process that created it
// Sends the frame gathered from local[0..nlocal): the WQE's outcome.
Outcome send_raw(Qp* qp, const iovec* local, int nlocal, uint64_t len);
// Steers the frames that match `rule` to qp's receives (ibv_create_flow): 0 or an errno;
// *handle names the rule for detach_flow.
int attach_flow(Qp* qp, FlowRule rule, uint64_t* handle);
void detach_flow(uint64_t handle);
bool raw_qp_has_flows(Qp* qp);
// An empty poll of a raw-fed CQ (Cq::raw_fed) takes the frames waiting on the port's socket
// (true: it took some, for whichever QPs their rules name, or none); raw_poll_stop before
// the application waits for an event.
bool raw_receiving();
bool raw_poll();
void raw_poll_stop();
// Responder: one frame into raw QP t's next receive (none posted: the frame is lost), or,
// for an RSS QP, into WQ wq's (completing on the WQ's CQ, qp_num the WQ's number).
// `flow_tag`: the tag of the rule that steered it (0: none), for ibv_wc_read_flow_tag.
void deliver_frame(Qp* t, const uint8_t* frame, size_t len, uint32_t flow_tag);
void deliver_frame_to_wq(Qp* rss, Wq* wq, const uint8_t* frame, size_t len, uint32_t flow_tag);

// The 40-byte GRH slot of a UD receive, as a RoCE v2 NIC fills it: an IPv4 header in the
// last 20 bytes for IPv4-mapped GIDs, an IPv6-format GRH otherwise.
void build_grh(uint8_t* grh, const ibv_gid& sgid, const ibv_gid& dgid, uint32_t payload);

// Moves `qp` to ERR, raises `event` (if >= 0) and flushes its queues from the progress thread.
void set_error(Qp* qp, int event);
// Completes every outstanding WQE with IBV_WC_WR_FLUSH_ERR. Caller holds no QP lock.
void flush(Qp* qp);
void flush_send_queue_locked(Qp* qp);  // caller holds qp->sq_mu
// Forgets the peer's receive window (requester side), unmapping the peer's memory if no
// other QP uses it. Caller holds qp->sq_mu, or is destroying qp.
void drop_peer_window(Qp* qp);
// A CQ overran: raise CQ_ERR (first time) and move every QP feeding it to ERR.
void cq_overrun(Cq* cq, bool first);
void cq_overrun_locked(Cq* cq, bool first);  // caller holds cq->ctx->objects_mu

void push_send_completion(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len);
void push_recv_completion(Qp* qp, uint64_t wr_id, ibv_wc_status status);

// Peer processes: connected QPs fail when the process at the other end dies.
// Watches process `pid` (pidfd); once it died, the progress thread calls on_death(pid).
// One hook for the process: the last one given (XRC's, verbs/xrc.cpp).
void watch_pid(pid_t pid, void (*on_death)(pid_t));
void watch_peer_of(Qp* qp);  // after a connected QP entered RTR
void peer_died(pid_t pid);
// ERR and IBV_EVENT_QP_FATAL if `qp` is connected and still on `connection` (Qp::connection).
void fail_if_still_connected(Qp* qp, uint64_t connection);
// How long a requester waits for an answer before it retries (the QP's `timeout`).
Clock::duration ack_timeout(uint8_t timeout);

// Resolves a receive WQE's scatter list (its non-empty SGEs, into out[0..*n)); returns its
// capacity or -1 on a protection error. Caller holds the key lock (shared). Inline: the
// polled path resolves a receive when it is posted.
inline int64_t resolve_recv(Pd* pd, const RecvWqe& r, iovec* out, int* n) {
  int64_t cap = 0;
  int k = 0;
  for (const Sge& s : r.sges) {
    if (s.length == 0) continue;
    if (!resolve_sge(pd, s.lkey, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, &out[k++])) return -1;
    cap += s.length;
  }
  *n = k;
  return cap;
}
inline int64_t resolve_recv(Qp* t, const RecvWqe& r, iovec* out, int* n) {
  return resolve_recv(t->pd, r, out, n);
}

// Receive windows, target side (shm_responder.cpp).
// The window's arena offset, 0 if not possible; `peer_pid` is the only process that will
// write it (its block is reused only once that process is gone).
uint64_t open_window(Qp* t, uint32_t peer_qpn, pid_t peer_pid);
// 0 if its buffers fail the checks. Caller holds the key lock (shared).
uint32_t receive_capacity(Qp* t, RecvWqe& r);
// Publishes receive `r` (the newest of t's receive queue) in t's window; caller holds the
// key lock (shared) and t->rq_mu.
void publish_receive_locked(Qp* t, const RecvWqe& r, uint32_t capacity);
// Where receive `r` of that capacity lands, for a requester to place a large SEND in
// (shm_send_place.cpp); same locks.
void publish_place(wire::RecvPlace& p, const RecvWqe& r, uint32_t capacity);
void drain_window_locked(Qp* t);  // caller holds the key lock (shared) and t->rq_mu
// SRQs whose QPs have receive windows (wire::SrqShared, srq_claims.cpp); caller holds
// srq->mu. publish_srq_receive_locked numbers and publishes receive `r` (the newest of
// srq->rq; its capacity checked under the key lock (shared) if keys_held, else 0: for no
// sender). A local consumer (agent, RoCE, UD responders) takes the next receive with
// srq_take_local (its number; false: none, or all promised to windows' messages: answer as
// for an empty queue), reads it with srq_receive, and then either consumes it or gives it
// back. Without a block these are the plain front of srq->rq.
void publish_srq_receive_locked(Srq* srq, const RecvWqe& r, bool keys_held);
bool srq_take_local(Srq* srq, uint64_t* number);
RecvWqe& srq_receive(Srq* srq, uint64_t number);
void srq_consume(Srq* srq, uint64_t number);  // also raises the SRQ limit event
void srq_give_back(Srq* srq, uint64_t number);
// No room for another receive: max_wr of them not consumed yet (or, with a block, a
// receive still claimed kSrqNumbers behind the newest: a claimer that never drains).
bool srq_full_locked(Srq* srq);
// Window side (shm_responder.cpp), same lock: the block (made with the first window; its
// offset, 0: none), a new window's claimer id (0: none left), whether `number` is a receive
// we hold that `claimer` claimed, and every such receive given back (its window closed).
uint64_t srq_shared_locked(Srq* srq, wire::Arena* arena);
uint32_t srq_new_claimer_locked(Srq* srq);
bool srq_claimed_by(Srq* srq, uint64_t number, uint32_t claimer);
void srq_give_back_claimer(Srq* srq, uint32_t claimer);
// Lands what waits in cq's receive windows: those whose rung bits are set, or every window
// (`every_window`, a look owed, or a new doorbell value: shm_rung.cpp).
void drain_inbound(Cq* cq, bool every_window);
// Under cq->inbound_mu: t joins (once) or leaves the QPs whose windows feed cq, in O(1)
// (10,000 windows on a CQ made a search per open and per close add up).
void inbound_add_locked(Cq* cq, Qp* t);
void inbound_remove_locked(Cq* cq, Qp* t);
// A CQ's rung bits (shm_rung.cpp): the block of leaf bits, made before a window is handed
// a leaf index and given back with the CQ; a window's index (under cq->inbound_mu);
// whether any bit is set (one cache line); the windows whose bits are set and that hold a
// message (at most max, the rest at the next look), clearing the bits of idle ones.
void rung_prepare(Cq* cq);
void rung_release(Cq* cq);
uint32_t rung_attach_locked(Cq* cq, Qp* t);  // its index for the window's header
void rung_detach_locked(Cq* cq, Qp* t);
bool rung_any(const Cq* cq);
int rung_collect_locked(Cq* cq, Qp** out, int max);
// At a look at every window: summary bits back for leaf words that lost theirs.
void rung_resync_locked(Cq* cq);
// A hint, read without t's queue lock: does the next message's slot of t's window (one of
// its UD windows) hold one? (Drained under the lock, which decides; a UD QP whose lock is
// taken says yes.) Caller holds t->recv_cq->inbound_mu.
bool window_waiting(Qp* t);
bool ud_window_waiting(Qp* t);  // the same for a UD QP's windows (shm_ud.cpp)
// ibv_poll_cq's shortcut for a CQ fed by one window: lands what waits there straight in
// `wc` (at most `max`), when the ring is empty and the CQ unarmed; 0 leaves it to
// drain_inbound.
int drain_solo_into(Cq* cq, int max, ibv_wc* wc);
void close_window(Qp* t, bool deliver);  // caller holds no QP lock

// UD between processes of this host (shm_ud.cpp, wire/shm/ud_window.hpp).
// Sender: a datagram of a built WQE, or one posted (post_now's terms), through the target
// QP's UD window; nullopt / false: not taken, the agent path delivers it.
std::optional<Outcome> send_ud_through_window(Qp* qp, const SendWqe& w, const iovec* local,
                                              int nlocal);
bool post_ud_now(Qp* qp, const ibv_send_wr* wr, uint64_t len);
// A datagram to a multicast group: a copy for each QP of this host attached to it, through
// its UD window where there is one, else as `req` (built for the agent path) names it.
Outcome send_ud_to_group(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                         const wire::Request& req);
void drop_ud_peers(Qp* qp);  // caller holds qp->sq_mu, or is destroying qp
// Target: open_window's UD case; the windows' datagrams into completions (the key lock
// held or not); ibv_poll_cq's shortcut (drain_solo_into's UD case, t->ud_mu held).
uint64_t open_ud_window(Qp* t, uint32_t peer_qpn, pid_t peer_pid);
void drain_ud(Qp* t, bool keys_held);
int drain_ud_solo_locked(Cq* cq, Qp* t, int max, ibv_wc* wc);
void close_ud_windows(Qp* t, bool deliver_first);  // close_window's UD case
// Shared with the RC/UC windows: a peer's wake-up fd is an eventfd we may write without
// blocking; a WR's payload as iovecs (-1: a bad key; caller holds the key lock unless
// inline); under cq->inbound_mu, what the CQ watches after its list changed.
bool usable_wake_fd(int fd);
// A message to an armed CQ of another process is in its window: wake its channel (the
// CQ's ready bit, then the wake-up fd unless the bit was set), or have its agent (`slot`)
// drain QP dst_qpn's window when the fd cannot be written.
void wake_target(const wire::ReadyHint& ready, int wake_fd, int slot, uint32_t dst_qpn);
int payload_iovecs(Qp* qp, const ibv_send_wr* wr, iovec* v);
void update_solo_locked(Cq* cq);

// Progress thread services.
void schedule_kick(uint32_t qpn, Clock::time_point when);
void schedule_flush(uint32_t qpn);

}  // namespace softverbs::engine
