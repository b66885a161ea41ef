// A deterministic test bench for engine/packet: nodes (one PacketQp each, with memory, a
// receive queue and CQs) joined by a fake link with a virtual clock. The link can drop,
// reorder and duplicate packets from a seeded generator, or drop what a filter picks.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/packet/packet_qp.hpp"

namespace softverbs::unit {

namespace pk = engine::packet;
namespace rw = wire::roce;

class Link;

// A packet as the link carries it: decoded headers plus its own copy of the payload.
struct WirePacket {
  int from = 0;
  pk::Packet pkt;
  std::vector<uint8_t> payload;
  uint64_t sent_at = 0;
};

class Node : public pk::Env {
 public:
  Node(Link& link, int id, pk::QpType type, uint32_t qpn, size_t mem_bytes)
      : qp(*this, type, qpn), link_(link), id_(id), mem(mem_bytes) {}

  void send_packet(const pk::Packet& pkt, std::span<const pk::Iov> payload) override;
  uint64_t now_ns() override;
  void arm_timer(uint64_t deadline) override {
    timer_on = true;
    timer_at = deadline;
  }
  void cancel_timer() override { timer_on = false; }
  pk::RkeyResult resolve_rkey(uint32_t key, uint64_t va, uint32_t len, int access) override {
    uint64_t base = reinterpret_cast<uintptr_t>(mem.data());
    if (key != rkey || (access & ~mr_access) != 0) return {};
    if (va < base || va + len > base + mem.size() || va + len < va) return {};
    return {reinterpret_cast<uint8_t*>(va), true};
  }
  std::optional<pk::RecvWqe> take_receive(std::span<const uint8_t>) override {
    if (rq.empty()) return std::nullopt;
    pk::RecvWqe w = std::move(rq.front());
    rq.pop_front();
    return w;
  }
  void push_completion(pk::WorkQueue q, const pk::Completion& wc) override {
    (q == pk::WorkQueue::kSend ? scq : rcq).push_back(wc);
  }
  void raise_event(ibv_event_type type) override { events.push_back(type); }
  // SEND_WITH_INV: the keys this node lets a peer invalidate (each once).
  bool invalidate_rkey(uint32_t rkey) override { return invalidatable.erase(rkey) == 1; }
  std::set<uint32_t> invalidatable;
  // XRC TGT: the XRC SRQ numbers of this node's domain (every one takes from `rq`).
  // Those of `xrc_elsewhere` belong to another process: xrc_forward records each operation
  // sent there and answers with `away_answers` in turn (Ack once they run out).
  pk::XrcSrqPlace select_xrc_srq(uint32_t srqn) override {
    xrc_selected.push_back(srqn);
    if (xrc_elsewhere.count(srqn)) return pk::XrcSrqPlace::kElsewhere;
    return xrc_srqs.count(srqn) == 1 ? pk::XrcSrqPlace::kHere : pk::XrcSrqPlace::kNone;
  }
  struct AwayCall {
    ibv_wr_opcode opcode;
    uint32_t srqn;
    std::vector<uint8_t> payload;
  };
  pk::XrcVerdict xrc_forward(const pk::XrcAway& a) override {
    away_calls.push_back({a.opcode, a.srqn, {a.payload.begin(), a.payload.end()}});
    pk::XrcVerdict v{pk::XrcVerdict::kAck, 0, {}};
    if (!away_answers.empty()) {
      v = away_answers.front();
      away_answers.pop_front();
    }
    if (v.kind == pk::XrcVerdict::kAck && !a.result.empty())
      std::memset(a.result.data(), 0x5a, a.result.size());
    return v;
  }
  std::set<uint32_t> xrc_srqs, xrc_elsewhere;
  std::vector<uint32_t> xrc_selected;
  std::vector<AwayCall> away_calls;
  std::deque<pk::XrcVerdict> away_answers;
  uint64_t atomic_execute(uint8_t* addr, ibv_wr_opcode op, uint64_t compare_add,
                          uint64_t swap) override {
    ++atomic_executions;
    uint64_t old;
    std::memcpy(&old, addr, 8);
    uint64_t now = op == IBV_WR_ATOMIC_WRITE       ? compare_add
                   : op == IBV_WR_ATOMIC_CMP_AND_SWP ? (old == compare_add ? swap : old)
                                                     : old + compare_add;
    std::memcpy(addr, &now, 8);
    return old;
  }

  // FLUSH: the key and the flush access its placement type needs, over the range (or all).
  bool flush(uint32_t key, uint64_t va, uint32_t len, uint8_t type, uint8_t level) override {
    ++flushes;
    int need = ((type & kFlushGlobal) ? kAccessFlushGlobal : 0) |
               ((type & kFlushPersistent) ? kAccessFlushPersistent : 0);
    if (need == 0 || (need & ~mr_access) != 0) return false;
    if (level == kFlushMr) return key == rkey;
    return resolve_rkey(key, va, len, 0).ok;
  }

  uint64_t va(size_t offset) { return reinterpret_cast<uintptr_t>(mem.data() + offset); }
  pk::Iov iov(size_t offset, uint32_t len) { return {mem.data() + offset, len}; }
  void post_recv(uint64_t wr_id, size_t offset, uint32_t len) {
    rq.push_back(pk::RecvWqe{wr_id, {iov(offset, len)}});
  }

  pk::PacketQp qp;
  Link& link_;
  int id_;
  std::vector<uint8_t> mem;
  uint32_t rkey = 0x1234;
  int mr_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  std::deque<pk::RecvWqe> rq;
  std::vector<pk::Completion> scq, rcq;
  std::vector<ibv_event_type> events;
  std::vector<WirePacket> sent;  // everything this node transmitted
  bool timer_on = false;
  uint64_t timer_at = 0;
  int atomic_executions = 0;
  int flushes = 0;
};

class Link {
 public:
  explicit Link(uint64_t seed = 1) : rng_(seed) {}

  uint64_t now = 0;
  uint64_t latency_ns = 1000;
  double drop_rate = 0, reorder_rate = 0, dup_rate = 0;
  bool deliver = true;  // false: packets are only recorded in Node::sent
  std::function<bool(const WirePacket&)> drop_if;
  std::vector<Node*> nodes;  // index = node id; node i sends to node 1 - i
  uint64_t delivered = 0, dropped = 0, reordered = 0, duplicated = 0;

  void carry(WirePacket wp) {
    if (!deliver) return;
    if (drop_if && drop_if(wp)) return;
    if (chance(drop_rate)) {
      ++dropped;
      return;
    }
    uint64_t at = now + latency_ns;
    if (chance(reorder_rate)) {
      ++reordered;
      at += 500 + rng_() % 5000;  // overtaken by later packets
    }
    if (chance(dup_rate)) {
      ++duplicated;
      queue_.emplace(std::make_pair(at + rng_() % 3000, seq_++), wp);
    }
    queue_.emplace(std::make_pair(at, seq_++), std::move(wp));
  }

  // Advances to the next event (a delivery or a timer); false when nothing is left.
  bool step() {
    Node* timer_node = nullptr;
    for (Node* n : nodes)
      if (n->timer_on && (!timer_node || n->timer_at < timer_node->timer_at)) timer_node = n;
    bool have_packet = !queue_.empty();
    if (!timer_node && !have_packet) return false;
    if (timer_node && (!have_packet || timer_node->timer_at <= queue_.begin()->first.first)) {
      now = std::max(now, timer_node->timer_at);
      timer_node->timer_on = false;
      timer_node->qp.on_timer();
      return true;
    }
    auto it = queue_.begin();
    now = std::max(now, it->first.first);
    WirePacket wp = std::move(it->second);
    queue_.erase(it);
    wp.pkt.payload = wp.payload.empty() ? nullptr : wp.payload.data();
    ++delivered;
    nodes[1 - wp.from]->qp.on_packet(wp.pkt);
    return true;
  }

  // Runs until `done` or nothing is left to do; false if `max_ns` of virtual time passed.
  bool run(const std::function<bool()>& done, uint64_t max_ns = 60'000'000'000ull) {
    while (!done()) {
      if (now > max_ns || !step()) return done();
    }
    return true;
  }
  void run_for(uint64_t ns) {
    uint64_t end = now + ns;
    while (next_event_at() <= end && step()) {
    }
    now = std::max(now, end);
  }

 private:
  uint64_t next_event_at() const {
    uint64_t t = UINT64_MAX;
    if (!queue_.empty()) t = queue_.begin()->first.first;
    for (Node* n : nodes)
      if (n->timer_on) t = std::min(t, n->timer_at);
    return t;
  }
  bool chance(double p) {
    return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  std::mt19937_64 rng_;
  uint64_t seq_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, WirePacket> queue_;
};

inline void Node::send_packet(const pk::Packet& pkt, std::span<const pk::Iov> payload) {
  WirePacket wp;
  wp.from = id_;
  wp.pkt = pkt;
  wp.sent_at = link_.now;
  for (const pk::Iov& v : payload) wp.payload.insert(wp.payload.end(), v.addr, v.addr + v.len);
  EXPECT_EQ(wp.payload.size(), pkt.payload_len);
  sent.push_back(wp);
  link_.carry(std::move(wp));
}

inline uint64_t Node::now_ns() { return link_.now; }

// Attributes for INIT -> RTR -> RTS, as a CM exchange would set them.
struct Connection {
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t psn_a = 100, psn_b = 5000;
  uint8_t timeout = 10;  // 4.19 ms
  uint8_t retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 1;  // 10 us
  uint8_t rd_atomic = 4;
  uint32_t qkey = 0x11111111;
};

inline void bring_up(Node& n, const Node& peer, uint32_t my_psn, uint32_t peer_psn,
                     const Connection& c, bool to_rts = true) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.qkey = c.qkey;
  ASSERT_EQ(n.qp.modify(a, IBV_QP_STATE | IBV_QP_QKEY), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = c.mtu;
  a.dest_qp_num = peer.qp.qp_num();
  a.rq_psn = peer_psn;
  a.max_dest_rd_atomic = c.rd_atomic;
  a.min_rnr_timer = c.min_rnr_timer;
  ASSERT_EQ(n.qp.modify(a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  if (!to_rts) return;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = my_psn;
  a.timeout = c.timeout;
  a.retry_cnt = c.retry_cnt;
  a.rnr_retry = c.rnr_retry;
  a.max_rd_atomic = c.rd_atomic;
  ASSERT_EQ(n.qp.modify(a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
            0);
}

// Two nodes of one QP type, connected back to back.
struct Pair {
  explicit Pair(pk::QpType type = pk::QpType::kRc, Connection c = {}, uint64_t seed = 1,
                size_t mem = 1 << 20)
      : link(seed), a(link, 0, type, 0x11, mem), b(link, 1, type, 0x22, mem), conn(c) {
    link.nodes = {&a, &b};
    bring_up(a, b, c.psn_a, c.psn_b, c);
    bring_up(b, a, c.psn_b, c.psn_a, c);
  }
  Link link;
  Node a, b;
  Connection conn;
};

inline void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) ^ seed);
}

}  // namespace softverbs::unit
