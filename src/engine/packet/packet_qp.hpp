// The IBA transport protocol for packet transports (RoCE v2): one QP's requester
// (requester.cpp), completer (completer.cpp) and responder (responder.cpp) working on
// decoded packets (wire/roce/packet.hpp). Self-contained: everything outside the protocol
// (sending datagrams, time, memory keys, the receive queue, CQs, async events, atomics)
// goes through `Env`, which the QP's owner implements.
//
// Threading: a PacketQp is not thread-safe. The owner holds one mutex per QP around every
// call into it (post_send, on_packet, on_timer, modify, the observers); Env callbacks run
// with that mutex held and must not call back into the same PacketQp.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "common/verbs_ext.hpp"
#include "wire/roce/packet.hpp"

namespace softverbs::engine::packet {

using wire::roce::Packet;

// 24-bit PSN arithmetic: psn_diff is the signed distance a - b within half the PSN space.
inline constexpr uint32_t kPsnMask = 0xffffff;
// BTH DestQP of a multicast packet (IBA 10.5.2.1): every UD QP attached to the group.
inline constexpr uint32_t kMulticastQpn = 0xffffff;
inline uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }
inline int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>((a - b) << 8) >> 8;
}

inline bool is_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
// IBA 1.5's ATOMIC WRITE and FLUSH: one packet each, answered (as rxe answers them) with an
// RDMA READ RESPONSE ONLY without payload, and holding a READ/atomic resource meanwhile.
inline bool is_flush_or_atomic_write(ibv_wr_opcode op) {
  return op == IBV_WR_ATOMIC_WRITE || op == kWrFlush;
}
inline bool is_single_packet(ibv_wr_opcode op) { return is_atomic(op) || is_flush_or_atomic_write(op); }
inline bool is_rd_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || is_atomic(op) || is_flush_or_atomic_write(op);
}

// Header fields from two of packet.hpp's enums (kept apart there: transport | operation,
// AETH kind | code).
inline constexpr uint8_t bth_opcode(uint8_t transport, uint8_t op) { return transport | op; }
inline constexpr uint8_t aeth_syndrome(uint8_t kind, uint8_t value) { return kind | value; }

// A resolved piece of local memory.
struct Iov {
  uint8_t* addr = nullptr;
  uint32_t len = 0;
};

enum class QpType : uint8_t { kRc, kUc, kUd };
// An XRC QP is an RC QP on transport 0xA0 (packet.hpp): an INI QP sends requests (each
// naming an XRC SRQ in its XRCETH) and takes responses; a TGT QP answers them.
enum class XrcRole : uint8_t { kNone, kIni, kTgt };
enum class WorkQueue : uint8_t { kSend, kRecv };

// One send work request, local addresses already resolved (lkeys checked by the owner).
// Tag matching (engine/tm_responder.cpp) rides along a WQE to its completion: the owner
// says what a receive or a send of its own is, and reads it back from the completion.
struct TmMark {
  uint8_t kind = 0;  // the owner's (0: none)
  uint64_t tag = 0;
  uint32_t app_ctx = 0;
};

struct SendWqe {
  uint64_t wr_id = 0;
  TmMark tm;                           // the owner's own work (never signaled to anyone)
  ibv_wr_opcode opcode = IBV_WR_SEND;  // SEND(_WITH_IMM, _WITH_INV), RDMA_WRITE(_WITH_IMM),
                                       // RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD,
                                       // ATOMIC_WRITE, FLUSH (kWrFlush)
  unsigned send_flags = 0;             // IBV_SEND_SIGNALED, _SOLICITED, _FENCE
  uint32_t imm = 0;                    // network order; SEND_WITH_INV: the R_Key (host)
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;            // CMP_AND_SWP: compare; FETCH_AND_ADD: add;
                                       // ATOMIC_WRITE: the 8 bytes, as in memory
  uint64_t swap = 0;
  uint32_t flush_length = 0;           // FLUSH: the range, placement type, selectivity
  uint8_t flush_type = 0;
  uint8_t flush_level = 0;
  uint32_t remote_qpn = 0;             // UD: the AH's destination
  uint32_t remote_qkey = 0;            // UD: high bit set = use the QP's own Q_Key
  uint32_t xrc_srqn = 0;               // XRC INI: the XRC SRQ named (XRCETH)
  std::vector<Iov> sg;                 // gather (SEND/WRITE) or scatter (READ, atomic: 8 B)
  // IBV_WR_BIND_MW / IBV_WR_LOCAL_INV: the owner ran it when posting (nothing goes on the
  // wire); it completes with this status once every WQE before it has completed.
  ibv_wc_status local_status = IBV_WC_SUCCESS;
};

// One receive work request: its scatter list is its capacity.
struct RecvWqe {
  uint64_t wr_id = 0;
  std::vector<Iov> sg;
  bool key_error = false;  // an SGE failed its lkey check (sg is then empty): LOC_PROT_ERR
  // Tag matching: the message's first `skip` bytes (a matched TMH) are not placed, or with
  // `discard` none is (a matched rendezvous request); byte_len counts what was placed.
  uint32_t skip = 0;
  bool discard = false;
  TmMark tm{};
};

// ibv_wc's fields, plus the SE bit for solicited-only CQ notification.
struct Completion {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;  // network order; IBV_WC_WITH_INV: the invalidated R_Key (host)
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  unsigned wc_flags = 0;  // IBV_WC_WITH_IMM, IBV_WC_GRH
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;  // UD: the GRH slot's L3 header type (wire/roce/grh.hpp)
  uint8_t dlid_path_bits = 0;
  bool solicited = false;
  TmMark tm;  // the WQE's, as the owner marked it
};

// What resolve_rkey found: `addr` maps [va, va + len) when ok.
struct RkeyResult {
  uint8_t* addr = nullptr;
  bool ok = false;
};

// XRC TGT: where the XRC SRQ a request names is (Env::select_xrc_srq).
enum class XrcSrqPlace : uint8_t {
  kNone,       // no XRC SRQ of the QP's domain has that number: an invalid request
  kHere,       // one of the owner's: take_receive, resolve_rkey, ... work on it
  kElsewhere,  // another process's: the operation goes there whole (Env::xrc_forward)
};
// An operation for an XRC SRQ of another process, once the QP has all of it (a SEND's or
// WRITE's last packet, a READ or atomic request); PSN order, duplicates and ACKs stay the
// QP's. The payload and the result lie in the QP's memory.
struct XrcAway {
  ibv_wr_opcode opcode = IBV_WR_SEND;  // SEND(_WITH_IMM, _WITH_INV), RDMA_WRITE(_WITH_IMM),
                                       // RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD
  uint32_t srqn = 0;
  uint32_t src_qpn = 0;  // the INI QP
  uint8_t min_rnr_timer = 0, max_dest_rd_atomic = 0;  // the TGT QP's, for the checks there
  uint32_t imm = 0;      // network order; SEND_WITH_INV: the R_Key, host order
  bool solicited = false;
  uint32_t rkey = 0;
  uint64_t va = 0;
  uint64_t compare_add = 0, swap = 0;
  std::span<const uint8_t> payload;  // SEND, WRITE: the whole message
  std::span<uint8_t> result;         // READ: its bytes; atomics: the original 8 bytes
};
// What became of it there. kNone: no answer (the process is slow or its answer was lost):
// nothing is acknowledged, the requester's retry brings the last packet again.
struct XrcVerdict {
  enum Kind : uint8_t { kAck, kRnr, kNak, kNone } kind = kNone;
  uint8_t code = 0;  // kRnr: the RNR timer; kNak: the NAK code (wire/roce/packet.hpp)
  std::optional<ibv_event_type> event;  // kNak: raised as the QP goes to ERR
};

// ---- `softverbs inject`'s responder faults (engine/debug_respond.cpp): what the next
// request meets at this responder. kRnr: an RNR NAK with timer `code`; kNak: NAK `code`
// and ERR with `event`; kReceive: it takes a receive that completes with recv_status,
// NAK `code`, ERR without event.
struct InjectedFault {
  enum Kind : uint8_t { kNone, kRnr, kNak, kReceive } kind = kNone;
  uint8_t code = 0;
  std::optional<ibv_event_type> event;
  ibv_wc_status recv_status = IBV_WC_SUCCESS;
};
// ---- end responder faults

class Env {
 public:
  virtual ~Env() = default;
  // Transmits one packet; `payload` is gathered after the headers (pkt.payload is unused,
  // pkt.payload_len is the total). The iovecs stay valid only during the call.
  virtual void send_packet(const Packet& pkt, std::span<const Iov> payload) = 0;
  // Monotonic time; the QP has one timer: arm_timer replaces the previous deadline, and the
  // owner calls PacketQp::on_timer() once now_ns() >= deadline (early calls are harmless).
  virtual uint64_t now_ns() = 0;
  virtual void arm_timer(uint64_t deadline_ns) = 0;
  virtual void cancel_timer() = 0;
  // Checks that `rkey` grants `access` (IBV_ACCESS_REMOTE_*) on [va, va + len), len > 0.
  virtual RkeyResult resolve_rkey(uint32_t rkey, uint64_t va, uint32_t len, int access) = 0;
  // The next receive WQE (dequeued: the QP completes it), or none (RNR). `first`: the
  // first packet's payload of the SEND it is for (tag matching looks at it), else empty.
  virtual std::optional<RecvWqe> take_receive(std::span<const uint8_t> first) = 0;
  virtual void push_completion(WorkQueue queue, const Completion& wc) = 0;
  virtual void raise_event(ibv_event_type type) = 0;
  // Executes an atomic on 8 aligned bytes and returns the old value (host order);
  // IBV_WR_ATOMIC_WRITE stores compare_add.
  virtual uint64_t atomic_execute(uint8_t* addr, ibv_wr_opcode op, uint64_t compare_add,
                                  uint64_t swap) = 0;
  // A FLUSH's work at the responder (core.hpp's flush_memory): false on an R_Key violation.
  virtual bool flush(uint32_t rkey, uint64_t va, uint32_t len, uint8_t type, uint8_t level) = 0;
  // The IETH of a SEND_WITH_INV that arrived: invalidates that R_Key for this QP; false
  // when it cannot (the receive fails, IBA class J). By default nothing can be.
  virtual bool invalidate_rkey(uint32_t /*rkey*/) { return false; }
  // An RNR NAK this QP's requester took (it waits, then sends again or gives up): for
  // `softverbs check`'s count of RNR waits. Nothing by default.
  virtual void rnr_nak_taken() {}
  // XRC TGT: the request being handled names XRC SRQ `srqn` (XRCETH); when it is here,
  // take_receive, resolve_rkey, flush and receive completions use it from now on.
  virtual XrcSrqPlace select_xrc_srq(uint32_t /*srqn*/) { return XrcSrqPlace::kNone; }
  // XRC TGT, an SRQ elsewhere: runs `op` there and says how it went. Nothing is
  // acknowledged before it returns.
  virtual XrcVerdict xrc_forward(const XrcAway& /*op*/) { return {XrcVerdict::kNak, wire::roce::kNakInvalidRequest, {}};
  }
  // ---- `softverbs inject`: the responder fault the next request meets (asked only while
  // debug hooks are armed), and one kReceive fault handed back when no receive was there.
  virtual InjectedFault responder_fault(bool /*needs_receive*/, uint8_t /*min_rnr_timer*/) {
    return {};
  }
  virtual void give_back_fault() {}
  // ---- end
};

// Requests allowed in flight without an ACK (as rxe's RXE_MAX_UNACKED_PSNS; the owner may
// allow kMaxUnackedPsnsLarge, set_max_unacked_psns), and how many
// packets go without AckReq before one asks for an ACK (rxe's RXE_MAX_PKT_PER_ACK is 64;
// 62 is what one UDP GSO send holds at a 1 KiB path MTU, so that in a stream each ACK
// opens the window for one GSO send, not for one of 57 packets and one of 7).
inline constexpr uint32_t kMaxUnackedPsns = 128;
inline constexpr uint32_t kMaxUnackedPsnsLarge = 256;
inline constexpr uint32_t kPacketsPerAckReq = 62;
inline constexpr uint32_t kGrhBytes = 40;

// IBA's RNR NAK timer encoding (the 5-bit field) in microseconds.
uint32_t rnr_timer_usec(uint8_t code);
// The local ACK timeout, 4.096 us * 2^timeout; 0 means infinite (returns 0).
uint64_t ack_timeout_ns(uint8_t timeout);

class PacketQp {
 public:
  PacketQp(Env& env, QpType type, uint32_t qp_num, bool sq_sig_all = false);
  // Makes an RC QP an XRC INI or TGT QP (before any traffic).
  void set_xrc(XrcRole role) { xrc_ = role; }
  // How many PSNs past the oldest unacknowledged one the requester may send (kMaxUnackedPsns
  // unless the owner knows the receivers' buffers hold more).
  void set_max_unacked_psns(uint32_t psns) { max_unacked_psns_ = psns; }

  // Applies ibv_modify_qp's attributes (state last). Transition legality is the owner's
  // business; bad values give EINVAL. Entering ERR (here or on a fatal error) flushes both
  // queues: every send WQE, the receive WQE being filled, and every receive WQE that
  // take_receive() still hands out (an SRQ-backed owner returns none there). RESET forgets
  // everything without completions.
  int modify(const ibv_qp_attr& attr, int attr_mask);
  // Queues a send WQE and transmits what the window allows. EINVAL: wrong state (before
  // RTS), an opcode the transport lacks, an atomic without 8 bytes, UD longer than the MTU.
  // In ERR or SQE the WQE completes at once with IBV_WC_WR_FLUSH_ERR; in SQD it waits.
  int post_send(SendWqe wqe);
  // One decoded packet addressed to this QP. `grh` (UD only): the 40-byte GRH image the
  // receive buffer starts with (zeros when null).
  void on_packet(const Packet& pkt, const uint8_t* grh = nullptr);
  // The timer armed through Env fired.
  void on_timer();

  ibv_qp_state state() const { return state_; }
  uint32_t qp_num() const { return qp_num_; }
  QpType type() const { return type_; }
  uint32_t mtu() const { return mtu_; }
  uint32_t next_send_psn() const { return next_psn_; }
  uint32_t expected_psn() const { return epsn_; }
  // The responder's message sequence number, and setting it on a QP built again elsewhere
  // from another process's (an XRC TGT QP handed over: verbs/xrc.cpp).
  // The responder's place in its connection, for another process to go on from (an XRC TGT
  // QP handed over as its process ends: verbs/xrc.cpp): the expected PSN (a message half
  // taken is taken again from its first packet: what was staged of it stays behind), the
  // MSN, whether COMM_EST was raised, and the atomic replies a duplicate is answered from.
  struct ResponderState {
    uint32_t epsn = 0, msn = 0;
    bool comm_est_raised = false;
    std::vector<std::pair<uint32_t, uint64_t>> atomic_replies;  // (psn, original value)
  };
  ResponderState responder_state() const;
  // On a QP in RTR whose expected PSN is the state's already.
  void resume_responder(const ResponderState& state);
  size_t send_queue_depth() const { return sq_.size(); }
  // Where `softverbs stat` reads the live PSNs and the send queue (verbs/stat_publish.cpp).
  const void* next_psn_address() const { return &next_psn_; }
  const void* expected_psn_address() const { return &epsn_; }
  const void* send_queue_address() const { return &sq_; }
  static size_t send_entry_size();

 private:
  // A send WQE while the send queue holds it: its PSN range and progress.
  struct SendEntry {
    SendWqe wr;
    uint32_t length = 0;
    uint32_t first_psn = 0;
    uint32_t npkts = 1;  // PSNs it uses (a READ: one per response packet)
    bool started = false;
    bool holds_rd_atomic = false;
    uint32_t last_psn() const { return psn_add(first_psn, npkts - 1); }
  };
  // A replayable atomic response (responder side).
  struct AtomicReply {
    uint32_t psn = 0;
    uint64_t orig = 0;
    bool valid = false;
  };
  enum class InMessage : uint8_t { kNone, kSend, kWrite };

  // packet_qp.cpp: shared pieces
  uint8_t transport_bits() const;
  void enter_error();
  void flush_receives();
  void reset_state();
  bool is_response(uint8_t op) const;

  // requester.cpp
  void pump();
  void transmit(SendEntry& e, uint32_t k);
  uint32_t cursor_psn() const;
  void go_back_to(uint32_t psn);
  void complete_head(ibv_wc_status status);
  void complete_send(const SendEntry& e, ibv_wc_status status);
  void retire_local_ops();
  void check_drained();

  // completer.cpp
  void on_response(const Packet& pkt);
  bool ack_through(uint32_t psn);
  void on_nak(const Packet& pkt);
  void on_read_response(const Packet& pkt);
  void on_atomic_ack(const Packet& pkt);
  void on_empty_read_response(const Packet& pkt, int i);
  void progress_made();
  void restart_retransmit_timer();
  void retry(bool from_timer);
  void fail_head(ibv_wc_status status);
  int find_entry(uint32_t psn) const;

  // responder.cpp
  void on_request(const Packet& pkt, const uint8_t* grh);
  void on_ud_request(const Packet& pkt, const uint8_t* grh);
  void execute(const Packet& pkt);
  void on_duplicate(const Packet& pkt);
  bool check_sequence(uint8_t op) const;
  bool check_length(const Packet& pkt, uint8_t op) const;
  bool do_send(const Packet& pkt, uint8_t op);
  bool do_write(const Packet& pkt, uint8_t op);
  void do_read(const Packet& pkt, bool duplicate);
  void do_atomic(const Packet& pkt);
  void do_atomic_write(const Packet& pkt);
  void do_flush(const Packet& pkt);
  void send_empty_read_response(uint32_t psn);
  void send_atomic_ack(uint32_t psn, uint64_t orig);
  bool hold_receive(std::span<const uint8_t> first = {});
  void complete_receive(ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len,
                        const Packet* last, uint32_t src_qp, unsigned flags, uint8_t sl = 0);
  void do_away(const Packet& pkt, uint8_t op);
  bool finish_away(const Packet& pkt, const XrcVerdict& v, bool single);
  XrcAway away_op(const Packet& pkt, ibv_wr_opcode opcode) const;
  void send_ack(uint8_t syndrome, uint32_t psn);
  void responder_fatal(uint8_t nak_code, uint32_t psn, std::optional<ibv_event_type> event);
  void drop_message();
  bool inject_fault(const Packet& pkt, uint8_t op);  // `softverbs inject`: true if it took it

  Env& env_;
  const QpType type_;
  const uint32_t qp_num_;
  const bool sq_sig_all_;
  XrcRole xrc_ = XrcRole::kNone;
  ibv_qp_state state_ = IBV_QPS_RESET;

  // Attributes as ibv_modify_qp sets them.
  uint32_t mtu_ = 1024;
  uint32_t dest_qpn_ = 0;
  uint32_t qkey_ = 0;
  uint8_t timeout_ = 14;
  uint8_t retry_cnt_ = 7;
  uint8_t rnr_retry_ = 7;
  uint8_t min_rnr_timer_ = 12;
  uint8_t max_rd_atomic_ = 1;
  uint8_t max_dest_rd_atomic_ = 1;
  uint32_t max_unacked_psns_ = kMaxUnackedPsns;

  // Requester and completer.
  std::deque<SendEntry> sq_;
  size_t cursor_ = 0;          // sq_ index of the next WQE to transmit
  uint32_t cursor_pkt_ = 0;    // its next packet
  uint32_t next_psn_ = 0;      // first PSN of the next posted WQE
  uint32_t comp_psn_ = 0;      // oldest PSN not acknowledged
  uint32_t sent_end_psn_ = 0;  // one past the newest PSN transmitted
  uint32_t since_ack_req_ = 0;
  std::vector<Iov> scratch_;   // the payload slice of the packet being sent
  uint32_t rd_atomic_in_flight_ = 0;
  uint8_t retry_left_ = 7;
  uint8_t rnr_left_ = 7;
  bool retry_started_ = false;  // a go-back-N is under way; NAKs don't start another
  bool rnr_wait_ = false;
  uint64_t deadline_ns_ = 0;    // retransmit timeout or end of the RNR wait
  bool timer_armed_ = false;
  bool drained_raised_ = false;  // SQD: IBV_EVENT_SQ_DRAINED sent

  // Responder.
  uint32_t epsn_ = 0;
  uint32_t msn_ = 0;
  bool sent_psn_nak_ = false;
  bool comm_est_raised_ = false;
  InMessage in_msg_ = InMessage::kNone;
  uint32_t msg_first_psn_ = 0;  // the PSN of the first packet of the message in_msg_ names
  std::optional<RecvWqe> recv_;  // the receive WQE being filled (or kept for reuse)
  uint32_t recv_offset_ = 0;
  uint8_t* write_base_ = nullptr;
  uint32_t write_len_ = 0;
  uint32_t write_offset_ = 0;
  std::vector<AtomicReply> atomic_replies_;
  size_t atomic_next_ = 0;
  // XRC TGT: the request being handled is for an SRQ of another process (select_xrc_srq),
  // and the message in progress (in_msg_) is staged here for it, whole, at its last packet.
  bool xrc_away_ = false;
  bool away_active_ = false;
  uint32_t away_srqn_ = 0;
  uint64_t away_va_ = 0;
  uint32_t away_rkey_ = 0;
  uint32_t away_dma_len_ = 0;
  std::vector<uint8_t> away_msg_;
};

// Gathers [offset, offset + len) of `sg` into `out` (cleared first); false if sg is shorter.
bool slice_iovs(const std::vector<Iov>& sg, uint64_t offset, uint32_t len,
                std::vector<Iov>& out);
// Copies `len` bytes from `src` into `sg` at `offset`; false (nothing copied) if they do
// not fit.
bool scatter(const std::vector<Iov>& sg, uint64_t offset, const uint8_t* src, uint32_t len);
uint64_t iov_total(const std::vector<Iov>& sg);

}  // namespace softverbs::engine::packet
