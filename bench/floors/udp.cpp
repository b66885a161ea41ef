// UDP between two hosts (network namespaces, tests/hosts/netns.sh): the floors for RoCE v2,
// which is UDP. A forked child enters host B's namespace, the parent host A's; each is
// pinned to its own CPU (as the other floors).
//
// Modes:
//   blocking:BYTES  ping-pong, recv() sleeps: the floor for event-mode (-e) latency
//   busy:BYTES      ping-pong, recv(MSG_DONTWAIT) in a loop: the floor for polled latency
//   busy-roce:BYTES the same under the rules every RoCE v2 port in user space has: one UDP
//                   port receives from every peer (an unconnected socket, SO_REUSEPORT), and
//                   sends leave from an unconnected socket with DF set, the only way the
//                   kernel gives IPv4 packets ID 0, which the ICRC covers (decision 0006).
//                   Unconnected, neither side has the route cached (the receive side's
//                   early demux and the send side's dst) that connected sockets use
//   stream          A sends datagrams of the path MTU, one send() each, to B
//   stream-gso      the same datagrams, 64 per send() with UDP_SEGMENT (GSO); B receives
//                   with UDP_GRO, so whole batches cross the veth as one packet
// Ping-pong: one-way latency = run time / (2 x round trips), in us. Stream: what B received
// / the time from its first datagram to its last, in GB/s (10^9 bytes/s); datagrams A sent
// that B never got are counted in the details (UDP has no flow control).
//
//   floor_udp [-r RUNS] [-n ITERS] MODE [NETNS_A ADDR_A NETNS_B ADDR_B]
// NETNS_X: a name under /run/netns, or "-" for this namespace. Without them both sides stay
// here on 127.0.0.1. ITERS: round trips, or datagrams per stream run.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <csignal>
#include <cstdint>

#include "floor.hpp"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

constexpr int kGsoBatch = 64;        // datagrams per UDP_SEGMENT send (the kernel's limit is 64 or 128)
constexpr int kGiveUpMs = 2000;      // a ping-pong message this late is lost: fail
constexpr int kStreamQuietMs = 200;  // a stream receiver with nothing for this long is done

struct Side {
  std::string netns;  // "-": stay
  sockaddr_storage addr{};
  socklen_t len = 0;
};

bool parse_addr(const char* text, Side* side) {
  auto* v4 = reinterpret_cast<sockaddr_in*>(&side->addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&side->addr);
  if (inet_pton(AF_INET, text, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    side->len = sizeof *v4;
    return true;
  }
  if (inet_pton(AF_INET6, text, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    side->len = sizeof *v6;
    return true;
  }
  return false;
}

void enter_netns(const std::string& name) {
  if (name == "-") return;
  const std::string path = "/run/netns/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) floors::die(path.c_str());
  if (setns(fd, CLONE_NEWNET) != 0) floors::die("setns (needs root)");
  close(fd);
}

// A UDP socket bound to the side's address (its port, 0 = any); returns the fd.
// SO_REUSEPORT with `shared`: a port every process of a host receives on (busy-roce).
int bound_socket(Side* side, bool shared = false) {
  const int fd = socket(side->addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) floors::die("socket");
  int on = 1;
  if (shared && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0) floors::die("SO_REUSEPORT");
  if (bind(fd, reinterpret_cast<sockaddr*>(&side->addr), side->len) != 0) floors::die("bind");
  socklen_t len = side->len;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&side->addr), &len) != 0) floors::die("getsockname");
  return fd;
}

void pipe_write(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != ssize_t(n)) floors::die("write(pipe)");
}

void pipe_read(int fd, void* p, size_t n) {
  if (read(fd, p, n) != ssize_t(n)) floors::die("read(pipe)");
}

void set_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) floors::die("SO_RCVTIMEO");
}

// One datagram of exactly `bytes` into buf; spins with MSG_DONTWAIT when `busy` (yielding
// when there is only one CPU). Dies when nothing came for kGiveUpMs.
void take(int fd, char* buf, size_t bytes, bool busy, bool yield) {
  ssize_t n;
  if (!busy) {
    n = recv(fd, buf, bytes + 1, 0);
  } else {
    const double give_up = floors::now_ns() + kGiveUpMs * 1e6;
    for (unsigned spins = 1;; ++spins) {
      n = recv(fd, buf, bytes + 1, MSG_DONTWAIT);
      if (n >= 0 || errno != EAGAIN) break;
      if (yield) sched_yield();
      if (spins % 4096 == 0 && floors::now_ns() > give_up) break;
    }
  }
  if (n < 0) floors::die("recv (a datagram lost?)");
  if (size_t(n) != bytes) {
    std::fprintf(stderr, "got %zd bytes, expected %zu\n", n, bytes);
    std::exit(1);
  }
}

// Sends on a connected socket, or with `to` from an unconnected one.
void give(int fd, const char* buf, size_t bytes, const Side* to = nullptr) {
  const ssize_t n = to ? sendto(fd, buf, bytes, 0, reinterpret_cast<const sockaddr*>(&to->addr), to->len)
                       : send(fd, buf, bytes, 0);
  if (n != ssize_t(bytes)) floors::die("send");
}

// busy-roce's sender: unconnected, DF (IPv4 ID 0), on a port of its own.
int roce_sender(int family) {
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) floors::die("socket");
  int df = IP_PMTUDISC_DO;
  if (family == AF_INET ? setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df)
                        : setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &df, sizeof df))
    floors::die("MTU_DISCOVER");
  return fd;
}

// ---------------------------------------------------------------- ping-pong

// `to`: busy-roce's client receive address (answers leave from `out`), else nullptr.
int echo_server(int fd, size_t bytes, bool busy, bool yield, const Side* to, int out) {
  std::vector<char> buf(bytes + 1);
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  // The first datagram says who the client is; a zero-length one ends the run.
  ssize_t n = recvfrom(fd, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&peer), &len);
  if (n < 0) floors::die("recvfrom");
  if (!to && connect(fd, reinterpret_cast<sockaddr*>(&peer), len) != 0) floors::die("connect");
  while (n > 0) {
    give(to ? out : fd, buf.data(), bytes, to);
    if (!busy) {
      n = recv(fd, buf.data(), buf.size(), 0);
    } else {
      while ((n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT)) < 0 && errno == EAGAIN)
        if (yield) sched_yield();
    }
    if (n < 0) floors::die("recv");
  }
  return 0;
}

double round_trips(int fd, char* buf, size_t bytes, long iters, bool busy, bool yield,
                   const Side* to, int out) {
  const double t0 = floors::now_ns();
  for (long i = 0; i < iters; ++i) {
    give(to ? out : fd, buf, bytes, to);
    take(fd, buf, bytes, busy, yield);
  }
  return floors::now_ns() - t0;
}

// ---------------------------------------------------------------- stream

struct StreamResult {
  uint64_t bytes;
  double ns;
};

// The receiver: for each run (a byte on `go`), counts what arrives until `expected` bytes
// came or the line stayed quiet for kStreamQuietMs, and reports it on `done`.
int stream_receiver(int fd, int go, int done, bool gro) {
  int on = 1, size = 16 << 20;
  if (gro && setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on) != 0) floors::die("UDP_GRO");
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  set_timeout(fd, kStreamQuietMs);
  std::vector<char> buf(1 << 17);
  uint64_t expected;
  while (read(go, &expected, sizeof expected) == sizeof expected && expected > 0) {
    StreamResult r{0, 0};
    double first = 0, last = 0;
    while (r.bytes < expected) {
      const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) floors::die("recv");
      last = floors::now_ns();
      if (r.bytes == 0) first = last;
      r.bytes += uint64_t(n);
    }
    r.ns = last - first;
    pipe_write(done, &r, sizeof r);
  }
  return 0;
}

// The largest UDP payload that fits the path MTU without fragmentation.
size_t datagram_payload(int fd, int family) {
  int mtu = 0;
  socklen_t len = sizeof mtu;
  const int level = family == AF_INET ? IPPROTO_IP : IPPROTO_IPV6;
  const int name = family == AF_INET ? IP_MTU : IPV6_MTU;
  if (getsockopt(fd, level, name, &mtu, &len) != 0) floors::die("getsockopt(MTU)");
  return size_t(mtu) - (family == AF_INET ? 20 : 40) - 8;
}

// Datagrams per UDP_SEGMENT send: at most kGsoBatch, and all of them in one IP packet's
// 64 KiB (on lo, whose MTU is 64 KiB, that is one).
long gso_batch(size_t payload) {
  return std::max(1L, std::min<long>(kGsoBatch, long(65000 / payload)));
}

void stream_send(int fd, const std::vector<char>& data, size_t payload, long datagrams, bool gso) {
  if (!gso) {
    for (long i = 0; i < datagrams; ++i) {
      // A full socket buffer drops nothing here: send() blocks, as a sender's queue would.
      if (send(fd, data.data(), payload, 0) != ssize_t(payload)) floors::die("send");
    }
    return;
  }
  const long batch = gso_batch(payload);
  for (long i = 0; i < datagrams; i += batch) {
    const size_t count = size_t(std::min(batch, datagrams - i));
    if (send(fd, data.data(), count * payload, 0) != ssize_t(count * payload)) floors::die("send (GSO)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(
      argc, argv, 5, 10000, " blocking:BYTES|busy:BYTES|busy-roce:BYTES|stream|stream-gso [NETNS_A ADDR_A NETNS_B ADDR_B]");
  const std::string mode = o.mode.substr(0, o.mode.find(':'));
  const bool roce = mode == "busy-roce";
  const bool pingpong = mode == "blocking" || mode == "busy" || roce;
  if (!pingpong && mode != "stream" && mode != "stream-gso") {
    std::fprintf(stderr, "%s: MODE is blocking:BYTES, busy:BYTES, busy-roce:BYTES, stream or stream-gso\n", argv[0]);
    return 2;
  }
  size_t bytes = 0;
  if (pingpong) {
    const size_t colon = o.mode.find(':');
    bytes = colon == std::string::npos ? 8 : std::strtoul(o.mode.c_str() + colon + 1, nullptr, 10);
    if (bytes < 1 || bytes > 65000) {
      std::fprintf(stderr, "%s: BYTES is 1..65000\n", argv[0]);
      return 2;
    }
  }
  Side a{"-"}, b{"-"};
  const int rest = argc - optind - 1;
  if (rest == 4) {
    a.netns = argv[optind + 1];
    b.netns = argv[optind + 3];
    if (!parse_addr(argv[optind + 2], &a) || !parse_addr(argv[optind + 4], &b) ||
        a.addr.ss_family != b.addr.ss_family) {
      std::fprintf(stderr, "%s: ADDR_A and ADDR_B are IP addresses of one family\n", argv[0]);
      return 2;
    }
  } else if (rest == 0) {
    parse_addr("127.0.0.1", &a);
    parse_addr("127.0.0.1", &b);
  } else {
    std::fprintf(stderr, "%s: give all four of NETNS_A ADDR_A NETNS_B ADDR_B, or none\n", argv[0]);
    return 2;
  }

  const std::vector<int> cpus = floors::allowed_cpus();
  const bool two_cpus = cpus.size() >= 2;
  const bool busy = mode == "busy" || roce;
  int go[2], done[2];
  if (pipe2(go, O_CLOEXEC) != 0 || pipe2(done, O_CLOEXEC) != 0) floors::die("pipe");

  // B: the echo server or the stream receiver. It tells A its port on `done` first.
  const pid_t child = floors::fork_child([&] {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a spinning echo server must not outlive A
    close(go[1]);
    close(done[0]);
    enter_netns(b.netns);
    floors::pin_to(cpus[two_cpus ? 1 : 0]);
    const int fd = bound_socket(&b, roce);
    pipe_write(done[1], &b.addr, sizeof b.addr);
    if (roce) {  // A's receive address comes on `go`
      Side client = a;
      pipe_read(go[0], &client.addr, sizeof client.addr);
      return echo_server(fd, bytes, busy, !two_cpus, &client, roce_sender(client.addr.ss_family));
    }
    if (pingpong) return echo_server(fd, bytes, busy, !two_cpus, nullptr, -1);
    return stream_receiver(fd, go[0], done[1], mode == "stream-gso");
  });
  close(go[0]);
  close(done[1]);
  pipe_read(done[0], &b.addr, sizeof b.addr);
  enter_netns(a.netns);
  floors::pin_to(cpus[0]);
  const int fd = bound_socket(&a, roce);
  const int out = roce ? roce_sender(a.addr.ss_family) : -1;
  if (roce) pipe_write(go[1], &a.addr, sizeof a.addr);
  else if (connect(fd, reinterpret_cast<sockaddr*>(&b.addr), b.len) != 0) floors::die("connect");
  const Side* to = roce ? &b : nullptr;

  char where[160];
  std::snprintf(where, sizeof where, "%s to %s, %s", a.netns == "-" ? "here" : a.netns.c_str(),
                b.netns == "-" ? "here" : b.netns.c_str(),
                two_cpus ? ("pinned to cpus " + std::to_string(cpus[0]) + "," + std::to_string(cpus[1])).c_str()
                         : "one cpu");
  std::vector<double> samples;
  if (pingpong) {
    set_timeout(fd, kGiveUpMs);
    std::vector<char> buf(bytes + 1, 'x');
    round_trips(fd, buf.data(), bytes, std::max(1L, o.iters / 10), busy, !two_cpus, to, out);  // warm-up
    for (int r = 0; r < o.runs; ++r)
      samples.push_back(round_trips(fd, buf.data(), bytes, o.iters, busy, !two_cpus, to, out) /
                        (2.0 * double(o.iters)) / 1000.0);
    give(to ? out : fd, buf.data(), 0, to);  // ends the echo server
    floors::reap(child);
    const std::string name = "udp_oneway_" + (roce ? std::string("busy_roce") : mode) + "_" + std::to_string(bytes) + "B";
    floors::report(name.c_str(), samples, "us",
                   std::to_string(o.iters) + " round trips each, " + where);
    return 0;
  }

  const bool gso = mode == "stream-gso";
  const size_t payload = datagram_payload(fd, a.addr.ss_family);
  if (gso) {
    const int segment = int(payload);
    if (setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &segment, sizeof segment) != 0) floors::die("UDP_SEGMENT");
  }
  std::vector<char> data(payload * kGsoBatch, 'x');
  const uint64_t expected = uint64_t(payload) * uint64_t(o.iters);
  uint64_t sent = 0, received = 0;
  for (int r = -1; r < o.runs; ++r) {  // run -1 warms up
    pipe_write(go[1], &expected, sizeof expected);
    stream_send(fd, data, payload, o.iters, gso);
    StreamResult result;
    pipe_read(done[0], &result, sizeof result);
    if (r < 0) continue;
    sent += expected;
    received += result.bytes;
    if (result.ns > 0) samples.push_back(double(result.bytes) / result.ns);
  }
  const uint64_t stop = 0;
  pipe_write(go[1], &stop, sizeof stop);
  floors::reap(child);
  if (samples.empty()) {
    std::fprintf(stderr, "%s: nothing arrived\n", argv[0]);
    return 1;
  }
  const std::string name = "udp_" + std::string(gso ? "stream_gso" : "stream");
  char details[128];
  std::snprintf(details, sizeof details, "%ld datagrams of %zu B each, %.1f%% lost, ", o.iters,
                payload, sent ? 100.0 * double(sent - received) / double(sent) : 0.0);
  floors::report(name.c_str(), samples, "GB/s", details + std::string(where));
  return 0;
}
