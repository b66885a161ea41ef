// A per-process shared arena: memory this process publishes to its peers on this host
// (receive-queue windows, CQ arm words). One memfd, mapped once by each peer that asks
// (the fd travels over the agent socket with SCM_RIGHTS). Everything a peer reads from it
// is untrusted: readers bound every index and check every tag.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace softverbs::wire {

class Arena {
 public:
  // This process's arena (created on first use, again after fork); nullptr if memfd fails.
  static Arena* self();
  int fd() const { return fd_; }
  char* base() const { return base_; }
  size_t size() const { return size_; }
  // Fixed-size blocks; offsets are what peers are told. 0 means "no memory".
  uint64_t allocate(size_t bytes);
  void release(uint64_t offset, size_t bytes);
  template <typename T>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  size_t size_ = 0;
};

// A peer's arena as mapped here (cached per process slot and pid).
struct PeerArena {
  char* base = nullptr;
  size_t size = 0;
  template <typename T>
  T* at(uint64_t offset, size_t bytes = sizeof(T)) const {
    if (!base || offset > size || bytes > size - offset || offset % alignof(T)) return nullptr;
    return reinterpret_cast<T*>(base + offset);
  }
};

// Maps (or finds the mapping of) the arena `fd` of the process in `slot`; takes the fd.
PeerArena map_peer_arena(int slot, pid_t pid, int fd);
PeerArena find_peer_arena(int slot, pid_t pid);

}  // namespace softverbs::wire
