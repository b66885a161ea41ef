// Large SENDs placed by the requester (docs/send-placement.md): to a connected QP of another
// process of this host, a SEND too large for the receive window's slots is copied straight
// into the buffers of the receive it will complete, as the target publishes them
// (wire/shm/recv_place.hpp), through the target's MR memfd where those pages are shared
// (decision 0005) or with one process_vm_writev where they are not. The completion then
// travels in the window's ring like a small SEND's, so it keeps its place among them.
// What cannot be done that way (no receive: RNR; one too small; a key that fails; a peer
// that went away) is left to the agent path, which answers exactly as the responder.
//
// Both sides are here: the target publishing where a receive lands, the requester placing.
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "engine/engine.hpp"
#include "engine/shm_peer.hpp"
#include "core/device.hpp"
#include "core/core.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/recv_place.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

// Target side. Caller holds the key lock (shared) and t->rq_mu.
void publish_place(wire::RecvPlace& p, const RecvWqe& r, uint32_t capacity) {
  uint32_t n = 0;
  bool placeable = capacity > 0;
  for (const Sge& s : r.sges) {
    if (!placeable) break;
    if (s.length == 0) continue;
    const Mr* mr = MrTable::instance().find(s.lkey);
    // An on-demand-paging MR's pages are faulted in by whoever lands the message: its agent.
    if (n == wire::kPlaceSges || !mr || (mr->access & IBV_ACCESS_ON_DEMAND)) {
      placeable = false;
      break;
    }
    p.sge[n++] = {s.addr, s.lkey, s.length};
  }
  p.nsge = placeable ? n : 0;
}

namespace {

// What the target's responder checks of a receive buffer, read from what it publishes: an
// MR (memory windows never have LOCAL_WRITE in the table) of the target QP's PD, with
// LOCAL_WRITE, holding [addr, +len). The entry's fields go to *out, read between two looks
// at its key.
bool receive_buffer_ok(const wire::PeerWindow* pw, uint32_t lkey, uint64_t addr, uint64_t len,
                       wire::MrShared* out) {
  if (!wire::read_mr_entry(pw->mr_table, lkey, out)) return false;
  if (out->pd_token != pw->pd_token || !(out->access & IBV_ACCESS_LOCAL_WRITE) || out->qpn != 0)
    return false;
  uint64_t iova = out->iova, length = out->length;
  return addr >= iova && len <= length && addr - iova <= length - len;
}

// Where the next message lands: the buffers of receive `receive`, as far as `len` bytes
// need them, each checked; in the target's shared pages (*shared, when all of them are
// there) and in its address space (cma), with their keys. Their count, or -1.
int place_of(const wire::PeerWindow* pw, uint64_t receive, uint32_t len, iovec* shared,
             bool* all_shared, iovec* cma, uint32_t* keys) {
  // (A QP of an SRQ: the SRQ's receive number `receive`, srq_claims.cpp.)
  const wire::RecvPlace& p =
      pw->srq ? pw->srq->place[receive % wire::kSrqNumbers]
              : wire::window_places(pw->hdr, pw->rq_cap)[receive & (pw->rq_cap - 1)];
  // Read once: the peer's memory may change under us.
  uint32_t nsge = p.nsge;
  if (nsge == 0 || nsge > wire::kPlaceSges) return -1;
  wire::PlacedSge sges[wire::kPlaceSges];
  for (uint32_t i = 0; i < nsge; ++i) sges[i] = p.sge[i];
  uint64_t left = len;
  int n = 0;
  *all_shared = true;
  for (uint32_t i = 0; i < nsge && left; ++i) {
    uint64_t take = std::min<uint64_t>(left, sges[i].length);
    if (take == 0) continue;
    wire::MrShared e;
    if (!receive_buffer_ok(pw, sges[i].lkey, sges[i].addr, take, &e)) return -1;
    cma[n] = {reinterpret_cast<void*>(e.addr + (sges[i].addr - e.iova)), take};
    char* there = shared_bytes(const_cast<wire::PeerWindow*>(pw), e, sges[i].addr, take);
    if (there) shared[n] = {there, take};
    else *all_shared = false;
    keys[n++] = sges[i].lkey;
    left -= take;
  }
  return left ? -1 : n;
}

// Places a SEND of `len` bytes from `local` in the next receive of the peer QP dst_qpn and
// hands its completion over; false: nothing was handed over (the agent path answers).
// With shared_only, only into buffers whose pages we map (one memcpy), else false.
bool place(Qp* qp, uint32_t dst_qpn, uint32_t opcode, uint32_t flags, uint32_t imm,
           const iovec* local, int nlocal, uint64_t len64, bool shared_only = false) {
  if (len64 > kMaxMsgSize || len64 > UINT32_MAX) return false;
  uint32_t len = static_cast<uint32_t>(len64);
  wire::PeerWindow* pw = peer_window(qp, dst_qpn);
  if (!pw || !pw->mr_table) return false;
  wire::WindowSlot* s = window_slot(pw, len);  // the next receive is there and holds len
  if (!s) return false;
  // An SRQ's receive was claimed by window_slot: one we do not use goes back (in order,
  // through the ring) before the agent path takes the message.
  uint64_t receive = pw->srq ? pw->srq_number : pw->taken;
  auto give_up = [pw] {
    window_unclaim(pw);
    return false;
  };
  iovec shared[wire::kPlaceSges], cma[wire::kPlaceSges];
  uint32_t keys[wire::kPlaceSges];
  bool all_shared;
  int n = place_of(pw, receive, len, shared, &all_shared, cma, keys);
  if (n < 0 || (shared_only && !all_shared)) return give_up();
  if (all_shared) {
    wire::copy_local(shared, n, local, nlocal, len);
  } else {
    if (!pw->cross_memory) return give_up();
    ssize_t done = process_vm_writev(pw->pid, local, nlocal, cma, n, 0);
    if (done < 0 && errno == EPERM) pw->cross_memory = false;
    // Part of it may have landed: the agent path lands it all again, or fails the receive.
    if (done != static_cast<ssize_t>(len)) return give_up();
  }
  // An MR deregistered while we copied: the agent answers for that receive (its buffers
  // are gone: LOC_PROT_ERR), as it would have before the copy.
  for (int i = 0; i < n; ++i)
    if (pw->mr_table[wire::key_index(keys[i])].key.load(std::memory_order_acquire) != keys[i]) return give_up();
  s->receive = receive;
  window_commit(pw, *s, opcode | wire::kWindowPlaced, flags, imm, len);
  return true;
}

}  // namespace

std::optional<Outcome> send_placed(Qp* qp, const SendWqe& w, const iovec* local, int nlocal,
                                   uint32_t dst_qpn) {
  if (!place(qp, dst_qpn, w.opcode, w.flags, w.imm, local, nlocal, w.total_length))
    return std::nullopt;
  return Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(w.total_length)};
}

bool post_placed(Qp* qp, const ibv_send_wr* wr, uint64_t len, bool shared_only) {
  iovec from[Limits::max_sge];
  int n;
  {
    // Only to translate, as execute() does: the memory is the application's and stays.
    std::shared_lock keys(MrTable::instance().lock(), std::defer_lock);
    if (!(wr->send_flags & IBV_SEND_INLINE)) keys.lock();
    n = payload_iovecs(qp, wr, from);
  }
  return n >= 0 && place(qp, qp->send_path.dest_qpn, wr->opcode, wr->send_flags, wr->imm_data,
                         from, n, len, shared_only);
}

// --- SENDs that fit the window's slots, placed too (issue 14 item 3, send-small) ---
// From kPlaceSmallMin bytes on, a SEND into a receive whose buffers are in the target's
// shared pages is placed like a large one: one memcpy (ours, into the receive) instead of
// two (ours into the slot, the target's out of it), and the slot it commits is one line.
// Where the receive is not shared, the slot is cheaper than a process_vm_writev: false.

std::optional<Outcome> send_placed_small(Qp* qp, const SendWqe& w, const iovec* local,
                                         int nlocal, uint32_t dst_qpn) {
  if (w.total_length < kPlaceSmallMin ||
      !place(qp, dst_qpn, w.opcode, w.flags, w.imm, local, nlocal, w.total_length, true))
    return std::nullopt;
  return Outcome{Outcome::Ack, IBV_WC_SUCCESS, 0, static_cast<uint32_t>(w.total_length)};
}

bool post_placed_small(Qp* qp, const ibv_send_wr* wr, uint64_t len) {
  return len >= kPlaceSmallMin && post_placed(qp, wr, len, true);
}
// --- end send-small ---

}  // namespace softverbs::engine
