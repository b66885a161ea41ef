// Multicast group membership in the state directory (see mcast.hpp).
#include "wire/shm/mcast.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

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
  return 0;
}

int mcast_detach(const ibv_gid& gid, uint32_t qpn) {
  return unlink(entry_path(gid, qpn).c_str()) == 0 ? 0 : EINVAL;
}

std::vector<uint32_t> mcast_members(const ibv_gid& gid) {
  std::vector<uint32_t> qpns;
  std::string dir = group_dir();
  DIR* d = opendir(dir.c_str());
  if (!d) return qpns;
  std::string prefix = gid_hex(gid) + ".";
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
      continue;
    }
    qpns.push_back(static_cast<uint32_t>(qpn));
  }
  closedir(d);
  return qpns;
}

}  // namespace softverbs::wire
