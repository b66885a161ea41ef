// Page faults without signals (page_fault.hpp): MADV_POPULATE_READ/WRITE (Linux 5.14), which
// fail with ENOMEM where nothing is mapped and EINVAL where the permission is missing; on an
// older kernel, a one-byte cross-memory-attach read of each page from our own process.
#include "common/page_fault.hpp"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace softverbs {

namespace {

uintptr_t page_size() {
  static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Whether the kernel has MADV_POPULATE_*: asked once, on a page we know is readable.
bool have_populate() {
  static const bool yes = [] {
    alignas(4096) static const char probe[4096] = {1};
    return madvise(const_cast<char*>(probe), sizeof(probe), MADV_POPULATE_READ) == 0;
  }();
  return yes;
}

// Reads one byte of every page through process_vm_readv on ourselves: EFAULT, not SIGSEGV,
// where a page cannot be read.
bool probe_pages(uintptr_t start, uintptr_t end) {
  constexpr int kBatch = 64;
  char sink[kBatch];
  iovec local[kBatch], remote[kBatch];
  const pid_t self = getpid();
  while (start < end) {
    int n = 0;
    for (; n < kBatch && start < end; ++n, start += page_size()) {
      local[n] = {&sink[n], 1};
      remote[n] = {reinterpret_cast<void*>(start), 1};
    }
    if (process_vm_readv(self, local, n, remote, n, 0) != n) return false;
  }
  return true;
}

}  // namespace

bool fault_in(const void* addr, size_t length, bool write) {
  if (length == 0) return true;
  const uintptr_t at = reinterpret_cast<uintptr_t>(addr);
  if (length > UINTPTR_MAX - at) return false;
  const uintptr_t start = at & ~(page_size() - 1);
  const uintptr_t end = at + length;
  if (!have_populate()) return probe_pages(start, end);
  int advice = write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
  while (madvise(reinterpret_cast<void*>(start), end - start, advice) != 0) {
    // EINTR: a signal arrived while faulting; EAGAIN: a transient failure. Both retry.
    if (errno != EINTR && errno != EAGAIN) return false;
  }
  return true;
}

bool range_mapped(const void* addr, size_t length) {
  if (length == 0) return true;
  const uintptr_t at = reinterpret_cast<uintptr_t>(addr);
  if (length > UINTPTR_MAX - at) return false;
  const uintptr_t start = at & ~(page_size() - 1);
  const uintptr_t end = at + length;
  // msync answers ENOMEM for an unmapped page and touches nothing else (MS_ASYNC is a no-op).
  return msync(reinterpret_cast<void*>(start), end - start, MS_ASYNC) == 0;
}

}  // namespace softverbs
