// RoCE v2 transport headers: the opcode table, and encoding and decoding of BTH, the
// extension headers and the payload of one UDP datagram. Multi-byte fields are big-endian
// on the wire (IBA 9.2); the ICRC is icrc.cpp's.
#include "wire/roce/packet.hpp"

#include <array>
#include <cstring>

#include "wire/roce/bytes.hpp"

namespace softverbs::wire::roce {
namespace {

constexpr uint8_t header_size_of(uint32_t flags) {
  uint32_t n = kBthBytes;
  if (flags & kHasXrceth) n += kXrcethBytes;
  if (flags & kHasFeth) n += kFethBytes;
  if (flags & kHasReth) n += kRethBytes;
  if (flags & kHasDeth) n += kDethBytes;
  if (flags & kHasAeth) n += kAethBytes;
  if (flags & kHasAtomicEth) n += kAtomicEthBytes;
  if (flags & kHasAtomicAckEth) n += kAtomicAckEthBytes;
  if (flags & kHasImm) n += kImmBytes;
  if (flags & kHasIeth) n += kIethBytes;
  return uint8_t(n);
}

struct Entry {
  uint8_t op;
  uint32_t flags;
  const char* name;
};

constexpr uint32_t kSendReq = kRequest | kSendOp | kHasPayload;
constexpr uint32_t kWriteReq = kRequest | kWriteOp | kHasPayload;
constexpr uint32_t kReadResp = kResponse | kReadOp | kHasPayload;

// The operations per transport service: RC has them all, UC only SEND and WRITE, UD only
// SEND_ONLY (with a DETH) -- IBA table 38.
constexpr Entry kRcOps[] = {
    {kSendFirst, kSendReq | kFirst, "SEND_FIRST"},
    {kSendMiddle, kSendReq | kMiddle, "SEND_MIDDLE"},
    {kSendLast, kSendReq | kLast, "SEND_LAST"},
    {kSendLastImm, kSendReq | kLast | kHasImm, "SEND_LAST_WITH_IMMEDIATE"},
    {kSendOnly, kSendReq | kOnly, "SEND_ONLY"},
    {kSendOnlyImm, kSendReq | kOnly | kHasImm, "SEND_ONLY_WITH_IMMEDIATE"},
    {kWriteFirst, kWriteReq | kFirst | kHasReth, "RDMA_WRITE_FIRST"},
    {kWriteMiddle, kWriteReq | kMiddle, "RDMA_WRITE_MIDDLE"},
    {kWriteLast, kWriteReq | kLast, "RDMA_WRITE_LAST"},
    {kWriteLastImm, kWriteReq | kLast | kHasImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE"},
    {kWriteOnly, kWriteReq | kOnly | kHasReth, "RDMA_WRITE_ONLY"},
    {kWriteOnlyImm, kWriteReq | kOnly | kHasReth | kHasImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
    {kReadRequest, kRequest | kReadOp | kOnly | kHasReth, "RDMA_READ_REQUEST"},
    {kReadResponseFirst, kReadResp | kFirst | kHasAeth, "RDMA_READ_RESPONSE_FIRST"},
    {kReadResponseMiddle, kReadResp | kMiddle, "RDMA_READ_RESPONSE_MIDDLE"},
    {kReadResponseLast, kReadResp | kLast | kHasAeth, "RDMA_READ_RESPONSE_LAST"},
    {kReadResponseOnly, kReadResp | kOnly | kHasAeth, "RDMA_READ_RESPONSE_ONLY"},
    {kAck, kResponse | kAckOp | kOnly | kHasAeth, "ACKNOWLEDGE"},
    {kAtomicAck, kResponse | kAtomicOp | kOnly | kHasAeth | kHasAtomicAckEth,
     "ATOMIC_ACKNOWLEDGE"},
    {kCompareSwap, kRequest | kAtomicOp | kOnly | kHasAtomicEth, "COMPARE_SWAP"},
    {kFetchAdd, kRequest | kAtomicOp | kOnly | kHasAtomicEth, "FETCH_ADD"},
    {kSendLastInv, kSendReq | kLast | kHasIeth, "SEND_LAST_WITH_INVALIDATE"},
    {kSendOnlyInv, kSendReq | kOnly | kHasIeth, "SEND_ONLY_WITH_INVALIDATE"},
    {kFlush, kRequest | kFlushOp | kOnly | kHasFeth | kHasReth, "FLUSH"},
    {kAtomicWrite, kRequest | kAtomicWriteOp | kOnly | kHasReth | kHasPayload, "ATOMIC_WRITE"},
};

struct Table {
  std::array<OpcodeInfo, 256> info{};
  std::array<char[40], 256> names{};
};

void put(Table& t, uint8_t opcode, uint32_t flags, const char* transport, const char* op) {
  char* name = t.names[opcode];
  size_t n = strlen(transport);
  memcpy(name, transport, n);
  strncpy(name + n, op, sizeof(t.names[opcode]) - n - 1);
  t.info[opcode] = OpcodeInfo{flags, header_size_of(flags), name};
}

Table build_table() {
  Table t;
  for (const Entry& e : kRcOps) {
    put(t, kRc | e.op, e.flags, "RC_", e.name);
    if (e.flags & (kSendOp | kWriteOp) && !(e.flags & kHasIeth)) {
      put(t, kUc | e.op, e.flags, "UC_", e.name);
    }
    // XRC: RC's opcodes at 0xA0 (IBA 1.5's FLUSH and ATOMIC WRITE are RC's only here);
    // a request names its XRC SRQ in an XRCETH.
    if (!(e.flags & (kFlushOp | kAtomicWriteOp)))
      put(t, kXrc | e.op, e.flags | ((e.flags & kRequest) ? uint32_t{kHasXrceth} : 0u), "XRC_", e.name);
  }
  put(t, kUd | kSendOnly, kSendReq | kOnly | kHasDeth, "UD_", "SEND_ONLY");
  put(t, kUd | kSendOnlyImm, kSendReq | kOnly | kHasDeth | kHasImm, "UD_",
      "SEND_ONLY_WITH_IMMEDIATE");
  return t;
}

const Table& table() {
  static const Table t = build_table();
  return t;
}

// A multi-packet message's FIRST and MIDDLE packets are a whole path MTU, a multiple of 4,
// so only LAST and ONLY packets can need pad.
bool pad_allowed(uint32_t flags) { return (flags & kHasPayload) && (flags & (kLast | kOnly)); }

}  // namespace

const OpcodeInfo& opcode_info(uint8_t opcode) { return table().info[opcode]; }

size_t datagram_bytes(uint8_t opcode, uint32_t payload_len) {
  const OpcodeInfo& info = opcode_info(opcode);
  if (info.flags == 0) return 0;
  return size_t(info.header_bytes) + payload_len + pad_bytes(payload_len) + kIcrcBytes;
}

size_t encode_headers(const Packet& p, uint32_t payload_len, uint8_t* out, size_t cap) {
  const OpcodeInfo& info = opcode_info(p.opcode);
  const uint8_t pad = pad_bytes(payload_len);
  if (info.flags == 0 || cap < info.header_bytes) return 0;
  if (payload_len != 0 && !(info.flags & kHasPayload)) return 0;
  if (pad != 0 && !pad_allowed(info.flags)) return 0;

  uint8_t* h = out;
  h[0] = p.opcode;
  h[1] = uint8_t((p.solicited ? 0x80 : 0) | (p.mig_req ? 0x40 : 0) | pad << 4);  // TVer 0
  put16(h + 2, p.pkey);
  h[4] = uint8_t((p.fecn ? 0x80 : 0) | (p.becn ? 0x40 : 0));
  put24(h + 5, p.dest_qp);
  h[8] = p.ack_req ? 0x80 : 0;
  put24(h + 9, p.psn);
  h += kBthBytes;

  if (info.flags & kHasXrceth) {
    put32(h, p.xrc_srqn & 0xffffff);  // the top 8 bits are reserved: zero
    h += kXrcethBytes;
  }
  if (info.flags & kHasFeth) {
    put32(h, uint32_t(p.flush_type & 0x0f) | uint32_t(p.flush_level & 0x03) << 4);
    h += kFethBytes;
  }
  if (info.flags & kHasReth) {
    put64(h, p.va);
    put32(h + 8, p.rkey);
    put32(h + 12, p.dma_len);
    h += kRethBytes;
  }
  if (info.flags & kHasDeth) {
    put32(h, p.qkey);
    h[4] = 0;
    put24(h + 5, p.src_qp);
    h += kDethBytes;
  }
  if (info.flags & kHasAeth) {
    h[0] = p.syndrome;
    put24(h + 1, p.msn);
    h += kAethBytes;
  }
  if (info.flags & kHasAtomicEth) {
    put64(h, p.va);
    put32(h + 8, p.rkey);
    put64(h + 12, p.swap_add);
    put64(h + 20, p.compare);
    h += kAtomicEthBytes;
  }
  if (info.flags & kHasAtomicAckEth) {
    put64(h, p.orig);
    h += kAtomicAckEthBytes;
  }
  if (info.flags & kHasImm) {
    memcpy(h, &p.imm, kImmBytes);  // already in network order
    h += kImmBytes;
  }
  if (info.flags & kHasIeth) {
    put32(h, p.inv_rkey);
    h += kIethBytes;
  }
  return size_t(h - out);
}

size_t encode(const Packet& p, const uint8_t* payload, uint32_t len, uint8_t* out, size_t cap) {
  const size_t total = datagram_bytes(p.opcode, len);
  if (total == 0 || total > kMaxDatagramBytes || cap < total) return 0;
  if (len != 0 && payload == nullptr) return 0;
  const size_t hdr = encode_headers(p, len, out, cap);
  if (hdr == 0) return 0;
  if (len != 0) memcpy(out + hdr, payload, len);
  memset(out + hdr + len, 0, total - hdr - len);  // pad and the ICRC's place
  return total;
}

const char* decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kOk: return "ok";
    case DecodeError::kTooShort: return "shorter than its headers";
    case DecodeError::kBadOpcode: return "unknown opcode";
    case DecodeError::kBadVersion: return "transport version not 0";
    case DecodeError::kPayloadNotAllowed: return "payload on an opcode without payload";
    case DecodeError::kBadPad: return "pad count not allowed here";
    case DecodeError::kTooLong: return "longer than an IP datagram";
  }
  return "?";
}

DecodeError decode_checked(const uint8_t* dgram, size_t len, Packet* out) {
  if (len < kBthBytes + kIcrcBytes) return DecodeError::kTooShort;
  if (len > kMaxDatagramBytes) return DecodeError::kTooLong;
  const OpcodeInfo& info = opcode_info(dgram[0]);
  if (info.flags == 0) return DecodeError::kBadOpcode;
  if (len < size_t(info.header_bytes) + kIcrcBytes) return DecodeError::kTooShort;
  if ((dgram[1] & 0x0f) != 0) return DecodeError::kBadVersion;

  const uint8_t pad = (dgram[1] >> 4) & 3;
  size_t body = len - info.header_bytes - kIcrcBytes;  // payload + pad
  if (body != 0 && !(info.flags & kHasPayload)) return DecodeError::kPayloadNotAllowed;
  if (pad != 0 && (!pad_allowed(info.flags) || pad > body)) return DecodeError::kBadPad;

  // Straight into *out, reset from a constant: a `Packet p;` copied out at the end was
  // 5 % of a receiving port thread (zeroed by `rep stos`, then read back from the stack).
  static constexpr Packet kFresh{};
  Packet& p = *out;
  p = kFresh;
  p.opcode = dgram[0];
  p.solicited = dgram[1] & 0x80;
  p.mig_req = dgram[1] & 0x40;
  p.pad = pad;
  p.pkey = uint16_t(get16(dgram + 2));
  p.fecn = dgram[4] & 0x80;
  p.becn = dgram[4] & 0x40;
  p.dest_qp = get24(dgram + 5);
  p.ack_req = dgram[8] & 0x80;
  p.psn = get24(dgram + 9);

  const uint8_t* h = dgram + kBthBytes;
  if (info.flags & kHasXrceth) {
    p.xrc_srqn = get32(h) & 0xffffff;  // reserved bits ignored
    h += kXrcethBytes;
  }
  if (info.flags & kHasFeth) {
    uint32_t feth = get32(h);  // bits 31-6 reserved: ignored
    p.flush_type = uint8_t(feth & 0x0f);
    p.flush_level = uint8_t((feth >> 4) & 0x03);
    h += kFethBytes;
  }
  if (info.flags & kHasReth) {
    p.va = get64(h);
    p.rkey = get32(h + 8);
    p.dma_len = get32(h + 12);
    h += kRethBytes;
  }
  if (info.flags & kHasDeth) {
    p.qkey = get32(h);
    p.src_qp = get24(h + 5);
    h += kDethBytes;
  }
  if (info.flags & kHasAeth) {
    p.syndrome = h[0];
    p.msn = get24(h + 1);
    h += kAethBytes;
  }
  if (info.flags & kHasAtomicEth) {
    p.va = get64(h);
    p.rkey = get32(h + 8);
    p.swap_add = get64(h + 12);
    p.compare = get64(h + 20);
    h += kAtomicEthBytes;
  }
  if (info.flags & kHasAtomicAckEth) {
    p.orig = get64(h);
    h += kAtomicAckEthBytes;
  }
  if (info.flags & kHasImm) {
    memcpy(&p.imm, h, kImmBytes);
    h += kImmBytes;
  }
  if (info.flags & kHasIeth) {
    p.inv_rkey = get32(h);
    h += kIethBytes;
  }
  p.payload_len = uint32_t(body - pad);
  p.payload = p.payload_len != 0 ? h : nullptr;
  return DecodeError::kOk;
}

}  // namespace softverbs::wire::roce
