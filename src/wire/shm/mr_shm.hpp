// Registered memory in a shared mapping (docs/decisions/0005): the pages of a memory region
// that peers may access are moved into this process's "MR memfd" and mapped back at the same
// addresses, so that a peer which maps the memfd can copy into and out of them, and run CPU
// atomics on them, with no system call and no thread of ours. Only private anonymous memory
// whose region starts on a page boundary is moved; everything else keeps cross-memory attach.
// The memfd only grows (sealed against shrinking), so a valid offset never faults a peer.
// SOFTVERBS_NO_SHARED_MR=1 turns it off (then cross-memory attach, or the agent, moves data).
#pragma once

#include <cstddef>
#include <cstdint>

namespace softverbs::wire {

// Offsets below this are never handed out: 0 in an MR table entry means "not shared".
inline constexpr uint64_t kMrShmFirst = 4096;

// Moves the whole pages of [addr, addr + length) into the MR memfd (or finds them there from
// an earlier registration) and returns the memfd offset of `addr`, with the bytes from addr
// on that are shared in *shared; 0 when the region stays where it is. Each successful call
// must be paired with mr_shm_release.
uint64_t mr_shm_acquire(void* addr, size_t length, size_t* shared);
// Drops one registration's hold; with the last, the pages go back to private memory.
void mr_shm_release(void* addr);
// The MR memfd to hand to peers (read-write), or -1 (created on first use).
int mr_shm_fd();

}  // namespace softverbs::wire
