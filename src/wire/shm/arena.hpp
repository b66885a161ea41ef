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
  // A second region that peers may only read (they get a read-only fd, and the memfd is
  // sealed against any new writable mapping, write and resize): what one peer must not be
  // able to change under another, such as the MR table. -1 if it could not be made.
  int published_fd() const { return published_ro_fd_; }
  uint64_t allocate_published(size_t bytes);
  template <typename T>
  T* published_at(uint64_t offset) const {
    return reinterpret_cast<T*>(published_base_ + offset);
  }
  char* base() const { return base_; }
  size_t size() const { return size_; }
  // Fixed-size blocks, zero-filled; offsets are what peers are told. 0 means "no memory".
  // Blocks of at most 128 bytes share pages (aligned to 128); larger ones are whole pages,
  // whose memory is given back to the system when they are released.
  uint64_t allocate(size_t bytes);
  void release(uint64_t offset, size_t bytes);
  // Releases a block that process `writer` may still write into (a receive window): only
  // once that process is gone, checked now and on later allocations. Until then the block
  // stays out of use, so a late write from it can never land in someone else's window.
  void retire(uint64_t offset, size_t bytes, pid_t writer);
  template <typename T>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  uint64_t allocate_locked(size_t bytes);  // whole pages, under the arena's lock
  int fd_ = -1;
  char* base_ = nullptr;
  size_t size_ = 0;
  int published_ro_fd_ = -1;
  char* published_base_ = nullptr;
  size_t published_size_ = 0;
  uint64_t published_next_ = 0;
};

// How much of a peer's MR memfd (wire/mr_shm.hpp) we reserve address space for.
inline constexpr uint64_t kPeerMrReserve = uint64_t{64} << 30;

// A peer's arena as mapped here (shared per process slot and pid, and counted).
struct PeerArena {
  int slot = 0;  // the mapping's key
  pid_t pid = 0;
  char* base = nullptr;
  size_t size = 0;
  const char* published = nullptr;  // mapped read-only
  size_t published_size = 0;
  char* mr = nullptr;  // its MR memfd (kPeerMrReserve reserved), or nullptr
  int mr_fd = -1;
  template <typename T>
  T* at(uint64_t offset, size_t bytes = sizeof(T)) const {
    if (!base || offset > size || bytes > size - offset || offset % alignof(T)) return nullptr;
    return reinterpret_cast<T*>(base + offset);
  }
  template <typename T>
  const T* published_at(uint64_t offset, size_t bytes = sizeof(T)) const {
    if (!published || offset > published_size || bytes > published_size - offset ||
        offset % alignof(T))
      return nullptr;
    return reinterpret_cast<const T*>(published + offset);
  }
};

// Maps (or finds the mapping of) the arena of the process in `slot`: `fd` read-write,
// `published_fd` (may be -1) read-only, `mr_fd` (may be -1) its MR memfd. Takes the fds.
// Each is used only with the seals its owner puts on it (no shrinking; the published region
// also no writing): without them, no mapping (arena), or none of that part.
// Each call that returns a mapping (base != nullptr) holds one reference to it, dropped
// with unmap_peer_arena; with the last one the peer's memory is unmapped (a dead peer's
// memfds, its registered memory included, are freed then).
PeerArena map_peer_arena(int slot, pid_t pid, int fd, int published_fd, int mr_fd);
void unmap_peer_arena(const PeerArena& arena);

// Where [offset, offset + bytes) of a peer's MR memfd (mapped at `mr`) is here, or nullptr
// when that is not inside the file; *known_size caches the file's size, refreshed with
// fstat(mr_fd) when exceeded.
char* peer_mr_span(char* mr, int mr_fd, uint64_t offset, uint64_t bytes, uint64_t* known_size);

}  // namespace softverbs::wire
