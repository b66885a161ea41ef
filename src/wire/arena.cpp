#include "wire/arena.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace softverbs::wire {

namespace {

constexpr size_t kArenaSize = size_t{256} << 20;  // sparse: only touched pages cost memory
constexpr size_t kAlign = 4096;

std::mutex g_mu;
pid_t g_owner = 0;
Arena* g_self = nullptr;
uint64_t g_next = kAlign;  // offset 0 stays unused: it means "none"
std::multimap<size_t, uint64_t> g_free;  // size -> offset

struct PeerKey {
  int slot;
  pid_t pid;
  bool operator<(const PeerKey& o) const { return slot != o.slot ? slot < o.slot : pid < o.pid; }
};
std::map<PeerKey, PeerArena>* g_peers = new std::map<PeerKey, PeerArena>;

}  // namespace

Arena* Arena::self() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_owner == getpid()) return g_self;
  g_owner = getpid();
  // A forked child gets an arena of its own; the parent's mapping stays the parent's.
  g_self = nullptr;
  g_next = kAlign;
  g_free.clear();
  int fd = memfd_create("softverbs-arena", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(kArenaSize)) != 0) {
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
  g_self = arena;
  return arena;
}

uint64_t Arena::allocate(size_t bytes) {
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_free.find(bytes);
  if (it != g_free.end()) {
    uint64_t off = it->second;
    g_free.erase(it);
    std::memset(base_ + off, 0, bytes);
    return off;
  }
  if (g_next + bytes > size_) return 0;
  uint64_t off = g_next;
  g_next += bytes;
  return off;
}

void Arena::release(uint64_t offset, size_t bytes) {
  if (!offset) return;
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  std::lock_guard<std::mutex> lock(g_mu);
  g_free.emplace(bytes, offset);
}

PeerArena map_peer_arena(int slot, pid_t pid, int fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& cached = (*g_peers)[{slot, pid}];
  if (cached.base) {
    close(fd);
    return cached;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return {};
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return {};
  cached = {static_cast<char*>(p), size};
  return cached;
}

PeerArena find_peer_arena(int slot, pid_t pid) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_peers->find({slot, pid});
  return it == g_peers->end() ? PeerArena{} : it->second;
}

}  // namespace softverbs::wire
