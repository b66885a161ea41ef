// rdma_getaddrinfo(3): getaddrinfo(3) with the rdma_cm defaults (RC over the TCP port space
// for streams, UD over the UDP one for datagrams), one result, each member its own block.
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cm/cm.hpp"

namespace {

sockaddr* copy_addr(const sockaddr* a, socklen_t len) {
  auto* c = static_cast<sockaddr*>(malloc(len));
  if (c) std::memcpy(c, a, len);
  return c;
}

}  // namespace

extern "C" {

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = next;
  }
}

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                     rdma_addrinfo** res) {
  if (!res || (!node && !service)) return EAI_NONAME;
  rdma_addrinfo h{};
  if (hints) h = *hints;
  bool datagram = h.ai_port_space == RDMA_PS_UDP || h.ai_qp_type == IBV_QPT_UD;
  addrinfo want{};
  want.ai_family = h.ai_family;
  want.ai_socktype = datagram ? SOCK_DGRAM : SOCK_STREAM;
  if (h.ai_flags & RAI_PASSIVE) want.ai_flags |= AI_PASSIVE;
  if (h.ai_flags & RAI_NUMERICHOST) want.ai_flags |= AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(node, service, &want, &found)) return rc;
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  bool ok = r != nullptr;
  if (ok) {
    r->ai_flags = h.ai_flags;
    r->ai_family = found->ai_family;
    r->ai_qp_type = h.ai_qp_type ? h.ai_qp_type : (datagram ? IBV_QPT_UD : IBV_QPT_RC);
    r->ai_port_space = h.ai_port_space ? h.ai_port_space : (datagram ? RDMA_PS_UDP : RDMA_PS_TCP);
    if (h.ai_flags & RAI_PASSIVE) {
      r->ai_src_len = found->ai_addrlen;
      ok = (r->ai_src_addr = copy_addr(found->ai_addr, found->ai_addrlen)) != nullptr;
      if (ok && found->ai_canonname) ok = (r->ai_src_canonname = strdup(found->ai_canonname));
    } else {
      r->ai_dst_len = found->ai_addrlen;
      ok = (r->ai_dst_addr = copy_addr(found->ai_addr, found->ai_addrlen)) != nullptr;
      if (ok && found->ai_canonname) ok = (r->ai_dst_canonname = strdup(found->ai_canonname));
      if (ok && h.ai_src_addr && h.ai_src_len) {
        r->ai_src_len = h.ai_src_len;
        ok = (r->ai_src_addr = copy_addr(h.ai_src_addr, h.ai_src_len)) != nullptr;
      }
    }
  }
  freeaddrinfo(found);
  if (!ok) {
    rdma_freeaddrinfo(r);
    return EAI_MEMORY;
  }
  *res = r;
  return 0;
}

}  // extern "C"
