// The QP directory of this process and the dispatch of requests to the transport of their
// route. The loop transport (QPs of this process) lives here; shm is in wire/shm/.
#include "wire/transport.hpp"

#include <mutex>
#include <unordered_map>

#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/shm/mcast.hpp"

namespace softverbs::wire {

namespace {

struct Entry {
  Qp* qp;
  std::atomic<int>* users;
};

struct Directory {
  std::mutex mu;
  std::unordered_map<uint32_t, Entry> qps;
  uint32_t next_index = 0;
  EngineHooks hooks;
  Transport* replaced[kRoutes] = {};
};

Directory& dir() {
  static Directory* d = new Directory;  // outlives static destructors (agent thread)
  return *d;
}

// A QP of this process: its responder runs right here, on the caller's thread.
class LoopTransport final : public Transport {
 public:
  Reply deliver(const ibv_gid&, const Request& req) override {
    QpRef target = find_local(req.dst_qpn);
    const EngineHooks& h = engine_hooks();
    if (!target || !h.respond) return {Reply::NoResponse};
    return h.respond(req, target.get());
  }
  void kick(uint32_t qpn) override {
    const EngineHooks& h = engine_hooks();
    if (QpRef qp = find_local(qpn); qp && h.kick) h.kick(qp.get());
  }
};

// A QP of another process of this host: through its agent.
class ShmTransport final : public Transport {
 public:
  Reply deliver(const ibv_gid&, const Request& req) override {
    return agent_call(slot_of_qpn(req.dst_qpn), req);
  }
  void kick(uint32_t qpn) override { agent_kick(slot_of_qpn(qpn), qpn); }
};

LoopTransport g_loop;
ShmTransport g_shm;

// A UD send to a multicast GID: a copy for every QP attached to the group now, the
// sender's own included unless it asked not to (BLOCK_SELF_MCAST_LB). As on a fabric, a
// member without a receive posted just misses it; the sender sees no difference.
Reply deliver_to_group(const ibv_gid& dgid, const Request& req) {
  for (uint32_t qpn : mcast_members(dgid)) {
    if (qpn == req.src_qpn && req.skip_self) continue;
    Request copy = req;
    copy.dst_qpn = qpn;
    Route r = slot_of_qpn(qpn) == my_slot() ? Route::Loop : Route::Shm;
    if (Transport* t = transport(r)) t->deliver(dgid, copy);
  }
  return {Reply::Ack};
}

}  // namespace

void set_engine(const EngineHooks& hooks) {
  std::lock_guard<std::mutex> lock(dir().mu);
  dir().hooks = hooks;
}

const EngineHooks& engine_hooks() { return dir().hooks; }

uint32_t allocate_qpn() {
  uint32_t base = static_cast<uint32_t>(my_slot()) << kQpnSlotShift;
  Directory& d = dir();
  std::lock_guard<std::mutex> lock(d.mu);
  for (uint32_t tries = 0; tries <= kQpnIndexMask; ++tries) {
    d.next_index = (d.next_index + 1) & kQpnIndexMask;
    uint32_t qpn = base | d.next_index;
    if (qpn < 2 || qpn >= 0xffffff || d.qps.count(qpn)) continue;
    return qpn;
  }
  return 0;  // all numbers of this process in use
}

void register_qp(uint32_t qpn, Qp* qp, std::atomic<int>* users) {
  std::lock_guard<std::mutex> lock(dir().mu);
  dir().qps[qpn] = {qp, users};
}

void unregister_qp(uint32_t qpn) {
  std::atomic<int>* users = nullptr;
  {
    std::lock_guard<std::mutex> lock(dir().mu);
    auto it = dir().qps.find(qpn);
    if (it == dir().qps.end()) return;
    users = it->second.users;
    dir().qps.erase(it);
  }
  for (int n = users->load(std::memory_order_acquire); n != 0;
       n = users->load(std::memory_order_acquire))
    users->wait(n, std::memory_order_acquire);
}

QpRef find_local(uint32_t qpn) {
  std::lock_guard<std::mutex> lock(dir().mu);
  auto it = dir().qps.find(qpn);
  if (it == dir().qps.end()) return QpRef();
  it->second.users->fetch_add(1, std::memory_order_acq_rel);
  return QpRef(it->second.qp, it->second.users);
}

Transport* transport(Route route) {
  if (Transport* t = dir().replaced[static_cast<int>(route)]) return t;
  switch (route) {
    case Route::Loop: return &g_loop;
    case Route::Shm: return &g_shm;
    case Route::Roce: return nullptr;  // not in this build yet: other hosts do not answer
    case Route::Multicast: return nullptr;
  }
  return nullptr;
}

void set_transport(Route route, Transport* t) { dir().replaced[static_cast<int>(route)] = t; }

Reply deliver(Route route, const ibv_gid& dgid, const Request& req) {
  if (route == Route::Multicast) return deliver_to_group(dgid, req);
  Transport* t = transport(route);
  return t ? t->deliver(dgid, req) : Reply{Reply::NoResponse};
}

void kick(uint32_t qpn) {
  Route r = slot_of_qpn(qpn) == my_slot() ? Route::Loop : Route::Shm;
  if (Transport* t = transport(r)) t->kick(qpn);
}

}  // namespace softverbs::wire
