// A CQ's rung bits (wire::CqRung, CqShared::rung_*): which of its receive windows rang since
// it last looked, so that a CQ fed by many windows drains those, not every window per
// message (issue 14, item 5; docs/object-model.md, "Receive windows: which to drain").
//
// Target side only: the requester's half is wire::ring_cq. Every bit is a hint from peers:
// it names a window by our own table (an index of no window is cleared), and a set bit
// costs one look at a window. The owner also looks at every window now and then
// (verbs/cq.cpp), for bits a peer cleared.
#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/full_fence.hpp"
#include "core/completion_clock.hpp"
#include "engine/engine.hpp"
#include "core/core.hpp"
#include "core/slot_table.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

namespace {

// Rung blocks of destroyed CQs, kept for rung bits only: a requester that still held the
// old CQ's address and sets a bit there costs another CQ one look.
std::mutex g_free_mu;
std::vector<uint64_t>& g_free_blocks = *new std::vector<uint64_t>;

// How long an idle window keeps its bit set, and how many idle windows one look visits
// (the rest at the next look: a poll stays short however many windows were busy lately).
// SOFTVERBS_TEST_RUNG_IDLE_LOOKS=N sets the second (conformance.twoproc_many_windows: 4,
// so that its looks stop early and the cursor matters).
constexpr uint64_t kRungKeepNs = 1'000'000;
uint32_t rung_idle_looks() {
  static const uint32_t n = [] {
    const char* v = std::getenv("SOFTVERBS_TEST_RUNG_IDLE_LOOKS");
    const unsigned long x = v ? std::strtoul(v, nullptr, 0) : 0;
    return x ? static_cast<uint32_t>(x) : 64u;
  }();
  return n;
}

uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC) | 1; }  // never 0: "not idle"

// A leaf word found empty: its summary bit goes, then the word is read once more (a
// requester that made it non-zero meanwhile set the summary bit, or we set it back).
void clear_summary(std::atomic<uint64_t>& word, std::atomic<uint64_t>& summary, uint64_t mask) {
  summary.fetch_and(~mask, std::memory_order_seq_cst);
  full_fence();
  if (word.load(std::memory_order_relaxed)) summary.fetch_or(mask, std::memory_order_seq_cst);
}

}  // namespace

void rung_prepare(Cq* cq) {
  // Leaf indices are handed out only with the block there: make it when the direct ones
  // run short (a hint read without the lock, with room for 64 windows opening meanwhile;
  // one that finds no index rings the doorbell for good).
  if (cq->rung_block.load(std::memory_order_acquire) || !cq->shared_offset ||
      cq->rung_used.load(std::memory_order_relaxed) + 64 < wire::kRungDirect)
    return;
  wire::Arena* arena = wire::Arena::self();
  if (!arena) return;
  uint64_t off = 0;
  {
    std::lock_guard<std::mutex> lock(g_free_mu);
    if (!g_free_blocks.empty()) {
      off = g_free_blocks.back();
      g_free_blocks.pop_back();
    }
  }
  if (off) {  // a stale bit there would cost a look only; clear them anyway
    for (std::atomic<uint64_t>& w : arena->at<wire::CqRung>(off)->leaf) w.store(0, std::memory_order_relaxed);
  } else {
    off = arena->allocate(sizeof(wire::CqRung));
  }
  if (!off) return;
  uint64_t none = 0;
  if (!cq->rung_offset.compare_exchange_strong(none, off)) {  // another open won
    std::lock_guard<std::mutex> lock(g_free_mu);
    g_free_blocks.push_back(off);
    return;
  }
  cq->shared->rung_offset = off;  // before any leaf index is handed to a requester
  cq->rung_block.store(arena->at<wire::CqRung>(off), std::memory_order_release);
}

void rung_release(Cq* cq) {
  const uint64_t off = cq->rung_offset.exchange(0);
  cq->rung_block.store(nullptr, std::memory_order_relaxed);
  if (!off) return;
  std::lock_guard<std::mutex> lock(g_free_mu);
  g_free_blocks.push_back(off);
}

uint32_t rung_attach_locked(Cq* cq, Qp* t) {
  if (t->rung_index == wire::kRungNone) {
    const uint32_t index = slot_take(cq->rung_qps, cq->rung_free, t);
    // Beyond the bits there are (or a leaf one without its block): the doorbell.
    if (index >= wire::kRungMax ||
        (index >= wire::kRungDirect && !cq->rung_block.load(std::memory_order_acquire))) {
      slot_give_back(cq->rung_qps, cq->rung_free, index);
    } else {
      t->rung_index = index;
      cq->rung_used.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return t->rung_index;
}

void rung_detach_locked(Cq* cq, Qp* t) {
  if (t->rung_index == wire::kRungNone) return;
  slot_give_back(cq->rung_qps, cq->rung_free, t->rung_index);
  t->rung_index = wire::kRungNone;
  t->rung_idle_since = 0;
  cq->rung_used.fetch_sub(1, std::memory_order_relaxed);
}

bool rung_any(const Cq* cq) {
  const wire::CqShared* s = cq->shared;
  uint64_t any = 0;
  for (const auto& w : s->rung_direct) any |= w.load(std::memory_order_relaxed);
  for (const auto& w : s->rung_summary) any |= w.load(std::memory_order_relaxed);
  return any != 0;
}

void rung_resync_locked(Cq* cq) {
  // A leaf word with bits and no summary bit (a peer cleared it) would never be looked at:
  // its requesters find their bits set and ring no more.
  wire::CqRung* block = cq->rung_block.load(std::memory_order_acquire);
  if (!block) return;
  for (uint32_t leaf = 0; leaf < wire::kRungLeafWords; ++leaf)
    if (block->leaf[leaf].load(std::memory_order_relaxed))
      cq->shared->rung_summary[leaf / 64].fetch_or(uint64_t{1} << (leaf % 64), std::memory_order_seq_cst);
}

int rung_collect_locked(Cq* cq, Qp** out, int max) {
  wire::CqShared* s = cq->shared;
  wire::CqRung* block = cq->rung_block.load(std::memory_order_acquire);
  if (!block) {
    // No leaf index was handed out (attach reads the block under this lock too): summary
    // bits are a peer's garbage, or a stale requester's; left set they would keep every
    // poll of the CQ busy.
    for (auto& w : s->rung_summary)
      if (w.load(std::memory_order_relaxed)) w.store(0, std::memory_order_relaxed);
  }
  // Word i: direct word i, then leaf word i - kRungDirectWords (where its summary bit is
  // set). From the bit the last look stopped at, so that no window waits behind others:
  // that word's bits from the cursor on, every other word, then its bits below the cursor.
  const uint32_t words = block ? wire::kRungDirectWords + wire::kRungLeafWords : wire::kRungDirectWords;
  const uint32_t from = cq->rung_cursor < words * 64 ? cq->rung_cursor : 0;
  uint32_t w = from / 64;
  int n = 0;
  uint32_t idle_looks = rung_idle_looks();
  uint64_t now = 0;  // read once, at the first idle window
  for (uint32_t k = 0; k <= words; ++k, w = w + 1 == words ? 0 : w + 1) {
    const uint64_t at_or_above = ~uint64_t{0} << (from % 64);
    const uint64_t part = k == 0 ? at_or_above : k == words ? ~at_or_above : ~uint64_t{0};
    if (!part) continue;
    std::atomic<uint64_t>* word;
    std::atomic<uint64_t>* summary = nullptr;
    uint64_t summary_mask = 0;
    uint32_t base;
    if (w < wire::kRungDirectWords) {
      word = &s->rung_direct[w];
      base = w * 64;
    } else {
      const uint32_t leaf = w - wire::kRungDirectWords;
      summary = &s->rung_summary[leaf / 64];
      summary_mask = uint64_t{1} << (leaf % 64);
      if (!(summary->load(std::memory_order_relaxed) & summary_mask)) continue;
      word = &block->leaf[leaf];
      base = wire::kRungDirect + leaf * 64;
    }
    uint64_t bits = word->load(std::memory_order_acquire);
    if (!bits && summary) clear_summary(*word, *summary, summary_mask);
    for (bits &= part; bits; bits &= bits - 1) {
      const uint64_t mask = bits & -bits;
      const uint32_t index = base + static_cast<uint32_t>(__builtin_ctzll(bits));
      if (n == max || idle_looks == 0) {  // the rest from here at the next look
        cq->rung_cursor = index;
        return n;
      }
      Qp* qp = index < cq->rung_qps.size() ? cq->rung_qps[index] : nullptr;
      if (qp && window_waiting(qp)) {
        qp->rung_idle_since = 0;
        out[n++] = qp;
        continue;
      }
      --idle_looks;
      // Idle: its bit stays until the window has been idle for kRungKeepNs, so that a
      // requester streaming into it finds the bit set and writes nothing (clearing it
      // between messages cost ib_send_bw -q 16/256 -s 65536 3-5 %: the line went back and
      // forth once more per message).
      if (qp) {
        if (!now) now = monotonic_ns();
        if (!qp->rung_idle_since) qp->rung_idle_since = now;
        if (now - qp->rung_idle_since < kRungKeepNs) continue;
        qp->rung_idle_since = 0;
      }
      // Idle for a while (or no window): the bit goes, then one more look at the window. A
      // requester that found the bit still set put its message there before our second look.
      const uint64_t left = word->fetch_and(~mask, std::memory_order_seq_cst) & ~mask;
      full_fence();
      if (qp && window_waiting(qp)) out[n++] = qp;
      if (!left && summary) clear_summary(*word, *summary, summary_mask);
    }
  }
  return n;  // every set bit looked at: the next look may start where this one did
}

}  // namespace softverbs::engine
