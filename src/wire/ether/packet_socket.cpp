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
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

namespace softverbs::wire::ether {

namespace {

constexpr size_t kEthHeader = 14, kVlanTag = 4;
// A poller seen within this keeps the receiver thread off the socket, which looks again
// this often meanwhile (a timer, not a spin).
constexpr int64_t kPollerGraceNs = 2'000'000;
constexpr int kParkedLookMs = 10;
std::atomic<int> g_receiving{0};

int64_t steady_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

struct Port {
  std::mutex mu;
  int senders = 0;  // raw QPs holding the sender
  std::atomic<int> send_fd{-1};
  int ifindex = 0;
  size_t mtu = 1500;
  bool loopback = false;  // lo: every frame comes back in; its outgoing copy is a duplicate
  bool promiscuous = false;  // the receiver's PACKET_MR_PROMISC membership
  uint64_t promisc_generation = 0;
  uint8_t mac[6] = {};
  int receivers = 0;  // flows holding the receiver
  int recv_fd = -1;   // also under read_mu: pollers read it there
  int stop_fd = -1;
  int wake_fd = -1;   // stop_polling: watch the socket again now
  // Who reads the socket: the receiver thread or a polling application thread, one at a
  // time, so frames are steered in the order they came.
  std::mutex read_mu;
  std::atomic<int64_t> app_polled_ns{0};  // the last empty poll of a raw-fed CQ
  // Set by stop_polling (the application armed a CQ to wait): its polls do not keep the
  // thread off the socket until one of them takes a frame itself (it is polling again).
  std::atomic<bool> waiter{false};
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
  g_receiving.store(0, std::memory_order_relaxed);
  for (int fd : {old->send_fd.load(), old->recv_fd, old->stop_fd, old->wake_fd})
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

// Room for the largest frame any interface (lo: 64 KiB MTU) hands us, with 4 bytes in front
// for a VLAN tag the kernel took off (below).
constexpr size_t kRxBuffer = kVlanTag + 65536 + kEthHeader + kVlanTag;

// Takes one frame off the socket and hands it to `handler`; false when none waits.
// Caller holds p->read_mu.
bool receive_one(Port* p, int fd, uint8_t* buf, FrameHandler handler) {
  uint8_t* const frame_at = buf + kVlanTag;
  const size_t room = kRxBuffer - kVlanTag;
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(tpacket_auxdata))];
  for (;;) {
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
    if (n < 0) return false;  // EAGAIN: drained
    if (static_cast<size_t>(n) > room || static_cast<size_t>(n) < kEthHeader) continue;
    bool outgoing = from.sll_pkttype == PACKET_OUTGOING;
    if (outgoing && p->loopback) continue;  // lo hands it to us again as it comes in
    // The kernel takes an 802.1Q tag off before packet sockets see the frame (and a NIC
    // with VLAN offload does too); the tag is in the aux data. A raw QP gets the frame as
    // it was on the wire, tag included: put it back.
    uint8_t* frame = frame_at;
    size_t len = static_cast<size_t>(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_PACKET || c->cmsg_type != PACKET_AUXDATA) continue;
      tpacket_auxdata aux;
      std::memcpy(&aux, CMSG_DATA(c), sizeof(aux));
      if (!(aux.tp_status & TP_STATUS_VLAN_VALID)) break;
      uint16_t tpid = htons((aux.tp_status & TP_STATUS_VLAN_TPID_VALID) ? aux.tp_vlan_tpid : 0x8100);
      uint16_t tci = htons(aux.tp_vlan_tci);
      frame = buf;
      std::memmove(frame, frame_at, 12);  // the MACs move up; the tag goes after them
      std::memcpy(frame + 12, &tpid, 2);
      std::memcpy(frame + 14, &tci, 2);
      len += kVlanTag;
      break;
    }
    handler(frame, len, outgoing);
    return true;
  }
}

void receive_loop(Port* p, int fd, int stop_fd, int wake_fd, FrameHandler handler) {
  std::vector<uint8_t> buf(kRxBuffer);
  for (;;) {
    // An application thread polling the CQs takes the frames itself: stay off the socket
    // (no wake-up per frame on its CPU) and look again later, or when told.
    const bool parked = steady_ns() - p->app_polled_ns.load(std::memory_order_relaxed) < kPollerGraceNs;
    pollfd fds[3] = {{parked ? -1 : fd, POLLIN, 0}, {stop_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (poll(fds, 3, parked ? kParkedLookMs : -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (fds[2].revents) {
      uint64_t v;
      (void)!read(wake_fd, &v, sizeof(v));
    }
    if (!(fds[0].revents & POLLIN)) continue;
    std::lock_guard<std::mutex> lock(p->read_mu);
    for (int k = 0; k < kFramesPerPoll && receive_one(p, fd, buf.data(), handler); ++k) {
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

bool receiving() { return g_receiving.load(std::memory_order_relaxed) > 0; }

int poll_frames(int max) {
  Port& p = port();
  // The usual event loop arms, polls the CQ empty once more, then sleeps: that last poll
  // must not send the thread off the socket (the frame it waits for would wait for the
  // thread's next look).
  const bool waiting = p.waiter.load(std::memory_order_relaxed);
  if (!waiting) p.app_polled_ns.store(steady_ns(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> read(p.read_mu, std::try_to_lock);
  if (!read.owns_lock() || p.recv_fd < 0 || !p.handler) return 0;  // the thread is at it
  thread_local std::vector<uint8_t> buf(kRxBuffer);
  int n = 0;
  while (n < max && receive_one(&p, p.recv_fd, buf.data(), p.handler)) ++n;
  if (n > 0 && waiting) p.waiter.store(false, std::memory_order_relaxed);  // polling again
  return n;
}

void stop_polling() {
  Port& p = port();
  p.waiter.store(true, std::memory_order_relaxed);
  if (p.app_polled_ns.exchange(0, std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(p.mu);
  uint64_t one = 1;
  if (p.wake_fd >= 0) (void)!write(p.wake_fd, &one, sizeof(one));
}

void set_promiscuous(bool on, uint64_t generation) {
  Port& p = port();
  std::lock_guard<std::mutex> lock(p.mu);
  if (generation < p.promisc_generation) return;  // a newer answer was applied already
  p.promisc_generation = generation;
  if (p.recv_fd < 0 || p.promiscuous == on) return;
  set_membership(p, p.recv_fd, PACKET_MR_PROMISC, on);
  p.promiscuous = on;
}

int send_frame(const iovec* v, int n, size_t len) {
  if (len < kEthHeader) return EMSGSIZE;
  // Four bytes more than MTU + header only for a frame that carries a VLAN tag (the
  // kernel's own rule, dev_validate_header/packet_snd).
  const size_t limit = max_frame();
  if (len > limit - kVlanTag) {
    const uint16_t type = static_cast<uint16_t>(byte_at(v, n, 12) << 8 | byte_at(v, n, 13));
    const bool tagged = type == 0x8100 || type == 0x88a8;
    if (!tagged || len > limit) return EMSGSIZE;
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
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0 || wake < 0) {
    int err = errno;
    close(fd);
    if (stop >= 0) close(stop);
    if (wake >= 0) close(wake);
    return err;
  }
  {
    std::lock_guard<std::mutex> read(p.read_mu);  // what a poller reads
    p.handler = handler;
    p.recv_fd = fd;
  }
  p.stop_fd = stop;
  p.wake_fd = wake;
  p.app_polled_ns.store(0, std::memory_order_relaxed);
  p.thread = std::thread(receive_loop, &p, fd, stop, wake, handler);
  p.receivers = 1;
  g_receiving.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void release_receiver() {
  Port& p = port();
  std::thread done;
  int fd, stop, wake;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.receivers == 0 || --p.receivers > 0) return;
    g_receiving.fetch_sub(1, std::memory_order_relaxed);
    done = std::move(p.thread);
    fd = p.recv_fd;
    stop = p.stop_fd;
    wake = p.wake_fd;
    p.stop_fd = p.wake_fd = -1;
    uint64_t one = 1;
    if (write(stop, &one, sizeof(one)) < 0) { /* the thread still sees the fd close below */ }
  }
  // Outside the lock: the thread may be in the handler, which takes the flows' lock.
  if (done.joinable() && done.get_id() != std::this_thread::get_id()) done.join();
  else if (done.joinable()) done.detach();
  {
    std::lock_guard<std::mutex> lock(p.mu);       // set_promiscuous reads it there
    std::lock_guard<std::mutex> read(p.read_mu);  // no poller is in the socket now
    if (p.recv_fd == fd) p.recv_fd = -1;
  }
  close(fd);
  close(stop);
  close(wake);
}

}  // namespace softverbs::wire::ether
