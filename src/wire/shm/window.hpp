// A receive window: how a requester in another process delivers small SENDs to a connected
// QP without waking anyone. The target publishes, in its shared arena, how many receives it
// has posted and how large each is; the requester checks that the next one is there and big
// enough (else it takes the agent path, which answers RNR / errors exactly), writes the
// message into a ring slot, and fires the target's CQ event only if that CQ is armed. The
// target's ibv_poll_cq drains the ring into its posted buffers and writes the completions.
//
// One requester (the connected peer QP) writes the slots and rq_taken; the target writes
// head and rq_posted (and rq_taken, for a receive a message through its agent used). Both
// sides treat what the other wrote as untrusted.
//
// Message #n (from 0) goes to slot n % kWindowSlots, whose `seq` is written last, as n + 1:
// the target polls that one word, and a small message shares its cache line, so a message
// costs the target one line of its CQ's rung bits and one slot line. The requester keeps its own copies
// of the counters and reads the target's only when they say the ring or the queue is full.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/full_fence.hpp"
#include "wire/registry.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/recv_place.hpp"

namespace softverbs::wire {

inline constexpr uint32_t kWindowMagic = 0x5356574e;  // "SVWN"
inline constexpr uint32_t kWindowSlots = 32;
inline constexpr uint32_t kWindowPayload = 4096;
// A slot to a QP of an SRQ that carries no message: its sender claimed `receive` and then
// could not use it (a bad key found after the claim); the target gives it back.
inline constexpr uint32_t kWindowVoid = 0x200;

struct alignas(64) WindowSlot {
  std::atomic<uint64_t> seq;  // message number + 1, stored (release) after the rest
  uint32_t opcode;  // IBV_WR_SEND or IBV_WR_SEND_WITH_IMM
  uint32_t flags;   // send flags (IBV_SEND_SOLICITED matters)
  uint32_t imm;     // network order
  uint32_t length;
  uint64_t receive;  // with kWindowPlaced: the receive (number since opening) it landed in;
                     // to a QP of an SRQ: the SRQ receive it claimed (SrqShared)
  uint8_t data[kWindowPayload];  // the first 32 bytes share the line with seq
};

struct WindowHeader {
  uint32_t magic;
  std::atomic<uint32_t> live;  // 1 while the target QP takes messages through the ring
  uint32_t qpn;                // the target QP
  uint32_t peer_qpn;           // the one requester QP allowed to write
  uint64_t cq_offset;          // the target's receive CQ's CqShared, in the same arena
  uint64_t srq_offset;         // the target QP's SRQ's SrqShared (same arena); 0: its own RQ
  uint32_t rq_cap;             // entries of rq_len (a power of two)
  uint32_t slots_offset;       // from the header to slots[0]
  // For RDMA WRITE/READ straight into/out of the target's memory: what the target's
  // responder would check (the QP's remote access and PD, the MR table) and its pid.
  std::atomic<uint32_t> qp_access;
  uint32_t max_dest_rd_atomic;
  uint64_t pd_token;
  uint64_t mr_table_offset;    // in the owner's read-only published region
  uint32_t mr_table_cap;
  int32_t owner_pid;
  uint32_t srq_claimer;        // with srq_offset: this window's `who` in SrqShared's owner words
  uint32_t rung_index;         // this window's bit in its CQ's rung words (CqRung)
  alignas(64) std::atomic<uint64_t> rq_posted;  // target: receives posted since opening
  alignas(64) std::atomic<uint64_t> rq_taken;   // receives already spoken for
  alignas(64) std::atomic<uint64_t> head;       // target: messages consumed
  // Followed by uint32_t rq_len[rq_cap]: byte capacity of receive #i (0: unusable), then
  // by RecvPlace places[rq_cap] (recv_place.hpp), then by WindowSlot slots[kWindowSlots]
  // at slots_offset.
  uint32_t* rq_len() { return reinterpret_cast<uint32_t*>(this + 1); }
  WindowSlot* slots() {
    return reinterpret_cast<WindowSlot*>(reinterpret_cast<char*>(this) + slots_offset);
  }
};

inline uint64_t window_bytes(uint32_t rq_cap) {
  uint64_t slots = window_places_at(sizeof(WindowHeader), rq_cap) + uint64_t{rq_cap} * sizeof(RecvPlace);
  return slots + uint64_t{kWindowSlots} * sizeof(WindowSlot);
}
inline RecvPlace* window_places(WindowHeader* hdr, uint32_t rq_cap) {
  return reinterpret_cast<RecvPlace*>(reinterpret_cast<char*>(hdr) +
                                      window_places_at(sizeof(WindowHeader), rq_cap));
}

// The receives of an SRQ whose QPs have receive windows (docs/send-placement.md, "SRQ").
// The target numbers its receives in the order posted (from 0 when the block was made) and
// publishes each one's capacity before it counts it in `posted`. Every consumer, a sender in
// another process before it commits a SEND to its QP's window as much as the target's own
// responders, claims the lowest unclaimed number with one compare-and-swap on that
// receive's `owner` word, which then names the claimer (`who`: the window's claimer id,
// kSrqLocal for the target itself) and the number's generation, so that:
//  - no receive is promised twice, and a message lands in exactly the receive it claimed
//    (a sender checked that one's capacity before claiming it);
//  - a claim whose sender died before committing its message is found by its tag and
//    given back by the target (engine/srq_claims.cpp).
// `claimed` is a hint (the lowest number perhaps unclaimed), advanced by whoever sees its
// number taken. `given_back` is nonzero while a receive given back waits for the target's
// own next consumer: senders then take the agent path, so that receive goes to the next
// message. All of it is peer-writable: see the trust notes in docs/send-placement.md.
inline constexpr uint32_t kSrqNumbers = 1u << 14;  // at least an SRQ's max_wr (checked in engine)
inline constexpr uint32_t kSrqLocal = 0xffffff;     // who: the target's own responders
inline constexpr uint64_t srq_tag(uint64_t number, uint32_t who) {
  return (number / kSrqNumbers) << 24 | who;  // who 0: free for `number`
}
inline constexpr uint64_t kSrqNone = UINT64_MAX;

struct SrqShared {
  alignas(64) std::atomic<uint64_t> posted;     // target: receives numbered below are posted
  std::atomic<uint32_t> given_back;             // target: see above
  alignas(64) std::atomic<uint64_t> claimed;    // hint: the lowest number perhaps unclaimed
  alignas(64) std::atomic<uint64_t> owner[kSrqNumbers];    // receive n at n % kSrqNumbers
  std::atomic<uint32_t> capacity[kSrqNumbers];  // target: receive n's bytes (0: not for senders)
  RecvPlace place[kSrqNumbers];  // target: where receive n lands (large SENDs, recv_place.hpp)
};

// Claims the lowest unclaimed receive numbered below `posted` for `who`, if it holds `len`
// bytes: its number, or kSrqNone (none left, too small, or garbage met: the agent path).
inline uint64_t srq_claim(SrqShared* s, uint64_t posted, uint32_t who, uint32_t len) {
  uint64_t c = s->claimed.load(std::memory_order_acquire);
  for (int tries = 0; tries < 1024; ++tries) {  // bounded: peers may keep changing it
    if (c >= posted) return kSrqNone;
    std::atomic<uint64_t>& e = s->owner[c % kSrqNumbers];
    uint64_t v = e.load(std::memory_order_acquire);
    if (v == srq_tag(c, 0)) {
      // Read while the number is still free: a capacity written for a later receive in
      // this place means c was taken meanwhile, and the swap below fails.
      if (s->capacity[c % kSrqNumbers].load(std::memory_order_relaxed) < len) return kSrqNone;
      if (!e.compare_exchange_strong(v, srq_tag(c, who), std::memory_order_acq_rel)) continue;
      uint64_t expect = c;
      s->claimed.compare_exchange_strong(expect, c + 1, std::memory_order_acq_rel);
      return c;
    }
    if (v >> 24 != c / kSrqNumbers || (v & kSrqLocal) == 0) return kSrqNone;  // garbage or older
    // Taken: move the hint on (or see where another moved it).
    uint64_t expect = c;
    c = s->claimed.compare_exchange_strong(expect, c + 1, std::memory_order_acq_rel) ? c + 1 : expect;
  }
  return kSrqNone;
}

// CQ arm values, shared by the target and its requesters.
enum ArmWord : int { kArmNone = 0, kArmSolicited = 1, kArmNext = 2 };

// One entry of a process's published MR table, indexed by key_index(key) (registry.hpp). `key` is written last
// on registration and cleared first on deregistration; readers re-check it after reading.
// A bound memory window has an entry too, for the part of its MR it opens: iova is where
// its remote addresses start (0 when zero-based), addr and shm where that part lies.
struct MrShared {
  std::atomic<uint32_t> key;  // 0: free
  uint32_t access;
  uint64_t pd_token;
  uint64_t iova;
  uint64_t length;
  uint64_t addr;  // in the owner's address space
  uint64_t shm;   // offset of addr in the owner's MR memfd (wire/mr_shm.hpp), 0: not there
  uint64_t shm_length;  // bytes from addr on that are there (whole pages)
  uint32_t qpn;   // a type 2 memory window: the one QP that may use it; 0: any of the PD
  uint32_t reserved;
};
inline constexpr uint32_t kMrTableCap = 1u << kKeySlotShift;  // every key of a process

// Copies the entry of `key` out of a peer's table (kMrTableCap entries) into *out: false
// when the index is out of range, or the entry holds another key before or after the copy
// (deregistered or reused meanwhile). The fields are the peer's word: check them after.
inline bool read_mr_entry(const MrShared* table, uint32_t key, MrShared* out) {
  const uint32_t index = key_index(key);
  if (!table || index == 0) return false;
  const MrShared& e = table[index];
  if (e.key.load(std::memory_order_acquire) != key) return false;
  out->access = e.access;
  out->pd_token = e.pd_token;
  out->iova = e.iova;
  out->length = e.length;
  out->addr = e.addr;
  out->shm = e.shm;
  out->shm_length = e.shm_length;
  out->qpn = e.qpn;
  return e.key.load(std::memory_order_acquire) == key;
}

// Which CQs of a completion channel a peer's wake-up is for, so that the waiter looks at
// those and not at every CQ of the channel. A CQ has bit (its slot in the channel) %
// kReadyBits; a requester that wakes the channel for an armed CQ sets the CQ's bit first,
// and writes the channel's wake-up fd only if the bit was clear (a bit already set has a
// wake-up coming, or the waiter's look at that CQ comes after our message: it takes the
// bit, then looks). Peers can write any bit, so the waiter treats them as hints
// (verbs/cq.cpp, get_cq_event): a bit without a CQ, or a CQ with nothing, costs one look;
// a wake-up beyond the bits taken (a peer cleared some) makes it look at every CQ.
inline constexpr uint32_t kReadyBits = 1024;
struct ReadyBits {
  std::atomic<uint64_t> words[kReadyBits / 64];
};
static_assert(sizeof(ReadyBits) == 128, "one small arena block (arena.cpp: kSmallBlock)");

// Sets `bit`; returns whether it was set already.
inline bool ready_set(ReadyBits& r, uint32_t bit) {
  const uint64_t mask = uint64_t{1} << (bit % 64);
  return r.words[bit / 64 % (kReadyBits / 64)].fetch_or(mask, std::memory_order_seq_cst) & mask;
}
inline void ready_clear(ReadyBits& r, uint32_t bit) {
  r.words[bit / 64 % (kReadyBits / 64)].fetch_and(~(uint64_t{1} << (bit % 64)),
                                                 std::memory_order_seq_cst);
}

// Which of a CQ's receive windows may hold messages (issue 14, item 5: a CQ fed by 1,000
// windows that looked at each one per message spent 15-25 µs a message). Each window of
// the CQ has a bit (its rung index, in the window's header; a UD QP's windows share the
// QP's). A requester, after putting a message in the window, sets the bit unless it is
// set already; the owner looks at the windows whose bits are set, and clears a bit only
// when it finds that window empty, then looks at the window once more. Both sides fence
// between their write and their read, so a message is always either seen by that second
// look or sets the bit again. While a window stays busy its bit stays set and its
// requester only reads it.
// Indices below kRungDirect are bits of the CQ's own line (rung_direct); the next
// kRungLeafWords * 64 are bits of a CqRung block, each of whose words has a summary bit
// (rung_summary), set while the word may be non-zero. A window with no index (beyond
// kRungMax, or no block yet) bumps the doorbell instead, and a new doorbell value makes the
// owner look at every window. Peers write all of this: a bit costs one look at a window; a
// bit a peer cleared delays that message until the owner looks at every window, which it
// does now and then (verbs/cq.cpp).
inline constexpr uint32_t kRungDirectWords = 4;
inline constexpr uint32_t kRungSummaryWords = 3;
inline constexpr uint32_t kRungLeafWords = kRungSummaryWords * 64;
inline constexpr uint32_t kRungDirect = kRungDirectWords * 64;            // 256
inline constexpr uint32_t kRungMax = kRungDirect + kRungLeafWords * 64;  // 12,544
inline constexpr uint32_t kRungNone = UINT32_MAX;
struct CqRung {
  std::atomic<uint64_t> leaf[kRungLeafWords];
};

// What a CQ shares with requesters in other processes, in its owner's arena.
struct CqShared {
  std::atomic<int> arm;            // ArmWord; changed only by CAS
  uint32_t ready_bit;              // this CQ's bit in its channel's ReadyBits
  uint64_t ready_offset;           // the channel's ReadyBits, same arena; 0: none
  uint64_t rung_offset;            // the CQ's CqRung, same arena; 0: none
  // One line, all an empty poll reads: bumped after each message of a window without a
  // rung index; the rung bits (above).
  alignas(64) std::atomic<uint64_t> doorbell;
  std::atomic<uint64_t> rung_summary[kRungSummaryWords];
  std::atomic<uint64_t> rung_direct[kRungDirectWords];
};
static_assert(sizeof(CqShared) <= 128, "one small arena block (arena.cpp: kSmallBlock)");
static_assert(offsetof(CqShared, rung_direct) + sizeof(CqShared::rung_direct) == 128,
              "the doorbell and the rung words share one cache line");

// Requester side: where our window's rung bit is, as the header said when it was opened
// (bounded here: the target's words are untrusted). 16 bytes, as what it replaced in
// PeerWindow: a larger one moved the fields after it and cost ib_send_lat -s 4096 0.06 µs.
struct RungBit {
  std::atomic<uint64_t>* word = nullptr;  // nullptr: no index (ring the doorbell)
  uint32_t index = kRungNone;
};
// `index` as the window's header said when it was opened; the CQ's block read once and
// bounded by the mapping (as ready_hint below).
inline RungBit rung_bit(const PeerArena& arena, CqShared* cq, uint32_t index) {
  if (index < kRungDirect) return {&cq->rung_direct[index / 64], index};
  if (index >= kRungMax) return {};
  const uint64_t offset = cq->rung_offset;
  CqRung* block = offset ? arena.at<CqRung>(offset, sizeof(CqRung)) : nullptr;
  return block ? RungBit{&block->leaf[(index - kRungDirect) / 64], index} : RungBit{};
}
// After a message is in the window: its bit (and its word's summary bit, when the word was
// empty) unless already set, or the doorbell. Also the fence between the message and the
// caller's look at the CQ's arm word.
inline void ring_cq(CqShared* cq, const RungBit& r) {
  if (!r.word) {
    cq->doorbell.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  const uint64_t mask = uint64_t{1} << (r.index % 64);
  full_fence();
  if (r.word->load(std::memory_order_relaxed) & mask) return;  // the owner will look
  if (r.word->fetch_or(mask, std::memory_order_seq_cst) == 0 && r.index >= kRungDirect) {
    const uint32_t leaf = (r.index - kRungDirect) / 64;
    cq->rung_summary[leaf / 64].fetch_or(uint64_t{1} << (leaf % 64), std::memory_order_seq_cst);
  }
}

// Requester side: the target CQ's bit in its channel's ReadyBits, as the CQ named it when
// the window was opened (bounded here: the target's word for it is untrusted).
struct ReadyHint {
  ReadyBits* bits = nullptr;  // nullptr: none (every wake-up writes the wake-up fd)
  uint32_t bit = 0;
};
inline ReadyHint ready_hint(const PeerArena& arena, const CqShared* cq) {
  const uint64_t offset = cq->ready_offset;
  const uint32_t bit = cq->ready_bit;
  ReadyBits* bits = offset && bit < kReadyBits ? arena.at<ReadyBits>(offset) : nullptr;
  return bits ? ReadyHint{bits, bit} : ReadyHint{};
}

// What a QP keeps of its receive window, target side (under the QP's rq_mu). The peer can
// write anywhere in the window, so what we index with is kept here, not read back.
struct InboundWindow {
  WindowSlot* slots = nullptr;
  uint32_t* rq_len = nullptr;
  uint32_t rq_cap = 0;
  uint32_t peer_qpn = 0;
  uint64_t posted = 0;  // receives published
  uint64_t head = 0;    // messages consumed
  // The window's block in our arena, given back when the window is closed (the writer
  // may still be alive: Arena::retire), and the process allowed to write it.
  uint64_t offset = 0;
  uint64_t bytes = 0;
  pid_t writer = 0;
  uint32_t srq_claimer = 0;  // QP of an SRQ: the writer's `who` in the SRQ's owner words
};

// Why a message could not take the window's next slot (PeerWindow::refused).
enum class WindowRefusal : uint8_t { None, RingFull, NoReceive, TooSmall, Srq };

// What a QP keeps of its peer's receive window, requester side, when the peer is another
// process of this host (under the QP's sq_mu).
struct PeerWindow {
  WindowHeader* hdr = nullptr;
  CqShared* cq = nullptr;
  const MrShared* mr_table = nullptr;  // kMrTableCap entries (read-only), or nullptr
  SrqShared* srq = nullptr;  // the target QP's SRQ, or nullptr (its own receive queue)
  uint32_t srq_claimer = 0;  // our `who` there
  uint64_t srq_number = 0;   // the receive window_slot claimed last
  // Checked once when the window was opened and never read back from the peer's memory:
  WindowSlot* slots = nullptr;
  const uint32_t* rq_len = nullptr;
  uint32_t rq_cap = 0;
  pid_t pid = 0;
  uint32_t dst_qpn = 0;
  uint64_t pd_token = 0;  // the target QP's PD, as the window said when opened
  uint32_t backoff = 0;  // operations to skip before asking for a window again
  bool cross_memory = true;  // false once the kernel refused cross-memory attach
  int wake_fd = -1;  // wakes the target's completion channel, or -1 (ask its agent)
  ReadyHint ready;   // the target CQ's bit in its channel's ReadyBits
  RungBit rung;      // our window's bit in the target CQ's rung words
  // Our own counts. The target's are read only when ours say the ring or its receive
  // queue is full, and rq_taken again after a message went through its agent.
  uint64_t tail = 0;    // messages written
  uint64_t taken = 0;   // receives spoken for
  uint64_t posted = 0;  // receives the target had published when last read
  uint64_t head = 0;    // messages the target had consumed when last read
  bool resync = true;   // read rq_taken before the next message
  // Why window_slot last said no (for the requester's counts of agent-path SENDs), and the
  // message (tail + 1) it last waited for room for: one wait per message, not one per try.
  WindowRefusal refused = WindowRefusal::None;
  uint64_t waited_at = 0;
  uint64_t* ring_waited = nullptr;  // the QP's count of waits that got room
  bool populated = false;  // its ring's pages faulted in when opened (shm_requester.cpp)
  // The mapping all of the above points into (one reference), with the peer's MR memfd
  // (arena.mr, or nullptr) and its size when last looked at.
  PeerArena arena;
  uint64_t mr_known = 0;
};

}  // namespace softverbs::wire
