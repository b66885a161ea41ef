// Per-thread state read on every packet or poll. A shared library's thread_local is reached
// through a call to __tls_get_addr (3 % of a receiving port thread's samples); the
// initial-exec model reads it with one instruction. That takes static TLS, of which glibc
// keeps only a few hundred bytes for a library loaded with dlopen (python loads libibverbs
// so), hence: small, trivially destructible variables only (a pointer to anything bigger,
// FastTlsHeap).
#pragma once

#define SV_FAST_TLS __attribute__((tls_model("initial-exec"))) thread_local

namespace softverbs {

// One T per thread, on the heap, reached through an initial-exec pointer and freed when the
// thread exits (a thread_local std::unique_ptr would be read through __tls_get_addr, for
// its destructor's guard). Tag tells apart users of one T. Asked for again while the thread is
// being torn down (a thread_local destroyed after it, or the main thread's exit handlers),
// it makes a second T rather than hand out the freed one; that one is freed with the
// thread's later thread_locals (glibc runs destructors registered during the teardown).
template <class T, class Tag = T>
class FastTlsHeap {
 public:
  // This thread's T, or nullptr if it has none yet.
  static T* peek() { return fast_; }
  static T& get() {
    if (fast_) [[likely]]
      return *fast_;
    if (gone_) {
      thread_local Owner late;
      late.made = new T();
      return *(fast_ = late.made);
    }
    thread_local Owner owner;
    owner.made = new T();
    return *(fast_ = owner.made);
  }

 private:
  struct Owner {
    T* made = nullptr;
    ~Owner() {
      delete made;
      fast_ = nullptr;
      gone_ = true;
    }
  };
  SV_FAST_TLS static inline constinit T* fast_ = nullptr;
  SV_FAST_TLS static inline constinit bool gone_ = false;
};

}  // namespace softverbs
