// Tag matching in the engine (engine/tm_responder.cpp): matching a message that arrives at
// a QP on a TM-SRQ, and the rendezvous work (RDMA READ, FIN) it gives that QP's requester.
#pragma once

#include <cstdint>
#include <vector>

#include "core/objects.hpp"
#include "core/tag_list.hpp"
#include "engine/engine.hpp"
#include "engine/packet/packet_qp.hpp"

namespace softverbs::engine {

// What a message's first bytes mean to a TM-SRQ (caller holds srq->mu).
struct TmDecision {
  enum Kind { kPlain, kUnexpected, kEager, kRndv } kind = kPlain;  // kPlain: NO_TAG/FIN/none
  TmHeader header;
  uint32_t handle = 0;  // kEager/kRndv: the matching entry (still posted)
};
TmDecision tm_decide(Qp* t, const uint8_t* head, uint32_t n);

// The same-host responder's delivery of a SEND to a QP whose SRQ does tag matching.
Outcome deliver_tagged(const wire::Request& req, Qp* t, uint8_t rnr_timer);

// The RDMA READ of a matched rendezvous into its tagged buffer.
SendWqe rndv_read_wqe(const TagEntry& entry, const TmHeader& h);
// Queues tag matching work on qp's send queue (the caller may hold no sq_mu) and kicks it.
void queue_tm_work(Qp* qp, SendWqe w);
// run_send_queue: the queued work joins the send queue (caller holds qp->sq_mu).
void take_tm_work_locked(Qp* qp);
// Instead of a send completion, for a WQE with w.tm.kind set: the rendezvous' data
// completion in the TM-SRQ's CQ, then its FIN (caller holds qp->sq_mu).
void complete_tm_work(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len);

// The RoCE v2 path (engine/tm_roce.cpp): the packet responder asks for a receive with the
// first packet of a SEND; what was matched rides on the receive to its completion.
struct TmArrival {
  TagEntry entry;  // a matched rendezvous' tagged buffer
  TmHeader header;
};
enum TmRecvKind : uint8_t { kTmRecvEager = 1, kTmRecvRndv, kTmRecvRndvIncomplete,
                            kTmRecvUnexpected, kTmRecvPlain };
std::optional<packet::RecvWqe> tm_take_receive(Qp* qp, std::span<const uint8_t> first,
                                               TmArrival* arrival);
void tm_complete_receive(Qp* qp, const packet::Completion& c, TmArrival* arrival);
// A completion of the rendezvous' own work (READ, FIN) on the wire.
void tm_complete_work(Qp* qp, const packet::Completion& c);

// While one lives on this thread, the kicks of queued tag matching work wait for its end
// (run_wqe: until the WQE that delivered the rendezvous request has completed).
class AfterComplete {
 public:
  AfterComplete();
  ~AfterComplete();
  AfterComplete(const AfterComplete&) = delete;
  AfterComplete& operator=(const AfterComplete&) = delete;

 private:
  std::vector<uint32_t>* outer_;
  std::vector<uint32_t> kicks_;
};

}  // namespace softverbs::engine
