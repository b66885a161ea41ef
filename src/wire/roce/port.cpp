// The RoCE v2 port (see port.hpp and docs/decisions/0006-roce-port-4791.md): opening and
// closing, sending, timers, and the thread that receives. Steering (probe rounds) and
// forwarding are in port_steering.cpp.
#include "wire/roce/port.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "common/fast_tls.hpp"
#include "common/state_dir.hpp"
#include "wire/registry.hpp"
#include "wire/roce/faults.hpp"
#include "wire/roce/port_internal.hpp"
#include "wire/roce/steering.hpp"

namespace softverbs::wire::roce {

using namespace detail;

namespace detail {

socklen_t to_sockaddr(const IpAddress& ip, uint16_t port, bool ipv6, sockaddr_storage& out) {
  std::memset(&out, 0, sizeof out);
  if (ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&out);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    std::memcpy(&a->sin6_addr, ip.bytes.data(), 16);
    return sizeof *a;
  }
  if (!ip.is_v4()) return 0;
  auto* a = reinterpret_cast<sockaddr_in*>(&out);
  a->sin_family = AF_INET;
  a->sin_port = htons(port);
  a->sin_addr.s_addr = ip.v4_network_order();
  return sizeof *a;
}

bool from_sockaddr(const sockaddr_storage& in, socklen_t len, IpAddress& ip, uint16_t& port) {
  if (in.ss_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&in);
    std::memcpy(ip.bytes.data(), &a->sin6_addr, 16);
    port = ntohs(a->sin6_port);
    return true;
  }
  if (in.ss_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&in);
    ip = IpAddress::v4(a->sin_addr.s_addr);
    port = ntohs(a->sin_port);
    return true;
  }
  return false;
}

sockaddr_un unix_sockaddr(const std::string& abstract_name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(abstract_name.size(), sizeof a.sun_path);
  std::memcpy(a.sun_path, abstract_name.data(), n);
  len = socklen_t(offsetof(sockaddr_un, sun_path) + n);
  return a;
}

}  // namespace detail

int detail::setopt(int fd, int level, int name, int value) {
  return setsockopt(fd, level, name, &value, sizeof value);
}

namespace {

// The local address, interface and TOS from a received datagram's control messages; returns
// the size of its segments when the kernel coalesced several (UDP_GRO), else 0.
size_t read_control(msghdr& msg, Datagram& d) {
  size_t segment = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      d.dst = IpAddress::v4(info.ipi_addr.s_addr);
      d.ifindex = info.ipi_ifindex;
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
      d.tos = *CMSG_DATA(c);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
      in6_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof info);
      std::memcpy(d.dst.bytes.data(), &info.ipi6_addr, 16);
      d.ifindex = int(info.ipi6_ifindex);
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
      int tclass;
      std::memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
      d.tos = uint8_t(tclass);
    } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int size;
      std::memcpy(&size, CMSG_DATA(c), sizeof size);
      if (size > 0) segment = size_t(size);
    }
  }
  return segment;
}

// Ports alive in this process, so a forked child can drop its copies of their sockets
// (the parent's group socket in a child would keep the parent's place in the group).
std::mutex g_ports_mu;
std::set<Port*>* g_ports = nullptr;

}  // namespace

// ---- IpAddress ---------------------------------------------------------------------------

IpAddress IpAddress::from_gid(const uint8_t (&gid)[16]) {
  IpAddress a;
  std::memcpy(a.bytes.data(), gid, 16);
  return a;
}

IpAddress IpAddress::v4(uint32_t network_order) {
  IpAddress a;
  a.bytes[10] = a.bytes[11] = 0xff;
  std::memcpy(&a.bytes[12], &network_order, 4);
  return a;
}

bool IpAddress::is_v4() const {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(bytes.data(), kMapped, 12) == 0;
}

uint32_t IpAddress::v4_network_order() const {
  uint32_t v;
  std::memcpy(&v, &bytes[12], 4);
  return v;
}

bool IpAddress::is_loopback() const {
  if (is_v4()) return bytes[12] == 127;
  static constexpr uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(bytes.data(), kLoop6, 16) == 0;
}

bool IpAddress::is_multicast() const {
  return is_v4() ? (bytes[12] & 0xf0) == 0xe0 : bytes[0] == 0xff;
}

std::string IpAddress::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (is_v4()) inet_ntop(AF_INET, &bytes[12], text, sizeof text);
  else inet_ntop(AF_INET6, bytes.data(), text, sizeof text);
  return text;
}

// ---- fork --------------------------------------------------------------------------------

struct PortForkGuard {
  static void prepare() { g_ports_mu.lock(); }
  static void parent() { g_ports_mu.unlock(); }
  // The child has no port thread; its copies of the sockets go, so that only the parent's
  // sockets stay in the group. Locks another thread held at fork are made anew.
  static void child() {
    if (g_ports) {
      for (Port* p : *g_ports) {
        new (&p->open_mu_) std::mutex;
        new (&p->timer_mu_) std::mutex;
        new (&p->stats_mu_) std::mutex;
        new (&p->group_mu_) std::mutex;
        new (&p->park_mu_) std::mutex;
        new (&p->rounds_cv_) std::condition_variable;
        p->close_fds();
        p->users_ = 0;
        p->thread_running_ = false;
        p->round_wanted_ = false;
        delete p->round_;
        p->round_ = nullptr;
        p->timer_queue_.clear();
        p->timer_when_.clear();
      }
    }
    g_ports_mu.unlock();
  }
};

// ---- lifetime ----------------------------------------------------------------------------

Port::Port(PortConfig config, DatagramHandler on_datagram, TimerHandler on_timer)
    : config_(std::move(config)),
      on_datagram_(std::move(on_datagram)),
      on_timer_(std::move(on_timer)),
      rx_buffers_(new uint8_t[kBatch * kRxBufferBytes]),
      forward_buffer_(sizeof(ForwardHeader) + kMaxDatagram) {
  if (config_.state_dir.empty()) config_.state_dir = softverbs::state_dir();
  if (config_.park_grace_ns < 0) config_.park_grace_ns = park_grace_from_env();
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(PortForkGuard::prepare, PortForkGuard::parent, PortForkGuard::child);
  });
  std::lock_guard<std::mutex> lock(g_ports_mu);
  if (!g_ports) g_ports = new std::set<Port*>;
  g_ports->insert(this);
}

Port::~Port() {
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    if (users_ > 0) users_ = 1;
  }
  release();
  std::lock_guard<std::mutex> lock(g_ports_mu);
  g_ports->erase(this);
}

void Port::close_fds() {
  close_multicast_fds();
  for (int* fd : {&fd_group_, &fd_forward_, &fd_lock_, &fd_epoll_, &fd_timer_, &fd_wake_})
    if (*fd >= 0) ::close(std::exchange(*fd, -1));
  for (int& fd : fd_senders_)
    if (fd >= 0) ::close(std::exchange(fd, -1));
}

int Port::acquire() {
  std::lock_guard<std::mutex> lock(open_mu_);
  if (users_ > 0) {
    ++users_;
    return 0;
  }
  slot_ = config_.slot > 0 ? config_.slot : my_slot();
  if (slot_ <= 0 || reserved_slot(slot_)) return -ENOSPC;  // no registry slot: no QPNs
  group_parked_ = false;  // the new thread receives until an application polls
  recheck_pending_ = false;
  idle_polls_ = 0;
  auto fail = [this](int err) {
    close_fds();
    return -err;
  };

  mkdir(config_.state_dir.c_str(), 0700);
  const std::string lock_path =
      config_.state_dir + "/roce-port-" + std::to_string(config_.udp_port) + ".lock";
  fd_lock_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_lock_ < 0) return fail(errno);

  // Dual-stack IPv6 sockets take IPv4 too (as ::ffff:a.b.c.d); AF_INET where IPv6 is off.
  fd_group_ = socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ipv6_ = fd_group_ >= 0;
  if (!ipv6_) fd_group_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_group_ < 0) return fail(errno);
  if (setopt(fd_group_, SOL_SOCKET, SO_REUSEPORT, 1) != 0) return fail(errno);
  setopt(fd_group_, SOL_SOCKET, SO_RCVBUF, 4 << 20);  // capped by rmem_max; best effort
  {
    int rcvbuf = 0;
    socklen_t len = sizeof rcvbuf;
    if (getsockopt(fd_group_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len) == 0 && rcvbuf > 0)
      rcvbuf_bytes_.store(size_t(rcvbuf), std::memory_order_relaxed);
  }
  setopt(fd_group_, IPPROTO_IP, IP_PKTINFO, 1);
  setopt(fd_group_, IPPROTO_IP, IP_RECVTOS, 1);
  // Multicast only for the groups this socket joined (join_group): with the default (1)
  // every socket on 4791 would get a copy of every group anyone on the host joined.
  setopt(fd_group_, IPPROTO_IP, IP_MULTICAST_ALL, 0);
  // Best effort: without it (old kernels) the kernel cuts a GSO send into its datagrams.
  if (gro_enabled()) setopt(fd_group_, SOL_UDP, UDP_GRO, 1);
  if (ipv6_) {
    if (setopt(fd_group_, IPPROTO_IPV6, IPV6_V6ONLY, 0) != 0) return fail(errno);
    setopt(fd_group_, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1);
    setopt(fd_group_, IPPROTO_IPV6, IPV6_RECVTCLASS, 1);
    setopt(fd_group_, IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);  // Linux 4.20+; best effort
  }
  sockaddr_storage any;
  const socklen_t any_len =
      to_sockaddr(ipv6_ ? IpAddress{} : IpAddress::v4(0), config_.udp_port, ipv6_, any);
  if (bind(fd_group_, reinterpret_cast<sockaddr*>(&any), any_len) != 0) return fail(errno);

  // Senders: unconnected (so IPv4 packets get ID 0) with DF, on kernel-chosen ports.
  for (int i = 0; i < kSenders; ++i) {
    int fd = socket(ipv6_ ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(errno);
    fd_senders_[i] = fd;
    if (ipv6_ && setopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, 0) != 0) return fail(errno);
    if (setopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO) != 0) return fail(errno);
    if (ipv6_ && setopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO) != 0)
      return fail(errno);
    // Our multicast never comes back to this host: its members here get their copies
    // through shared memory (decision 0008).
    setopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, 0);
    if (ipv6_) setopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 0);
    sockaddr_storage local;
    socklen_t len = to_sockaddr(ipv6_ ? IpAddress{} : IpAddress::v4(0), 0, ipv6_, local);
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), len) != 0) return fail(errno);
    len = sizeof local;
    IpAddress ignored;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        !from_sockaddr(local, len, ignored, sender_ports_[i]))
      return fail(errno ? errno : EINVAL);
  }

  fd_forward_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);  // receives with MSG_DONTWAIT
  if (fd_forward_ < 0) return fail(errno);
  if (setopt(fd_forward_, SOL_SOCKET, SO_PASSCRED, 1) != 0 ||
      setsockopt(fd_forward_, SOL_SOCKET, SO_SNDTIMEO, &kForwardWait, sizeof kForwardWait) != 0)
    return fail(errno);
  forward_congested_until_.assign(kSlots, Clock::time_point{});
  socklen_t un_len;
  sockaddr_un un =
      unix_sockaddr(forward_address(config_.state_dir, config_.udp_port, slot_), un_len);
  if (bind(fd_forward_, reinterpret_cast<sockaddr*>(&un), un_len) != 0) return fail(errno);

  fd_epoll_ = epoll_create1(EPOLL_CLOEXEC);
  fd_timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  fd_wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_epoll_ < 0 || fd_timer_ < 0 || fd_wake_ < 0) return fail(errno);
  const std::pair<int, uint32_t> watched[] = {{fd_group_, kTagGroup},
                                              {fd_forward_, kTagForward},
                                              {fd_senders_[0], kTagAnswers},
                                              {fd_timer_, kTagTimer},
                                              {fd_wake_, kTagWake}};
  for (auto [fd, tag] : watched) {
    epoll_event ev{};
    // The group socket is one-shot: re-armed after each wake-up unless an application
    // polls it itself (rearm_group).
    ev.events = tag == kTagGroup ? EPOLLIN | EPOLLONESHOT : EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(fd_epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) return fail(errno);
  }

  stop_ = false;
  // Joining: learn the indices and attach a program that has us.
  request_reroute();
  int err = pthread_create(
      &thread_, nullptr,
      [](void* self) -> void* {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the application's signals go elsewhere
        static_cast<Port*>(self)->loop();
        return nullptr;
      },
      this);
  if (err != 0) return fail(err);
  thread_running_ = true;
  users_ = 1;
  {
    // The timerfd is new, so nothing is set on it yet, whatever the one the last user's
    // close took with it was set for; timers left pending then (a parked socket's recheck
    // stays scheduled) would otherwise make arm_timerfd believe it set, and never set it.
    std::lock_guard<std::mutex> tlock(timer_mu_);
    timerfd_at_ = Clock::time_point::max();
    arm_timerfd();
  }
  uint64_t one = 1;
  (void)!write(fd_wake_, &one, sizeof one);
  return 0;
}

void Port::release() {
  std::lock_guard<std::mutex> lock(open_mu_);
  if (users_ == 0 || --users_ > 0) return;
  stop_ = true;
  uint64_t one = 1;
  (void)!write(fd_wake_, &one, sizeof one);
  if (thread_running_) pthread_join(thread_, nullptr);
  thread_running_ = false;
  delete round_;
  round_ = nullptr;
  // Leaving moves the group's last socket into our place: ask whoever is at index 0 now
  // to re-learn the indices (our lock, if a round of ours held it, goes with its fd).
  ::close(std::exchange(fd_group_, -1));
  nudge_group();
  close_fds();
}

// ---- sending -----------------------------------------------------------------------------

namespace {

}  // namespace

int64_t detail::park_grace_from_env() {
  static const int64_t ns = [] {
    const char* v = std::getenv("SOFTVERBS_POLL_PARK");
    long us = v && *v ? std::atol(v) : 1000;
    return us > 0 ? int64_t{us} * 1000 : int64_t{0};
  }();
  return ns;
}

bool detail::gro_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SOFTVERBS_NO_GRO");
    return !(v && *v && *v != '0');
  }();
  return on;
}

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The CPU time all threads of this process have run so far.
int64_t process_cpu_ns() {
  timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Room for a source-address control message (IPV6_PKTINFO is the larger), a multicast hop
// limit and a UDP_SEGMENT.
constexpr size_t kSourceControlBytes =
    CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t));

// Appends one control message to msg (in its msg_control buffer).
void add_control(msghdr& msg, int level, int type, const void* data, size_t size) {
  cmsghdr* c = reinterpret_cast<cmsghdr*>(static_cast<char*>(msg.msg_control) + msg.msg_controllen);
  c->cmsg_level = level;
  c->cmsg_type = type;
  c->cmsg_len = CMSG_LEN(size);
  std::memcpy(CMSG_DATA(c), data, size);
  msg.msg_controllen += CMSG_SPACE(size);
}

// Puts the source address into msg as a control message (in `control`): IP_PKTINFO for IPv4
// (also on a dual-stack socket sending to a v4-mapped address), IPV6_PKTINFO for IPv6.
// Loopback needs none: the kernel picks it for a loopback destination. To a multicast group
// the same message names the interface (there may be no route to the group at all), and
// IP_TTL / IPV6_HOPLIMIT the hop limit.
void set_source(msghdr& msg, char (&control)[kSourceControlBytes], const IpAddress* src,
                const IpAddress& dst, int ifindex, uint8_t hop_limit) {
  std::memset(control, 0, sizeof control);
  const bool multicast = dst.is_multicast();
  if (!multicast) ifindex = hop_limit = 0;
  const bool with_src = src && !src->is_loopback();
  if (!with_src && ifindex <= 0 && hop_limit == 0) return;
  msg.msg_control = control;
  msg.msg_controllen = 0;
  const bool v4 = dst.is_v4();
  if (with_src || ifindex > 0) {
    if (v4) {
      in_pktinfo info{};
      if (with_src) info.ipi_spec_dst.s_addr = src->v4_network_order();
      info.ipi_ifindex = ifindex > 0 ? ifindex : 0;
      add_control(msg, IPPROTO_IP, IP_PKTINFO, &info, sizeof info);
    } else {
      in6_pktinfo info{};
      if (with_src) std::memcpy(&info.ipi6_addr, src->bytes.data(), 16);
      info.ipi6_ifindex = ifindex > 0 ? unsigned(ifindex) : 0;
      add_control(msg, IPPROTO_IPV6, IPV6_PKTINFO, &info, sizeof info);
    }
  }
  if (hop_limit) {
    const int hops = hop_limit;
    add_control(msg, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_TTL : IPV6_HOPLIMIT, &hops, sizeof hops);
  }
}

}  // namespace

int Port::send_from(int fd, const IpAddress& dst, const void* data, size_t size,
                    const IpAddress* src, int ifindex, uint8_t hop_limit) {
  sockaddr_storage to;
  const socklen_t len = to_sockaddr(dst, config_.udp_port, ipv6_, to);
  if (len == 0) return -EAFNOSUPPORT;
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_name = &to;
  msg.msg_namelen = len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[kSourceControlBytes];
  set_source(msg, control, src, dst, ifindex, hop_limit);
  if (sendmsg(fd, &msg, 0) < 0) return -errno;
  return 0;
}

int Port::send(const IpAddress& dst, const void* data, size_t size, uint32_t flow,
               const IpAddress* src, int ifindex, uint8_t hop_limit) {
  const int fd = fd_senders_[flow % kSenders];
  if (fd < 0) return -ENOTCONN;
  if (Faults* faults = Faults::from_env()) {  // SOFTVERBS_FAULTS, for tests (faults.hpp)
    const std::optional<IpAddress> from = src ? std::optional(*src) : std::nullopt;
    return faults->send(data, size, [=, this](const void* d, size_t n) {
      return send_from(fd_senders_[flow % kSenders], dst, d, n, from ? &*from : nullptr,
                       ifindex, hop_limit);
    });
  }
  return send_from(fd, dst, data, size, src, ifindex, hop_limit);
}

int Port::send_batch(const OutDatagram* datagrams, size_t count) {
  if (Faults::from_env()) {
    // Under SOFTVERBS_FAULTS every datagram goes through the fault injector one by one (a
    // GSO group is cut into its datagrams here; the engine makes none when faults are on).
    for (size_t i = 0; i < count; ++i) {
      const OutDatagram& d = datagrams[i];
      const size_t step = d.segment ? d.segment : d.size;
      for (size_t at = 0; at < d.size; at += step) {
        int err = send(d.dst, static_cast<const uint8_t*>(d.data) + at, std::min(step, d.size - at),
                       d.flow, d.src, d.ifindex, d.hop_limit);
        if (err < 0) return i ? int(i) : err;
      }
    }
    return int(count);
  }
  constexpr size_t kChunk = 64;
  sockaddr_storage to[kChunk];
  iovec iov[kChunk];
  mmsghdr msgs[kChunk];
  alignas(cmsghdr) char control[kChunk][kSourceControlBytes];
  size_t done = 0;
  while (done < count) {
    // One sendmmsg per run of datagrams that leave from the same socket, in order.
    const uint32_t sender = datagrams[done].flow % kSenders;
    const int fd = fd_senders_[sender];
    if (fd < 0) return done ? int(done) : -ENOTCONN;
    size_t n = 0;
    while (n < kChunk && done + n < count && datagrams[done + n].flow % kSenders == sender) {
      const OutDatagram& d = datagrams[done + n];
      const socklen_t len = to_sockaddr(d.dst, config_.udp_port, ipv6_, to[n]);
      if (len == 0) break;
      iov[n] = {const_cast<void*>(d.data), d.size};
      msgs[n] = {};
      msgs[n].msg_hdr.msg_name = &to[n];
      msgs[n].msg_hdr.msg_namelen = len;
      msgs[n].msg_hdr.msg_iov = d.iovcnt ? const_cast<iovec*>(d.iov) : &iov[n];
      msgs[n].msg_hdr.msg_iovlen = d.iovcnt ? d.iovcnt : 1;
      set_source(msgs[n].msg_hdr, control[n], d.src, d.dst, d.ifindex, d.hop_limit);
      if (d.segment && d.size > d.segment) {
        // After the source address (if any): the GSO segment size.
        msghdr& h = msgs[n].msg_hdr;
        h.msg_control = control[n];
        add_control(h, SOL_UDP, UDP_SEGMENT, &d.segment, sizeof d.segment);
      }
      ++n;
    }
    if (n == 0) return done ? int(done) : -EAFNOSUPPORT;
    const int sent = sendmmsg(fd, msgs, unsigned(n), 0);
    if (sent < 0) return done ? int(done) : -errno;
    done += size_t(sent);
    if (size_t(sent) < n) break;
  }
  return int(done);
}

uint16_t Port::source_port(uint32_t flow) const { return sender_ports_[flow % kSenders]; }

// ---- timers ------------------------------------------------------------------------------

// Caller holds timer_mu_.
void Port::arm_timerfd() {
  if (fd_timer_ < 0) return;
  // A deadline later than the one the timerfd is set for needs no system call: the timer
  // fires early, and handle_timers sets it for what is due next (moved retransmit timers,
  // one per ACK, are the common case).
  if (!timer_queue_.empty() && timerfd_at_ != Clock::time_point::max() &&
      timer_queue_.begin()->first >= timerfd_at_)
    return;
  timerfd_at_ = timer_queue_.empty() ? Clock::time_point::max() : timer_queue_.begin()->first;
  itimerspec spec{};
  if (!timer_queue_.empty()) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  timer_queue_.begin()->first.time_since_epoch())
                  .count();
    if (ns <= 0) ns = 1;  // a zero value would disarm
    spec.it_value.tv_sec = ns / 1000000000;
    spec.it_value.tv_nsec = ns % 1000000000;
  }
  timerfd_settime(fd_timer_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void Port::schedule(uint64_t timer_id, Clock::time_point when) {
  std::lock_guard<std::mutex> lock(timer_mu_);
  auto it = timer_when_.find(timer_id);
  if (it != timer_when_.end()) {
    timer_queue_.erase({it->second, timer_id});
    it->second = when;
  } else {
    timer_when_.emplace(timer_id, when);
  }
  timer_queue_.insert({when, timer_id});
  if (timer_queue_.begin()->second == timer_id) arm_timerfd();
}

bool Port::cancel(uint64_t timer_id) {
  std::lock_guard<std::mutex> lock(timer_mu_);
  auto it = timer_when_.find(timer_id);
  if (it == timer_when_.end()) return false;
  timer_queue_.erase({it->second, timer_id});
  timer_when_.erase(it);
  return true;
}

void Port::handle_timers() {
  uint64_t expirations;
  (void)!read(fd_timer_, &expirations, sizeof expirations);
  std::vector<uint64_t> due;
  {
    std::lock_guard<std::mutex> lock(timer_mu_);
    timerfd_at_ = Clock::time_point::max();  // it fired: set it again below
    const auto now = Clock::now();
    while (!timer_queue_.empty() && timer_queue_.begin()->first <= now) {
      due.push_back(timer_queue_.begin()->second);
      timer_when_.erase(due.back());
      timer_queue_.erase(timer_queue_.begin());
    }
    // Set after the handlers, which often schedule what is due next (a periodic timer):
    // one timerfd_settime instead of two. Meanwhile a schedule() from any thread sets it.
    if (due.empty()) arm_timerfd();
  }
  for (uint64_t id : due) {
    if (id == kRoundRetry) start_round();
    else if (id == kRoundDeadline) finish_round_if_done(true);
    else if (id == kGroupRecheck) recheck_parked();
    else if (on_timer_) on_timer_(id);
  }
  if (due.empty()) return;
  std::lock_guard<std::mutex> lock(timer_mu_);
  arm_timerfd();
}

// ---- the thread --------------------------------------------------------------------------

void Port::loop() {
  epoll_event events[8];
  while (!stop_.load()) {
    const int n = epoll_wait(fd_epoll_, events, 8, -1);
    for (int i = 0; i < n && !stop_.load(); ++i) {
      const uint64_t data = events[i].data.u64;
      switch (uint32_t(data)) {
        case kTagGroup:
          handle_group();
          rearm_group();
          break;
        case kTagForward: handle_forwarded(); break;
        case kTagAnswers: handle_answers(); break;
        case kTagTimer: handle_timers(); break;
        case kTagWake: handle_commands(); break;
        case kTagMulticast: handle_multicast(int(data >> 32)); break;
      }
    }
  }
}

void Port::handle_commands() {
  uint64_t count;
  (void)!read(fd_wake_, &count, sizeof count);
  if (round_wanted_.exchange(false)) start_round();
}

// ---- who receives: the port's thread, or an application polling its CQ ------------------
//
// The port's thread must receive whenever nobody else does (an RDMA WRITE lands while its
// target polls memory, not a CQ). But an application that spins on an empty CQ receives by
// itself (poll): waking the port's thread for each packet too would only take the CPU from
// it, and make both fight over the socket. So after kParkAfterIdlePolls empty polls in a row
// the group socket is parked (left out of epoll), until the application finds completions
// (it may go and poll memory next), asks for an event, or stops polling for park_grace_ns
// (the port's thread checks that on a timer while parked).

void Port::arm_group_locked(bool armed) {
  if (fd_group_ < 0) return;
  epoll_event ev{};
  ev.events = armed ? EPOLLIN | EPOLLONESHOT : EPOLLONESHOT;  // without EPOLLIN: never woken
  ev.data.u64 = kTagGroup;
  epoll_ctl(fd_epoll_, EPOLL_CTL_MOD, fd_group_, &ev);
}

void Port::park_group() {
  if (config_.park_grace_ns == 0) return;
  std::lock_guard<std::mutex> lock(park_mu_);
  if (group_parked_.load(std::memory_order_relaxed)) return;
  group_parked_.store(true, std::memory_order_release);
  arm_group_locked(false);
  {
    std::lock_guard<std::mutex> stats_lock(stats_mu_);
    ++stats_.parked;
  }
  sample_app_cpu();
  // One recheck at a time: a ping-pong parks and unparks every message, and a timer set
  // each time would cost a system call and wake this thread for nothing.
  if (!recheck_pending_.exchange(true))
    schedule(kGroupRecheck, Clock::now() + std::chrono::nanoseconds(config_.park_grace_ns));
}

// park_mu_ held: how much CPU the process has had so far, and when.
void Port::sample_app_cpu() {
  sample_cpu_ns_ = process_cpu_ns();
  sample_wall_ns_ = steady_ns();
}

void Port::unpark_group() {
  std::lock_guard<std::mutex> lock(park_mu_);
  if (!group_parked_.load(std::memory_order_relaxed)) return;
  group_parked_.store(false, std::memory_order_release);
  arm_group_locked(true);  // the recheck stays: cancelling it would not stop the timerfd
}

void Port::poll_idle() {
  last_poll_found_.store(false, std::memory_order_relaxed);
  if (config_.park_grace_ns == 0 || group_parked_.load(std::memory_order_relaxed)) return;
  if (idle_polls_.fetch_add(1, std::memory_order_relaxed) + 1 >= kParkAfterIdlePolls) {
    idle_polls_.store(0, std::memory_order_relaxed);
    park_group();
  }
}

void Port::poll_found(bool rode) {
  last_poll_found_.store(true, std::memory_order_relaxed);
  // Kept parked: a loop that found completions is back on its CQs within microseconds (a
  // ping-pong's send and receive CQs), and giving the socket back and taking it again
  // cost two epoll_ctl calls a message. Only once the recheck saw a program go away
  // after completions (eager_unpark_) is it given back here.
  if (!eager_unpark_.load(std::memory_order_relaxed)) {
    if (!group_parked_.load(std::memory_order_relaxed)) idle_polls_.store(0, std::memory_order_relaxed);
    return;
  }
  // The request that came with the completion is what the program went to poll memory
  // for; the next comes after its reply, which takes the held ACK along.
  const bool keep = rode && group_parked_.load(std::memory_order_relaxed) &&
                    ride_misses_.load(std::memory_order_relaxed) < kRideMisses;
  kept_for_ride_.store(keep, std::memory_order_relaxed);
  if (keep) {
    kept_for_ride_count_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  give_back();
}

void Port::give_back() {
  // A thread asleep in wait_begin receives every packet: the socket stays with it.
  if (waiters_.load(std::memory_order_acquire) > 0) return;
  if (!group_parked_.load(std::memory_order_acquire)) {
    idle_polls_.store(0, std::memory_order_relaxed);
    return;
  }
  unpark_group();
  // A loop that came back from its CQ with completions and polls it empty again is still
  // waiting on it: parked again at its first empty poll, before the peer's next packet
  // (one-sided ping-pongs, whose ACK and next request arrive microseconds apart).
  idle_polls_.store(kParkAfterIdlePolls - 1, std::memory_order_relaxed);
}

namespace {
// When this thread last came out of Port::wait_end (steady ns; 0: never).
SV_FAST_TLS int64_t t_wait_ended_ns = 0;
}  // namespace

void Port::poll_stop() {
  if (t_wait_ended_ns != 0 && steady_ns() - t_wait_ended_ns < config_.park_grace_ns) return;
  app_polled_ns_.store(0, std::memory_order_relaxed);
  give_back();
}

void Port::wait_begin() {
  waiters_.fetch_add(1, std::memory_order_acq_rel);
  park_group();
}

void Port::wait_end() {
  waiters_.fetch_sub(1, std::memory_order_acq_rel);
  // Kept parked (see port.hpp); counted as a poll, so the recheck waits a grace for it.
  t_wait_ended_ns = steady_ns();
  app_polled_ns_.store(t_wait_ended_ns, std::memory_order_relaxed);
}

// After a wake-up on the group socket (one-shot): armed again unless an application took
// the socket meanwhile.
void Port::rearm_group() {
  std::lock_guard<std::mutex> lock(park_mu_);
  if (!group_parked_.load(std::memory_order_relaxed)) arm_group_locked(true);
}

// Parked: the application still polls, or the socket comes back to this thread. Then the
// owner's backstop (kRecheckTimerId), after the socket came back.
void Port::recheck_parked() {
  recheck_give_back();
  if (on_timer_) on_timer_(kRecheckTimerId);
}

void Port::recheck_give_back() {
  const int64_t grace = config_.park_grace_ns;
  std::lock_guard<std::mutex> lock(park_mu_);
  recheck_pending_.store(false);
  if (!group_parked_.load(std::memory_order_relaxed)) return;
  const int64_t polled = app_polled_ns_.load(std::memory_order_relaxed);
  if (waiters_.load(std::memory_order_acquire) > 0 || (polled != 0 && steady_ns() - polled < grace)) {
    sample_app_cpu();
    recheck_pending_.store(true);
    schedule(kGroupRecheck, Clock::now() + std::chrono::nanoseconds(grace));
    return;
  }
  // The program went away right after its poll found completions while packets came for
  // it, and it ran meanwhile (it polls memory for an RDMA WRITE, say, perhaps in another
  // thread): from now on completions give the socket back. A pause with nothing arriving
  // (a program between its phases, syncing with its peer out of band), or a process the
  // machine did not run (a loaded CPU: running, the loop would have polled), change
  // nothing. What the process ran since the sample counts from the last poll on (it may
  // have polled all the time before); anything unsure errs towards giving the socket back.
  // It takes kEagerVotes such rechecks: a program's one pause at its start (perftest works
  // out its clock) is not a pattern.
  if (last_poll_found_.load(std::memory_order_relaxed) && fd_group_ >= 0) {
    uint8_t byte;
    const bool waiting = recv(fd_group_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
    const int64_t ran = process_cpu_ns() - sample_cpu_ns_;
    const int64_t ran_away = ran - std::max<int64_t>(0, polled - sample_wall_ns_);
    if (waiting && sample_cpu_ns_ >= 0 && ran_away >= grace / 16)
      if (eager_votes_.fetch_add(1) + 1 >= kEagerVotes) eager_unpark_.store(true);
    // Kept for a ride and yet a datagram came before the reply: not a ping-pong.
    if (waiting && kept_for_ride_.load(std::memory_order_relaxed))
      ride_misses_.fetch_add(1, std::memory_order_relaxed);
  }
  group_parked_.store(false, std::memory_order_release);
  idle_polls_.store(0, std::memory_order_relaxed);
  arm_group_locked(true);
  // Packets that came while nobody looked wait in the socket: an armed one-shot socket
  // with data reports it at the next epoll_wait.
}

void Port::request_reroute() {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    reroute_ticket_ = rounds_started_ + 1;  // the next round to start (rounds run one by one)
  }
  round_wanted_ = true;
  uint64_t one = 1;
  if (fd_wake_ >= 0) (void)!write(fd_wake_, &one, sizeof one);
}

void Port::handle_group() {
  std::lock_guard<std::mutex> lock(group_mu_);
  receive_locked(fd_group_, false, false);
}

int Port::poll() {
  if (config_.park_grace_ns) {
    app_polled_ns_.store(steady_ns(), std::memory_order_relaxed);
  }
  std::unique_lock<std::mutex> lock(group_mu_, std::try_to_lock);
  if (!lock.owns_lock() || fd_group_ < 0) return 0;  // the port's thread is at it
  return receive_locked(fd_group_, true, false);
}

int Port::receive_locked(int fd, bool once, bool multicast) {
  int total = 0;
  sockaddr_storage from[kBatch];
  iovec iov[kBatch];
  alignas(cmsghdr) uint8_t control[kBatch][kControlBytes];
  mmsghdr msgs[kBatch];
  // A poll takes one buffer (with UDP_GRO often several datagrams of a flow): an empty
  // poll spins on this, and setting up a whole batch for it cost ~0.4 µs a message
  // (bench/floors: recvmmsg of 16 against 1 on RoCE's sockets, polled ping-pong).
  const int want = once ? 1 : kBatch;
  for (;;) {
    for (int i = 0; i < want; ++i) {
      iov[i] = {&rx_buffers_[size_t(i) * kRxBufferBytes], kRxBufferBytes};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof from[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = control[i];
      msgs[i].msg_hdr.msg_controllen = kControlBytes;
    }
    const int n = recvmmsg(fd, msgs, unsigned(want), MSG_DONTWAIT, nullptr);
    if (n <= 0) return total;
    for (int i = 0; i < n; ++i)
      total += route_received(msgs[i].msg_hdr, msgs[i].msg_len, multicast);
    if (n < want || once) return total;
  }
}

// One buffer recvmmsg filled: a datagram, or with UDP_GRO several of one flow, each `segment`
// bytes but the last (which may be shorter). Each is one RoCE packet, routed on its own: the
// kernel coalesces by addresses and ports only, so they may be for different QPs (and the
// steering program saw only the first). Returns how many datagrams it held.
int Port::route_received(msghdr& msg, size_t size, bool multicast) {
  Datagram d;
  const size_t segment = read_control(msg, d);
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
      !from_sockaddr(*static_cast<sockaddr_storage*>(msg.msg_name), msg.msg_namelen, d.src,
                     d.src_port)) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.dropped;
    return 1;
  }
  // Multicast comes through the group's own sockets only (port_multicast.cpp): on the shared
  // socket it would be a second copy (a kernel that ignores IP_MULTICAST_ALL).
  if (d.dst.is_multicast() != multicast) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.dropped;
    return 1;
  }
  const uint8_t* data = static_cast<const uint8_t*>(msg.msg_iov[0].iov_base);
  const size_t step = segment > 0 ? segment : std::max<size_t>(size, 1);
  if (segment > 0) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.coalesced += (size + segment - 1) / segment;
  }
  int count = 0;
  size_t at = 0;
  const uint64_t delivered_before = delivered_.load(std::memory_order_relaxed);
  do {  // an empty datagram too is one (dropped by route)
    d.data = data + at;
    d.size = std::min(step, size - at);
    at += d.size;
    ++count;
    d.more = at < size;
    if (d.size > kMaxDatagram) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.dropped;
      continue;
    }
    route(d);
  } while (at < size);
  // (Another thread's delivery meanwhile may call it for a buffer that had none: harmless.)
  if (config_.on_buffer_end && delivered_.load(std::memory_order_relaxed) != delivered_before)
    config_.on_buffer_end();
  return count;
}

// A datagram the kernel gave us: ours, a probe, or another process's (stale steering).
void Port::route(const Datagram& d) {
  if (d.size == kProbeBytes && d.src.is_loopback()) {
    uint32_t magic;
    std::memcpy(&magic, d.data, 4);
    if (ntohl(magic) == kProbeMagic) return answer_probe(d.data, d.src, d.src_port);
    if (ntohl(magic) == kNudgeMagic) return start_round();
  }
  const int slot = destination_slot(d.data, d.size);
  if (slot < 0) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.dropped;
    return;
  }
  // An adopted slot's QPs (an ended process's XRC TGT QPs, verbs/xrc.cpp) are ours too.
  const bool ours = slot == slot_ && !slot_handed_over_.load(std::memory_order_relaxed);
  if (ours || reserved_slot(slot) || hosted_by_me(slot)) return deliver(d);
  if (forward(d, slot)) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.forwarded_out;
    }
    start_round();  // its owner is alive and in the group, but the program sent it here
  } else {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.dropped;  // no live owner: as a NIC drops a packet for a QP it does not have
  }
}

bool Port::pass_to(const Datagram& d, int slot) {
  // Never forwarded twice: no loops.
  if (d.forwarded || slot == slot_ || slot <= 0 || slot >= kSlots) return false;
  bool ok = forward(d, slot);
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++(ok ? stats_.forwarded_out : stats_.dropped);
  return ok;
}

void Port::deliver(const Datagram& d) {
  delivered_.fetch_add(1, std::memory_order_relaxed);
  if (d.forwarded) forwarded_in_.fetch_add(1, std::memory_order_relaxed);
  if (on_datagram_) on_datagram_(d);
}

PortStats Port::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  PortStats s = stats_;
  s.delivered = delivered_.load(std::memory_order_relaxed);
  s.forwarded_in = forwarded_in_.load(std::memory_order_relaxed);
  s.eager_unpark = eager_unpark_.load(std::memory_order_relaxed);
  s.kept_for_ride = kept_for_ride_count_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace softverbs::wire::roce
