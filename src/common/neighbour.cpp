// The kernel's route and neighbour tables over rtnetlink (neighbour.hpp says why).
#include "common/neighbour.hpp"

#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace softverbs {

namespace {

constexpr size_t kReplyBytes = 32768;

// The address bytes of an AF_INET / AF_INET6 socket address, and their length.
const void* ip_bytes(const sockaddr* a, size_t* len) {
  if (a->sa_family == AF_INET) {
    *len = 4;
    return &reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
  }
  *len = 16;
  return &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
}

void set_ip(int family, const void* bytes, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  out->ss_family = sa_family_t(family);
  if (family == AF_INET)
    std::memcpy(&reinterpret_cast<sockaddr_in*>(out)->sin_addr, bytes, 4);
  else
    std::memcpy(&reinterpret_cast<sockaddr_in6*>(out)->sin6_addr, bytes, 16);
}

// A NETLINK_ROUTE socket that gives up on a reply after a second (the kernel answers a
// GET in the sender's own call; the limit is only against the unexpected).
int open_rtnl() {
  int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (s < 0) return -1;
  timeval tv{1, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

// Calls on_msg for every message of the reply to the request with sequence `seq`, until
// NLMSG_DONE or, for a non-dump request, the first answer. Returns 0 or an errno value
// (an NLMSG_ERROR's). on_msg returns false to stop early.
template <typename F>
int read_reply(int s, uint32_t seq, bool dump, F&& on_msg) {
  static thread_local char buf[kReplyBytes];
  for (;;) {
    ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n < 0) return errno == EINTR ? EINTR : errno;
    size_t left = size_t(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq != seq) continue;  // not ours (a stale reply)
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return EIO;
        int err = -static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
        return err > 0 ? err : 0;  // 0: an ACK
      }
      if (!on_msg(h) || !dump) return 0;
    }
  }
}

// The flags of interface `ifindex` (SIOCGIFFLAGS), 0 when unknown.
int interface_flags(int ifindex) {
  char name[IF_NAMESIZE];
  if (!if_indextoname(unsigned(ifindex), name)) return 0;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name, sizeof ifr.ifr_name);
  int flags = ioctl(s, SIOCGIFFLAGS, &ifr) == 0 ? ifr.ifr_flags : 0;
  close(s);
  return flags;
}

}  // namespace

int route_next_hop(const sockaddr* dst, NextHop* out) {
  if (dst->sa_family != AF_INET && dst->sa_family != AF_INET6) return EAFNOSUPPORT;
  size_t len;
  const void* ip = ip_bytes(dst, &len);
  struct {
    nlmsghdr h;
    rtmsg r;
    char attrs[64];
  } req{};
  req.h.nlmsg_type = RTM_GETROUTE;
  req.h.nlmsg_flags = NLM_F_REQUEST;
  req.h.nlmsg_seq = 1;
  req.r.rtm_family = uint8_t(dst->sa_family);
  req.r.rtm_dst_len = uint8_t(len * 8);
  auto* a = reinterpret_cast<rtattr*>(req.attrs);
  a->rta_type = RTA_DST;
  a->rta_len = uint16_t(RTA_LENGTH(len));
  std::memcpy(RTA_DATA(a), ip, len);
  req.h.nlmsg_len = uint32_t(NLMSG_LENGTH(sizeof(rtmsg)) + RTA_ALIGN(a->rta_len));
  int s = open_rtnl();
  if (s < 0) return errno;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(s, &req, req.h.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    int err = errno;
    close(s);
    return err;
  }
  *out = NextHop{};
  set_ip(dst->sa_family, ip, &out->addr);  // on-link: the destination is the next hop
  bool answered = false;
  int err = read_reply(s, 1, false, [&](const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(rtmsg))) return true;
    answered = true;
    auto* r = static_cast<const rtmsg*>(NLMSG_DATA(h));
    int attr_len = int(h->nlmsg_len - NLMSG_LENGTH(sizeof(rtmsg)));
    for (auto* at = RTM_RTA(r); RTA_OK(at, attr_len); at = RTA_NEXT(at, attr_len)) {
      size_t n = RTA_PAYLOAD(at);
      if (at->rta_type == RTA_OIF && n >= 4) {
        std::memcpy(&out->ifindex, RTA_DATA(at), 4);
      } else if (at->rta_type == RTA_GATEWAY && n == len) {
        set_ip(dst->sa_family, RTA_DATA(at), &out->addr);
      } else if (at->rta_type == RTA_VIA && n >= sizeof(rtvia)) {
        // An IPv4 route through an IPv6 gateway (or back).
        auto* via = static_cast<const rtvia*>(RTA_DATA(at));
        size_t via_len = via->rtvia_family == AF_INET ? 4 : via->rtvia_family == AF_INET6 ? 16 : 0;
        if (via_len && n >= sizeof(rtvia) + via_len) set_ip(via->rtvia_family, via->rtvia_addr, &out->addr);
      }
    }
    return false;
  });
  close(s);
  if (err) return err;
  if (!answered || out->ifindex <= 0) return EHOSTUNREACH;
  out->no_neighbour = (interface_flags(out->ifindex) & (IFF_LOOPBACK | IFF_NOARP)) != 0;
  return 0;
}

NeighbourState neighbour_state(const NextHop& hop) {
  if (hop.no_neighbour) return NeighbourState::kValid;
  int family = hop.addr.ss_family;
  size_t len;
  const void* ip = ip_bytes(reinterpret_cast<const sockaddr*>(&hop.addr), &len);
  struct {
    nlmsghdr h;
    ndmsg n;
  } req{};
  req.h.nlmsg_len = NLMSG_LENGTH(sizeof(ndmsg));
  req.h.nlmsg_type = RTM_GETNEIGH;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.h.nlmsg_seq = 2;
  req.n.ndm_family = uint8_t(family);
  req.n.ndm_ifindex = hop.ifindex;  // a filter for kernels that take it; checked below anyway
  int s = open_rtnl();
  if (s < 0) return NeighbourState::kPending;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(s, &req, req.h.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    close(s);
    return NeighbourState::kPending;
  }
  uint16_t nud = 0;
  bool found = false;
  read_reply(s, 2, true, [&](const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWNEIGH || h->nlmsg_len < NLMSG_LENGTH(sizeof(ndmsg))) return true;
    auto* n = static_cast<const ndmsg*>(NLMSG_DATA(h));
    if (n->ndm_ifindex != hop.ifindex || n->ndm_family != family) return true;
    int attr_len = int(h->nlmsg_len - NLMSG_LENGTH(sizeof(ndmsg)));
    auto* at = reinterpret_cast<const rtattr*>(reinterpret_cast<const char*>(n) + NLMSG_ALIGN(sizeof(ndmsg)));
    for (; RTA_OK(at, attr_len); at = RTA_NEXT(at, attr_len)) {
      if (at->rta_type == NDA_DST && RTA_PAYLOAD(at) == len && std::memcmp(RTA_DATA(at), ip, len) == 0) {
        nud = n->ndm_state;
        found = true;
        return false;
      }
    }
    return true;
  });
  close(s);
  if (!found) return NeighbourState::kPending;
  constexpr uint16_t kValid = NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_PROBE | NUD_STALE | NUD_DELAY;
  if (nud & kValid) return NeighbourState::kValid;
  if (nud & NUD_FAILED) return NeighbourState::kFailed;
  return NeighbourState::kPending;
}

void provoke_neighbour(const sockaddr* dst) {
  int s = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return;
  sockaddr_storage to{};
  size_t len;
  set_ip(dst->sa_family, ip_bytes(dst, &len), &to);
  socklen_t to_len = dst->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (dst->sa_family == AF_INET6)  // a link-local destination needs its scope
    reinterpret_cast<sockaddr_in6*>(&to)->sin6_scope_id = reinterpret_cast<const sockaddr_in6*>(dst)->sin6_scope_id;
  constexpr uint16_t kDiscardPort = 9;
  if (dst->sa_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&to)->sin_port = htons(kDiscardPort);
  else
    reinterpret_cast<sockaddr_in6*>(&to)->sin6_port = htons(kDiscardPort);
  (void)!sendto(s, "", 0, 0, reinterpret_cast<sockaddr*>(&to), to_len);
  close(s);
}

}  // namespace softverbs
