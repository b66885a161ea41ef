// The exported rdma_cm calls (librdmacm.map puts each in its RDMACM_1.x node). Arguments
// are checked here; the work is in service.cpp. Every call returns 0, or -1 with errno,
// as rdma_cm(7) says, unless its man page says otherwise.
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <rdma/rdma_verbs.h>

#include "cm/cm.hpp"

using namespace softverbs::cm;

namespace {

int fail(int err) {
  errno = err;
  return -1;
}

// The id, or nullptr with errno = EINVAL.
Id* checked(rdma_cm_id* raw) {
  Id* id = Id::from(raw);
  if (!id) errno = EINVAL;
  return id;
}

// A call that produces an event: a synchronous id waits for it.
int after(Id* id, int err) {
  if (err) return fail(err);
  return id->sync ? complete_sync(id) : 0;
}

void destroy_own_cqs(Id* id) {
  if (!id->own_cqs) return;
  if (id->id.send_cq) ibv_destroy_cq(id->id.send_cq);
  if (id->id.recv_cq) ibv_destroy_cq(id->id.recv_cq);
  if (id->id.send_cq_channel) ibv_destroy_comp_channel(id->id.send_cq_channel);
  if (id->id.recv_cq_channel) ibv_destroy_comp_channel(id->id.recv_cq_channel);
  id->id.send_cq = id->id.recv_cq = nullptr;
  id->id.send_cq_channel = id->id.recv_cq_channel = nullptr;
  id->own_cqs = false;
}

// rdma_create_qp(3): a CQ the caller did not give is made here, one per direction, each
// with a completion channel of its own and the id as cq_context.
int create_cqs(Id* id, ibv_cq** send_cq, ibv_cq** recv_cq, uint32_t send_wr, uint32_t recv_wr) {
  ibv_context* ctx = id->id.verbs;
  auto make = [&](ibv_comp_channel** ch, ibv_cq** cq, uint32_t depth) {
    *ch = ibv_create_comp_channel(ctx);
    if (!*ch) return false;
    *cq = ibv_create_cq(ctx, static_cast<int>(depth ? depth : 1), &id->id, *ch, 0);
    return *cq != nullptr;
  };
  bool ok = true;
  if (send_cq && !*send_cq) {
    id->own_cqs = true;
    ok = make(&id->id.send_cq_channel, &id->id.send_cq, send_wr);
    *send_cq = id->id.send_cq;
  }
  if (ok && recv_cq && !*recv_cq) {
    id->own_cqs = true;
    ok = make(&id->id.recv_cq_channel, &id->id.recv_cq, recv_wr);
    *recv_cq = id->id.recv_cq;
  }
  if (ok) return 0;
  int err = errno ? errno : ENOMEM;
  destroy_own_cqs(id);
  return err;
}

int finish_qp(Id* id, ibv_qp* qp) {
  if (!qp) {
    int err = errno ? errno : ENOMEM;
    destroy_own_cqs(id);
    return err;
  }
  if (int err = init_qp_locked(id, qp)) {
    ibv_destroy_qp(qp);
    destroy_own_cqs(id);
    return err;
  }
  id->id.qp = qp;
  return 0;
}

ibv_pd* pd_for(Id* id, ibv_pd* pd) {
  if (!pd) pd = id->id.pd ? id->id.pd : device_pd();
  id->id.pd = pd;
  return pd;
}

// The QP of an id, as librdmacm makes it: CQs the caller did not give (an XRC INI QP
// needs none for receives, an XRC TGT QP none at all: it is created in the device's XRC
// domain, and its receives complete on the CQ of the XRC SRQ they land in).
int create_id_qp(Id* id, ibv_pd* pd, ibv_qp_init_attr_ex* attr) {
  const bool ini = attr->qp_type == IBV_QPT_XRC_SEND, tgt = attr->qp_type == IBV_QPT_XRC_RECV;
  if (tgt) {
    attr->comp_mask = (attr->comp_mask & ~uint32_t(IBV_QP_INIT_ATTR_PD)) | IBV_QP_INIT_ATTR_XRCD;
    attr->xrcd = device_xrcd();
    attr->send_cq = attr->recv_cq = nullptr;
    attr->srq = nullptr;
    if (!attr->xrcd) return errno ? errno : ENODEV;
    return finish_qp(id, ibv_create_qp_ex(id->id.verbs, attr));
  }
  if (int err = create_cqs(id, &attr->send_cq, ini ? nullptr : &attr->recv_cq,
                           attr->cap.max_send_wr, attr->cap.max_recv_wr))
    return err;
  if (!ini && !attr->srq && id->id.srq) attr->srq = id->id.srq;
  attr->pd = pd;
  attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  return finish_qp(id, ibv_create_qp_ex(id->id.verbs, attr));
}

ibv_qp_init_attr_ex to_ex(const ibv_qp_init_attr& a) {
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = a.qp_context;
  ex.send_cq = a.send_cq;
  ex.recv_cq = a.recv_cq;
  ex.srq = a.srq;
  ex.cap = a.cap;
  ex.qp_type = a.qp_type;
  ex.sq_sig_all = a.sq_sig_all;
  return ex;
}

void from_ex(const ibv_qp_init_attr_ex& ex, ibv_qp_init_attr* a) {
  a->send_cq = ex.send_cq;
  a->recv_cq = ex.recv_cq;
  a->srq = ex.srq;
  a->cap = ex.cap;
}

const char* const kEventNames[] = {
    "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",   "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST",  "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",         "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",     "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",      "RDMA_CM_EVENT_TIMEWAIT_EXIT",
};

}  // namespace

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
  if (!device_context()) {
    errno = ENODEV;
    return nullptr;
  }
  Channel* ch = new_channel();
  return ch ? &ch->ch : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (Channel* ch = Channel::from(channel); ch && !ch->destroyed) free_channel(ch);
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context,
                   enum rdma_port_space ps) {
  if (!out) return fail(EINVAL);
  ibv_qp_type type;
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_IB:
      type = IBV_QPT_RC;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      type = IBV_QPT_UD;
      break;
    default:
      return fail(EINVAL);
  }
  Channel* ch = nullptr;
  if (channel && !(ch = Channel::from(channel))) return fail(EINVAL);
  if (!device_context()) return fail(ENODEV);
  std::lock_guard<std::mutex> lock(g_mu);
  Id* id = new_id(ch, context, ps, type);
  if (!id) return fail(ENOMEM);
  *out = &id->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* raw) {
  Id* id = checked(raw);
  if (!id) return -1;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    drop_kept_event(id);  // a synchronous id's last event
    for (const Id::Group& g : id->groups)  // groups are left with the id
      if (g.attached && id->id.qp) ibv_detach_mcast(id->id.qp, &g.mgid, 0);
    id->groups.clear();
    detach_locked(id);
  }
  wait_acked(id);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    release_channel_locked(id);
  }
  id->magic = kDeadMagic;
  delete id;
  return 0;
}

int rdma_bind_addr(rdma_cm_id* raw, sockaddr* addr) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = bind_locked(id, addr)) return fail(err);
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* raw, sockaddr* src, sockaddr* dst, int timeout_ms) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!dst || (dst->sa_family != AF_INET && dst->sa_family != AF_INET6)) return fail(EINVAL);
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    // Another host's address: the kernel's routing table picks our source address (and
    // so the GID), as rdma_cm does on RoCE (resolve_remote_locked).
    int dst_index = gid_index_of(dst);
    bool remote = dst_index == -1 && !is_multicast_addr(dst);
    sockaddr_storage source{};
    int route_err = remote ? resolve_remote_locked(id, dst, &source) : 0;
    // A multicast group: bound to the source the kernel's routing table picks for it, as
    // rdma_cm does (decision 0008); without a route to it, this host alone.
    const bool mcast_routed = is_multicast_addr(dst) && !src && id->state == IdState::Idle &&
                              resolve_remote_locked(id, dst, &source) == 0;
    if (id->state == IdState::Idle) {
      // Bind first: to the given source, else to the destination's own address when the
      // destination is this host (it is the address a kernel would pick), else to the
      // route's source for another host, else any.
      sockaddr_storage from{};
      if (src && (src->sa_family == AF_INET || src->sa_family == AF_INET6)) {
        std::memcpy(&from, src, addr_len(src));
      } else if ((remote && !route_err) || mcast_routed) {
        from = source;
      } else {
        std::memcpy(&from, dst, addr_len(dst));
        set_port(&from, 0);
        if (gid_index_of(reinterpret_cast<sockaddr*>(&from)) < 0) {
          std::memset(&from, 0, sizeof(from));
          from.ss_family = dst->sa_family;
        }
      }
      err = bind_locked(id, reinterpret_cast<sockaddr*>(&from));
    }
    if (!err && id->state != IdState::Bound && id->state != IdState::AddrResolved) err = EINVAL;
    // No route: rdma_resolve_addr itself fails, as the kernel's rdma_resolve_ip does when
    // its first route lookup does (the id stays bound).
    if (!err && remote && route_err && route_err != EADDRNOTAVAIL) err = route_err;
    if (!err) {
      std::memset(&id->id.route.addr.dst_storage, 0, sizeof(sockaddr_storage));
      std::memcpy(&id->id.route.addr.dst_storage, dst, addr_len(dst));
      int index = dst_index;
      if (index == -2) index = loopback_gid_index();  // connecting to "any" reaches this host
      // A multicast group is reached through our own port.
      if (is_multicast_addr(dst)) index = id->id.verbs ? id->sgid_index : loopback_gid_index();
      if (remote && !route_err && (route_err = remote_start_locked()) == 0) {
        // The neighbour (ARP/ND) next: ADDR_RESOLVED now or from the service's timers.
        err = remote_resolve_addr_locked(id, source, timeout_ms);
      } else if (remote || index < 0) {
        queue_event(id, RDMA_CM_EVENT_ADDR_ERROR, -(route_err ? route_err : EHOSTUNREACH));
      } else {
        if (!id->id.verbs) {  // bound to a wildcard: the route picks the device
          id->id.verbs = device_context();
          id->id.pd = device_pd();  // as rdma-core: an id on a device has its PD
          id->id.port_num = 1;
          id->sgid_index = index;
          gid_at(index, &id->sgid);
        }
        gid_at(index, &id->remote_gid);
        id->state = IdState::AddrResolved;
        queue_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
      }
    }
  }
  return after(id, err);
}

int rdma_resolve_route(rdma_cm_id* raw, int timeout_ms) {
  Id* id = checked(raw);
  if (!id) return -1;
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (id->state != IdState::AddrResolved) {
      err = EINVAL;
    } else {
      ibv_sa_path_rec& p = id->path;
      p = {};
      p.dgid = id->remote_gid;
      p.sgid = id->sgid;
      p.pkey = 0xffff;
      p.hop_limit = 64;
      p.traffic_class = id->tos;
      p.mtu = id->path_mtu ? static_cast<ibv_mtu>(id->path_mtu) : device_mtu();
      p.reversible = 1;
      p.numb_path = 1;
      id->id.route.path_rec = &p;
      id->id.route.num_paths = 1;
      id->state = IdState::RouteResolved;
      queue_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    }
  }
  (void)timeout_ms;
  return after(id, err);
}

int rdma_create_qp(rdma_cm_id* raw, ibv_pd* pd, ibv_qp_init_attr* attr) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !id->id.verbs || id->id.qp) return fail(EINVAL);
  if (pd && pd->context != id->id.verbs) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  pd = pd_for(id, pd);
  if (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV) {
    ibv_qp_init_attr_ex ex = to_ex(*attr);
    int err = create_id_qp(id, pd, &ex);
    from_ex(ex, attr);
    return err ? fail(err) : 0;
  }
  if (int err = create_cqs(id, &attr->send_cq, &attr->recv_cq, attr->cap.max_send_wr,
                           attr->cap.max_recv_wr))
    return fail(err);
  if (!attr->srq && id->id.srq) attr->srq = id->id.srq;
  if (int err = finish_qp(id, ibv_create_qp(pd, attr))) return fail(err);
  return 0;
}

int rdma_create_qp_ex(rdma_cm_id* raw, ibv_qp_init_attr_ex* attr) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !id->id.verbs || id->id.qp) return fail(EINVAL);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_PD) && attr->pd && attr->pd->context != id->id.verbs)
    return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  ibv_pd* pd = pd_for(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr);
  if (int err = create_id_qp(id, pd, attr)) return fail(err);
  return 0;
}

void rdma_destroy_qp(rdma_cm_id* raw) {
  Id* id = Id::from(raw);
  if (!id) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (id->id.qp) ibv_destroy_qp(id->id.qp);
  id->id.qp = nullptr;
  destroy_own_cqs(id);
}

int rdma_connect(rdma_cm_id* raw, rdma_conn_param* param) {
  Id* id = checked(raw);
  if (!id) return -1;
  int err;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    err = connect_locked(id, param);
  }
  return after(id, err);
}

int rdma_establish(rdma_cm_id* raw) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = establish_locked(id)) return fail(err);
  return 0;
}

int rdma_listen(rdma_cm_id* raw, int backlog) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = listen_locked(id, backlog)) return fail(err);
  return 0;
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** out) {
  Id* l = checked(listen);
  if (!l) return -1;
  if (!out || !l->sync) return fail(EINVAL);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    drop_kept_event(l);
  }
  Event* e = nullptr;
  if (take_event(l->channel, &e) != 0) return -1;
  if (e->ev.event != RDMA_CM_EVENT_CONNECT_REQUEST || e->ev.status) {
    // Something else came for the listener (an error): keep it there, as rdma-core does.
    int status = e->ev.status;
    l->id.event = &e->ev;
    return fail(status < 0 ? -status : (status ? status : EINVAL));
  }
  Id* id = e->owner;
  std::lock_guard<std::mutex> lock(g_mu);
  // The new id is synchronous too, with a channel of its own.
  Channel* own = new_channel();
  if (!own) {
    int err = errno;
    ack_event(e);
    return fail(err);
  }
  release_channel_locked(id);
  id->channel = own;
  own->ids = 1;
  id->id.channel = &own->ch;
  id->sync = true;
  id->id.event = &e->ev;
  if (l->has_ep_attr) {
    ibv_qp_init_attr attr = l->ep_attr;
    ibv_pd* pd = pd_for(id, l->ep_pd);
    int err;
    if (attr.qp_type == IBV_QPT_XRC_SEND || attr.qp_type == IBV_QPT_XRC_RECV) {
      ibv_qp_init_attr_ex ex = to_ex(attr);
      err = create_id_qp(id, pd, &ex);
    } else {
      err = create_cqs(id, &attr.send_cq, &attr.recv_cq, attr.cap.max_send_wr, attr.cap.max_recv_wr);
      if (!err) {
        if (!attr.srq && id->id.srq) attr.srq = id->id.srq;
        err = finish_qp(id, ibv_create_qp(pd, &attr));
      }
    }
    if (err) {
      reject_locked(id, nullptr, 0, kRejConsumerDefined);
      return fail(err);
    }
  }
  *out = &id->id;
  return 0;
}

int rdma_accept(rdma_cm_id* raw, rdma_conn_param* param) {
  Id* id = checked(raw);
  if (!id) return -1;
  int err;
  bool wait;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    err = accept_locked(id, param);
    wait = id->id.ps != RDMA_PS_UDP;  // SIDR has nothing to wait for
  }
  if (err) return fail(err);
  return id->sync && wait ? complete_sync(id) : 0;
}

int rdma_reject(rdma_cm_id* raw, const void* data, uint8_t len) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = reject_locked(id, data, len, kRejConsumerDefined)) return fail(err);
  return 0;
}

int rdma_reject_ece(rdma_cm_id* raw, const void* data, uint8_t len) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = reject_locked(id, data, len, kRejVendorOptionNotSupported)) return fail(err);
  return 0;
}

int rdma_notify(rdma_cm_id* raw, enum ibv_event_type event) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  // Between hosts the RTU can be lost: COMM_EST establishes as the kernel's CM does. On
  // one host the RTU never gets lost, so there is nothing to hurry along.
  if (!id->remote) return 0;
  if (int err = remote_notify_locked(id, event)) return fail(err);
  return 0;
}

int rdma_disconnect(rdma_cm_id* raw) {
  Id* id = checked(raw);
  if (!id) return -1;
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = disconnect_locked(id)) return fail(err);
  return 0;
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** out) {
  Channel* ch = Channel::from(channel);
  if (!ch || !out) return fail(EINVAL);
  Event* e = nullptr;
  if (take_event(ch, &e) != 0) return -1;
  *out = &e->ev;
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  auto* e = reinterpret_cast<Event*>(event);
  if (!event || e->magic != kEventMagic) return fail(EINVAL);
  ack_event(e);
  return 0;
}

const char* rdma_event_str(enum rdma_cm_event_type event) {
  auto i = static_cast<size_t>(event);
  return i < sizeof(kEventNames) / sizeof(kEventNames[0]) ? kEventNames[i] : "UNKNOWN EVENT";
}

int rdma_set_option(rdma_cm_id* raw, int level, int optname, void* optval, size_t optlen) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!optval) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
      case RDMA_OPTION_ID_AFONLY:
        return optlen == sizeof(int) ? 0 : fail(EINVAL);
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->ack_timeout = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
        return 0;
      default:
        return fail(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
    // A path record for IB routing: RoCE on one host has only one path.
    return optlen % sizeof(ibv_path_data) == 0 && optlen ? 0 : fail(EINVAL);
  }
  return fail(ENOSYS);
}

int rdma_migrate_id(rdma_cm_id* raw, rdma_event_channel* channel) {
  Id* id = checked(raw);
  if (!id) return -1;
  Channel* to = nullptr;
  if (channel && !(to = Channel::from(channel))) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  bool sync = !to;
  if (sync && !(to = new_channel())) return -1;
  // Events of this id not yet handed out move along; those handed out stay counted.
  std::vector<Event*> moving;
  Channel* from = id->channel;
  from->events.remove_if([&](Event* e) {
    if (e->owner != id) return false;
    moving.push_back(e);
    return true;
  });
  for (Event* e : moving) to->events.push(e);
  if (id->sync) drop_kept_event(id);
  release_channel_locked(id);
  id->channel = to;
  ++to->ids;
  id->id.channel = &to->ch;
  id->sync = sync;
  return 0;
}

int rdma_init_qp_attr(rdma_cm_id* raw, ibv_qp_attr* attr, int* mask) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !mask) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  if (int err = qp_attr_locked(id, attr, mask)) return fail(err);
  return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* raw) {
  Id* id = Id::from(raw);
  return id ? htons(port_of(&id->id.route.addr.src_addr)) : 0;
}

__be16 rdma_get_dst_port(rdma_cm_id* raw) {
  Id* id = Id::from(raw);
  return id ? htons(port_of(&id->id.route.addr.dst_addr)) : 0;
}

ibv_context** rdma_get_devices(int* num_devices) {
  ibv_context* ctx = device_context();
  auto** list = static_cast<ibv_context**>(calloc(2, sizeof(ibv_context*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = ctx;
  if (num_devices) *num_devices = ctx ? 1 : 0;
  return list;
}

void rdma_free_devices(ibv_context** list) { free(list); }

int rdma_create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_port_space ps = res->ai_port_space ? static_cast<rdma_port_space>(res->ai_port_space)
                                          : RDMA_PS_TCP;
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(nullptr, &raw, nullptr, ps) != 0) return -1;
  Id* id = Id::from(raw);
  if (res->ai_qp_type) id->id.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  if (qp_init_attr) qp_init_attr->qp_type = id->id.qp_type;  // rdma_create_ep(3) decides it
  int rc;
  if (res->ai_flags & RAI_PASSIVE) {
    rc = rdma_bind_addr(raw, res->ai_src_addr);
    if (rc == 0 && qp_init_attr) {
      std::lock_guard<std::mutex> lock(g_mu);
      id->ep_attr = *qp_init_attr;
      id->has_ep_attr = true;
    }
    if (rc == 0 && pd) {
      std::lock_guard<std::mutex> lock(g_mu);
      id->ep_pd = pd;
    }
  } else {
    rc = rdma_resolve_addr(raw, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (rc == 0) rc = rdma_resolve_route(raw, 2000);
    if (rc == 0 && qp_init_attr) rc = rdma_create_qp(raw, pd, qp_init_attr);
  }
  if (rc != 0) {
    int err = errno;
    rdma_destroy_id(raw);
    return fail(err);
  }
  *out = raw;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* raw) {
  if (!Id::from(raw)) return;
  if (raw->qp) rdma_destroy_qp(raw);
  if (raw->srq) rdma_destroy_srq(raw);
  rdma_destroy_id(raw);
}

int rdma_create_srq_ex(rdma_cm_id* raw, ibv_srq_init_attr_ex* attr) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !id->id.verbs || id->id.srq) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->pd = pd_for(id, nullptr);
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  // An XRC SRQ: in the device's XRC domain unless one is given, completing on the id's
  // receive CQ (made here if there is none), as librdmacm does.
  if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_XRC) {
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
      attr->xrcd = device_xrcd();
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
      if (int err = create_cqs(id, nullptr, &id->id.recv_cq, 0, attr->attr.max_wr)) return fail(err);
      attr->cq = id->id.recv_cq;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
    }
  }
  ibv_srq* srq = ibv_create_srq_ex(id->id.verbs, attr);
  if (!srq) return -1;
  id->id.srq = srq;
  return 0;
}

int rdma_create_srq(rdma_cm_id* raw, ibv_pd* pd, ibv_srq_init_attr* attr) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !id->id.verbs || id->id.srq) return fail(EINVAL);
  if (id->id.qp_type == IBV_QPT_XRC_RECV) {
    // The SRQ of an XRC id is an XRC SRQ (rdma_create_srq(3)).
    ibv_srq_init_attr_ex ex{};
    ex.srq_context = attr->srq_context;
    ex.attr = attr->attr;
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = IBV_SRQT_XRC;
    ex.pd = pd;
    int rc = rdma_create_srq_ex(raw, &ex);
    attr->attr = ex.attr;
    return rc;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  ibv_srq* srq = ibv_create_srq(pd_for(id, pd), attr);
  if (!srq) return -1;
  id->id.srq = srq;
  return 0;
}

void rdma_destroy_srq(rdma_cm_id* raw) {
  Id* id = Id::from(raw);
  if (!id) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (id->id.srq) ibv_destroy_srq(id->id.srq);
  id->id.srq = nullptr;
}

int rdma_join_multicast_ex(rdma_cm_id* raw, rdma_cm_join_mc_attr_ex* attr, void* context) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
      (attr->comp_mask & ~(RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS)))
    return fail(EINVAL);
  uint32_t flags = (attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS)
                       ? attr->join_flags
                       : static_cast<uint32_t>(RDMA_MC_JOIN_FLAG_FULLMEMBER);
  if (flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    return fail(EINVAL);
  const sockaddr* addr = attr->addr;
  if (!is_multicast_addr(addr)) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  // rdma_join_multicast(3): a UD id, bound to the device (bind_addr or resolve_addr).
  if (id->id.qp_type != IBV_QPT_UD || !id->id.verbs) return fail(EINVAL);
  for (const Id::Group& g : id->groups)
    if (same_ip(reinterpret_cast<const sockaddr*>(&g.addr), addr)) return fail(EADDRINUSE);
  Id::Group g{};
  std::memcpy(&g.addr, addr, addr_len(addr));
  g.mgid = multicast_gid(addr);
  // A send-only member sends to the group without receiving from it.
  if (flags == RDMA_MC_JOIN_FLAG_FULLMEMBER && id->id.qp) {
    if (int err = ibv_attach_mcast(id->id.qp, &g.mgid, 0)) return fail(err);
    g.attached = true;
  }
  id->groups.push_back(g);
  // MULTICAST_JOIN carries what a sender needs: the group's address vector, the QPN
  // 0xFFFFFF and the qkey, and the join's context as private_data.
  Event* e = new_event(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
  if (e) {
    rdma_ud_param& ud = e->ev.param.ud;
    ud.private_data = context;
    ud.ah_attr.is_global = 1;
    ud.ah_attr.grh.dgid = g.mgid;
    ud.ah_attr.grh.sgid_index = static_cast<uint8_t>(id->sgid_index);
    ud.ah_attr.grh.hop_limit = 64;
    ud.ah_attr.grh.traffic_class = id->tos;
    ud.ah_attr.port_num = 1;
    ud.qp_num = 0xffffff;
    ud.qkey = RDMA_UDP_QKEY;
  }
  push_event(id, e);
  return 0;
}

int rdma_join_multicast(rdma_cm_id* raw, sockaddr* addr, void* context) {
  rdma_cm_join_mc_attr_ex attr{};
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  attr.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  attr.addr = addr;
  return rdma_join_multicast_ex(raw, &attr, context);
}

int rdma_leave_multicast(rdma_cm_id* raw, sockaddr* addr) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!addr) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = id->groups.begin(); it != id->groups.end(); ++it) {
    if (!same_ip(reinterpret_cast<const sockaddr*>(&it->addr), addr)) continue;
    if (it->attached && id->id.qp) ibv_detach_mcast(id->id.qp, &it->mgid, 0);
    id->groups.erase(it);
    return 0;
  }
  return fail(EADDRNOTAVAIL);
}

int rdma_set_local_ece(rdma_cm_id* raw, ibv_ece* ece) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!ece) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  id->local_ece = *ece;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* raw, ibv_ece* ece) {
  Id* id = checked(raw);
  if (!id) return -1;
  if (!ece) return fail(EINVAL);
  std::lock_guard<std::mutex> lock(g_mu);
  *ece = id->remote_ece;
  return 0;
}

}  // extern "C"
