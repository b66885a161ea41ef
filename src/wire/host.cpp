#include "wire/host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

namespace softverbs::wire {

namespace {

std::vector<HostAddress> collect() {
  std::vector<HostAddress> v4, v6;
  uint32_t lo = htonl(INADDR_LOOPBACK);
  v4.push_back({ipv4_mapped_gid(lo), static_cast<int>(if_nametoindex("lo"))});
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
      if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
      int index = static_cast<int>(if_nametoindex(ifa->ifa_name));
      if (ifa->ifa_addr->sa_family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(ifa->ifa_addr);
        if (sin->sin_addr.s_addr == lo) continue;
        v4.push_back({ipv4_mapped_gid(sin->sin_addr.s_addr), index});
      } else if (ifa->ifa_addr->sa_family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr);
        ibv_gid gid{};
        std::memcpy(gid.raw, &sin6->sin6_addr, 16);
        v6.push_back({gid, index});
      }
    }
    freeifaddrs(list);
  }
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

const std::vector<HostAddress>& host_addresses() {
  static const std::vector<HostAddress>* list = new std::vector<HostAddress>(collect());
  return *list;
}

bool is_host_gid(const ibv_gid& gid) {
  for (const HostAddress& a : host_addresses())
    if (std::memcmp(a.gid.raw, gid.raw, 16) == 0) return true;
  return false;
}

}  // namespace softverbs::wire
