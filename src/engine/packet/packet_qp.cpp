// PacketQp's shared pieces: attributes (ibv_modify_qp), the packet dispatch between the
// completer and the responder, the error state, iovec helpers and IBA's timer tables.
#include "engine/packet/packet_qp.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softverbs::engine::packet {

namespace rw = wire::roce;

uint32_t rnr_timer_usec(uint8_t code) {
  // IBA Vol. 1, table "RNR NAK timer field encoding", in microseconds.
  static constexpr uint32_t kUsec[32] = {
      655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
      480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kUsec[code & 0x1f];
}

uint64_t ack_timeout_ns(uint8_t timeout) {
  return timeout == 0 ? 0 : uint64_t{4096} << std::min<uint8_t>(timeout, 31);
}

uint64_t iov_total(const std::vector<Iov>& sg) {
  uint64_t n = 0;
  for (const Iov& v : sg) n += v.len;
  return n;
}

namespace {

// Calls fn(addr, n) for the pieces of `sg` that hold [offset, offset + len), in order;
// returns how many of the len bytes `sg` does not reach.
template <class Fn>
uint32_t for_each_piece(const std::vector<Iov>& sg, uint64_t offset, uint32_t len, Fn fn) {
  for (const Iov& v : sg) {
    if (len == 0) break;
    if (offset >= v.len) {
      offset -= v.len;
      continue;
    }
    uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(v.len - offset, len));
    fn(v.addr + offset, take);
    len -= take;
    offset = 0;
  }
  return len;
}

}  // namespace

bool slice_iovs(const std::vector<Iov>& sg, uint64_t offset, uint32_t len,
                std::vector<Iov>& out) {
  out.clear();
  return for_each_piece(sg, offset, len,
                        [&](uint8_t* p, uint32_t n) { out.push_back({p, n}); }) == 0;
}

bool scatter(const std::vector<Iov>& sg, uint64_t offset, const uint8_t* src, uint32_t len) {
  if (offset + len > iov_total(sg)) return false;
  for_each_piece(sg, offset, len, [&](uint8_t* p, uint32_t n) {
    std::memcpy(p, src, n);
    src += n;
  });
  return true;
}

PacketQp::PacketQp(Env& env, QpType type, uint32_t qp_num, bool sq_sig_all)
    : env_(env), type_(type), qp_num_(qp_num & kPsnMask), sq_sig_all_(sq_sig_all) {}

uint8_t PacketQp::transport_bits() const {
  if (xrc_ != XrcRole::kNone) return rw::kXrc;
  switch (type_) {
    case QpType::kRc: return rw::kRc;
    case QpType::kUc: return rw::kUc;
    case QpType::kUd: return rw::kUd;
  }
  return rw::kRc;
}

int PacketQp::modify(const ibv_qp_attr& a, int mask) {
  if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096))
    return EINVAL;
  if (((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) ||
      ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) ||
      ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) ||
      ((mask & IBV_QP_TIMEOUT) && a.timeout > 31))
    return EINVAL;
  if (mask & IBV_QP_PATH_MTU) mtu_ = 128u << a.path_mtu;
  if (mask & IBV_QP_DEST_QPN) dest_qpn_ = a.dest_qp_num & kPsnMask;
  if (mask & IBV_QP_QKEY) qkey_ = a.qkey;
  if (mask & IBV_QP_TIMEOUT) timeout_ = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) retry_cnt_ = retry_left_ = a.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) rnr_retry_ = rnr_left_ = a.rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) min_rnr_timer_ = a.min_rnr_timer;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) max_rd_atomic_ = a.max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) max_dest_rd_atomic_ = a.max_dest_rd_atomic;
  if (mask & IBV_QP_SQ_PSN) next_psn_ = comp_psn_ = sent_end_psn_ = a.sq_psn & kPsnMask;
  if (mask & IBV_QP_RQ_PSN) epsn_ = a.rq_psn & kPsnMask;
  if (!(mask & IBV_QP_STATE)) return 0;

  ibv_qp_state old = state_;
  state_ = a.qp_state;
  switch (state_) {
    case IBV_QPS_RESET:
      reset_state();
      break;
    case IBV_QPS_ERR:
      if (old != IBV_QPS_ERR) {
        state_ = old;  // enter_error does the move and the flush
        enter_error();
      }
      break;
    case IBV_QPS_RTR:
      comm_est_raised_ = false;
      atomic_replies_.assign(std::max<uint8_t>(max_dest_rd_atomic_, 1), AtomicReply{});
      atomic_next_ = 0;
      break;
    case IBV_QPS_RTS:
      pump();  // SQD -> RTS resumes
      break;
    case IBV_QPS_SQD:
      drained_raised_ = false;
      check_drained();
      break;
    default:
      break;
  }
  return 0;
}

void PacketQp::reset_state() {
  if (timer_armed_) env_.cancel_timer();
  timer_armed_ = false;
  sq_.clear();
  cursor_ = cursor_pkt_ = 0;
  since_ack_req_ = rd_atomic_in_flight_ = 0;
  retry_started_ = rnr_wait_ = false;
  retry_left_ = retry_cnt_;
  rnr_left_ = rnr_retry_;
  msn_ = 0;
  sent_psn_nak_ = comm_est_raised_ = false;
  in_msg_ = InMessage::kNone;
  away_active_ = xrc_away_ = false;
  away_msg_.clear();
  recv_.reset();  // the owner empties its receive queue on RESET itself
  recv_offset_ = write_len_ = write_offset_ = 0;
  write_base_ = nullptr;
  atomic_replies_.clear();
  atomic_next_ = 0;
}

// The QP moves to ERR: every outstanding send WQE and every receive WQE completes with
// IBV_WC_WR_FLUSH_ERR (error completions are pushed even for unsignaled WQEs).
void PacketQp::enter_error() {
  if (state_ == IBV_QPS_ERR) return;
  state_ = IBV_QPS_ERR;
  if (timer_armed_) env_.cancel_timer();
  timer_armed_ = false;
  rnr_wait_ = false;
  while (!sq_.empty()) complete_head(IBV_WC_WR_FLUSH_ERR);
  cursor_ = cursor_pkt_ = 0;
  rd_atomic_in_flight_ = 0;
  flush_receives();
}

void PacketQp::flush_receives() {
  in_msg_ = InMessage::kNone;
  away_active_ = false;
  if (!recv_) recv_ = env_.take_receive({});
  while (recv_) {
    Completion wc;
    wc.wr_id = recv_->wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp_num_;
    env_.push_completion(WorkQueue::kRecv, wc);
    recv_ = env_.take_receive({});
  }
}

bool PacketQp::is_response(uint8_t op) const {
  return op >= rw::kReadResponseFirst && op <= rw::kAtomicAck;
}

void PacketQp::on_packet(const Packet& pkt, const uint8_t* grh) {
  if ((pkt.opcode & 0xe0) != transport_bits()) return;  // another transport: drop
  // A multicast datagram names no QP: the caller hands it to each one attached to its group.
  if (pkt.dest_qp != qp_num_ && !(type_ == QpType::kUd && pkt.dest_qp == kMulticastQpn)) return;
  uint8_t op = pkt.opcode & 0x1f;
  if (is_response(op)) {
    if (type_ == QpType::kRc && xrc_ != XrcRole::kTgt) on_response(pkt);
    return;
  }
  if (xrc_ == XrcRole::kIni) return;  // an INI QP has no responder
  on_request(pkt, grh);
}

size_t PacketQp::send_entry_size() { return sizeof(SendEntry); }

}  // namespace softverbs::engine::packet
