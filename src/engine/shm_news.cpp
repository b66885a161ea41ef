// A CQ's news (wire::CqNews): which receive windows its last messages went to, so that a
// CQ fed by many windows drains those, not every window per doorbell (issue 14, item 5;
// docs/object-model.md, "Receive windows: which to drain").
//
// Target side only: the requester's half is wire::tell_news, after its doorbell ticket.
// Everything read from the news is a hint from peers: an entry counts only if it carries the
// ticket expected at its place and an index that names a window of this CQ now; anything
// else (a requester between its ticket and its entry, one that died there, an entry
// overwritten by a newer ticket, garbage) and the caller looks at every window, as before.
#include <cstdlib>
#include <mutex>
#include <vector>

#include "engine/engine.hpp"
#include "core/core.hpp"
#include "core/slot_table.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

namespace {

// From this many windows on, requesters write news and the CQ reads it; 0 (the default):
// never. Off by default: on a quiet machine, ib_send_bw -s 4096 -q 256 -n 2000 (pinned,
// alternating, 2026-11-29) gave 6.0 / 8.0 / 8.5 GB/s with it at 8 windows and 9.3 / 8.9 /
// 13.7 without (the news line each message moves, and the looks at every window its
// count check still asks for). SOFTVERBS_NEWS_MIN=N turns it on (the twoproc_news tests).
size_t news_min() {
  static const size_t n = [] {
    const char* v = std::getenv("SOFTVERBS_NEWS_MIN");
    return v ? static_cast<size_t>(std::strtoul(v, nullptr, 0)) : size_t{0};
  }();
  return n;
}

// News blocks of destroyed CQs, kept for news only: a requester that still held the old
// CQ's address and writes an entry there spoils only another CQ's hint.
std::mutex g_free_mu;
std::vector<uint64_t>& g_free_blocks = *new std::vector<uint64_t>;

}  // namespace

bool news_enabled() { return news_min() != 0; }

void news_prepare(Cq* cq) {
  if (!news_enabled() || cq->news.load(std::memory_order_acquire) || !cq->shared_offset) return;
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
  if (off) {  // the old CQ's tickets go: the new doorbell counts from 0 again
    for (std::atomic<uint64_t>& e : arena->at<wire::CqNews>(off)->entry) e.store(0, std::memory_order_relaxed);
  } else {
    off = arena->allocate(sizeof(wire::CqNews));
  }
  if (!off) return;
  uint64_t none = 0;
  if (!cq->news_offset.compare_exchange_strong(none, off)) {  // another open won
    std::lock_guard<std::mutex> lock(g_free_mu);
    g_free_blocks.push_back(off);
    return;
  }
  cq->shared->news_offset = off;  // before any window of this CQ is handed to a requester
  cq->news.store(arena->at<wire::CqNews>(off), std::memory_order_release);
}

void news_release(Cq* cq) {
  const uint64_t off = cq->news_offset.exchange(0);
  cq->news.store(nullptr, std::memory_order_relaxed);
  if (!off) return;
  std::lock_guard<std::mutex> lock(g_free_mu);
  g_free_blocks.push_back(off);
}

void news_attach_locked(Cq* cq, Qp* t, wire::WindowHeader* hdr) {
  if (t->news_index == UINT32_MAX) t->news_index = slot_take(cq->news_qps, cq->news_free, t);
  hdr->news_index = t->news_index;
  if (news_min() && cq->inbound.size() >= news_min())
    cq->shared->news_on.store(1, std::memory_order_relaxed);
}

void news_detach_locked(Cq* cq, Qp* t) {
  if (t->news_index == UINT32_MAX) return;
  slot_give_back(cq->news_qps, cq->news_free, t->news_index);
  t->news_index = UINT32_MAX;
  if (cq->inbound.size() < news_min() / 2) cq->shared->news_on.store(0, std::memory_order_relaxed);
}

int news_windows_locked(Cq* cq, uint64_t from, uint64_t bell, Qp** out, int max, uint64_t* upto) {
  wire::CqNews* news = cq->news.load(std::memory_order_acquire);
  // from 0: the first look, or a look at every window asked for (doorbell_seen reset).
  if (!news || from == 0 || bell <= from || bell - from > wire::kNewsEntries ||
      !cq->shared->news_on.load(std::memory_order_relaxed))
    return -1;
  int n = 0;
  for (uint64_t t = from; t < bell; ++t) {
    const uint64_t e = news->entry[t % wire::kNewsEntries].load(std::memory_order_acquire);
    if (e >> wire::kNewsIndexBits != ((t + 1) & (~uint64_t{0} >> wire::kNewsIndexBits))) return -1;
    const uint32_t index = static_cast<uint32_t>(e & ((1u << wire::kNewsIndexBits) - 1));
    Qp* qp = index < cq->news_qps.size() ? cq->news_qps[index] : nullptr;
    if (!qp) return -1;
    bool seen = false;
    for (int i = 0; i < n && !seen; ++i) seen = out[i] == qp;
    if (seen) continue;
    if (n == max) {  // the rest of the tickets at the next look
      *upto = t;
      return n;
    }
    out[n++] = qp;
  }
  *upto = bell;
  return n;
}

}  // namespace softverbs::engine
