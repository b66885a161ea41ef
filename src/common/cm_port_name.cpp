// The abstract names of rdma_cm ports and who holds them (see cm_port_name.hpp).
#include "common/cm_port_name.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/state_dir.hpp"

namespace softverbs {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

socklen_t cm_port_name(int ps, uint16_t port, sockaddr_un* un) {
  // A state directory (a test's own) is a host of its own: it is part of the name.
  static const uint64_t host = fnv1a(state_dir());
  std::memset(un, 0, sizeof(*un));
  un->sun_family = AF_UNIX;
  int n = std::snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "softverbs-cm-%016llx-%x-%u",
                        static_cast<unsigned long long>(host), ps, port);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

pid_t cm_port_holder(int ps, uint16_t port) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  sockaddr_un un;
  socklen_t len = cm_port_name(ps, port, &un);
  pid_t pid = 0;
  if (connect(s, reinterpret_cast<sockaddr*>(&un), len) == 0) {
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) pid = cred.pid;
  }
  close(s);
  return pid;
}

}  // namespace softverbs
