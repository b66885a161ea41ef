// SRQ receives shared with receive windows (wire::SrqShared, docs/send-placement.md "SRQ"):
// claims never exceed the receives posted, also when several threads race for them, and a
// claimed counter a peer scribbled on never lets the target's own claims pass its own count.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "wire/shm/window.hpp"

namespace softverbs::unit {
namespace {

TEST(SrqClaim, BoundedByPosted) {
  wire::SrqShared s{};
  EXPECT_FALSE(wire::srq_claim(&s, 0));  // nothing posted: RNR
  EXPECT_TRUE(wire::srq_claim(&s, 2));
  EXPECT_TRUE(wire::srq_claim(&s, 2));
  EXPECT_FALSE(wire::srq_claim(&s, 2));
  EXPECT_EQ(s.claimed.load(), 2u);
  s.claimed.fetch_sub(1);  // one given back (not committed)
  EXPECT_TRUE(wire::srq_claim(&s, 2));
  EXPECT_FALSE(wire::srq_claim(&s, 2));
}

TEST(SrqClaim, RacingClaimersTakeEachReceiveOnce) {
  wire::SrqShared s{};
  constexpr uint64_t kPosted = 20000;
  std::atomic<uint64_t> won{0};
  std::vector<std::thread> claimers;
  for (int t = 0; t < 4; ++t)
    claimers.emplace_back([&] {
      for (int i = 0; i < 10000; ++i)
        if (wire::srq_claim(&s, kPosted)) won.fetch_add(1);
    });
  for (auto& c : claimers) c.join();
  EXPECT_EQ(won.load(), kPosted);  // 40000 tries, exactly the 20000 posted
  EXPECT_EQ(s.claimed.load(), kPosted);
}

TEST(SrqClaim, GarbageCountGivesNothingBeyondOwnCount) {
  wire::SrqShared s{};
  s.claimed.store(UINT64_MAX);  // a peer's garbage: everything looks taken
  EXPECT_FALSE(wire::srq_claim(&s, 5));
  s.claimed.store(7);  // beyond what the target posted
  EXPECT_FALSE(wire::srq_claim(&s, 5));
}

}  // namespace
}  // namespace softverbs::unit
