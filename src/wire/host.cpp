// This host's addresses as GIDs (host.hpp): read from getifaddrs, per fork generation.
#include "wire/host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>

#include <atomic>
#include <cstring>

namespace softverbs::wire {

namespace {

// As a RoCE NIC lists its netdev's addresses: the interfaces' IPv4 addresses first, so GID 0
// is one another host can reach (UCX, perftest and others take the first IPv4 GID), then
// 127.0.0.1 (index 0 when only lo is up), then IPv6. No separate fe80 default GID first, as
// rxe has: the interfaces' link-locals are in the IPv6 part, and a unicast send to one
// carries no scope (port.cpp), so it would be a GID 0 other hosts could not use.
std::vector<HostAddress> collect() {
  std::vector<HostAddress> v4, v4_loopback, v6;
  uint32_t lo = htonl(INADDR_LOOPBACK);
  // 127.0.0.1 is always there (same-host programs name it, lo up or not), first of its group.
  v4_loopback.push_back({ipv4_mapped_gid(lo), static_cast<int>(if_nametoindex("lo"))});
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
      if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
      int index = static_cast<int>(if_nametoindex(ifa->ifa_name));
      if (ifa->ifa_addr->sa_family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(ifa->ifa_addr);
        if (sin->sin_addr.s_addr == lo) continue;
        // Other addresses of lo (127.0.0.2, ...) reach no other host either: after 127.0.0.1.
        auto& group = (ifa->ifa_flags & IFF_LOOPBACK) ? v4_loopback : v4;
        group.push_back({ipv4_mapped_gid(sin->sin_addr.s_addr), index});
      } else if (ifa->ifa_addr->sa_family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr);
        ibv_gid gid{};
        std::memcpy(gid.raw, &sin6->sin6_addr, 16);
        v6.push_back({gid, index});
      }
    }
    freeifaddrs(list);
  }
  if (v4.size() > 63) v4.resize(63);  // 127.0.0.1 keeps its place within the 64
  v4.insert(v4.end(), v4_loopback.begin(), v4_loopback.end());
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.size() > 64) v4.resize(64);
  return v4;
}

}  // namespace

ibv_gid ipv4_mapped_gid(uint32_t addr_be) {
  ibv_gid gid{};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  std::memcpy(&gid.raw[12], &addr_be, 4);
  return gid;
}

namespace {

// One reading of the interfaces, tagged with the fork generation it was made in.
struct Snapshot {
  unsigned generation;
  std::vector<HostAddress> list;
};
std::atomic<unsigned> g_generation{0};  // bumped in every forked child
std::atomic<const Snapshot*> g_snapshot{nullptr};

}  // namespace

const std::vector<HostAddress>& host_addresses() {
  // A forked child reads the interfaces again on first use: it may have entered another
  // network namespace first (setns), becoming a process of another host, as the between-
  // hosts tests' forked peers do. A snapshot, once handed out, is never freed (callers
  // keep references); a process makes one, plus one per fork that asks again.
  static const bool registered =
      (pthread_atfork(nullptr, nullptr, [] { g_generation.fetch_add(1, std::memory_order_relaxed); }), true);
  (void)registered;
  unsigned generation = g_generation.load(std::memory_order_relaxed);
  const Snapshot* s = g_snapshot.load(std::memory_order_acquire);
  if (s && s->generation == generation) return s->list;
  auto* fresh = new Snapshot{generation, collect()};
  if (g_snapshot.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return fresh->list;
  delete fresh;  // another thread was first
  return s->list;
}

bool is_host_gid(const ibv_gid& gid) {
  for (const HostAddress& a : host_addresses())
    if (std::memcmp(a.gid.raw, gid.raw, 16) == 0) return true;
  return false;
}

}  // namespace softverbs::wire
