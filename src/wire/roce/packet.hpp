// RoCE v2 packets: the IBA transport headers that follow the UDP header (destination port
// 4791), decoded into one struct. Layouts, opcodes and which extension headers an opcode
// carries are IBTA's (Vol. 1 ch. 9, the RoCE v2 annex A17), as Linux rxe's opcode table
// has them. Encoding, decoding and the ICRC live beside this header (packet.cpp, icrc.*).
#pragma once

#include <cstdint>

namespace softverbs::wire::roce {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint32_t kBthBytes = 12;
inline constexpr uint32_t kIcrcBytes = 4;

// BTH opcodes: the high three bits name the transport, the low five the operation.
enum Transport : uint8_t { kRc = 0x00, kUc = 0x20, kRd = 0x40, kUd = 0x60, kCnp = 0x80 };
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
};

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
  // The payload: after the headers, without pad bytes and ICRC. Decode points into the
  // datagram it parsed; encode copies from here (or takes the payload separately).
  const uint8_t* payload = nullptr;
  uint32_t payload_len = 0;
};

}  // namespace softverbs::wire::roce
