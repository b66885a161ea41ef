// Per-thread state read on every packet or poll. A shared library's thread_local is reached
// through a call to __tls_get_addr (3 % of a receiving port thread's samples); the
// initial-exec model reads it with one instruction. That takes static TLS, of which glibc
// keeps only a few hundred bytes for a library loaded with dlopen (python loads libibverbs
// so), hence: small, trivially destructible variables only (a pointer to anything bigger,
// FastTlsHeap).
#pragma once

#include <memory>

#define SV_FAST_TLS __attribute__((tls_model("initial-exec"))) thread_local

namespace softverbs {

// One T per thread, on the heap, reached through an initial-exec pointer; freed when the
// thread exits. Tag tells the users apart. (A thread_local std::unique_ptr would be read
// through __tls_get_addr, for its destructor's guard.)
template <class T, class Tag, class... Args>
T& fast_tls_heap(Args&&... args) {
  SV_FAST_TLS static T* fast = nullptr;
  if (fast) [[likely]]
    return *fast;
  thread_local std::unique_ptr<T> owner;
  owner = std::make_unique<T>(std::forward<Args>(args)...);
  fast = owner.get();
  return *fast;
}

}  // namespace softverbs
