// rdma_getaddrinfo(3): getaddrinfo(3) with the rdma_cm defaults (RC over the TCP port space
// for streams, UD over the UDP one for datagrams), one result, each member its own block.
#include <netdb.h>
#include <netinet/in.h>

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
  // rdma_getaddrinfo(3): node, service or hints must be given; with hints alone the
  // result is built from them (their addresses copied).
  if (!res || (!node && !service && !hints)) {
    errno = EINVAL;
    return -1;
  }
  rdma_addrinfo h{};
  if (hints) h = *hints;
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!r) return EAI_MEMORY;
  bool ok = true;
  if (node || service) {
    addrinfo want{};
    want.ai_family = h.ai_family;
    bool datagram = h.ai_qp_type == IBV_QPT_UD || (!h.ai_qp_type && h.ai_port_space == RDMA_PS_UDP);
    bool stream = h.ai_qp_type == IBV_QPT_RC || h.ai_qp_type == IBV_QPT_UC ||
                  (!h.ai_qp_type && h.ai_port_space == RDMA_PS_TCP);
    want.ai_socktype = datagram ? SOCK_DGRAM : (stream ? SOCK_STREAM : 0);
    if (h.ai_flags & RAI_PASSIVE) want.ai_flags |= AI_PASSIVE;
    if (h.ai_flags & RAI_NUMERICHOST) want.ai_flags |= AI_NUMERICHOST;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(node, service, hints ? &want : nullptr, &found)) {
      free(r);
      return rc;
    }
    // One result, from the first address (as rdma-core).
    r->ai_family = found->ai_family;
    r->ai_qp_type = h.ai_qp_type ? h.ai_qp_type
                                 : (found->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC);
    r->ai_port_space = h.ai_port_space ? h.ai_port_space
                                       : (found->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP);
    bool passive = (want.ai_flags & AI_PASSIVE) && hints;
    r->ai_flags = passive ? RAI_PASSIVE : 0;
    sockaddr** addr = passive ? &r->ai_src_addr : &r->ai_dst_addr;
    socklen_t* len = passive ? &r->ai_src_len : &r->ai_dst_len;
    char** canon = passive ? &r->ai_src_canonname : &r->ai_dst_canonname;
    *len = found->ai_addrlen;
    ok = (*addr = copy_addr(found->ai_addr, found->ai_addrlen)) != nullptr;
    if (ok && found->ai_canonname) ok = (*canon = strdup(found->ai_canonname)) != nullptr;
    freeaddrinfo(found);
  } else {
    r->ai_flags = h.ai_flags;
    r->ai_family = h.ai_family;
    r->ai_qp_type = h.ai_qp_type;
    r->ai_port_space = h.ai_port_space;
    if (h.ai_dst_len && h.ai_dst_addr) {
      r->ai_dst_len = h.ai_dst_len;
      ok = (r->ai_dst_addr = copy_addr(h.ai_dst_addr, h.ai_dst_len)) != nullptr;
    }
  }
  // A source the caller gave is kept when the lookup did not produce one.
  if (ok && !r->ai_src_len && h.ai_src_len && h.ai_src_addr) {
    r->ai_src_len = h.ai_src_len;
    ok = (r->ai_src_addr = copy_addr(h.ai_src_addr, h.ai_src_len)) != nullptr;
  }
  if (!ok) {
    rdma_freeaddrinfo(r);
    return EAI_MEMORY;
  }
  *res = r;
  return 0;
}

}  // extern "C"
