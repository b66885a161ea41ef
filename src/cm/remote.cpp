// rdma_cm between hosts: the IB CM (ib_cm.hpp) over this process's QP1 agent, a UD QP made
// with IBV_QP_CREATE_SOURCE_QPN = 1 through the public verbs (docs/decisions/0007), and the
// address resolution for other hosts' addresses (the kernel's routing table picks the
// source address). The ids' side of it: their events, as service.cpp makes them for peers
// on this host. Everything here runs under g_mu, from the application's calls or from the
// service thread (the agent's completion channel and the CM's timers).
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cm/cm.hpp"
#include "cm/ib_cm.hpp"
#include "cm/orphans.hpp"
#include "cm/random.hpp"
#include "common/neighbour.hpp"

namespace softverbs::cm {

namespace {

namespace wr = wire::roce;

// As the kernel's MAD layer (mad_recvq_size 512, mad_sendq_size 128): a burst of REQs, as
// cmtime makes (one per connection, all at once), must not find the receive queue empty,
// where a UD QP drops the datagram and only the 6.4 s resend would bring it back. Sends
// beyond the send queue wait in `backlog` (the kernel's overflow list), not dropped.
constexpr int kRecvs = 4096;
constexpr int kSends = 128;
constexpr size_t kMaxBacklog = 8192;  // beyond that the CM's timers resend
constexpr size_t kGrh = 40;
constexpr size_t kRecvBytes = kGrh + wr::kMadBytes;

ib::Time now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

wr::Gid to_gid(const ibv_gid& g) {
  wr::Gid out;
  std::memcpy(out.data(), g.raw, 16);
  return out;
}

ibv_gid from_gid(const wr::Gid& g) {
  ibv_gid out;
  std::memcpy(out.raw, g.data(), 16);
  return out;
}

bool is_v4_mapped(const wr::Gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.data(), prefix, 12) == 0;
}

// The socket address of a GID (IPv4-mapped: AF_INET), with a port.
void gid_to_sockaddr(const wr::Gid& g, uint16_t port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  if (is_v4_mapped(g)) {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, g.data() + 12, 4);
    sin->sin_port = htons(port);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
    sin6->sin6_family = AF_INET6;
    std::memcpy(&sin6->sin6_addr, g.data(), 16);
    sin6->sin6_port = htons(port);
  }
}

// rdma_cm's private-data header (cma_hdr) from/to socket addresses.
wr::CmaHeader cma_header(const sockaddr* src, const sockaddr* dst) {
  wr::CmaHeader h;
  h.ip_version = src->sa_family == AF_INET6 ? 6 : 4;
  h.src_port = port_of(src);
  auto put = [](const sockaddr* a, std::array<uint8_t, 16>& out) {
    if (a->sa_family == AF_INET)
      std::memcpy(out.data() + 12, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, 4);
    else if (a->sa_family == AF_INET6)
      std::memcpy(out.data(), &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
  };
  put(src, h.src_addr);
  put(dst, h.dst_addr);
  return h;
}

void cma_addr(const wr::CmaHeader& h, bool dst, uint16_t port, sockaddr_storage* out) {
  wr::Gid g = dst ? h.dst_addr : h.src_addr;
  if (h.ip_version == 4) {  // the last 4 bytes after 12 zeros: as a GID, ::ffff:a.b.c.d
    std::memset(g.data(), 0, 10);
    g[10] = g[11] = 0xff;
  }
  gid_to_sockaddr(g, port, out);
}

rdma_port_space to_ps(wr::PortSpace ps) {
  switch (ps) {
    case wr::PortSpace::kTcp: return RDMA_PS_TCP;
    case wr::PortSpace::kUdp: return RDMA_PS_UDP;
    case wr::PortSpace::kIb: return RDMA_PS_IB;
    case wr::PortSpace::kIpoib: return RDMA_PS_IPOIB;
  }
  return RDMA_PS_TCP;
}

// The listener for (port space, port) that takes requests for `local` (our address the
// peer asked for), or nullptr.
Id* find_listener(rdma_port_space ps, uint16_t port, const sockaddr* local);

struct Agent final : ib::MadSender, ib::CmUser {
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;
  int next_send = 0;
  int sends_out = 0;
  struct Queued {
    ib::Endpoint to;
    std::array<uint8_t, wr::kMadBytes> mad;
  };
  std::deque<Queued> backlog;  // MADs waiting for a free send slot, in order
  std::map<std::pair<wr::Gid, int>, ibv_ah*> ahs;  // (peer, our GID index)
  std::unique_ptr<ib::Cm> cm;

  uint8_t* recv_buf(int i) { return buf + size_t(i) * kRecvBytes; }
  uint8_t* send_buf(int i) { return buf + size_t(kRecvs) * kRecvBytes + size_t(i) * wr::kMadBytes; }

  bool post_recv(int i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_buf(i)), uint32_t(kRecvBytes), mr->lkey};
    ibv_recv_wr wr{}, *bad;
    wr.wr_id = uint64_t(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(qp, &wr, &bad) == 0;
  }

  ibv_ah* ah_for(const ib::Endpoint& to) {
    int index = gid_index_of_gid(from_gid(to.local));
    if (index < 0) return nullptr;
    auto key = std::make_pair(to.peer, index);
    if (auto it = ahs.find(key); it != ahs.end()) return it->second;
    ibv_ah_attr a{};
    a.is_global = 1;
    a.grh.dgid = from_gid(to.peer);
    a.grh.sgid_index = uint8_t(index);
    a.grh.hop_limit = 64;
    a.port_num = 1;
    ibv_ah* ah = ibv_create_ah(device_pd(), &a);
    if (ah && ahs.size() < 4096) ahs[key] = ah;
    return ah;
  }

  void drain_sends() {
    ibv_wc wc[16];
    // Receive completions are the service's; here only count the sends (both share the CQ,
    // so take everything and hand receives on).
    for (int n; (n = ibv_poll_cq(cq, 16, wc)) > 0;)
      for (int i = 0; i < n; ++i) complete(wc[i]);
    while (sends_out < kSends && !backlog.empty()) {
      post_mad(backlog.front().to, backlog.front().mad.data());
      backlog.pop_front();
    }
  }

  void send_mad(const ib::Endpoint& to, const uint8_t (&mad)[wr::kMadBytes]) override {
    // Never polls the CQ here: this runs inside the CM's handling of a MAD, and a receive
    // completion handed to it now would re-enter it.
    if (sends_out < kSends && backlog.empty()) {
      post_mad(to, mad);
      return;
    }
    if (backlog.size() >= kMaxBacklog) return;
    Queued q{to, {}};
    std::memcpy(q.mad.data(), mad, wr::kMadBytes);
    backlog.push_back(q);
  }

  void post_mad(const ib::Endpoint& to, const uint8_t* mad) {
    ibv_ah* ah = ah_for(to);
    if (!ah) return;
    int i = next_send;
    next_send = (next_send + 1) % kSends;
    std::memcpy(send_buf(i), mad, wr::kMadBytes);
    ibv_sge sge{reinterpret_cast<uintptr_t>(send_buf(i)), uint32_t(wr::kMadBytes), mr->lkey};
    ibv_send_wr w{}, *bad;
    w.wr_id = uint64_t(1) << 32 | uint32_t(i);
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = wr::kGsiQpn;
    w.wr.ud.remote_qkey = wr::kGsiQkey;
    if (ibv_post_send(qp, &w, &bad) == 0) ++sends_out;
  }

  void complete(const ibv_wc& wc) {
    if (wc.wr_id >> 32) {
      --sends_out;
      return;
    }
    int i = int(wc.wr_id);
    if (i < 0 || i >= kRecvs) return;
    if (wc.status == IBV_WC_SUCCESS && wc.byte_len == kRecvBytes) {
      // The GRH: over RoCE v2 IPv4, an IPv4 header in its last 20 bytes; else IPv6's.
      const uint8_t* g = recv_buf(i);
      ib::Endpoint from;
      if ((g[20] >> 4) == 4) {
        from.peer = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, g[32], g[33], g[34], g[35]};
        from.local = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, g[36], g[37], g[38], g[39]};
      } else {
        std::memcpy(from.peer.data(), g + 8, 16);
        std::memcpy(from.local.data(), g + 24, 16);
      }
      uint8_t mad[wr::kMadBytes];
      std::memcpy(mad, g + kGrh, sizeof mad);
      if (wc.qp_num == qp->qp_num) cm->on_mad(from, mad, sizeof mad, now_ns());
    }
    post_recv(i);
  }

  // ---- CmUser: what the CM's protocol tells the ids

  void* on_req(uint32_t conn, const ib::Endpoint& from, const wr::CmReq& req, uint16_t* reason) override;
  void* on_sidr_req(uint32_t conn, const ib::Endpoint& from, const wr::CmSidrReq& req) override;
  void on_rep(void* user, const wr::CmRep& rep) override;
  void on_established(void* user) override {
    Id* id = static_cast<Id*>(user);
    if (id->state != IdState::Accepting) return;
    id->state = IdState::Connected;
    queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  }
  void on_rej(void* user, const wr::CmRej& rej) override {
    Id* id = static_cast<Id*>(user);
    id->conn = 0;
    id->state = IdState::Failed;
    Msg m = make_msg(MsgType::Rej);
    m.status = rej.reason;
    std::memcpy(m.private_data, rej.private_data.data(), kRejPrivate);
    m.private_len = kRejPrivate;
    queue_event(id, RDMA_CM_EVENT_REJECTED, rej.reason, &m, QpStep::ToError);
  }
  void on_timeout(void* user) override {
    Id* id = static_cast<Id*>(user);
    id->conn = 0;
    id->state = IdState::Failed;
    queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, nullptr,
                id->id.qp_type == IBV_QPT_UD ? QpStep::None : QpStep::ToError);
  }
  void on_disconnect(void* user) override { report_disconnect_remote(static_cast<Id*>(user)); }
  void on_timewait_exit(void* user) override {
    Id* id = static_cast<Id*>(user);
    id->conn = 0;
    queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
  }
  void on_sidr_rep(void* user, const wr::CmSidrRep& rep) override {
    Id* id = static_cast<Id*>(user);
    id->conn = 0;
    if (rep.status != wr::kSidrSuccess) {
      id->state = IdState::Failed;
      queue_event(id, RDMA_CM_EVENT_UNREACHABLE, rep.status);
      return;
    }
    Msg m = make_msg(MsgType::SidrRep);
    m.qpn = rep.qpn;
    m.qkey = rep.qkey;
    std::memcpy(m.gid, id->remote_gid.raw, 16);
    std::memcpy(m.private_data, rep.private_data.data(), kSidrRepPrivate);
    m.private_len = kSidrRepPrivate;
    id->have_remote = true;
    id->remote_qpn = rep.qpn;
    id->remote_qkey = rep.qkey;
    id->state = IdState::Connected;
    queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &m);
  }
};

Agent* g_agent = nullptr;  // under g_mu; lives until exit once started

int modify_agent(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = wr::kGsiQkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return errno;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return errno;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return errno;
  return 0;
}

Id* find_listener(rdma_port_space ps, uint16_t port, const sockaddr* local) {
  for (Id* l : all_ids_locked()) {
    if (l->state != IdState::Listening || l->id.ps != ps || l->port != port) continue;
    const sockaddr* bound = &l->id.route.addr.src_addr;
    int bound_index = gid_index_of(bound);
    if (bound_index >= 0 && bound_index != gid_index_of(local)) continue;
    return l;
  }
  return nullptr;
}

// A new passive id for a request to `listener` from another host.
Id* passive_id(Id* listener, uint32_t conn, const ib::Endpoint& from, ibv_qp_type type,
               const sockaddr_storage& local, const sockaddr_storage& peer) {
  Id* id = new_id(listener->channel, listener->id.context, listener->id.ps, type);
  if (!id) return nullptr;
  id->sync = false;
  id->listener = listener;
  id->id.verbs = device_context();
  id->id.pd = device_pd();
  id->id.port_num = 1;
  id->sgid_index = std::max(0, gid_index_of_gid(from_gid(from.local)));
  id->sgid = from_gid(from.local);
  std::memcpy(&id->id.route.addr.src_storage, &local, sizeof(local));
  std::memcpy(&id->id.route.addr.dst_storage, &peer, sizeof(peer));
  id->port = listener->port;
  id->remote = true;
  id->conn = conn;
  id->remote_gid = from_gid(from.peer);
  id->state = IdState::ReqReceived;
  return id;
}

void* Agent::on_req(uint32_t conn, const ib::Endpoint& from, const wr::CmReq& req, uint16_t* reason) {
  wr::PortSpace ps;
  uint16_t port;
  wr::CmaHeader h;
  if (!wr::parse_service_id(req.service_id, &ps, &port)) return nullptr;
  if (wr::decode_cma_header(req.private_data.data(), req.private_data.size(), &h) != wr::CmaError::kOk) {
    *reason = wr::kRejConsumerDefined;  // the kernel's rdma_cm refuses a bad header so
    return nullptr;
  }
  sockaddr_storage local, peer;
  cma_addr(h, true, port, &local);
  cma_addr(h, false, h.src_port, &peer);
  Id* l = find_listener(to_ps(ps), port, reinterpret_cast<sockaddr*>(&local));
  if (!l || l->id.ps == RDMA_PS_UDP) return nullptr;
  ibv_qp_type type = req.transport_service_type == wr::kCmUc ? IBV_QPT_UC : IBV_QPT_RC;
  // XRC (extended transport type 1): an INI QP asks, an XRC TGT QP answers.
  if (req.transport_service_type == wr::kCmExtended) {
    if (req.extended_transport_type != 1) {
      *reason = wr::kRejInvalidTransportType;
      return nullptr;
    }
    type = IBV_QPT_XRC_RECV;
  }
  Id* id = passive_id(l, conn, from, type, local, peer);
  if (!id) {
    *reason = wr::kRejNoResources;
    return nullptr;
  }
  id->have_remote = true;
  id->remote_qpn = req.local_qpn;
  id->remote_psn = req.starting_psn;
  id->remote_responder_resources = req.responder_resources;
  id->remote_initiator_depth = req.initiator_depth;
  id->remote_retry_count = req.retry_count;
  id->remote_rnr_retry_count = req.rnr_retry_count;
  id->remote_ece = {req.vendor_id, 0, 0};
  id->path_mtu = std::min<uint8_t>(req.path_mtu, path_mtu_for(from_gid(from.local)));
  Msg m = make_msg(MsgType::Req);
  m.qpn = req.local_qpn;
  m.psn = req.starting_psn;
  std::memcpy(m.gid, from.peer.data(), 16);
  m.responder_resources = req.responder_resources;
  m.initiator_depth = req.initiator_depth;
  m.flow_control = req.end_to_end_flow_control;
  m.retry_count = req.retry_count;
  m.rnr_retry_count = req.rnr_retry_count;
  m.srq = req.srq;
  std::memcpy(m.private_data, req.private_data.data() + wr::kCmaHeaderBytes, kReqPrivate);
  m.private_len = kReqPrivate;
  queue_event(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &m);
  return id;
}

void* Agent::on_sidr_req(uint32_t conn, const ib::Endpoint& from, const wr::CmSidrReq& req) {
  wr::PortSpace ps;
  uint16_t port;
  wr::CmaHeader h;
  if (!wr::parse_service_id(req.service_id, &ps, &port)) return nullptr;
  if (wr::decode_cma_header(req.private_data.data(), req.private_data.size(), &h) != wr::CmaError::kOk)
    return nullptr;
  sockaddr_storage local, peer;
  cma_addr(h, true, port, &local);
  cma_addr(h, false, h.src_port, &peer);
  Id* l = find_listener(to_ps(ps), port, reinterpret_cast<sockaddr*>(&local));
  if (!l || l->id.ps != RDMA_PS_UDP) return nullptr;
  Id* id = passive_id(l, conn, from, IBV_QPT_UD, local, peer);
  if (!id) return nullptr;
  id->sidr_service_id = req.service_id;
  Msg m = make_msg(MsgType::SidrReq);
  std::memcpy(m.gid, from.peer.data(), 16);
  std::memcpy(m.private_data, req.private_data.data() + wr::kCmaHeaderBytes, kSidrReqPrivate);
  m.private_len = kSidrReqPrivate;
  queue_event(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &m);
  return id;
}

void Agent::on_rep(void* user, const wr::CmRep& rep) {
  Id* id = static_cast<Id*>(user);
  if (id->state != IdState::Connecting) return;
  id->have_remote = true;
  id->remote_qpn = rep.local_qpn;
  id->remote_psn = rep.starting_psn;
  id->remote_responder_resources = rep.responder_resources;
  id->remote_initiator_depth = rep.initiator_depth;
  id->remote_rnr_retry_count = rep.rnr_retry_count;
  id->remote_ece = {rep.vendor_id, 0, 0};
  id->responder_resources = std::min(id->responder_resources, rep.initiator_depth);
  id->initiator_depth = std::min(id->initiator_depth, rep.responder_resources);
  id->state = IdState::RepReceived;
  Msg m = make_msg(MsgType::Rep);
  m.qpn = rep.local_qpn;
  m.psn = rep.starting_psn;
  std::memcpy(m.gid, id->remote_gid.raw, 16);
  m.responder_resources = rep.responder_resources;
  m.initiator_depth = rep.initiator_depth;
  m.flow_control = rep.end_to_end_flow_control;
  m.rnr_retry_count = rep.rnr_retry_count;
  m.srq = rep.srq;
  std::memcpy(m.private_data, rep.private_data.data(), kRepPrivate);
  m.private_len = kRepPrivate;
  queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &m, id->id.qp ? QpStep::Connect : QpStep::None);
}

// An exponent from the environment (SOFTVERBS_CM_*, docs/roce-cm.md), if set and in
// [0, max]; else `fallback`.
uint8_t env_exponent(const char* name, uint8_t max, uint8_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end || n < 0 || n > max) {
    std::fprintf(stderr, "softverbs: %s=%s ignored (0..%u)\n", name, v, unsigned(max));
    return fallback;
  }
  return uint8_t(n);
}

// The CM's timers: the kernel's rdma_cm values, unless the environment says otherwise
// (tests run the retry paths in a second instead of 100): SOFTVERBS_CM_RESPONSE_TIMEOUT
// (both CM response timeouts, and the SIDR_REQ resend interval as cma.c derives it),
// SOFTVERBS_CM_PACKET_LIFETIME, SOFTVERBS_CM_RETRIES. Read once, when the agent starts.
void timers_from_env(ib::Config* cfg) {
  cfg->response_timeout = env_exponent("SOFTVERBS_CM_RESPONSE_TIMEOUT", 31, cfg->response_timeout);
  cfg->packet_life_time = env_exponent("SOFTVERBS_CM_PACKET_LIFETIME", 30, cfg->packet_life_time);
  cfg->max_cm_retries = env_exponent("SOFTVERBS_CM_RETRIES", 15, cfg->max_cm_retries);
  // cma.c: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
  int shift = cfg->response_timeout >= 8 ? cfg->response_timeout - 8 : 0;
  cfg->sidr_timeout = (ib::Time(1) << shift) * 1000000;
}

uint64_t ca_guid() { return be64toh(device_attr().node_guid); }

wr::CmPath path_of(Id* id) {
  wr::CmPath p;
  p.local_lid = p.remote_lid = 0xffff;  // RoCE has no LIDs: the permissive LID, as the kernel
  p.local_gid = to_gid(id->sgid);
  p.remote_gid = to_gid(id->remote_gid);
  p.traffic_class = id->tos;
  p.hop_limit = 64;
  return p;
}

}  // namespace

// ---- resolution

int gid_index_of_gid(const ibv_gid& gid) {
  sockaddr_storage a;
  gid_to_sockaddr(to_gid(gid), 0, &a);
  return gid_index_of(reinterpret_cast<sockaddr*>(&a));
}

uint8_t path_mtu_for(const ibv_gid& local) {
  // The interface that holds the address: its MTU less IP, UDP, BTH and ICRC (and room
  // for the largest extension header), rounded down to an IB MTU, as rxe does.
  wr::Gid g = to_gid(local);
  bool v4 = is_v4_mapped(g);
  int mtu = 0;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* ifa = list; ifa && !mtu; ifa = ifa->ifa_next) {
      if (!ifa->ifa_addr) continue;
      bool match = false;
      if (v4 && ifa->ifa_addr->sa_family == AF_INET)
        match = std::memcmp(&reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr, g.data() + 12, 4) == 0;
      if (!v4 && ifa->ifa_addr->sa_family == AF_INET6)
        match = std::memcmp(&reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, g.data(), 16) == 0;
      if (!match) continue;
      int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      ifreq ifr{};
      std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifa->ifa_name);
      if (s >= 0 && ioctl(s, SIOCGIFMTU, &ifr) == 0) mtu = ifr.ifr_mtu;
      if (s >= 0) close(s);
    }
    freeifaddrs(list);
  }
  int room = mtu - (v4 ? 20 : 40) - 8 - 12 - 4 - 28;
  uint8_t best = IBV_MTU_256;
  for (int m = IBV_MTU_4096; m >= IBV_MTU_256; --m)
    if (room >= (128 << m)) {
      best = uint8_t(m);
      break;
    }
  return std::min<uint8_t>(best, uint8_t(device_mtu()));
}

int resolve_remote_locked(Id* id, const sockaddr* dst, sockaddr_storage* source) {
  // `ip route get` without netlink: a connected UDP socket makes the kernel choose the
  // route and source address (getsockname tells which); no packet is sent.
  int s = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  sockaddr_storage to{};
  std::memcpy(&to, dst, addr_len(dst));
  if (port_of(dst) == 0) set_port(&to, 4791);
  int err = 0;
  socklen_t len = sizeof(*source);
  if (::connect(s, reinterpret_cast<sockaddr*>(&to), addr_len(dst)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(source), &len) != 0)
    err = errno;
  close(s);
  if (err) return err == ENETUNREACH ? ENETUNREACH : EHOSTUNREACH;
  set_port(source, 0);
  if (gid_index_of(reinterpret_cast<sockaddr*>(source)) < 0) return EADDRNOTAVAIL;
  (void)id;
  return 0;
}

// ---- neighbour resolution (rdma_resolve_addr's wait for ARP/ND)

namespace {

// An id in AddrQuery: whose neighbour to ask about, until when.
struct Resolution {
  Id* id;
  NextHop hop;
  sockaddr_storage source;
  ib::Time deadline;
  ib::Time next_poll;
  int polls = 0;
};
// Under g_mu. Never destroyed: the service thread may still use it while the process exits.
std::vector<Resolution>& g_resolutions = *new std::vector<Resolution>;

// The id is resolved: its device and source (a wildcard-bound id takes the route's, keeping
// its port), the peer's GID, the path MTU; ADDR_RESOLVED.
void addr_resolved(Id* id, const sockaddr_storage& source) {
  if (!id->id.verbs) {
    uint16_t port = id->port;
    id->id.route.addr.src_storage = source;
    set_port(&id->id.route.addr.src_storage, port);
    id->id.verbs = device_context();
    id->id.pd = device_pd();
    id->id.port_num = 1;
    id->sgid_index = gid_index_of(reinterpret_cast<const sockaddr*>(&source));
    gid_at(id->sgid_index, &id->sgid);
  }
  const sockaddr* dst = &id->id.route.addr.dst_addr;
  std::memset(&id->remote_gid, 0, sizeof(id->remote_gid));
  if (dst->sa_family == AF_INET) {
    id->remote_gid.raw[10] = id->remote_gid.raw[11] = 0xff;
    std::memcpy(id->remote_gid.raw + 12, &reinterpret_cast<const sockaddr_in*>(dst)->sin_addr, 4);
  } else {
    std::memcpy(id->remote_gid.raw, &reinterpret_cast<const sockaddr_in6*>(dst)->sin6_addr, 16);
  }
  id->remote = true;
  id->path_mtu = path_mtu_for(id->sgid);
  id->state = IdState::AddrResolved;
  queue_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
}

// Polls every waiting id whose time has come: valid → ADDR_RESOLVED; past its deadline →
// ADDR_ERROR -ETIMEDOUT (addr.c's status once timeout_ms has passed); else later, at
// 1, 2, 4 ... 32 ms intervals (the kernel is woken by the neighbour's update instead).
void poll_resolutions(ib::Time now) {
  for (size_t i = 0; i < g_resolutions.size();) {
    Resolution& r = g_resolutions[i];
    if (r.next_poll > now) {
      ++i;
      continue;
    }
    bool valid = neighbour_state(r.hop) == NeighbourState::kValid;
    if (!valid && now < r.deadline) {
      ib::Time step = ib::Time(1000000) << std::min(r.polls++, 5);
      r.next_poll = std::min(now + step, r.deadline);
      ++i;
      continue;
    }
    Id* id = r.id;
    sockaddr_storage source = r.source;
    g_resolutions.erase(g_resolutions.begin() + std::ptrdiff_t(i));
    if (valid) {
      addr_resolved(id, source);
    } else {
      id->state = IdState::Bound;  // as the kernel's: bound again, may resolve again
      queue_event(id, RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT);
    }
  }
}

ib::Time next_resolution_poll() {
  ib::Time t = ib::kNever;
  for (const Resolution& r : g_resolutions) t = std::min(t, r.next_poll);
  return t;
}

void forget_resolution(Id* id) {
  std::erase_if(g_resolutions, [id](const Resolution& r) { return r.id == id; });
}

}  // namespace

int remote_resolve_addr_locked(Id* id, const sockaddr_storage& source, int timeout_ms) {
  const sockaddr* dst = &id->id.route.addr.dst_addr;
  Resolution r{id, {}, source, 0, 0};
  if (int err = route_next_hop(dst, &r.hop)) return err == ENETUNREACH ? ENETUNREACH : EHOSTUNREACH;
  if (neighbour_state(r.hop) == NeighbourState::kValid) {
    addr_resolved(id, source);
    return 0;
  }
  provoke_neighbour(dst);
  ib::Time now = now_ns();
  r.deadline = now + ib::Time(std::max(timeout_ms, 0)) * 1000000;
  r.next_poll = std::min(now + 1000000, r.deadline);
  forget_resolution(id);
  g_resolutions.push_back(r);
  id->state = IdState::AddrQuery;
  kick_service();
  return 0;
}

// ---- the agent

int remote_start_locked() {
  if (g_agent) return 0;
  ibv_context* ctx = device_context();
  if (!ctx) return ENODEV;
  auto a = std::make_unique<Agent>();
  a->channel = ibv_create_comp_channel(ctx);
  if (!a->channel) return errno ? errno : ENOMEM;
  fcntl(a->channel->fd, F_SETFL, fcntl(a->channel->fd, F_GETFL) | O_NONBLOCK);
  a->cq = ibv_create_cq(ctx, kRecvs + kSends, nullptr, a->channel, 0);
  size_t bytes = size_t(kRecvs) * kRecvBytes + size_t(kSends) * wr::kMadBytes;
  a->buf = static_cast<uint8_t*>(std::calloc(1, bytes));
  if (a->cq && a->buf) a->mr = ibv_reg_mr(device_pd(), a->buf, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (a->mr) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_type = IBV_QPT_UD;
    ex.send_cq = ex.recv_cq = a->cq;
    ex.cap.max_send_wr = kSends;
    ex.cap.max_recv_wr = kRecvs;
    ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ex.pd = device_pd();
    ex.create_flags = IBV_QP_CREATE_SOURCE_QPN;
    ex.source_qpn = wr::kGsiQpn;
    a->qp = ibv_create_qp_ex(ctx, &ex);
  }
  int err = a->qp ? modify_agent(a->qp) : (errno ? errno : ENOMEM);
  for (int i = 0; !err && i < kRecvs; ++i)
    if (!a->post_recv(i)) err = ENOMEM;
  if (!err && ibv_req_notify_cq(a->cq, 0)) err = errno;
  if (err) {
    if (a->qp) ibv_destroy_qp(a->qp);
    if (a->mr) ibv_dereg_mr(a->mr);
    if (a->cq) ibv_destroy_cq(a->cq);
    if (a->channel) ibv_destroy_comp_channel(a->channel);
    std::free(a->buf);
    return err;
  }
  ib::Config cfg;
  timers_from_env(&cfg);
  // Our registry slot, from the QPN, leads every comm ID: answers name this process.
  uint32_t slot = a->qp->qp_num >> 14;
  cfg.id_prefix = (slot & 0x3ff) << 22;
  cfg.tid_agent = slot;
  a->cm = std::make_unique<ib::Cm>(cfg, *a, *a);
  a->cm->seed(random32());
  g_agent = a.release();
  kick_service();
  return 0;
}

namespace {
uint32_t my_slot_of_agent() { return g_agent->qp->qp_num >> 14; }
// Our established connections, published for the host's CM should we die (orphans.hpp).
void publish_established() {
  if (g_agent) orphans_publish_locked(*g_agent->cm, my_slot_of_agent());
}
}  // namespace

int remote_fd_locked() { return g_agent ? g_agent->channel->fd : -1; }

int remote_timeout_ms_locked() {
  ib::Time t = next_resolution_poll();
  if (g_agent) t = std::min({t, g_agent->cm->next_deadline(), orphans_next_scan_locked()});
  if (t == ib::kNever) return -1;
  ib::Time left = t - now_ns();
  return left <= 0 ? 0 : int(std::min<ib::Time>(left / 1000000 + 1, 60000));
}

void remote_service_locked() {
  if (!g_resolutions.empty()) poll_resolutions(now_ns());
  if (!g_agent) return;
  ibv_cq* cq;
  void* ctx;
  while (ibv_get_cq_event(g_agent->channel, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  ibv_req_notify_cq(g_agent->cq, 0);
  g_agent->drain_sends();  // every completion: receives go to the CM
  g_agent->cm->on_time(now_ns());
  orphans_scan_locked(*g_agent->cm, my_slot_of_agent(), now_ns());
  publish_established();
}

// ---- the ids' calls

int remote_connect_locked(Id* id, const rdma_conn_param* param) {
  if (int err = remote_start_locked()) return err;
  bool ud = id->id.ps == RDMA_PS_UDP;
  uint8_t len = param ? param->private_data_len : 0;
  ib::Endpoint to{to_gid(id->sgid), to_gid(id->remote_gid)};
  wr::CmaHeader h = cma_header(&id->id.route.addr.src_addr, &id->id.route.addr.dst_addr);
  uint16_t port = port_of(&id->id.route.addr.dst_addr);
  wr::PortSpace ps = static_cast<wr::PortSpace>(id->id.ps);
  id->remote = true;
  if (ud) {
    wr::CmSidrReq req;
    req.service_id = wr::service_id(ps, port);
    wr::encode_cma_header(h, req.private_data.data());
    if (len) std::memcpy(req.private_data.data() + wr::kCmaHeaderBytes, param->private_data, len);
    id->state = IdState::Connecting;
    id->conn = g_agent->cm->sidr_query(id, to, req, now_ns());
    kick_service();
    return 0;
  }
  wr::CmReq req;
  req.service_id = wr::service_id(ps, port);
  req.local_ca_guid = ca_guid();
  req.local_qpn = (id->id.qp ? id->id.qp->qp_num : id->local_qpn) & 0xffffff;
  req.responder_resources = id->responder_resources;
  req.initiator_depth = id->initiator_depth;
  req.transport_service_type = id->id.qp && id->id.qp->qp_type == IBV_QPT_UC ? wr::kCmUc : wr::kCmRc;
  if (id->id.qp && id->id.qp->qp_type == IBV_QPT_XRC_SEND) {
    req.transport_service_type = wr::kCmExtended;  // with extended transport type 1: XRC
    req.extended_transport_type = 1;
  }
  req.end_to_end_flow_control = param && param->flow_control;
  req.starting_psn = id->psn;
  req.retry_count = id->retry_count;
  req.rnr_retry_count = id->rnr_retry_count;
  req.path_mtu = id->path_mtu ? id->path_mtu : path_mtu_for(id->sgid);
  req.srq = (param && param->srq) || id->id.srq;
  req.vendor_id = id->local_ece.vendor_id & 0xffffff;
  req.primary = path_of(id);
  wr::encode_cma_header(h, req.private_data.data());
  if (len) std::memcpy(req.private_data.data() + wr::kCmaHeaderBytes, param->private_data, len);
  id->path_mtu = req.path_mtu;
  id->state = IdState::Connecting;
  id->conn = g_agent->cm->connect(id, to, req, now_ns());
  kick_service();
  return 0;
}

int remote_accept_locked(Id* id, const rdma_conn_param* param, uint8_t len) {
  if (!g_agent || !id->conn) return EINVAL;
  if (id->id.ps == RDMA_PS_UDP) {
    wr::CmSidrRep rep;
    rep.qpn = (id->id.qp ? id->id.qp->qp_num : id->local_qpn) & 0xffffff;
    rep.qkey = RDMA_UDP_QKEY;
    rep.service_id = id->sidr_service_id;
    if (len) std::memcpy(rep.private_data.data(), param->private_data, len);
    int err = g_agent->cm->sidr_reply(id->conn, rep, now_ns());
    if (!err) {
      id->conn = 0;
      id->state = IdState::Connected;
    }
    return err;
  }
  wr::CmRep rep;
  rep.local_qpn = (id->id.qp ? id->id.qp->qp_num : id->local_qpn) & 0xffffff;
  rep.starting_psn = id->psn;
  rep.responder_resources = id->responder_resources;
  rep.initiator_depth = id->initiator_depth;
  rep.target_ack_delay = 15;  // rxe's local CA ACK delay
  rep.end_to_end_flow_control = param && param->flow_control;
  rep.rnr_retry_count = id->rnr_retry_count;
  rep.srq = (param && param->srq) || id->id.srq;
  rep.local_ca_guid = ca_guid();
  rep.vendor_id = id->local_ece.vendor_id & 0xffffff;
  if (len) std::memcpy(rep.private_data.data(), param->private_data, len);
  int err = g_agent->cm->accept(id->conn, rep, now_ns());
  if (!err) id->state = IdState::Accepting;
  kick_service();
  return err;
}

int remote_reject_locked(Id* id, const void* data, uint8_t len, int reason) {
  if (!g_agent || !id->conn) return EINVAL;
  int err;
  if (id->id.ps == RDMA_PS_UDP) {
    wr::CmSidrRep rep;
    rep.status = wr::kSidrReject;
    rep.service_id = id->sidr_service_id;
    if (len) std::memcpy(rep.private_data.data(), data, std::min<size_t>(len, kSidrRepPrivate));
    err = g_agent->cm->sidr_reply(id->conn, rep, now_ns());
  } else {
    err = g_agent->cm->reject(id->conn, uint16_t(reason),
                              std::span<const uint8_t>(static_cast<const uint8_t*>(data), len), now_ns());
  }
  id->conn = 0;
  id->state = IdState::Failed;
  return err;
}

int remote_rtu_locked(Id* id) {
  if (!g_agent || !id->conn) return ECONNRESET;
  int err = g_agent->cm->send_rtu(id->conn, now_ns());
  kick_service();  // the service publishes the new connection
  return err;
}

void remote_reject_rep_locked(Id* id) {
  if (!g_agent || !id->conn) return;
  g_agent->cm->reject(id->conn, wr::kRejConsumerDefined, {}, now_ns());
  id->conn = 0;
}

int remote_disconnect_locked(Id* id) {
  if (!g_agent || !id->conn) return 0;
  int err = g_agent->cm->disconnect(id->conn, now_ns());
  publish_established();
  kick_service();
  return err == EINVAL ? 0 : err;
}

int remote_notify_locked(Id* id, ibv_event_type event) {
  if (!g_agent || !id->conn) return EINVAL;  // no IB CM connection (cma.c: no cm_id.ib)
  switch (event) {
    case IBV_EVENT_COMM_EST: {
      int err = g_agent->cm->establish(id->conn, now_ns());
      kick_service();  // the service publishes the new connection
      return err;
    }
    case IBV_EVENT_PATH_MIG:
      return g_agent->cm->state(id->conn) == ib::State::Established ? 0 : EINVAL;
    default:
      return EINVAL;
  }
}

void remote_destroy_locked(Id* id) {
  forget_resolution(id);
  if (!g_agent || !id->conn) return;
  g_agent->cm->destroy(id->conn, now_ns());
  id->conn = 0;
  publish_established();  // now: the process may exit before the service runs again
  kick_service();
}

}  // namespace softverbs::cm
