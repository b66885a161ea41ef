// How a datagram sent to one UDP port reaches the process that owns its destination QP, when
// many processes share the port (docs/decisions/0006-roce-port-4791.md). Three designs:
//   plain      the floor: each receiver has its own UDP port, nothing is shared
//   reuseport  every process binds the port with SO_REUSEPORT; a classic BPF program
//              (SO_ATTACH_REUSEPORT_CBPF) reads DestQP (payload bytes 5..7) and returns the
//              owner's index in the group
//   forward    one holder process binds the port and forwards each datagram to its owner
//              over a Unix datagram socket
// Each run measures one-way latency (a pinger and N receivers, ping-pong round robin, both
// directions through the design, half the round trip) and packets/s (one sender blasting
// 64-byte datagrams round robin at N receivers with sendmmsg, for 200 ms).
//
//   roce_port [-r RUNS] [-n ITERS] [-p RECEIVERS] [-P PORT] plain|reuseport|forward
//
// Prints two lines (latency, rate), medians of the runs.
#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstdint>

#include "../floors/floor.hpp"

namespace {

constexpr int kShift = 14;  // QPN = slot << 14 | index, as src/wire/registry.hpp
constexpr int kMaxProcs = 64;
constexpr size_t kBytes = 64;
constexpr uint8_t kPing = 1, kBlast = 2;

struct Shared {
  std::atomic<int> ready{0};
  std::atomic<uint64_t> received[kMaxProcs];
  std::atomic<int64_t> last_rx_ns[kMaxProcs];
};

std::string mode;
uint16_t port = 4791;
int receivers = 2;
Shared* shared = nullptr;
pid_t bench_pid = 0;  // names the Unix addresses of this run

int64_t now() { return int64_t(floors::now_ns()); }

sockaddr_in loopback(uint16_t p) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(p);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

sockaddr_un unix_address(int slot) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "roce-port-bench-%d-%d", int(bench_pid),
                slot);
  return a;
}

int udp_socket(uint16_t bind_port, bool reuse) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) floors::die("socket");
  int one = 1;
  if (reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
    floors::die("SO_REUSEPORT");
  sockaddr_in a = loopback(bind_port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) floors::die("bind udp");
  return fd;
}

int unix_socket(int slot) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a = unix_address(slot);
  socklen_t len = offsetof(sockaddr_un, sun_path) + 1 + std::strlen(a.sun_path + 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) floors::die("bind unix");
  return fd;
}

// The reuseport program for the bench: slot s joined at index s - 1, so index = slot - 1.
void attach_slot_program(int fd) {
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xffffff),
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, kShift),
      BPF_STMT(BPF_ALU | BPF_SUB | BPF_K, 1),
      BPF_STMT(BPF_RET | BPF_A, 0),
  };
  sock_fprog prog{sizeof code / sizeof code[0], code};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0)
    floors::die("SO_ATTACH_REUSEPORT_CBPF");
}

// Where a datagram for `slot` is sent: the shared port, or the slot's own port (plain).
sockaddr_in destination(int slot) { return loopback(mode == "plain" ? port + slot : port); }

void fill(uint8_t* buf, int dest_slot, uint8_t kind) {
  std::memset(buf, 0, kBytes);
  buf[0] = kind;
  const uint32_t qpn = uint32_t(dest_slot) << kShift | 5;
  buf[5] = uint8_t(qpn >> 16);
  buf[6] = uint8_t(qpn >> 8);
  buf[7] = uint8_t(qpn);
}

// One process of the design: its receiving socket (UDP or Unix) and a socket to send from.
struct Endpoint {
  int rx = -1;
  int tx = -1;
};

Endpoint join(int slot) {
  Endpoint e;
  if (mode == "plain") {
    e.rx = e.tx = udp_socket(uint16_t(port + slot), false);
  } else if (mode == "reuseport") {
    e.rx = e.tx = udp_socket(port, true);
  } else {
    e.rx = unix_socket(slot);
    e.tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  }
  return e;
}

void send_to_slot(int fd, int slot, uint8_t kind) {
  uint8_t buf[kBytes];
  fill(buf, slot, kind);
  sockaddr_in a = destination(slot);
  if (sendto(fd, buf, kBytes, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) != ssize_t(kBytes))
    floors::die("sendto");
}

// The forward design's holder: recvmmsg from the port, one sendto per datagram to its owner.
[[noreturn]] void holder(int udp) {
  int out = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  constexpr int kBatch = 32;
  static uint8_t bufs[kBatch][2048];
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  for (;;) {
    for (int i = 0; i < kBatch; ++i) {
      iov[i] = {bufs[i], sizeof bufs[i]};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(udp, msgs, kBatch, MSG_WAITFORONE, nullptr);
    for (int i = 0; i < n; ++i) {
      if (msgs[i].msg_len < 8) continue;
      const int slot = bufs[i][5] << 2 | bufs[i][6] >> 6;  // DestQP >> 14
      sockaddr_un a = unix_address(slot);
      socklen_t len = offsetof(sockaddr_un, sun_path) + 1 + std::strlen(a.sun_path + 1);
      sendto(out, bufs[i], msgs[i].msg_len, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&a), len);
    }
  }
}

// A receiver: answers pings to the pinger's slot, counts blasts.
[[noreturn]] void receiver(Endpoint e, int slot, int pinger_slot) {
  shared->ready.fetch_add(1);
  uint8_t buf[2048];
  for (;;) {
    ssize_t n = recv(e.rx, buf, sizeof buf, 0);
    if (n < ssize_t(kBytes)) continue;
    if (buf[0] == kPing) {
      send_to_slot(e.tx, pinger_slot, kPing);
    } else {
      shared->received[slot].fetch_add(1, std::memory_order_relaxed);
      shared->last_rx_ns[slot].store(now(), std::memory_order_relaxed);
    }
  }
}

double ping_run(const Endpoint& e, long iters) {
  uint8_t buf[2048];
  const double t0 = floors::now_ns();
  for (long i = 0; i < iters; ++i) {
    send_to_slot(e.tx, 1 + int(i % receivers), kPing);
    while (recv(e.rx, buf, sizeof buf, 0) < ssize_t(kBytes) || buf[0] != kPing) {
    }
  }
  return (floors::now_ns() - t0) / (2.0 * iters) / 1000.0;  // one way, us
}

// Blasts for 200 ms; returns packets/s delivered to the receivers.
double blast_run(const Endpoint& e) {
  constexpr int kBatch = 32;
  uint8_t bufs[kBatch][kBytes];
  sockaddr_in addrs[kBatch];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch];
  uint64_t before = 0;
  for (int s = 1; s <= receivers; ++s) before += shared->received[s].load();
  const int64_t t0 = now();
  long next = 0;
  while (now() - t0 < 200'000'000) {
    for (int i = 0; i < kBatch; ++i, ++next) {
      const int slot = 1 + int(next % receivers);
      fill(bufs[i], slot, kBlast);
      addrs[i] = destination(slot);
      iov[i] = {bufs[i], kBytes};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_name = &addrs[i];
      msgs[i].msg_hdr.msg_namelen = sizeof addrs[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    sendmmsg(e.tx, msgs, kBatch, 0);  // a full socket buffer drops; we count arrivals
  }
  usleep(50'000);  // let the receivers drain
  uint64_t after = 0;
  int64_t last = t0;
  for (int s = 1; s <= receivers; ++s) {
    after += shared->received[s].load();
    last = std::max<int64_t>(last, shared->last_rx_ns[s].load());
  }
  return double(after - before) / (double(last - t0) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  // -p RECEIVERS and -P PORT are ours; floors::parse takes -r and -n.
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if ((!std::strcmp(argv[i], "-p") || !std::strcmp(argv[i], "-P")) && i + 1 < argc) {
      if (argv[i][1] == 'p') receivers = std::atoi(argv[i + 1]);
      else port = uint16_t(std::atoi(argv[i + 1]));
      ++i;
    } else {
      rest.push_back(argv[i]);
    }
  }
  const floors::Options o = floors::parse(int(rest.size()), rest.data(), 5, 20000,
                                          " [-p RECEIVERS] [-P PORT] plain|reuseport|forward");
  mode = o.mode;
  if ((mode != "plain" && mode != "reuseport" && mode != "forward") || receivers < 1 ||
      receivers > kMaxProcs - 3) {
    std::fprintf(stderr, "%s: mode plain|reuseport|forward, 1..%d receivers\n", argv[0],
                 kMaxProcs - 3);
    return 2;
  }
  shared = floors::shared_object<Shared>();
  bench_pid = getpid();
  const int pinger_slot = receivers + 1;

  // Joins happen in slot order, so slot s has index s - 1 in a reuseport group.
  std::vector<pid_t> children;
  int holder_udp = -1;
  if (mode == "forward") {
    holder_udp = udp_socket(port, false);
    children.push_back(floors::fork_child([&]() -> int { holder(holder_udp); }));
    close(holder_udp);
  }
  for (int s = 1; s <= receivers; ++s) {
    Endpoint e = join(s);
    if (mode == "reuseport" && s == 1) attach_slot_program(e.rx);
    children.push_back(floors::fork_child([&]() -> int { receiver(e, s, pinger_slot); }));
    close(e.rx);
    if (e.tx != e.rx) close(e.tx);
  }
  Endpoint self = join(pinger_slot);
  while (shared->ready.load() < receivers) usleep(1000);

  ping_run(self, std::max(1L, o.iters / 10));  // warm-up
  std::vector<double> one_way_us, rate;
  for (int r = 0; r < o.runs; ++r) one_way_us.push_back(ping_run(self, o.iters));
  for (int r = 0; r < o.runs; ++r) rate.push_back(blast_run(self) / 1e6);

  for (pid_t c : children) kill(c, SIGKILL);
  for (pid_t c : children) waitpid(c, nullptr, 0);
  const std::string what = mode + ", " + std::to_string(receivers) + " receivers";
  floors::report(("roce_port_oneway_" + mode).c_str(), one_way_us, "us",
                 what + ", " + std::to_string(o.iters) + " round trips each");
  floors::report(("roce_port_rate_" + mode).c_str(), rate, "Mpps",
                 what + ", 64-byte datagrams, sendmmsg x32, 200 ms each");
  return 0;
}
