// The lock of a QP's send or receive queue. Every work request takes one or two of them, so
// the uncontended path is inline: one compare-exchange to take, one exchange to release (a
// pthread mutex adds two calls through the PLT and a dispatch on its type, ~50 instructions
// per message measured with callgrind on ib_send_lat). A holder may copy a large message
// through process_vm_writev with it held, so a waiter spins only briefly and then sleeps
// on the word itself (futex, through std::atomic::wait). Meets Lockable (std::lock_guard,
// std::unique_lock with try_to_lock).
#pragma once

#include <atomic>

namespace softverbs {

class QueueMutex {
 public:
  void lock() noexcept {
    int expected = kFree;
    if (!state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire))
      lock_contended();
  }
  bool try_lock() noexcept {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (state_.exchange(kFree, std::memory_order_release) == kHeldWaited) state_.notify_one();
  }

 private:
  enum : int { kFree = 0, kHeld = 1, kHeldWaited = 2 };  // kHeldWaited: someone may sleep

  void lock_contended() noexcept {
    for (int spins = 0; spins < 100; ++spins) {
      if (state_.load(std::memory_order_relaxed) == kFree) {
        int expected = kFree;
        if (state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire)) return;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    // From here on the word says "waited" while we hold it, so our unlock wakes the next.
    while (state_.exchange(kHeldWaited, std::memory_order_acquire) != kFree)
      state_.wait(kHeldWaited, std::memory_order_relaxed);
  }

  std::atomic<int> state_{kFree};
};

}  // namespace softverbs
