// Management datagrams (MADs) as RoCE v2 carries them: a 256-byte MAD with the common
// header of IBA vol. 1 ch. 13.4, sent to QP1 (the GSI, "general services interface") as a
// UD SEND_ONLY with a DETH: Q_Key 0x80010000 (the kernel's IB_QP1_QKEY), P_Key 0xffff.
// Only the CM class (0x07) travels this way over RoCE: there is no subnet manager or SA.
// The CM messages inside the MAD are cm_msg.hpp's.
//
// Facts from IBA vol. 1 ch. 13 as the kernel implements it (include/rdma/ib_mad.h,
// drivers/infiniband/core/mad.c) and as frames captured from Linux 6.1 rxe show it
// (tests/unit/roce_cm_frames_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {

inline constexpr size_t kMadBytes = 256;
inline constexpr size_t kMadHeaderBytes = 24;
inline constexpr size_t kMadDataBytes = kMadBytes - kMadHeaderBytes;  // 232

inline constexpr uint8_t kMadBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;  // IBA 1.2 and later; the kernel sends 2

// Methods (IBA ch. 13.4; the kernel's IB_MGMT_METHOD_*). The CM sends every message with
// Send; ClassPortInfo is Get/GetResp.
enum MadMethod : uint8_t {
  kMadGet = 0x01,
  kMadSet = 0x02,
  kMadSend = 0x03,
  kMadTrap = 0x05,
  kMadGetResp = 0x81,
  kMadResponseBit = 0x80,
};

// MAD status (IBA ch. 13.4; the kernel's IB_MGMT_MAD_STATUS_*): what an agent answers to a
// request it cannot serve.
enum MadStatus : uint16_t {
  kMadStatusBadVersion = 0x0004,       // base or class version not supported
  kMadStatusUnsupportedMethod = 0x0008,
  kMadStatusUnsupportedAttribute = 0x000c,  // method/attribute combination not supported
  kMadStatusInvalidAttributeValue = 0x001c,
};

// The common MAD header, host order. The 16 reserved bits after attr_id are written as 0.
struct MadHeader {
  uint8_t base_version = kMadBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMadSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;  // transaction ID: a response carries the request's
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;  // the CM puts ECE's attribute modifier here in REQ/REP/REJ
  bool operator==(const MadHeader&) const = default;
};

void encode_mad_header(const MadHeader& h, uint8_t* mad);
// Reads the 24 header bytes; no field is checked (decode_cm does that for the CM).
MadHeader decode_mad_header(const uint8_t* mad);
// The header of the answer an agent gives to a Get or Set it does not support: GetResp,
// the same TID, class and attribute, `status` (as the kernel's MAD layer answers requests
// no agent takes). Sends and responses get no answer; see mad_wants_answer.
MadHeader mad_error_response(const MadHeader& request, uint16_t status);
inline bool mad_wants_answer(const MadHeader& h) {
  return h.method == kMadGet || h.method == kMadSet;
}

// ---- GMP transport: a MAD in a RoCE v2 datagram ----

inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;
inline constexpr uint16_t kDefaultPkey = 0xffff;
// BTH + DETH + MAD + ICRC: 280 bytes after the UDP header.
inline constexpr size_t kGmpDatagramBytes = kBthBytes + kDethBytes + kMadBytes + kIcrcBytes;

// The transport fields of a GMP. rxe sends every GMP with AckReq set and its QP1's own PSN
// sequence (UD receivers ignore both); src_qp and dest_qp are 1 both ways.
struct Gmp {
  uint16_t pkey = kDefaultPkey;
  uint32_t dest_qp = kGsiQpn;
  uint32_t src_qp = kGsiQpn;
  uint32_t qkey = kGsiQkey;
  uint32_t psn = 0;
  bool ack_req = true;
  bool operator==(const Gmp&) const = default;
};

// Writes BTH, DETH, the MAD and 4 zero bytes for the ICRC (icrc_fill, icrc.hpp); returns
// kGmpDatagramBytes, or 0 when cap is too small.
size_t encode_gmp(const Gmp& g, const uint8_t* mad, uint8_t* out, size_t cap);

enum class GmpError : uint8_t {
  kOk = 0,
  kMalformed,    // not a well-formed RoCE v2 datagram (packet.hpp's decode said no)
  kNotUdSend,    // an opcode other than UD SEND_ONLY
  kNotQp1,       // DestQP is not 1: a data packet for some UD QP, not ours to read
  kBadQkey,      // QP1 takes only Q_Key 0x80010000 (rxe drops other Q_Keys too)
  kBadLength,    // the payload is not exactly one 256-byte MAD
};
const char* gmp_error_name(GmpError e);

// Parses a datagram (after the UDP header, ICRC included but not checked here) as a GMP:
// fills *g and points *mad at the 256 MAD bytes inside dgram.
GmpError decode_gmp(const uint8_t* dgram, size_t len, Gmp* g, const uint8_t** mad);

}  // namespace softverbs::wire::roce
