// A parent domain's allocator behind queue memory (queue_memory.hpp).
#include "core/queue_memory.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace softverbs {

void* QueueMemory::allocate(size_t size, size_t align, uint64_t type) {
  void* p = alloc_(pd_, pd_context_, size, align, type);
  if (p == IBV_ALLOCATOR_USE_DEFAULT) {
    p = nullptr;
    if (posix_memalign(&p, align, size) != 0) throw std::bad_alloc();
    std::memset(p, 0, size);
    std::lock_guard<std::mutex> lock(mu_);
    from_heap_.push_back(p);
    return p;
  }
  if (!p) throw std::bad_alloc();
  return p;
}

void QueueMemory::release(void* p, uint64_t type) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(from_heap_.begin(), from_heap_.end(), p);
    if (it != from_heap_.end()) {
      from_heap_.erase(it);
      std::free(p);
      return;
    }
  }
  free_(pd_, pd_context_, p, type);
}

}  // namespace softverbs
