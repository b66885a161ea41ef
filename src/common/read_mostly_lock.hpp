// A reader-writer lock for a table that every work request reads and only (de)registration
// writes (the MR key table). A reader costs two inlined atomic adds on a line that stays in
// its core's cache; std::shared_mutex (pthread_rwlock) costs two calls with a
// compare-and-swap loop each, three times per message on the data path. Writers take turns
// on a mutex, announce themselves, and sleep (futex, through std::atomic::wait) until the
// readers in flight are out; readers that meet a writer step back and sleep until it is
// gone. Nobody spins. Meets the SharedMutex requirements used here (std::shared_lock,
// std::unique_lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace softverbs {

class ReadMostlyLock {
 public:
  void lock_shared() noexcept {
    for (;;) {
      uint32_t s = state_.fetch_add(1, std::memory_order_acquire);
      if (!(s & kWriter)) return;
      unlock_shared();  // a writer is in or waiting: let it go first
      for (s = state_.load(std::memory_order_acquire); s & kWriter;
           s = state_.load(std::memory_order_acquire))
        state_.wait(s, std::memory_order_acquire);
    }
  }
  void unlock_shared() noexcept {
    // The last reader out wakes the writer waiting for it.
    if (state_.fetch_sub(1, std::memory_order_release) == (kWriter | 1)) state_.notify_all();
  }

  void lock() {
    writers_.lock();
    uint32_t s = state_.fetch_or(kWriter, std::memory_order_acquire) | kWriter;
    while (s != kWriter) {
      state_.wait(s, std::memory_order_acquire);
      s = state_.load(std::memory_order_acquire);
    }
  }
  void unlock() {
    state_.fetch_and(~kWriter, std::memory_order_release);
    state_.notify_all();  // readers that stepped back
    writers_.unlock();
  }

 private:
  static constexpr uint32_t kWriter = 1u << 31;
  std::atomic<uint32_t> state_{0};  // kWriter | readers in flight
  std::mutex writers_;
};

}  // namespace softverbs
