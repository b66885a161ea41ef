// The requester: turns send WQEs into request packets. Messages are cut at the path MTU
// into FIRST/MIDDLE/LAST or ONLY packets with consecutive 24-bit PSNs; a READ takes one PSN
// per response packet it asks for. PSNs are given when the WQE is posted, so that a
// retransmission rebuilds any packet from its WQE (go-back-N needs nothing else kept).
// Pacing as rxe: at most max_unacked_psns_ PSNs past the oldest unacknowledged one, at most
// max_rd_atomic READs/atomics outstanding, AckReq on the last packet of a message and
// every kPacketsPerAckReq packets.
#include <algorithm>
#include <cerrno>

#include "engine/packet/packet_qp.hpp"

namespace softverbs::engine::packet {

namespace rw = wire::roce;

namespace {

bool has_imm(ibv_wr_opcode op) {
  return op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}
bool is_write(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}
bool is_local(ibv_wr_opcode op) { return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV; }

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  if (op == kWrFlush) return kWcFlush;  // not in the 44 headers' enum
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE: return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW: return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV: return IBV_WC_LOCAL_INV;
    default: return IBV_WC_SEND;
  }
}

// FIRST/MIDDLE/LAST/ONLY for packet k of n of a SEND or WRITE.
uint8_t segment_opcode(ibv_wr_opcode op, uint32_t k, uint32_t n) {
  bool first = k == 0, last = k + 1 == n, imm = has_imm(op);
  if (is_write(op)) {
    if (first && last) return imm ? rw::kWriteOnlyImm : rw::kWriteOnly;
    if (first) return rw::kWriteFirst;
    if (last) return imm ? rw::kWriteLastImm : rw::kWriteLast;
    return rw::kWriteMiddle;
  }
  // SEND_WITH_INV: the IETH rides on the packet that ends the message.
  const bool inv = op == IBV_WR_SEND_WITH_INV;
  if (first && last) return inv ? rw::kSendOnlyInv : imm ? rw::kSendOnlyImm : rw::kSendOnly;
  if (first) return rw::kSendFirst;
  if (last) return inv ? rw::kSendLastInv : imm ? rw::kSendLastImm : rw::kSendLast;
  return rw::kSendMiddle;
}

}  // namespace

int PacketQp::post_send(SendWqe wqe) {
  if (wqe.opcode == kWrFlush && type_ != QpType::kRc) return EINVAL;
  if (wqe.opcode != kWrFlush) switch (wqe.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      if (type_ == QpType::kUd) return EINVAL;
      break;
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:
    case IBV_WR_SEND_WITH_INV:  // IBA has IETH opcodes for RC only
      if (type_ != QpType::kRc) return EINVAL;
      break;
    case IBV_WR_BIND_MW:
    case IBV_WR_LOCAL_INV:
      if (type_ == QpType::kUd) return EINVAL;
      break;
    default:
      return EINVAL;
  }
  uint64_t length = iov_total(wqe.sg);
  if (is_atomic(wqe.opcode)) {
    if (length < 8) return EINVAL;
    length = 8;
  }
  if (wqe.opcode == IBV_WR_ATOMIC_WRITE) length = rw::kAtomicWriteBytes;  // in compare_add
  if (wqe.opcode == kWrFlush) length = wqe.flush_length;
  if (length > (uint64_t{1} << 31)) return EINVAL;
  if (type_ == QpType::kUd && length > mtu_) return EINVAL;

  SendEntry e;
  e.length = static_cast<uint32_t>(length);
  e.npkts = is_single_packet(wqe.opcode) ? 1 : std::max<uint32_t>(1, (e.length + mtu_ - 1) / mtu_);
  if (is_local(wqe.opcode)) e.length = e.npkts = 0;  // no PSN: nothing goes on the wire
  e.wr = std::move(wqe);
  if (state_ == IBV_QPS_ERR || state_ == IBV_QPS_SQE) {
    complete_send(e, IBV_WC_WR_FLUSH_ERR);
    return 0;
  }
  if (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD) return EINVAL;
  e.first_psn = next_psn_;
  next_psn_ = psn_add(next_psn_, e.npkts);
  sq_.push_back(std::move(e));
  pump();
  return 0;
}

// Local operations ran when they were posted; each completes as soon as it is the oldest
// (an error one fails the QP, as any failed WQE does).
void PacketQp::retire_local_ops() {
  while (!sq_.empty() && is_local(sq_.front().wr.opcode)) {
    ibv_wc_status status = sq_.front().wr.local_status;
    if (status != IBV_WC_SUCCESS) {
      fail_head(status);
      return;
    }
    complete_head(IBV_WC_SUCCESS);
  }
}

uint32_t PacketQp::cursor_psn() const {
  if (cursor_ >= sq_.size()) return next_psn_;
  return psn_add(sq_[cursor_].first_psn, cursor_pkt_);
}

// Transmits what the window allows, from the cursor on. In SQD only retransmissions go out:
// what was started finishes, nothing new starts.
void PacketQp::pump() {
  if ((state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD) || rnr_wait_) return;
  const bool rc = type_ == QpType::kRc;
  retire_local_ops();
  while (cursor_ < sq_.size()) {
    SendEntry& e = sq_[cursor_];
    if (state_ == IBV_QPS_SQD && !e.started) break;
    if (is_local(e.wr.opcode)) {  // nothing to send; retired in order
      e.started = true;
      ++cursor_;
      cursor_pkt_ = 0;
      retire_local_ops();
      continue;
    }
    const bool rd_atomic = is_rd_atomic(e.wr.opcode);
    uint32_t psn = psn_add(e.first_psn, cursor_pkt_);
    if (rc) {
      if (psn_diff(psn, comp_psn_) >= static_cast<int32_t>(max_unacked_psns_)) break;
      if (!e.started) {
        // A fenced WQE waits for every earlier READ/atomic to finish.
        if ((e.wr.send_flags & IBV_SEND_FENCE) && rd_atomic_in_flight_ > 0) break;
        if (rd_atomic) {
          // max_rd_atomic 0 would block READs forever; one at a time is the least.
          if (rd_atomic_in_flight_ >= std::max<uint8_t>(max_rd_atomic_, 1)) break;
          e.holds_rd_atomic = true;
          ++rd_atomic_in_flight_;
        }
      }
    }
    e.started = true;
    transmit(e, cursor_pkt_);
    uint32_t used = rd_atomic ? e.npkts - cursor_pkt_ : 1;  // a READ asks for the rest
    uint32_t end = psn_add(psn, used);
    if (psn_diff(end, sent_end_psn_) > 0) sent_end_psn_ = end;
    cursor_pkt_ += used;
    if (cursor_pkt_ >= e.npkts) {
      ++cursor_;
      cursor_pkt_ = 0;
      // UC and UD have no acknowledgements: a WQE is done once it is on the wire.
      if (!rc) {
        complete_head(IBV_WC_SUCCESS);
        retire_local_ops();
      }
    }
    if (rc && !timer_armed_) restart_retransmit_timer();
  }
}

// In SQD, once nothing started is outstanding: IBV_EVENT_SQ_DRAINED, once.
void PacketQp::check_drained() {
  if (state_ != IBV_QPS_SQD || drained_raised_) return;
  if (!sq_.empty() && sq_.front().started) return;
  drained_raised_ = true;
  env_.raise_event(IBV_EVENT_SQ_DRAINED);
}

// Builds and sends packet k of `e` (for a READ: the request for response packets k..).
void PacketQp::transmit(SendEntry& e, uint32_t k) {
  const SendWqe& w = e.wr;
  const bool rc = type_ == QpType::kRc;
  Packet p;
  p.dest_qp = type_ == QpType::kUd ? (w.remote_qpn & kPsnMask) : dest_qpn_;
  p.psn = psn_add(e.first_psn, k);
  p.xrc_srqn = w.xrc_srqn;  // encoded only in XRC requests (their XRCETH)
  uint64_t offset = uint64_t{k} * mtu_;
  scratch_.clear();
  if (w.opcode == IBV_WR_RDMA_READ) {
    p.opcode = transport_bits() | rw::kReadRequest;
    p.va = w.remote_addr + offset;
    p.rkey = w.rkey;
    p.dma_len = static_cast<uint32_t>(e.length - std::min<uint64_t>(offset, e.length));
    p.ack_req = true;
  } else if (is_atomic(w.opcode)) {
    bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
    p.opcode = transport_bits() | (cas ? rw::kCompareSwap : rw::kFetchAdd);
    p.va = w.remote_addr;
    p.rkey = w.rkey;
    p.swap_add = cas ? w.swap : w.compare_add;
    p.compare = cas ? w.compare_add : 0;
    p.ack_req = true;
  } else if (w.opcode == IBV_WR_ATOMIC_WRITE) {
    p.opcode = transport_bits() | rw::kAtomicWrite;
    p.va = w.remote_addr;
    p.rkey = w.rkey;
    p.dma_len = rw::kAtomicWriteBytes;
    // The 8 bytes go as they lie in the requester's memory (compare_add holds them so).
    scratch_.push_back({reinterpret_cast<uint8_t*>(const_cast<uint64_t*>(&w.compare_add)),
                        rw::kAtomicWriteBytes});
    p.payload_len = rw::kAtomicWriteBytes;
    p.ack_req = true;
  } else if (w.opcode == kWrFlush) {
    p.opcode = transport_bits() | rw::kFlush;
    p.va = w.remote_addr;
    p.rkey = w.rkey;
    p.dma_len = e.length;
    p.flush_type = w.flush_type;
    p.flush_level = w.flush_level;
    p.ack_req = true;
  } else {
    bool first = k == 0, last = k + 1 == e.npkts;
    uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(mtu_, e.length - offset));
    p.opcode = transport_bits() | segment_opcode(w.opcode, k, e.npkts);
    if (is_write(w.opcode) && first) {
      p.va = w.remote_addr;
      p.rkey = w.rkey;
      p.dma_len = e.length;
    }
    if (last && has_imm(w.opcode)) p.imm = w.imm;
    if (last && w.opcode == IBV_WR_SEND_WITH_INV) p.inv_rkey = w.imm;
    if (last && (w.send_flags & IBV_SEND_SOLICITED) &&
        (!is_write(w.opcode) || has_imm(w.opcode)))
      p.solicited = true;
    if (type_ == QpType::kUd) {
      p.qkey = (w.remote_qkey & 0x80000000u) ? qkey_ : w.remote_qkey;
      p.src_qp = qp_num_;
    }
    slice_iovs(w.sg, offset, len, scratch_);
    p.payload_len = len;
    p.ack_req = rc && (last || since_ack_req_ + 1 >= kPacketsPerAckReq);
  }
  since_ack_req_ = p.ack_req ? 0 : since_ack_req_ + 1;
  env_.send_packet(p, scratch_);
}

// Moves the cursor to `psn` (go-back-N, or forward past what a late ACK covered).
void PacketQp::go_back_to(uint32_t psn) {
  int i = find_entry(psn);
  if (i < 0) {
    cursor_ = sq_.size();
    cursor_pkt_ = 0;
    for (size_t j = 0; j < sq_.size(); ++j) {
      if (psn_diff(sq_[j].first_psn, psn) >= 0) {
        cursor_ = j;
        break;
      }
    }
    return;
  }
  cursor_ = static_cast<size_t>(i);
  cursor_pkt_ = is_single_packet(sq_[cursor_].wr.opcode)
                    ? 0
                    : static_cast<uint32_t>(psn_diff(psn, sq_[cursor_].first_psn));
}

int PacketQp::find_entry(uint32_t psn) const {
  for (size_t i = 0; i < sq_.size(); ++i) {
    const SendEntry& e = sq_[i];
    if (psn_diff(psn, e.first_psn) < 0) return -1;
    if (psn_diff(psn, e.last_psn()) <= 0) return static_cast<int>(i);
  }
  return -1;
}

// Retires the oldest WQE with `status` (completions leave in posting order).
void PacketQp::complete_head(ibv_wc_status status) {
  SendEntry& h = sq_.front();
  if (h.holds_rd_atomic && rd_atomic_in_flight_ > 0) --rd_atomic_in_flight_;
  complete_send(h, status);
  sq_.pop_front();
  if (cursor_ > 0) {
    --cursor_;
  } else {
    cursor_pkt_ = 0;
  }
}

// Unsignaled WQEs retire silently unless they failed (IBA 10.7.3.1).
void PacketQp::complete_send(const SendEntry& e, ibv_wc_status status) {
  if (status == IBV_WC_SUCCESS && !sq_sig_all_ && !(e.wr.send_flags & IBV_SEND_SIGNALED))
    return;
  Completion wc;
  wc.wr_id = e.wr.wr_id;
  wc.tm = e.wr.tm;
  wc.status = status;
  wc.opcode = wc_opcode(e.wr.opcode);
  wc.byte_len = e.length;
  wc.qp_num = qp_num_;
  env_.push_completion(WorkQueue::kSend, wc);
}

}  // namespace softverbs::engine::packet
