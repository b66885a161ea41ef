// Random numbers for rdma_cm: ephemeral ports, starting PSNs, the CM's first comm ID.
// getrandom(2) when the kernel's pool is ready; before that (a machine just booted, e.g. the
// emulated rxe-vm guest, where GRND_NONBLOCK fails with EAGAIN) a generator that still
// gives a new value on every call. A fallback of one value per process handed every
// ephemeral-port try the same port, so a process's second id failed with EADDRINUSE.
#pragma once

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace softverbs::cm {

// splitmix64 (Steele, Lea, Flood 2014) over a per-process counter started from the pid and
// the clock: distinct values call after call, different in every process.
inline uint64_t fallback_random64() {
  static std::atomic<uint64_t> state{[] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(getpid()) << 32 ^ uint64_t(ts.tv_sec) * 1000000000u ^ uint64_t(ts.tv_nsec);
  }()};
  uint64_t z = state.fetch_add(0x9e3779b97f4a7c15u, std::memory_order_relaxed) + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

inline uint32_t random32() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != sizeof(v)) v = uint32_t(fallback_random64() >> 32);
  return v;
}

inline uint32_t random24() { return random32() & 0xffffff; }

}  // namespace softverbs::cm
