// `softverbs trace` of same-host traffic: each work request the requester ran through shared
// memory (or within the process) is written to the trace as the RoCE v2 packets a NIC would
// have exchanged for it: the request cut at the path MTU (FIRST/MIDDLE/LAST or ONLY, RETH,
// ImmDt, IETH, DETH, XRCETH as the opcode carries them), then what the responder answered
// (ACK, READ responses, ATOMIC ACK, RNR NAK, NAK), with PSNs counted from the QP's sq_psn,
// the responder's MSN, the QPs' GIDs as IP addresses and a valid ICRC. Only the process that
// posts writes them (a same-host responder runs no code for a WRITE/READ/atomic that lands
// in its memory), both directions. Frames are whole: a packet is at most one MTU. IBA 1.5's
// FLUSH and ATOMIC WRITE are one request each, answered by an empty RDMA READ response.
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "core/core.hpp"
#include "core/device.hpp"
#include "core/errors.hpp"
#include "common/verbs_ext.hpp"
#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/port.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/pcap.hpp"

namespace softverbs::engine {

namespace rw = wire::roce;

namespace {

constexpr uint32_t kPsnMask = 0xffffff;
// AETH credit field "invalid": no end-to-end credits are advertised (IBA 9.7.7.2).
constexpr uint8_t kNoCredits = 0x1f;

// What a QP's packets need from its attributes, read under attr_mu.
struct TracePath {
  uint32_t mtu = 1024;
  ibv_gid sgid{};
  ibv_gid dgid{};
  uint32_t dest_qpn = 0;
  uint32_t sq_psn = 0;
};

TracePath trace_path(Qp* qp, const SendWqe& w) {
  TracePath p;
  std::lock_guard<std::mutex> lock(qp->attr_mu);
  if (qp->attr.path_mtu >= IBV_MTU_256 && qp->attr.path_mtu <= IBV_MTU_4096)
    p.mtu = 128u << qp->attr.path_mtu;
  p.sq_psn = qp->attr.sq_psn & kPsnMask;
  p.dest_qpn = qp->attr.dest_qp_num;
  const auto& gids = Device::instance().gids();
  unsigned index = qp->attr.ah_attr.grh.sgid_index;
  if (!gids.empty()) p.sgid = gids[index < gids.size() ? index : 0].gid;
  p.dgid = qp->attr.ah_attr.is_global ? qp->attr.ah_attr.grh.dgid : p.sgid;
  if (qp->type == IBV_QPT_UD) {
    p.mtu = 4096;
    p.sgid = w.sgid;
    p.dgid = w.dgid;
    p.dest_qpn = w.remote_qpn;
  }
  return p;
}

// A UDP source port per QP, as a NIC spreads flows (rxe hashes the QPN into 0xC000..).
uint16_t flow_port(uint32_t qpn) { return static_cast<uint16_t>(0xc000 | (qpn & 0x3fff)); }

// The message's bytes [at, at + len) from its local buffers (inline copy or SGEs through
// their keys) into out; fewer when a key no longer resolves.
void copy_message(Qp* qp, const SendWqe& w, uint64_t at, uint32_t len, uint8_t* out) {
  if (!w.inline_data.empty()) {
    if (at < w.inline_data.size())
      std::memcpy(out, w.inline_data.data() + at,
                  std::min<uint64_t>(len, w.inline_data.size() - at));
    return;
  }
  std::shared_lock keys(MrTable::instance().lock());
  uint64_t pos = 0;
  for (const Sge& s : w.sges) {
    if (len == 0) break;
    uint64_t end = pos + s.length;
    if (s.length && at < end) {
      iovec v{};
      if (!resolve_sge(qp->pd, s.lkey, s.addr, s.length, 0, &v)) return;
      uint64_t from = at - pos;
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len, s.length - from));
      std::memcpy(out, static_cast<const uint8_t*>(v.iov_base) + from, n);
      out += n;
      at += n;
      len -= n;
    }
    pos = end;
  }
}

uint8_t transport_of(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_UC: return rw::kUc;
    case IBV_QPT_UD: return rw::kUd;
    case IBV_QPT_XRC_SEND: return rw::kXrc;
    default: return rw::kRc;
  }
}

// The NAK code a responder sends for the requester status it causes (IBA 9.7.5.2.8).
int nak_code(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_REM_ACCESS_ERR: return rw::kNakRemoteAccessError;
    case IBV_WC_REM_INV_REQ_ERR: return rw::kNakInvalidRequest;
    case IBV_WC_REM_OP_ERR: return rw::kNakRemoteOperationalError;
    default: return -1;  // a local error: nothing went on the wire
  }
}

class Emitter {
 public:
  Emitter(rw::PcapWriter* out, const TracePath& p, uint32_t src_qpn)
      : out_(out),
        request_(rw::IcrcContext::from_gids(p.sgid.raw, p.dgid.raw, flow_port(src_qpn))),
        response_(rw::IcrcContext::from_gids(p.dgid.raw, p.sgid.raw, flow_port(p.dest_qpn))) {}

  void request(const rw::Packet& p) { emit(request_, p); }
  void response(const rw::Packet& p) { emit(response_, p); }

 private:
  void emit(const rw::IcrcContext& ctx, const rw::Packet& p) {
    size_t n = rw::encode(p, buf_, sizeof buf_);
    if (!n) return;
    rw::icrc_fill(ctx, buf_, n);
    out_->write(ctx, buf_, n);
  }
  rw::PcapWriter* out_;
  rw::IcrcContext request_, response_;
  uint8_t buf_[4096 + 128];
};

// The Op of packet `i` of `count` of a SEND or WRITE message.
uint8_t segment_op(bool send, size_t i, size_t count, bool imm, bool inv) {
  if (count == 1) {
    if (send) return inv ? rw::kSendOnlyInv : imm ? rw::kSendOnlyImm : rw::kSendOnly;
    return imm ? rw::kWriteOnlyImm : rw::kWriteOnly;
  }
  if (i == 0) return send ? rw::kSendFirst : rw::kWriteFirst;
  if (i + 1 < count) return send ? rw::kSendMiddle : rw::kWriteMiddle;
  if (send) return inv ? rw::kSendLastInv : imm ? rw::kSendLastImm : rw::kSendLast;
  return imm ? rw::kWriteLastImm : rw::kWriteLast;
}

}  // namespace

void trace_exchange(Qp* qp, const SendWqe& w, const Outcome& o, bool resend) {
  // SOFTVERBS_TRACE_SAME_HOST=0: the file holds only what crossed the wire.
  static const bool same_host = [] {
    const char* v = std::getenv("SOFTVERBS_TRACE_SAME_HOST");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  if (!same_host) return;
  rw::PcapWriter* out = trace_writer();
  if (!out) return;
  // Each exchange reaches the file when it is written: a process may end with _exit.
  struct Flush {
    rw::PcapWriter* w;
    ~Flush() { w->flush(); }
  } flush{out};
  const ibv_wr_opcode op = w.opcode;
  const bool send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV;
  const bool write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  const bool read = op == IBV_WR_RDMA_READ;
  const bool atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
  // IBA 1.5's: one request packet each, answered (as rxe does) by an empty READ response.
  const bool atomic_write = op == IBV_WR_ATOMIC_WRITE;
  const bool flush_op = op == kWrFlush;
  if (!send && !write && !read && !atomic && !atomic_write && !flush_op)
    return;  // local operations send nothing
  if (qp->type == IBV_QPT_UD && !send) return;
  // A group of the other IP version than the source: no packet could carry it.
  if (qp->type == IBV_QPT_UD && rw::IpAddress::from_gid(w.sgid.raw).is_v4() !=
                                    rw::IpAddress::from_gid(w.dgid.raw).is_v4())
    return;
  if (o.kind == Outcome::Error && nak_code(o.status) < 0) return;  // failed before sending

  const TracePath path = trace_path(qp, w);
  QpDebug& d = qp->debug;
  if (!d.psn_known) {
    d.psn = d.psn_base = path.sq_psn;
    d.msn = 0;
    d.psn_known = true;
  }
  const uint64_t len = w.total_length;
  const size_t packets = atomic || atomic_write || flush_op
                             ? 1 : std::max<uint64_t>(1, (len + path.mtu - 1) / path.mtu);
  // A resent request (a duplicate) carries the PSNs of the one before it; others start at
  // the next PSN, which advances only when the responder took the request.
  const uint32_t first_psn = resend ? (d.psn - d.last_psns) & kPsnMask : d.psn;
  const uint8_t transport = transport_of(qp->type);
  const bool reliable = transport == rw::kRc || transport == rw::kXrc;
  Emitter emit(out, path, qp->qpn());
  uint8_t payload[4096];  // one packet's (never thread_local: a dlopen'ed library has little static TLS)

  rw::Packet p;
  p.dest_qp = path.dest_qpn;
  p.xrc_srqn = w.xrc_srqn;
  if (qp->type == IBV_QPT_UD) {
    p.qkey = (w.remote_qkey & 0x80000000u) ? qp->send_path.qkey : w.remote_qkey;
    p.src_qp = qp->source_qpn ? qp->source_qpn : qp->qpn();
  }
  uint32_t psn = first_psn;
  if (send || write) {
    const bool imm = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    const bool inv = op == IBV_WR_SEND_WITH_INV;
    for (size_t i = 0; i < packets; ++i, psn = (psn + 1) & kPsnMask) {
      const bool last = i + 1 == packets;
      p.opcode = transport | segment_op(send, i, packets, imm, inv);
      p.psn = psn;
      p.ack_req = reliable && last;
      p.solicited = last && (w.flags & IBV_SEND_SOLICITED);
      p.va = w.remote_addr;
      p.rkey = w.rkey;
      p.dma_len = static_cast<uint32_t>(len);
      p.imm = w.imm;
      p.inv_rkey = w.imm;  // SEND_WITH_INV: the R_Key, in host order as posted
      p.payload_len = static_cast<uint32_t>(std::min<uint64_t>(path.mtu, len - i * path.mtu));
      copy_message(qp, w, i * path.mtu, p.payload_len, payload);
      p.payload = payload;
      emit.request(p);
    }
  } else if (atomic_write || flush_op) {
    p.opcode = transport | (flush_op ? rw::kFlush : rw::kAtomicWrite);
    p.psn = psn;
    p.ack_req = true;
    p.va = w.remote_addr;
    p.rkey = w.rkey;
    if (flush_op) {
      p.dma_len = static_cast<uint32_t>(len);  // the WQE: compare_add the type, swap the level
      p.flush_type = static_cast<uint8_t>(w.compare_add);
      p.flush_level = static_cast<uint8_t>(w.swap);
    } else {  // the 8 bytes as they lie in the requester's memory (compare_add holds them)
      p.dma_len = rw::kAtomicWriteBytes;
      std::memcpy(payload, &w.compare_add, rw::kAtomicWriteBytes);
      p.payload = payload;
      p.payload_len = rw::kAtomicWriteBytes;
    }
    emit.request(p);
    psn = (psn + 1) & kPsnMask;
  } else {
    p.opcode = transport | (read ? rw::kReadRequest
                                 : op == IBV_WR_ATOMIC_CMP_AND_SWP ? rw::kCompareSwap : rw::kFetchAdd);
    p.psn = psn;
    p.ack_req = true;
    p.va = w.remote_addr;
    p.rkey = w.rkey;
    p.dma_len = static_cast<uint32_t>(read ? len : 8);
    p.swap_add = atomic && op == IBV_WR_ATOMIC_CMP_AND_SWP ? w.swap : w.compare_add;
    p.compare = w.compare_add;
    emit.request(p);
    psn = (psn + (read ? packets : 1)) & kPsnMask;
  }
  const uint32_t used = (psn - first_psn) & kPsnMask;
  if (!resend && (o.kind == Outcome::Ack || o.kind == Outcome::Error)) {
    d.psn = psn;
    d.last_psns = used;
  }
  if (!reliable || o.kind == Outcome::NoResponse) return;  // UC/UD: nothing comes back

  rw::Packet r;
  r.dest_qp = qp->qpn();
  const uint32_t last_psn = (psn - 1) & kPsnMask;
  if (o.kind == Outcome::RnrNak || o.kind == Outcome::Error) {
    r.opcode = transport | rw::kAck;
    r.psn = first_psn;
    r.msn = d.msn & kPsnMask;
    r.syndrome = o.kind == Outcome::RnrNak ? uint8_t(rw::kAethRnrNak | (o.rnr_timer & 0x1f))
                                           : uint8_t(rw::kAethNak | nak_code(o.status));
    emit.response(r);
    return;
  }
  if (!resend) ++d.msn;
  r.msn = d.msn & kPsnMask;
  r.syndrome = rw::kAethAck | kNoCredits;
  if (send || write) {
    r.opcode = transport | rw::kAck;
    r.psn = last_psn;
    emit.response(r);
  } else if (atomic_write || flush_op) {
    r.opcode = transport | rw::kReadResponseOnly;
    r.psn = first_psn;
    emit.response(r);
  } else if (atomic) {
    r.opcode = transport | rw::kAtomicAck;
    r.psn = first_psn;
    uint8_t orig[8] = {};
    copy_message(qp, w, 0, 8, orig);
    std::memcpy(&r.orig, orig, 8);
    emit.response(r);
  } else {
    for (size_t i = 0; i < packets; ++i) {
      r.opcode = transport | (packets == 1 ? rw::kReadResponseOnly
                              : i == 0 ? rw::kReadResponseFirst
                              : i + 1 < packets ? rw::kReadResponseMiddle
                                                : rw::kReadResponseLast);
      r.psn = (first_psn + i) & kPsnMask;
      r.payload_len = static_cast<uint32_t>(std::min<uint64_t>(path.mtu, len - i * path.mtu));
      if (len == 0) r.payload_len = 0;
      copy_message(qp, w, i * path.mtu, r.payload_len, payload);
      r.payload = payload;
      emit.response(r);
    }
  }
}

}  // namespace softverbs::engine
