// The IB CM's messages (IBA vol. 1 ch. 12, tables 106-120) in the data part of a CM MAD
// (mad.hpp), and what rdma_cm adds on top: the service IDs of its port spaces and the header
// it puts at the start of a REQ's or SIDR_REQ's private data.
//
// Where the facts come from: the bit positions are the kernel's tables of IBA's
// (include/rdma/ibta_vol1_c12.h: a field is `bits` wide from bit `bit` of byte `byte`, bit 0
// the most significant, big-endian across bytes), the attribute IDs, private data sizes and
// REJ reasons include/rdma/ib_cm.h, the rdma_cm header and service IDs
// drivers/infiniband/core/cma.c and rdma-core's <rdma/rdma_cma.h>; frames captured from
// Linux 6.1 rxe check all of it (tests/unit/roce_cm_frames_test.cpp, docs/roce-cm.md).
//
// Everything decoded comes from the network: decode_cm checks the MAD's length and header
// and every field whose value would make the rest meaningless (lengths, reserved codes);
// values a CM must answer with a REJ (an unsupported MTU, a service ID nobody listens on)
// decode as they are and are the CM's to judge.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <variant>

#include "wire/roce/mad.hpp"

namespace softverbs::wire::roce {

// Attribute IDs of the CM class (ib_cm.h CM_*_ATTR_ID; ClassPortInfo is every class's 0x0001).
enum class CmAttr : uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001a,
};

// Private data bytes per message: what is left of the 232-byte MAD data after the fields.
inline constexpr size_t kReqPrivateBytes = 92;
inline constexpr size_t kMraPrivateBytes = 222;
inline constexpr size_t kRejPrivateBytes = 148;
inline constexpr size_t kRepPrivateBytes = 196;
inline constexpr size_t kRtuPrivateBytes = 224;
inline constexpr size_t kDreqPrivateBytes = 220;
inline constexpr size_t kDrepPrivateBytes = 224;
inline constexpr size_t kSidrReqPrivateBytes = 216;
inline constexpr size_t kSidrRepPrivateBytes = 136;
inline constexpr size_t kRejAriBytes = 72;       // REJ's additional rejection information
inline constexpr size_t kSidrRepInfoBytes = 72;  // SIDR_REP's additional information

using Gid = std::array<uint8_t, 16>;

// REQ transport service type (with extended transport type 1 for XRC, as the kernel).
enum CmTransport : uint8_t { kCmRc = 0, kCmUc = 1, kCmRd = 2, kCmExtended = 3 };
// Which message an MRA or REJ answers (MRA's "message MRAed", REJ's "message rejected").
enum CmMsgResponse : uint8_t { kCmRespReq = 0, kCmRespRep = 1, kCmRespOther = 2 };

// REJ reasons (IBA ch. 12; ib_cm.h enum ib_cm_rej_reason).
enum CmRejReason : uint16_t {
  kRejNoQp = 1,
  kRejNoEec = 2,
  kRejNoResources = 3,
  kRejTimeout = 4,
  kRejUnsupported = 5,
  kRejInvalidCommId = 6,
  kRejInvalidCommInstance = 7,
  kRejInvalidServiceId = 8,  // no listener: what Linux answers a REQ to a port nobody listens on
  kRejInvalidTransportType = 9,
  kRejStaleConn = 10,
  kRejRdcNotExist = 11,
  kRejInvalidGid = 12,
  kRejInvalidLid = 13,
  kRejInvalidSl = 14,
  kRejInvalidTrafficClass = 15,
  kRejInvalidHopLimit = 16,
  kRejInvalidPacketRate = 17,
  kRejInvalidAltGid = 18,
  kRejInvalidAltLid = 19,
  kRejInvalidAltSl = 20,
  kRejInvalidAltTrafficClass = 21,
  kRejInvalidAltHopLimit = 22,
  kRejInvalidAltPacketRate = 23,
  kRejPortCmRedirect = 24,
  kRejPortRedirect = 25,
  kRejInvalidMtu = 26,
  kRejInsufficientRespResources = 27,
  kRejConsumerDefined = 28,  // rdma_reject, or the listener's rdma_cm refusing the request
  kRejInvalidRnrRetry = 29,
  kRejDuplicateLocalCommId = 30,
  kRejInvalidClassVersion = 31,
  kRejInvalidFlowLabel = 32,
  kRejInvalidAltFlowLabel = 33,
  kRejVendorOptionNotSupported = 35,  // ECE: rdma_reject_ece
};

// SIDR_REP status (IBA ch. 12; ib_cm.h enum ib_cm_sidr_status).
enum CmSidrStatus : uint8_t {
  kSidrSuccess = 0,
  kSidrUnsupported = 1,  // no listener for the service ID
  kSidrReject = 2,
  kSidrNoQp = 3,
  kSidrRedirect = 4,
  kSidrUnsupportedVersion = 5,
};

// A REQ's primary or alternate path. Over RoCE v2 (as the kernel fills it): both LIDs are
// 0xffff (the permissive LID), the GIDs are the RoCE v2 GIDs (::ffff:a.b.c.d for IPv4),
// traffic class, hop limit and flow label are the IP header's, subnet_local is set only
// when hop_limit <= 1, and the packet rate is the IB rate enum (rxe sends 0).
struct CmPath {
  uint16_t local_lid = 0;
  uint16_t remote_lid = 0;
  Gid local_gid{};
  Gid remote_gid{};
  uint32_t flow_label = 0;  // 20 bits
  uint8_t packet_rate = 0;  // 6 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;           // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  // 5 bits: 4.096 us * 2^value
  bool operator==(const CmPath&) const = default;
};

// REQ (table 106).
struct CmReq {
  uint32_t local_comm_id = 0;
  uint32_t vendor_id = 0;  // 24 bits: ECE's vendor ID (rdma_set_local_ece)
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;   // 24 bits
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;  // 24 bits
  uint8_t remote_cm_response_timeout = 0;  // 5 bits: 4.096 us * 2^value
  uint8_t transport_service_type = kCmRc;  // 2 bits, CmTransport
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;  // 24 bits
  uint8_t local_cm_response_timeout = 0;  // 5 bits
  uint8_t retry_count = 0;    // 3 bits
  uint16_t pkey = kDefaultPkey;
  uint8_t path_mtu = 0;       // 4 bits: 1 = 256 ... 5 = 4096, as enum ibv_mtu
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;  // 3 bits
  uint8_t max_cm_retries = 0;   // 4 bits
  bool srq = false;
  uint8_t extended_transport_type = 0;  // 3 bits: 1 = XRC
  CmPath primary;
  CmPath alternate;  // all zero when there is none (always over RoCE)
  bool sap_supported = false;
  std::array<uint8_t, kReqPrivateBytes> private_data{};
  bool operator==(const CmReq&) const = default;
};

// MRA (table 107): "give me service_timeout longer before you resend".
struct CmMra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_mraed = kCmRespReq;  // 2 bits, CmMsgResponse
  uint8_t service_timeout = 0;         // 5 bits: 4.096 us * 2^value
  std::array<uint8_t, kMraPrivateBytes> private_data{};
  bool operator==(const CmMra&) const = default;
};

// REJ (table 108).
struct CmRej {
  uint32_t local_comm_id = 0;   // 0 when the rejecter never had an id (no listener)
  uint32_t remote_comm_id = 0;
  uint8_t message_rejected = kCmRespReq;  // 2 bits, CmMsgResponse
  uint8_t ari_length = 0;                 // 7 bits, at most kRejAriBytes
  uint16_t reason = 0;                    // CmRejReason
  std::array<uint8_t, kRejAriBytes> ari{};
  std::array<uint8_t, kRejPrivateBytes> private_data{};
  bool operator==(const CmRej&) const = default;
};

// REP (table 110).
struct CmRep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint32_t local_eecn = 0; // 24 bits
  uint32_t starting_psn = 0;  // 24 bits
  uint32_t vendor_id = 0;  // 24 bits, ECE, spread over three reserved bytes (15, 19, 23)
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;  // 5 bits
  uint8_t failover_accepted = 0;  // 2 bits
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;    // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateBytes> private_data{};
  bool operator==(const CmRep&) const = default;
};

// RTU (table 111).
struct CmRtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateBytes> private_data{};
  bool operator==(const CmRtu&) const = default;
};

// DREQ (table 112).
struct CmDreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24 bits: the receiver's QPN (or EECN)
  std::array<uint8_t, kDreqPrivateBytes> private_data{};
  bool operator==(const CmDreq&) const = default;
};

// DREP (table 113).
struct CmDrep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateBytes> private_data{};
  bool operator==(const CmDrep&) const = default;
};

// SIDR_REQ (table 119): which UD QP serves this service ID?
struct CmSidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = kDefaultPkey;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateBytes> private_data{};
  bool operator==(const CmSidrReq&) const = default;
};

// SIDR_REP (table 120).
struct CmSidrRep {
  uint32_t request_id = 0;
  uint8_t status = kSidrSuccess;  // CmSidrStatus
  uint8_t info_length = 0;        // at most kSidrRepInfoBytes
  uint32_t vendor_id = 0;         // 24 bits, ECE (bytes 6-7 and 11)
  uint32_t qpn = 0;               // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, kSidrRepInfoBytes> info{};
  std::array<uint8_t, kSidrRepPrivateBytes> private_data{};
  bool operator==(const CmSidrRep&) const = default;
};

using CmBody = std::variant<CmReq, CmMra, CmRej, CmRep, CmRtu, CmDreq, CmDrep, CmSidrReq,
                            CmSidrRep>;

// One CM MAD, decoded. The header's attr_id always matches the body.
struct CmMad {
  MadHeader hdr;
  CmBody body;
  bool operator==(const CmMad&) const = default;
};

// The attribute ID of a body.
CmAttr cm_attr(const CmBody& body);
const char* cm_attr_name(uint16_t attr_id);  // "REQ", ..., "?" for an unknown one

enum class CmError : uint8_t {
  kOk = 0,
  kBadLength,        // not exactly one 256-byte MAD
  kBadBaseVersion,   // not 1
  kNotCm,            // another management class (not the CM's to read)
  kBadClassVersion,  // not 2 (a REQ may deserve REJ 31, invalid class version)
  kBadMethod,        // a CM message not sent with Send, or a response bit on a request
  kUnknownAttribute, // no CM attribute has this ID
  kUnsupported,      // LAP, APR, ClassPortInfo: known, not implemented (no APM over RoCE);
                     // *out's header is filled so the caller can answer (mad_wants_answer)
  kBadField,         // a length or a reserved code out of range (decode_cm names it)
};
const char* cm_error_name(CmError e);

// Decodes a 256-byte CM MAD. On kOk, *out holds the header and body; on kUnsupported only
// the header; on any other error *out is unspecified. For kBadField, *detail (when given)
// names the field, for traces. Reads only mad[0, len).
CmError decode_cm(const uint8_t* mad, size_t len, CmMad* out, const char** detail = nullptr);

// The ID an answer carries back to the side that issued it, read without decoding the rest:
// the remote comm ID of an MRA, REJ, REP, RTU, DREQ or DREP, the request ID of a SIDR_REP;
// 0 for anything else (a REQ, a SIDR_REQ, not a 256-byte CM MAD). Routing only: the MAD is
// still checked whole by decode_cm where it lands.
uint32_t cm_answer_id(const uint8_t* mad, size_t len);

// The service ID a REQ or SIDR_REQ asks for, read without decoding the rest (routing only,
// like cm_answer_id); false for anything else.
bool cm_request_service(const uint8_t* mad, size_t len, uint64_t* service_id);

// What a host's CM answers when no connection or listener of its own is concerned (the
// kernel's cm.c: REJ 8 for a REQ nobody listens on, SIDR_REP status 1 for such a SIDR_REQ,
// cm_issue_drep's DREP for a DREQ naming no connection), built from the request alone:
// the same TID, the requester's IDs echoed. False (nothing to answer) for anything else or
// for a MAD that does not decode.
bool cm_stateless_answer(const uint8_t* mad, size_t len, uint8_t out[kMadBytes]);

// Writes the MAD: the header (attr_id from the body), then the body. Returns false, having
// written an unspecified MAD, when a field does not fit its width (e.g. a 25-bit QPN) or a
// length is over its maximum; reserved bits are written as 0.
bool encode_cm(const CmMad& m, uint8_t out[kMadBytes]);

// A CM MAD's header for a new request (Send, the CM class, version 2) or for an answer,
// which carries the TID of the message it answers (REP, REJ, MRA to a REQ; DREP to a DREQ;
// SIDR_REP to a SIDR_REQ), as the kernel's CM does.
inline MadHeader cm_header(uint64_t tid) {
  MadHeader h;
  h.tid = tid;
  return h;
}

// ---- rdma_cm on top of the CM ----

// rdma_cm's port spaces (<rdma/rdma_cma.h> enum rdma_port_space) and their service IDs: the
// kernel's cma_get_service_id() is (port space << 16) | port, e.g. RDMA_PS_TCP port 7471 is
// 0x0000000001061d2f (RDMA_IB_IP_PS_TCP = 0x0000000001060000).
enum class PortSpace : uint16_t { kIpoib = 0x0002, kTcp = 0x0106, kUdp = 0x0111, kIb = 0x013f };
inline constexpr uint64_t service_id(PortSpace ps, uint16_t port) {
  return uint64_t(ps) << 16 | port;
}
// Splits an rdma_cm service ID; false for one of another shape (not rdma_cm's).
bool parse_service_id(uint64_t sid, PortSpace* ps, uint16_t* port);

// The header rdma_cm puts at the start of the private data of a REQ and a SIDR_REQ for IP
// port spaces (cma.c struct cma_hdr): version 0, the IP version in the high nibble of a
// byte, the *source* port (the destination port is the service ID's), then the source and
// destination addresses, each in 16 bytes: an IPv6 address, or an IPv4 address in the last
// 4 bytes after 12 zero bytes (cma.c union cma_ip_addr; not the ::ffff: mapped form).
// What the application passed to rdma_connect follows it.
inline constexpr size_t kCmaHeaderBytes = 36;
inline constexpr uint8_t kCmaVersion = 0;

struct CmaHeader {
  uint8_t ip_version = 4;  // 4 or 6
  uint16_t src_port = 0;
  // Network order; IPv4 addresses in bytes 12..15 (bytes 0..11 are written as 0).
  std::array<uint8_t, 16> src_addr{};
  std::array<uint8_t, 16> dst_addr{};
  bool operator==(const CmaHeader&) const = default;
};

enum class CmaError : uint8_t {
  kOk = 0,
  kTooShort,       // less than 36 bytes
  kBadVersion,     // cma_version != 0 (the kernel refuses the request then)
  kBadIpVersion,   // neither 4 nor 6
};
const char* cma_error_name(CmaError e);
// Reads the header from the first bytes of private data (kernel-like: the low nibble of the
// IP version byte and IPv4's 12 leading bytes are not looked at).
CmaError decode_cma_header(const uint8_t* private_data, size_t len, CmaHeader* out);
// Writes 36 bytes; false for an IP version other than 4 or 6.
bool encode_cma_header(const CmaHeader& h, uint8_t* out);

}  // namespace softverbs::wire::roce
