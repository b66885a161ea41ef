// The transport of this host: QPs of this process are reached directly (loop), QPs of
// other processes through their agent. The QPN says which: its high bits are the owner's
// registry slot.
#include <unistd.h>

#include <mutex>
#include <unordered_map>

#include "verbs/device.hpp"
#include "verbs/objects.hpp"
#include "wire/agent.hpp"
#include "wire/mcast.hpp"
#include "wire/registry.hpp"
#include "wire/transport.hpp"

namespace softverbs::wire {

void QpRef::reset() {
  if (!qp_) return;
  if (qp_->users.fetch_sub(1, std::memory_order_acq_rel) == 1) qp_->users.notify_all();
  qp_ = nullptr;
}

namespace {

class HostTransport final : public Transport {
 public:
  void set_engine(const EngineHooks& hooks) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hooks_ = hooks;
    }
    start_agent(hooks);
  }

  uint32_t allocate_qpn() override {
    uint32_t base = static_cast<uint32_t>(my_slot()) << kQpnSlotShift;
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t tries = 0; tries <= kQpnIndexMask; ++tries) {
      next_index_ = (next_index_ + 1) & kQpnIndexMask;
      uint32_t qpn = base | next_index_;
      if (qpn < 2 || qpn >= 0xffffff || qps_.count(qpn)) continue;
      return qpn;
    }
    return 0;  // all numbers of this process in use
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

  QpRef find_local(uint32_t qpn) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return QpRef();
    it->second->users.fetch_add(1, std::memory_order_acq_rel);
    return QpRef(it->second);
  }

  Reply deliver(const ibv_gid& dgid, const Request& req) override {
    if (req.type == IBV_QPT_UD && is_multicast_gid(dgid)) return deliver_to_group(dgid, req);
    if (!Device::instance().is_local_gid(dgid)) return {Reply::NoResponse};  // other hosts: later
    return deliver_to(req);
  }

  void kick(uint32_t qpn) override {
    int slot = slot_of_qpn(qpn);
    if (slot == my_slot()) {
      if (QpRef qp = find_local(qpn); qp && hooks_.kick) hooks_.kick(qp.get());
      return;
    }
    agent_kick(slot, qpn);
  }

 private:
  Reply deliver_to(const Request& req) {
    int slot = slot_of_qpn(req.dst_qpn);
    if (slot == my_slot()) {
      QpRef target = find_local(req.dst_qpn);
      if (!target || !hooks_.respond) return {Reply::NoResponse};
      return hooks_.respond(req, target.get());
    }
    return agent_call(slot, req);
  }

  // A UD send to a multicast GID: a copy for every QP attached to the group now, the
  // sender's own included unless it was created with BLOCK_SELF_MCAST_LB. As on a fabric,
  // a member without a receive posted just misses it; the sender sees no difference.
  Reply deliver_to_group(const ibv_gid& dgid, const Request& req) {
    bool skip_self = false;
    if (QpRef self = find_local(req.src_qpn)) skip_self = self->block_self_mcast;
    for (uint32_t qpn : mcast_members(dgid)) {
      if (qpn == req.src_qpn && skip_self) continue;
      Request copy = req;
      copy.dst_qpn = qpn;
      deliver_to(copy);
    }
    return {Reply::Ack};
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint32_t, Qp*> qps_;
  uint32_t next_index_ = 0;
  EngineHooks hooks_;
};

}  // namespace

Transport& transport() {
  static HostTransport* host = new HostTransport;  // outlives static destructors
  return *host;
}

}  // namespace softverbs::wire
