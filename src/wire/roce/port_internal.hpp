// What port.cpp and port_steering.cpp share: constants, the probe round's state, the
// header of a forwarded datagram, and socket-address helpers. Private to wire/roce.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/registry.hpp"
#include "wire/roce/port.hpp"

namespace softverbs::wire::roce::detail {

// epoll tags of the port thread's file descriptors
// (the low 32 bits of epoll_event.data.u64; a multicast socket's fd is in the high 32).
inline constexpr uint32_t kTagGroup = 1, kTagForward = 2, kTagAnswers = 3, kTagTimer = 4,
                          kTagWake = 5, kTagMulticast = 6;
// The group socket receives with UDP_GRO: one buffer may hold a super-datagram of up to
// 64 KiB (several RoCE packets of one flow). The buffers are left uninitialised, so pages
// small datagrams never reach cost no memory.
inline constexpr int kBatch = 16;
inline constexpr size_t kRxBufferBytes = 65536;
inline constexpr size_t kMaxDatagram = 8192;  // IBA MTU 4096 + headers; longer ones are dropped
// IP_PKTINFO, IP_TOS, IPV6_PKTINFO (IPv4 on a dual-stack socket gets both) and UDP_GRO
inline constexpr size_t kControlBytes = 256;
// SOFTVERBS_NO_GRO=1: the kernel cuts super-datagrams before they reach the group socket.
bool gro_enabled();
inline constexpr uint64_t kInternalTimer = uint64_t(1) << 63;
inline constexpr uint64_t kRoundRetry = kInternalTimer | 1;
inline constexpr uint64_t kRoundDeadline = kInternalTimer | 2;
inline constexpr uint64_t kGroupRecheck = kInternalTimer | 3;
// An application that polls an empty CQ this many times in a row is waiting on it: the
// port's thread leaves the group socket to it (Port::poll_idle).
inline constexpr int kParkAfterIdlePolls = 4;
// SOFTVERBS_POLL_PARK=MICROSECONDS (default 1000, 0: never park): while the socket is left to
// a polling application, the port's thread looks this often whether it still polls, and
// takes the socket back once it stopped.
int64_t park_grace_from_env();
inline constexpr uint32_t kProbesPerStep = 16;
inline constexpr uint32_t kMaxProbes = kSlots + 64;
inline constexpr auto kRoundTimeout = std::chrono::milliseconds(50);
inline constexpr auto kRoundSpacing = std::chrono::milliseconds(5);  // between two of our rounds
inline constexpr auto kLockRetry = std::chrono::milliseconds(2);
// A Unix datagram socket queues only net.unix.max_dgram_qlen (10) datagrams: a forward
// waits this long for room, unless its owner was too slow a moment ago (stopped, say).
inline constexpr timeval kForwardWait = {0, 2000};
inline constexpr auto kForwardCongested = std::chrono::milliseconds(100);
// What a forwarded datagram carries before the payload: the addresses the owner would have
// seen, had the kernel given the datagram to it.
struct ForwardHeader {
  uint32_t magic;
  uint16_t src_port;
  uint8_t tos;
  uint8_t reserved;
  int32_t ifindex;
  uint8_t src[16];
  uint8_t dst[16];
};
inline constexpr uint32_t kForwardMagic = 0x53564657;  // "SVFW"

// Slot 0 (QP1, the CM's) and the last slot (QPN 0xffffff) belong to no process.
inline bool reserved_slot(int slot) { return slot == 0 || slot == kSlots - 1; }

// sockaddr for (address, port) in the family of our sockets; 0 when it has none.
socklen_t to_sockaddr(const IpAddress& ip, uint16_t port, bool ipv6, sockaddr_storage& out);
// setsockopt of an int.
int setopt(int fd, int level, int name, int value);
bool from_sockaddr(const sockaddr_storage& in, socklen_t len, IpAddress& ip, uint16_t& port);
sockaddr_un unix_sockaddr(const std::string& abstract_name, socklen_t& len);

}  // namespace softverbs::wire::roce::detail

namespace softverbs::wire::roce {

// A probe round in progress (only the port's thread touches it).
struct Port::Round {
  uint64_t token = 0;
  uint32_t sent = 0;
  std::vector<int> slot_at;  // the slot that answered for each index, -1 for none yet
};

}  // namespace softverbs::wire::roce
