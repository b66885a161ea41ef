// Raw packet QPs (IBV_QPT_RAW_PACKET): Ethernet frames on the port's interface
// (wire/ether), steered to receive queues by the rules of ibv_create_flow(3), as a NIC's
// flow table does. docs/raw-packet.md.
//
// Steering, per frame (one table for the process; other processes steer their own copy):
//  - SNIFFER rules get every frame, in or out;
//  - NORMAL rules by priority (lower value first): the first that matches traps the frame
//    for its QP and every other rule of that same priority that matches (each QP gets a
//    frame once); a DONT_TRAP rule takes a copy and lets the frame go on; a DROP rule traps
//    it for nobody;
//  - a frame no rule trapped goes to the ALL_DEFAULT rules, and to the MC_DEFAULT ones
//    when it is addressed to a group.
// A frame this host sends comes back to the table when it is addressed to the interface's
// MAC or to a group (the NIC's loopback); otherwise only sniffers see it.
#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/errors.hpp"
#include "core/flow_rule.hpp"
#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "wire/ether/packet_socket.hpp"
#include "wire/roce/pcap.hpp"
#include "wire/registry.hpp"

namespace softverbs::engine {

namespace {

struct Entry {
  uint64_t handle;
  Qp* qp;
  FlowRule rule;
};

struct Steering {
  std::mutex mu;
  std::vector<Entry> entries;  // NORMAL ones sorted by priority, stable in creation order
  uint64_t next_handle = 1;
  uint64_t promisc_generation = 0;
  Steering* before_fork = nullptr;  // the parent's table in a forked child: kept, never used
};

Steering* the_steering = nullptr;

Steering& steering() {
  // Never destroyed: the receiver thread may run past static destructors. A forked child
  // starts with an empty table (the parent's QPs are not its own; the lock may have been
  // held at the fork).
  static Steering* first = [] {
    the_steering = new Steering;
    pthread_atfork(nullptr, nullptr, [] {
      Steering* parent = the_steering;
      the_steering = new Steering;
      the_steering->before_fork = parent;
      // Handles go on from the parent's: a rule the child inherited names none of its own.
      the_steering->next_handle = parent->next_handle;
    });
    return the_steering;
  }();
  (void)first;
  return *the_steering;
}

// Whether a rule wants frames addressed to other hosts' unicast MACs: then the receiver
// must see the whole link (wire::ether::set_promiscuous).
bool wants_other_unicast(const FlowRule& r, const uint8_t* own) {
  if (r.type == IBV_FLOW_ATTR_SNIFFER || r.type == IBV_FLOW_ATTR_ALL_DEFAULT) return true;
  if (r.type != IBV_FLOW_ATTR_NORMAL) return false;  // MC_DEFAULT: groups only
  for (const FlowRule::Spec& sp : r.specs) {
    if (sp.type != IBV_FLOW_SPEC_ETH) continue;
    const uint8_t* val = sp.u.eth.val.dst_mac;
    const uint8_t* mask = sp.u.eth.mask.dst_mac;
    if ((mask[0] & 1) && (val[0] & 1)) return false;  // group addresses only
    bool exact = true;
    for (int i = 0; i < 6; ++i) exact = exact && mask[i] == 0xff;
    return !(exact && std::memcmp(val, own, 6) == 0);
  }
  return true;  // no MAC in the rule: any destination
}

// Whether the table wants the link promiscuous, numbered so that the newest answer wins
// (applied after the table's lock is let go: the port's lock is never taken under it).
struct Promiscuity {
  bool on;
  uint64_t generation;
};
Promiscuity promiscuity_locked(Steering& s) {
  bool any = false;
  for (const Entry& e : s.entries) any = any || wants_other_unicast(e.rule, wire::ether::own_mac());
  return {any, ++s.promisc_generation};
}

// A QP a frame goes to, with the tag of the rule that took it there (the first, if several).
struct Taker {
  Qp* qp;
  uint32_t tag;
};

// `softverbs trace`: a frame as it was on the link, flushed (a process may end with _exit).
void trace_frame(const iovec* v, int n, size_t len) {
  if (wire::roce::PcapWriter* w = trace_writer()) {
    w->write_frame(v, n, len);
    w->flush();
  }
}

void add_once(std::vector<Taker>& to, Qp* qp, uint32_t tag) {
  for (const Taker& t : to)
    if (t.qp == qp) return;
  to.push_back({qp, tag});
}

// The WQ of an RSS QP a frame goes to: its hash over the fields the QP asked for, in
// Toeplitz order (source address, destination address, source port, destination port).
Wq* pick_wq(const RxHash& rss, const FrameHeaders& h) {
  uint8_t in[36];
  size_t n = 0;
  auto add = [&](uint64_t field, const uint8_t* p, size_t len) {
    if ((rss.fields & field) && p) {
      std::memcpy(in + n, p, len);
      n += len;
    }
  };
  add(IBV_RX_HASH_SRC_IPV4, h.ipv4 ? h.ipv4 + 12 : nullptr, 4);
  add(IBV_RX_HASH_DST_IPV4, h.ipv4 ? h.ipv4 + 16 : nullptr, 4);
  add(IBV_RX_HASH_SRC_IPV6, h.ipv6 ? h.ipv6 + 8 : nullptr, 16);
  add(IBV_RX_HASH_DST_IPV6, h.ipv6 ? h.ipv6 + 24 : nullptr, 16);
  const bool tcp = h.l4 && h.l4_proto == 6, udp = h.l4 && h.l4_proto == 17;
  add(IBV_RX_HASH_SRC_PORT_TCP, tcp ? h.l4 : nullptr, 2);
  add(IBV_RX_HASH_DST_PORT_TCP, tcp ? h.l4 + 2 : nullptr, 2);
  add(IBV_RX_HASH_SRC_PORT_UDP, udp ? h.l4 : nullptr, 2);
  add(IBV_RX_HASH_DST_PORT_UDP, udp ? h.l4 + 2 : nullptr, 2);
  uint32_t hash = n ? toeplitz_hash(rss.key.data(), rss.key.size(), in, n) : 0;
  const std::vector<Wq*>& wqs = rss.table->wqs;
  return wqs[hash & (wqs.size() - 1)];
}

void on_frame(const uint8_t* frame, size_t len, bool outgoing) {
  const FrameHeaders h = parse_frame(frame, len);
  const bool group = (frame[0] & 1) != 0;
  const bool comes_back = !outgoing || group || std::memcmp(frame, wire::ether::own_mac(), 6) == 0;
  Steering& s = steering();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<Taker> to;
  bool trapped = false;
  int trapped_priority = -1;
  for (const Entry& e : s.entries) {
    const FlowRule& r = e.rule;
    if (r.type == IBV_FLOW_ATTR_SNIFFER) {
      add_once(to, e.qp, r.tag);
      continue;
    }
    if (r.type != IBV_FLOW_ATTR_NORMAL || !comes_back) continue;
    if (trapped && r.priority != trapped_priority) continue;
    if (!flow_matches(r, h)) continue;
    if (!r.drop) add_once(to, e.qp, r.tag);
    if (!r.dont_trap) {
      trapped = true;
      trapped_priority = r.priority;
    }
  }
  if (!trapped && comes_back)
    for (const Entry& e : s.entries)
      if (e.rule.type == IBV_FLOW_ATTR_ALL_DEFAULT || (group && e.rule.type == IBV_FLOW_ATTR_MC_DEFAULT))
        add_once(to, e.qp, e.rule.tag);
  // Traced once however many QPs took it.
  if (!to.empty()) {
    iovec v{const_cast<uint8_t*>(frame), len};
    trace_frame(&v, 1, len);
  }
  // Under the lock: a QP with rules cannot be destroyed, and its rules go only through it.
  for (const Taker& t : to) {
    if (t.qp->rss) deliver_frame_to_wq(t.qp, pick_wq(*t.qp->rss, h), frame, len, t.tag);
    else deliver_frame(t.qp, frame, len, t.tag);
  }
}

}  // namespace

int raw_qp_created() { return wire::ether::hold_sender(); }
void raw_qp_create_failed() { wire::ether::release_sender(); }
void raw_qp_destroyed(Qp* qp) {
  // A forked child's copy of its parent's QP holds nothing of the child's port.
  if (qp->raw_owner == wire::self_pid()) wire::ether::release_sender();
}

Outcome send_raw(Qp*, const iovec* local, int nlocal, uint64_t len) {
  if (wire::ether::send_frame(local, nlocal, len) != 0)
    return {Outcome::Error, fault_rule(Fault::LocalLength).requester_status};
  trace_frame(local, nlocal, len);
  return {Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
}

bool raw_receiving() { return wire::ether::receiving(); }
bool raw_poll() { return wire::ether::poll_frames(16) > 0; }
void raw_poll_stop() { wire::ether::stop_polling(); }

int attach_flow(Qp* qp, FlowRule rule, uint64_t* handle) {
  if (int err = wire::ether::hold_receiver(&on_frame)) return err;
  // The CQs its frames complete on: an empty poll of one takes frames itself.
  if (qp->rss) {
    for (Wq* wq : qp->rss->table->wqs) wq->rq->xrc_cq->raw_fed.store(true, std::memory_order_relaxed);
  } else {
    qp->recv_cq->raw_fed.store(true, std::memory_order_relaxed);
  }
  Steering& s = steering();
  std::unique_lock<std::mutex> lock(s.mu);
  auto at = s.entries.begin();
  while (at != s.entries.end() && !(rule.type == IBV_FLOW_ATTR_NORMAL && at->rule.type == IBV_FLOW_ATTR_NORMAL &&
                                    at->rule.priority > rule.priority))
    ++at;
  *handle = s.next_handle++;
  s.entries.insert(at, Entry{*handle, qp, std::move(rule)});
  ++qp->raw_flows;
  const Promiscuity want = promiscuity_locked(s);
  lock.unlock();
  wire::ether::set_promiscuous(want.on, want.generation);
  return 0;
}

void detach_flow(uint64_t handle) {
  Steering& s = steering();
  bool found = false;
  Promiscuity want{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto it = s.entries.begin(); it != s.entries.end(); ++it) {
      if (it->handle != handle) continue;
      --it->qp->raw_flows;
      s.entries.erase(it);
      found = true;
      break;
    }
    if (found) want = promiscuity_locked(s);
  }
  if (found) wire::ether::set_promiscuous(want.on, want.generation);
  // Not under the lock: stopping the receiver waits for its thread, which may be waiting
  // for the lock in on_frame. (A rule a forked child inherited holds no receiver of its.)
  if (found) wire::ether::release_receiver();
}

bool raw_qp_has_flows(Qp* qp) {
  if (qp->raw_owner != wire::self_pid()) return false;  // the parent's rules, not ours
  std::lock_guard<std::mutex> lock(steering().mu);
  return qp->raw_flows > 0;
}

}  // namespace softverbs::engine
