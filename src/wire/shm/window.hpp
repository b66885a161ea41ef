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
// costs the target one doorbell line and one slot line. The requester keeps its own copies
// of the counters and reads the target's only when they say the ring or the queue is full.
#pragma once

#include <atomic>
#include <cstdint>

namespace softverbs::wire {

inline constexpr uint32_t kWindowMagic = 0x5356574e;  // "SVWN"
inline constexpr uint32_t kWindowSlots = 32;
inline constexpr uint32_t kWindowPayload = 4096;

struct alignas(64) WindowSlot {
  std::atomic<uint64_t> seq;  // message number + 1, stored (release) after the rest
  uint32_t opcode;  // IBV_WR_SEND or IBV_WR_SEND_WITH_IMM
  uint32_t flags;   // send flags (IBV_SEND_SOLICITED matters)
  uint32_t imm;     // network order
  uint32_t length;
  uint64_t reserved;
  uint8_t data[kWindowPayload];  // the first 32 bytes share the line with seq
};

struct WindowHeader {
  uint32_t magic;
  std::atomic<uint32_t> live;  // 1 while the target QP takes messages through the ring
  uint32_t qpn;                // the target QP
  uint32_t peer_qpn;           // the one requester QP allowed to write
  uint64_t cq_offset;          // the target's receive CQ's CqShared, in the same arena
  uint64_t reserved;
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
  alignas(64) std::atomic<uint64_t> rq_posted;  // target: receives posted since opening
  alignas(64) std::atomic<uint64_t> rq_taken;   // receives already spoken for
  alignas(64) std::atomic<uint64_t> head;       // target: messages consumed
  // Followed by uint32_t rq_len[rq_cap]: byte capacity of receive #i (0: unusable), then
  // by WindowSlot slots[kWindowSlots] at slots_offset.
  uint32_t* rq_len() { return reinterpret_cast<uint32_t*>(this + 1); }
  WindowSlot* slots() {
    return reinterpret_cast<WindowSlot*>(reinterpret_cast<char*>(this) + slots_offset);
  }
};

inline uint64_t window_bytes(uint32_t rq_cap) {
  uint64_t slots = (sizeof(WindowHeader) + uint64_t{rq_cap} * 4 + 63) / 64 * 64;
  return slots + uint64_t{kWindowSlots} * sizeof(WindowSlot);
}

// CQ arm values, shared by the target and its requesters.
enum ArmWord : int { kArmNone = 0, kArmSolicited = 1, kArmNext = 2 };

// One entry of a process's published MR table, indexed by key >> 8. `key` is written last
// on registration and cleared first on deregistration; readers re-check it after reading.
struct MrShared {
  std::atomic<uint32_t> key;  // 0: free
  uint32_t access;
  uint64_t pd_token;
  uint64_t iova;
  uint64_t length;
  uint64_t addr;  // in the owner's address space
  uint64_t shm;   // offset of addr in the owner's MR memfd (wire/mr_shm.hpp), 0: not there
  uint64_t shm_length;  // bytes from addr on that are there (whole pages)
};
inline constexpr uint32_t kMrTableCap = 1u << 16;

// What a CQ shares with requesters in other processes, in its owner's arena.
struct CqShared {
  std::atomic<int> arm;            // ArmWord; changed only by CAS
  alignas(64) std::atomic<uint64_t> doorbell;  // bumped after each message put in a window
};

}  // namespace softverbs::wire
