// The clock completion timestamps count: what ibv_wc_read_completion_ts returns, what
// ibv_query_rt_values_ex reads as the raw clock and what ibv_query_device_ex reports as
// hca_core_clock. A NIC has a free-running oscillator; ours is CLOCK_MONOTONIC_RAW in
// nanoseconds (no NTP slewing, shared by every process of the host), so it ticks at
// 1 GHz = 1,000,000 kHz and is 64 bits wide.
#pragma once

#include <time.h>

#include <cstdint>

namespace softverbs {

inline constexpr uint64_t kCompletionClockKhz = 1000000;
inline constexpr uint64_t kCompletionTimestampMask = ~uint64_t{0};

inline uint64_t clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}
inline uint64_t completion_clock_now() { return clock_ns(CLOCK_MONOTONIC_RAW); }
inline uint64_t wallclock_now_ns() { return clock_ns(CLOCK_REALTIME); }

}  // namespace softverbs
