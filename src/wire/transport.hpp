// How a work request reaches its target QP.
//
// The requester (engine) hands the transport a Request naming the target by (GID, QPN);
// the transport finds where that QP lives and has the responder run there:
//  - in this process: directly (the `loop` part, local_qps below);
//  - in another process of this host: through that process's agent (agent.cpp), a thread
//    that sleeps on a socket and runs the responder on its own objects, pulling and
//    pushing payload straight from/to the requester's buffers with cross-memory attach;
//  - later, other hosts (`net`).
// The answer is what a NIC would see: ACK, RNR NAK, NAK with an error, or nothing.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

namespace softverbs {
struct Qp;
}

namespace softverbs::wire {

// One operation as it travels to the responder. `local` is the requester's gather list
// (SEND/WRITE payload) or scatter list (READ data, atomic result), in process `pid`.
struct Request {
  uint32_t src_qpn = 0;
  uint32_t dst_qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  uint32_t imm = 0;  // network order
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t qkey = 0;  // UD: the effective Q_Key
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint64_t length = 0;
  ibv_gid sgid{};
  ibv_gid dgid{};
  const iovec* local = nullptr;
  int nlocal = 0;
  pid_t pid = 0;
};

struct Reply {
  enum Kind : uint32_t { Ack, RnrNak, NoResponse, Error } kind = Ack;
  ibv_wc_status status = IBV_WC_SUCCESS;  // Error: the requester's completion status
  uint8_t rnr_timer = 0;                  // RnrNak: the responder's min_rnr_timer
  uint32_t byte_len = 0;
};

// Pins a local QP against destruction while a peer or the progress thread works on it.
class QpRef {
 public:
  QpRef() = default;
  explicit QpRef(Qp* qp) : qp_(qp) {}
  QpRef(QpRef&& o) noexcept : qp_(std::exchange(o.qp_, nullptr)) {}
  QpRef& operator=(QpRef&& o) noexcept {
    if (this != &o) {
      reset();
      qp_ = std::exchange(o.qp_, nullptr);
    }
    return *this;
  }
  QpRef(const QpRef&) = delete;
  QpRef& operator=(const QpRef&) = delete;
  ~QpRef() { reset(); }
  Qp* get() const { return qp_; }
  Qp* operator->() const { return qp_; }
  explicit operator bool() const { return qp_ != nullptr; }
  void reset();

 private:
  Qp* qp_ = nullptr;
};

// What the engine does for the transport, on QPs of this process.
struct EngineHooks {
  // The responder: runs `req` on the local QP `target`.
  Reply (*respond)(const Request& req, Qp* target) = nullptr;
  // Retries a local QP's send queue soon (RNR waiters).
  void (*kick)(Qp* qp) = nullptr;
  // Opens the receive window of `target` for the peer QP `peer_qpn` in process `peer_pid`
  // (as the kernel names the process that asked): its arena offset, or 0.
  uint64_t (*open_window)(Qp* target, uint32_t peer_qpn, pid_t peer_pid) = nullptr;
  // Turns what a peer left in `target`'s receive window into completions now (the peer
  // saw the receive CQ armed: a blocked ibv_get_cq_event must hear of them).
  void (*drain)(Qp* target) = nullptr;
  // The fd that wakes `target`'s receive CQ's completion channel, or -1 (no channel).
  int (*wake_fd)(Qp* target) = nullptr;
  // Holds completions back while on (this thread), adds them when turned off.
  void (*defer_completions)(bool on) = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void set_engine(const EngineHooks& hooks) = 0;
  // A QP number unique on this host (24 bits, never 0, 1 or 0xffffff).
  virtual uint32_t allocate_qpn() = 0;
  virtual void register_qp(Qp* qp) = 0;
  // After this returns no lookup can find the QP and no pinned reference remains.
  virtual void unregister_qp(Qp* qp) = 0;
  // A QP of this process by number.
  virtual QpRef find_local(uint32_t qpn) = 0;
  // Runs `req` on the QP named by (dgid, req.dst_qpn), wherever it lives on this host.
  virtual Reply deliver(const ibv_gid& dgid, const Request& req) = 0;
  // Retries the send queue of QP `qpn` (local or in another process) soon.
  virtual void kick(uint32_t qpn) = 0;
};

Transport& transport();

// Payload movement between the requester's buffers (req.local in req.pid) and buffers of
// this process. Returns false if the requester's memory cannot be reached (it died).
bool copy_from_requester(const Request& req, const iovec* dst, int ndst, uint64_t len);
bool copy_to_requester(const Request& req, const iovec* src, int nsrc, uint64_t len);
// memcpy between two scatter lists of this process.
void copy_scattered(const iovec* dst, int ndst, const iovec* src, int nsrc, uint64_t len);
inline void copy_local(const iovec* dst, int ndst, const iovec* src, int nsrc, uint64_t len) {
  // One buffer each side (nearly every message): no loop, no call.
  if (ndst == 1 && nsrc == 1) {
    std::memmove(dst->iov_base, src->iov_base, std::min<uint64_t>({len, dst->iov_len, src->iov_len}));
    return;
  }
  copy_scattered(dst, ndst, src, nsrc, len);
}

}  // namespace softverbs::wire
