#include "wire/router.hpp"

#include "wire/host.hpp"
#include "wire/registry.hpp"
#include "wire/shm/mcast.hpp"

namespace softverbs::wire {

Route route(const ibv_gid& dgid, uint32_t dst_qpn) {
  if (is_multicast_gid(dgid)) return Route::Multicast;
  if (!is_host_gid(dgid)) return Route::Roce;
  return slot_of_qpn(dst_qpn) == my_slot() ? Route::Loop : Route::Shm;
}

const char* route_name(Route r) {
  switch (r) {
    case Route::Loop: return "loop";
    case Route::Shm: return "shm";
    case Route::Roce: return "roce";
    case Route::Multicast: return "multicast";
  }
  return "?";
}

}  // namespace softverbs::wire
