// How a work request reaches its target QP. The engine asks the transport for the QP
// named by (GID, QPN) and for a way to move bytes into/out of it. Today: `loop`, every QP
// lives in this process. Later `shm` (other processes of this host) and `net` (other hosts)
// implement the same interface.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <cstdint>
#include <utility>

namespace softverbs {
struct Qp;
}

namespace softverbs::wire {

// Pins a QP against destruction while a peer or the progress thread works on it.
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

class Transport {
 public:
  virtual ~Transport() = default;
  // A QP number unique on this host (24 bits, never 0, 1 or 0xffffff).
  virtual uint32_t allocate_qpn() = 0;
  virtual void register_qp(Qp* qp) = 0;
  // After this returns no lookup can find the QP and no pinned reference remains.
  virtual void unregister_qp(Qp* qp) = 0;
  // The QP named by (gid, qpn), or an empty ref if none is reachable.
  virtual QpRef find_qp(const ibv_gid& gid, uint32_t qpn) = 0;
  // A QP of this process by number (for timers and deferred work).
  virtual QpRef find_local(uint32_t qpn) = 0;
  // Copies `len` bytes between scatter lists that the engine has already validated.
  virtual void copy(const iovec* dst, int ndst, const iovec* src, int nsrc, size_t len) = 0;
};

Transport& transport();

}  // namespace softverbs::wire
