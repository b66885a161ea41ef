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
  bool promiscuous = false;  // the receiver's PACKET_MR_PROMISC membership
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

// Frames taken per wake-up before the stop fd is looked at again: a socket that never
// drains (all of lo's traffic passes here) must not keep release_receiver waiting.
constexpr int kFramesPerPoll = 64;

void receive_loop(Port* p, int fd, int stop_fd, FrameHandler handler) {
  // Room for the largest frame any interface (lo: 64 KiB MTU) hands us, with 4 bytes in
  // front for a VLAN tag the kernel took off (below).
  std::vector<uint8_t> buf(kVlanTag + 65536 + kEthHeader + kVlanTag);
  uint8_t* const frame_at = buf.data() + kVlanTag;
  const size_t room = buf.size() - kVlanTag;
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(tpacket_auxdata))];
  pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    for (int k = 0; k < kFramesPerPoll; ++k) {
      sockaddr_ll from{};
      iovec v{frame_at, room};
      msghdr msg{};
      msg.msg_name = &from;
      msg.msg_namelen = sizeof(from);
      msg.msg_iov = &v;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_TRUNC);
      if (n < 0) break;  // EAGAIN: drained
      if (static_cast<size_t>(n) > room || static_cast<size_t>(n) < kEthHeader) continue;
      bool outgoing = from.sll_pkttype == PACKET_OUTGOING;
      if (outgoing && p->loopback) continue;  // lo hands it to us again as it comes in
      // The kernel takes an 802.1Q tag off before packet sockets see the frame (and a NIC
      // with VLAN offload does too); the tag is in the aux data. A raw QP gets the frame
      // as it was on the wire, tag included: put it back.
      uint8_t* frame = frame_at;
      size_t len = static_cast<size_t>(n);
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_PACKET || c->cmsg_type != PACKET_AUXDATA) continue;
        tpacket_auxdata aux;
        std::memcpy(&aux, CMSG_DATA(c), sizeof(aux));
        if (!(aux.tp_status & TP_STATUS_VLAN_VALID)) break;
        uint16_t tpid = htons((aux.tp_status & TP_STATUS_VLAN_TPID_VALID) ? aux.tp_vlan_tpid : 0x8100);
        uint16_t tci = htons(aux.tp_vlan_tci);
        frame = buf.data();
        std::memmove(frame, frame_at, 12);  // the MACs move up; the tag goes after them
        std::memcpy(frame + 12, &tpid, 2);
        std::memcpy(frame + 14, &tci, 2);
        len += kVlanTag;
        break;
      }
      handler(frame, len, outgoing);
    }
  }
}

// Receives frames to every address on the interface (PACKET_MR_PROMISC) or to every group
// (PACKET_MR_ALLMULTI): the kernel counts memberships per socket and drops them with it.
void set_membership(const Port& p, int fd, int type, bool on) {
  packet_mreq m{};
  m.mr_ifindex = p.ifindex;
  m.mr_type = static_cast<unsigned short>(type);
  setsockopt(fd, SOL_PACKET, on ? PACKET_ADD_MEMBERSHIP : PACKET_DROP_MEMBERSHIP, &m, sizeof(m));
}

// Byte `at` of a frame gathered from v[0..n) (0 past its end).
uint8_t byte_at(const iovec* v, int n, size_t at) {
  for (int i = 0; i < n; ++i) {
    if (at < v[i].iov_len) return static_cast<const uint8_t*>(v[i].iov_base)[at];
    at -= v[i].iov_len;
  }
  return 0;
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

void set_promiscuous(bool on) {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.recv_fd < 0 || p.promiscuous == on) return;
  set_membership(p, p.recv_fd, PACKET_MR_PROMISC, on);
  p.promiscuous = on;
}

int send_frame(const iovec* v, int n, size_t len) {
  if (len < kEthHeader) return EMSGSIZE;
  // Four bytes more than MTU + header only for a frame that carries a VLAN tag (the
  // kernel's own rule, dev_validate_header/packet_snd).
  if (len > max_frame() - kVlanTag) {
    const uint16_t type = static_cast<uint16_t>(byte_at(v, n, 12) << 8 | byte_at(v, n, 13));
    const bool tagged = type == 0x8100 || type == 0x88a8;
    if (!tagged || len > max_frame()) return EMSGSIZE;
  }
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(v);
  msg.msg_iovlen = static_cast<size_t>(n);
  int fd = port().send_fd.load(std::memory_order_acquire);
  if (fd < 0) return EBADF;
  ssize_t sent;
  while ((sent = sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (sent < 0 && errno == EMSGSIZE) return EMSGSIZE;
  return 0;  // a frame the link refused (down, no buffer) is lost, as on the wire
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
  int one = 1;
  setsockopt(fd, SOL_PACKET, PACKET_AUXDATA, &one, sizeof(one));  // VLAN tags (receive_loop)
  // Group frames reach the rules whether or not the host joined the group, as on a NIC.
  set_membership(p, fd, PACKET_MR_ALLMULTI, true);
  p.promiscuous = false;
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
