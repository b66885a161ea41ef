// The router: which path reaches a QP, from its GID and number. A GID names a host (one of
// this host's addresses, wire/host.hpp), a QPN a QP on it; on this host, the QPN's high bits
// name the process (wire/registry.hpp).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softverbs::wire {

enum class Route : uint8_t {
  Loop,       // a QP of this process
  Shm,        // a QP of another process of this host
  Roce,       // a QP on another host
  Multicast,  // a multicast group (UD)
};
inline constexpr int kRoutes = 4;

Route route(const ibv_gid& dgid, uint32_t dst_qpn);
const char* route_name(Route r);

}  // namespace softverbs::wire
