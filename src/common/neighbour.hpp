// The kernel's neighbour table (ARP / IPv6 ND) seen from user space, for rdma_resolve_addr
// between hosts: the kernel's ib_addr (drivers/infiniband/core/addr.c) gives
// ADDR_RESOLVED only once the route's next hop has a valid neighbour entry, and
// ADDR_ERROR -ETIMEDOUT when it never gets one within the caller's timeout. Without root
// we cannot send ARP ourselves; a datagram to the destination makes the kernel resolve
// the next hop, and rtnetlink tells its state. Nothing here blocks longer than a netlink
// round trip.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace softverbs {

// Where the kernel sends a packet for a destination: the interface and the next hop (the
// destination itself on a directly connected subnet, else the gateway).
struct NextHop {
  int ifindex = 0;
  sockaddr_storage addr{};  // port 0
  // The interface needs no neighbour (loopback, IFF_NOARP): resolved as it is.
  bool no_neighbour = false;
};

// The next hop of the kernel's route to `dst` (RTM_GETROUTE). 0, or the errno the kernel's
// route lookup gives (ENETUNREACH, EHOSTUNREACH, ...), or the netlink socket's error.
int route_next_hop(const sockaddr* dst, NextHop* out);

enum class NeighbourState {
  kValid,    // REACHABLE, STALE, DELAY, PROBE, PERMANENT, NOARP: the kernel's NUD_VALID
  kPending,  // INCOMPLETE, or no entry yet
  kFailed,   // FAILED: the probes went unanswered
};

// The state of the next hop's neighbour entry (RTM_GETNEIGH dump of its interface).
NeighbourState neighbour_state(const NextHop& hop);

// Makes the kernel resolve `dst`'s next hop: one empty UDP datagram to `dst`'s discard
// port (9), as any first packet would. Errors are ignored: the state says what happened.
void provoke_neighbour(const sockaddr* dst);

}  // namespace softverbs
