// The connections of dead rdma_cm processes (orphans.hpp says what and why).
#include "cm/orphans.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cm/cm.hpp"
#include "common/state_dir.hpp"
#include "wire/registry.hpp"

namespace softverbs::cm {

namespace {

constexpr uint32_t kMagic = 0x53564345;  // "SVCE"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxRecords = 1u << 16;
constexpr ib::Time kScanInterval = 1'000'000'000;  // the kernel's DREQ is immediate; ours within a second
constexpr char kPrefix[] = "cm-established-";

struct FileHeader {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t slot;
  uint64_t start_time;  // /proc/PID/stat's, so a reused pid is not taken for the writer
  uint32_t count;
  uint32_t reserved;
};
struct Record {
  uint32_t local_id;
  uint32_t remote_id;
  uint32_t remote_qpn;
  uint32_t reserved;
  uint8_t local_gid[16];
  uint8_t peer_gid[16];
};
static_assert(sizeof(FileHeader) == 32 && sizeof(Record) == 48);

// What our file says. Never destroyed: the service thread may still use it while the process
// exits (a global's destructor would free it under that thread: ASan, hosts.cm.*).
std::vector<ib::Cm::Established>& g_published = *new std::vector<ib::Cm::Established>;
ib::Time g_next_scan = 0;

std::string file_of(long pid) { return state_dir() + "/" + kPrefix + std::to_string(pid); }

// Field 22 of /proc/PID/stat (the start time in clock ticks since boot), 0 when unknown.
uint64_t start_time_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command may hold spaces and parentheses
  if (!p) return 0;
  unsigned long long v = 0;
  // After ')': state (field 3) ... starttime (field 22) is the 20th.
  if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &v) != 1)
    return 0;
  return v;
}

bool write_all(int fd, const void* data, size_t len) {
  auto* p = static_cast<const uint8_t*>(data);
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= size_t(n);
  }
  return true;
}

// The process that wrote `h` is gone (or its pid belongs to another process now).
bool writer_dead(const FileHeader& h) {
  if (kill(h.pid, 0) != 0 && errno == ESRCH) return true;
  uint64_t now = start_time_of(h.pid);
  return h.start_time && now && now != h.start_time;
}

// Reads a file another process wrote: everything checked, nothing trusted.
bool read_file(const std::string& path, long pid, FileHeader* h, std::vector<Record>* records) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  bool ok = read(fd, h, sizeof *h) == ssize_t(sizeof *h) && h->magic == kMagic &&
            h->version == kVersion && h->pid == pid && h->pid > 0 && h->count <= kMaxRecords &&
            h->slot > 0 && h->slot < uint32_t(wire::kSlots);
  if (ok) {
    records->resize(h->count);
    size_t bytes = sizeof(Record) * h->count;
    ok = read(fd, records->data(), bytes) == ssize_t(bytes);
    char extra;
    ok = ok && read(fd, &extra, 1) == 0;  // no more than it says
  }
  close(fd);
  return ok;
}

}  // namespace

void orphans_publish_locked(const ib::Cm& cm, uint32_t slot) {
  std::vector<ib::Cm::Established> now = cm.established();
  if (now == g_published) return;
  pid_t pid = getpid();
  std::string path = file_of(pid);
  if (now.empty()) {
    unlink(path.c_str());
    g_published.clear();
    return;
  }
  if (now.size() > kMaxRecords) now.resize(kMaxRecords);
  FileHeader h{kMagic, kVersion, pid, slot, start_time_of(pid), uint32_t(now.size()), 0};
  std::vector<Record> records(now.size());
  for (size_t i = 0; i < now.size(); ++i) {
    Record& r = records[i];
    r = Record{now[i].local_id, now[i].remote_id, now[i].remote_qpn, 0, {}, {}};
    std::memcpy(r.local_gid, now[i].ep.local.data(), 16);
    std::memcpy(r.peer_gid, now[i].ep.peer.data(), 16);
  }
  // A new file renamed over the old: a reader sees one or the other, whole.
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  bool ok = write_all(fd, &h, sizeof h) && write_all(fd, records.data(), sizeof(Record) * records.size());
  close(fd);
  if (ok && rename(tmp.c_str(), path.c_str()) == 0) {
    g_published = std::move(now);
  } else {
    unlink(tmp.c_str());
  }
}

ib::Time orphans_next_scan_locked() { return g_next_scan; }

void orphans_scan_locked(ib::Cm& cm, uint32_t slot, ib::Time now) {
  if (now < g_next_scan) return;
  g_next_scan = now + kScanInterval;
  // Only the host's CM process: DREPs naming a dead process's slot are passed to it.
  if (wire::lowest_slot_with(wire::kSlotHasGsi, -1) != int(slot)) return;
  DIR* dir = opendir(state_dir().c_str());
  if (!dir) return;
  std::vector<long> dead;
  size_t prefix_len = sizeof kPrefix - 1;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, prefix_len) != 0) continue;
    const char* digits = e->d_name + prefix_len;
    char* end = nullptr;
    long pid = std::strtol(digits, &end, 10);
    if (end == digits || pid <= 0 || pid > 0x7fffffff || pid == long(getpid())) continue;
    if (*end == 0) dead.push_back(pid);
    else if (std::strcmp(end, ".tmp") == 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH)
      unlink((file_of(pid) + ".tmp").c_str());  // a writer killed mid-write
  }
  closedir(dir);
  for (long pid : dead) {
    std::string path = file_of(pid);
    FileHeader h;
    std::vector<Record> records;
    if (!read_file(path, pid, &h, &records)) {
      if (kill(pid_t(pid), 0) != 0 && errno == ESRCH) unlink(path.c_str());  // junk of the dead
      continue;
    }
    if (!writer_dead(h)) continue;
    // Whoever removes the file sends the DREQs: never two processes for one connection.
    if (unlink(path.c_str()) != 0) continue;
    for (const Record& r : records) {
      ib::Cm::Established e;
      e.local_id = r.local_id;
      e.remote_id = r.remote_id;
      e.remote_qpn = r.remote_qpn & 0xffffff;
      std::memcpy(e.ep.local.data(), r.local_gid, 16);
      std::memcpy(e.ep.peer.data(), r.peer_gid, 16);
      // Only the dead process's own comm IDs, from one of our GIDs.
      ibv_gid local;
      std::memcpy(local.raw, r.local_gid, 16);
      if ((r.local_id >> 22) != h.slot || gid_index_of_gid(local) < 0) continue;
      cm.disconnect_orphan(e, now);
    }
  }
}

}  // namespace softverbs::cm
