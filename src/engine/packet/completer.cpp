// The completer (RC only): retires send WQEs on what the responder sends back.
//  - ACK for PSN n: everything up to n is done (coalesced ACKs);
//  - READ responses: scattered into the WQE's buffers in PSN order; one for a later READ
//    also acknowledges every PSN before that READ; atomic ACKs carry the original value;
//  - NAK sequence error: go-back-N from its PSN; RNR NAK: the same after the NAK's timer,
//    rnr_retry times (7 = forever); other NAKs fail the WQE and the QP;
//  - the retransmit timer (4.096 us * 2^timeout) retransmits from the oldest unacknowledged
//    PSN, retry_cnt times, then IBV_WC_RETRY_EXC_ERR.
// A READ or atomic whose responses are skipped over (an ACK or response for a later PSN
// came first) lost them: it is retried at once, as rxe does.
#include "engine/packet/packet_qp.hpp"

namespace softverbs::engine::packet {

namespace rw = wire::roce;

void PacketQp::on_response(const Packet& pkt) {
  if (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD && state_ != IBV_QPS_SQE) return;
  if (sq_.empty()) return;
  uint32_t psn = pkt.psn & kPsnMask;
  // Only PSNs sent and not yet acknowledged mean anything; the rest are old or bogus.
  if (psn_diff(psn, comp_psn_) < 0 || psn_diff(psn, sent_end_psn_) >= 0) return;
  switch (pkt.opcode & 0x1f) {
    case rw::kAck:
      if ((pkt.syndrome & 0xe0) == rw::kAethAck) {
        ack_through(psn);
      } else if ((pkt.syndrome & 0xe0) == rw::kAethRnrNak ||
                 (pkt.syndrome & 0xe0) == rw::kAethNak) {
        on_nak(pkt);
      }
      break;
    case rw::kAtomicAck:
      on_atomic_ack(pkt);
      break;
    default:
      on_read_response(pkt);
      break;
  }
  pump();
  check_drained();
}

// Retires the WQEs that an acknowledgement of `psn` covers. False when it ran into a READ
// or atomic whose responses never came (a retry has been started, or the QP failed).
bool PacketQp::ack_through(uint32_t psn) {
  bool progressed = false;
  bool responses_lost = false;
  while (!sq_.empty()) {
    SendEntry& h = sq_.front();
    if (h.npkts == 0) {  // a local operation, now the oldest
      retire_local_ops();
      continue;
    }
    if (!h.started || psn_diff(psn, h.first_psn) < 0) break;
    if (is_rd_atomic(h.wr.opcode)) {
      responses_lost = true;
      break;
    }
    if (psn_diff(psn, h.last_psn()) < 0) {  // part of a multi-packet message
      if (psn_diff(psn, comp_psn_) >= 0) {
        comp_psn_ = psn_add(psn, 1);
        progressed = true;
      }
      break;
    }
    comp_psn_ = psn_add(h.last_psn(), 1);
    complete_head(IBV_WC_SUCCESS);
    progressed = true;
  }
  if (progressed) progress_made();
  if (responses_lost) {
    retry(false);
    return false;
  }
  return true;
}

// Progress: fresh retry budgets, the timer restarted from now, and the cursor moved past
// anything a late ACK covered.
void PacketQp::progress_made() {
  retry_left_ = retry_cnt_;
  rnr_left_ = rnr_retry_;
  retry_started_ = false;
  if (psn_diff(cursor_psn(), comp_psn_) < 0) go_back_to(comp_psn_);
  restart_retransmit_timer();
}

void PacketQp::restart_retransmit_timer() {
  if (rnr_wait_) return;  // the one timer is counting the RNR wait
  uint64_t timeout = ack_timeout_ns(timeout_);
  if (type_ == QpType::kRc && timeout != 0 && psn_diff(sent_end_psn_, comp_psn_) > 0) {
    deadline_ns_ = env_.now_ns() + timeout;
    timer_armed_ = true;
    env_.arm_timer(deadline_ns_);
  } else if (timer_armed_) {
    timer_armed_ = false;
    env_.cancel_timer();
  }
}

// Go-back-N from the oldest unacknowledged PSN. A NAK or lost READ response starts at
// most one retry until progress is made; the timer always may.
void PacketQp::retry(bool from_timer) {
  if (!from_timer && retry_started_) return;
  if (sq_.empty() || !sq_.front().started) return;
  if (retry_left_ == 0) {
    fail_head(IBV_WC_RETRY_EXC_ERR);
    return;
  }
  --retry_left_;
  retry_started_ = true;
  go_back_to(comp_psn_);
  restart_retransmit_timer();
  pump();
}

void PacketQp::fail_head(ibv_wc_status status) {
  if (!sq_.empty()) complete_head(status);
  enter_error();
}

void PacketQp::on_nak(const Packet& pkt) {
  uint32_t psn = pkt.psn & kPsnMask;
  uint32_t before = psn_add(psn, kPsnMask);  // psn - 1: a NAK acknowledges what precedes it
  if ((pkt.syndrome & 0xe0) == rw::kAethRnrNak) {
    if (rnr_wait_ || !ack_through(before) || sq_.empty()) return;
    env_.rnr_nak_taken();
    if (rnr_left_ == 0) {
      fail_head(IBV_WC_RNR_RETRY_EXC_ERR);
      return;
    }
    if (rnr_left_ != 7) --rnr_left_;
    go_back_to(psn);
    rnr_wait_ = true;
    deadline_ns_ = env_.now_ns() + uint64_t{rnr_timer_usec(pkt.syndrome & 0x1f)} * 1000;
    timer_armed_ = true;
    env_.arm_timer(deadline_ns_);
    return;
  }
  ibv_wc_status status;
  switch (pkt.syndrome & 0x1f) {
    case rw::kNakPsnSequenceError:
      // During an RNR wait the responder NAKs the packets that followed the refused one.
      if (ack_through(before) && !rnr_wait_) retry(false);
      return;
    case rw::kNakInvalidRequest: status = IBV_WC_REM_INV_REQ_ERR; break;
    case rw::kNakRemoteAccessError: status = IBV_WC_REM_ACCESS_ERR; break;
    case rw::kNakInvalidRdRequest: status = IBV_WC_REM_INV_RD_REQ_ERR; break;
    default: status = IBV_WC_REM_OP_ERR; break;
  }
  ack_through(before);
  if (state_ != IBV_QPS_ERR) fail_head(status);
}

void PacketQp::on_read_response(const Packet& pkt) {
  uint8_t op = pkt.opcode & 0x1f;
  uint32_t psn = pkt.psn & kPsnMask;
  bool has_aeth = op != rw::kReadResponseMiddle;
  if (has_aeth && (pkt.syndrome & 0xe0) != rw::kAethAck) return;
  int i = find_entry(psn);
  if (i >= 0 && is_flush_or_atomic_write(sq_[i].wr.opcode)) {
    on_empty_read_response(pkt, i);
    return;
  }
  if (i < 0 || sq_[i].wr.opcode != IBV_WR_RDMA_READ) return;
  // A response to this READ acknowledges every request before it.
  if (i > 0 && !ack_through(psn_add(sq_[i].first_psn, kPsnMask))) return;
  if (sq_.empty() || psn_diff(psn, comp_psn_) != 0) return;  // a gap: the timer retries
  SendEntry& w = sq_.front();
  if (w.wr.opcode != IBV_WR_RDMA_READ || psn_diff(psn, w.first_psn) < 0) return;
  uint32_t k = static_cast<uint32_t>(psn_diff(psn, w.first_psn));
  if (k >= w.npkts) return;
  uint64_t offset = uint64_t{k} * mtu_;
  bool last = k + 1 == w.npkts;
  uint32_t expect = last ? static_cast<uint32_t>(w.length - offset) : mtu_;
  // A retried READ starts again with FIRST or ONLY; only the end must fall where it should.
  bool ends = op == rw::kReadResponseLast || op == rw::kReadResponseOnly;
  if (ends != last || pkt.payload_len != expect || (expect != 0 && pkt.payload == nullptr))
    return;
  if (!scatter(w.wr.sg, offset, pkt.payload, expect)) return;
  comp_psn_ = psn_add(psn, 1);
  if (last) complete_head(IBV_WC_SUCCESS);
  progress_made();
}

// ATOMIC WRITE and FLUSH are done when their empty READ RESPONSE ONLY comes.
void PacketQp::on_empty_read_response(const Packet& pkt, int i) {
  uint32_t psn = pkt.psn & kPsnMask;
  if ((pkt.opcode & 0x1f) != rw::kReadResponseOnly || pkt.payload_len != 0) return;
  if (i > 0 && !ack_through(psn_add(psn, kPsnMask))) return;
  if (sq_.empty() || psn_diff(psn, comp_psn_) != 0 ||
      !is_flush_or_atomic_write(sq_.front().wr.opcode))
    return;
  comp_psn_ = psn_add(psn, 1);
  complete_head(IBV_WC_SUCCESS);
  progress_made();
}

void PacketQp::on_atomic_ack(const Packet& pkt) {
  uint32_t psn = pkt.psn & kPsnMask;
  if ((pkt.syndrome & 0xe0) != rw::kAethAck) return;
  int i = find_entry(psn);
  if (i < 0 || !is_atomic(sq_[i].wr.opcode)) return;
  if (i > 0 && !ack_through(psn_add(psn, kPsnMask))) return;
  if (sq_.empty() || psn_diff(psn, comp_psn_) != 0 || !is_atomic(sq_.front().wr.opcode))
    return;
  uint64_t orig = pkt.orig;
  scatter(sq_.front().wr.sg, 0, reinterpret_cast<const uint8_t*>(&orig), sizeof orig);
  comp_psn_ = psn_add(psn, 1);
  complete_head(IBV_WC_SUCCESS);
  progress_made();
}

void PacketQp::on_timer() {
  if (!timer_armed_) return;
  if (env_.now_ns() < deadline_ns_) {
    env_.arm_timer(deadline_ns_);
    return;
  }
  timer_armed_ = false;
  if (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD && state_ != IBV_QPS_SQE) return;
  if (rnr_wait_) {
    rnr_wait_ = false;
    restart_retransmit_timer();
    pump();
    return;
  }
  if (psn_diff(sent_end_psn_, comp_psn_) > 0) retry(true);
}

}  // namespace softverbs::engine::packet
