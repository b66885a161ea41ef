// Small numbers for objects, reused after they are given back: a CQ's slot in its channel
// (ReadyBits), a window's rung bit in its CQ. by_slot[n] is the object numbered n, or
// nullptr for a free number (also in `free`). Callers hold their own lock.
#pragma once

#include <cstdint>
#include <vector>

namespace softverbs {

template <typename T>
uint32_t slot_take(std::vector<T*>& by_slot, std::vector<uint32_t>& free, T* object) {
  if (free.empty()) {
    by_slot.push_back(object);
    return static_cast<uint32_t>(by_slot.size() - 1);
  }
  const uint32_t n = free.back();
  free.pop_back();
  by_slot[n] = object;
  return n;
}

template <typename T>
void slot_give_back(std::vector<T*>& by_slot, std::vector<uint32_t>& free, uint32_t n) {
  by_slot[n] = nullptr;
  free.push_back(n);
}

}  // namespace softverbs
