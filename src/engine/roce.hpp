// A QP's RoCE v2 path: when its peer is on another host (route roce, wire/router.hpp), or it
// is a UD QP (which any host may send to), the packet roles of engine/packet/ run its
// transport protocol, and wire/roce/'s port carries the datagrams. The verbs layer calls in
// here at modify, post and destroy; the port's thread delivers packets and timers.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>

#include "core/objects.hpp"
#include "engine/packet/packet_qp.hpp"

namespace softverbs::wire::roce {
class PcapWriter;
}

namespace softverbs::engine {

// SOFTVERBS_TRACE=FILE (`softverbs trace -w FILE`): the pcap file this process writes its
// RoCE v2 datagrams and its same-host exchanges (trace_shm.cpp) to; nullptr when not
// tracing. The first call opens it (engine::start makes that call).
wire::roce::PcapWriter* trace_writer();

// After ibv_modify_qp applied `attr`/`mask` to qp (caller holds no QP lock): creates the
// QP's RoCE link when it enters RTR towards another host (any UD QP entering RTR), and
// hands every later change to it. Entering ERR flushes what the link holds.
void roce_modify(Qp* qp, const ibv_qp_attr& attr, int mask);
// Hands WQE `w` to the QP's RoCE link when it goes on the wire (connected QP on the roce
// route; UD to another host). True when taken (it completes later, through the link, or
// has completed with an error); false: not a RoCE WQE. Caller holds qp->sq_mu.
bool roce_post(Qp* qp, SendWqe& w);
// Send WQEs the link holds (sent, not yet completed): they count against max_send_wr.
size_t roce_in_flight(Qp* qp);
// Waits out the link's protocol call in progress, if any. A call that pushed an error
// completion moves the QP to ERR before it lets the link go (sync_error): a reader of the
// QP's state that saw that completion must see ERR after this (ibv_query_qp).
void roce_settle(Qp* qp);
// Where `softverbs stat` reads a QP's RoCE v2 link live (common/stat_segment.hpp's RoceHot):
// the link object, its tag, and the offsets in it of its PSNs and send queue. False: the
// QP has no link. Its tag reads kRoceLinkMagic while the link lives.
inline constexpr uint32_t kRoceLinkMagic = 0x5356524c;  // "SVRL"
struct RoceStatView {
  const void* object = nullptr;
  uint32_t size = 0, magic_offset = 0, magic = 0;
  uint32_t next_psn = 0, expected_psn = 0, send_queue = 0, send_entry_size = 0;
};
bool roce_stat_view(Qp* qp, RoceStatView* view);
// ibv_poll_cq on an empty CQ that QPs on the wire feed: receives what waits on the port
// now, on the caller's thread. True when something was received. `hold_acks`: ACKs for
// what it receives may wait for the QP's next packet (a polling loop, which says what it
// found with roce_poll_result); false for a thread that may sleep next (events).
bool roce_poll(bool hold_acks = true);
// What such a poll of `cq` returned: nothing (found=false: the application waits on the
// CQ), or completions. Decides whether the port's thread or the application receives
// (Port), and which held ACKs leave (all after an empty poll; those of QPs not on `cq`).
void roce_poll_result(const Cq* cq, bool found);
// ACKs a polling application holds back for its QPs' next packets (docs/roce.md, "ACKs
// held back"). Any call of the application other than a poll of the QP's CQs or a post to
// it sends them: roce_flush_held(qp) the others', roce_flush_held() all. A relaxed load
// when nothing is held.
extern std::atomic<int> g_roce_held_acks;
void roce_flush_held_slow(const Qp* except);
inline void roce_flush_held(const Qp* except = nullptr) {
  if (g_roce_held_acks.load(std::memory_order_relaxed) != 0) roce_flush_held_slow(except);
}
// For a thread about to sleep in ibv_get_cq_event on a channel of such CQs: the port's
// socket to sleep on too (-1: none open), and the calls around that sleep (Port::wait_*).
int roce_wait_fd();
void roce_wait_begin();
void roce_wait_end();
// The application arms such a CQ (it will sleep until an event): stop relying on its polls.
void roce_poll_stop();
// QP1: the process's MAD agent (a UD QP created with IBV_QP_CREATE_SOURCE_QPN = 1, see
// docs/decisions/0007). At most one per process; it receives every datagram for DestQP 1
// that reaches this process, and sends with SrcQP 1. A process without one passes QP1
// datagrams to the host's lowest-slot process that has one (wire::lowest_slot_with).
bool roce_claim_gsi(Qp* qp);
void roce_release_gsi(Qp* qp);
// ibv_attach_mcast / ibv_detach_mcast of a UD QP (decision 0008), after the same-host
// membership (wire/shm/mcast.hpp) is recorded: the port joins the group's IP address on
// every interface with a GID of its family (loopback aside), once per process however many
// of its QPs attach (Port::join_group); datagrams to the group are then handed to each of
// this process's attached QPs. 0 or an errno value (ENOMEM: the kernel refused the join).
// Without the port (another user holds 4791) the group still works on this host.
int roce_attach_mcast(Qp* qp, const ibv_gid& gid);
void roce_detach_mcast(Qp* qp, const ibv_gid& gid);
// Frees the link, after wire::unregister_qp (nothing can look the QP up any more). With
// `resume`, what another process needs to go on answering the connection: the responder's
// state once the link took its last packet (has_link false: no link).
struct RoceResume {
  bool has_link = false;
  packet::PacketQp::ResponderState responder;
};
void roce_destroy(Qp* qp, RoceResume* resume = nullptr);
// On the QP built again from such a resume (after its modify to RTR, rq_psn = its epsn).
void roce_resume(Qp* qp, const RoceResume& resume);
// This process now serves another registry slot's QPs (an adopted XRC slot): the port's
// group learns the steering again.
void roce_steering_changed();
// This process, ending, handed its own slot over (an XRC hand-over): its port passes the
// slot's datagrams to the adopter from now on.
void roce_slot_handed_over();

}  // namespace softverbs::engine
