// rdma_cm's random numbers (src/cm/random.hpp) when getrandom(2) cannot help yet: the rxe-vm
// guest, just booted, fails GRND_NONBLOCK with EAGAIN, and a fallback of one value per
// process gave every ephemeral-port try of a process the same port (its second id: EADDRINUSE).
#include <gtest/gtest.h>

#include <set>

#include "cm/random.hpp"

namespace softverbs::cm {
namespace {

TEST(CmRandomTest, FallbackGivesANewValueEveryCall) {
  // As bind_locked picks an ephemeral port: 32768 + value % (61000 - 32768).
  std::set<uint32_t> ports, psns;
  for (int i = 0; i < 64; ++i) {
    const uint64_t v = fallback_random64();
    ports.insert(32768 + uint32_t(v >> 32) % (61000 - 32768));
    psns.insert(uint32_t(v >> 32) & 0xffffff);
  }
  // 64 draws from 28232 ports collide rarely; a per-process constant gives 1.
  EXPECT_GE(ports.size(), 48u);
  EXPECT_GE(psns.size(), 48u);
}

TEST(CmRandomTest, Random24FitsAPsn) {
  std::set<uint32_t> seen;
  for (int i = 0; i < 64; ++i) {
    const uint32_t v = random24();
    EXPECT_LT(v, 1u << 24);
    seen.insert(v);
  }
  EXPECT_GE(seen.size(), 48u);
}

}  // namespace
}  // namespace softverbs::cm
