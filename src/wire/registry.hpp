// The host registry: which process owns which block of QP numbers. A small file in the
// state directory, mapped by every softverbs process of the user; no daemon.
// A QPN is (slot << kQpnSlotShift) | index, so any process can tell from a QPN (learned
// out of band, e.g. by ibv_rc_pingpong's TCP exchange) which process to ask.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace softverbs::wire {

inline constexpr int kSlots = 1024;
inline constexpr int kQpnSlotShift = 14;
inline constexpr uint32_t kQpnIndexMask = (1u << kQpnSlotShift) - 1;

// getpid() without a system call (refreshed in a forked child).
pid_t self_pid();

// This process's slot, claimed on first use (and again in a forked child). A slot whose
// owner died is reclaimed. Returns 0 when no registry is available (then every QP is
// reachable only from this process).
int my_slot();
// The process registered in `slot`, or 0.
pid_t slot_owner(int slot);
inline int slot_of_qpn(uint32_t qpn) { return static_cast<int>(qpn >> kQpnSlotShift); }
// MR and memory window keys are host-wide, as a kernel's are for every process of one
// uverbs file (ibv_import_mr(3)): key = ((slot << kKeySlotShift) | index) << 8 | generation,
// so a key imported from another process never equals one of ours.
inline constexpr int kKeySlotShift = 14;
inline constexpr uint32_t kKeyIndexMask = (1u << kKeySlotShift) - 1;
inline int slot_of_key(uint32_t key) { return static_cast<int>(key >> (8 + kKeySlotShift)); }
inline uint32_t key_index(uint32_t key) { return (key >> 8) & kKeyIndexMask; }
// Flags a process publishes in its slot (cleared when the slot is claimed anew).
inline constexpr uint32_t kSlotHasGsi = 1;  // runs a QP1 agent (an rdma_cm MAD agent)
// The slot's process ended and handed its XRC TGT QPs that other processes still held to
// the entry's pid, which serves the slot's agent address (and RoCE datagrams) for them
// from then on; its own slot is in the bits above kSlotHostShift (verbs/xrc.cpp).
inline constexpr uint32_t kSlotAdopted = 2;
// ... taken after its process was killed: its TGT QPs were rebuilt in ERR, not handed over.
inline constexpr uint32_t kSlotAdoptedAfterDeath = 4;
// Another process holds a handle on a TGT QP of the slot's process: a newcomer leaves the
// slot, once its process is dead, to the holders (verbs/xrc.cpp) while others are free.
inline constexpr uint32_t kSlotSharedTgt = 8;
inline constexpr int kSlotHostShift = 16;
void set_my_slot_flag(uint32_t flag, bool on);
// The lowest slot other than `except` whose live owner has `flag` set, or -1.
int lowest_slot_with(uint32_t flag, int except);
// The slot of the live process `pid` when it has `flag` set, else -1.
int slot_of_pid_with(pid_t pid, uint32_t flag);
// The slot whose process serves `slot`: the adopter's for an adopted slot whose adopter
// lives, else `slot` itself.
int host_slot(int slot);
// At the adopter: takes `slot` over from its process `from` (still alive, handing it
// over), our own slot going in its flags. False if `from` does not hold it.
bool take_slot(int slot, pid_t from);
// A holder of a TGT QP of `slot`, whose process `dead` was killed, takes the slot
// (kSlotAdopted | kSlotAdoptedAfterDeath): false if another process (a holder, a newcomer)
// took it first. `dead` must have died (its pidfd said so).
bool take_dead_slot(int slot, pid_t dead);
// True when `slot` is adopted (a live adopter) after its process was killed.
bool adopted_after_death(int slot);
// The pid in `slot`'s entry when the slot is adopted (alive or not, kSlotAdopted set),
// else 0; *after_death tells whether it was taken after a kill.
pid_t adopter_of(int slot, bool* after_death);
// True when this process serves `slot` as its adopter (no system call: the RoCE port asks
// per datagram of a slot not its own).
bool hosted_by_me(int slot);
// Every adopted slot whose adopter lives, with the adopter's own slot.
std::vector<std::pair<int, int>> adopted_slots();
// The adopter lets go of an adopted slot (no TGT QP of it is left here): free for anyone.
void release_adopted_slot(int slot);

// The abstract Unix socket address of the agent serving `slot`.
std::string agent_address(int slot);

}  // namespace softverbs::wire
