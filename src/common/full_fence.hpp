// A full (store-load) fence for the Dekker-style handshakes between a requester and a CQ's
// owner (wire::ring_cq and the CQ's side of it, ibv_req_notify_cq's arm).
//
// On x86-64 a locked add of 0 to the stack's red zone, as the Linux kernel's smp_mb(): it
// orders every earlier load and store (string stores included) before every later load,
// as mfence does, and is no dearer than the lock xadd of the doorbell it replaces (mfence
// is, on many Intel cores). Elsewhere (and under TSan, which sees no asm), the C++
// seq_cst fence.
#pragma once

#include <atomic>

namespace softverbs {

inline void full_fence() {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  asm volatile("lock addl $0, -4(%%rsp)" ::: "memory", "cc");
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace softverbs
