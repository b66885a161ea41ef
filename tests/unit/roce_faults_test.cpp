// SOFTVERBS_FAULTS (wire/roce/faults.hpp): the configuration's parser, and what drop,
// reorder and dup do to a stream of numbered datagrams given to a Faults.
#include "wire/roce/faults.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace rw = softverbs::wire::roce;

namespace {

// Collects what a Faults sends: the number each datagram carries.
struct Wire {
  std::mutex mu;
  std::vector<uint32_t> seen;
  rw::Faults::Sender sender() {
    return [this](const void* data, size_t size) {
      EXPECT_EQ(size, sizeof(uint32_t));
      uint32_t n;
      std::memcpy(&n, data, sizeof n);
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(n);
      return 0;
    };
  }
};

// Sends 0..count-1 through faults, then flushes what is held.
std::vector<uint32_t> run(rw::Faults& faults, uint32_t count) {
  Wire wire;
  for (uint32_t i = 0; i < count; ++i) faults.send(&i, sizeof i, wire.sender());
  faults.flush();
  return wire.seen;
}

rw::FaultConfig parsed(const char* text) {
  rw::FaultConfig c;
  std::string error;
  EXPECT_TRUE(rw::FaultConfig::parse(text, &c, &error)) << error;
  return c;
}

}  // namespace

TEST(RoceFaults, ParsesEveryKey) {
  rw::FaultConfig c = parsed("drop=1,reorder=5,dup=2,gap=3,delay_us=200,seed=42");
  EXPECT_EQ(c.drop, 1u);
  EXPECT_EQ(c.reorder, 5u);
  EXPECT_EQ(c.dup, 2u);
  EXPECT_EQ(c.gap, 3u);
  EXPECT_EQ(c.delay_us, 200u);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_TRUE(c.any());
  EXPECT_FALSE(parsed("seed=7,").any());
  EXPECT_FALSE(parsed("").any());
}

TEST(RoceFaults, RefusesBadInput) {
  for (const char* bad : {"drop", "drop=", "drop=x", "drop=101", "drop=-1", "gap=0", "gap=65",
                          "loss=3", "dup=1x", "seed=99999999999999999999999"}) {
    rw::FaultConfig c;
    std::string error;
    EXPECT_FALSE(rw::FaultConfig::parse(bad, &c, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
}

TEST(RoceFaults, DropAllAndDupAll) {
  rw::Faults drop_all(parsed("drop=100"));
  EXPECT_TRUE(run(drop_all, 50).empty());
  EXPECT_EQ(drop_all.stats().dropped, 50u);

  rw::Faults dup_all(parsed("dup=100"));
  std::vector<uint32_t> out = run(dup_all, 50);
  ASSERT_EQ(out.size(), 100u);
  for (uint32_t i = 0; i < 50; ++i) {
    EXPECT_EQ(out[2 * i], i);
    EXPECT_EQ(out[2 * i + 1], i);
  }
}

TEST(RoceFaults, ReorderSendsEachOnceLateAndTheSameForTheSameSeed) {
  // A long delay: only later datagrams (gap 2) and the final flush release held ones.
  const char* text = "reorder=20,gap=2,delay_us=10000000,seed=9";
  rw::Faults faults(parsed(text));
  std::vector<uint32_t> out = run(faults, 2000);
  ASSERT_EQ(out.size(), 2000u);
  std::vector<uint32_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 2000; ++i) ASSERT_EQ(sorted[i], i);
  size_t late = 0;
  for (size_t i = 1; i < out.size(); ++i) late += out[i] < out[i - 1];
  EXPECT_GT(late, 200u);  // ~20 % held: a fixed seed, so not a matter of luck
  EXPECT_EQ(faults.stats().seen, 2000u);
  // A held datagram is overtaken by at most gap (2) datagrams that were not held.
  for (size_t i = 0; i < out.size(); ++i) {
    size_t overtaken_by = 0;
    for (size_t j = 0; j < i; ++j) overtaken_by += out[j] > out[i];
    ASSERT_LE(overtaken_by, 2u) << out[i];
  }

  rw::Faults again(parsed(text));
  EXPECT_EQ(run(again, 2000), out);
  rw::Faults other_seed(parsed("reorder=20,gap=2,delay_us=10000000,seed=10"));
  EXPECT_NE(run(other_seed, 2000), out);
}

TEST(RoceFaults, DropShareFollowsTheSeed) {
  rw::Faults faults(parsed("drop=10,dup=5,seed=3"));
  std::vector<uint32_t> out = run(faults, 5000);
  rw::FaultStats s = faults.stats();
  EXPECT_EQ(out.size(), s.seen - s.dropped + s.duplicated);
  EXPECT_GT(s.dropped, 350u);
  EXPECT_LT(s.dropped, 650u);
  EXPECT_GT(s.duplicated, 150u);
}

TEST(RoceFaults, HeldDatagramLeavesAfterItsDelayWithoutMoreTraffic) {
  rw::Faults faults(parsed("reorder=100,delay_us=1000"));
  Wire wire;
  uint32_t n = 7;
  faults.send(&n, sizeof n, wire.sender());
  // Bounded wait: the timer thread sends it; nothing else would.
  for (int i = 0; i < 5000; ++i) {
    {
      std::lock_guard<std::mutex> lock(wire.mu);
      if (!wire.seen.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(wire.mu);
  ASSERT_EQ(wire.seen.size(), 1u);
  EXPECT_EQ(wire.seen[0], 7u);
}
