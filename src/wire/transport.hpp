// How a work request reaches its target QP: a path per connection, chosen by the router
// from the destination GID and QPN (wire/router.hpp):
//  - loop: a QP of this process, whose responder runs directly;
//  - shm: a QP of another process of this host (wire/shm/): its receive window, its shared
//    MR pages, or its agent, a thread that runs the responder on the target's objects;
//  - roce: a QP on another host, in RoCE v2 packets (wire/roce/);
//  - multicast: a UD send to a group, one copy per member.
// A transport answers what a NIC would see: ACK, RNR NAK, NAK with an error, or nothing.
// Unit tests can put a fake transport in place of any of them (set_transport).
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>

#include "wire/router.hpp"

namespace softverbs {
struct Qp;
}

namespace softverbs::wire {

// What any transport carries at most: the device's limits (verbs/device.hpp) are these.
inline constexpr uint32_t kMaxMsgSize = 1u << 31;
inline constexpr int kMaxSge = 32;

// One operation as it travels to the responder. `local` is the requester's gather list
// (SEND/WRITE payload) or scatter list (READ data, atomic result), in process `pid`.
struct Request {
  uint32_t src_qpn = 0;
  uint32_t dst_qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  uint32_t imm = 0;  // network order; SEND_WITH_INV: the R_Key to invalidate (host order)
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t qkey = 0;  // UD: the effective Q_Key
  uint32_t xrc_srqn = 0;  // XRC (type IBV_QPT_XRC_SEND): the XRC SRQ it lands in (XRCETH)
  // Atomics' operands; ATOMIC_WRITE: compare_add is the 8 bytes; FLUSH: compare_add the
  // placement type, swap the selectivity level, length the range (common/verbs_ext.hpp).
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint64_t length = 0;
  ibv_gid sgid{};
  ibv_gid dgid{};
  const iovec* local = nullptr;
  int nlocal = 0;
  pid_t pid = 0;
  bool skip_self = false;  // multicast: not to the sender's own QP (BLOCK_SELF_MCAST_LB)
  uint32_t flow_tag = 0;   // a raw frame: its steering rule's IBV_FLOW_SPEC_ACTION_TAG
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
  // Takes over one reference the caller already counted in *users.
  QpRef(Qp* qp, std::atomic<int>* users) : qp_(qp), users_(users) {}
  QpRef(QpRef&& o) noexcept
      : qp_(std::exchange(o.qp_, nullptr)), users_(std::exchange(o.users_, nullptr)) {}
  QpRef& operator=(QpRef&& o) noexcept {
    if (this != &o) {
      reset();
      qp_ = std::exchange(o.qp_, nullptr);
      users_ = std::exchange(o.users_, nullptr);
    }
    return *this;
  }
  QpRef(const QpRef&) = delete;
  QpRef& operator=(const QpRef&) = delete;
  ~QpRef() { reset(); }
  Qp* get() const { return qp_; }
  Qp* operator->() const { return qp_; }
  explicit operator bool() const { return qp_ != nullptr; }
  void reset() {
    if (!qp_) return;
    if (users_->fetch_sub(1, std::memory_order_acq_rel) == 1) users_->notify_all();
    qp_ = nullptr;
    users_ = nullptr;
  }

 private:
  Qp* qp_ = nullptr;
  std::atomic<int>* users_ = nullptr;
};

// XRC: a message that arrived on a TGT QP of another process and names an XRC SRQ of
// this one. What that process tells of its TGT QP (the domain by its file's inode).
struct XrcTarget {
  uint32_t tgt_qpn = 0;
  unsigned access = 0;  // the TGT QP's qp_access_flags
  uint8_t min_rnr_timer = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint64_t dev = 0, ino = 0;
};
// What the TGT QP's process must do to its QP after such a message: nothing, or ERR with
// `event` (-1: none).
inline constexpr int kXrcTgtFine = -2;

// What the engine does for the transports, on QPs of this process.
struct EngineHooks {
  // The responder: runs `req` on the local QP `target`.
  Reply (*respond)(const Request& req, Qp* target) = nullptr;
  // The responder for a message another process's TGT QP took: runs `req` on our XRC SRQ
  // req.xrc_srqn (its memory, its CQ); *tgt_error says what the TGT QP must do.
  Reply (*respond_xrc)(const Request& req, const XrcTarget& tgt, int* tgt_error) = nullptr;
  // Retries a local QP's send queue soon (RNR waiters).
  void (*kick)(Qp* qp) = nullptr;
};
void set_engine(const EngineHooks& hooks);
const EngineHooks& engine_hooks();

// The QPs of this process, by number (every transport looks its targets up here).
// A QP number unique on this host (24 bits, never 0, 1 or 0xffffff); its high bits are
// this process's registry slot (wire/registry.hpp).
uint32_t allocate_qpn();
// `users` counts pinned references (QpRef); unregister waits until none is left.
void register_qp(uint32_t qpn, Qp* qp, std::atomic<int>* users);
// After this returns no lookup can find the QP and no pinned reference remains.
void unregister_qp(uint32_t qpn);
QpRef find_local(uint32_t qpn);

// One kind of path to a QP.
class Transport {
 public:
  virtual ~Transport() = default;
  // Runs `req` on the QP named by (dgid, req.dst_qpn).
  virtual Reply deliver(const ibv_gid& dgid, const Request& req) = 0;
  // Retries the send queue of QP `qpn` soon (it waits for a receive we just posted).
  virtual void kick(uint32_t qpn) = 0;
};
// The transport of a route (Multicast: none, deliver() fans out). nullptr for a route with
// no transport in this build (then every request on it goes unanswered, as to a host that
// does not exist).
Transport* transport(Route route);
// Puts `t` in place of the route's own transport (nullptr: back to it). For unit tests.
void set_transport(Route route, Transport* t);

// Runs `req` on the QP at (dgid, req.dst_qpn) along `route`.
Reply deliver(Route route, const ibv_gid& dgid, const Request& req);
// Retries QP `qpn`'s send queue soon, wherever on this host it lives (RNR waiters).
void kick(uint32_t qpn);

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
