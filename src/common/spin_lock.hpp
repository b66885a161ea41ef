// A lock for the data path's shortest critical sections: a CQ's ring indices, a CQ's list
// of inbound windows. Nothing inside ever blocks or makes a syscall. Taking it is one atomic
// exchange and releasing it one plain store, where a pthread mutex costs two atomic
// read-modify-writes and two calls; that difference is a visible part of a 1 µs round trip.
// A waiter spins a little, then yields its CPU: on a 2-core machine the holder may be
// preempted, and a waiter must not burn the time slice it needs.
#pragma once

#include <sched.h>

#include <atomic>

namespace softverbs {

class SpinLock {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lock_contended();
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    for (unsigned spins = 0;;) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 128) pause();
        else sched_yield();
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  std::atomic<bool> locked_{false};
};

}  // namespace softverbs
