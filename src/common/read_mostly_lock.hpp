// A reader-writer lock for a table that every work request reads and only (de)registration
// writes (the MR key table). Every message takes it two or three times, so a reader must
// cost next to nothing: it announces itself in its own thread's slot with plain stores and
// no atomic read-modify-write or fence, which would also stall it until the store of a
// message into a line the peer is spinning on has completed. The writer pays instead:
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) runs a full memory barrier on every CPU
// that runs one of our threads (the asymmetric scheme of liburcu's "memb" flavour), after
// which it sees every reader that got in and every later reader sees it; it then sleeps
// until the readers in flight are out. Where the kernel refuses membarrier, readers pay
// one exchange instead. Readers may nest; readers that meet a writer step back and sleep
// until it is gone. Nobody spins. Meets the SharedMutex requirements used here
// (std::shared_lock, std::unique_lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/fast_tls.hpp"

namespace softverbs {

class ReadMostlyLock {
 public:
  ReadMostlyLock();
  ~ReadMostlyLock();
  ReadMostlyLock(const ReadMostlyLock&) = delete;
  ReadMostlyLock& operator=(const ReadMostlyLock&) = delete;

  void lock_shared() noexcept {
    Slot* s = slot();
    uint32_t depth = s->depth.load(std::memory_order_relaxed);
    if (depth > 0) {  // nested: a writer is waiting for this thread anyway
      s->depth.store(depth + 1, std::memory_order_relaxed);
      return;
    }
    announce(s);
    if (writer_.load(std::memory_order_acquire)) step_back(s);
  }
  void unlock_shared() noexcept {
    Slot* s = slot();
    s->depth.store(s->depth.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }

  void lock();
  void unlock();

  // Forgets the exiting thread's slots (run by a thread_local destructor).
  static void unregister_thread() noexcept;

  // fork(2) handlers (registered once): no writer is half-way through at the fork, and in
  // the child the read sections of threads that did not survive it are closed, so that
  // the child's first writer does not wait for them forever.
  static void before_fork() noexcept;
  static void parent_after_fork() noexcept;
  static void child_after_fork() noexcept;

 private:
  // One per thread that ever read; the writer looks at all of them.
  struct Slot {
    std::atomic<uint32_t> depth{0};  // read sections this thread is in
    uint64_t lock_id = 0;            // the lock's id_ (an address could be reused)
    ReadMostlyLock* lock = nullptr;  // nullptr once the lock is gone
    Slot* next = nullptr;
  };

  Slot* slot() noexcept {
    Slot* s = t_slot;
    return s && s->lock_id == id_ ? s : slot_slow();
  }
  // Enters a first read section, visible to a writer before we look at writer_.
  void announce(Slot* s) noexcept {
    if (asymmetric_) {
      s->depth.store(1, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the writer's membarrier fences
    } else {
      s->depth.exchange(1, std::memory_order_seq_cst);
    }
  }
  Slot* slot_slow() noexcept;
  void step_back(Slot* s) noexcept;

  // The slot of this thread for the lock it used last (there is one lock in practice).
  // Constant-initialised and defined here, so that reading it is one load (no TLS wrapper
  // call, which gcc 12 also gets wrong under -fsanitize=undefined for a member defined
  // elsewhere).
  SV_FAST_TLS static inline constinit Slot* t_slot = nullptr;

  const uint64_t id_;
  std::atomic<uint32_t> writer_{0};  // 1 while a writer is in or waiting
  bool asymmetric_ = false;          // membarrier works: readers need no fence
  std::mutex writers_;               // writers take turns
  std::mutex slots_mu_;              // guards slots_ (list of Slot, threads come and go)
  Slot* slots_ = nullptr;
};

}  // namespace softverbs
