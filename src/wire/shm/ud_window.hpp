// UD receive windows: how a UD QP in another process of this host delivers SENDs to a UD QP
// without waking anyone (issue 14, item 2). A UD QP has no connected peer, so the target
// keeps one window per sending QP, opened lazily through its agent on the sender's first
// datagram to it and cached by the sender (by destination QPN). Each window is a ring of
// kWindowSlots slots with one writer (that sender QP) and one reader (the target), as the
// RC/UC receive window (window.hpp) is, but UD-shaped:
//  - the sender does not look at posted receives: UD has no RNR, so a datagram that finds
//    no receive, or one too small, is dealt with by the target when it drains the ring;
//  - each slot carries what a UD receive completion needs besides the payload: the Q_Key
//    the target checks, and the GIDs its 40-byte GRH slot is built from.
//
// Message #n (from 0) goes to slot n % kWindowSlots, whose `seq` is written last, as n + 1;
// the target stores how many it consumed in `head`. A slot has the stride and the seq word
// of a WindowSlot, so a CQ fed by one window watches it the same way (Cq::solo_slots).
// The target reads each field once and checks it: the sender can write anything anywhere
// in the window at any time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "wire/shm/arena.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::wire {

inline constexpr uint32_t kUdWindowMagic = 0x53565544;  // "SVUD"
// One MTU: a UD message is one packet (bigger ones fail at the sender, IBA 10.8.3).
inline constexpr uint32_t kUdPayload = 4096;
// Windows per target QP (senders beyond it take the agent path), and destinations a
// sender QP keeps windows into (the least recently opened one makes room).
inline constexpr size_t kUdMaxWindows = 256;
inline constexpr size_t kUdMaxPeers = 64;

enum UdSlotOp : uint8_t { kUdSend = 0, kUdSendImm = 1 };
inline constexpr uint8_t kUdSolicited = 1;  // UdSlot::flags

struct alignas(64) UdSlot {
  std::atomic<uint64_t> seq;  // message number + 1, stored (release) after the rest
  uint16_t length;
  uint8_t opcode;  // UdSlotOp
  uint8_t flags;   // kUdSolicited
  uint32_t imm;    // network order
  uint32_t qkey;   // the effective Q_Key (the QP's own when the WR's high bit is set)
  uint8_t sgid[16];  // the GRH's source and destination, as the sender's AH gives them
  uint8_t dgid[16];
  uint8_t data[kUdPayload];  // the first 12 bytes share the line with seq
};
static_assert(offsetof(UdSlot, data) == 52, "a small datagram shares the line with seq");
static_assert(sizeof(UdSlot) == sizeof(WindowSlot) && offsetof(UdSlot, seq) == 0,
              "a CQ watches a UD window's next slot as it watches a WindowSlot");

struct UdWindowHeader {
  uint32_t magic;
  std::atomic<uint32_t> live;  // 1 while the target takes messages through the ring
  uint32_t qpn;                // the target UD QP
  uint32_t peer_qpn;           // the one sender QP allowed to write
  uint64_t cq_offset;          // the target's receive CQ's CqShared, in the same arena
  int32_t owner_pid;
  uint32_t slots_offset;       // from the header to slots[0]
  uint32_t rung_index;         // the target QP's bit in its CQ's rung words (window.hpp)
  alignas(64) std::atomic<uint64_t> head;  // target: messages consumed
  // Followed by UdSlot slots[kWindowSlots] at slots_offset.
};

inline constexpr uint64_t ud_window_slots_at() {
  return (sizeof(UdWindowHeader) + 63) / 64 * 64;
}
inline constexpr uint64_t ud_window_bytes() {
  return ud_window_slots_at() + uint64_t{kWindowSlots} * sizeof(UdSlot);
}

// Target side: one window of a UD QP (under the QP's ud_mu). What we index with is kept
// here, never read back from shared memory.
struct UdInboundWindow {
  UdWindowHeader* hdr = nullptr;
  UdSlot* slots = nullptr;
  uint32_t peer_qpn = 0;
  uint64_t head = 0;  // messages consumed
  // A lone window's count for the CQ to watch (see update_watch_locked), or nullptr.
  std::atomic<uint64_t>* watch = nullptr;
  // The block in our arena, given back (Arena::retire) when the window closes, and the
  // one process allowed to write it.
  uint64_t offset = 0;
  pid_t writer = 0;
};

// Sender side: a window into a UD QP of another process (under the sender QP's sq_mu).
// An entry without hdr remembers a destination that had none to give: it is asked again
// only after `backoff` more datagrams to it (they take the agent path meanwhile).
struct UdPeerWindow {
  uint32_t dst_qpn = 0;
  uint32_t backoff = 0;
  UdWindowHeader* hdr = nullptr;
  CqShared* cq = nullptr;
  UdSlot* slots = nullptr;  // checked once, when opened
  pid_t pid = 0;            // the target process, as the kernel named its agent
  int wake_fd = -1;         // wakes the target's completion channel, or -1 (ask its agent)
  ReadyHint ready;          // the target CQ's bit in its channel's ReadyBits
  RungBit rung;             // the target QP's bit in its CQ's rung words
  uint64_t tail = 0;        // messages written
  uint64_t head = 0;        // messages the target had consumed when last read
  uint64_t opened = 0;      // when (a count of opens), to pick the one to close for room
  PeerArena arena;          // one reference to the mapping hdr points into
};

}  // namespace softverbs::wire
