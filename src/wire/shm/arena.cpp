#include "wire/shm/arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <string>
#include <mutex>
#include <vector>

#include "wire/shm/mr_shm.hpp"

namespace softverbs::wire {

namespace {

// Sparse: only touched pages cost memory, and blocks given back are hole-punched. Large
// enough for a receive window (~133 KiB of address space) on each of max_qp QPs.
constexpr size_t kArenaSize = size_t{4} << 30;
constexpr size_t kAlign = 4096;
constexpr size_t kPublishedSize = size_t{16} << 20;
// The seals of a memfd whose size never changes; F_SEAL_SEAL keeps the set as it is.
constexpr int kFixedSize = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Blocks are handed out, freed and retired in multiples of kAlign.
size_t whole_blocks(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

std::mutex g_mu;
pid_t g_owner = 0;
Arena* g_self = nullptr;
uint64_t g_next = kAlign;  // offset 0 stays unused: it means "none"
std::multimap<size_t, uint64_t>& g_free = *new std::multimap<size_t, uint64_t>;  // size -> offset
// Blocks of at most kSmallBlock bytes (a CQ's arm word and doorbell) are cut from pages,
// kAlign / kSmallBlock to a page: one page each would let 65536 CQs take the whole arena
// and 256 MiB of shared memory.
constexpr size_t kSmallBlock = 128;
std::vector<uint64_t>& g_small_free = *new std::vector<uint64_t>;

struct PeerKey {
  int slot;
  pid_t pid;
  bool operator<(const PeerKey& o) const { return slot != o.slot ? slot < o.slot : pid < o.pid; }
};
struct PeerMapping {
  PeerArena arena;
  int refs = 0;
};
std::map<PeerKey, PeerMapping>* g_peers = new std::map<PeerKey, PeerMapping>;

// Blocks whose writer process was alive when they were given back (Arena::retire).
struct Retired {
  uint64_t offset;
  size_t bytes;
  pid_t writer;
};
std::vector<Retired>& g_retired = *new std::vector<Retired>;

// kill(0) cannot tell a pid that was reused from the writer itself; erring that way only
// keeps a block out of use longer.
bool gone(pid_t pid) { return pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH); }

// A block of whole pages goes back to the free list, its pages back to the system: it
// reads as zeros again (as fresh arena memory does) and costs nothing until touched.
void give_back_locked(Arena* arena, uint64_t offset, size_t bytes) {
  if (fallocate(arena->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(bytes)) != 0)
    std::memset(arena->base() + offset, 0, bytes);
  g_free.emplace(bytes, offset);
}

// Under g_mu: frees the retired blocks whose writer is gone.
void reclaim_retired_locked(Arena* arena) {
  auto dead = std::partition(g_retired.begin(), g_retired.end(),
                             [](const Retired& r) { return !gone(r.writer); });
  for (auto it = dead; it != g_retired.end(); ++it) give_back_locked(arena, it->offset, it->bytes);
  g_retired.erase(dead, g_retired.end());
}

}  // namespace

Arena* Arena::self() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_owner == getpid()) return g_self;
  g_owner = getpid();
  // A forked child gets an arena of its own; the parent's mapping stays the parent's.
  g_self = nullptr;
  g_next = kAlign;
  g_free.clear();
  g_small_free.clear();
  g_retired.clear();
  int fd = memfd_create("softverbs-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  // Peers map it read-write, but none may change its size: a shrunk file would raise SIGBUS
  // in every process that maps it, ours included.
  if (ftruncate(fd, static_cast<off_t>(kArenaSize)) != 0 ||
      fcntl(fd, F_ADD_SEALS, kFixedSize) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  auto* arena = new Arena;
  arena->fd_ = fd;
  arena->base_ = static_cast<char*>(p);
  arena->size_ = kArenaSize;
  // The published region: a memfd peers receive through a read-only reopening. An fd alone
  // would not keep it read-only (a peer could open /proc/self/fd/N of it for writing): once
  // our own writable mapping exists, the seals refuse every new writable mapping, write(2),
  // hole punching and change of size, to us and to anyone else.
  int pfd = memfd_create("softverbs-published", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (pfd >= 0 && ftruncate(pfd, static_cast<off_t>(kPublishedSize)) == 0) {
    void* q = mmap(nullptr, kPublishedSize, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    int ro = -1;
    if (q != MAP_FAILED && fcntl(pfd, F_ADD_SEALS, kFixedSize | F_SEAL_FUTURE_WRITE) == 0) {
      std::string path = "/proc/self/fd/" + std::to_string(pfd);
      ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (q != MAP_FAILED && ro >= 0) {
      arena->published_base_ = static_cast<char*>(q);
      arena->published_size_ = kPublishedSize;
      arena->published_ro_fd_ = ro;
      arena->published_next_ = kAlign;
    } else {
      if (q != MAP_FAILED) munmap(q, kPublishedSize);
      if (ro >= 0) close(ro);
    }
  }
  if (pfd >= 0) close(pfd);
  g_self = arena;
  return arena;
}

uint64_t Arena::allocate_published(size_t bytes) {
  bytes = whole_blocks(bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!published_base_ || published_next_ + bytes > published_size_) return 0;
  uint64_t off = published_next_;
  published_next_ += bytes;
  return off;
}

uint64_t Arena::allocate_locked(size_t bytes) {
  bytes = whole_blocks(bytes);
  if (!g_retired.empty()) reclaim_retired_locked(this);
  auto it = g_free.find(bytes);
  if (it != g_free.end()) {  // zeros already (give_back_locked)
    uint64_t off = it->second;
    g_free.erase(it);
    return off;
  }
  if (g_next + bytes > size_) return 0;
  uint64_t off = g_next;
  g_next += bytes;
  return off;
}

uint64_t Arena::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (bytes > kSmallBlock) return allocate_locked(bytes);
  if (g_small_free.empty()) {
    uint64_t page = allocate_locked(kAlign);
    if (!page) return 0;
    // Handed out from the page's start, as a page of its own would be.
    for (size_t at = kAlign; at > 0; at -= kSmallBlock) g_small_free.push_back(page + at - kSmallBlock);
  }
  uint64_t off = g_small_free.back();
  g_small_free.pop_back();
  std::memset(base_ + off, 0, kSmallBlock);
  return off;
}

void Arena::release(uint64_t offset, size_t bytes) {
  if (!offset) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (bytes <= kSmallBlock) g_small_free.push_back(offset);
  else give_back_locked(this, offset, whole_blocks(bytes));
}

void Arena::retire(uint64_t offset, size_t bytes, pid_t writer) {
  if (!offset) return;
  bytes = whole_blocks(bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  if (gone(writer)) {
    give_back_locked(this, offset, bytes);
    return;
  }
  // Its pages go back now; a late write from the writer only touches a page again, and the
  // block is punched once more when it is reclaimed.
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
            static_cast<off_t>(bytes));
  g_retired.push_back({offset, bytes, writer});
}


namespace {
// Maps all of `fd` (then closes it) if its seals include `seals`; nullptr otherwise. The
// shrink seal is what makes touching every byte of the mapping safe later (no SIGBUS).
char* map_whole(int fd, int prot, int seals, size_t* size) {
  struct stat st;
  void* p = MAP_FAILED;
  int has = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
  if (has >= 0 && (has & seals) == seals && fstat(fd, &st) == 0 && st.st_size > 0) {
    *size = static_cast<size_t>(st.st_size);
    p = mmap(nullptr, *size, prot, MAP_SHARED, fd, 0);
  }
  if (fd >= 0) close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}
}  // namespace

// The peer's MR memfd, reserved at its largest size: only what the file holds may be
// touched (PeerArena::mr_span); the shrink seal keeps that true once seen.
void map_peer_mr(int fd, PeerArena* mapped) {
  int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
  void* p = MAP_FAILED;
  if (seals >= 0 && (seals & F_SEAL_SHRINK))
    p = mmap(nullptr, kPeerMrReserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    if (fd >= 0) close(fd);
    return;
  }
  mapped->mr = static_cast<char*>(p);
  mapped->mr_fd = fd;  // kept: fstat tells how far the file has grown
}

PeerArena map_peer_arena(int slot, pid_t pid, int fd, int published_fd, int mr_fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  PeerMapping& cached = (*g_peers)[{slot, pid}];
  if (cached.arena.base) {
    close(fd);
    if (published_fd >= 0) close(published_fd);
    if (mr_fd >= 0) close(mr_fd);
    ++cached.refs;
    return cached.arena;
  }
  PeerArena mapped;
  mapped.slot = slot;
  mapped.pid = pid;
  mapped.base = map_whole(fd, PROT_READ | PROT_WRITE, F_SEAL_SHRINK, &mapped.size);
  // What we read from the published region (the MR table) decides where we write in the
  // peer's memory: only one nobody else can write qualifies.
  mapped.published = map_whole(published_fd, PROT_READ, F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE,
                               &mapped.published_size);
  if (!mapped.base) {
    if (mapped.published) munmap(const_cast<char*>(mapped.published), mapped.published_size);
    if (mr_fd >= 0) close(mr_fd);
    g_peers->erase({slot, pid});
    return {};
  }
  map_peer_mr(mr_fd, &mapped);
  cached = {mapped, 1};
  return mapped;
}

void unmap_peer_arena(const PeerArena& arena) {
  if (!arena.base) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_peers->find({arena.slot, arena.pid});
  if (it == g_peers->end() || it->second.arena.base != arena.base || --it->second.refs > 0) return;
  PeerArena& a = it->second.arena;
  munmap(a.base, a.size);
  if (a.published) munmap(const_cast<char*>(a.published), a.published_size);
  if (a.mr) munmap(a.mr, kPeerMrReserve);
  if (a.mr_fd >= 0) close(a.mr_fd);
  g_peers->erase(it);
}

char* peer_mr_span(char* mr, int mr_fd, uint64_t offset, uint64_t bytes, uint64_t* known_size) {
  if (!mr || offset < kMrShmFirst || offset > kPeerMrReserve || bytes > kPeerMrReserve - offset)
    return nullptr;
  if (offset + bytes > *known_size) {  // grown since we last looked?
    struct stat st;
    if (fstat(mr_fd, &st) != 0) return nullptr;
    *known_size = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), kPeerMrReserve);
    if (offset + bytes > *known_size) return nullptr;
  }
  return mr + offset;
}

}  // namespace softverbs::wire
