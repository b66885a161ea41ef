// decode() and icrc_check() on what a hostile or broken peer could send: random bytes, every
// truncation and random bit flips of valid datagrams of every opcode. Nothing may crash or
// read outside the datagram (each input sits in its own exactly-sized heap buffer, so ASan
// sees any overread), and whatever decodes must be self-consistent. Fixed seed.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {
namespace {

// Decodes a copy of [data, data + n) in a buffer of exactly n bytes; checks the invariants
// of an accepted packet. Returns whether it decoded.
bool decode_exact_copy(const uint8_t* data, size_t n) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n == 0 ? 1 : n]);
  if (n != 0) memcpy(copy.get(), data, n);
  const uint8_t* buf = n == 0 ? nullptr : copy.get();
  Packet p;
  const bool ok = decode(buf, n, &p);
  if (ok) {
    const OpcodeInfo& info = opcode_info(p.opcode);
    EXPECT_NE(info.flags, 0u);
    EXPECT_EQ(size_t(info.header_bytes) + p.payload_len + p.pad + kIcrcBytes, n);
    if (p.payload_len != 0) {
      EXPECT_TRUE(info.flags & kHasPayload);
      EXPECT_EQ(p.payload, buf + info.header_bytes);
    }
    EXPECT_LE(p.dest_qp, 0xffffffu);
    EXPECT_LE(p.psn, 0xffffffu);
  }
  const IcrcContext ctx;
  (void)icrc_check(ctx, buf, n);
  return ok;
}

std::vector<std::vector<uint8_t>> valid_datagrams(std::mt19937& rng) {
  std::vector<std::vector<uint8_t>> out;
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(uint8_t(op));
    if (info.flags == 0) continue;
    for (uint32_t len : {0u, 3u, 64u}) {
      if (len != 0 && !(info.flags & kHasPayload)) continue;
      if (len == 3 && !(info.flags & (kLast | kOnly))) continue;
      Packet p;
      p.opcode = uint8_t(op);
      p.dest_qp = rng() & 0xffffff;
      p.psn = rng() & 0xffffff;
      std::vector<uint8_t> payload(len);
      for (auto& b : payload) b = uint8_t(rng());
      std::vector<uint8_t> d(datagram_bytes(p.opcode, len));
      EXPECT_EQ(encode(p, payload.data(), len, d.data(), d.size()), d.size());
      out.push_back(std::move(d));
    }
  }
  return out;
}

TEST(RoceFuzzTest, DecodeNeverMisbehaves) {
  std::mt19937 rng(20261124);
  const auto valid = valid_datagrams(rng);
  ASSERT_GT(valid.size(), 60u);
  int decoded = 0, iterations = 0;

  // Every truncation of every valid datagram. Without payload only the whole one decodes
  // (with payload a shorter one can: a shorter payload, whose ICRC will not match).
  for (const auto& d : valid) {
    const bool has_payload = opcode_info(d[0]).flags & kHasPayload;
    for (size_t n = 0; n <= d.size(); ++n, ++iterations) {
      const bool ok = decode_exact_copy(d.data(), n);
      if (!has_payload) {
        EXPECT_EQ(ok, n == d.size()) << int(d[0]) << " " << n;
      }
      decoded += ok;
    }
  }
  // Random flips of 1..4 bits, and random lengths around the valid one.
  std::vector<uint8_t> buf;
  for (int i = 0; i < 60000; ++i, ++iterations) {
    const auto& d = valid[rng() % valid.size()];
    buf = d;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) buf[rng() % buf.size()] ^= uint8_t(1u << (rng() % 8));
    if (rng() % 4 == 0) buf.resize(rng() % (d.size() + 8), 0xee);
    decoded += decode_exact_copy(buf.data(), buf.size());
  }
  // Random bytes of random length, with a valid opcode half the time.
  for (int i = 0; i < 40000; ++i, ++iterations) {
    buf.resize(rng() % 96);
    for (auto& b : buf) b = uint8_t(rng());
    if (!buf.empty() && rng() % 2) buf[0] = valid[rng() % valid.size()][0];
    if (buf.size() > 1 && rng() % 2) buf[1] &= 0xf0;  // TVer 0
    decoded += decode_exact_copy(buf.data(), buf.size());
  }
  std::printf("%d inputs, %d decoded\n", iterations, decoded);
  EXPECT_GT(iterations, 100000);
  EXPECT_GT(decoded, 1000);  // the mutations do reach the field parsers
}

}  // namespace
}  // namespace softverbs::wire::roce
