// The RoCE v2 port's multicast groups (decision 0008): one socket per (group, interface) this
// process joined, bound to the group's address, the UDP port and the interface.
//
// Why not join on the shared socket: the kernel gives a multicast datagram to every socket
// that matches it (bound to the port, joined to the group or IP_MULTICAST_ALL), except when
// exactly one does; then the early demux hands it to that socket, and since Linux 6.5 the
// socket's SO_REUSEPORT group picks again (inet_steal_sock), with our steering program,
// which would send it to whichever process the program names for QPN 0xFFFFFF. A socket
// bound to the group's address and interface is in a reuseport group of its own with the
// other processes' sockets for that (group, interface), all of which joined: whichever the
// kernel picks is a member. The shared socket sets IP_MULTICAST_ALL to 0, so it never
// matches a group, and drops any multicast that reaches it still (Port::route_received).
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "wire/roce/port.hpp"
#include "wire/roce/port_internal.hpp"

namespace softverbs::wire::roce {

using namespace detail;

namespace {

// IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP on `fd`, for `group` on the interface `ifindex`. An
// IPv4 group on a dual-stack socket is joined at the IPv4 level.
int join(int fd, const IpAddress& group, int ifindex) {
  int rc;
  if (group.is_v4()) {
    ip_mreqn req{};
    req.imr_multiaddr.s_addr = group.v4_network_order();
    req.imr_ifindex = ifindex;
    rc = setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &req, sizeof req);
  } else {
    ipv6_mreq req{};
    std::memcpy(&req.ipv6mr_multiaddr, group.bytes.data(), 16);
    req.ipv6mr_interface = unsigned(ifindex);
    rc = setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &req, sizeof req);
  }
  return rc == 0 ? 0 : -errno;
}

// Binds `fd` to one interface: SO_BINDTOIFINDEX (Linux 5.0), else SO_BINDTODEVICE by name.
// Unprivileged since Linux 5.7 for a socket not bound to one yet.
int bind_to_interface(int fd, int ifindex) {
  if (setopt(fd, SOL_SOCKET, SO_BINDTOIFINDEX, ifindex) == 0) return 0;
  char name[IF_NAMESIZE] = {};
  if (!if_indextoname(unsigned(ifindex), name)) return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, name, socklen_t(std::strlen(name))) == 0) return 0;
  return -errno;
}

}  // namespace

// A socket that receives `group` on `ifindex`, joined and registered with the port's epoll;
// its fd, or -errno. Caller holds open_mu_.
int Port::open_multicast_socket(const IpAddress& group, int ifindex) {
  const bool v6 = ipv6_;
  int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  auto fail = [fd](int err) {
    ::close(fd);
    return err;
  };
  if (setopt(fd, SOL_SOCKET, SO_REUSEPORT, 1) != 0) return fail(-errno);
  setopt(fd, SOL_SOCKET, SO_RCVBUF, 1 << 20);  // capped by rmem_max; best effort
  setopt(fd, IPPROTO_IP, IP_PKTINFO, 1);
  setopt(fd, IPPROTO_IP, IP_RECVTOS, 1);
  setopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, 0);
  if (v6) {
    if (setopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, group.is_v4() ? 0 : 1) != 0) return fail(-errno);
    setopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1);
    setopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, 1);
    setopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
  }
  // Best effort: without it (kernels before 5.7, unprivileged) a host with the group joined
  // on several interfaces by different processes may see a datagram go to the wrong one.
  bind_to_interface(fd, ifindex);
  sockaddr_storage at;
  const socklen_t len = to_sockaddr(group, config_.udp_port, v6, at);
  if (len == 0) return fail(-EAFNOSUPPORT);
  if (v6 && !group.is_v4()) {
    // Link-scope groups (ff02::...) name their interface.
    reinterpret_cast<sockaddr_in6*>(&at)->sin6_scope_id = uint32_t(ifindex);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&at), len) != 0) return fail(-errno);
  if (int err = join(fd, group, ifindex)) return fail(err);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagMulticast | uint64_t(uint32_t(fd)) << 32;
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    multicast_fds_.insert(fd);
  }
  if (epoll_ctl(fd_epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int err = -errno;
    std::lock_guard<std::mutex> lock(group_mu_);
    multicast_fds_.erase(fd);
    return fail(err);
  }
  return fd;
}

int Port::join_group(const IpAddress& group, int ifindex) {
  if (!group.is_multicast() || ifindex <= 0) return -EINVAL;
  std::lock_guard<std::mutex> lock(open_mu_);
  if (fd_group_ < 0 || fd_epoll_ < 0) return -ENOTCONN;
  if (!ipv6_ && !group.is_v4()) return -EAFNOSUPPORT;
  auto it = joins_.find({group, ifindex});
  if (it != joins_.end()) {
    ++it->second.count;
    return 0;
  }
  const int fd = open_multicast_socket(group, ifindex);
  if (fd < 0) return fd;
  joins_[{group, ifindex}] = {fd, 1};
  return 0;
}

int Port::leave_group(const IpAddress& group, int ifindex) {
  std::lock_guard<std::mutex> lock(open_mu_);
  auto it = joins_.find({group, ifindex});
  if (it == joins_.end()) return -EINVAL;
  if (--it->second.count > 0) return 0;
  const int fd = it->second.fd;
  joins_.erase(it);
  // Under group_mu_: the port's thread never receives from a closed (or reused) fd.
  std::lock_guard<std::mutex> rx(group_mu_);
  multicast_fds_.erase(fd);
  if (fd_epoll_ >= 0) epoll_ctl(fd_epoll_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);  // leaves the group: the kernel counts the membership per socket
  return 0;
}

int Port::group_joins(const IpAddress& group, int ifindex) const {
  std::lock_guard<std::mutex> lock(open_mu_);
  auto it = joins_.find({group, ifindex});
  return it == joins_.end() ? 0 : it->second.count;
}

void Port::close_multicast_fds() {
  for (auto& [key, joined] : joins_) ::close(joined.fd);
  joins_.clear();
  multicast_fds_.clear();
}

void Port::handle_multicast(int fd) {
  std::lock_guard<std::mutex> lock(group_mu_);
  if (multicast_fds_.count(fd)) receive_locked(fd, false, true);
}

}  // namespace softverbs::wire::roce
