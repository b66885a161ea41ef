// Multicast groups of this host: which UD QPs are attached to which multicast GID, shared by
// every softverbs process through files in the state directory (no daemon): attaching
// creates <state>/mcast/<gid>.<qpn> holding the owner's pid, detaching removes it. A send to
// a multicast GID goes to every QP attached at that moment; an entry whose process is gone
// (its registry slot now belongs to someone else) is dropped when it is met.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

namespace softverbs::wire {

// ff00::/8, or an IPv4-mapped 224.0.0.0/4 address (RoCE v2's GID for an IPv4 group).
bool is_multicast_gid(const ibv_gid& gid);

// 0, or an errno value (EINVAL for a non-multicast GID; attaching twice is not an error).
int mcast_attach(const ibv_gid& gid, uint32_t qpn);
// 0, or EINVAL when qpn is not attached to gid.
int mcast_detach(const ibv_gid& gid, uint32_t qpn);
// The QPs attached to gid now.
std::vector<uint32_t> mcast_members(const ibv_gid& gid);

}  // namespace softverbs::wire
