// Real frames against our ICRC and decoder: what Linux rxe sent (its IP IDs are a counter,
// never 0) and what our prober's kernel sent for it (ID 0, DF), captured on a veth in the
// rxe-vm guest (rxe_capture/capture.sh; frames in roce_rxe_frames.inc). rxe answered every
// request our prober built with encode() and icrc_fill(), so rxe accepted those ICRCs too.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {
namespace {

#include "roce_rxe_frames.inc"

struct Parsed {
  IcrcContext sent;      // the IP and UDP header as on the wire
  IcrcContext receiver;  // what a UDP socket tells: no ID, DF assumed
  const uint8_t* dgram;
  size_t len;
};

Parsed parse(const RxeFrame& f) {
  const uint8_t* ip = f.bytes + 14;
  const uint8_t* udp = ip + 20;
  EXPECT_EQ(ip[0], 0x45);
  const uint16_t sport = uint16_t(udp[0] << 8 | udp[1]), dport = uint16_t(udp[2] << 8 | udp[3]);
  Parsed p;
  p.sent = IcrcContext::from_ipv4(ip + 12, ip + 16, sport, dport);
  p.sent.ipv4_id = uint16_t(ip[4] << 8 | ip[5]);
  p.sent.ipv4_df = ip[6] & 0x40;
  p.receiver = IcrcContext::from_ipv4(ip + 12, ip + 16, sport, dport);
  p.dgram = udp + 8;
  p.len = f.len - 14 - 20 - 8;
  EXPECT_EQ(size_t(udp[4] << 8 | udp[5]), p.len + 8);
  return p;
}

TEST(RoceRxeFramesTest, IcrcMatchesExactlyWithTheWireHeader) {
  for (const RxeFrame& f : kRxeFrames) {
    const Parsed p = parse(f);
    EXPECT_TRUE(icrc_check_exact(p.sent, p.dgram, p.len)) << f.what;
    EXPECT_EQ(icrc(p.sent, p.dgram, p.len - 4), icrc_stored(p.dgram, p.len)) << f.what;
  }
}

TEST(RoceRxeFramesTest, ReceiverFindsTheHiddenIpv4Id) {
  int some_id = 0;
  for (const RxeFrame& f : kRxeFrames) {
    const Parsed p = parse(f);
    const IcrcCheck c = icrc_check(p.receiver, p.dgram, p.len);
    ASSERT_TRUE(c.ok()) << f.what;
    EXPECT_EQ(c.ipv4_id, p.sent.ipv4_id) << f.what;
    EXPECT_EQ(c.ipv4_df, p.sent.ipv4_df) << f.what;
    if (p.sent.ipv4_id != 0) {
      EXPECT_EQ(c.result, IcrcCheck::kSomeIpv4Id) << f.what;
      ++some_id;
    } else {
      EXPECT_EQ(c.result, IcrcCheck::kExact) << f.what;  // ours: ID 0, DF
    }
  }
  EXPECT_GE(some_id, 10);
}

// Every single-bit error in every frame's datagram (bar the masked BTH byte 4) fails the
// exact check. The some-ID check rejects nearly all: as icrc.hpp says, about one bit
// position in 2^15 can flip and still match with some other ID (measured here: one in the
// 1040-byte SEND_FIRST, none in the others), and then it names an ID that is not the one
// sent. Another address or port fails both.
TEST(RoceRxeFramesTest, BitFlipsAreRejected) {
  size_t bits = 0, accepted = 0;
  for (const RxeFrame& f : kRxeFrames) {
    const Parsed p = parse(f);
    std::basic_string<uint8_t> d(p.dgram, p.len);
    for (size_t bit = 0; bit < d.size() * 8; ++bit) {
      if (bit / 8 == 4) continue;
      d[bit / 8] ^= uint8_t(1u << (bit % 8));
      ASSERT_FALSE(icrc_check_exact(p.sent, d.data(), d.size())) << f.what << " bit " << bit;
      const IcrcCheck c = icrc_check(p.receiver, d.data(), d.size());
      if (c.ok()) {
        EXPECT_FALSE(c.ipv4_id == p.sent.ipv4_id && c.ipv4_df == p.sent.ipv4_df);
        ++accepted;
      }
      ++bits;
      d[bit / 8] ^= uint8_t(1u << (bit % 8));
    }
    IcrcContext other = p.receiver;
    other.src_ip[15] ^= 1;
    EXPECT_FALSE(icrc_check(other, p.dgram, p.len).ok()) << f.what;
    other = p.receiver;
    other.src_port ^= 0x100;
    EXPECT_FALSE(icrc_check(other, p.dgram, p.len).ok()) << f.what;
  }
  std::printf("some-ID check accepted %zu of %zu single-bit errors\n", accepted, bits);
  EXPECT_LE(accepted * 4096, bits);  // expected bits / 32768
}

TEST(RoceRxeFramesTest, DecodesWhatRxeSent) {
  const uint32_t kImm = htonl(0x11223344);
  for (const RxeFrame& f : kRxeFrames) {
    const Parsed p = parse(f);
    Packet pkt;
    ASSERT_EQ(decode_checked(p.dgram, p.len, &pkt), DecodeError::kOk) << f.what;
    const OpcodeInfo& info = opcode_info(pkt.opcode);
    const std::string what = f.what;
    EXPECT_NE(what.find(info.name + 3), std::string::npos) << what << " decoded as " << info.name;
    EXPECT_EQ(pkt.pkey, 0xffff);
    const bool ours = what.find("ours") != std::string::npos;
    if (ours) {
      EXPECT_EQ(pkt.psn, 0x200u);
      EXPECT_EQ(pkt.payload_len, 14u);
      EXPECT_EQ(memcmp(pkt.payload, "from softverbs", 14), 0);
      continue;
    }
    if ((pkt.opcode & 0xe0) == kUd) {
      EXPECT_EQ(pkt.dest_qp, 0xdefu);
      EXPECT_EQ(pkt.qkey, 0x11111111u);
      EXPECT_EQ(pkt.psn, 0x55u + (pkt.opcode == (kUd | kSendOnlyImm)));
      EXPECT_EQ(pkt.payload_len, 10u + (pkt.opcode == (kUd | kSendOnlyImm)));
    } else if (info.flags & kResponse) {
      EXPECT_EQ(pkt.dest_qp, 0x777u);  // to our prober's QP
      EXPECT_EQ(pkt.syndrome & 0xe0, kAethAck);
      EXPECT_GE(pkt.psn, 0x200u);
    } else {
      EXPECT_EQ(pkt.dest_qp, 0xabcu);
      EXPECT_TRUE(pkt.ack_req || pkt.opcode == (kRc | kSendFirst));
      EXPECT_GE(pkt.psn, 0x1000u);
    }
    if (info.flags & kHasImm) {
      EXPECT_EQ(pkt.imm, (pkt.opcode & 0xe0) == kUd ? htonl(0xabcdef01) : kImm);
    }
    if (info.flags & kHasIeth) {
      EXPECT_EQ(pkt.inv_rkey, 0x5566u);
    }
    if (pkt.opcode == (kRc | kSendLast)) {
      EXPECT_EQ(pkt.pad, 3);
    }
    if (info.flags & kHasAtomicEth) {
      EXPECT_EQ(pkt.va, 0x7000001000u);
      EXPECT_EQ(pkt.rkey, 0x99u);
      EXPECT_EQ(pkt.swap_add, pkt.opcode == (kRc | kFetchAdd) ? 0xaaaau : 0xbbbbu);
    }
    if (pkt.opcode == (kRc | kAtomicAck)) {
      EXPECT_EQ(pkt.orig, 0x0808080808080808u);
    }
  }
}

}  // namespace
}  // namespace softverbs::wire::roce
