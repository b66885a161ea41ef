// The soft device as rdma_cm sees it: one context for the whole process (librpma takes
// id->verbs, destroys the id and keeps using the context), one PD for ids created without
// one, and addresses mapped to GIDs through the public verbs calls.
#include <fcntl.h>

#include <mutex>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "cm/cm.hpp"

namespace softverbs::cm {

namespace {

struct DeviceState {
  std::once_flag once;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_device_attr attr{};
  ibv_mtu mtu = IBV_MTU_1024;
  int gid_len = 0;
};

DeviceState& state() {
  static DeviceState s;  // never destroyed: the context outlives every id
  return s;
}

void open_device(DeviceState& s) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return;
  if (n > 0) s.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!s.ctx) return;
  s.pd = ibv_alloc_pd(s.ctx);
  ibv_query_device(s.ctx, &s.attr);
  ibv_port_attr port;
  if (ibv_query_port(s.ctx, 1, &port) == 0) {
    s.mtu = port.active_mtu;
    s.gid_len = port.gid_tbl_len;
  }
}

DeviceState& opened() {
  DeviceState& s = state();
  std::call_once(s.once, [&] { open_device(s); });
  return s;
}

// The GID an IP address has on a RoCE v2 port: IPv4 as ::ffff:a.b.c.d, IPv6 as it is.
bool gid_of(const sockaddr* addr, ibv_gid* gid) {
  std::memset(gid, 0, sizeof(*gid));
  if (addr->sa_family == AF_INET) {
    in_addr a = reinterpret_cast<const sockaddr_in*>(addr)->sin_addr;
    // The whole loopback net is the host itself: its one loopback GID.
    if ((ntohl(a.s_addr) >> 24) == 127) a.s_addr = htonl(INADDR_LOOPBACK);
    gid->raw[10] = gid->raw[11] = 0xff;
    std::memcpy(gid->raw + 12, &a, 4);
    return true;
  }
  if (addr->sa_family == AF_INET6) {
    std::memcpy(gid->raw, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, 16);
    return true;
  }
  return false;
}

bool is_wildcard(const sockaddr* addr) {
  if (addr->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (addr->sa_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return false;
}

}  // namespace

ibv_context* device_context() { return opened().ctx; }
ibv_pd* device_pd() { return opened().pd; }
// XRC (rdma_create_qp / rdma_create_srq with an XRC id): one XRC domain of the device's own
// (fd -1), opened at first use and kept, as librdmacm's ucma_get_xrcd does.
ibv_xrcd* device_xrcd() {
  static std::mutex mu;
  static ibv_xrcd* xrcd = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!xrcd && device_context()) {
    ibv_xrcd_init_attr attr{};
    attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    attr.fd = -1;
    attr.oflags = O_CREAT;
    xrcd = ibv_open_xrcd(device_context(), &attr);
  }
  return xrcd;
}
const ibv_device_attr& device_attr() { return opened().attr; }
enum ibv_mtu device_mtu() { return opened().mtu; }

int gid_index_of(const sockaddr* addr) {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return -1;
  if (is_wildcard(addr)) return -2;
  DeviceState& s = opened();
  ibv_gid want;
  if (!s.ctx || !gid_of(addr, &want)) return -1;
  if (addr->sa_family == AF_INET6 &&
      IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr)) {
    // ::1 is the host too: it uses the IPv4 loopback GID, which is always there.
    sockaddr_in lo{};
    lo.sin_family = AF_INET;
    lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    gid_of(reinterpret_cast<sockaddr*>(&lo), &want);
  }
  for (int i = 0; i < s.gid_len; ++i) {
    ibv_gid g;
    if (ibv_query_gid(s.ctx, 1, i, &g) == 0 && std::memcmp(g.raw, want.raw, 16) == 0) return i;
  }
  return -1;
}

int loopback_gid_index() {
  sockaddr_in lo{};
  lo.sin_family = AF_INET;
  lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return std::max(0, gid_index_of(reinterpret_cast<sockaddr*>(&lo)));
}

bool gid_at(int index, ibv_gid* out) {
  DeviceState& s = opened();
  return s.ctx && ibv_query_gid(s.ctx, 1, index, out) == 0;
}

bool is_multicast_addr(const sockaddr* addr) {
  if (!addr) return false;
  if (addr->sa_family == AF_INET)
    return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr));
  if (addr->sa_family == AF_INET6)
    return IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return false;
}

ibv_gid multicast_gid(const sockaddr* addr) {
  ibv_gid gid;
  gid_of(addr, &gid);
  return gid;
}

bool same_ip(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
  return false;
}

uint16_t port_of(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  if (addr->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  return 0;
}

void set_port(sockaddr_storage* addr, uint16_t port) {
  if (addr->ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(port);
  if (addr->ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(port);
}

socklen_t addr_len(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return sizeof(sockaddr_in);
  if (addr->sa_family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

}  // namespace softverbs::cm
