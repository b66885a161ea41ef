// Receive placement: where each posted receive of a receive window (window.hpp) lands, so
// that a requester in another process can copy a SEND too large for the window's slots
// straight into the receive's buffers (docs/send-placement.md). The target writes one
// RecvPlace per posted receive, beside its capacity in rq_len, before it publishes
// rq_posted; the requester reads it once, checks every buffer against the target's
// read-only MR table (a key of the QP's PD with LOCAL_WRITE, the range inside the MR),
// copies, and puts a slot with kWindowPlaced in the ring: the target's drain then writes
// the completion exactly as for a message carried in the slot, without copying.
//
// The array lies in the window's block, between rq_len and the slots (window_bytes).
// Everything in it is untrusted to the requester: a receive it cannot check goes through
// the agent, which answers exactly (errors, RNR).
#pragma once

#include <cstdint>

namespace softverbs::wire {

// Buffers a receive may have and still be placed by the requester; more go via the agent.
inline constexpr uint32_t kPlaceSges = 3;

// Set in WindowSlot::opcode: the payload is already in the receive, slot.receive names it.
inline constexpr uint32_t kWindowPlaced = 0x100;

struct PlacedSge {
  uint64_t addr;  // as the receive's SGE says (the MR's iova space)
  uint32_t lkey;
  uint32_t length;
};

// One cache line per receive.
struct alignas(64) RecvPlace {
  uint32_t nsge;  // non-empty buffers; 0: the requester may not place into this receive
  uint32_t reserved;
  PlacedSge sge[kPlaceSges];
};
static_assert(sizeof(RecvPlace) == 64);

// Where the places start, from the window header, for a window of rq_cap receives: right
// after the header and rq_len, on a line of their own.
inline uint64_t window_places_at(uint64_t header_bytes, uint32_t rq_cap) {
  return (header_bytes + uint64_t{rq_cap} * 4 + 63) / 64 * 64;
}

}  // namespace softverbs::wire
