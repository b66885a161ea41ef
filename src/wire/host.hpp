// This host as the network sees it: its addresses, as RoCE v2 GIDs (IPv4-mapped for IPv4).
// The device's GID table is this list; the router uses it to tell a QP on this host from
// one on another host.
#pragma once

#include <infiniband/verbs.h>

#include <vector>

namespace softverbs::wire {

struct HostAddress {
  ibv_gid gid;
  int ifindex;
};

// The interfaces' IPv4 addresses first (GID 0 is one another host can reach, as on a
// RoCE NIC), then 127.0.0.1 (GID 0 when only lo is up), then IPv6 ones; at most 64.
// Every entry names this host (is_host_gid). Read from the interfaces on first use, and again on first
// use in a forked child (which may have moved to another network namespace).
const std::vector<HostAddress>& host_addresses();
bool is_host_gid(const ibv_gid& gid);
ibv_gid ipv4_mapped_gid(uint32_t addr_be);

}  // namespace softverbs::wire
