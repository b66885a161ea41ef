// The requester's hold on a connected peer's receive window (wire/shm/window.hpp), shared
// by the same-host fast paths: shm_requester.cpp (small SENDs in the window's slots, RDMA
// WRITE/READ, atomics) and shm_send_place.cpp (large SENDs placed in the receive).
// Caller holds qp->sq_mu throughout.
#pragma once

#include <sys/uio.h>

#include <optional>

#include "core/core.hpp"
#include "engine/engine.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::engine {

// The receive window of the peer QP `dst_qpn` in another process, opened through its agent
// the first time; nullptr when there is none to use.
wire::PeerWindow* peer_window(Qp* qp, uint32_t dst_qpn);
// The slot for the next message, of `len` bytes, when the ring has room and the next
// receive is posted and its published capacity holds len; nullptr: take the agent path.
wire::WindowSlot* window_slot(wire::PeerWindow* pw, uint32_t len);
// A receive of the target's SRQ that window_slot claimed goes back (nothing was committed).
void window_unclaim(wire::PeerWindow* pw);
// Hands the message in `s` to the target (the receive pw->taken is spoken for), and wakes
// its channel if its CQ is armed for it.
void window_commit(wire::PeerWindow* pw, wire::WindowSlot& s, uint32_t opcode, uint32_t flags,
                   uint32_t imm, uint32_t len);
// The target's bytes at `addr` (in the iova space of entry e, already checked to hold
// [addr, +len)), when its pages are in the target's MR memfd and mapped here; else nullptr.
char* shared_bytes(wire::PeerWindow* pw, const wire::MrShared& e, uint64_t addr, uint64_t len);

// The payload of a checked WR as iovecs: the application's addresses when inline, else its
// buffers through their keys (caller holds the key lock). Their count, or -1: a bad key.
int payload_iovecs(Qp* qp, const ibv_send_wr* wr, iovec* v);
// post_now's large SEND (shm_send_place.cpp): placed straight into the peer's next receive,
// no WQE built. False: nothing was done (or it must be done again): build the WQE.
// With shared_only: only when every buffer is in the target's shared pages (one memcpy).
bool post_placed(Qp* qp, const ibv_send_wr* wr, uint64_t len, bool shared_only = false);

// --- SENDs that fit the window's slots, placed too (issue 14 item 3, send-small) ---
// From this size on, a SEND that fits a slot is placed in the receive when the receive's
// buffers are in the target's shared pages (shm_send_place.cpp); below it the slot's one
// or few lines are cheaper than reading the receive's place and checking its keys.
inline constexpr uint64_t kPlaceSmallMin = 1024;
// post_now's and send_through_window's try at that: false (nothing happened) unless placed.
bool post_placed_small(Qp* qp, const ibv_send_wr* wr, uint64_t len);
std::optional<Outcome> send_placed_small(Qp* qp, const SendWqe& w, const iovec* local,
                                         int nlocal, uint32_t dst_qpn);
// --- end send-small ---

}  // namespace softverbs::engine
