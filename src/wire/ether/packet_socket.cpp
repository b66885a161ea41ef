// AF_PACKET sockets for raw packet QPs (packet_socket.hpp).
//
// Two sockets, not one: the kernel hands a frame sent on a packet socket to every other
// packet socket of the interface (as PACKET_OUTGOING) but never back to the one that sent
// it, so with separate sender and receiver the raw QPs of this process see each other's
// frames just as they see those of other processes.
#include "wire/ether/packet_socket.hpp"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace softverbs::wire::ether {

namespace {

constexpr size_t kEthHeader = 14, kVlanTag = 4;

struct Port {
  std::mutex mu;
  int senders = 0;  // raw QPs holding the sender
  std::atomic<int> send_fd{-1};
  int ifindex = 0;
  size_t mtu = 1500;
  bool loopback = false;  // lo: every frame comes back in; its outgoing copy is a duplicate
  uint8_t mac[6] = {};
  int receivers = 0;  // flows holding the receiver
  int recv_fd = -1;
  int stop_fd = -1;
  FrameHandler handler = nullptr;
  std::thread thread;
  Port* before_fork = nullptr;  // the parent's state in a forked child: kept, never used
};

Port* the_port = nullptr;

// A forked child starts with no sender and no receiver: the parent's thread is not in it,
// and its lock may have been held at the fork. The old state is left (its thread object
// names a thread of the parent); its sockets are the child's copies, closed.
void forget_parent_port() {
  Port* old = the_port;
  the_port = new Port;
  the_port->before_fork = old;  // still reachable: not a leak to LeakSanitizer
  for (int fd : {old->send_fd.load(), old->recv_fd, old->stop_fd})
    if (fd >= 0) close(fd);
}

Port& port() {
  // Never destroyed: a receiver thread may outlive static destructors.
  static Port* first = [] {
    the_port = new Port;
    pthread_atfork(nullptr, nullptr, forget_parent_port);
    return the_port;
  }();
  (void)first;
  return *the_port;
}

// The interface of the default IPv4 route, from /proc/net/route ("" when there is none).
std::string default_route_netdev() {
  FILE* f = std::fopen("/proc/net/route", "re");
  if (!f) return {};
  char line[512];
  std::string found;
  if (std::fgets(line, sizeof(line), f)) {  // the header
    while (std::fgets(line, sizeof(line), f)) {
      char name[IF_NAMESIZE + 1];
      unsigned dest = 0, gateway = 0, flags = 0;
      if (std::sscanf(line, "%16s %x %x %x", name, &dest, &gateway, &flags) != 4) continue;
      if (dest == 0 && (flags & 0x1 /* RTF_UP */)) {
        found = name;
        break;
      }
    }
  }
  std::fclose(f);
  return found;
}

// Learns the interface's index, MTU, flags and MAC (caller holds port().mu).
int look_up_interface(Port& p) {
  std::string name = netdev_name();
  if (name.size() >= IF_NAMESIZE) return ENODEV;
  int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return errno;
  ifreq req{};
  std::memcpy(req.ifr_name, name.c_str(), name.size() + 1);
  int err = 0;
  if (ioctl(probe, SIOCGIFINDEX, &req) != 0) {
    err = ENODEV;
  } else {
    p.ifindex = req.ifr_ifindex;
    if (ioctl(probe, SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) p.mtu = static_cast<size_t>(req.ifr_mtu);
    if (ioctl(probe, SIOCGIFFLAGS, &req) == 0) p.loopback = (req.ifr_flags & IFF_LOOPBACK) != 0;
    std::memset(p.mac, 0, sizeof(p.mac));
    if (ioctl(probe, SIOCGIFHWADDR, &req) == 0) std::memcpy(p.mac, req.ifr_hwaddr.sa_data, 6);
  }
  close(probe);
  return err;
}

// A packet socket bound to the interface; `protocol` 0 receives nothing (the sender).
int open_bound(const Port& p, uint16_t protocol, int* fd) {
  int s = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(protocol));
  if (s < 0) return errno;
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(protocol);
  addr.sll_ifindex = p.ifindex;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(s);
    return err;
  }
  *fd = s;
  return 0;
}

void receive_loop(Port* p, int fd, int stop_fd, FrameHandler handler) {
  // Room for the largest frame any interface (lo: 64 KiB MTU) hands us.
  std::vector<uint8_t> buf(65536 + kEthHeader + kVlanTag);
  pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    for (;;) {
      sockaddr_ll from{};
      socklen_t from_len = sizeof(from);
      ssize_t n = recvfrom(fd, buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC,
                           reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 0) break;  // EAGAIN: drained
      if (static_cast<size_t>(n) > buf.size() || static_cast<size_t>(n) < kEthHeader) continue;
      bool outgoing = from.sll_pkttype == PACKET_OUTGOING;
      if (outgoing && p->loopback) continue;  // lo hands it to us again as it comes in
      handler(buf.data(), static_cast<size_t>(n), outgoing);
    }
  }
}

}  // namespace

std::string netdev_name() {
  if (const char* env = std::getenv("SOFTVERBS_RAW_NETDEV"); env && *env) return env;
  std::string def = default_route_netdev();
  return def.empty() ? "lo" : def;
}

int hold_sender() {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.senders > 0) {
    ++p.senders;
    return 0;
  }
  if (int err = look_up_interface(p)) return err;
  int fd = -1;
  if (int err = open_bound(p, 0, &fd)) return err;
  p.send_fd.store(fd, std::memory_order_release);
  p.senders = 1;
  return 0;
}

void release_sender() {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.senders == 0 || --p.senders > 0) return;
  close(p.send_fd.exchange(-1));
}

size_t max_frame() {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.mtu + kEthHeader + kVlanTag;
}

const uint8_t* own_mac() { return port().mac; }

int send_frame(const iovec* v, int n, size_t len) {
  if (len < kEthHeader || len > max_frame()) return EMSGSIZE;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(v);
  msg.msg_iovlen = static_cast<size_t>(n);
  int fd = port().send_fd.load(std::memory_order_acquire);
  if (fd < 0) return EBADF;
  while (sendmsg(fd, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  return 0;  // a frame the link refused is lost, as on the wire
}

int hold_receiver(FrameHandler handler) {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.receivers > 0) {
    ++p.receivers;
    return 0;
  }
  if (p.senders == 0)
    if (int err = look_up_interface(p)) return err;
  int fd = -1;
  if (int err = open_bound(p, ETH_P_ALL, &fd)) return err;
  int stop = eventfd(0, EFD_CLOEXEC);
  if (stop < 0) {
    int err = errno;
    close(fd);
    return err;
  }
  p.recv_fd = fd;
  p.stop_fd = stop;
  p.handler = handler;
  p.thread = std::thread(receive_loop, &p, fd, stop, handler);
  p.receivers = 1;
  return 0;
}

void release_receiver() {
  Port& p = port();
  std::thread done;
  int fd, stop;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.receivers == 0 || --p.receivers > 0) return;
    done = std::move(p.thread);
    fd = p.recv_fd;
    stop = p.stop_fd;
    p.recv_fd = p.stop_fd = -1;
    uint64_t one = 1;
    if (write(stop, &one, sizeof(one)) < 0) { /* the thread still sees the fd close below */ }
  }
  // Outside the lock: the thread may be in the handler, which takes the flows' lock.
  if (done.joinable() && done.get_id() != std::this_thread::get_id()) done.join();
  else if (done.joinable()) done.detach();
  close(fd);
  close(stop);
}

}  // namespace softverbs::wire::ether
