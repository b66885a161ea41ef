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

// 127.0.0.1 first, so GID index 0 always names this host, then the other IPv4 addresses,
// then IPv6 ones; at most 64. Read from the interfaces on first use, and again on first
// use in a forked child (which may have moved to another network namespace).
const std::vector<HostAddress>& host_addresses();
bool is_host_gid(const ibv_gid& gid);
ibv_gid ipv4_mapped_gid(uint32_t addr_be);

}  // namespace softverbs::wire
