// The rsockets API of our librdmacm.so.1 (src/cm/rsockets.cpp), which maps rsockets onto
// kernel sockets: TCP and UDP traffic on 127.0.0.1, rfcntl, the SOL_RDMA options it only
// remembers, and the errors of what it does not support.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace {

constexpr int kPollMs = 5000;  // long enough for a loaded CI machine; nothing here waits on it

sockaddr_in loopback(uint16_t port = 0) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sin;
}

const sockaddr *as_addr(const sockaddr_in &sin) { return reinterpret_cast<const sockaddr *>(&sin); }

// The port a bound rsocket got from the kernel, or 0 on failure.
uint16_t bound_port(int fd) {
  sockaddr_in sin{};
  socklen_t len = sizeof(sin);
  if (rgetsockname(fd, reinterpret_cast<sockaddr *>(&sin), &len) != 0) return 0;
  return ntohs(sin.sin_port);
}

// Whether fd becomes readable within kPollMs.
bool readable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  return rpoll(&pfd, 1, kPollMs) == 1 && (pfd.revents & POLLIN);
}

// An rsocket that closes itself, so a failed assertion does not leak it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  ~Fd() {
    if (fd_ >= 0) rclose(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// A UDP rsocket bound to an ephemeral port on 127.0.0.1.
int bound_udp() {
  int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return -1;
  sockaddr_in sin = loopback();
  if (rbind(fd, as_addr(sin), sizeof(sin)) != 0) {
    rclose(fd);
    return -1;
  }
  return fd;
}

TEST(RsocketsTest, TcpEcho) {
  Fd listener(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(listener.get(), 0) << strerror(errno);
  sockaddr_in any_port = loopback();
  ASSERT_EQ(rbind(listener.get(), as_addr(any_port), sizeof(any_port)), 0) << strerror(errno);
  ASSERT_EQ(rlisten(listener.get(), 1), 0) << strerror(errno);
  uint16_t port = bound_port(listener.get());
  ASSERT_NE(port, 0);

  // Echoes everything back until the client shuts its side down. The server waits with
  // rpoll, so a client that never connects cannot hang the test.
  std::thread server([fd = listener.get()] {
    if (!readable(fd)) {
      ADD_FAILURE() << "no connection within " << kPollMs << " ms";
      return;
    }
    sockaddr_in peer{};
    socklen_t peer_len = sizeof(peer);
    Fd conn(raccept(fd, reinterpret_cast<sockaddr *>(&peer), &peer_len));
    if (conn.get() < 0) {
      ADD_FAILURE() << "raccept: " << strerror(errno);
      return;
    }
    EXPECT_EQ(peer.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    char buf[256];
    for (;;) {
      if (!readable(conn.get())) {
        ADD_FAILURE() << "client went quiet";
        return;
      }
      ssize_t n = rread(conn.get(), buf, sizeof(buf));
      if (n <= 0) {
        EXPECT_EQ(n, 0) << strerror(errno);
        return;
      }
      EXPECT_EQ(rwrite(conn.get(), buf, static_cast<size_t>(n)), n) << strerror(errno);
    }
  });

  Fd client(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(client.get(), 0) << strerror(errno);
  sockaddr_in server_addr = loopback(port);
  ASSERT_EQ(rconnect(client.get(), as_addr(server_addr), sizeof(server_addr)), 0)
      << strerror(errno);

  sockaddr_in peer{};
  socklen_t peer_len = sizeof(peer);
  ASSERT_EQ(rgetpeername(client.get(), reinterpret_cast<sockaddr *>(&peer), &peer_len), 0);
  EXPECT_EQ(ntohs(peer.sin_port), port);

  // One message with rsend, one gathered with rwritev; the echo may come back in pieces.
  const std::string first = "hello, rsockets";
  const std::string second = "second";
  const std::string third = " message";
  ASSERT_EQ(rsend(client.get(), first.data(), first.size(), 0), static_cast<ssize_t>(first.size()));
  iovec iov[2] = {{const_cast<char *>(second.data()), second.size()},
                  {const_cast<char *>(third.data()), third.size()}};
  ASSERT_EQ(rwritev(client.get(), iov, 2), static_cast<ssize_t>(second.size() + third.size()));

  const std::string expected = first + second + third;
  std::string echoed;
  while (echoed.size() < expected.size()) {
    ASSERT_TRUE(readable(client.get())) << "no echo within " << kPollMs << " ms";
    char buf[256];
    ssize_t n = rrecv(client.get(), buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << strerror(errno);
    echoed.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(echoed, expected);

  // Our half-close ends the server's loop; its close then reads as end of stream here.
  ASSERT_EQ(rshutdown(client.get(), SHUT_WR), 0) << strerror(errno);
  server.join();
  ASSERT_TRUE(readable(client.get()));
  char byte;
  EXPECT_EQ(rrecv(client.get(), &byte, 1, 0), 0);
}

// A send to a peer that has closed fails with EPIPE (or ECONNRESET) instead of raising
// SIGPIPE, which would end this process: rsockets programs do not expect the signal.
TEST(RsocketsTest, SendToClosedPeerRaisesNoSignal) {
  Fd listener(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(listener.get(), 0) << strerror(errno);
  sockaddr_in any_port = loopback();
  ASSERT_EQ(rbind(listener.get(), as_addr(any_port), sizeof(any_port)), 0);
  ASSERT_EQ(rlisten(listener.get(), 1), 0);
  Fd client(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(client.get(), 0);
  sockaddr_in server_addr = loopback(bound_port(listener.get()));
  // The kernel completes the handshake from the backlog, so no thread needs to accept.
  ASSERT_EQ(rconnect(client.get(), as_addr(server_addr), sizeof(server_addr)), 0)
      << strerror(errno);
  ASSERT_EQ(rclose(raccept(listener.get(), nullptr, nullptr)), 0) << strerror(errno);

  // The first send draws the peer's reset; a later one then fails.
  const char byte = 'x';
  ssize_t n = 0;
  for (int i = 0; i < 100 && n >= 0; ++i) {
    n = i % 2 ? rsend(client.get(), &byte, 1, 0) : rwrite(client.get(), &byte, 1);
    if (n >= 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(n, -1);
  EXPECT_TRUE(errno == EPIPE || errno == ECONNRESET) << strerror(errno);
}

TEST(RsocketsTest, UdpRoundTrip) {
  Fd a(bound_udp());
  Fd b(bound_udp());
  ASSERT_GE(a.get(), 0) << strerror(errno);
  ASSERT_GE(b.get(), 0) << strerror(errno);
  uint16_t port_a = bound_port(a.get());
  sockaddr_in to_b = loopback(bound_port(b.get()));

  const char ping[] = "ping";
  ASSERT_EQ(rsendto(a.get(), ping, sizeof(ping), 0, as_addr(to_b), sizeof(to_b)),
            static_cast<ssize_t>(sizeof(ping)))
      << strerror(errno);
  ASSERT_TRUE(readable(b.get()));
  char buf[64];
  sockaddr_in from{};
  socklen_t from_len = sizeof(from);
  ASSERT_EQ(rrecvfrom(b.get(), buf, sizeof(buf), 0, reinterpret_cast<sockaddr *>(&from), &from_len),
            static_cast<ssize_t>(sizeof(ping)));
  EXPECT_STREQ(buf, ping);
  EXPECT_EQ(ntohs(from.sin_port), port_a);

  // The reply goes to the address the datagram came from, and arrives through rrecvmsg.
  const char pong[] = "pong";
  ASSERT_EQ(rsendto(b.get(), pong, sizeof(pong), 0, reinterpret_cast<sockaddr *>(&from), from_len),
            static_cast<ssize_t>(sizeof(pong)));
  ASSERT_TRUE(readable(a.get()));
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  ASSERT_EQ(rrecvmsg(a.get(), &msg, 0), static_cast<ssize_t>(sizeof(pong)));
  EXPECT_STREQ(buf, pong);
}

TEST(RsocketsTest, SelectSeesADatagram) {
  Fd a(bound_udp());
  Fd b(bound_udp());
  ASSERT_GE(a.get(), 0);
  ASSERT_GE(b.get(), 0);
  sockaddr_in to_b = loopback(bound_port(b.get()));
  ASSERT_EQ(rsendto(a.get(), "x", 1, 0, as_addr(to_b), sizeof(to_b)), 1);

  fd_set readfds;
  FD_ZERO(&readfds);
  FD_SET(b.get(), &readfds);
  timeval timeout{kPollMs / 1000, 0};
  ASSERT_EQ(rselect(b.get() + 1, &readfds, nullptr, nullptr, &timeout), 1);
  EXPECT_TRUE(FD_ISSET(b.get(), &readfds));
}

TEST(RsocketsTest, NonBlockingRecvSaysEagain) {
  Fd fd(bound_udp());
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  int flags = rfcntl(fd.get(), F_GETFL);
  ASSERT_GE(flags, 0) << strerror(errno);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  ASSERT_EQ(rfcntl(fd.get(), F_SETFL, flags | O_NONBLOCK), 0) << strerror(errno);
  EXPECT_NE(rfcntl(fd.get(), F_GETFL) & O_NONBLOCK, 0);

  char buf[16];
  errno = 0;
  EXPECT_EQ(rrecv(fd.get(), buf, sizeof(buf), 0), -1);
  EXPECT_EQ(errno, EAGAIN);

  // Commands with a pointer argument pass it through too.
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  EXPECT_EQ(rfcntl(fd.get(), F_GETLK, &lock), 0) << strerror(errno);
}

TEST(RsocketsTest, SocketFlagsAndDomains) {
  Fd fd(rsocket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  EXPECT_NE(rfcntl(fd.get(), F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(rfcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);

  errno = 0;
  EXPECT_EQ(rsocket(AF_IB, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  errno = 0;
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_SEQPACKET, 0), -1);
  EXPECT_NE(errno, 0);
}

uint32_t rdma_option(int fd, int optname) {
  uint32_t value = 0;
  socklen_t len = sizeof(value);
  EXPECT_EQ(rgetsockopt(fd, SOL_RDMA, optname, &value, &len), 0) << strerror(errno);
  EXPECT_EQ(len, sizeof(value));
  return value;
}

TEST(RsocketsTest, RdmaOptionsRoundTrip) {
  Fd fd(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  EXPECT_EQ(rdma_option(fd.get(), RDMA_SQSIZE), 384u);
  EXPECT_EQ(rdma_option(fd.get(), RDMA_RQSIZE), 384u);
  EXPECT_EQ(rdma_option(fd.get(), RDMA_INLINE), 64u);
  EXPECT_EQ(rdma_option(fd.get(), RDMA_IOMAPSIZE), 0u);

  const struct {
    int optname;
    uint32_t value;
  } settings[] = {{RDMA_SQSIZE, 128}, {RDMA_RQSIZE, 256}, {RDMA_INLINE, 16}, {RDMA_IOMAPSIZE, 8}};
  for (const auto &s : settings)
    ASSERT_EQ(rsetsockopt(fd.get(), SOL_RDMA, s.optname, &s.value, sizeof(s.value)), 0)
        << strerror(errno);
  for (const auto &s : settings)
    EXPECT_EQ(rdma_option(fd.get(), s.optname), s.value) << "option " << s.optname;

  // A route is accepted but not reported back.
  char path[64] = {};
  EXPECT_EQ(rsetsockopt(fd.get(), SOL_RDMA, RDMA_ROUTE, path, sizeof(path)), 0);
  socklen_t len = sizeof(path);
  errno = 0;
  EXPECT_EQ(rgetsockopt(fd.get(), SOL_RDMA, RDMA_ROUTE, path, &len), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);

  uint32_t value = 1;
  errno = 0;
  EXPECT_EQ(rsetsockopt(fd.get(), SOL_RDMA, 99, &value, sizeof(value)), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  len = sizeof(value);
  errno = 0;
  EXPECT_EQ(rgetsockopt(fd.get(), SOL_RDMA, 99, &value, &len), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);

  uint16_t too_short = 1;
  errno = 0;
  EXPECT_EQ(rsetsockopt(fd.get(), SOL_RDMA, RDMA_SQSIZE, &too_short, sizeof(too_short)), -1);
  EXPECT_EQ(errno, EINVAL);

  // Other levels are the kernel's.
  int on = 1;
  ASSERT_EQ(rsetsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)), 0);
  int got = 0;
  len = sizeof(got);
  ASSERT_EQ(rgetsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &got, &len), 0);
  EXPECT_NE(got, 0);
}

TEST(RsocketsTest, RcloseForgetsRdmaOptions) {
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << strerror(errno);
  uint32_t value = 32;
  ASSERT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &value, sizeof(value)), 0);
  ASSERT_EQ(rclose(fd), 0);

  // The kernel hands out the lowest free number, so the new socket very likely reuses fd;
  // either way it must start from the defaults.
  Fd again(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(again.get(), 0);
  EXPECT_EQ(rdma_option(again.get(), RDMA_SQSIZE), 384u);

  // Options belong to sockets only.
  errno = 0;
  EXPECT_EQ(rsetsockopt(-1, SOL_RDMA, RDMA_SQSIZE, &value, sizeof(value)), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(RsocketsTest, DirectDataPlacementIsNotSupported) {
  Fd fd(rsocket(AF_INET, SOCK_STREAM, 0));
  ASSERT_GE(fd.get(), 0);
  char buf[4096];
  errno = 0;
  EXPECT_EQ(riomap(fd.get(), buf, sizeof(buf), PROT_WRITE, 0, -1), static_cast<off_t>(-1));
  EXPECT_EQ(errno, ENOSYS);
  errno = 0;
  EXPECT_EQ(riounmap(fd.get(), buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, ENOSYS);
  errno = 0;
  EXPECT_EQ(static_cast<ssize_t>(riowrite(fd.get(), buf, sizeof(buf), 0, 0)), -1);
  EXPECT_EQ(errno, ENOSYS);
}

TEST(RsocketsTest, RcloseOfBadFdSaysEbadf) {
  errno = 0;
  EXPECT_EQ(rclose(-1), -1);
  EXPECT_EQ(errno, EBADF);

  int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(rclose(fd), 0);
  errno = 0;
  EXPECT_EQ(rclose(fd), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
