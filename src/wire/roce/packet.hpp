// RoCE v2 packets: the IBA transport headers that follow the UDP header (destination port
// 4791), decoded into one struct. Layouts, opcodes and which extension headers an opcode
// carries are IBTA's (Vol. 1 ch. 9, the RoCE v2 annex A17), as Linux rxe's opcode table
// has them. Encoding, decoding and the ICRC live beside this header (packet.cpp, icrc.*).
#pragma once

#include <cstddef>
#include <cstdint>

namespace softverbs::wire::roce {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint32_t kBthBytes = 12;
inline constexpr uint32_t kIcrcBytes = 4;
// No UDP payload is longer (an IPv6 payload length of 65535 less the UDP header; over IPv4
// it is 20 bytes less).
inline constexpr uint32_t kMaxDatagramBytes = 65535 - 8;
// Extension header sizes (IBA 9.3).
inline constexpr uint32_t kRethBytes = 16;
inline constexpr uint32_t kAethBytes = 4;
inline constexpr uint32_t kAtomicEthBytes = 28;
inline constexpr uint32_t kAtomicAckEthBytes = 8;
inline constexpr uint32_t kImmBytes = 4;
inline constexpr uint32_t kIethBytes = 4;
inline constexpr uint32_t kDethBytes = 8;
// FLUSH Extended Transport Header (IBA 1.5, as rxe_hdr.h): placement type in bits 3-0,
// selectivity level in bits 5-4 of one big-endian word.
inline constexpr uint32_t kFethBytes = 4;
// ATOMIC WRITE's payload: exactly 8 bytes.
inline constexpr uint32_t kAtomicWriteBytes = 8;
// XRC Extended Transport Header (IBA 9.x, as rxe_hdr.h lays it out): 8 reserved bits, then
// the 24-bit XRC SRQ number; in every XRC request packet, right after the BTH.
inline constexpr uint32_t kXrcethBytes = 4;

// BTH opcodes: the high three bits name the transport, the low five the operation.
enum Transport : uint8_t { kRc = 0x00, kUc = 0x20, kRd = 0x40, kUd = 0x60, kCnp = 0x80, kXrc = 0xa0 };
enum Op : uint8_t {
  kSendFirst = 0x00,
  kSendMiddle = 0x01,
  kSendLast = 0x02,
  kSendLastImm = 0x03,
  kSendOnly = 0x04,
  kSendOnlyImm = 0x05,
  kWriteFirst = 0x06,
  kWriteMiddle = 0x07,
  kWriteLast = 0x08,
  kWriteLastImm = 0x09,
  kWriteOnly = 0x0a,
  kWriteOnlyImm = 0x0b,
  kReadRequest = 0x0c,
  kReadResponseFirst = 0x0d,
  kReadResponseMiddle = 0x0e,
  kReadResponseLast = 0x0f,
  kReadResponseOnly = 0x10,
  kAck = 0x11,
  kAtomicAck = 0x12,
  kCompareSwap = 0x13,
  kFetchAdd = 0x14,
  kSendLastInv = 0x16,
  kSendOnlyInv = 0x17,
  // IBA 1.5 (rxe_opcode.c): answered with an RDMA READ RESPONSE ONLY without payload.
  kFlush = 0x1c,        // FETH then RETH (the range), no payload
  kAtomicWrite = 0x1d,  // RETH, then the 8 bytes as payload
};
// kRc | kSendOnly is an opcode (and without this, C++20 deprecates mixing two enums).
constexpr uint8_t operator|(Transport t, Op op) { return uint8_t(uint8_t(t) | uint8_t(op)); }

// AETH syndrome: bits 7..5 say what it is, bits 4..0 the credit count, RNR timer or NAK code.
enum AethKind : uint8_t { kAethAck = 0x00, kAethRnrNak = 0x20, kAethNak = 0x60 };
enum NakCode : uint8_t {
  kNakPsnSequenceError = 0,
  kNakInvalidRequest = 1,
  kNakRemoteAccessError = 2,
  kNakRemoteOperationalError = 3,
  kNakInvalidRdRequest = 4,
};

// One packet, decoded. Numbers are in host order, except `imm`, which stays in network
// order as ibv_wc.imm_data and ibv_send_wr.imm_data carry it. Fields of headers the opcode
// does not carry are ignored by encode and left zero by decode.
struct Packet {
  // BTH
  uint8_t opcode = 0;       // Transport | Op
  bool solicited = false;   // SE
  bool mig_req = false;     // M
  uint8_t pad = 0;          // PadCnt: decode reports it, encode computes it
  uint16_t pkey = 0xffff;
  bool fecn = false;
  bool becn = false;
  uint32_t dest_qp = 0;     // 24 bits
  bool ack_req = false;     // A
  uint32_t psn = 0;         // 24 bits
  // RETH; AtomicETH's VA and R_Key are these too
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_len = 0;
  // AtomicETH
  uint64_t swap_add = 0;
  uint64_t compare = 0;
  // AETH
  uint8_t syndrome = 0;
  uint32_t msn = 0;         // 24 bits
  // AtomicAckETH
  uint64_t orig = 0;
  // ImmDt (network order) and IETH
  uint32_t imm = 0;
  uint32_t inv_rkey = 0;
  // DETH
  uint32_t qkey = 0;
  uint32_t src_qp = 0;      // 24 bits
  // XRCETH
  uint32_t xrc_srqn = 0;    // 24 bits
  // FETH
  uint8_t flush_type = 0;   // placement type, 4 bits
  uint8_t flush_level = 0;  // selectivity level, 2 bits
  // The payload: after the headers, without pad bytes and ICRC. Decode points into the
  // datagram it parsed; encode copies from here (or takes the payload separately).
  const uint8_t* payload = nullptr;
  uint32_t payload_len = 0;
};

// What an opcode carries and means, from the opcode table. Extension headers follow the
// BTH in the order XRCETH, FETH, RETH/DETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH
// (IBA 9.2-9.3; only WRITE_ONLY_IMM, UD SEND_ONLY_IMM, FLUSH and XRC requests have two or
// more). XRC (transport 0xA0) has RC's opcodes; its requests carry an XRCETH first.
enum OpcodeFlag : uint32_t {
  kHasReth = 1u << 0,
  kHasAeth = 1u << 1,
  kHasAtomicEth = 1u << 2,
  kHasAtomicAckEth = 1u << 3,
  kHasImm = 1u << 4,
  kHasIeth = 1u << 5,
  kHasDeth = 1u << 6,
  kHasPayload = 1u << 7,   // payload allowed (it may still be empty)
  kFirst = 1u << 8,        // first packet of a multi-packet message
  kMiddle = 1u << 9,
  kLast = 1u << 10,
  kOnly = 1u << 11,        // the whole message in one packet
  kRequest = 1u << 12,     // requester to responder
  kResponse = 1u << 13,    // responder to requester
  kSendOp = 1u << 14,      // the message kind
  kWriteOp = 1u << 15,
  kReadOp = 1u << 16,      // READ request and READ response packets
  kAtomicOp = 1u << 17,    // CMP_SWAP, FETCH_ADD and ATOMIC_ACK
  kAckOp = 1u << 18,       // the plain ACK/NAK opcode
  kHasFeth = 1u << 19,
  kFlushOp = 1u << 20,       // FLUSH
  kAtomicWriteOp = 1u << 21, // ATOMIC WRITE
  kHasXrceth = 1u << 22,     // XRC requests
};

struct OpcodeInfo {
  uint32_t flags = 0;        // 0: not an opcode we know (drop the packet)
  uint8_t header_bytes = 0;  // BTH + extension headers
  const char* name = "";     // e.g. "RC_SEND_ONLY", for traces and errors
};

// The table entry of `opcode`; flags == 0 for opcodes outside RC, UC (send and write),
// UD (SEND_ONLY, SEND_ONLY_IMM) and XRC (RC's, without IBA 1.5's FLUSH and ATOMIC WRITE).
const OpcodeInfo& opcode_info(uint8_t opcode);
inline bool opcode_valid(uint8_t opcode) { return opcode_info(opcode).flags != 0; }
// BTH plus extension headers; 0 for an invalid opcode.
inline size_t header_bytes(uint8_t opcode) { return opcode_info(opcode).header_bytes; }
// PadCnt for a payload: bytes that bring it to a multiple of 4.
inline uint8_t pad_bytes(uint32_t payload_len) { return uint8_t((4 - (payload_len & 3)) & 3); }
// The whole datagram (what follows the UDP header): headers, payload, pad and ICRC; 0 for an
// invalid opcode.
size_t datagram_bytes(uint8_t opcode, uint32_t payload_len);

// Writes BTH and the opcode's extension headers for a packet of `payload_len` payload bytes
// (PadCnt computed from it, p.pad ignored). Returns the header bytes, 0 for an invalid opcode,
// a payload on an opcode without one, or cap too small. Lets a sender gather headers,
// payload and trailer (pad + ICRC) without copying the payload.
size_t encode_headers(const Packet& p, uint32_t payload_len, uint8_t* out, size_t cap);
// Writes the whole datagram: headers, payload, zero pad and 4 zero bytes for the ICRC (fill
// them with icrc_fill, icrc.hpp). Returns the datagram length, 0 when it does not fit or
// the packet cannot be encoded (see encode_headers).
size_t encode(const Packet& p, const uint8_t* payload, uint32_t len, uint8_t* out, size_t cap);
// The same with the payload from p.payload / p.payload_len.
inline size_t encode(const Packet& p, uint8_t* out, size_t cap) {
  return encode(p, p.payload, p.payload_len, out, cap);
}

// Why a datagram did not decode; counters and traces name the reason.
enum class DecodeError : uint8_t {
  kOk = 0,
  kTooShort,        // shorter than the opcode's headers + pad + ICRC
  kBadOpcode,       // not in the table (RD, CNP, reserved, UC READ, ...)
  kBadVersion,      // TVer != 0
  kPayloadNotAllowed,  // bytes between the headers and the ICRC on an opcode without payload
  kBadPad,          // PadCnt on an opcode without payload, on a FIRST/MIDDLE packet, or > payload
  kTooLong,         // more than an IP datagram can hold (64 KiB)
};
const char* decode_error_name(DecodeError e);

// Parses one datagram (everything after the UDP header, ICRC included; the ICRC is not
// checked here, see icrc.hpp). Fills *out (payload points into dgram) and returns kOk, or
// returns why the datagram is malformed (then *out is unspecified). Reads only dgram[0, len).
// Reserved BTH/DETH bits are ignored as IBA requires of receivers; P_Key, QPN, PSN and the
// payload length against the path MTU are the receiving QP's to check.
DecodeError decode_checked(const uint8_t* dgram, size_t len, Packet* out);
inline bool decode(const uint8_t* dgram, size_t len, Packet* out) {
  return decode_checked(dgram, len, out) == DecodeError::kOk;
}

}  // namespace softverbs::wire::roce
