#include "wire/shm/agent.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/verbs_ext.hpp"
#include "wire/shm/mr_shm.hpp"
#include "wire/registry.hpp"

namespace softverbs::wire {

namespace {

constexpr uint32_t kMagic = 0x53565731;  // "SVW1"
constexpr int kMaxWireIov = kMaxSge + 1;
constexpr int kReplyTimeoutMs = 5000;
// How long the agent waits for a requester to take its answer or send its payload: one
// that is there reads and writes at once, and meanwhile every other peer waits too.
constexpr int kPeerStallMs = 1000;

enum Kind : uint32_t {
  kExecute = 1, kKick = 2, kProbe = 3, kOpenWindow = 4, kDrain = 5,
  // XRC TGT QPs opened across processes (XrcOp's values), and their events.
  kXrcOpen = 6, kXrcModify = 7, kXrcQuery = 8, kXrcClose = 9, kXrcEvent = 10,
  // XRC: a message our TGT QP took, for an XRC SRQ of the process asked (its delivery
  // thread); the payload is in the asker's memory.
  kXrcDeliver = 11,
  // ibv_import_pd/ibv_import_mr across processes (ImportOp in flags), and the destruction
  // of what an importer deregisters.
  kImport = 12,
  // XRC: a process that ends hands its TGT QPs still held elsewhere to a holder (XrcOp).
  kXrcAdopt = 13, kXrcCommit = 14, kXrcAbort = 15,
  // XRC: a holder's handles on a TGT QP rebuilt after its process was killed.
  kXrcRejoin = 16,
};

std::atomic<const XrcHooks*> g_xrc_hooks{nullptr};
std::atomic<const ImportHooks*> g_import_hooks{nullptr};

// How payload travels on a connection: straight between the two processes' buffers with
// cross-memory attach, or, where the kernel refuses that (no CAP_SYS_PTRACE in some
// containers, Yama), through the socket in chunks after the request / reply.
enum CopyMode : uint32_t { kCrossMemory = 0, kThroughSocket = 1 };
constexpr size_t kChunk = 64 * 1024;

struct WireIov {
  uint64_t addr;
  uint64_t len;
};

// Everything in it comes from another process: the agent checks it before use, and takes
// the requester's pid from the kernel (SO_PEERCRED), never from the message.
struct WireRequest {
  uint32_t magic;
  uint32_t kind;
  uint32_t src_qpn;
  uint32_t dst_qpn;
  uint32_t type;
  uint32_t opcode;
  uint32_t flags;
  uint32_t imm;
  uint32_t rkey;
  uint32_t qkey;
  uint32_t niov;
  uint32_t copy_mode;
  uint32_t xrc_srqn;  // XRC: the XRC SRQ named (24 bits)
  uint32_t xrc_access;  // kXrcDeliver: the TGT QP's access flags (qkey: its rnr timer, rd_atomic)
  uint64_t remote_addr;
  uint64_t compare_add;
  uint64_t swap;
  uint64_t length;
  uint64_t xrc_dev, xrc_ino;  // kXrcDeliver: the domain's file
  uint8_t sgid[16];
  uint8_t dgid[16];
  WireIov iov[kMaxWireIov];
};
// tests/conformance/twoproc_agent_garbage.c speaks this layout by hand: change both.
static_assert(sizeof(WireRequest) == 664, "WireRequest's layout is mirrored by a test");

struct WireReply {
  uint32_t magic;
  uint32_t kind;
  uint32_t status;
  uint32_t rnr_timer;
  uint32_t byte_len;
  uint32_t fd_mask;  // which of the kMaxFds slots the attached descriptors fill, in order
  uint64_t value;  // kOpenWindow: the window's offset in the arena sent along (SCM_RIGHTS)
};

bool valid_type(uint32_t t) {
  return t == IBV_QPT_RC || t == IBV_QPT_UC || t == IBV_QPT_UD || t == IBV_QPT_XRC_SEND;
}

bool valid_opcode(uint32_t op) {
  switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:  // its 8 bytes travel in compare_add
    case kWrFlush:             // type and level in compare_add and swap
      return true;
    default:
      return false;
  }
}

sockaddr_un make_address(int slot, socklen_t* len, bool delivery = false) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string name = agent_address(slot) + (delivery ? "-xrc" : "");
  size_t n = std::min(name.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  return addr;
}

bool carries_payload(uint32_t op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
         op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

uint64_t returned_length(uint32_t op, uint64_t length) {
  if (op == IBV_WR_RDMA_READ) return length;
  if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) return 8;
  return 0;
}

// Waits up to `wait_ms` for `fd` to be readable; a signal does not cut the wait short (a
// caller that took EINTR for "no answer" dropped a healthy connection, or gave up on
// cross-memory attach for good). 1: readable, 0: timed out, -1: error (errno).
int wait_readable(int fd, int wait_ms) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, wait_ms);
    if (ready >= 0 || errno != EINTR) return ready;
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t spent_ms =
        (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (spent_ms >= wait_ms) return 0;
    wait_ms -= static_cast<int>(spent_ms);
    start = now;
  }
}

// Sends one message, waiting at most `wait_ms` for room: a peer that stops reading must not
// hold this thread for good. On failure errno says why (ETIMEDOUT: no room in time).
bool send_message(int fd, const msghdr* msg, size_t len, int wait_ms) {
  for (;;) {
    ssize_t n = sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n) == len;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return false;
    pollfd p{fd, POLLOUT, 0};
    int ready = wait_ms > 0 ? poll(&p, 1, wait_ms) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      if (ready == 0) errno = ETIMEDOUT;
      return false;
    }
  }
}

bool send_message(int fd, const void* buf, size_t len, int wait_ms) {
  iovec iov{const_cast<void*>(buf), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  return send_message(fd, &msg, len, wait_ms);
}

// Sends `len` bytes gathered from `iov` as chunk messages, waiting at most `wait_ms` for
// room for each.
bool send_chunks(int fd, const iovec* iov, int n, uint64_t len, int wait_ms) {
  std::vector<char> buf(std::min<uint64_t>(len, kChunk));
  int i = 0;
  size_t off = 0;
  while (len > 0) {
    size_t fill = 0, want = std::min<uint64_t>(len, kChunk);
    while (fill < want && i < n) {
      size_t k = std::min(want - fill, iov[i].iov_len - off);
      std::memcpy(buf.data() + fill, static_cast<char*>(iov[i].iov_base) + off, k);
      fill += k;
      off += k;
      if (off == iov[i].iov_len) ++i, off = 0;
    }
    if (fill != want) return false;
    if (!send_message(fd, buf.data(), want, wait_ms)) return false;
    len -= want;
  }
  return true;
}

// Receives `len` bytes of chunk messages, scattering them into `iov`, waiting at most
// `wait_ms` for each.
bool recv_chunks(int fd, const iovec* iov, int n, uint64_t len, int wait_ms) {
  std::vector<char> buf(std::min<uint64_t>(len, kChunk));
  int i = 0;
  size_t off = 0;
  while (len > 0) {
    size_t want = std::min<uint64_t>(len, kChunk);
    if (wait_readable(fd, wait_ms) <= 0) return false;
    if (recv(fd, buf.data(), want, 0) != static_cast<ssize_t>(want)) return false;
    size_t used = 0;
    while (used < want && i < n) {
      size_t k = std::min(want - used, iov[i].iov_len - off);
      std::memcpy(static_cast<char*>(iov[i].iov_base) + off, buf.data() + used, k);
      used += k;
      off += k;
      if (off == iov[i].iov_len) ++i, off = 0;
    }
    if (used != want) return false;
    len -= want;
  }
  return true;
}

// Through-socket mode: a request's payload (or READ data) in our memory. Its length is the
// peer's word, up to kMaxMsgSize: the buffer is mapped, not allocated and filled, so its
// pages cost memory only as payload arrives (or the responder writes them), and a length
// that cannot be had is a failed reserve, never an exception in the agent thread.
class Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (data_) munmap(data_, size_);
  }
  bool reserve(size_t bytes) {
    if (bytes == 0) return true;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<char*>(p);
    size_ = bytes;
    return true;
  }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// ---- server side -------------------------------------------------------------------------

struct Server {
  EngineHooks hooks;  // the engine's, with the agent's own below
  ShmHooks shm;
  int listen_fd = -1;
  // The XRC delivery thread: it serves kXrcDeliver only, and never asks another process
  // anything, so that agents forwarding to each other cannot wait on each other in a ring.
  bool delivery = false;
  // Readable when the thread must stop (an eventfd; -1: never): it closes its sockets,
  // which frees its address, and sets `stopped`.
  int stop_fd = -1;
  std::atomic<bool>* stopped = nullptr;
  // An adopted slot's thread: when `release` is set at the stop, the slot goes back to the
  // registry once the address is free (no newcomer can find it taken).
  int slot = 0;
  std::atomic<bool>* release = nullptr;
};

constexpr int kMaxFds = 4;

// Sends a reply with file descriptors attached; the -1 entries are left out and fd_mask
// says which slots the others fill.
bool send_with_fds(int sock, const WireReply& reply, const int fds[kMaxFds]) {
  WireReply r = reply;
  int present[kMaxFds];
  int n = 0;
  r.fd_mask = 0;
  for (int i = 0; i < kMaxFds; ++i) {
    if (fds[i] < 0) continue;
    r.fd_mask |= 1u << i;
    present[n++] = fds[i];
  }
  iovec iov{&r, sizeof(r)};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    std::memcpy(CMSG_DATA(c), present, n * sizeof(int));
  }
  return send_message(sock, &msg, sizeof(r), kPeerStallMs);
}

// Receives a reply and the file descriptors attached to it (-1 where none).
bool recv_with_fds(int sock, WireReply* r, int fds[kMaxFds]) {
  iovec iov{r, sizeof(*r)};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (int i = 0; i < kMaxFds; ++i) fds[i] = -1;
  ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  int slot = 0;  // next slot named by fd_mask
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      while (got == sizeof(*r) && slot < kMaxFds && !(r->fd_mask & (1u << slot))) ++slot;
      if (got == sizeof(*r) && slot < kMaxFds)
        fds[slot++] = fd;
      else
        close(fd);  // more than the mask names (or a bad reply): not ours to keep
    }
  }
  return got == sizeof(*r);
}

// An XRC request about our TGT QP `m.dst_qpn` from process `pid`: 0 or an errno value. The
// attributes travel by cross-memory attach from and to the asker's `m.remote_addr`.
int serve_xrc(const XrcHooks* h, const WireRequest& m, pid_t pid) {
  if (!h || !h->open) return ENOSYS;
  const uint32_t qpn = m.dst_qpn & 0xffffff;
  ibv_qp_attr a{};
  iovec ours{&a, sizeof(a)}, theirs{reinterpret_cast<void*>(m.remote_addr), sizeof(a)};
  switch (m.kind) {
    case kXrcOpen: {
      const int slot = static_cast<int>(m.src_qpn);
      if (slot <= 0 || slot >= kSlots || slot_owner(slot) != pid) return EINVAL;
      return h->open(qpn, m.compare_add, m.swap, pid, slot);
    }
    case kXrcModify:
      if (process_vm_readv(pid, &ours, 1, &theirs, 1, 0) != static_cast<ssize_t>(sizeof(a)))
        return EFAULT;
      return h->modify(qpn, &a, static_cast<int>(m.flags), pid);
    case kXrcQuery: {
      if (int err = h->query(qpn, &a, pid)) return err;
      if (process_vm_writev(pid, &ours, 1, &theirs, 1, 0) != static_cast<ssize_t>(sizeof(a)))
        return EFAULT;
      return 0;
    }
    case kXrcClose:
      return h->close(qpn, pid);
    case kXrcAdopt: {
      if (!h->adopt) return ENOSYS;
      auto snap = std::make_unique<XrcSnapshot>();
      iovec mine{snap.get(), sizeof(*snap)};
      iovec from{reinterpret_cast<void*>(m.remote_addr), sizeof(*snap)};
      if (process_vm_readv(pid, &mine, 1, &from, 1, 0) != static_cast<ssize_t>(sizeof(*snap)))
        return EFAULT;
      if (snap->qpn != qpn) return EINVAL;
      return h->adopt(*snap, pid);
    }
    case kXrcCommit:
      return h->commit ? h->commit(static_cast<int>(m.flags), pid) : ENOSYS;
    case kXrcAbort:
      return h->abort ? h->abort(static_cast<int>(m.flags), pid) : ENOSYS;
    case kXrcRejoin: {
      const int slot = static_cast<int>(m.src_qpn);
      if (!h->rejoin || slot <= 0 || slot >= kSlots || slot_owner(slot) != pid) return EINVAL;
      return h->rejoin(qpn, m.compare_add, m.swap, pid, slot, static_cast<int>(m.flags));
    }
    default:
      return EINVAL;
  }
}

// An importer asks about an object of one of our contexts, named by the file (dev, ino) of
// its cmd_fd (which the asker must hold). An MR's answer brings our arena, its read-only
// published region and the MR memfd along, as kOpenWindow's does: the importer reads the
// MR's entry from that table and maps its pages.
bool serve_import(int fd, const WireRequest& m, pid_t pid) {
  const ImportHooks* h = g_import_hooks.load(std::memory_order_acquire);
  WireReply r{kMagic, Reply::Ack, ENOSYS, 0, 0, 0, 0};
  const auto op = static_cast<ImportOp>(m.flags);
  if (pid > 0 && h && h->serve && m.flags <= static_cast<uint32_t>(ImportOp::DeallocPd))
    r.status = static_cast<uint32_t>(h->serve(op, m.compare_add, m.swap, m.rkey, pid, &r.value));
  Arena* arena = Arena::self();
  bool sent;
  if (r.status == 0 && op == ImportOp::Mr && arena) {
    int fds[kMaxFds] = {arena->fd(), arena->published_fd(), -1, mr_shm_fd()};
    sent = send_with_fds(fd, r, fds);
  } else {
    if (r.status == 0 && op == ImportOp::Mr) r.status = EOPNOTSUPP;  // nothing to map
    sent = send_message(fd, &r, sizeof(r), kPeerStallMs);
  }
  if (!sent) close(fd);
  return sent;
}

// Serves one message; returns false when the connection is gone (then it is closed): the
// peer hung up, or did not take an answer or send its payload in time.
bool serve_one(const Server& srv, int fd) {
  WireRequest m;
  ssize_t n = recv(fd, &m, sizeof(m), 0);
  if (n <= 0) {
    close(fd);
    return false;
  }
  // Garbage, or a kind this thread does not serve: no softverbs peer sends it, and one whose
  // stream is out of step would flood us with what we drop unanswered. Hang up on it.
  if (n != static_cast<ssize_t>(sizeof(m)) || m.magic != kMagic ||
      (srv.delivery != (m.kind == kXrcDeliver) && m.kind != kProbe)) {
    close(fd);
    return false;
  }
  if (m.kind == kKick) {
    if (QpRef qp = find_local(m.dst_qpn & 0xffffff)) srv.hooks.kick(qp.get());
    return true;
  }
  if (m.kind == kDrain) {
    if (QpRef qp = find_local(m.dst_qpn & 0xffffff)) srv.shm.drain(qp.get());
    return true;
  }
  const XrcHooks* xrc = g_xrc_hooks.load(std::memory_order_acquire);
  if (m.kind == kXrcEvent) {
    if (xrc && xrc->event) xrc->event(m.dst_qpn & 0xffffff, static_cast<int>(m.imm), static_cast<int>(m.src_qpn));
    return true;
  }
  WireReply r{kMagic, Reply::NoResponse, IBV_WC_SUCCESS, 0, 0, 0, 0};
  ucred cred{};
  socklen_t clen = sizeof(cred);
  bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0;
  if (m.kind == kOpenWindow) {
    uint64_t off = 0;
    int wake = -1;
    if (QpRef qp = known ? find_local(m.dst_qpn & 0xffffff) : QpRef()) {
      off = srv.shm.open_window(qp.get(), m.src_qpn & 0xffffff, cred.pid);
      wake = srv.shm.wake_fd(qp.get());
    }
    Arena* arena = Arena::self();
    if (off && arena) {
      r.kind = Reply::Ack;
      r.value = off;
      // The arena, its read-only published region, and the receive CQ's channel waker.
      int published = arena->published_fd();
      int fds[kMaxFds] = {arena->fd(), published, wake, mr_shm_fd()};
      if (send_with_fds(fd, r, fds)) return true;
    } else if (send_message(fd, &r, sizeof(r), kPeerStallMs)) {
      return true;
    }
    close(fd);
    return false;
  }
  if (m.kind == kImport) return serve_import(fd, m, known ? cred.pid : 0);
  if (!known) return true;
  if (m.kind == kProbe) {
    // Can we reach the requester's memory? Read the word it pointed us at.
    uint64_t word = 0;
    iovec ours{&word, sizeof(word)}, theirs{reinterpret_cast<void*>(m.iov[0].addr), sizeof(word)};
    bool ok = process_vm_readv(cred.pid, &ours, 1, &theirs, 1, 0) == sizeof(word) &&
              word == m.compare_add;
    r.kind = ok ? Reply::Ack : Reply::Error;
    if (send_message(fd, &r, sizeof(r), kPeerStallMs)) return true;
    close(fd);
    return false;
  }
  if ((m.kind >= kXrcOpen && m.kind <= kXrcClose) || m.kind == kXrcAdopt ||
      m.kind == kXrcCommit || m.kind == kXrcAbort || m.kind == kXrcRejoin) {
    r.kind = Reply::Ack;
    r.status = static_cast<uint32_t>(serve_xrc(xrc, m, cred.pid));
    if (send_message(fd, &r, sizeof(r), kPeerStallMs)) return true;
    close(fd);
    return false;
  }
  bool through_socket = m.copy_mode == kThroughSocket;
  Staging staging;
  QpRef target;
  bool deferring = false;
  struct Release {  // completions held back become visible on every way out
    const Server& srv;
    bool& on;
    ~Release() {
      if (on) srv.shm.defer_completions(false);
    }
  } release{srv, deferring};
  const bool executes = m.kind == kExecute || m.kind == kXrcDeliver;
  if (through_socket && executes && m.length <= kMaxMsgSize) {
    // Without room for it, the payload on its way would put the stream out of step: hang up,
    // as a NIC drops what it cannot take (the requester's retries decide what follows).
    bool staged = staging.reserve(std::max(m.length, returned_length(m.opcode, m.length)));
    iovec all{staging.data(), staging.size()};
    if (!staged ||
        (carries_payload(m.opcode) && !recv_chunks(fd, &all, 1, m.length, kPeerStallMs))) {
      close(fd);
      return false;
    }
  }
  if (executes && m.niov <= kMaxWireIov && valid_type(m.type) &&
      valid_opcode(m.opcode) && m.length <= kMaxMsgSize) {
    iovec local[kMaxWireIov];
    for (uint32_t i = 0; i < m.niov; ++i)
      local[i] = {reinterpret_cast<void*>(m.iov[i].addr), m.iov[i].len};
    if (through_socket) {
      local[0] = {staging.data(), staging.size()};
      m.niov = 1;
      cred.pid = self_pid();  // the payload is in our memory now
    }
    Request req;
    req.src_qpn = m.src_qpn & 0xffffff;
    req.dst_qpn = m.dst_qpn & 0xffffff;
    req.type = static_cast<ibv_qp_type>(m.type);
    req.opcode = static_cast<ibv_wr_opcode>(m.opcode);
    req.flags = m.flags;
    req.imm = m.imm;
    req.remote_addr = m.remote_addr;
    req.rkey = m.rkey;
    req.qkey = m.qkey;
    req.xrc_srqn = m.xrc_srqn & 0xffffff;
    req.compare_add = m.compare_add;
    req.swap = m.swap;
    req.length = m.length;
    std::memcpy(req.sgid.raw, m.sgid, 16);
    std::memcpy(req.dgid.raw, m.dgid, 16);
    req.local = local;
    req.nlocal = static_cast<int>(m.niov);
    req.pid = cred.pid;
    if (m.kind == kXrcDeliver) {
      target = QpRef();
      if (req.type == IBV_QPT_XRC_SEND && srv.hooks.respond_xrc) {
        XrcTarget x;
        x.tgt_qpn = req.dst_qpn;
        x.access = m.xrc_access;
        x.min_rnr_timer = static_cast<uint8_t>(m.qkey & 31);
        x.max_dest_rd_atomic = static_cast<uint8_t>(m.qkey >> 8);
        x.dev = m.xrc_dev;
        x.ino = m.xrc_ino;
        int tgt_error = kXrcTgtFine;
        srv.shm.defer_completions(true);
        deferring = true;
        Reply reply = srv.hooks.respond_xrc(req, x, &tgt_error);
        r.kind = reply.kind;
        r.status = reply.status;
        r.rnr_timer = reply.rnr_timer;
        r.byte_len = reply.byte_len;
        r.value = static_cast<uint64_t>(static_cast<int64_t>(tgt_error));
      }
    } else if ((target = find_local(req.dst_qpn))) {
      // The answer leaves before the target can see the completions (an ACK is sent by
      // the NIC, not by the application): hold them until then.
      srv.shm.defer_completions(true);
      deferring = true;
      Reply reply = srv.hooks.respond(req, target.get());
      r.kind = reply.kind;
      r.status = reply.status;
      r.rnr_timer = reply.rnr_timer;
      r.byte_len = reply.byte_len;
    }
  }
  bool sent = send_message(fd, &r, sizeof(r), kPeerStallMs);
  if (sent && through_socket && r.kind == Reply::Ack && returned_length(m.opcode, m.length)) {
    iovec all{staging.data(), staging.size()};
    sent = send_chunks(fd, &all, 1, returned_length(m.opcode, m.length), kPeerStallMs);
  }
  if (!sent) {
    close(fd);
    return false;
  }
  return true;
}

void serve(Server srv) {
  // fds[0]: the listening socket, fds[1]: the stop eventfd (or -1, never readable).
  std::vector<pollfd> fds{{srv.listen_fd, POLLIN, 0}, {srv.stop_fd, POLLIN, 0}};
  for (;;) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents & POLLIN) {
      // Every connection goes: its peer sees a hang-up and connects anew, to whoever
      // took the address over.
      for (size_t i = 0; i < fds.size(); ++i)
        if (i != 1) close(fds[i].fd);
      close(srv.stop_fd);
      if (srv.release && srv.release->load()) release_adopted_slot(srv.slot);
      srv.stopped->store(true);
      srv.stopped->notify_all();
      return;
    }
    if (fds[0].revents & POLLIN) {
      int c = accept4(srv.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
    for (size_t i = 2; i < fds.size();) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!serve_one(srv, fds[i].fd)) {
          fds.erase(fds.begin() + static_cast<long>(i));
          continue;
        }
      }
      ++i;
    }
  }
}

std::mutex g_server_mu;
pid_t g_server_pid = 0;
// The agent's stop eventfd and flag (made once; never freed: its thread may outlive exit),
// and the process whose agent stopped for good (it handed its slot over as it ends).
int g_server_stop_fd = -1;
std::atomic<bool>* g_server_stopped = nullptr;
pid_t g_server_stopped_in = 0;
// Slots of processes that ended which this process serves (adopted XRC TGT QPs): each
// has a thread like the agent's on that slot's address.
struct AdoptedServer {
  int stop_fd;
  std::atomic<bool>* stopped;
  std::atomic<bool>* release;
};
std::map<int, AdoptedServer>* g_adopted_servers = new std::map<int, AdoptedServer>;
pid_t g_delivery_pid = 0;
ShmHooks g_shm_hooks;  // start_agent's, for the delivery thread too

// ---- client side -------------------------------------------------------------------------

struct Connection {
  std::mutex mu;
  int fd = -1;
  CopyMode mode = kCrossMemory;
  bool delivery = false;  // to the XRC delivery thread's address
};

}  // namespace

bool cross_memory_disabled() {
  static const bool disabled = [] {
    const char* v = getenv("SOFTVERBS_NO_CMA");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return disabled;
}

namespace {

// Asks the agent whether it can read our memory; says once per process when it cannot.
// False when it did not answer within `wait_ms` (or hung up): the connection is out of step
// then (a late answer would be taken for the next one's), so the caller drops it.
bool probe_copy_mode(int fd, int wait_ms, CopyMode* mode) {
  *mode = kThroughSocket;
  if (cross_memory_disabled()) return true;
  static const uint64_t probe_word = 0x5356434d41ull;  // "SVCMA"
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kProbe;
  m.niov = 1;
  m.iov[0] = {reinterpret_cast<uint64_t>(&probe_word), sizeof(probe_word)};
  m.compare_add = probe_word;
  WireReply r{};
  if (!send_message(fd, &m, sizeof(m), wait_ms) || wait_readable(fd, wait_ms) <= 0 ||
      recv(fd, &r, sizeof(r), 0) != sizeof(r))
    return false;
  if (r.magic != kMagic || r.kind != Reply::Ack) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr,
                   "softverbs: cross-memory attach between processes is refused here; "
                   "copying payload through sockets instead (slower)\n");
    });
    return true;
  }
  *mode = kCrossMemory;
  return true;
}

std::mutex g_conn_mu;
pid_t g_conn_pid = 0;
std::map<int, std::shared_ptr<Connection>>* g_conns = new std::map<int, std::shared_ptr<Connection>>;

std::shared_ptr<Connection> connection(int slot, bool delivery = false) {
  std::lock_guard<std::mutex> lock(g_conn_mu);
  if (g_conn_pid != self_pid()) {  // a forked child must not share its parent's sockets
    g_conns->clear();
    g_conn_pid = self_pid();
  }
  auto& c = (*g_conns)[delivery ? slot + kSlots : slot];
  if (!c) {
    c = std::make_shared<Connection>();
    c->delivery = delivery;
  }
  return c;
}

// Under c.mu: connects if needed. Returns false if the agent is not there, or did not
// answer the probe within `wait_ms`.
bool ensure_connected(Connection& c, int slot, int wait_ms) {
  if (c.fd >= 0) return true;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  socklen_t len;
  sockaddr_un addr = make_address(slot, &len, c.delivery);
  CopyMode mode;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      !probe_copy_mode(fd, wait_ms, &mode)) {
    const int err = errno;  // ECONNREFUSED: nobody serves the address (xrc_call)
    close(fd);
    errno = err;
    return false;
  }
  c.fd = fd;
  c.mode = mode;
  return true;
}

void drop(Connection& c) {
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
}

// Under c.mu: connects if needed and sends m (its copy_mode set for the connection), waiting
// at most `wait_ms` for room. A socket kept from an earlier process in this slot (it
// exited, a new one took the slot) fails with EPIPE on the first send: then we connect
// afresh, once.
bool send_request(Connection& c, int slot, WireRequest& m, int wait_ms) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!ensure_connected(c, slot, wait_ms > 0 ? wait_ms : kReplyTimeoutMs)) return false;
    m.copy_mode = c.mode;
    if (send_message(c.fd, &m, sizeof(m), wait_ms)) return true;
    bool stale = errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN;
    drop(c);
    if (!stale) return false;
  }
  return false;
}

WireRequest encode(const Request& req, uint32_t kind) {
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kind;
  m.src_qpn = req.src_qpn;
  m.dst_qpn = req.dst_qpn;
  m.type = req.type;
  m.opcode = req.opcode;
  m.flags = req.flags;
  m.imm = req.imm;
  m.rkey = req.rkey;
  m.qkey = req.qkey;
  m.xrc_srqn = req.xrc_srqn;
  m.remote_addr = req.remote_addr;
  m.compare_add = req.compare_add;
  m.swap = req.swap;
  m.length = req.length;
  std::memcpy(m.sgid, req.sgid.raw, 16);
  std::memcpy(m.dgid, req.dgid.raw, 16);
  m.niov = static_cast<uint32_t>(std::min(req.nlocal, kMaxWireIov));
  for (uint32_t i = 0; i < m.niov; ++i)
    m.iov[i] = {reinterpret_cast<uint64_t>(req.local[i].iov_base), req.local[i].iov_len};
  return m;
}

}  // namespace

void start_agent(const ShmHooks& shm) {
  std::lock_guard<std::mutex> lock(g_server_mu);
  if (g_server_pid == getpid() || g_server_stopped_in == getpid()) return;
  g_server_pid = getpid();
  g_shm_hooks = shm;
  int slot = my_slot();
  if (slot == 0) return;  // no registry: this process is reachable only from itself
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  socklen_t len;
  sockaddr_un addr = make_address(slot, &len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return;
  }
  g_server_stop_fd = eventfd(0, EFD_CLOEXEC);
  g_server_stopped = new std::atomic<bool>(false);
  std::thread(serve, Server{engine_hooks(), shm, fd, false, g_server_stop_fd, g_server_stopped})
      .detach();
}

namespace {

// Waits (at most the agent's reply deadline and a second) until `stopped`.
bool wait_stopped(std::atomic<bool>* stopped) {
  const timespec pause{0, 1000000};
  for (int ms = 0; ms < kReplyTimeoutMs + 1000; ++ms) {
    if (stopped->load()) return true;
    nanosleep(&pause, nullptr);
  }
  return stopped->load();
}

}  // namespace

bool stop_agent() {
  {
    std::lock_guard<std::mutex> lock(g_server_mu);
    if (g_server_pid != getpid() || g_server_stop_fd < 0) return false;
    const uint64_t one = 1;
    if (write(g_server_stop_fd, &one, sizeof(one)) != sizeof(one)) return false;
    g_server_pid = 0;
    g_server_stopped_in = getpid();  // not started again: the address is the adopter's
  }
  // (Not under the lock: the thread may be serving a request that needs it.)
  return wait_stopped(g_server_stopped);
}

bool serve_adopted_slot(int slot) {
  std::lock_guard<std::mutex> lock(g_server_mu);
  if (slot <= 0 || slot >= kSlots || g_adopted_servers->count(slot)) return true;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  socklen_t len;
  sockaddr_un addr = make_address(slot, &len);
  int stop = eventfd(0, EFD_CLOEXEC);
  if (stop < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    if (stop >= 0) close(stop);
    close(fd);
    return false;
  }
  auto* stopped = new std::atomic<bool>(false);
  auto* release = new std::atomic<bool>(false);
  (*g_adopted_servers)[slot] = {stop, stopped, release};
  std::thread(serve, Server{engine_hooks(), g_shm_hooks, fd, false, stop, stopped, slot, release})
      .detach();
  return true;
}

void stop_serving_slot(int slot, bool wait, bool release) {
  std::atomic<bool>* stopped;
  {
    std::lock_guard<std::mutex> lock(g_server_mu);
    auto it = g_adopted_servers->find(slot);
    if (it == g_adopted_servers->end()) return;
    it->second.release->store(release);
    const uint64_t one = 1;
    (void)!write(it->second.stop_fd, &one, sizeof(one));
    stopped = it->second.stopped;
    g_adopted_servers->erase(it);
  }
  // (Not waited for when the last QP's destroy asks: that may run on the thread itself.)
  if (wait) wait_stopped(stopped);
}

namespace {

// Sends an executing request `m` (its payload from req.local) on `c` and takes the answer
// (READ data into req.local); *value gets the reply's value. False when the peer could
// not be reached or hung up (out->kind NoResponse either way when there is no answer).
bool execute_call(Connection* c, int slot, WireRequest& m, const Request& req, Reply* out,
                  uint64_t* value) {
  *out = {Reply::NoResponse};
  if (!send_request(*c, slot, m, kReplyTimeoutMs)) return false;
  if (c->mode == kThroughSocket && carries_payload(m.opcode) &&
      !send_chunks(c->fd, req.local, req.nlocal, req.length, kReplyTimeoutMs)) {
    drop(*c);
    return false;
  }
  WireReply r{};
  int ready = wait_readable(c->fd, kReplyTimeoutMs);
  ssize_t got = ready > 0 ? recv(c->fd, &r, sizeof(r), 0) : -1;
  if (got != static_cast<ssize_t>(sizeof(r)) || r.magic != kMagic || r.kind > Reply::Error) {
    drop(*c);  // the stream is out of step now: start afresh next time
    return ready == 0;  // a peer slow to answer is there; one that hung up is not
  }
  out->kind = static_cast<Reply::Kind>(r.kind);
  out->status = static_cast<ibv_wc_status>(r.status);
  out->rnr_timer = static_cast<uint8_t>(r.rnr_timer & 31);
  out->byte_len = r.byte_len;
  *value = r.value;
  if (out->kind == Reply::Error && out->status == IBV_WC_SUCCESS) out->status = IBV_WC_GENERAL_ERR;
  uint64_t back = returned_length(m.opcode, m.length);
  if (c->mode == kThroughSocket && out->kind == Reply::Ack && back &&
      !recv_chunks(c->fd, req.local, req.nlocal, back, kReplyTimeoutMs)) {
    drop(*c);
    *out = {Reply::NoResponse};
  }
  return true;
}

}  // namespace

Reply agent_call(int slot, const Request& req) {
  std::shared_ptr<Connection> c = connection(slot);
  std::lock_guard<std::mutex> lock(c->mu);
  WireRequest m = encode(req, kExecute);
  Reply out;
  uint64_t value = 0;
  execute_call(c.get(), slot, m, req, &out, &value);
  return out;
}

bool agent_xrc_deliver(int slot, const Request& req, const XrcTarget& tgt, Reply* out,
                       int* tgt_error) {
  *tgt_error = kXrcTgtFine;
  std::shared_ptr<Connection> c = connection(slot, true);
  std::lock_guard<std::mutex> lock(c->mu);
  WireRequest m = encode(req, kXrcDeliver);
  m.dst_qpn = tgt.tgt_qpn;
  m.xrc_access = tgt.access;
  m.qkey = tgt.min_rnr_timer | (uint32_t{tgt.max_dest_rd_atomic} << 8);
  m.xrc_dev = tgt.dev;
  m.xrc_ino = tgt.ino;
  uint64_t value = static_cast<uint64_t>(static_cast<int64_t>(kXrcTgtFine));
  if (!execute_call(c.get(), slot, m, req, out, &value)) return false;
  // What the QP must do comes from another process: only ERR, with an event of its kind.
  const auto e = static_cast<int64_t>(value);
  if (out->kind == Reply::Error && (e == -1 || e == IBV_EVENT_QP_REQ_ERR || e == IBV_EVENT_QP_ACCESS_ERR))
    *tgt_error = static_cast<int>(e);
  return true;
}

// Sends a message that gets no answer; a full or broken connection drops it (the peer's
// state, not ours, decides what happens next).
static void send_oneway(int slot, WireRequest m) {
  std::shared_ptr<Connection> c = connection(slot);
  std::lock_guard<std::mutex> lock(c->mu);
  (void)send_request(*c, slot, m, 0);
}

void agent_kick(int slot, uint32_t qpn) {
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kKick;
  m.dst_qpn = qpn;
  send_oneway(slot, m);
}

uint64_t agent_open_window(int slot, uint32_t src_qpn, uint32_t dst_qpn, PeerArena* arena,
                           int* wake_fd, int wait_ms) {
  *wake_fd = -1;
  if (wait_ms <= 0) wait_ms = kReplyTimeoutMs;
  std::shared_ptr<Connection> c = connection(slot);
  std::lock_guard<std::mutex> lock(c->mu);
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kOpenWindow;
  m.src_qpn = src_qpn;
  m.dst_qpn = dst_qpn;
  if (!send_request(*c, slot, m, wait_ms)) return 0;
  WireReply r{};
  int fds[kMaxFds] = {-1, -1, -1, -1};
  auto close_fds = [&fds] {
    for (int f : fds)
      if (f >= 0) close(f);
  };
  if (wait_readable(c->fd, wait_ms) <= 0 || !recv_with_fds(c->fd, &r, fds) ||
      r.magic != kMagic) {
    close_fds();
    drop(*c);
    return 0;
  }
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (r.kind != Reply::Ack || fds[0] < 0 ||
      getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    close_fds();
    return 0;
  }
  *arena = map_peer_arena(slot, cred.pid, fds[0], fds[1], fds[3]);
  *wake_fd = fds[2];
  return arena->base ? r.value : 0;
}

void start_xrc_delivery() {
  std::lock_guard<std::mutex> lock(g_server_mu);
  if (g_delivery_pid == getpid() || g_server_pid != getpid()) return;
  g_delivery_pid = getpid();
  int slot = my_slot();
  if (slot == 0) return;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  socklen_t len;
  sockaddr_un addr = make_address(slot, &len, true);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return;
  }
  std::thread(serve, Server{engine_hooks(), g_shm_hooks, fd, true}).detach();
}

void set_xrc_hooks(const XrcHooks& hooks) {
  static XrcHooks installed;  // set once, before any opener can ask
  if (g_xrc_hooks.load(std::memory_order_acquire)) return;
  installed = hooks;
  g_xrc_hooks.store(&installed, std::memory_order_release);
}

namespace {

// One XRC request to the agent of `slot` and its status: 0 or an errno value (ENXIO: no answer).
int xrc_call(int slot, WireRequest& m) {
  std::shared_ptr<Connection> c = connection(slot);
  std::lock_guard<std::mutex> lock(c->mu);
  m.magic = kMagic;
  m.src_qpn = static_cast<uint32_t>(my_slot());
  // A slot whose live process refuses connections is being handed over as that process
  // ends (verbs/xrc.cpp): its adopter takes the address within moments. Only a refusal is
  // waited out, for a second at most; a peer that does not answer is not.
  const bool may_wait = m.kind < kXrcAdopt || m.kind == kXrcRejoin;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!send_request(*c, slot, m, kReplyTimeoutMs)) {
    const bool refused = errno == ECONNREFUSED;
    const pid_t owner = slot_owner(slot);
    if (!may_wait || !refused || std::chrono::steady_clock::now() >= give_up || owner <= 0 ||
        (kill(owner, 0) != 0 && errno == ESRCH))
      return ENXIO;
    const timespec pause{0, 2000000};
    nanosleep(&pause, nullptr);
  }
  WireReply r{};
  int ready = wait_readable(c->fd, kReplyTimeoutMs);
  if (ready <= 0 || recv(c->fd, &r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r)) ||
      r.magic != kMagic || r.kind != Reply::Ack) {
    drop(*c);
    return ENXIO;
  }
  return static_cast<int>(r.status);
}

}  // namespace

int agent_xrc(int slot, XrcOp op, uint32_t qpn, uint64_t dev, uint64_t ino, ibv_qp_attr* attr,
              int mask) {
  WireRequest m{};
  m.kind = static_cast<uint32_t>(op);
  m.dst_qpn = qpn;
  m.flags = static_cast<uint32_t>(mask);
  m.compare_add = dev;
  m.swap = ino;
  m.remote_addr = reinterpret_cast<uint64_t>(attr);
  return xrc_call(slot, m);
}

int agent_xrc_adopt(int slot, const XrcSnapshot* snap) {
  WireRequest m{};
  m.kind = kXrcAdopt;
  m.dst_qpn = snap->qpn;
  m.remote_addr = reinterpret_cast<uint64_t>(snap);
  return xrc_call(slot, m);
}

int agent_xrc_rejoin(int slot, uint32_t qpn, uint64_t dev, uint64_t ino, int handles) {
  WireRequest m{};
  m.kind = kXrcRejoin;
  m.dst_qpn = qpn;
  m.compare_add = dev;
  m.swap = ino;
  m.flags = static_cast<uint32_t>(handles);
  return xrc_call(slot, m);
}

int agent_xrc_commit(int slot, int adopted_slot, bool abort) {
  WireRequest m{};
  m.kind = abort ? kXrcAbort : kXrcCommit;
  m.flags = static_cast<uint32_t>(adopted_slot);
  return xrc_call(slot, m);
}

void set_import_hooks(const ImportHooks& hooks) {
  static ImportHooks installed;  // set once, before any importer can ask
  if (g_import_hooks.load(std::memory_order_acquire)) return;
  installed = hooks;
  g_import_hooks.store(&installed, std::memory_order_release);
}

int agent_import(int slot, ImportOp op, uint64_t dev, uint64_t ino, uint32_t handle,
                 uint64_t* value, PeerArena* arena) {
  std::shared_ptr<Connection> c = connection(slot);
  std::lock_guard<std::mutex> lock(c->mu);
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kImport;
  m.flags = static_cast<uint32_t>(op);
  m.rkey = handle;
  m.compare_add = dev;
  m.swap = ino;
  if (!send_request(*c, slot, m, kReplyTimeoutMs)) return ENXIO;
  WireReply r{};
  int fds[kMaxFds] = {-1, -1, -1, -1};
  auto close_fds = [&fds] {
    for (int f : fds)
      if (f >= 0) close(f);
  };
  int ready = wait_readable(c->fd, kReplyTimeoutMs);
  if (ready <= 0 || !recv_with_fds(c->fd, &r, fds) || r.magic != kMagic || r.kind != Reply::Ack) {
    close_fds();
    drop(*c);
    return ENXIO;
  }
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (r.status != 0 || op != ImportOp::Mr) {
    close_fds();
    *value = r.value;
    return r.status > 0 && r.status < 4096 ? static_cast<int>(r.status) : 0;
  }
  // The process whose memory we map is the one the kernel names as the agent's.
  if (fds[0] < 0 || fds[1] < 0 || fds[3] < 0 ||
      getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.pid != slot_owner(slot)) {
    close_fds();
    return EPROTO;
  }
  if (fds[2] >= 0) close(fds[2]);
  *arena = map_peer_arena(slot, cred.pid, fds[0], fds[1], fds[3]);
  *value = r.value;
  return arena->base && arena->published && arena->mr ? 0 : EPROTO;
}

void agent_xrc_event(int slot, uint32_t qpn, int type) {
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kXrcEvent;
  m.src_qpn = static_cast<uint32_t>(slot_of_qpn(qpn));  // whoever hosts it now (adopted)
  m.dst_qpn = qpn;
  m.imm = static_cast<uint32_t>(type);
  send_oneway(slot, m);
}

void agent_drain(int slot, uint32_t dst_qpn) {
  WireRequest m{};
  m.magic = kMagic;
  m.kind = kDrain;
  m.dst_qpn = dst_qpn;
  send_oneway(slot, m);
}

}  // namespace softverbs::wire
