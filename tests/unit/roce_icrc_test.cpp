// RoCE v2 ICRC: the CRC against its standard check value, known answers computed
// independently (python's zlib.crc32 over the masked bytes, written out below), and the
// receive-side search for the hidden IPv4 ID against an exhaustive search.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {
namespace {

const uint8_t kSrc4[4] = {10, 0, 0, 1};
const uint8_t kDst4[4] = {10, 0, 0, 2};

TEST(RoceIcrcTest, Crc32MatchesTheStandardCheckValue) {
  const char* check = "123456789";
  EXPECT_EQ(~crc32_update(0xffffffff, reinterpret_cast<const uint8_t*>(check), 9), 0xcbf43926u);
  // rxe seeds its register with 0xdebb20e3: ones run through 8 bytes of 0xff (the LRH).
  const uint8_t lrh[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  EXPECT_EQ(crc32_update(0xffffffff, lrh, 8), 0xdebb20e3u);
  // Word-at-a-time and byte-at-a-time agree at every length and alignment.
  std::vector<uint8_t> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 37 + 11);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; start + n <= data.size(); n += 7) {
      uint32_t bytewise = 0x12345678;
      for (size_t i = 0; i < n; ++i) bytewise = crc32_update(bytewise, &data[start + i], 1);
      EXPECT_EQ(crc32_update(0x12345678, data.data() + start, n), bytewise);
    }
  }
}

// RC SEND_ONLY to QP 0x11, PSN 1, A set, payload "hello" (pad 3), 10.0.0.1:49152 ->
// 10.0.0.2:4791. Reference, computed with python 3 (zlib), independent of our code:
//   bth = bytes([4,0x30,0xff,0xff, 0,0,0,0x11, 0x80,0,0,1]); d = bth + b"hello\0\0\0"
//   L = len(d) + 4; u = L + 8
//   ip = bytes([0x45,0xff]) + pack(">H", u+20) + bytes([0,0, 0x40,0, 0xff,17, 0xff,0xff,
//        10,0,0,1, 10,0,0,2])            # ID 0, DF; TOS, TTL, checksum as ones
//   udp = pack(">HHH", 49152, 4791, u) + b"\xff\xff"
//   zlib.crc32(b"\xff"*8 + ip + udp + bth[:4] + b"\xff" + bth[5:] + d[12:])  -> 0x616d5145
//   the same with ID 0x1234                                                   -> 0x1849f8d4
//   IPv6 fe80::1 -> fe80::2: ip = bytes([0x6f,0xff,0xff,0xff]) + pack(">H", u) +
//        bytes([17, 0xff]) + src + dst                                        -> 0xb8a9c2d1
std::vector<uint8_t> hello_packet() {
  Packet p;
  p.opcode = kRc | kSendOnly;
  p.dest_qp = 0x11;
  p.psn = 1;
  p.ack_req = true;
  std::vector<uint8_t> d(datagram_bytes(p.opcode, 5));
  EXPECT_EQ(encode(p, reinterpret_cast<const uint8_t*>("hello"), 5, d.data(), d.size()), 24u);
  return d;
}

// crc32_update takes long runs by carry-less multiplication (or zlib) and the rest by
// tables: at every length, offset (alignment) and register value, all must agree with zlib.
TEST(RoceIcrcTest, Crc32AgreesWithZlibAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(70000);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (int trial = 0; trial < 4000; ++trial) {
    size_t offset = rng() % 64;
    size_t len = trial < 2000 ? trial % 300 : rng() % 65000;
    uint32_t reg = rng();
    uint32_t want = ~static_cast<uint32_t>(::crc32(~reg, buf.data() + offset, static_cast<uInt>(len)));
    ASSERT_EQ(crc32_update(reg, buf.data() + offset, len), want)
        << "length " << len << " offset " << offset;
  }
}

TEST(RoceIcrcTest, KnownAnswers) {
  auto d = hello_packet();
  IcrcContext v4 = IcrcContext::from_ipv4(kSrc4, kDst4, 49152);
  EXPECT_FALSE(v4.ipv6);
  EXPECT_EQ(icrc(v4, d.data(), d.size() - 4), 0x616d5145u);
  icrc_fill(v4, d.data(), d.size());
  const uint8_t stored[4] = {0x45, 0x51, 0x6d, 0x61};  // least significant byte first
  EXPECT_EQ(memcmp(d.data() + 20, stored, 4), 0);
  EXPECT_TRUE(icrc_check_exact(v4, d.data(), d.size()));

  IcrcContext id = v4;
  id.ipv4_id = 0x1234;
  EXPECT_EQ(icrc(id, d.data(), d.size() - 4), 0x1849f8d4u);

  uint8_t a[16] = {0xfe, 0x80}, b[16] = {0xfe, 0x80};
  a[15] = 1;
  b[15] = 2;
  IcrcContext v6 = IcrcContext::from_gids(a, b, 49152);
  EXPECT_TRUE(v6.ipv6);
  EXPECT_EQ(icrc(v6, d.data(), d.size() - 4), 0xb8a9c2d1u);
}

// Masked fields do not change the ICRC: FECN/BECN/resv6 in the BTH.
TEST(RoceIcrcTest, VariantBthBitsAreMasked) {
  auto d = hello_packet();
  IcrcContext c = IcrcContext::from_ipv4(kSrc4, kDst4, 49152);
  const uint32_t before = icrc(c, d.data(), d.size() - 4);
  d[4] = 0xc0 | 0x15;
  EXPECT_EQ(icrc(c, d.data(), d.size() - 4), before);
  d[5] ^= 1;  // the QPN is not masked
  EXPECT_NE(icrc(c, d.data(), d.size() - 4), before);
}

TEST(RoceIcrcTest, BuilderMatchesWholeAtEverySplit) {
  std::vector<uint8_t> d(64);
  for (size_t i = 0; i < d.size(); ++i) d[i] = uint8_t(i * 13 + 5);
  IcrcContext c = IcrcContext::from_ipv4(kSrc4, kDst4, 1234);
  const uint32_t whole = icrc(c, d.data(), d.size() - 4);
  for (size_t i = 0; i <= d.size() - 4; ++i) {
    for (size_t j = i; j <= d.size() - 4; j += 3) {
      IcrcBuilder b(c, d.size());
      b.add(d.data(), i);
      b.add(d.data() + i, j - i);
      b.add(d.data() + j, d.size() - 4 - j);
      ASSERT_EQ(b.value(), whole) << i << " " << j;
    }
  }
}

// The masked BTH byte is applied as the first block is loaded, and the carry-less paths take
// any length (their last partial block folded whole): at every length, alignment and value
// of byte 4, the whole-datagram ICRC agrees with a builder fed one byte at a time (which
// masks by feeding a 0xff byte, through the tables), and so does one fed in two pieces.
TEST(RoceIcrcTest, MaskedRunMatchesBytewiseAtEveryLengthAndAlignment) {
  std::mt19937 rng(11);
  std::vector<uint8_t> buf(9100);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  IcrcContext c = IcrcContext::from_ipv4(kSrc4, kDst4, 1234);
  for (int trial = 0; trial < 1500; ++trial) {
    const size_t offset = rng() % 64;
    const size_t len = trial < 1200 ? 4 + size_t(trial) % 600 : 4 + rng() % 9000;  // ICRC included
    uint8_t* d = buf.data() + offset;
    if (len > 8) d[4] = static_cast<uint8_t>(rng());
    IcrcBuilder bytewise(c, len);
    for (size_t i = 0; i + 4 < len; ++i) bytewise.add(d + i, 1);
    ASSERT_EQ(icrc(c, d, len - 4), bytewise.value()) << "length " << len << " offset " << offset;
    // A sender's pieces: the headers first (masked as a run from offset 0), then the rest.
    const size_t header = std::min(len - 4, size_t(rng() % 64));
    IcrcBuilder pieces(c, len);
    pieces.add(d, header);
    pieces.add(d + header, len - 4 - header);
    ASSERT_EQ(pieces.value(), bytewise.value()) << "length " << len << " split " << header;
  }
}

// The solver against trying all 2^17 (ID, DF): the one pair it names must be the only one.
TEST(RoceIcrcTest, SomeIdCheckAgreesWithExhaustiveSearch) {
  std::mt19937 rng(7);
  for (uint32_t len : {0u, 1u, 200u, 301u}) {
    Packet p;
    p.opcode = kRc | kWriteOnly;
    p.dest_qp = 0x42;
    std::vector<uint8_t> payload(len);
    for (auto& x : payload) x = uint8_t(rng());
    std::vector<uint8_t> d(datagram_bytes(p.opcode, len));
    ASSERT_EQ(encode(p, payload.data(), len, d.data(), d.size()), d.size());
    IcrcContext sender = IcrcContext::from_ipv4(kSrc4, kDst4, 0xc123);
    sender.ipv4_id = uint16_t(rng());
    sender.ipv4_df = len != 200;  // one case without DF
    icrc_fill(sender, d.data(), d.size());

    IcrcContext receiver = IcrcContext::from_ipv4(kSrc4, kDst4, 0xc123);  // ID 0, DF
    const IcrcCheck check = icrc_check(receiver, d.data(), d.size());
    ASSERT_EQ(check.result, IcrcCheck::kSomeIpv4Id) << len;
    EXPECT_EQ(check.ipv4_id, sender.ipv4_id);
    EXPECT_EQ(check.ipv4_df, sender.ipv4_df);
    EXPECT_FALSE(icrc_check_exact(receiver, d.data(), d.size()));

    int matches = 0;
    const uint32_t stored = icrc_stored(d.data(), d.size());
    for (uint32_t v = 0; v < (1u << 17); ++v) {
      IcrcContext t = receiver;
      t.ipv4_id = uint16_t(v);
      t.ipv4_df = v >> 16;
      if (icrc(t, d.data(), d.size() - 4) == stored) ++matches;
    }
    EXPECT_EQ(matches, 1) << len;

    // Anything else wrong: a flipped payload, header or ICRC bit, or another address.
    for (size_t bit : {size_t(0), size_t(8 * 5 + 3), d.size() * 8 - 40, d.size() * 8 - 1}) {
      d[bit / 8] ^= uint8_t(1u << (bit % 8));
      EXPECT_FALSE(icrc_check(receiver, d.data(), d.size()).ok()) << len << " bit " << bit;
      d[bit / 8] ^= uint8_t(1u << (bit % 8));
    }
    IcrcContext other = receiver;
    other.src_port ^= 1;
    EXPECT_FALSE(icrc_check(other, d.data(), d.size()).ok());
  }
}

// Lengths that share a slot of the per-thread solver cache, in turns, and many others.
TEST(RoceIcrcTest, SomeIdCheckAcrossLengths) {
  std::vector<uint8_t> payload(1024, 0x3c);
  const IcrcContext receiver = IcrcContext::from_ipv4(kSrc4, kDst4, 0xc000);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t len = 0; len <= 256; len += 4 + 28 * (round == 1)) {
      Packet p;
      p.opcode = kRc | kSendOnly;
      std::vector<uint8_t> d(datagram_bytes(p.opcode, len));
      ASSERT_EQ(encode(p, payload.data(), len, d.data(), d.size()), d.size());
      IcrcContext sender = receiver;
      sender.ipv4_id = uint16_t(0x8000 + len * 3 + round);
      icrc_fill(sender, d.data(), d.size());
      const IcrcCheck check = icrc_check(receiver, d.data(), d.size());
      ASSERT_EQ(check.result, IcrcCheck::kSomeIpv4Id) << len;
      EXPECT_EQ(check.ipv4_id, sender.ipv4_id) << len;
      d[d.size() / 2] ^= 0x10;
      EXPECT_FALSE(icrc_check(receiver, d.data(), d.size()).ok()) << len;
    }
  }
}

// The per-thread caches (the pseudo-header's CRC per flow and length with ID 0, the ID's
// part per length) give what the whole computation gives: for an ID the thread has no
// solver for yet and one it has, for flows and lengths taken in turns. And a receiver that
// expects the sender's ID (on_datagram guesses the next of a GSO send) gets kExact with it;
// a wrong guess still finds the ID.
TEST(RoceIcrcTest, CachedPartsAgreeAndTheExpectedIdIsExact) {
  std::vector<uint8_t> payload(1024);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 13 + 1);
  auto datagram = [&](uint32_t len) {
    Packet p;
    p.opcode = kRc | kWriteOnly;
    p.dest_qp = 0x77;
    std::vector<uint8_t> d(datagram_bytes(p.opcode, len));
    EXPECT_EQ(encode(p, payload.data(), len, d.data(), d.size()), d.size());
    return d;
  };
  // What a fresh thread computes (no cache of any kind yet) is the reference.
  auto fresh = [](const IcrcContext& c, const std::vector<uint8_t>& d) {
    uint32_t v = 0;
    std::thread([&] { v = icrc(c, d.data(), d.size() - 4); }).join();
    return v;
  };
  const uint32_t lengths[] = {1024, 20, 1024, 512, 20};
  for (int round = 0; round < 2; ++round) {
    for (uint16_t port : {uint16_t(0xc001), uint16_t(0xc002)}) {
      for (uint32_t len : lengths) {
        auto d = datagram(len);
        IcrcContext sender = IcrcContext::from_ipv4(kSrc4, kDst4, port);
        sender.ipv4_id = uint16_t(len + port + round);
        const uint32_t want = fresh(sender, d);
        ASSERT_EQ(icrc(sender, d.data(), d.size() - 4), want) << len << " " << round;
        icrc_fill(sender, d.data(), d.size());
        IcrcContext receiver = sender;
        const IcrcCheck exact = icrc_check(receiver, d.data(), d.size());
        EXPECT_EQ(exact.result, IcrcCheck::kExact) << len;
        EXPECT_EQ(exact.ipv4_id, sender.ipv4_id);
        receiver.ipv4_id = uint16_t(sender.ipv4_id + 1);  // a wrong guess
        const IcrcCheck found = icrc_check(receiver, d.data(), d.size());
        EXPECT_EQ(found.result, IcrcCheck::kSomeIpv4Id) << len;
        EXPECT_EQ(found.ipv4_id, sender.ipv4_id);
        // Now this thread has the solver of this length: the sender's path with it agrees.
        ASSERT_EQ(icrc(sender, d.data(), d.size() - 4), want) << len << " " << round;
        // ID 0 under a guess is found too; another flow's datagram is not taken.
        sender.ipv4_id = 0;
        icrc_fill(sender, d.data(), d.size());
        const IcrcCheck zero = icrc_check(receiver, d.data(), d.size());
        EXPECT_TRUE(zero.ok());
        EXPECT_EQ(zero.ipv4_id, 0);
        IcrcContext other = receiver;
        other.src_port ^= 3;
        EXPECT_FALSE(icrc_check(other, d.data(), d.size()).ok()) << len;
      }
    }
  }
}

TEST(RoceIcrcTest, ExactFirstAndNoIdSearchOverIpv6) {
  auto d = hello_packet();
  IcrcContext c = IcrcContext::from_ipv4(kSrc4, kDst4, 49152);
  icrc_fill(c, d.data(), d.size());
  IcrcCheck check = icrc_check(c, d.data(), d.size());
  EXPECT_EQ(check.result, IcrcCheck::kExact);
  EXPECT_EQ(check.ipv4_id, 0);
  EXPECT_TRUE(check.ipv4_df);

  uint8_t a[16] = {0x20, 0x01, 0xd, 0xb8}, b[16] = {0x20, 0x01, 0xd, 0xb8};
  b[15] = 9;
  IcrcContext v6 = IcrcContext::from_gids(a, b, 49152);
  icrc_fill(v6, d.data(), d.size());
  EXPECT_EQ(icrc_check(v6, d.data(), d.size()).result, IcrcCheck::kExact);
  d[13] ^= 0x40;
  EXPECT_EQ(icrc_check(v6, d.data(), d.size()).result, IcrcCheck::kBad);
  EXPECT_FALSE(icrc_check(v6, d.data(), 3).ok());
}

// The strength the some-ID check gives up, measured: of all single-bit errors in a 4 KiB
// WRITE, how many it accepts (the exact check accepts none). Expect about bits / 2^15.
TEST(RoceIcrcTest, SingleBitErrorsTheSomeIdCheckMisses) {
  const uint32_t len = 4096;
  Packet p;
  p.opcode = kRc | kWriteOnly;
  std::vector<uint8_t> payload(len, 0xa5);
  std::vector<uint8_t> d(datagram_bytes(p.opcode, len));
  ASSERT_EQ(encode(p, payload.data(), len, d.data(), d.size()), d.size());
  IcrcContext c = IcrcContext::from_ipv4(kSrc4, kDst4, 0xc000);
  icrc_fill(c, d.data(), d.size());
  int missed = 0;
  for (size_t bit = 0; bit < d.size() * 8; ++bit) {
    if (bit / 8 == 4) continue;  // FECN, BECN, resv6: masked, not covered
    d[bit / 8] ^= uint8_t(1u << (bit % 8));
    EXPECT_FALSE(icrc_check_exact(c, d.data(), d.size()));
    missed += icrc_check(c, d.data(), d.size()).ok();
    d[bit / 8] ^= uint8_t(1u << (bit % 8));
  }
  std::printf("some-ID check: %d of %zu single-bit errors accepted\n", missed, d.size() * 8);
  EXPECT_LT(missed, 10);
}

}  // namespace
}  // namespace softverbs::wire::roce
