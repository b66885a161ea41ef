// The pcap writer: file and record headers as libpcap defines them, the synthesized frame
// (Ethernet, IPv4/IPv6, UDP with checksums) around the datagram, whole records from many
// threads at once, and open/close errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/pcap.hpp"

namespace softverbs::wire::roce {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> out;
  FILE* f = fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  fclose(f);
  return out;
}

uint32_t le32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
uint32_t be16(const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; }

// RFC 1071 sum over a buffer; 0xffff when the checksum inside is right.
uint32_t ones_sum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += be16(p + i);
  if (n & 1) sum += uint32_t(p[n - 1]) << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return sum;
}

class RocePcapTest : public ::testing::Test {
 protected:
  std::string path = "/tmp/roce_pcap_test." + std::to_string(getpid()) + ".pcap";
  void TearDown() override { unlink(path.c_str()); }
};

TEST_F(RocePcapTest, FrameLayoutIpv4) {
  Packet p;
  p.opcode = kRc | kSendOnly;
  p.dest_qp = 5;
  uint8_t d[64];
  const size_t n = encode(p, reinterpret_cast<const uint8_t*>("abc"), 3, d, sizeof d);
  const uint8_t a[4] = {10, 1, 2, 3}, b[4] = {10, 1, 2, 4};
  IcrcContext c = IcrcContext::from_ipv4(a, b, 50000);
  c.ipv4_id = 0x0102;
  icrc_fill(c, d, n);
  uint8_t f[128];
  const size_t len = ethernet_frame(c, d, n, f, sizeof f);
  ASSERT_EQ(len, 14 + 20 + 8 + n);
  EXPECT_EQ(be16(f + 12), 0x0800u);
  const uint8_t* ip = f + 14;
  EXPECT_EQ(ip[0], 0x45);
  EXPECT_EQ(be16(ip + 2), 20 + 8 + n);
  EXPECT_EQ(be16(ip + 4), 0x0102u);
  EXPECT_EQ(be16(ip + 6), 0x4000u);  // DF
  EXPECT_EQ(ip[9], 17);
  EXPECT_EQ(ones_sum(ip, 20), 0xffffu);
  EXPECT_EQ(memcmp(ip + 12, a, 4), 0);
  EXPECT_EQ(memcmp(ip + 16, b, 4), 0);
  const uint8_t* udp = ip + 20;
  EXPECT_EQ(be16(udp), 50000u);
  EXPECT_EQ(be16(udp + 2), 4791u);
  EXPECT_EQ(be16(udp + 4), 8 + n);
  // UDP checksum over the pseudo-header (addresses, protocol, length) and the datagram.
  uint32_t pseudo = ones_sum(ip + 12, 8, 17 + uint32_t(8 + n));
  EXPECT_EQ(ones_sum(udp, 8 + n, pseudo), 0xffffu);
  EXPECT_EQ(memcmp(udp + 8, d, n), 0);
  EXPECT_EQ(ethernet_frame(c, d, n, f, 14 + 20 + 8 + n - 1), 0u);
}

TEST_F(RocePcapTest, FrameLayoutIpv6) {
  uint8_t d[16] = {kRc | kAck};
  uint8_t s6[16] = {0xfe, 0x80}, d6[16] = {0xfe, 0x80};
  s6[15] = 1;
  d6[15] = 2;
  IcrcContext c = IcrcContext::from_gids(s6, d6, 1000);
  uint8_t f[128];
  ASSERT_EQ(ethernet_frame(c, d, sizeof d, f, sizeof f), 14 + 40 + 8 + sizeof d);
  EXPECT_EQ(be16(f + 12), 0x86ddu);
  const uint8_t* ip = f + 14;
  EXPECT_EQ(ip[0] >> 4, 6);
  EXPECT_EQ(be16(ip + 4), 8 + sizeof d);
  EXPECT_EQ(ip[6], 17);
  uint32_t pseudo = ones_sum(ip + 8, 32, 17 + uint32_t(8 + sizeof d));
  EXPECT_EQ(ones_sum(ip + 40, 8 + sizeof d, pseudo), 0xffffu);
  EXPECT_NE(be16(ip + 40 + 6), 0u);  // IPv6 UDP needs a checksum
}

TEST_F(RocePcapTest, ThreadsWriteWholeRecords) {
  PcapWriter w;
  EXPECT_FALSE(w.write(IcrcContext{}, nullptr, 0));  // not open
  ASSERT_TRUE(w.open(path.c_str()));
  EXPECT_TRUE(w.is_open());
  EXPECT_FALSE(w.open(path.c_str()));
  const int kThreads = 4, kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&w, t] {
      std::vector<uint8_t> d(16 + 4 * t, uint8_t(t));  // thread t: its byte, its length
      const uint8_t a[4] = {1, 1, 1, 1};
      for (int i = 0; i < kEach; ++i) {
        EXPECT_TRUE(w.write(IcrcContext::from_ipv4(a, a, 1), d.data(), d.size(),
                            timespec{1700000000 + i, 999999999}));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(w.close());
  EXPECT_TRUE(w.close());
  EXPECT_FALSE(w.is_open());

  const auto file = read_file(path);
  ASSERT_GE(file.size(), 24u);
  EXPECT_EQ(le32(file.data()), 0xa1b23c4du);          // nanosecond timestamps
  EXPECT_EQ(le32(file.data() + 4), 2u | 4u << 16);    // version 2.4
  EXPECT_EQ(le32(file.data() + 20), 1u);              // LINKTYPE_ETHERNET
  size_t at = 24;
  int per_thread[kThreads] = {};
  while (at + 16 <= file.size()) {
    EXPECT_EQ(le32(file.data() + at + 4), 999999999u);
    const uint32_t caplen = le32(file.data() + at + 8);
    ASSERT_EQ(caplen, le32(file.data() + at + 12));
    ASSERT_LE(at + 16 + caplen, file.size());
    const uint8_t* frame = file.data() + at + 16;
    const size_t dlen = caplen - 42;
    const int t = frame[42];
    ASSERT_LT(t, kThreads);
    ASSERT_EQ(dlen, 16u + 4 * t);
    for (size_t i = 0; i < dlen; ++i) ASSERT_EQ(frame[42 + i], t);
    ++per_thread[t];
    at += 16 + caplen;
  }
  EXPECT_EQ(at, file.size());
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(per_thread[t], kEach);
}

TEST_F(RocePcapTest, OpenFailsOnBadPath) {
  PcapWriter w;
  EXPECT_FALSE(w.open("/nonexistent-dir/x.pcap"));
  EXPECT_FALSE(w.is_open());
  EXPECT_TRUE(w.close());
}

}  // namespace
}  // namespace softverbs::wire::roce
