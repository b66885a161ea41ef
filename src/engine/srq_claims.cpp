// The receives of an SRQ shared with senders in other processes (wire::SrqShared,
// docs/send-placement.md "SRQ"), target side: numbering and publishing posted receives,
// the local consumers' claims, consuming receives in any order, and giving back claims
// that no message will use (a sender's void slot, a window closed with claims still out:
// its sender died between claim and commit, or the QP was reset).
#include <algorithm>
#include <sys/uio.h>

#include "engine/engine.hpp"
#include "core/core.hpp"
#include "core/device.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

static_assert(Limits::max_srq_wr <= wire::kSrqNumbers,
              "an SRQ's receives must all have their own owner word");

namespace {

uint32_t place_of(uint64_t number) { return static_cast<uint32_t>(number % wire::kSrqNumbers); }

// What a receive of an SRQ holds, 0 if its buffers fail the checks (key lock held, shared).
uint32_t srq_receive_capacity(Srq* srq, const RecvWqe& r) {
  iovec dst[Limits::max_sge];
  int n;
  int64_t cap = resolve_recv(srq->pd, r, dst, &n);
  return cap < 0 ? 0 : static_cast<uint32_t>(std::min<int64_t>(cap, UINT32_MAX));
}

void publish_given_back(Srq* srq, wire::SrqShared* sh) {
  sh->given_back.store(static_cast<uint32_t>(srq->given_back.size()), std::memory_order_release);
}

void raise_limit(Srq* srq) {
  if (srq->limit && srq->rq.size() - srq->consumed_ahead < srq->limit) {
    srq->limit = 0;  // one-shot, re-armed by ibv_modify_srq(IBV_SRQ_LIMIT)
    raise_srq_event(srq, IBV_EVENT_SRQ_LIMIT_REACHED);
  }
}

}  // namespace

uint64_t srq_shared_locked(Srq* srq, wire::Arena* arena) {
  if (wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed))
    return reinterpret_cast<char*>(sh) - arena->base();
  uint64_t off = arena->allocate(sizeof(wire::SrqShared));
  if (!off) return 0;
  auto* sh = arena->at<wire::SrqShared>(off);
  // Zeros: every owner word free for generation 0, nothing claimed.
  srq->popped = 0;
  srq->consumed_ahead = 0;
  srq->consumed.assign(wire::kSrqNumbers, 0);
  srq->given_back.clear();
  for (uint64_t i = 0; i < srq->rq.size(); ++i) {
    uint32_t cap = srq_receive_capacity(srq, srq->rq[i]);
    publish_place(sh->place[i], srq->rq[i], cap);
    sh->capacity[i].store(cap, std::memory_order_relaxed);
  }
  srq->posted = srq->rq.size();
  sh->posted.store(srq->posted, std::memory_order_release);
  srq->shared.store(sh, std::memory_order_release);
  return off;
}

uint32_t srq_new_claimer_locked(Srq* srq) {
  if (srq->next_claimer >= wire::kSrqLocal) return 0;  // 16 M windows on one SRQ: agent path
  return srq->next_claimer++;
}

void publish_srq_receive_locked(Srq* srq, const RecvWqe& r, bool keys_held) {
  wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed);
  if (!sh) return;
  uint32_t cap = keys_held ? srq_receive_capacity(srq, r) : 0;
  // Written before the receive is counted: a sender that sees the count sees its capacity
  // and where it lands (no place without the keys: capacity 0).
  publish_place(sh->place[place_of(srq->posted)], r, cap);
  sh->capacity[place_of(srq->posted)].store(cap, std::memory_order_relaxed);
  sh->posted.store(++srq->posted, std::memory_order_release);
}

bool srq_full_locked(Srq* srq) {
  return srq->rq.size() - srq->consumed_ahead >= srq->max_wr || srq->rq.size() >= wire::kSrqNumbers;
}

bool srq_take_local(Srq* srq, uint64_t* number) {
  wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed);
  if (!sh) {
    *number = 0;
    return !srq->rq.empty();
  }
  if (!srq->given_back.empty()) {  // first what a claimer gave back: it came first
    *number = *srq->given_back.begin();
    srq->given_back.erase(srq->given_back.begin());
    publish_given_back(srq, sh);
    return true;
  }
  *number = wire::srq_claim(sh, srq->posted, wire::kSrqLocal, 0);
  // Our own count bounds it; a number outside what we hold is a peer's garbage.
  return *number != wire::kSrqNone && *number >= srq->popped && *number < srq->posted &&
         !srq->consumed[place_of(*number)];
}

RecvWqe& srq_receive(Srq* srq, uint64_t number) {
  if (!srq->shared.load(std::memory_order_relaxed)) return srq->rq.front();
  return srq->rq[number - srq->popped];
}

void srq_consume(Srq* srq, uint64_t number) {
  wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed);
  if (!sh) {
    srq->rq.pop_front();
    raise_limit(srq);
    return;
  }
  srq->consumed[place_of(number)] = 1;
  ++srq->consumed_ahead;
  // Free for the receive that will be numbered number + kSrqNumbers.
  sh->owner[place_of(number)].store(wire::srq_tag(number + wire::kSrqNumbers, 0),
                                    std::memory_order_release);
  while (!srq->rq.empty() && srq->consumed[place_of(srq->popped)]) {
    srq->consumed[place_of(srq->popped)] = 0;
    srq->rq.pop_front();
    ++srq->popped;
    --srq->consumed_ahead;
  }
  raise_limit(srq);
}

void srq_give_back(Srq* srq, uint64_t number) {
  wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed);
  if (!sh) return;  // it never left the front
  // Ours until the next local consumer takes it: no sender can claim it again.
  sh->owner[place_of(number)].store(wire::srq_tag(number, wire::kSrqLocal), std::memory_order_release);
  srq->given_back.insert(number);
  publish_given_back(srq, sh);
}

bool srq_claimed_by(Srq* srq, uint64_t number, uint32_t claimer) {
  wire::SrqShared* sh = srq->shared.load(std::memory_order_relaxed);
  return sh && claimer && number >= srq->popped && number < srq->posted &&
         !srq->consumed[place_of(number)] &&
         sh->owner[place_of(number)].load(std::memory_order_acquire) == wire::srq_tag(number, claimer);
}

void srq_give_back_claimer(Srq* srq, uint32_t claimer) {
  if (!claimer) return;
  for (uint64_t n = srq->popped; n < srq->posted; ++n)
    if (srq_claimed_by(srq, n, claimer)) srq_give_back(srq, n);
}

}  // namespace softverbs::engine
