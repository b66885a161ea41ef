// SRQ receives shared with receive windows (wire::SrqShared, docs/send-placement.md "SRQ"):
// claims never pass the receives posted, each number is claimed once also when several
// threads race, a claim names its claimer (so a dead one's can be found), a receive too
// small for the message is not claimed, and a peer's garbage gives nothing beyond the
// target's own count.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "wire/shm/window.hpp"

namespace softverbs::unit {
namespace {

using wire::kSrqNone;
using wire::srq_claim;

std::unique_ptr<wire::SrqShared> fresh(uint32_t capacity) {
  auto s = std::make_unique<wire::SrqShared>();  // value-initialized: zeros, as the arena
  for (auto& c : s->capacity) c.store(capacity);
  return s;
}

TEST(SrqClaim, BoundedByPostedAndNamesTheClaimer) {
  auto s = fresh(4096);
  EXPECT_EQ(srq_claim(s.get(), 0, 7, 64), kSrqNone);  // nothing posted: RNR
  EXPECT_EQ(srq_claim(s.get(), 2, 7, 64), 0u);
  EXPECT_EQ(srq_claim(s.get(), 2, 9, 64), 1u);
  EXPECT_EQ(srq_claim(s.get(), 2, 7, 64), kSrqNone);
  EXPECT_EQ(s->owner[0].load(), wire::srq_tag(0, 7));
  EXPECT_EQ(s->owner[1].load(), wire::srq_tag(1, 9));
  // Consumed (the target frees the word for the number kSrqNumbers later): not again.
  s->owner[0].store(wire::srq_tag(wire::kSrqNumbers, 0));
  EXPECT_EQ(srq_claim(s.get(), 3, 7, 64), 2u);
}

TEST(SrqClaim, TooSmallIsNotClaimed) {
  auto s = fresh(64);
  EXPECT_EQ(srq_claim(s.get(), 1, 7, 65), kSrqNone);  // the agent path answers the error
  EXPECT_EQ(s->owner[0].load(), wire::srq_tag(0, 0));
  EXPECT_EQ(srq_claim(s.get(), 1, wire::kSrqLocal, 0), 0u);  // the target's own takes it
}

TEST(SrqClaim, RacingClaimersTakeEachReceiveOnce) {
  auto s = fresh(4096);
  constexpr uint64_t kPosted = 12000;
  std::vector<std::vector<uint64_t>> got(4);
  std::vector<std::thread> claimers;
  for (uint32_t t = 0; t < 4; ++t)
    claimers.emplace_back([&, t] {
      for (int i = 0; i < 6000; ++i)
        if (uint64_t n = srq_claim(s.get(), kPosted, t + 1, 1); n != kSrqNone) got[t].push_back(n);
    });
  for (auto& c : claimers) c.join();
  std::vector<int> seen(kPosted, 0);
  size_t total = 0;
  for (uint32_t t = 0; t < 4; ++t)
    for (uint64_t n : got[t]) {
      ASSERT_LT(n, kPosted);
      ++seen[n];
      ++total;
      EXPECT_EQ(s->owner[n].load(), wire::srq_tag(n, t + 1));
    }
  EXPECT_EQ(total, kPosted);  // 24000 tries, exactly the 12000 posted, each once
  for (int v : seen) EXPECT_EQ(v, 1);
}

TEST(SrqClaim, GarbageGivesNothingBeyondOwnCount) {
  auto s = fresh(4096);
  s->claimed.store(UINT64_MAX);  // a peer's garbage: everything looks taken
  EXPECT_EQ(srq_claim(s.get(), 5, wire::kSrqLocal, 0), kSrqNone);
  s->claimed.store(7);  // beyond what the target posted
  EXPECT_EQ(srq_claim(s.get(), 5, wire::kSrqLocal, 0), kSrqNone);
  s->claimed.store(0);
  s->owner[0].store(0xdeadbeefdeadbeefull);  // neither free nor a claim of receive 0
  EXPECT_EQ(srq_claim(s.get(), 5, wire::kSrqLocal, 0), kSrqNone);
}

}  // namespace
}  // namespace softverbs::unit
