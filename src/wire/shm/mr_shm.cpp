// Moving registered pages into the MR memfd and back (see mr_shm.hpp).
#include "wire/shm/mr_shm.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "wire/registry.hpp"

namespace softverbs::wire {

namespace {

struct Region {
  size_t size;      // whole pages
  uint64_t offset;  // in the memfd
  int holds;        // registrations that use it
};

struct State {
  std::mutex mu;
  pid_t owner = 0;  // the process the memfd belongs to (a forked child makes its own)
  int fd = -1;
  uint64_t next = kMrShmFirst;  // offsets are never reused: a stale peer entry finds nothing
  std::map<uintptr_t, Region> regions;  // by start (page-aligned, in our address space)
  int maps_fd = -1;     // /proc/self/maps of maps_owner, for PROCMAP_QUERY
  pid_t maps_owner = 0;
  bool atfork = false;
  int fork_pipe[2] = {-1, -1};  // the child says "copied" (see before_fork)
};

State& state() {
  static State* s = new State;  // immortal: peers' requests may come during exit()
  return *s;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The line of /proc/self/maps that holds `addr`.
struct Mapping {
  unsigned long lo = 0, hi = 0, inode = 0;
  char perms[8] = {};
  char name[256] = {};  // the path, or [heap], or empty for anonymous memory
};

// PROCMAP_QUERY (Linux 6.11, uapi linux/fs.h): the one VMA that covers an address, found
// by the kernel in O(log n). Reading /proc/self/maps instead costs a formatted line per VMA
// before it, and every moved region is a VMA of its own: with 10,000 MRs, 10 ms each.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr;
  uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = 0xC0686611;  // _IOWR('f', 17, struct procmap_query)
constexpr uint64_t kVmaRead = 1, kVmaWrite = 2, kVmaExec = 4, kVmaShared = 8;

// Under the state's lock. 1 found, 0 not mapped, -1 the kernel has no PROCMAP_QUERY.
int query_mapping(State& s, uintptr_t addr, Mapping* m) {
  if (s.maps_owner != self_pid()) {  // an inherited fd would describe the parent
    if (s.maps_fd >= 0) close(s.maps_fd);
    s.maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    s.maps_owner = self_pid();
  }
  if (s.maps_fd < 0) return -1;
  ProcmapQuery q{};
  q.size = sizeof(q);
  q.query_addr = addr;
  q.vma_name_size = sizeof(m->name);
  q.vma_name_addr = reinterpret_cast<uintptr_t>(m->name);
  m->name[0] = '\0';
  if (ioctl(s.maps_fd, kProcmapQuery, &q) != 0) return errno == ENOENT ? 0 : -1;
  m->lo = q.vma_start;
  m->hi = q.vma_end;
  m->inode = q.inode;
  m->perms[0] = (q.vma_flags & kVmaRead) ? 'r' : '-';
  m->perms[1] = (q.vma_flags & kVmaWrite) ? 'w' : '-';
  m->perms[2] = (q.vma_flags & kVmaExec) ? 'x' : '-';
  m->perms[3] = (q.vma_flags & kVmaShared) ? 's' : 'p';
  m->perms[4] = '\0';
  return 1;
}

bool find_mapping(uintptr_t addr, Mapping* m) {
  if (int found = query_mapping(state(), addr, m); found >= 0) return found == 1;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f)) {
    unsigned long off;
    char dev[16] = {};
    int name_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &m->lo, &m->hi, m->perms, &off, dev,
                    &m->inode, &name_at) < 6 ||
        addr < m->lo || addr >= m->hi)
      continue;
    std::snprintf(m->name, sizeof(m->name), "%s", line + name_at);
    m->name[std::strcspn(m->name, "\n")] = '\0';
    found = true;
  }
  std::fclose(f);
  return found;
}

// Is [start, start + size) one private, anonymous, writable mapping (not the stack)?
bool private_anonymous(uintptr_t start, size_t size) {
  Mapping m;
  if (!find_mapping(start, &m)) return false;
  bool anonymous = m.inode == 0 && (m.name[0] == '\0' || std::strcmp(m.name, "[heap]") == 0);
  return anonymous && m.perms[0] == 'r' && m.perms[1] == 'w' && m.perms[3] == 'p' &&
         start + size <= m.hi;
}

// Puts `fresh` (size bytes, already filled) in place of [start, start + size): mremap
// replaces the old pages in one step, or changes nothing when it fails (then fresh goes).
//
// mremap is called as a system call, not through libc: a program may interpose mremap, and
// UCX's memory hooks (UCM, libucm 1.13) forward only its first four arguments, so the new
// address of MREMAP_FIXED was lost; as root the pages went to address 0 while the program
// kept its own at `start`, and every peer's store into the MR went where it never looked
// (interop.twoproc.ucx.rc_ud.ucp_put_bw hung). Where it landed is checked all the same.
bool move_over(void* fresh, uintptr_t start, size_t size) {
  long moved = syscall(SYS_mremap, fresh, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, start);
  if (moved == -1) {
    munmap(fresh, size);
    return false;
  }
  if (static_cast<uintptr_t>(moved) != start) {  // never seen: the kernel honours FIXED
    munmap(reinterpret_cast<void*>(moved), size);
    return false;
  }
  return true;
}

// Replaces [start, start + size) with the memfd's pages at `offset`, keeping the bytes.
bool swap_into_memfd(uintptr_t start, size_t size, int fd, uint64_t offset) {
  void* fresh = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (fresh == MAP_FAILED) return false;
  std::memcpy(fresh, reinterpret_cast<void*>(start), size);
  return move_over(fresh, start, size);
}

// Back to private pages holding what the memfd holds at `offset`, which is what [start,
// start + size) shows. Read from the file, not through `start`: the program may have freed
// its buffer before deregistering it (UCX does), and a sanitizer's allocator keeps such
// memory mapped but poisoned.
bool swap_out_of_memfd(uintptr_t start, size_t size, int fd, uint64_t offset) {
  void* fresh = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) return false;
  for (size_t done = 0; done < size;) {
    ssize_t n = pread(fd, static_cast<char*>(fresh) + done, size - done,
                      static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // an error, or the file ends short of the region
      munmap(fresh, size);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return move_over(fresh, start, size);
}

// In a forked child the moved pages would be shared with the parent, where hardware gives a
// child its own copy. The child makes private copies before anything else runs in it, and
// the parent's forking thread waits for that (a pipe), so the copies are what the memory held
// at fork time. The child gets a memfd of its own when it registers memory.
void before_fork() {
  State& s = state();
  s.mu.lock();
  s.fork_pipe[0] = s.fork_pipe[1] = -1;
  if (!s.regions.empty() && pipe2(s.fork_pipe, O_CLOEXEC) != 0) s.fork_pipe[0] = s.fork_pipe[1] = -1;
}

void parent_after_fork() {
  State& s = state();
  if (s.fork_pipe[1] >= 0) {
    close(s.fork_pipe[1]);
    char done;
    while (read(s.fork_pipe[0], &done, 1) < 0 && errno == EINTR) {
    }
    close(s.fork_pipe[0]);
  }
  s.mu.unlock();
}

void child_after_fork() {
  State& s = state();
  for (const auto& [start, r] : s.regions) swap_out_of_memfd(start, r.size, s.fd, r.offset);
  s.regions.clear();
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
  s.owner = 0;
  s.next = kMrShmFirst;
  if (s.fork_pipe[1] >= 0) {
    char done = 1;
    (void)!write(s.fork_pipe[1], &done, 1);
    close(s.fork_pipe[1]);
    close(s.fork_pipe[0]);
  }
  new (&s.mu) std::mutex;  // held by the parent's forking thread at fork time
}

bool open_locked(State& s) {
  if (s.owner == self_pid() && s.fd >= 0) return true;
  s.fd = memfd_create("softverbs-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd < 0) return false;
  // Peers rely on every offset they were told about staying valid.
  if (fcntl(s.fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    close(s.fd);
    s.fd = -1;
    return false;
  }
  s.owner = self_pid();
  if (!s.atfork) {
    s.atfork = true;
    pthread_atfork(&before_fork, &parent_after_fork, &child_after_fork);
  }
  return true;
}

bool disabled() {
  static const bool off = [] {
    const char* v = std::getenv("SOFTVERBS_NO_SHARED_MR");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return off;
}

}  // namespace

uint64_t mr_shm_acquire(void* addr, size_t length, size_t* shared) {
  auto start = reinterpret_cast<uintptr_t>(addr);
  size_t page = page_size();
  *shared = 0;
  // Whole pages of the region only: a partial last page also holds other objects, which
  // other threads may be writing while we copy.
  size_t size = length / page * page;
  if (size == 0 || start % page || disabled()) return 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // Already moved for another registration: it must lie wholly inside that region. Regions
  // do not overlap, so only the last one starting before our end can.
  if (auto it = s.regions.lower_bound(start + size); it != s.regions.begin()) {
    --it;
    auto& [r_start, r] = *it;
    if (start < r_start + r.size) {
      if (start < r_start || start + size > r_start + r.size) return 0;  // partial overlap
      ++r.holds;
      *shared = size;
      return r.offset + (start - r_start);
    }
  }
  if (!open_locked(s) || !private_anonymous(start, size)) return 0;
  uint64_t offset = s.next;
  if (ftruncate(s.fd, static_cast<off_t>(offset + size)) != 0) return 0;
  if (!swap_into_memfd(start, size, s.fd, offset)) return 0;
  s.next = offset + size;
  s.regions[start] = Region{size, offset, 1};
  *shared = size;
  return offset;
}

void mr_shm_release(void* addr) {
  auto start = reinterpret_cast<uintptr_t>(addr);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.regions.upper_bound(start);  // the region holding start starts at or before it
  if (it == s.regions.begin()) return;
  --it;
  auto& [r_start, r] = *it;
  if (start >= r_start + r.size || --r.holds > 0) return;
  // Back to private memory (the application keeps using it after deregistering), unless
  // it already unmapped it; then the memfd's pages are given back. Pages that could not be
  // swapped back (no memory for the copy) stay in the memfd: punching them would zero the
  // application's memory under it.
  Mapping m;
  const bool stays = find_mapping(r_start, &m) && std::strstr(m.name, "softverbs-mr") &&
                     !swap_out_of_memfd(r_start, r.size, s.fd, r.offset);
  if (!stays)
    fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
              static_cast<off_t>(r.size));
  s.regions.erase(it);
}

int mr_shm_fd() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return open_locked(s) ? s.fd : -1;
}

}  // namespace softverbs::wire
