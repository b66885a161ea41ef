// Multicast group membership in the state directory (see mcast.hpp).
#include "wire/shm/mcast.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/state_dir.hpp"
#include "wire/registry.hpp"

namespace softverbs::wire {

namespace {

std::string group_dir() { return state_dir() + "/mcast"; }

std::string gid_hex(const ibv_gid& gid) {
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", gid.raw[i]);
  return std::string(hex, 32);
}

std::string entry_path(const ibv_gid& gid, uint32_t qpn) {
  char name[48];
  std::snprintf(name, sizeof(name), "%s.%06x", gid_hex(gid).c_str(), qpn & 0xffffff);
  return group_dir() + "/" + name;
}

// The pid an entry names, or 0 when it cannot be read.
pid_t entry_pid(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[24] = {};
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  long pid = std::strtol(buf, nullptr, 10);
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

// The groups' generation: every attach and detach (and a reader's removal of a dead
// member's entry) bumps it once the directory changed, so that a process that cached a
// group's members reads the directory again only then. 8 bytes of <state>/mcast/gen,
// mapped shared; nullptr when that fails (then every send reads the directory). A peer
// that writes it can only make us read the directory more often, or (keeping it still
// across a change) miss members until the next change, which it could do by removing
// their entries.
std::atomic<uint64_t>* generation() {
  static std::once_flag once;
  static std::atomic<uint64_t>* word = nullptr;
  std::call_once(once, [] {
    mkdir(state_dir().c_str(), 0700);
    mkdir(group_dir().c_str(), 0700);
    int fd = open((group_dir() + "/gen").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    struct stat st{};
    if (fstat(fd, &st) == 0 && (st.st_size >= 8 || ftruncate(fd, 8) == 0)) {
      void* m = mmap(nullptr, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) word = static_cast<std::atomic<uint64_t>*>(m);
    }
    close(fd);
  });
  return word;
}

void bump_generation() {
  if (std::atomic<uint64_t>* g = generation()) g->fetch_add(1, std::memory_order_seq_cst);
}

// Members as last read from the directory: their QPN and owner, at that generation.
struct Member {
  uint32_t qpn;
  pid_t pid;
};
struct CachedGroup {
  uint64_t generation = 0;
  std::vector<Member> members;
};
std::mutex g_cache_mu;
std::map<std::array<uint8_t, 16>, CachedGroup> g_cache;

std::array<uint8_t, 16> key_of(const ibv_gid& gid) {
  std::array<uint8_t, 16> k;
  std::memcpy(k.data(), gid.raw, 16);
  return k;
}

// The directory's members of gid; entries of dead processes are removed.
std::vector<Member> read_members(const ibv_gid& gid) {
  std::vector<Member> members;
  std::string dir = group_dir();
  DIR* d = opendir(dir.c_str());
  if (!d) return members;
  std::string prefix = gid_hex(gid) + ".";
  bool removed = false;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    // <32 hex>.<6 hex>, nothing else (temporary files have a suffix).
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    unsigned long qpn = std::strtoul(name.c_str() + prefix.size(), &end, 16);
    if (!end || *end || qpn == 0 || qpn >= 0xffffff) continue;
    std::string path = dir + "/" + name;
    pid_t owner = slot_owner(slot_of_qpn(static_cast<uint32_t>(qpn)));
    if (owner == 0 || entry_pid(path) != owner) {
      unlink(path.c_str());  // its process is gone: the QP number may be someone else's now
      removed = true;
      continue;
    }
    members.push_back({static_cast<uint32_t>(qpn), owner});
  }
  closedir(d);
  if (removed) bump_generation();
  return members;
}

}  // namespace

bool is_multicast_gid(const ibv_gid& gid) {
  if (gid.raw[0] == 0xff) return true;
  static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, v4_mapped, 12) == 0 && (gid.raw[12] & 0xf0) == 0xe0;
}

int mcast_attach(const ibv_gid& gid, uint32_t qpn) {
  if (!is_multicast_gid(gid)) return EINVAL;
  mkdir(state_dir().c_str(), 0700);
  mkdir(group_dir().c_str(), 0700);
  // Written under a temporary name and renamed: a reader never sees an empty entry.
  std::string path = entry_path(gid, qpn);
  std::string tmp = path + ".tmp" + std::to_string(self_pid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  std::string pid = std::to_string(self_pid()) + "\n";
  bool ok = write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    int err = ok ? errno : EIO;
    unlink(tmp.c_str());
    return err;
  }
  bump_generation();
  return 0;
}

int mcast_detach(const ibv_gid& gid, uint32_t qpn) {
  if (unlink(entry_path(gid, qpn).c_str()) != 0) return EINVAL;
  bump_generation();
  return 0;
}

std::vector<uint32_t> mcast_members(const ibv_gid& gid) {
  std::atomic<uint64_t>* g = generation();
  // Read before the directory: a change during the read leaves the cache one behind.
  const uint64_t now = g ? g->load(std::memory_order_seq_cst) : 0;
  std::vector<uint32_t> qpns;
  std::lock_guard<std::mutex> lock(g_cache_mu);
  if (g) {
    auto it = g_cache.find(key_of(gid));
    // Cached at this generation, and every member's process still holds its slot (one
    // that died without detaching changes no file).
    if (it != g_cache.end() && it->second.generation == now) {
      bool alive = true;
      for (const Member& m : it->second.members)
        if (slot_owner(slot_of_qpn(m.qpn)) != m.pid) alive = false;
      if (alive) {
        for (const Member& m : it->second.members) qpns.push_back(m.qpn);
        return qpns;
      }
    }
  }
  std::vector<Member> members = read_members(gid);
  for (const Member& m : members) qpns.push_back(m.qpn);
  if (g) g_cache[key_of(gid)] = {now, std::move(members)};
  return qpns;
}

}  // namespace softverbs::wire
