// The responder: executes request packets in PSN order.
//  RC: the expected PSN runs the request; a PSN from the past is a duplicate, answered
//      again (re-ACK, READ re-executed from its own RETH, atomic replayed from the reply
//      cache, never executed twice); a PSN from the future gets one NAK sequence error and
//      then silence until the expected PSN comes. ACKs go out when a packet asks (AckReq),
//      one covering every packet before it. Class C errors (bad opcode sequence, length,
//      R_Key, alignment) NAK and move the QP to ERR.
//  UC: no ACKs or NAKs; a gap or error drops the message, its receive WQE is kept for
//      the next one.
//  UD: SEND ONLY with the right Q_Key, at most one MTU, behind a 40-byte GRH slot.
#include <algorithm>
#include <cstring>
#include <new>

#include "core/debug_hooks.hpp"
#include "engine/packet/packet_qp.hpp"
#include "wire/roce/grh.hpp"

namespace softverbs::engine::packet {

namespace rw = wire::roce;

namespace {

inline constexpr uint8_t kAckUnlimited = rw::kAethAck | 0x1f;  // ACK, credits unlimited
// XRC, an SRQ elsewhere: the longest message staged (the device's max_msg_sz), and the
// staging kept between messages.
inline constexpr uint64_t kMaxAwayMessage = uint64_t{1} << 31;
inline constexpr size_t kKeepAwayBytes = size_t{1} << 20;

// Makes `buf` hold `n` bytes; false when the memory cannot be had now.
bool away_room(std::vector<uint8_t>& buf, uint64_t n) {
  try {
    buf.resize(n);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

bool starts_message(uint8_t op) {
  switch (op) {
    case rw::kSendFirst: case rw::kSendOnly: case rw::kSendOnlyImm: case rw::kSendOnlyInv:
    case rw::kWriteFirst: case rw::kWriteOnly: case rw::kWriteOnlyImm:
    case rw::kReadRequest: case rw::kCompareSwap: case rw::kFetchAdd:
    case rw::kFlush: case rw::kAtomicWrite:
      return true;
    default:
      return false;
  }
}
bool ends_message(uint8_t op) {
  switch (op) {
    case rw::kSendLast: case rw::kSendLastImm: case rw::kSendOnly: case rw::kSendOnlyImm:
    case rw::kSendLastInv: case rw::kSendOnlyInv:
    case rw::kWriteLast: case rw::kWriteLastImm: case rw::kWriteOnly: case rw::kWriteOnlyImm:
    case rw::kReadRequest: case rw::kCompareSwap: case rw::kFetchAdd:
    case rw::kFlush: case rw::kAtomicWrite:
      return true;
    default:
      return false;
  }
}
// SEND_LAST/ONLY_WITH_INVALIDATE (0x16, 0x17) are sends too; only RC (and XRC) have them.
bool carries_ieth(uint8_t op) { return op == rw::kSendLastInv || op == rw::kSendOnlyInv; }
bool is_send_op(uint8_t op) { return op <= rw::kSendOnlyImm || carries_ieth(op); }
bool is_write_op(uint8_t op) { return op >= rw::kWriteFirst && op <= rw::kWriteOnlyImm; }
bool is_flush_or_atomic_write_op(uint8_t op) { return op == rw::kFlush || op == rw::kAtomicWrite; }
bool carries_imm(uint8_t op) {
  return op == rw::kSendLastImm || op == rw::kSendOnlyImm || op == rw::kWriteLastImm ||
         op == rw::kWriteOnlyImm;
}

}  // namespace

void PacketQp::on_request(const Packet& pkt, const uint8_t* grh) {
  if (state_ != IBV_QPS_RTR && state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD &&
      state_ != IBV_QPS_SQE)
    return;
  if (state_ == IBV_QPS_RTR && !comm_est_raised_) {
    comm_est_raised_ = true;
    env_.raise_event(IBV_EVENT_COMM_EST);
  }
  if (type_ == QpType::kUd) {
    on_ud_request(pkt, grh);
    return;
  }
  uint32_t psn = pkt.psn & kPsnMask;
  int32_t d = psn_diff(psn, epsn_);
  // XRC: the request's XRC SRQ must be one of this TGT QP's domain (an invalid request).
  if (xrc_ == XrcRole::kTgt) {
    const XrcSrqPlace place = env_.select_xrc_srq(pkt.xrc_srqn);
    if (place == XrcSrqPlace::kNone) {
      if (d == 0) responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
      return;
    }
    xrc_away_ = place == XrcSrqPlace::kElsewhere;
  }
  if (type_ == QpType::kRc) {
    if (d > 0) {
      if (!sent_psn_nak_) {
        sent_psn_nak_ = true;
        send_ack(aeth_syndrome(rw::kAethNak, rw::kNakPsnSequenceError), epsn_);
      }
      return;
    }
    if (d < 0) {
      on_duplicate(pkt);
      return;
    }
    sent_psn_nak_ = false;
  } else if (d != 0) {
    drop_message();  // UC lost packets: the message they belonged to is gone
    epsn_ = psn;
  }
  execute(pkt);
}

// Runs the request at the expected PSN.
void PacketQp::execute(const Packet& pkt) {
  const bool rc = type_ == QpType::kRc;
  const uint8_t op = pkt.opcode & 0x1f;
  const uint32_t psn = pkt.psn & kPsnMask;
  if (!rc) epsn_ = psn_add(psn, 1);
  bool known = is_send_op(op) || is_write_op(op) ||
               (rc && (op == rw::kReadRequest || op == rw::kCompareSwap || op == rw::kFetchAdd ||
                       is_flush_or_atomic_write_op(op)));
  if (!known) {
    if (rc) responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  if (!check_sequence(op)) {
    if (rc) {
      responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
      return;
    }
    drop_message();
    if (!starts_message(op)) return;
  }
  if (!check_length(pkt, op)) {
    if (rc) {
      responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    } else {
      drop_message();
    }
    return;
  }
  // `softverbs inject`: a new message may meet a fault armed on this responder.
  if (rc && in_msg_ == InMessage::kNone && debug_hooks_armed() && inject_fault(pkt, op)) return;
  if (xrc_away_ || away_active_) {
    do_away(pkt, op);
    return;
  }
  if (op == rw::kReadRequest) {
    do_read(pkt, false);
    return;
  }
  if (op == rw::kCompareSwap || op == rw::kFetchAdd) {
    do_atomic(pkt);
    return;
  }
  if (op == rw::kAtomicWrite) {
    do_atomic_write(pkt);
    return;
  }
  if (op == rw::kFlush) {
    do_flush(pkt);
    return;
  }
  bool done = is_send_op(op) ? do_send(pkt, op) : do_write(pkt, op);
  if (!done || !rc) return;
  epsn_ = psn_add(psn, 1);
  if (pkt.ack_req) send_ack(kAckUnlimited, psn);
}

// A message in progress continues with its MIDDLE/LAST; otherwise a new one starts.
bool PacketQp::check_sequence(uint8_t op) const {
  switch (in_msg_) {
    case InMessage::kSend:
      return op == rw::kSendMiddle || op == rw::kSendLast || op == rw::kSendLastImm ||
             op == rw::kSendLastInv;
    case InMessage::kWrite:
      return op == rw::kWriteMiddle || op == rw::kWriteLast || op == rw::kWriteLastImm;
    case InMessage::kNone:
      return starts_message(op);
  }
  return false;
}

// FIRST and MIDDLE carry exactly one MTU, LAST 1..MTU, ONLY up to an MTU (as rxe checks).
bool PacketQp::check_length(const Packet& pkt, uint8_t op) const {
  uint32_t n = pkt.payload_len;
  if (n != 0 && pkt.payload == nullptr) return false;
  if (op == rw::kReadRequest || op == rw::kCompareSwap || op == rw::kFetchAdd || op == rw::kFlush)
    return n == 0;
  if (op == rw::kAtomicWrite) return n == rw::kAtomicWriteBytes && pkt.dma_len == n;
  bool start = starts_message(op), end = ends_message(op);
  if (start && end) return n <= mtu_;
  if (start || !end) return n == mtu_;
  return n >= 1 && n <= mtu_;
}

bool PacketQp::hold_receive(std::span<const uint8_t> first) {
  if (!recv_) recv_ = env_.take_receive(first);
  return recv_.has_value();
}

bool PacketQp::do_send(const Packet& pkt, uint8_t op) {
  const bool rc = type_ == QpType::kRc;
  const uint32_t psn = pkt.psn & kPsnMask;
  if (starts_message(op)) {
    if (!hold_receive({pkt.payload, pkt.payload_len})) {
      if (rc) send_ack(rw::kAethRnrNak | (min_rnr_timer_ & 0x1f), psn);
      return false;  // UC: dropped; the rest of the message fails the sequence check
    }
    in_msg_ = InMessage::kSend;
    msg_first_psn_ = psn;
    recv_offset_ = 0;
  }
  // Tag matching: the bytes before `skip` (or all, `discard`) are not placed.
  const uint32_t drop = recv_->discard ? pkt.payload_len
                        : recv_offset_ >= recv_->skip
                            ? 0
                            : std::min(pkt.payload_len, recv_->skip - recv_offset_);
  const uint64_t place_at = recv_offset_ + drop - std::min(recv_offset_ + drop, recv_->skip);
  if (drop < pkt.payload_len &&
      !scatter(recv_->sg, place_at, pkt.payload + drop, pkt.payload_len - drop)) {
    if (!rc) {
      drop_message();
      return false;
    }
    complete_receive(recv_->key_error ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR, IBV_WC_RECV,
                     0, nullptr, 0, 0);
    // A bad key in the receive WQE is the responder's own fault (rxe: a malformed WQE,
    // Remote Operational Error, as on one host); a message too long is Invalid Request.
    responder_fatal(recv_->key_error ? rw::kNakRemoteOperationalError : rw::kNakInvalidRequest,
                    psn, std::nullopt);
    return false;
  }
  recv_offset_ += pkt.payload_len;
  if (carries_ieth(op) && !env_.invalidate_rkey(pkt.inv_rkey)) {
    // The data is in; the R_Key is not ours to invalidate (rxe's "class J"): the receive
    // fails and so does the QP; the requester hears Invalid Request.
    complete_receive(IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0, nullptr, 0, 0);
    responder_fatal(rw::kNakInvalidRequest, psn, std::nullopt);
    return false;
  }
  if (ends_message(op)) {
    // src_qp: the connected peer, as the same-host transport reports it (ibv_poll_cq(3)
    // promises it for UD only; programs moving between the two must see the same).
    const uint32_t placed = recv_->discard ? 0 : recv_offset_ - std::min(recv_offset_, recv_->skip);
    complete_receive(IBV_WC_SUCCESS, IBV_WC_RECV, placed, &pkt, dest_qpn_, 0);
    in_msg_ = InMessage::kNone;
    msn_ = psn_add(msn_, 1);
  }
  return true;
}

bool PacketQp::do_write(const Packet& pkt, uint8_t op) {
  const bool rc = type_ == QpType::kRc;
  const uint32_t psn = pkt.psn & kPsnMask;
  const uint32_t n = pkt.payload_len;
  const bool first = starts_message(op);
  if (first) {
    write_base_ = nullptr;
    if (pkt.dma_len > 0) {  // a zero-length WRITE needs no valid R_Key (C9-88)
      RkeyResult r = env_.resolve_rkey(pkt.rkey, pkt.va, pkt.dma_len, IBV_ACCESS_REMOTE_WRITE);
      if (!r.ok) {
        if (rc) {
          responder_fatal(rw::kNakRemoteAccessError, psn, IBV_EVENT_QP_ACCESS_ERR);
        } else {
          drop_message();
        }
        return false;
      }
      write_base_ = r.addr;
    }
    write_len_ = pkt.dma_len;
    write_offset_ = 0;
    in_msg_ = InMessage::kWrite;
    msg_first_psn_ = psn;
  }
  bool last = ends_message(op);
  if (uint64_t{write_offset_} + n > write_len_ || (last && write_offset_ + n != write_len_)) {
    if (rc) {
      responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    } else {
      drop_message();
    }
    return false;
  }
  if (carries_imm(op) && !hold_receive()) {
    if (first) in_msg_ = InMessage::kNone;  // the retried ONLY starts afresh
    if (rc) {
      send_ack(rw::kAethRnrNak | (min_rnr_timer_ & 0x1f), psn);
    } else {
      drop_message();
    }
    return false;
  }
  if (n) std::memcpy(write_base_ + write_offset_, pkt.payload, n);
  write_offset_ += n;
  if (last) {
    if (carries_imm(op))
      complete_receive(IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, write_len_, &pkt, dest_qpn_,
                       0);
    in_msg_ = InMessage::kNone;
    msn_ = psn_add(msn_, 1);
  }
  return true;
}

// Answers a READ with its response packets (a duplicate from its own RETH and PSN).
void PacketQp::do_read(const Packet& pkt, bool duplicate) {
  const uint32_t psn = pkt.psn & kPsnMask;
  const uint32_t len = pkt.dma_len;
  if (len > (uint32_t{1} << 31)) {
    if (!duplicate) responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  uint8_t* base = nullptr;
  if (xrc_away_) {
    // The bytes come from the SRQ owner's memory (a duplicate reads them again).
    if (!away_room(away_msg_, len)) return;  // no memory for it now: unanswered
    XrcAway a = away_op(pkt, IBV_WR_RDMA_READ);
    a.result = {away_msg_.data(), len};
    const XrcVerdict v = env_.xrc_forward(a);
    if (v.kind != XrcVerdict::kAck) {
      if (v.kind == XrcVerdict::kNak && !duplicate) responder_fatal(v.code, psn, v.event);
      return;  // kNone: unanswered, the requester asks again
    }
    base = away_msg_.data();
  } else if (len > 0) {
    RkeyResult r = env_.resolve_rkey(pkt.rkey, pkt.va, len, IBV_ACCESS_REMOTE_READ);
    if (!r.ok) {
      if (!duplicate)
        responder_fatal(rw::kNakRemoteAccessError, psn, IBV_EVENT_QP_ACCESS_ERR);
      return;
    }
    base = r.addr;
  }
  const uint32_t npkts = std::max<uint32_t>(1, (len + mtu_ - 1) / mtu_);
  if (!duplicate) {
    msn_ = psn_add(msn_, 1);
    epsn_ = psn_add(psn, npkts);
  }
  for (uint32_t k = 0; k < npkts; ++k) {
    Packet r;
    uint8_t op = npkts == 1       ? rw::kReadResponseOnly
                 : k == 0         ? rw::kReadResponseFirst
                 : k + 1 < npkts  ? rw::kReadResponseMiddle
                                  : rw::kReadResponseLast;
    r.opcode = transport_bits() | op;
    r.dest_qp = dest_qpn_;
    r.psn = psn_add(psn, k);
    r.syndrome = kAckUnlimited;
    r.msn = msn_;
    uint32_t offset = k * mtu_;
    Iov chunk{base + offset, std::min(mtu_, len - offset)};
    r.payload_len = chunk.len;
    env_.send_packet(r, std::span<const Iov>(&chunk, chunk.len ? 1 : 0));
  }
}

void PacketQp::do_atomic(const Packet& pkt) {
  const uint32_t psn = pkt.psn & kPsnMask;
  if (pkt.va & 7) {
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  bool cas = (pkt.opcode & 0x1f) == rw::kCompareSwap;
  uint64_t orig = 0;
  if (xrc_away_) {
    // Executed once, in the SRQ owner's process; its duplicates replay the cached answer.
    XrcAway a = away_op(pkt, cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD);
    a.result = {reinterpret_cast<uint8_t*>(&orig), sizeof orig};
    const XrcVerdict v = env_.xrc_forward(a);
    if (v.kind == XrcVerdict::kNak) responder_fatal(v.code, psn, v.event);
    if (v.kind != XrcVerdict::kAck) return;
  } else {
    RkeyResult r = env_.resolve_rkey(pkt.rkey, pkt.va, 8, IBV_ACCESS_REMOTE_ATOMIC);
    if (!r.ok) {
      responder_fatal(rw::kNakRemoteAccessError, psn, IBV_EVENT_QP_ACCESS_ERR);
      return;
    }
    orig = env_.atomic_execute(r.addr, cas ? IBV_WR_ATOMIC_CMP_AND_SWP
                                           : IBV_WR_ATOMIC_FETCH_AND_ADD,
                               cas ? pkt.compare : pkt.swap_add, cas ? pkt.swap_add : 0);
  }
  if (atomic_replies_.empty()) atomic_replies_.resize(std::max<uint8_t>(max_dest_rd_atomic_, 1));
  atomic_replies_[atomic_next_] = AtomicReply{psn, orig, true};
  atomic_next_ = (atomic_next_ + 1) % atomic_replies_.size();
  msn_ = psn_add(msn_, 1);
  epsn_ = psn_add(psn, 1);
  send_atomic_ack(psn, orig);
}

// ATOMIC WRITE: 8 aligned bytes stored at once; the MR needs REMOTE_WRITE (as rxe).
void PacketQp::do_atomic_write(const Packet& pkt) {
  const uint32_t psn = pkt.psn & kPsnMask;
  if (pkt.va & 7) {
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  RkeyResult r = env_.resolve_rkey(pkt.rkey, pkt.va, rw::kAtomicWriteBytes, IBV_ACCESS_REMOTE_WRITE);
  if (!r.ok) {
    responder_fatal(rw::kNakRemoteAccessError, psn, IBV_EVENT_QP_ACCESS_ERR);
    return;
  }
  uint64_t value;
  std::memcpy(&value, pkt.payload, sizeof value);  // check_length: exactly 8 bytes
  env_.atomic_execute(r.addr, IBV_WR_ATOMIC_WRITE, value, 0);
  msn_ = psn_add(msn_, 1);
  epsn_ = psn_add(psn, 1);
  send_empty_read_response(psn);
}

// FLUSH: the placement type names the access the MR (and QP) must grant; the selectivity
// level, the range (RETH) or the whole MR.
void PacketQp::do_flush(const Packet& pkt) {
  const uint32_t psn = pkt.psn & kPsnMask;
  bool type_ok = pkt.flush_type != 0 && !(pkt.flush_type & ~(kFlushGlobal | kFlushPersistent));
  if (!type_ok || pkt.flush_level > kFlushMr) {
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  if (!env_.flush(pkt.rkey, pkt.va, pkt.dma_len, pkt.flush_type, pkt.flush_level)) {
    responder_fatal(rw::kNakRemoteAccessError, psn, IBV_EVENT_QP_ACCESS_ERR);
    return;
  }
  msn_ = psn_add(msn_, 1);
  epsn_ = psn_add(psn, 1);
  send_empty_read_response(psn);
}

// How rxe answers ATOMIC WRITE and FLUSH: an RDMA READ RESPONSE ONLY without payload.
void PacketQp::send_empty_read_response(uint32_t psn) {
  Packet r;
  r.opcode = bth_opcode(transport_bits(), rw::kReadResponseOnly);
  r.dest_qp = dest_qpn_;
  r.psn = psn;
  r.syndrome = kAckUnlimited;
  r.msn = msn_;
  env_.send_packet(r, {});
}

void PacketQp::send_atomic_ack(uint32_t psn, uint64_t orig) {
  Packet r;
  r.opcode = bth_opcode(transport_bits(), rw::kAtomicAck);
  r.dest_qp = dest_qpn_;
  r.psn = psn;
  r.syndrome = kAckUnlimited;
  r.msn = msn_;
  r.orig = orig;
  env_.send_packet(r, {});
}

PacketQp::ResponderState PacketQp::responder_state() const {
  ResponderState st;
  st.epsn = in_msg_ != InMessage::kNone ? msg_first_psn_ : epsn_;
  st.msn = msn_;
  st.comm_est_raised = comm_est_raised_;
  for (const AtomicReply& a : atomic_replies_)
    if (a.valid) st.atomic_replies.push_back({a.psn, a.orig});
  return st;
}

void PacketQp::resume_responder(const ResponderState& st) {
  msn_ = st.msn & kPsnMask;
  comm_est_raised_ = st.comm_est_raised;
  if (atomic_replies_.empty()) atomic_replies_.resize(std::max<uint8_t>(max_dest_rd_atomic_, 1));
  for (const auto& [psn, orig] : st.atomic_replies) {
    atomic_replies_[atomic_next_] = AtomicReply{psn & kPsnMask, orig, true};
    atomic_next_ = (atomic_next_ + 1) % atomic_replies_.size();
  }
}

// C9-105 and on: a duplicate is answered again, never executed again (READ excepted:
// reading twice changes nothing).
void PacketQp::on_duplicate(const Packet& pkt) {
  const uint8_t op = pkt.opcode & 0x1f;
  const uint32_t psn = pkt.psn & kPsnMask;
  if (is_send_op(op) || is_write_op(op)) {
    if (pkt.ack_req) send_ack(kAckUnlimited, psn_add(epsn_, kPsnMask));
  } else if (op == rw::kReadRequest) {
    if (pkt.payload_len == 0) do_read(pkt, true);
  } else if (op == rw::kCompareSwap || op == rw::kFetchAdd) {
    for (const AtomicReply& a : atomic_replies_) {
      if (a.valid && a.psn == psn) {
        send_atomic_ack(psn, a.orig);
        break;
      }
    }
    // Not cached any more: dropped (executing it again could be wrong).
  } else if (is_flush_or_atomic_write_op(op)) {
    send_empty_read_response(psn);  // done once already: only the answer was lost
  }
}

void PacketQp::on_ud_request(const Packet& pkt, const uint8_t* grh) {
  const uint8_t op = pkt.opcode & 0x1f;
  if (op != rw::kSendOnly && op != rw::kSendOnlyImm) return;
  if (pkt.qkey != qkey_) return;
  const uint32_t n = pkt.payload_len;
  if (n > mtu_ || (n != 0 && pkt.payload == nullptr)) return;
  if (!hold_receive()) return;  // no receive: silently dropped
  // Too long for the receive: dropped, the WQE stays for the next datagram (as rxe).
  if (iov_total(recv_->sg) < uint64_t{kGrhBytes} + n) return;
  static constexpr uint8_t kNoGrh[kGrhBytes] = {};
  scatter(recv_->sg, 0, grh ? grh : kNoGrh, kGrhBytes);
  scatter(recv_->sg, kGrhBytes, pkt.payload, n);
  complete_receive(IBV_WC_SUCCESS, IBV_WC_RECV, kGrhBytes + n, &pkt, pkt.src_qp & kPsnMask,
                   IBV_WC_GRH, rw::grh_slot_l3_type(grh ? grh : kNoGrh));
}

// Completes the held receive WQE; `last` is the packet that ended the message.
void PacketQp::complete_receive(ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len,
                                const Packet* last, uint32_t src_qp, unsigned flags,
                                uint8_t sl) {
  Completion wc;
  wc.wr_id = recv_->wr_id;
  wc.tm = recv_->tm;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.qp_num = qp_num_;
  wc.src_qp = src_qp;
  wc.wc_flags = flags;
  wc.sl = sl;
  if (last) {
    if (carries_imm(last->opcode & 0x1f)) {
      wc.imm_data = last->imm;
      wc.wc_flags |= IBV_WC_WITH_IMM;
    }
    if (carries_ieth(last->opcode & 0x1f)) {
      wc.imm_data = last->inv_rkey;  // ibv_wc.invalidated_rkey shares it (host order)
      wc.wc_flags |= IBV_WC_WITH_INV;
    }
    wc.solicited = last->solicited;
  }
  recv_.reset();
  env_.push_completion(WorkQueue::kRecv, wc);
}

// ---- XRC: a request for an XRC SRQ of another process ------------------------------------
// The QP keeps its PSN order, duplicate answers and ACKs; a SEND or WRITE is staged here
// packet by packet and goes to the SRQ's process whole at its last packet, which is
// acknowledged only once that process placed it (or definitely failed it). A refused last
// packet (RNR, no answer) leaves the rest staged: the retry brings that packet again.

XrcAway PacketQp::away_op(const Packet& pkt, ibv_wr_opcode opcode) const {
  XrcAway a;
  a.opcode = opcode;
  a.srqn = pkt.xrc_srqn & kPsnMask;
  a.src_qpn = dest_qpn_;
  a.min_rnr_timer = min_rnr_timer_;
  a.max_dest_rd_atomic = max_dest_rd_atomic_;
  a.rkey = pkt.rkey;
  a.va = pkt.va;
  const bool cas = (pkt.opcode & 0x1f) == rw::kCompareSwap;
  a.compare_add = cas ? pkt.compare : pkt.swap_add;
  a.swap = cas ? pkt.swap_add : 0;
  return a;
}

void PacketQp::do_away(const Packet& pkt, uint8_t op) {
  const uint32_t psn = pkt.psn & kPsnMask;
  // One message, one SRQ: its packets all name the SRQ its first one named.
  const bool continues = in_msg_ != InMessage::kNone;
  if (continues && (!away_active_ || !xrc_away_ || (pkt.xrc_srqn & kPsnMask) != away_srqn_)) {
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  if (op == rw::kReadRequest) {
    do_read(pkt, false);
    return;
  }
  if (op == rw::kCompareSwap || op == rw::kFetchAdd) {
    do_atomic(pkt);
    return;
  }
  if (is_flush_or_atomic_write_op(op)) {  // not XRC operations (no XRC opcodes for them)
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  const bool write = is_write_op(op);
  if (starts_message(op)) {
    away_msg_.clear();
    away_active_ = true;
    away_srqn_ = pkt.xrc_srqn & kPsnMask;
    away_va_ = pkt.va;
    away_rkey_ = pkt.rkey;
    away_dma_len_ = pkt.dma_len;
    in_msg_ = write ? InMessage::kWrite : InMessage::kSend;
    msg_first_psn_ = psn;
  }
  const uint64_t staged = away_msg_.size(), total = staged + pkt.payload_len;
  const uint64_t limit = write ? away_dma_len_ : kMaxAwayMessage;
  if (total > limit || (write && ends_message(op) && total != away_dma_len_)) {
    responder_fatal(rw::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    return;
  }
  if (!away_room(away_msg_, total)) {
    if (starts_message(op)) drop_message();
    return;  // unanswered: the requester sends it again
  }
  if (pkt.payload_len) std::memcpy(away_msg_.data() + staged, pkt.payload, pkt.payload_len);
  if (!ends_message(op)) {
    epsn_ = psn_add(psn, 1);
    if (pkt.ack_req) send_ack(kAckUnlimited, psn);
    return;
  }
  const bool imm = carries_imm(op), inv = carries_ieth(op);
  XrcAway a;
  a.opcode = write ? (imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE)
                   : (imm ? IBV_WR_SEND_WITH_IMM : inv ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND);
  a.srqn = away_srqn_;
  a.src_qpn = dest_qpn_;
  a.min_rnr_timer = min_rnr_timer_;
  a.max_dest_rd_atomic = max_dest_rd_atomic_;
  a.imm = imm ? pkt.imm : inv ? pkt.inv_rkey : 0;  // SEND_WITH_INV: the R_Key, host order
  a.solicited = pkt.solicited;
  a.rkey = away_rkey_;
  a.va = away_va_;
  a.payload = {away_msg_.data(), away_msg_.size()};
  const XrcVerdict v = env_.xrc_forward(a);
  if (!finish_away(pkt, v, starts_message(op))) away_msg_.resize(staged);
}

// Answers the last packet of a staged message; false when it is to come again (RNR, no
// answer) and the message stays staged without it.
bool PacketQp::finish_away(const Packet& pkt, const XrcVerdict& v, bool single) {
  const uint32_t psn = pkt.psn & kPsnMask;
  switch (v.kind) {
    case XrcVerdict::kAck:
      drop_message();
      if (away_msg_.capacity() > kKeepAwayBytes) std::vector<uint8_t>().swap(away_msg_);
      msn_ = psn_add(msn_, 1);
      epsn_ = psn_add(psn, 1);
      if (pkt.ack_req) send_ack(kAckUnlimited, psn);
      return true;
    case XrcVerdict::kNak:
      responder_fatal(v.code, psn, v.event);
      return true;
    case XrcVerdict::kRnr:
      send_ack(rw::kAethRnrNak | (v.code & 0x1f), psn);
      break;
    case XrcVerdict::kNone:
      break;
  }
  if (single) drop_message();  // the retried ONLY starts afresh
  return false;
}

// ---- `softverbs inject`'s responder faults, as the real ones are answered above.
bool PacketQp::inject_fault(const Packet& pkt, uint8_t op) {
  const uint32_t psn = pkt.psn & kPsnMask;
  const bool write_imm = op == rw::kWriteOnlyImm;
  const InjectedFault f = env_.responder_fault(is_send_op(op) || write_imm, min_rnr_timer_);
  switch (f.kind) {
    case InjectedFault::kNone:
      return false;
    case InjectedFault::kRnr:
      send_ack(rw::kAethRnrNak | (f.code & 0x1f), psn);
      return true;
    case InjectedFault::kNak:
      responder_fatal(f.code, psn, f.event);
      return true;
    case InjectedFault::kReceive:
      break;
  }
  if (!hold_receive({pkt.payload, pkt.payload_len})) {  // none to fail: the RNR it meets anyway
    env_.give_back_fault();
    return false;
  }
  complete_receive(f.recv_status, write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV, 0,
                   nullptr, dest_qpn_, 0);
  responder_fatal(f.code, psn, std::nullopt);
  return true;
}
// ---- end

void PacketQp::send_ack(uint8_t syndrome, uint32_t psn) {
  Packet r;
  r.opcode = bth_opcode(transport_bits(), rw::kAck);
  r.dest_qp = dest_qpn_;
  r.psn = psn & kPsnMask;
  r.syndrome = syndrome;
  r.msn = msn_;
  env_.send_packet(r, {});
}

// A class C error: NAK it, tell the owner, and take the QP to ERR.
void PacketQp::responder_fatal(uint8_t nak_code, uint32_t psn,
                               std::optional<ibv_event_type> event) {
  send_ack(rw::kAethNak | nak_code, psn);
  if (event) env_.raise_event(*event);
  enter_error();
}

void PacketQp::drop_message() {
  in_msg_ = InMessage::kNone;
  away_active_ = false;
  away_msg_.clear();
  recv_offset_ = 0;
  write_base_ = nullptr;
  write_len_ = write_offset_ = 0;
}

}  // namespace softverbs::engine::packet
