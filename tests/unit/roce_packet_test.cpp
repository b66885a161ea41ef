// RoCE v2 packet encoding and decoding: the opcode table against IBA's header layouts (the
// sizes rxe's opcode table has), byte-exact encodings, round trips of every opcode, and
// each way a malformed datagram is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {
namespace {

TEST(RocePacketTest, HeaderSizesPerOpcode) {
  struct Expect {
    uint8_t opcode;
    size_t bytes;
  };
  // BTH 12, RETH 16, AETH 4, AtomicETH 28, AtomicAckETH 8, ImmDt 4, IETH 4, DETH 8, FETH 4.
  const Expect expect[] = {
      {0x00, 12}, {0x01, 12}, {0x02, 12}, {0x03, 16}, {0x04, 12}, {0x05, 16},
      {0x06, 28}, {0x07, 12}, {0x08, 12}, {0x09, 16}, {0x0a, 28}, {0x0b, 32},
      {0x0c, 28}, {0x0d, 16}, {0x0e, 12}, {0x0f, 16}, {0x10, 16}, {0x11, 16},
      {0x12, 24}, {0x13, 40}, {0x14, 40}, {0x16, 16}, {0x17, 16}, {0x1c, 32}, {0x1d, 28},
      {0x20, 12}, {0x21, 12}, {0x22, 12}, {0x23, 16}, {0x24, 12}, {0x25, 16},
      {0x26, 28}, {0x27, 12}, {0x28, 12}, {0x29, 16}, {0x2a, 28}, {0x2b, 32},
      {0x64, 20}, {0x65, 24},
      // XRC (0xA0 + RC's operation): requests carry a 4-byte XRCETH after the BTH.
      {0xa0, 16}, {0xa1, 16}, {0xa2, 16}, {0xa3, 20}, {0xa4, 16}, {0xa5, 20},
      {0xa6, 32}, {0xa7, 16}, {0xa8, 16}, {0xa9, 20}, {0xaa, 32}, {0xab, 36},
      {0xac, 32}, {0xad, 16}, {0xae, 12}, {0xaf, 16}, {0xb0, 16}, {0xb1, 16},
      {0xb2, 24}, {0xb3, 44}, {0xb4, 44}, {0xb6, 20}, {0xb7, 20},
  };
  int valid = 0;
  for (int op = 0; op < 256; ++op) valid += opcode_valid(uint8_t(op));
  EXPECT_EQ(valid, int(std::size(expect)));
  for (const Expect& e : expect) {
    EXPECT_TRUE(opcode_valid(e.opcode)) << int(e.opcode);
    EXPECT_EQ(header_bytes(e.opcode), e.bytes) << opcode_info(e.opcode).name;
  }
  for (uint8_t bad : {0x15, 0x18, 0x1f, 0x2c, 0x2d, 0x31, 0x36, 0x37, 0x40, 0x44, 0x60, 0x63,
                      0x66, 0x80, 0x81, 0xb5, 0xbc, 0xbd, 0xc0, 0xff}) {
    EXPECT_FALSE(opcode_valid(bad)) << int(bad);
    EXPECT_EQ(header_bytes(bad), 0u);
  }
  EXPECT_STREQ(opcode_info(0x0b).name, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
  EXPECT_STREQ(opcode_info(0x65).name, "UD_SEND_ONLY_WITH_IMMEDIATE");
  EXPECT_EQ(opcode_info(kRc | kReadResponseMiddle).flags,
            uint32_t(kResponse | kReadOp | kHasPayload | kMiddle));
  EXPECT_EQ(opcode_info(kUc | kWriteOnlyImm).flags,
            uint32_t(kRequest | kWriteOp | kHasPayload | kOnly | kHasReth | kHasImm));
}

// RC SEND_ONLY, SE, ack request, 5 bytes of payload: BTH fields at their bits, PadCnt 3.
TEST(RocePacketTest, EncodesSendOnlyByteExact) {
  Packet p;
  p.opcode = kRc | kSendOnly;
  p.solicited = true;
  p.pkey = 0xffff;
  p.dest_qp = 0x123456;
  p.ack_req = true;
  p.psn = 0xabcdef;
  p.becn = true;
  uint8_t out[64];
  ASSERT_EQ(encode(p, reinterpret_cast<const uint8_t*>("hello"), 5, out, sizeof out), 24u);
  const uint8_t expect[24] = {0x04, 0xb0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd,
                              0xef, 'h', 'e', 'l', 'l', 'o', 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(memcmp(out, expect, sizeof expect), 0);
  EXPECT_EQ(encode(p, reinterpret_cast<const uint8_t*>("hello"), 5, out, 23), 0u);
}

// Extension headers in IBA order with their fields big-endian.
TEST(RocePacketTest, EncodesExtensionHeadersByteExact) {
  Packet p;
  p.opcode = kRc | kWriteOnlyImm;
  p.va = 0x0102030405060708;
  p.rkey = 0x11223344;
  p.dma_len = 4;
  const uint8_t imm[4] = {0xde, 0xad, 0xbe, 0xef};
  memcpy(&p.imm, imm, 4);
  uint8_t out[64];
  ASSERT_EQ(encode(p, imm, 4, out, sizeof out), 40u);
  const uint8_t reth_imm[20] = {1,    2,    3,    4,    5,    6,    7,    8, 0x11, 0x22,
                                0x33, 0x44, 0,    0,    0,    4,    0xde, 0xad, 0xbe, 0xef};
  EXPECT_EQ(memcmp(out + 12, reth_imm, 20), 0);

  Packet a;
  a.opcode = kRc | kAtomicAck;
  a.syndrome = kAethAck | 0x1f;
  a.msn = 0x010203;
  a.orig = 0xa0a1a2a3a4a5a6a7;
  ASSERT_EQ(encode(a, nullptr, 0, out, sizeof out), 28u);
  const uint8_t aeth_ack[12] = {0x1f, 1, 2, 3, 0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7};
  EXPECT_EQ(memcmp(out + 12, aeth_ack, 12), 0);

  Packet u;
  u.opcode = kUd | kSendOnly;
  u.qkey = 0x80010000;
  u.src_qp = 0xfedcba;
  ASSERT_EQ(encode(u, nullptr, 0, out, sizeof out), 24u);
  const uint8_t deth[8] = {0x80, 0x01, 0, 0, 0, 0xfe, 0xdc, 0xba};
  EXPECT_EQ(memcmp(out + 12, deth, 8), 0);

  Packet c;
  c.opcode = kRc | kCompareSwap;
  c.va = 0x1000;
  c.rkey = 7;
  c.swap_add = 0x5555;
  c.compare = 0x6666;
  ASSERT_EQ(encode(c, nullptr, 0, out, sizeof out), 44u);
  EXPECT_EQ(out[12 + 6], 0x10);  // VA 0x1000, big-endian
  EXPECT_EQ(out[12 + 11], 7);
  EXPECT_EQ(out[12 + 18], 0x55);  // swap at AtomicETH offset 12
  EXPECT_EQ(out[12 + 26], 0x66);  // compare at offset 20
}

Packet full_packet(uint8_t opcode) {
  Packet p;
  p.opcode = opcode;
  p.solicited = true;
  p.mig_req = true;
  p.pkey = 0x8001;
  p.fecn = true;
  p.becn = true;
  p.dest_qp = 0xabcdef;
  p.ack_req = true;
  p.psn = 0xfffffe;
  const OpcodeInfo& info = opcode_info(opcode);
  if (info.flags & (kHasReth | kHasAtomicEth)) {
    p.va = 0xfedcba9876543210;
    p.rkey = 0x89abcdef;
  }
  if (info.flags & kHasReth) p.dma_len = 0x80000001;
  if (info.flags & kHasAtomicEth) {
    p.swap_add = 0x1111222233334444;
    p.compare = 0x5555666677778888;
  }
  if (info.flags & kHasAeth) {
    p.syndrome = kAethRnrNak | 0x0e;
    p.msn = 0x123456;
  }
  if (info.flags & kHasAtomicAckEth) p.orig = 0x0123456789abcdef;
  if (info.flags & kHasImm) p.imm = 0x78563412;
  if (info.flags & kHasIeth) p.inv_rkey = 0xcafef00d;
  if (info.flags & kHasDeth) {
    p.qkey = 0x11111111;
    p.src_qp = 0x000001;
  }
  if (info.flags & kHasXrceth) p.xrc_srqn = 0x00c0ffee & 0xffffff;
  return p;
}

bool same_fields(const Packet& a, const Packet& b) {
  return a.opcode == b.opcode && a.solicited == b.solicited && a.mig_req == b.mig_req &&
         a.pkey == b.pkey && a.fecn == b.fecn && a.becn == b.becn && a.dest_qp == b.dest_qp &&
         a.ack_req == b.ack_req && a.psn == b.psn && a.va == b.va && a.rkey == b.rkey &&
         a.dma_len == b.dma_len && a.swap_add == b.swap_add && a.compare == b.compare &&
         a.syndrome == b.syndrome && a.msn == b.msn && a.orig == b.orig && a.imm == b.imm &&
         a.inv_rkey == b.inv_rkey && a.qkey == b.qkey && a.src_qp == b.src_qp &&
         a.xrc_srqn == b.xrc_srqn;
}

// FLUSH: FETH (placement type bits 3-0, selectivity bits 5-4) before its RETH; ATOMIC
// WRITE: a RETH and 8 bytes of payload (rxe_opcode.c, rxe_hdr.h).
TEST(RocePacketTest, FlushAndAtomicWriteByteExact) {
  Packet f;
  f.opcode = kRc | kFlush;
  f.flush_type = 3;
  f.flush_level = 1;
  f.va = 0x0102030405060708;
  f.rkey = 0x11223344;
  f.dma_len = 0x1000;
  uint8_t out[64] = {};
  ASSERT_EQ(encode(f, nullptr, 0, out, sizeof out), 36u);
  const uint8_t feth_reth[20] = {0, 0, 0, 0x13, 1, 2, 3, 4, 5, 6, 7, 8,
                                 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0};
  EXPECT_EQ(memcmp(out + 12, feth_reth, 20), 0);
  Packet d;
  out[12] = 0xff;  // reserved FETH bits are ignored
  ASSERT_TRUE(decode(out, 36, &d));
  EXPECT_EQ(d.flush_type, 3);
  EXPECT_EQ(d.flush_level, 1);
  EXPECT_EQ(d.va, f.va);
  EXPECT_EQ(d.dma_len, 0x1000u);
  out[16] = 1;  // a payload on FLUSH is refused
  EXPECT_EQ(decode_checked(out, 40, &d), DecodeError::kPayloadNotAllowed);

  Packet w;
  w.opcode = kRc | kAtomicWrite;
  w.va = 8;
  w.rkey = 9;
  w.dma_len = 8;
  const uint8_t value[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(encode(w, value, 8, out, sizeof out), 40u);
  ASSERT_TRUE(decode(out, 40, &d));
  EXPECT_EQ(d.payload_len, 8u);
  EXPECT_EQ(memcmp(d.payload, value, 8), 0);
  EXPECT_FALSE(opcode_valid(kUc | kAtomicWrite));
  EXPECT_FALSE(opcode_valid(kUc | kFlush));
}

// XRC (IBA 9.x, rxe_hdr.h): the XRCETH follows the BTH, before RETH/AtomicETH/ImmDt:
// 8 reserved bits (sent as 0, ignored when read), then the 24-bit XRC SRQ number.
// Responses carry none.
TEST(RocePacketTest, XrcethByteExact) {
  Packet w;
  w.opcode = kXrc | kWriteOnlyImm;
  w.dest_qp = 0x000042;
  w.psn = 7;
  w.xrc_srqn = 0xabcdef;
  w.va = 0x0102030405060708;
  w.rkey = 0x11223344;
  w.dma_len = 4;
  w.imm = 0x04030201;  // network order as stored
  const uint8_t data[4] = {9, 8, 7, 6};
  uint8_t out[96] = {};
  ASSERT_EQ(encode(w, data, 4, out, sizeof out), 12u + 4 + 16 + 4 + 4 + 4);
  EXPECT_EQ(out[0], 0xab);  // XRC RDMA WRITE ONLY with immediate
  const uint8_t xrceth_reth[20] = {0, 0xab, 0xcd, 0xef, 1, 2, 3, 4, 5, 6, 7, 8,
                                   0x11, 0x22, 0x33, 0x44, 0, 0, 0, 4};
  EXPECT_EQ(memcmp(out + 12, xrceth_reth, 20), 0);
  EXPECT_EQ(memcmp(out + 32, &w.imm, 4), 0);
  EXPECT_EQ(memcmp(out + 36, data, 4), 0);
  Packet d;
  out[12] = 0xff;  // reserved XRCETH bits are ignored
  ASSERT_TRUE(decode(out, 44, &d));
  EXPECT_EQ(d.xrc_srqn, 0xabcdefu);
  EXPECT_EQ(d.va, w.va);
  EXPECT_EQ(d.rkey, w.rkey);
  EXPECT_EQ(d.imm, w.imm);
  EXPECT_STREQ(opcode_info(kXrc | kSendOnly).name, "XRC_SEND_ONLY");

  Packet ack;
  ack.opcode = kXrc | kAck;
  ack.xrc_srqn = 0x123456;  // not encoded: an ACK has no XRCETH
  ASSERT_EQ(encode(ack, nullptr, 0, out, sizeof out), 12u + 4 + 4);
  ASSERT_TRUE(decode(out, 20, &d));
  EXPECT_EQ(d.xrc_srqn, 0u);
  // Too short for its XRCETH: refused.
  Packet s;
  s.opcode = kXrc | kSendOnly;
  ASSERT_EQ(encode(s, nullptr, 0, out, sizeof out), 20u);
  EXPECT_EQ(decode_checked(out, 19, &d), DecodeError::kTooShort);
  EXPECT_EQ(decode_checked(out, 15, &d), DecodeError::kTooShort);
}

// XRC SEND LAST/ONLY WITH INVALIDATE (0xB6, 0xB7): the XRCETH first, then the IETH (the
// R_Key to invalidate); IBA 1.5's FLUSH (0xBC) and ATOMIC WRITE (0xBD) are no XRC opcodes.
TEST(RocePacketTest, XrcSendWithInvalidateByteExact) {
  Packet w;
  w.opcode = kXrc | kSendOnlyInv;
  w.dest_qp = 0x000042;
  w.psn = 9;
  w.xrc_srqn = 0x123456;
  w.inv_rkey = 0xa1b2c3d4;  // host order
  const uint8_t data[3] = {5, 6, 7};
  uint8_t out[64] = {};
  ASSERT_EQ(encode(w, data, 3, out, sizeof out), 12u + 4 + 4 + 3 + 1 + 4);  // pad to 4
  EXPECT_EQ(out[0], 0xb7);
  const uint8_t xrceth_ieth[8] = {0, 0x12, 0x34, 0x56, 0xa1, 0xb2, 0xc3, 0xd4};
  EXPECT_EQ(memcmp(out + 12, xrceth_ieth, 8), 0);
  EXPECT_EQ(memcmp(out + 20, data, 3), 0);
  Packet d;
  ASSERT_TRUE(decode(out, 28, &d));
  EXPECT_EQ(d.xrc_srqn, 0x123456u);
  EXPECT_EQ(d.inv_rkey, 0xa1b2c3d4u);
  EXPECT_EQ(d.payload_len, 3u);
  EXPECT_STREQ(opcode_info(kXrc | kSendOnlyInv).name, "XRC_SEND_ONLY_WITH_INVALIDATE");
  EXPECT_STREQ(opcode_info(kXrc | kSendLastInv).name, "XRC_SEND_LAST_WITH_INVALIDATE");
  EXPECT_EQ(header_bytes(kXrc | kSendLastInv), 12u + 4 + 4);
  EXPECT_EQ(header_bytes(kXrc | kFlush), 0u);
  EXPECT_EQ(header_bytes(kXrc | kAtomicWrite), 0u);
}

TEST(RocePacketTest, EveryOpcodeRoundTrips) {
  std::vector<uint8_t> payload(4096 + 3);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7 + 1);
  std::vector<uint8_t> buf(8192);
  int checked = 0;
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(uint8_t(op));
    if (info.flags == 0) continue;
    const Packet p = full_packet(uint8_t(op));
    std::vector<uint32_t> lengths = {0};
    if (info.flags & kHasPayload) {
      lengths = {256, 4096};  // FIRST and MIDDLE packets: whole MTUs
      if (info.flags & (kLast | kOnly)) lengths.insert(lengths.end(), {0, 1, 2, 3, 4, 5, 4099});
    }
    for (uint32_t len : lengths) {
      const size_t n = encode(p, payload.data(), len, buf.data(), buf.size());
      ASSERT_EQ(n, datagram_bytes(uint8_t(op), len)) << info.name << " " << len;
      ASSERT_EQ(n % 4, 0u);
      Packet d;
      ASSERT_EQ(decode_checked(buf.data(), n, &d), DecodeError::kOk) << info.name << " " << len;
      EXPECT_TRUE(same_fields(p, d)) << info.name;
      EXPECT_EQ(d.pad, pad_bytes(len));
      ASSERT_EQ(d.payload_len, len);
      if (len != 0) {
        EXPECT_EQ(d.payload, buf.data() + header_bytes(uint8_t(op)));
        EXPECT_EQ(memcmp(d.payload, payload.data(), len), 0);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
}

TEST(RocePacketTest, EncodeRefusesWhatDecodeWouldRefuse) {
  uint8_t buf[128];
  const uint8_t data[8] = {};
  Packet p = full_packet(kRc | kReadRequest);
  EXPECT_EQ(encode(p, data, 4, buf, sizeof buf), 0u);  // READ request carries no payload
  p.opcode = kRc | kSendFirst;
  EXPECT_EQ(encode(p, data, 5, buf, sizeof buf), 0u);  // FIRST would need pad
  p.opcode = 0x15;
  EXPECT_EQ(encode(p, data, 0, buf, sizeof buf), 0u);
  p.opcode = kRc | kSendOnly;
  EXPECT_EQ(encode(p, nullptr, 4, buf, sizeof buf), 0u);
  EXPECT_EQ(encode_headers(p, 0, buf, 11), 0u);
  EXPECT_EQ(encode_headers(p, 0, buf, 12), 12u);
}

// A valid datagram of `opcode` with `len` payload bytes, for the refusal tests.
std::vector<uint8_t> valid(uint8_t opcode, uint32_t len) {
  std::vector<uint8_t> buf(datagram_bytes(opcode, len));
  std::vector<uint8_t> payload(len, 0x5a);
  EXPECT_EQ(encode(full_packet(opcode), payload.data(), len, buf.data(), buf.size()), buf.size());
  return buf;
}

DecodeError decode_vec(const std::vector<uint8_t>& b) {
  Packet p;
  return decode_checked(b.data(), b.size(), &p);
}

TEST(RocePacketTest, DecodeRefusesMalformed) {
  Packet p;
  EXPECT_EQ(decode_checked(nullptr, 0, &p), DecodeError::kTooShort);

  auto b = valid(kRc | kSendOnly, 5);
  ASSERT_EQ(decode_vec(b), DecodeError::kOk);
  b[0] = 0x15;
  EXPECT_EQ(decode_vec(b), DecodeError::kBadOpcode);
  b[0] = kRd | kSendOnly;
  EXPECT_EQ(decode_vec(b), DecodeError::kBadOpcode);
  b[0] = kUc | kReadRequest;
  EXPECT_EQ(decode_vec(b), DecodeError::kBadOpcode);

  b = valid(kRc | kSendOnly, 8);
  b[1] |= 0x01;  // TVer 1
  EXPECT_EQ(decode_vec(b), DecodeError::kBadVersion);
  b = valid(kRc | kSendOnly, 0);
  b[1] |= 0x10;  // pad 1 with no payload
  EXPECT_EQ(decode_vec(b), DecodeError::kBadPad);
  b = valid(kRc | kSendFirst, 256);
  b[1] |= 0x20;  // pad on a FIRST packet
  EXPECT_EQ(decode_vec(b), DecodeError::kBadPad);
  b = valid(kRc | kSendOnly, 1);  // payload 1 + pad 3
  b[1] = uint8_t(b[1] & ~0x30);   // pad 0: the pad bytes become payload, fine
  EXPECT_EQ(decode_vec(b), DecodeError::kOk);

  // Bytes between headers and ICRC on opcodes that carry none.
  for (uint8_t op : {uint8_t(kRc | kAck), uint8_t(kRc | kReadRequest), uint8_t(kRc | kAtomicAck),
                     uint8_t(kRc | kFetchAdd)}) {
    b = valid(op, 0);
    b.insert(b.begin() + 12, {0, 0, 0, 0});
    EXPECT_EQ(decode_vec(b), DecodeError::kPayloadNotAllowed) << int(op);
    const std::vector<uint8_t> cut(b.begin(), b.end() - 8);  // now short of its headers
    EXPECT_EQ(decode_vec(cut), DecodeError::kTooShort) << int(op);
  }

  // Every truncation of every opcode's datagram below its headers + ICRC.
  for (int op = 0; op < 256; ++op) {
    if (!opcode_valid(uint8_t(op))) continue;
    b = valid(uint8_t(op), 0);
    for (size_t n = 0; n < b.size(); ++n) {
      std::vector<uint8_t> cut(b.begin(), b.begin() + n);
      EXPECT_NE(decode_vec(cut), DecodeError::kOk) << int(op) << " " << n;
    }
  }

  // Pad larger than payload + pad bytes present (1 byte of body, pad 3).
  b = valid(kRc | kSendOnly, 4);
  b.erase(b.begin() + 12, b.begin() + 15);
  b[1] |= 0x30;
  EXPECT_EQ(decode_vec(b), DecodeError::kBadPad);
  b = std::vector<uint8_t>(kMaxDatagramBytes + 1);
  b[0] = kRc | kSendOnly;
  EXPECT_EQ(decode_vec(b), DecodeError::kTooLong);
}

// Reserved bits are ignored on receive, as IBA asks of receivers.
TEST(RocePacketTest, DecodeIgnoresReservedBits) {
  auto b = valid(kUd | kSendOnly, 4);
  b[4] |= 0x3f;   // BTH resv6
  b[8] |= 0x7f;   // BTH resv7
  b[16] = 0xff;   // DETH reserved byte
  Packet p;
  ASSERT_EQ(decode_checked(b.data(), b.size(), &p), DecodeError::kOk);
  EXPECT_EQ(p.psn, 0xfffffeu);
  EXPECT_EQ(p.src_qp, 1u);
  EXPECT_TRUE(p.fecn && p.becn && p.ack_req);
}

}  // namespace
}  // namespace softverbs::wire::roce
