// The connection-management messages two processes exchange, one per SOCK_SEQPACKET packet,
// on the socket pair a connection attempt creates (see docs/decisions/0004). They carry
// what IB CM's REQ/REP/RTU/REJ/DREQ/DREP and SIDR REQ/REP carry for RoCE: QPN, PSN, GID,
// RDMA read resources, retry counts and private data. Everything received is checked
// before use: the peer may be any process of the same user.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>

#include "wire/roce/cm_msg.hpp"

namespace softverbs::cm {

inline constexpr uint32_t kMsgMagic = 0x5356434d;  // "SVCM"
inline constexpr uint16_t kMsgVersion = 1;

enum class MsgType : uint16_t {
  Req = 1,
  Rep,
  Rtu,
  Rej,
  Dreq,
  Drep,
  SidrReq,
  SidrRep,
};

// Private data sizes as the application sees them over RoCE (IB CM's fixed field sizes
// minus the 36-byte rdma_cm header where rdma_cm adds one): what a sender may pass, and
// what the receiver's event reports (zero-padded).
namespace wr = wire::roce;
inline constexpr uint8_t kReqPrivate = wr::kReqPrivateBytes - wr::kCmaHeaderBytes;  // 56
inline constexpr uint8_t kRepPrivate = wr::kRepPrivateBytes;                        // 196
inline constexpr uint8_t kRejPrivate = wr::kRejPrivateBytes;                        // 148
inline constexpr uint8_t kSidrReqPrivate = wr::kSidrReqPrivateBytes - wr::kCmaHeaderBytes;  // 180
inline constexpr uint8_t kSidrRepPrivate = wr::kSidrRepPrivateBytes;                // 136
inline constexpr size_t kMaxPrivate = wr::kRtuPrivateBytes;                         // 224, the largest

inline uint8_t private_size(MsgType t) {
  switch (t) {
    case MsgType::Req: return kReqPrivate;
    case MsgType::Rep: return kRepPrivate;
    case MsgType::Rej: return kRejPrivate;
    case MsgType::SidrReq: return kSidrReqPrivate;
    case MsgType::SidrRep: return kSidrRepPrivate;
    default: return 0;
  }
}

// IB CM reject reasons rdma_cm reports as REJECTED's status.
inline constexpr int kRejInvalidServiceId = 8;   // nobody listens there
inline constexpr int kRejConsumerDefined = 28;   // rdma_reject
inline constexpr int kRejTimeout = 1;             // the requester went away
inline constexpr int kRejVendorOptionNotSupported = 35;  // rdma_reject_ece
// SIDR REP status (UNREACHABLE's status when not 0).
inline constexpr uint32_t kSidrReject = 1;       // rdma_reject
inline constexpr uint32_t kSidrUnsupported = 2;  // nobody listens there

// The PSNs a connected QP starts from. The starting PSN a REQ or a REP carries is the one
// its sender's receive queue expects, i.e. where the peer's send queue starts: the kernel's
// CM (cm.c) sets the active side's rq_psn and the passive side's sq_psn from the REQ's, the
// other two from the REP's, and rxe's first packets carry them (roce_cm_frames_test). So a
// side's own number is its rq_psn and the peer's its sq_psn (UD: no peer, it sends from its own).
struct StartingPsns {
  uint32_t rq_psn;
  uint32_t sq_psn;
};
constexpr StartingPsns starting_psns(uint32_t own, uint32_t peers) { return {own, peers}; }

struct Msg {
  uint32_t magic;
  uint16_t version;
  MsgType type;
  uint32_t qpn;          // REQ/REP/SIDR REP: the sender's QP number (24 bits)
  uint32_t psn;          // REQ/REP: the sender's starting receive PSN (24 bits; starting_psns)
  uint32_t qkey;         // SIDR REP
  uint32_t status;       // REJ: reason; SIDR REP: 0 or kSidrRejected
  uint8_t gid[16];       // the sender's GID (its source address on the soft device)
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t flow_control;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t srq;
  uint8_t qp_type;       // REQ: ibv_qp_type of the sender's QP
  uint8_t private_len;   // bytes of private_data the sender gave
  uint32_t ece_vendor;   // REQ/REP: the sender's ECE (rdma_set_local_ece)
  uint32_t ece_options;
  sockaddr_storage src;  // REQ: the requester's address; the listener's answer mirrors it
  sockaddr_storage dst;  // REQ: the address the requester asked for
  uint8_t private_data[kMaxPrivate];
};

inline Msg make_msg(MsgType type) {
  Msg m;
  std::memset(&m, 0, sizeof(m));
  m.magic = kMsgMagic;
  m.version = kMsgVersion;
  m.type = type;
  return m;
}

// A packet is a message only if it is exactly one, of a known type, with sane fields.
inline bool valid_msg(const Msg& m, size_t bytes) {
  if (bytes != sizeof(Msg) || m.magic != kMsgMagic || m.version != kMsgVersion) return false;
  auto t = static_cast<uint16_t>(m.type);
  if (t < static_cast<uint16_t>(MsgType::Req) || t > static_cast<uint16_t>(MsgType::SidrRep))
    return false;
  if (m.private_len > private_size(m.type)) return false;
  if ((m.qpn >> 24) != 0 || (m.psn >> 24) != 0) return false;
  auto family_ok = [](const sockaddr_storage& a) {
    return a.ss_family == AF_INET || a.ss_family == AF_INET6 || a.ss_family == AF_UNSPEC;
  };
  return family_ok(m.src) && family_ok(m.dst);
}

}  // namespace softverbs::cm
