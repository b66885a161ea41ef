// A FIFO over a power-of-two ring whose elements stay constructed when popped: a receive
// queue reuses its WQEs (and their SGE storage) instead of allocating, which std::deque
// does every few elements. Grows by doubling when full (callers bound it by the queue's
// max_wr).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

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

 private:
  void regrow(size_t n) {
    size_t cap = 1;
    while (cap < n) cap <<= 1;
    std::vector<T> bigger(cap);
    for (size_t i = 0; i < size(); ++i) bigger[i] = std::move((*this)[i]);
    tail_ -= head_;
    head_ = 0;
    slots_ = std::move(bigger);
    mask_ = cap - 1;
  }

  std::vector<T> slots_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0, tail_ = 0;
};

}  // namespace softverbs
