// The requester's same-host fast paths: to a connected QP of another process of this host,
// a small SEND goes into the peer's receive window (wire/shm/window.hpp), an RDMA WRITE,
// READ or atomic straight into the peer's registered pages when they are shared with us
// (docs/decisions/0005), all after the checks the peer's responder would make. Whatever
// they cannot do exactly (RNR, errors, a peer that went away) they leave to the shm
// transport's agent path, which answers like the responder itself.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "engine/engine.hpp"
#include "engine/shm_peer.hpp"
#include "core/device.hpp"
#include "core/core.hpp"
#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/mr_shm.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

// A wake-up fd from a peer is used only if it is what it should be, an eventfd (see
// EventQueue), and never blocks us: a full counter makes the write fail and we ask the
// peer's agent instead.
bool usable_wake_fd(int fd) {
  char path[40], target[32];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = 0;
  return std::strcmp(target, "anon_inode:[eventfd]") == 0 &&
         fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0;
}

namespace {

// Windows open in this process whose ring pages open_window_at_rts faulted in. Each holds
// 33 pages of its peer's memory whether SENDs come or not; past this many, the pages come
// with the messages (a process connected to many peers on this host).
constexpr int kPopulateMax = 64;
std::atomic<int> g_populated{0};
// An rdma_cm passive side takes its QP to RTS as it accepts, before the active side's QP is
// at RTR: every ask there is refused, one agent round trip each (1,000 refusals, 111 ms of
// cmtime -c 1000's server on a busy machine). After this many refusals a process leaves
// windows to the first post. (Capping the windows opened at RTS instead halved
// ib_send_bw -s 4096 -q 256: 5.4-5.9 GB/s against 9.8-10.9, pinned, 2026-11-29.)
constexpr int kAtRtsRefusedMax = 16;
std::atomic<int> g_at_rts_refused{0};

// Faults in our mapping of the ring's pages (and so the peer's memory behind them) now, in
// the application's setup: each first touch of a page costs a fault in the timed loop
// otherwise (~0.25 ms over a new ring in a VM here: ib_send_bw -s 4096 at 1,000 messages
// gave 7 GB/s without, 12-14 GB/s with). No contents change.
void populate_ring(wire::PeerWindow& pw) {
  if (g_populated.fetch_add(1, std::memory_order_relaxed) >= kPopulateMax) {
    g_populated.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  auto from = reinterpret_cast<uintptr_t>(pw.slots) & ~uintptr_t{4095};
  auto to = reinterpret_cast<uintptr_t>(pw.slots + wire::kWindowSlots);
  if (madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE) != 0) {
    g_populated.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  pw.populated = true;
}

}  // namespace

void drop_peer_window(Qp* qp) {
  drop_ud_peers(qp);  // a UD QP's windows, one per destination (shm_ud.cpp)
  wire::PeerWindow& pw = qp->peer_window;
  if (pw.populated) g_populated.fetch_sub(1, std::memory_order_relaxed);
  pw.populated = false;
  pw.hdr = nullptr;
  if (pw.wake_fd >= 0) close(pw.wake_fd);
  pw.wake_fd = -1;
  wire::unmap_peer_arena(pw.arena);  // the last window into that peer unmaps its memory
  pw.arena = {};
}

namespace {

// conformance.twoproc_channel_garbage: with SOFTVERBS_TEST_READY_GARBAGE=SEED (read at the
// first wake-up, so a forked test process may set it) this process is a requester that,
// at each wake-up, overwrites the target's ReadyBits with garbage (about every other time
// with zeros) after setting its bit, and writes the wake-up fd whatever the bit was.
std::atomic<uint64_t> g_garbage{UINT64_MAX};

// A test's garbage generator: its state, the seed read from `env` the first time (0: off).
uint64_t garbage_state(std::atomic<uint64_t>& state, const char* env) {
  uint64_t x = state.load(std::memory_order_relaxed);
  if (x == UINT64_MAX) {
    const char* seed = getenv(env);
    x = seed ? std::strtoull(seed, nullptr, 0) | 1 : 0;
    state.store(x, std::memory_order_relaxed);
  }
  return x;
}
uint64_t next_garbage(uint64_t& x) {  // xorshift64
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

bool scribble_ready(wire::ReadyBits* bits) {
  uint64_t x = garbage_state(g_garbage, "SOFTVERBS_TEST_READY_GARBAGE");
  if (x == 0 || !bits) return false;
  const bool zeros = (x >> 7) & 1;
  for (std::atomic<uint64_t>& w : bits->words) {
    const uint64_t v = next_garbage(x);  // the sequence moves on with zeros written too
    w.store(zeros ? 0 : v, std::memory_order_relaxed);
  }
  g_garbage.store(x, std::memory_order_relaxed);
  return true;
}

}  // namespace

void wake_target(const wire::ReadyHint& ready, int wake_fd, int slot, uint32_t dst_qpn) {
  if (wake_fd >= 0) {
    // send-small: one write per sleep, not per message. A bit already set has a write
    // coming, or not yet taken by the waiter, whose look at the CQ (after taking the bit,
    // seq_cst) finds this message too and fires the event.
    const bool pending = ready.bits && wire::ready_set(*ready.bits, ready.bit);
    const bool garbage = scribble_ready(ready.bits);
    if (pending && !garbage) return;
    uint64_t one = 1;
    if (write(wake_fd, &one, sizeof(one)) == sizeof(one)) return;
    // A full counter: later requesters must write again (and we ask the agent).
    if (ready.bits) wire::ready_clear(*ready.bits, ready.bit);
  }
  wire::agent_drain(slot, dst_qpn);
}

namespace {

// How long ibv_modify_qp to RTS waits for each answer of the peer's agent (its probe, the
// window): one that shares a pinned target's CPU with a spinning poller may run only at a
// scheduler tick (4 ms at HZ=250). A peer slower than this leaves the window to the first post.
constexpr int kOpenAtRtsWaitMs = 50;

// Asks the agent of the peer QP `dst_qpn` for its receive window, each answer waited for
// at most `wait_ms` (0: the agent's usual deadline); true: pw holds it, with fresh counts.
bool open_peer_window(Qp* qp, uint32_t dst_qpn, int wait_ms) {
  wire::PeerWindow& pw = qp->peer_window;
  int slot = wire::slot_of_qpn(dst_qpn);
  wire::PeerArena arena;
  int wake_fd = -1;
  uint64_t off = wire::agent_open_window(slot, qp->qpn(), dst_qpn, &arena, &wake_fd, wait_ms);
  auto* hdr = off ? arena.at<wire::WindowHeader>(off) : nullptr;
  // Everything in the peer's arena is read once into locals, checked, and kept here: the
  // peer (or anyone scribbling on its memory) may change it at any time afterwards.
  uint32_t rq_cap = hdr ? hdr->rq_cap : 0;
  uint64_t bytes = wire::window_bytes(rq_cap);
  uint64_t slots_at = bytes - uint64_t{wire::kWindowSlots} * sizeof(wire::WindowSlot);
  // The process cross-memory attach writes into is the one the kernel named as the agent's
  // (SO_PEERCRED), never the header's word for it: a header that names another is garbage.
  pid_t pid = arena.pid;
  bool ok = hdr && hdr->magic == wire::kWindowMagic && hdr->qpn == dst_qpn &&
            hdr->peer_qpn == qp->qpn() && rq_cap && !(rq_cap & (rq_cap - 1)) &&
            rq_cap <= (1u << 20) && arena.at<char>(off, bytes) && hdr->owner_pid == pid;
  auto* cq = ok ? arena.at<wire::CqShared>(hdr->cq_offset) : nullptr;
  // The target QP's SRQ, where its receives are claimed (wire::SrqShared), if it has one.
  uint64_t srq_at = ok ? hdr->srq_offset : 0;
  auto* srq = srq_at ? arena.at<wire::SrqShared>(srq_at) : nullptr;
  uint32_t srq_claimer = srq ? hdr->srq_claimer : 0;  // read once: our `who` there
  if (srq_at && (!srq || srq_claimer == 0 || srq_claimer >= wire::kSrqLocal)) ok = false;
  if (pw.wake_fd >= 0) close(pw.wake_fd);
  pw.wake_fd = -1;
  if (!ok || !cq || pid <= 0) {
    if (wake_fd >= 0) close(wake_fd);
    wire::unmap_peer_arena(arena);
    return false;
  }
  if (wake_fd >= 0 && !usable_wake_fd(wake_fd)) {
    close(wake_fd);
    wake_fd = -1;
  }
  const wire::MrShared* table = nullptr;
  uint64_t table_at = hdr->mr_table_offset;
  if (hdr->mr_table_cap == wire::kMrTableCap)
    table = arena.published_at<wire::MrShared>(table_at,
                                               sizeof(wire::MrShared) * wire::kMrTableCap);
  bool cross_memory = pw.cross_memory && !wire::cross_memory_disabled();
  char* base = reinterpret_cast<char*>(hdr);
  pw = wire::PeerWindow{};  // fresh counts
  pw.hdr = hdr;
  pw.cq = cq;
  pw.mr_table = table;
  pw.srq = srq;
  pw.srq_claimer = srq_claimer;
  pw.slots = reinterpret_cast<wire::WindowSlot*>(base + slots_at);
  pw.rq_len = reinterpret_cast<const uint32_t*>(base + sizeof(wire::WindowHeader));
  pw.rq_cap = rq_cap;
  pw.pid = pid;
  pw.dst_qpn = dst_qpn;
  pw.pd_token = hdr->pd_token;
  pw.cross_memory = cross_memory;
  pw.wake_fd = wake_fd;
  pw.ready = wire::ready_hint(arena, cq);
  pw.rung = wire::rung_bit(arena, cq, hdr->rung_index);
  pw.arena = arena;
  pw.ring_waited = &qp->window_counts.ring_waited;
  return true;
}

// Whether the window pw holds is the one to `dst_qpn` and its target still lives; any other
// is dropped here.
bool window_open_to(Qp* qp, uint32_t dst_qpn) {
  wire::PeerWindow& pw = qp->peer_window;
  if (!pw.hdr) return false;
  if (pw.dst_qpn == dst_qpn && pw.hdr->live.load(std::memory_order_acquire)) return true;
  drop_peer_window(qp);
  return false;
}

}  // namespace

// The receive window of the peer QP `dst_qpn` in another process, asked of its agent the
// first time (and again after it closed); nullptr when there is none to use.
wire::PeerWindow* peer_window(Qp* qp, uint32_t dst_qpn) {
  wire::PeerWindow& pw = qp->peer_window;
  if (window_open_to(qp, dst_qpn)) return &pw;  // the data path's case: one we opened
  int slot = wire::slot_of_qpn(dst_qpn);
  if (slot == wire::my_slot()) return nullptr;  // same process: direct anyway
  if (pw.backoff) {
    --pw.backoff;
    return nullptr;
  }
  if (!open_peer_window(qp, dst_qpn, 0)) {
    ++qp->window_counts.open_failed;
    pw.backoff = 64;  // ask again later, not on every operation
    return nullptr;
  }
  ++qp->window_counts.opened_at_post;
  return &pw;
}

void open_window_at_rts(Qp* qp) {
  if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC) return;
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  const Qp::SendPath& path = qp->send_path;
  // RoCE v2 peers have no window; one in this process needs none.
  if (path.route != wire::Route::Shm || !Device::instance().port_active() ||
      wire::slot_of_qpn(path.dest_qpn) == wire::my_slot())
    return;
  if (window_open_to(qp, path.dest_qpn)) return;
  wire::PeerWindow& pw = qp->peer_window;
  // A refusal here (the target not yet at RTR: both sides of a connection set up at once)
  // leaves the ask to the first post, with no backoff: this is a new connection.
  pw.backoff = 0;
  if (g_at_rts_refused.load(std::memory_order_relaxed) >= kAtRtsRefusedMax) return;
  if (!open_peer_window(qp, path.dest_qpn, kOpenAtRtsWaitMs)) {
    g_at_rts_refused.fetch_add(1, std::memory_order_relaxed);
    ++qp->window_counts.open_failed;
    return;
  }
  ++qp->window_counts.opened_at_rts;
  populate_ring(pw);
}

void count_agent_send(Qp* qp) {
  wire::PeerWindow& pw = qp->peer_window;
  stat::PeerWindowCounts& c = qp->window_counts;
  if (!pw.hdr) ++c.agent_no_window;
  else if (pw.refused == wire::WindowRefusal::RingFull) ++c.agent_ring_full;
  else if (pw.refused == wire::WindowRefusal::NoReceive) ++c.agent_no_receive;
  else if (pw.refused == wire::WindowRefusal::TooSmall) ++c.agent_too_small;
  else if (pw.refused == wire::WindowRefusal::Srq) ++c.agent_srq;
  else ++c.agent_other;
  pw.refused = wire::WindowRefusal::None;
  pw.waited_at = 0;  // the next message may wait for room again
}

namespace {

// How long a message waits for room in a full ring before taking the agent path: while
// the target polls, and while it sleeps on a CQ armed for the next completion.
constexpr auto kRingWait = std::chrono::microseconds(30);
constexpr auto kRingWaitAsleep = std::chrono::microseconds(250);

// The ring is full (message tail + 1 waits). While the target polls, room comes with its
// next poll, microseconds away, where the agent path waits for a thread that may share the
// target's CPU with that poller and so run only at a scheduler tick. A target asleep on a
// CQ armed for the next completion was woken by the first message that found it so
// (window_commit) and drains the ring when it runs: a wake-up of a sleeping thread takes
// tens of µs on a VM (the eventfd floor, 25 µs here), and the agent path is one more
// wake-up and a copy on top (ib_send_bw -e took it for most messages a sleep left behind:
// docs/analysis/send-bw-events.md). Armed for solicited events only, nothing may wake it:
// the agent path, at once. Once per message (the paths that try the window again after
// this one do not wait again). Only this posting thread spins, and boundedly.
bool wait_for_room(wire::PeerWindow* pw, uint64_t tail) {
  const int arm = pw->cq->arm.load(std::memory_order_relaxed);
  if (pw->waited_at == tail + 1 || arm == wire::kArmSolicited) return false;
  pw->waited_at = tail + 1;
  const Clock::time_point until = Clock::now() + (arm == wire::kArmNone ? kRingWait : kRingWaitAsleep);
  do {
    for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    pw->head = pw->hdr->head.load(std::memory_order_acquire);
    if (tail - pw->head < wire::kWindowSlots) {
      if (pw->ring_waited) ++*pw->ring_waited;
      return true;
    }
  } while (Clock::now() < until);
  return false;
}

// Whether the ring has room for message tail + 1, reading the target's head when our copy
// says it is full (and waiting a little, above); a no says why in pw->refused.
bool ring_room(wire::PeerWindow* pw, uint64_t tail) {
  if (tail - pw->head < wire::kWindowSlots) return true;
  pw->head = pw->hdr->head.load(std::memory_order_acquire);
  if (tail - pw->head < wire::kWindowSlots || wait_for_room(pw, tail)) return true;
  pw->refused = wire::WindowRefusal::RingFull;
  return false;
}

// window_slot for a target QP with an SRQ: when the ring has room and the SRQ's lowest
// unclaimed receive holds `len` (a small SEND, or a large one the caller places): claimed now (its owner word names our window,
// so the target gives it back if we die before the commit), and named in the slot, so the
// message lands in exactly that receive. None left, one too small, one given back waiting
// for the target: the agent path, which answers RNR / the length error exactly.
// For conformance.twoproc_send_place_srq_dead: a sender that dies between claim and commit
// (read at the first claim, so a forked test process may set it).
bool die_after_srq_claim() {
  static const bool die = getenv("SOFTVERBS_TEST_DIE_AFTER_SRQ_CLAIM") != nullptr;
  return die;
}

wire::WindowSlot* srq_window_slot(wire::PeerWindow* pw, uint32_t len) {
  wire::SrqShared* srq = pw->srq;
  pw->refused = wire::WindowRefusal::Srq;
  if (srq->given_back.load(std::memory_order_acquire)) return nullptr;
  uint64_t tail = pw->tail;
  if (!ring_room(pw, tail)) return nullptr;
  uint64_t number = wire::srq_claim(srq, srq->posted.load(std::memory_order_acquire), pw->srq_claimer, len);
  if (number == wire::kSrqNone) return nullptr;
  pw->refused = wire::WindowRefusal::None;
  if (die_after_srq_claim()) _exit(0);
  pw->srq_number = number;
  wire::WindowSlot* s = &pw->slots[tail % wire::kWindowSlots];
  s->receive = number;
  return s;
}

}  // namespace

// The slot of the peer's receive window for the next message, of `len` bytes, when the ring
// has room and the receive it will land in is there and big enough; nullptr means "take
// the agent path", which answers everything else (RNR, errors, a target that went away)
// exactly. Nothing is spoken for until window_commit, but for an SRQ's receive, claimed
// last here (window_unclaim gives it back).
wire::WindowSlot* window_slot(wire::PeerWindow* pw, uint32_t len) {
  wire::WindowHeader* hdr = pw->hdr;
  if (pw->srq) return srq_window_slot(pw, len);
  if (pw->resync) {
    pw->taken = hdr->rq_taken.load(std::memory_order_acquire);
    pw->resync = false;
  }
  uint64_t taken = pw->taken;
  if (pw->posted == taken) {
    pw->posted = hdr->rq_posted.load(std::memory_order_acquire);
    if (pw->posted == taken) {  // no receive posted: RNR, via the agent
      pw->refused = wire::WindowRefusal::NoReceive;
      return nullptr;
    }
  }
  if (pw->rq_len[taken & (pw->rq_cap - 1)] < len) {
    pw->refused = wire::WindowRefusal::TooSmall;
    return nullptr;
  }
  uint64_t tail = pw->tail;
  if (!ring_room(pw, tail)) return nullptr;
  pw->refused = wire::WindowRefusal::None;
  return &pw->slots[tail % wire::kWindowSlots];
}

namespace {

// conformance.twoproc_rung_garbage: with SOFTVERBS_TEST_RUNG_GARBAGE=SEED this process is a
// requester that, for every message, writes a random word or zero over one of the target
// CQ's rung words or its doorbell (setting bits of other windows, clearing theirs) instead
// of ringing.
std::atomic<uint64_t> g_rung_garbage{UINT64_MAX};

void ring(wire::PeerWindow* pw) {
  if (uint64_t x = garbage_state(g_rung_garbage, "SOFTVERBS_TEST_RUNG_GARBAGE")) {
    const uint64_t which = next_garbage(x);
    const uint64_t word = which >> 32 & 1 ? 0 : next_garbage(x);  // half the time: cleared
    g_rung_garbage.store(x, std::memory_order_relaxed);
    wire::CqShared* cq = pw->cq;
    std::atomic<uint64_t>* words[] = {&cq->doorbell, &cq->rung_summary[0], &cq->rung_summary[1],
                                      &cq->rung_summary[2], &cq->rung_direct[0], &cq->rung_direct[1],
                                      &cq->rung_direct[2], &cq->rung_direct[3]};
    words[which % 8]->store(word, std::memory_order_seq_cst);
    full_fence();  // as ring_cq's, before the arm
    return;
  }
  wire::ring_cq(pw->cq, pw->rung);
}

}  // namespace

// The claimed receive goes back through the ring (a void slot), in order with what we
// commit next; the doorbell has the target drain it soon.
void window_unclaim(wire::PeerWindow* pw) {
  if (!pw->srq) return;
  wire::WindowSlot& s = pw->slots[pw->tail % wire::kWindowSlots];
  s.opcode = wire::kWindowVoid;
  s.length = 0;
  s.receive = pw->srq_number;
  s.seq.store(pw->tail + 1, std::memory_order_release);
  ++pw->tail;
  ring(pw);
}

// Hands the message whose payload is already in `s` (from window_slot) to the target.
void window_commit(wire::PeerWindow* pw, wire::WindowSlot& s, uint32_t opcode, uint32_t flags,
                   uint32_t imm, uint32_t len) {
  s.opcode = opcode;
  s.flags = flags;
  s.imm = imm;
  s.length = len;
  s.seq.store(pw->tail + 1, std::memory_order_release);
  ++pw->tail;
  pw->hdr->rq_taken.store(++pw->taken, std::memory_order_relaxed);
  // The target turns ring messages into completions when it polls. If its CQ is armed it
  // may be asleep in ibv_get_cq_event: have its agent drain the window now, so that the
  // completion is added (and the event fires) exactly as for a local arrival.
  ring(pw);
  int arm = pw->cq->arm.load(std::memory_order_seq_cst);
  if (arm == wire::kArmNext || (arm == wire::kArmSolicited && (flags & IBV_SEND_SOLICITED)))
    wake_target(pw->ready, pw->wake_fd, pw->arena.slot, pw->dst_qpn);
}

namespace {

// What a peer's responder would check before letting `need` at [remote_addr, +len) of the
// MR (or memory window) named by rkey, read from what it publishes: its QP's access, the
// MR table entry (key, PD, access, range, the QP a type 2 window is bound to). The entry's fields, read between two looks at its key, go to *out.
bool peer_allows(wire::PeerWindow* pw, uint32_t rkey, uint64_t remote_addr, unsigned need,
                 uint64_t len, wire::MrShared* out) {
  wire::WindowHeader* hdr = pw->hdr;
  if (!pw->mr_table || !(hdr->qp_access.load(std::memory_order_acquire) & need)) return false;
  if (need != IBV_ACCESS_REMOTE_WRITE && hdr->max_dest_rd_atomic == 0) return false;
  if (!wire::read_mr_entry(pw->mr_table, rkey, out)) return false;
  if (out->pd_token != hdr->pd_token || (out->access & need) != need) return false;
  // A type 2 memory window serves only the QP it is bound to: the peer's end of ours.
  if (out->qpn != 0 && out->qpn != pw->dst_qpn) return false;
  uint64_t iova = out->iova, length = out->length;
  return remote_addr >= iova && len <= length && remote_addr - iova <= length - len;
}

}  // namespace

// The target's bytes at remote_addr, when its MR's pages are in its MR memfd and we have it
// mapped (decision 0005); nullptr otherwise.
char* shared_bytes(wire::PeerWindow* pw, const wire::MrShared& e, uint64_t remote_addr, uint64_t len) {
  if (!pw->arena.mr || e.shm < wire::kMrShmFirst) return nullptr;
  uint64_t at = remote_addr - e.iova;  // within the MR (checked by peer_allows)
  if (at > e.shm_length || len > e.shm_length - at) return nullptr;  // reaches the private tail
  return wire::peer_mr_span(pw->arena.mr, pw->arena.mr_fd, e.shm + at, len, &pw->mr_known);
}

// The payload of a checked WR as iovecs: the application's addresses when inline, else its
// buffers through their keys (caller holds the key lock). -1: a bad key.
int payload_iovecs(Qp* qp, const ibv_send_wr* wr, iovec* v) {
  bool inl = wr->send_flags & IBV_SEND_INLINE;
  int n = 0;
  for (int i = 0; i < wr->num_sge; ++i) {
    const ibv_sge& g = wr->sg_list[i];
    if (g.length == 0) continue;
    if (inl) v[n++] = {reinterpret_cast<void*>(g.addr), g.length};
    else if (!resolve_sge(qp->pd, g.lkey, g.addr, g.length, 0, &v[n++])) return -1;
  }
  return n;
}

// A small SEND to a connected QP of another process, through the peer's receive window;
// nullopt: take the agent path.
std::optional<Outcome> send_through_window(Qp* qp, const SendWqe& w, const iovec* local,
                                           int nlocal, uint32_t dst_qpn) {
  // send-small: into the receive itself when its pages are shared (shm_send_place.cpp).
  if (auto o = send_placed_small(qp, w, local, nlocal, dst_qpn)) return o;
  wire::PeerWindow* pw = peer_window(qp, dst_qpn);
  if (!pw) return std::nullopt;
  uint32_t len = static_cast<uint32_t>(w.total_length);
  wire::WindowSlot* s = window_slot(pw, len);
  if (!s) return std::nullopt;
  iovec dst{s->data, len};
  wire::copy_local(&dst, 1, local, nlocal, len);
  window_commit(pw, *s, w.opcode, w.flags, w.imm, len);
  return Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, len};
}

// RDMA WRITE / READ to a connected QP of another process, straight into / out of its
// memory after the checks its responder would make: with plain loads and stores when the
// MR's pages are shared with us, else with cross-memory attach. Any doubt: nullopt, and the
// agent path answers exactly (errors, a target that went away).
std::optional<Outcome> rdma_direct(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                   uint32_t dst_qpn) {
  uint64_t len = w.total_length;
  if (len == 0) return std::nullopt;
  wire::PeerWindow* pw = peer_window(qp, dst_qpn);
  if (!pw) return std::nullopt;
  bool write = w.opcode == IBV_WR_RDMA_WRITE;
  wire::MrShared e;
  if (!peer_allows(pw, w.rkey, w.remote_addr,
                   write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ, len, &e))
    return std::nullopt;
  Outcome done{Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(len)};
  if (char* remote = shared_bytes(pw, e, w.remote_addr, len)) {
    iovec there{remote, len};
    if (write) wire::copy_local(&there, 1, local, nlocal, len);
    else wire::copy_local(local, nlocal, &there, 1, len);
    return done;
  }
  if (!pw->cross_memory) return std::nullopt;
  iovec remote{reinterpret_cast<void*>(e.addr + (w.remote_addr - e.iova)), len};
  ssize_t n = write ? process_vm_writev(pw->pid, local, nlocal, &remote, 1, 0)
                    : process_vm_readv(pw->pid, local, nlocal, &remote, 1, 0);
  if (n == static_cast<ssize_t>(len)) return done;
  if (n < 0 && errno == EPERM) pw->cross_memory = false;
  return std::nullopt;
}

// An atomic on a connected QP of another process whose MR's pages are shared with us: a CPU
// atomic on the shared line, as the target's own agent would run it. Misaligned addresses
// and everything else go to the agent path, which answers exactly.
std::optional<Outcome> atomic_direct(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                     uint32_t dst_qpn) {
  if (w.remote_addr % 8 || nlocal != 1 || local[0].iov_len != 8) return std::nullopt;
  wire::PeerWindow* pw = peer_window(qp, dst_qpn);
  if (!pw) return std::nullopt;
  wire::MrShared e;
  if (!peer_allows(pw, w.rkey, w.remote_addr, IBV_ACCESS_REMOTE_ATOMIC, 8, &e)) return std::nullopt;
  char* remote = shared_bytes(pw, e, w.remote_addr, 8);
  if (!remote) return std::nullopt;
  auto* word = reinterpret_cast<uint64_t*>(remote);
  uint64_t old;
  if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
    old = w.compare_add;
    __atomic_compare_exchange_n(word, &old, w.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } else {
    old = __atomic_fetch_add(word, w.compare_add, __ATOMIC_SEQ_CST);
  }
  std::memcpy(local[0].iov_base, &old, 8);
  return Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, 8};
}

namespace {

// post_now's copy of a small SEND into the window's next slot, or of an RDMA WRITE into the
// peer MR's shared pages; false: nothing happened.
bool copy_now(Qp* qp, const ibv_send_wr* wr, uint64_t len, bool send) {
  if (send ? len > wire::kWindowPayload : len == 0 || len > kMaxMsgSize) return false;
  wire::PeerWindow* pw = peer_window(qp, qp->send_path.dest_qpn);
  if (!pw) return false;
  // Where the bytes go: the next slot of the peer's receive window, or its MR's pages.
  wire::WindowSlot* slot = nullptr;
  char* remote = nullptr;
  if (send) {
    if (!(slot = window_slot(pw, static_cast<uint32_t>(len)))) return false;
  } else {
    wire::MrShared e;
    uint64_t at = wr->wr.rdma.remote_addr;
    if (!peer_allows(pw, wr->wr.rdma.rkey, at, IBV_ACCESS_REMOTE_WRITE, len, &e) ||
        !(remote = shared_bytes(pw, e, at, len)))
      return false;
  }
  // The target spins on the line we write: from our first store into it to the last, no
  // atomic read-modify-write may stall us until that line is ours, or the target takes it
  // back in between and the message costs two more line transfers. So every key is
  // resolved before the first byte is copied, and the key lock is let go only after.
  iovec from[Limits::max_sge];
  std::shared_lock keys(MrTable::instance().lock(), std::defer_lock);
  if (!(wr->send_flags & IBV_SEND_INLINE)) keys.lock();
  int n = payload_iovecs(qp, wr, from);
  if (n < 0) {  // the general path reports the bad key
    if (send) window_unclaim(pw);
    return false;
  }
  iovec to{send ? static_cast<void*>(slot->data) : remote, len};
  wire::copy_local(&to, 1, from, n, len);
  if (send)
    window_commit(pw, *slot, wr->opcode, wr->send_flags, wr->imm_data, static_cast<uint32_t>(len));
  return true;
}

}  // namespace

bool post_now(Qp* qp, const ibv_send_wr* wr, uint64_t len) {
  if (qp->type == IBV_QPT_UD) return post_ud_now(qp, wr, len);  // shm_ud.cpp
  bool send = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM;
  if (!send && wr->opcode != IBV_WR_RDMA_WRITE) return false;
  // XRC goes through the target's agent: its XRC SRQ is named per message (verbs/xrc.cpp).
  if ((qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC) ||
      qp->send_path.route != wire::Route::Shm || !Device::instance().port_active())
    return false;
  // A SEND too large for the window's slots goes straight into the receive (shm_send_place.cpp).
  bool placed = send && len > wire::kWindowPayload;
  // send-small: one that fits a slot goes into the receive itself when its pages are shared.
  bool small_placed = send && !placed && post_placed_small(qp, wr, len);
  if (!small_placed && (placed ? !post_placed(qp, wr, len) : !copy_now(qp, wr, len, send)))
    return false;
  if (qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED)) {
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.opcode = send ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    wc.byte_len = static_cast<uint32_t>(len);
    wc.qp_num = qp->qpn();
    cq_push(qp->send_cq, wc, false);
  }
  return true;
}

}  // namespace softverbs::engine
