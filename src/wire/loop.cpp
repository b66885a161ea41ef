// The loop transport: every QP is in this process; bytes move with memcpy.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "verbs/device.hpp"
#include "verbs/objects.hpp"
#include "wire/transport.hpp"

namespace softverbs::wire {

void QpRef::reset() {
  if (!qp_) return;
  if (qp_->users.fetch_sub(1, std::memory_order_acq_rel) == 1) qp_->users.notify_all();
  qp_ = nullptr;
}

namespace {

class LoopTransport final : public Transport {
 public:
  uint32_t allocate_qpn() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (;;) {
      next_qpn_ = (next_qpn_ + 1) & 0xffffff;
      if (next_qpn_ < 2 || next_qpn_ == 0xffffff) continue;
      if (!qps_.count(next_qpn_)) return next_qpn_;
    }
  }

  void register_qp(Qp* qp) override {
    std::lock_guard<std::mutex> lock(mu_);
    qps_[qp->qpn()] = qp;
  }

  void unregister_qp(Qp* qp) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      qps_.erase(qp->qpn());
    }
    for (int n = qp->users.load(std::memory_order_acquire); n != 0;
         n = qp->users.load(std::memory_order_acquire))
      qp->users.wait(n, std::memory_order_acquire);
  }

  QpRef find_qp(const ibv_gid& gid, uint32_t qpn) override {
    if (!Device::instance().is_local_gid(gid)) return QpRef();
    return find_local(qpn);
  }

  QpRef find_local(uint32_t qpn) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return QpRef();
    it->second->users.fetch_add(1, std::memory_order_acq_rel);
    return QpRef(it->second);
  }

  void copy(const iovec* dst, int ndst, const iovec* src, int nsrc, size_t len) override {
    int di = 0, si = 0;
    size_t doff = 0, soff = 0;
    while (len > 0 && di < ndst && si < nsrc) {
      size_t n = std::min({len, dst[di].iov_len - doff, src[si].iov_len - soff});
      std::memmove(static_cast<char*>(dst[di].iov_base) + doff,
                   static_cast<const char*>(src[si].iov_base) + soff, n);
      len -= n;
      doff += n;
      soff += n;
      if (doff == dst[di].iov_len) ++di, doff = 0;
      if (soff == src[si].iov_len) ++si, soff = 0;
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint32_t, Qp*> qps_;
  uint32_t next_qpn_ = 0x10;
};

}  // namespace

Transport& transport() {
  static LoopTransport loop;
  return loop;
}

}  // namespace softverbs::wire
