// The rsockets API of librdmacm.so.1 (<rdma/rsocket.h>), plainly mapped onto kernel sockets:
// an rsocket is a kernel socket fd and each call forwards to its kernel counterpart, so the
// errno values are the kernel's. Programs written for rsockets (rstream, rcopy, ...) thus work
// on a machine without RDMA hardware; they get sockets' semantics, not RDMA's performance.
//
// Where we differ from a plain forward, and why:
// - Sends never raise SIGPIPE (MSG_NOSIGNAL): a real rsocket has no kernel socket that could
//   raise it, so rsockets programs do not ignore the signal and would be killed by it.
// - Options at level SOL_RDMA size the RDMA queues of a real rsocket. There are no queues
//   here, so they are only remembered per fd, for rgetsockopt to report back.
// - Direct data placement (riomap, riounmap, riowrite) writes into a peer's registered
//   memory with RDMA writes; a kernel byte stream has no such memory, so all three fail
//   with ENOSYS.

#include <fcntl.h>
#include <rdma/rsocket.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

#define RSOCKET_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// The SOL_RDMA values of one fd; the defaults are rdma-core's.
struct RdmaOptions {
  uint32_t sq_size = 384;
  uint32_t rq_size = 384;
  uint32_t inline_size = 64;
  uint32_t iomap_size = 0;
};

// Only fds whose options were set have an entry. Never destroyed: other threads may still
// call in while static destructors run at exit.
std::mutex &g_options_mu = *new std::mutex;
std::unordered_map<int, RdmaOptions> &g_options = *new std::unordered_map<int, RdmaOptions>;

// A new fd may reuse the number of one closed with close() rather than rclose(); it starts
// from the defaults, not from that fd's options.
void forget_options(int fd) {
  std::lock_guard lock(g_options_mu);
  g_options.erase(fd);
}

RdmaOptions options_of(int fd) {
  std::lock_guard lock(g_options_mu);
  auto it = g_options.find(fd);
  return it == g_options.end() ? RdmaOptions{} : it->second;
}

// The member of RdmaOptions an option names, or nullptr for one we do not remember.
uint32_t *option_field(RdmaOptions &options, int optname) {
  switch (optname) {
    case RDMA_SQSIZE:
      return &options.sq_size;
    case RDMA_RQSIZE:
      return &options.rq_size;
    case RDMA_INLINE:
      return &options.inline_size;
    case RDMA_IOMAPSIZE:
      return &options.iomap_size;
    default:
      return nullptr;
  }
}

// SOL_RDMA options exist only on rsockets: a bad fd or a non-socket fails as it would at
// SOL_SOCKET (EBADF, ENOTSOCK).
bool is_socket(int fd) {
  int type;
  socklen_t len = sizeof(type);
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
}

int fail(int err) {
  errno = err;
  return -1;
}

int set_rdma_option(int fd, int optname, const void *optval, socklen_t optlen) {
  if (!is_socket(fd)) return -1;
  if (optname == RDMA_ROUTE)
    return 0;  // a path record for the RDMA connection; the kernel routes ours
  RdmaOptions probe;
  if (!option_field(probe, optname)) return fail(ENOPROTOOPT);
  if (optlen < sizeof(uint32_t)) return fail(EINVAL);
  if (!optval) return fail(EFAULT);
  uint32_t value;
  std::memcpy(&value, optval, sizeof(value));
  std::lock_guard lock(g_options_mu);
  *option_field(g_options[fd], optname) = value;
  return 0;
}

int get_rdma_option(int fd, int optname, void *optval, socklen_t *optlen) {
  if (!is_socket(fd)) return -1;
  RdmaOptions options = options_of(fd);
  const uint32_t *field = option_field(options, optname);
  // RDMA_ROUTE included: there is no RDMA path to report.
  if (!field) return fail(ENOPROTOOPT);
  if (!optval || !optlen) return fail(EFAULT);
  if (*optlen < sizeof(uint32_t)) return fail(EINVAL);
  std::memcpy(optval, field, sizeof(uint32_t));
  *optlen = sizeof(uint32_t);
  return 0;
}

// What the third argument of an fcntl command is, so rfcntl reads it with its own type.
enum class FcntlArg { None, Int, Pointer };

FcntlArg fcntl_arg(int cmd) {
  switch (cmd) {
    case F_GETFD:
    case F_GETFL:
    case F_GETOWN:
    case F_GETSIG:
    case F_GETLEASE:
    case F_GETPIPE_SZ:
    case F_GET_SEALS:
      return FcntlArg::None;
    case F_DUPFD:
    case F_DUPFD_CLOEXEC:
    case F_SETFD:
    case F_SETFL:
    case F_SETOWN:
    case F_SETSIG:
    case F_SETLEASE:
    case F_NOTIFY:
    case F_SETPIPE_SZ:
    case F_ADD_SEALS:
      return FcntlArg::Int;
    default:
      return FcntlArg::Pointer;  // locks, F_GETOWN_EX, hints; unknown ones as glibc does
  }
}

}  // namespace

RSOCKET_EXPORT int rsocket(int domain, int type, int protocol) {
  if (domain != AF_INET && domain != AF_INET6)
    return fail(EAFNOSUPPORT);  // AF_IB too: it names InfiniBand addresses
  int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (kind != SOCK_STREAM && kind != SOCK_DGRAM)
    return fail(ENOTSUP);  // rsockets carry streams and datagrams only
  int fd = socket(domain, type, protocol);
  if (fd >= 0) forget_options(fd);
  return fd;
}

RSOCKET_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen) {
  return bind(socket, addr, addrlen);
}

RSOCKET_EXPORT int rlisten(int socket, int backlog) { return listen(socket, backlog); }

RSOCKET_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen) {
  int fd = accept(socket, addr, addrlen);
  if (fd >= 0) forget_options(fd);
  return fd;
}

RSOCKET_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen) {
  return connect(socket, addr, addrlen);
}

RSOCKET_EXPORT int rshutdown(int socket, int how) { return shutdown(socket, how); }

RSOCKET_EXPORT int rclose(int socket) {
  // Forget first: once closed, the number may already belong to another thread's rsocket.
  forget_options(socket);
  return close(socket);
}

RSOCKET_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags) {
  return recv(socket, buf, len, flags);
}

RSOCKET_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
                                 struct sockaddr *src_addr, socklen_t *addrlen) {
  return recvfrom(socket, buf, len, flags, src_addr, addrlen);
}

RSOCKET_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags) {
  return recvmsg(socket, msg, flags);
}

RSOCKET_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags) {
  return send(socket, buf, len, flags | MSG_NOSIGNAL);
}

RSOCKET_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
                               const struct sockaddr *dest_addr, socklen_t addrlen) {
  return sendto(socket, buf, len, flags | MSG_NOSIGNAL, dest_addr, addrlen);
}

RSOCKET_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags) {
  return sendmsg(socket, msg, flags | MSG_NOSIGNAL);
}

RSOCKET_EXPORT ssize_t rread(int socket, void *buf, size_t count) {
  return read(socket, buf, count);
}

RSOCKET_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt) {
  return readv(socket, iov, iovcnt);
}

// write() on a socket is send() without flags; send() lets us add MSG_NOSIGNAL. A fd that is
// not a socket gets the plain write().
RSOCKET_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count) {
  ssize_t n = send(socket, buf, count, MSG_NOSIGNAL);
  if (n < 0 && errno == ENOTSOCK) return write(socket, buf, count);
  return n;
}

RSOCKET_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt) {
  // writev's errno for a bad count; sendmsg would say EMSGSIZE.
  if (iovcnt < 0 || iovcnt > IOV_MAX) return fail(EINVAL);
  struct msghdr msg {};
  msg.msg_iov = const_cast<struct iovec *>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
  if (n < 0 && errno == ENOTSOCK) return writev(socket, iov, iovcnt);
  return n;
}

RSOCKET_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) {
  return poll(fds, nfds, timeout);
}

RSOCKET_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
                           struct timeval *timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}

RSOCKET_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen) {
  return getpeername(socket, addr, addrlen);
}

RSOCKET_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen) {
  return getsockname(socket, addr, addrlen);
}

RSOCKET_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval,
                               socklen_t optlen) {
  if (level == SOL_RDMA) return set_rdma_option(socket, optname, optval, optlen);
  return setsockopt(socket, level, optname, optval, optlen);
}

RSOCKET_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval,
                               socklen_t *optlen) {
  if (level == SOL_RDMA) return get_rdma_option(socket, optname, optval, optlen);
  return getsockopt(socket, level, optname, optval, optlen);
}

RSOCKET_EXPORT int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  int ret;
  switch (fcntl_arg(cmd)) {
    case FcntlArg::None:
      ret = fcntl(socket, cmd);
      break;
    case FcntlArg::Int:
      ret = fcntl(socket, cmd, va_arg(ap, int));
      break;
    default:
      ret = fcntl(socket, cmd, va_arg(ap, void *));
      break;
  }
  va_end(ap);
  return ret;
}

RSOCKET_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset) {
  errno = ENOSYS;
  return -1;
}

RSOCKET_EXPORT int riounmap(int socket, void *buf, size_t len) { return fail(ENOSYS); }

// The header declares size_t; failure is (size_t)-1, i.e. -1 once the caller casts it back.
RSOCKET_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags) {
  errno = ENOSYS;
  return static_cast<size_t>(-1);
}
