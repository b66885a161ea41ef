// Steering inside the SO_REUSEPORT group on UDP port 4791 (decision 0006): the classic BPF
// program the kernel runs for every datagram to pick the group member (by index) that owns
// its destination QP, and the probe datagrams that tell which process sits at which index.
//
// The kernel (net/core/sock_reuseport.c) runs the program with the UDP payload at offset 0;
// an index at or past the group's size falls back to the flow hash. Indices follow join
// order, and a closing socket's hole is filled by the last one, so they change behind our
// back when a process dies: a probe round (port.cpp) re-learns them.
#pragma once

#include <linux/filter.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace softverbs::wire::roce {

// A probe is 16 bytes: this magic, the group index to deliver it to (big-endian), a token.
// The program sends it to that index; whoever gets it answers with a ProbeAnswer to the
// probe's source. The magic's first byte is a vendor-specific opcode rxe never sends.
inline constexpr uint32_t kProbeMagic = 0xff535650;   // 0xff 'S' 'V' 'P'
inline constexpr uint32_t kNudgeMagic = 0xff53564e;   // 0xff 'S' 'V' 'N': "re-learn, please"
inline constexpr uint32_t kAnswerMagic = 0xff535641;  // 0xff 'S' 'V' 'A'
inline constexpr uint32_t kProbeBytes = 16;
inline constexpr uint32_t kNoIndex = 0xffffffff;  // "let the kernel hash": past any group size

struct Probe {
  uint32_t magic;  // kProbeMagic or kNudgeMagic, big-endian on the wire
  uint32_t index;  // big-endian
  uint64_t token;
};
static_assert(sizeof(Probe) == kProbeBytes);

struct ProbeAnswer {
  uint32_t magic;  // kAnswerMagic
  uint32_t index;  // the probe's, as it came
  uint64_t token;  // the probe's
  int32_t slot;    // the answering process's registry slot
  int32_t pid;
};

struct Route {
  uint32_t slot;   // DestQP >> kQpnSlotShift
  uint32_t index;  // group index of the socket that owns it
};

// The program: probes and nudges of 16 bytes go to the index they carry; any other datagram
// of at least 8 bytes to the index of its DestQP's slot in `routes`, else to `fallback`;
// shorter ones to kNoIndex. `routes` need not be sorted; a slot listed twice keeps the
// first. Never more than BPF_MAXINSNS instructions for up to kSlots routes.
std::vector<sock_filter> steering_program(std::vector<Route> routes, uint32_t fallback);

// The slot a RoCE datagram is for (DestQP, payload bytes 5..7, >> kQpnSlotShift), or -1
// when it is too short to carry a BTH.
int destination_slot(const uint8_t* payload, size_t size);

}  // namespace softverbs::wire::roce
