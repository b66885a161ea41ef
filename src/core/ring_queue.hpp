// A FIFO over a power-of-two ring whose elements stay constructed when popped: a receive
// queue reuses its WQEs (and their SGE storage) instead of allocating, which std::deque
// does every few elements. Grows by doubling when full (callers bound it by the queue's
// max_wr). Its storage can come from a parent domain's allocator (queue_memory.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/queue_memory.hpp"

namespace softverbs {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return head_ == tail_; }
  size_t size() const { return static_cast<size_t>(tail_ - head_); }
  // i-th element from the front.
  T& operator[](size_t i) { return slots_[(head_ + i) & mask_]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & mask_]; }
  T& front() { return (*this)[0]; }
  T& back() { return (*this)[size() - 1]; }
  // Appends an element holding whatever the slot held before: the caller overwrites it.
  T& push_slot() {
    if (size() == slots_.size()) regrow(slots_.size() + 1);
    return slots_[tail_++ & mask_];
  }
  void pop_front() { ++head_; }
  void clear() { head_ = tail_ = 0; }
  // Where `softverbs stat` reads the fill from another process (verbs/stat_publish.cpp).
  const uint64_t* head_address() const { return &head_; }
  const uint64_t* tail_address() const { return &tail_; }
  // Storage from `source` from now on (call while empty and before anything was pushed),
  // sized for `n` elements so that it never grows: one allocation, like a NIC's queue
  // buffer. Throws std::bad_alloc when the allocator fails.
  void use_memory(QueueMemory* source, uint64_t type, size_t n) {
    slots_ = std::vector<T, QueueAllocator<T>>(QueueAllocator<T>(source, type));
    mask_ = 0;
    head_ = tail_ = 0;
    regrow(n);
  }

 private:
  void regrow(size_t n) {
    size_t cap = 1;
    while (cap < n) cap <<= 1;
    std::vector<T, QueueAllocator<T>> bigger(cap, slots_.get_allocator());
    for (size_t i = 0; i < size(); ++i) bigger[i] = std::move((*this)[i]);
    tail_ -= head_;
    head_ = 0;
    slots_ = std::move(bigger);
    mask_ = cap - 1;
  }

  std::vector<T, QueueAllocator<T>> slots_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0, tail_ = 0;
};

}  // namespace softverbs
