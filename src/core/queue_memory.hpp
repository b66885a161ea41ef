// Where a queue's memory comes from: the heap, or the application's allocator of a parent
// domain (ibv_alloc_parent_domain(3): "Provider memory allocations will use this function").
// A receive queue (a QP's or an SRQ's) takes its ring of WQEs from here, once, at creation.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace softverbs {

// The resource_type values we hand to a parent domain's alloc/free: rdma_driver_id in the
// upper 32 bits (RDMA_DRIVER_UNKNOWN, 0: softverbs has no id of its own) and a code below,
// numbered as mlx5dv_res_type numbers its own (QP 1, RWQ 2, DBR 3, SRQ 4, CQ 5).
inline constexpr uint64_t kResourceQp = 1;
inline constexpr uint64_t kResourceSrq = 4;
inline constexpr uint64_t kResourceCq = 5;

class QueueMemory {
 public:
  using AllocFn = void* (*)(ibv_pd*, void*, size_t, size_t, uint64_t);
  using FreeFn = void (*)(ibv_pd*, void*, void*, uint64_t);
  QueueMemory(ibv_pd* pd, void* pd_context, AllocFn alloc, FreeFn free)
      : pd_(pd), pd_context_(pd_context), alloc_(alloc), free_(free) {}

  // `size` bytes aligned to `align` (a power of two), zeroed; throws std::bad_alloc when the
  // application's allocator answers NULL. IBV_ALLOCATOR_USE_DEFAULT: from the heap.
  void* allocate(size_t size, size_t align, uint64_t type);
  void release(void* p, uint64_t type);

 private:
  ibv_pd* pd_;
  void* pd_context_;
  AllocFn alloc_;
  FreeFn free_;
  std::mutex mu_;
  std::vector<void*> from_heap_;  // what we allocated because the application said so
};

// A std allocator over a QueueMemory (none: the heap), for the ring's storage.
template <typename T>
struct QueueAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  static constexpr size_t kAlign = alignof(T) > 64 ? alignof(T) : 64;

  QueueMemory* source = nullptr;
  uint64_t type = 0;

  QueueAllocator() = default;
  QueueAllocator(QueueMemory* s, uint64_t t) : source(s), type(t) {}
  template <typename U>
  QueueAllocator(const QueueAllocator<U>& o) : source(o.source), type(o.type) {}

  T* allocate(size_t n) {
    if (!source) return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kAlign}));
    return static_cast<T*>(source->allocate(n * sizeof(T), kAlign, type));
  }
  void deallocate(T* p, size_t) {
    if (!source) ::operator delete(p, std::align_val_t{kAlign});
    else source->release(p, type);
  }
  template <typename U>
  bool operator==(const QueueAllocator<U>& o) const { return source == o.source && type == o.type; }
};

}  // namespace softverbs
