#include "abi/context_ops.hpp"

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "common/verbs_ext.hpp"
#include "core/device.hpp"
#include "verbs/verbs.hpp"

extern "C" int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* attr);

namespace softverbs::abi {

namespace {

// A typed "not supported" for any op slot: pointer results are NULL with errno EOPNOTSUPP,
// int results EOPNOTSUPP, void results nothing.
template <typename Fn>
struct Unsupported;
template <typename R, typename... A>
struct Unsupported<R (*)(A...)> {
  static R fn(A...) {
    if constexpr (std::is_pointer_v<R>) {
      errno = EOPNOTSUPP;
      return nullptr;
    } else if constexpr (std::is_void_v<R>) {
      return;
    } else {
      errno = EOPNOTSUPP;
      return static_cast<R>(EOPNOTSUPP);
    }
  }
};
template <typename Slot>
void unsupported(Slot& slot) {
  slot = &Unsupported<Slot>::fn;
}

int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) { return poll_cq(reinterpret_cast<Cq*>(cq), n, wc); }

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  Cq* c = Cq::from(cq);
  return c ? req_notify_cq(c, solicited_only) : EINVAL;
}

int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* q = Qp::from(qp);
  if (!q) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  return post_send(q, wr, bad);
}

int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* q = Qp::from(qp);
  if (!q) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  return post_recv(q, wr, bad);
}

int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Srq* s = Srq::from(srq);
  if (!s) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  return post_srq_recv(s, wr, bad);
}

int op_query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t len) {
  if (port < 1 || port > kPortCount || !attr) return EINVAL;
  ibv_port_attr full;
  Device::instance().fill_port_attr(&full);
  std::memcpy(attr, &full, std::min(len, sizeof(full)));
  return 0;
}

void fill_odp_dm_attr(ibv_device_attr_ex* attr);  // odp-dm (below)

int op_query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* input,
                       ibv_device_attr_ex* attr, size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  Device::instance().fill_device_attr(&full.orig_attr);
  full.phys_port_cnt_ex = kPortCount;
  // The 64-bit flags repeat the 32 of ibv_device_attr (the memory window bits among them),
  // plus (ex-qp) IBA 1.5's ATOMIC WRITE and FLUSH (both placement types), the bits librpma tests.
  full.device_cap_flags_ex = static_cast<uint32_t>(full.orig_attr.device_cap_flags);
  full.device_cap_flags_ex |= kDeviceAtomicWrite | kDeviceFlushGlobal | kDeviceFlushPersistent;
  // Extended CQs: completion timestamps and their clock, no CQ moderation (ex-cq).
  fill_cq_ex_attr(&full);
  fill_odp_dm_attr(&full);  // odp-dm
  fill_tm_caps(&full.tm_caps);  // tag matching (pyverbs-more)
  // XRC (xrc): ODP on XRC as on RC (the same responder and requester); receives land in
  // XRC SRQs only (no RECV bit: an XRC TGT QP has no receive queue).
  full.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                      IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  // RSS (verbs/wq.cpp): raw packet QPs hash IP addresses and TCP/UDP ports with Toeplitz
  // over WQs; the table sizes are softverbs' own bounds (create_rwq_ind_table).
  full.rss_caps.supported_qpts = 1u << IBV_QPT_RAW_PACKET;
  full.rss_caps.max_rwq_indirection_tables = uint32_t(full.orig_attr.max_qp);
  full.rss_caps.max_rwq_indirection_table_size = 1u << 16;
  full.rss_caps.rx_hash_fields_mask =
      IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 | IBV_RX_HASH_DST_IPV6 |
      IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP | IBV_RX_HASH_SRC_PORT_UDP |
      IBV_RX_HASH_DST_PORT_UDP;
  full.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
  full.max_wq_type_rq = uint32_t(full.orig_attr.max_srq);  // a WQ's receives are an SRQ's
  std::memcpy(attr, &full, std::min(attr_size, sizeof(full)));
  return 0;
}

// ---- Extended CQs, ibv_modify_cq, ibv_query_rt_values_ex, ibv_create_srq_ex (ex-cq) ----
ibv_cq_ex* op_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create_cq_ex(ctx, attr);
}

int op_modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr) {
  Cq* c = Cq::from(cq);
  return c ? modify_cq(c, attr) : EINVAL;
}

int op_query_rt_values(ibv_context* context, ibv_values_ex* values) {
  return Context::from(context) ? query_rt_values(values) : EINVAL;
}

ibv_srq* op_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create_srq_ex(ctx, attr);
}
// ---- end of ex-cq ops ----

// ---- Tag matching: ibv_post_srq_ops (pyverbs-more; verbs/tag_matching.cpp) ----
int op_post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  Srq* s = Srq::from(srq);
  if (!s) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  return post_srq_ops(s, wr, bad);
}
// ---- end of tag matching ops ----

// ---- memory windows (verbs/mw.cpp) ----------------------------------------------------
// <infiniband/verbs.h> inlines reach these: ibv_alloc_mw, ibv_bind_mw (after its own type,
// MR and PD checks), ibv_dealloc_mw.
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  Pd* p = Pd::from(pd);
  if (!p) {
    errno = EINVAL;
    return nullptr;
  }
  return alloc_mw(p, type);
}

int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  Qp* q = Qp::from(qp);
  Mw* w = Mw::from(mw);
  if (!q || !w || !bind || w->pd->ctx != q->ctx) return EINVAL;
  return bind_mw(q, w, bind);
}

int op_dealloc_mw(ibv_mw* mw) {
  Mw* w = Mw::from(mw);
  return w ? dealloc_mw(w) : EINVAL;
}
// ---- end of memory windows --------------------------------------------------------------

// The extended create: what the plain one can do (a PD), the creation flags we honour
// (BLOCK_SELF_MCAST_LB, SOURCE_QPN for QP1) and send-ops flags (the ibv_wr_* API,
// verbs/qp_ex.cpp). XRC, RSS and the rest are not implemented.
ibv_qp* op_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* ex) {
  // XRC TGT QP: an XRC domain instead of a PD (verbs/xrc.cpp).
  if (ex && ex->qp_type == IBV_QPT_XRC_RECV) {
    Context* ctx = Context::from(context);
    if (!ctx || (ex->comp_mask & ~uint32_t(IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
        ((ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ex->create_flags)) {
      errno = ctx ? EOPNOTSUPP : EINVAL;
      return nullptr;
    }
    return create_xrc_tgt_qp(ctx, ex);
  }
  if (!ex || !(ex->comp_mask & IBV_QP_INIT_ATTR_PD)) {
    errno = EINVAL;
    return nullptr;
  }
  // RSS: a receive-only raw QP spreading frames over an indirection table's WQs (verbs/wq.cpp).
  if (ex->comp_mask & (IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE)) {
    Context* ctx = Context::from(context);
    constexpr uint32_t kRssMask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                                  IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
    if (!ctx || (ex->comp_mask & ~kRssMask) || !(ex->comp_mask & IBV_QP_INIT_ATTR_IND_TABLE) ||
        ((ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ex->create_flags)) {
      errno = EINVAL;
      return nullptr;
    }
    return create_rss_qp(ctx, ex);
  }
  constexpr uint32_t kKnownMask =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
      IBV_QP_INIT_ATTR_XRCD;  // an XRC INI QP may name one; it is not used
  if ((ex->comp_mask & ~kKnownMask) ||
      ((ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
       (ex->create_flags & ~(IBV_QP_CREATE_BLOCK_SELF_MCAST_LB | IBV_QP_CREATE_SOURCE_QPN)))) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // SOURCE_QPN: only a UD QP speaking as QP1 (the CM's MAD agent, decision 0007).
  const bool source_qpn = (ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
                          (ex->create_flags & IBV_QP_CREATE_SOURCE_QPN);
  if (source_qpn && (ex->qp_type != IBV_QPT_UD || ex->source_qpn != 1)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // Extended QP: the send ops asked for must be ones this device and QP type have.
  const uint64_t send_ops =
      (ex->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? ex->send_ops_flags : 0;
  if (int err = check_send_ops_flags(ex->qp_type, send_ops)) {
    errno = err;
    return nullptr;
  }
  Pd* pd = Pd::from(ex->pd);
  if (!pd || pd->ctx != Context::from(context)) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr attr{};
  attr.qp_context = ex->qp_context;
  attr.send_cq = ex->send_cq;
  attr.recv_cq = ex->recv_cq;
  attr.srq = ex->srq;
  attr.cap = ex->cap;
  attr.qp_type = ex->qp_type;
  attr.sq_sig_all = ex->sq_sig_all;
  ibv_qp* qp = create_qp(pd, &attr);
  if (!qp) return nullptr;
  ex->cap = attr.cap;
  if ((ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
      (ex->create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB))
    Qp::from(qp)->block_self_mcast = true;
  install_qp_ex(Qp::from(qp), send_ops);
  if (source_qpn && !claim_gsi(Qp::from(qp))) {
    ibv_destroy_qp(qp);
    errno = EBUSY;  // one QP1 agent per process
    return nullptr;
  }
  return qp;
}

// ---- receive work queues and RSS (verbs/wq.cpp)
ibv_wq* op_create_wq(ibv_context* context, ibv_wq_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create_wq(ctx, attr);
}

int op_modify_wq(ibv_wq* wq, ibv_wq_attr* attr) {
  Wq* w = Wq::from(wq);
  return w ? modify_wq(w, attr) : EINVAL;
}

int op_destroy_wq(ibv_wq* wq) {
  Wq* w = Wq::from(wq);
  return w ? destroy_wq(w) : EINVAL;
}

ibv_rwq_ind_table* op_create_rwq_ind_table(ibv_context* context, ibv_rwq_ind_table_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create_rwq_ind_table(ctx, attr);
}

int op_destroy_rwq_ind_table(ibv_rwq_ind_table* table) {
  RwqIndTable* t = RwqIndTable::from(table);
  return t ? destroy_rwq_ind_table(t) : EINVAL;
}

ibv_flow* op_create_flow(ibv_qp* qp, ibv_flow_attr* attr) {
  Qp* q = Qp::from(qp);
  if (!q) {
    errno = EINVAL;
    return nullptr;
  }
  return create_flow(q, attr);
}

int op_destroy_flow(ibv_flow* flow) { return destroy_flow(flow); }

// ---- XRC (verbs/xrc.cpp) ----------------------------------------------------------------
ibv_xrcd* op_open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return open_xrcd(ctx, attr);
}

int op_close_xrcd(ibv_xrcd* xrcd) {
  Xrcd* x = Xrcd::from(xrcd);
  return x ? close_xrcd(x) : EINVAL;
}

int op_get_srq_num(ibv_srq* srq, uint32_t* num) {
  Srq* s = Srq::from(srq);
  return s ? get_srq_num(s, num) : EINVAL;
}

ibv_qp* op_open_qp(ibv_context* context, ibv_qp_open_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return open_xrc_qp(ctx, attr);
}
// ---- end of XRC -------------------------------------------------------------------------

// --- ODP, device memory, thread and parent domains (issue 13, odp-dm) ---
int op_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                 uint32_t num_sge) {
  Pd* p = Pd::from(pd);
  return p ? advise_mr(p, advice, flags, sg_list, num_sge) : EINVAL;
}

ibv_dm* op_alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return alloc_dm(ctx, attr);
}

int op_free_dm(ibv_dm* dm) {
  Dm* d = Dm::from(dm);
  return d ? free_dm(d) : EINVAL;
}

ibv_mr* op_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned access) {
  Pd* p = Pd::from(pd);
  Dm* d = Dm::from(dm);
  if (!p || !d) {
    errno = EINVAL;
    return nullptr;
  }
  return reg_dm_mr(p, d, offset, length, access);
}

ibv_td* op_alloc_td(ibv_context* context, ibv_td_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return alloc_td(ctx, attr);
}

int op_dealloc_td(ibv_td* td) {
  Td* t = Td::from(td);
  return t ? dealloc_td(t) : EINVAL;
}

ibv_pd* op_alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return alloc_parent_domain(ctx, attr);
}

// What query_device_ex says about them: ODP on every transport and operation we have
// (implicit ODP too), and device memory.
void fill_odp_dm_attr(ibv_device_attr_ex* attr) {
  attr->odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  const uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  attr->odp_caps.per_transport_caps.rc_odp_caps = rc;
  attr->odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
  attr->odp_caps.per_transport_caps.ud_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  attr->max_dm_size = kMaxDmSize;
}
// --- end odp-dm ---

}  // namespace

void fill_context_ops(Context* ctx) {
  ibv_context_ops& ops = ctx->ibv()->ops;
  verbs_context& v = ctx->vctx;

  ops._compat_query_device = &ibv_query_device;
  ops._compat_query_port = &ibv_query_port;
  unsupported(ops._compat_alloc_pd);
  unsupported(ops._compat_dealloc_pd);
  unsupported(ops._compat_reg_mr);
  unsupported(ops._compat_rereg_mr);
  unsupported(ops._compat_dereg_mr);
  ops.alloc_mw = &op_alloc_mw;  // memory windows
  ops.bind_mw = &op_bind_mw;
  ops.dealloc_mw = &op_dealloc_mw;
  unsupported(ops._compat_create_cq);
  ops.poll_cq = &op_poll_cq;
  ops.req_notify_cq = &op_req_notify_cq;
  unsupported(ops._compat_cq_event);
  unsupported(ops._compat_resize_cq);
  unsupported(ops._compat_destroy_cq);
  unsupported(ops._compat_create_srq);
  unsupported(ops._compat_modify_srq);
  unsupported(ops._compat_query_srq);
  unsupported(ops._compat_destroy_srq);
  ops.post_srq_recv = &op_post_srq_recv;
  unsupported(ops._compat_create_qp);
  unsupported(ops._compat_query_qp);
  unsupported(ops._compat_modify_qp);
  unsupported(ops._compat_destroy_qp);
  ops.post_send = &op_post_send;
  ops.post_recv = &op_post_recv;
  unsupported(ops._compat_create_ah);
  unsupported(ops._compat_destroy_ah);
  unsupported(ops._compat_attach_mcast);
  unsupported(ops._compat_detach_mcast);
  unsupported(ops._compat_async_event);

  v.query_port = &op_query_port;
  unsupported(v.alloc_null_mr);
  unsupported(v.read_counters);
  unsupported(v.attach_counters_point_flow);
  unsupported(v.create_counters);
  unsupported(v.destroy_counters);
  unsupported(v.modify_flow_action_esp);
  unsupported(v.destroy_flow_action);
  unsupported(v.create_flow_action_esp);
  unsupported(v.modify_qp_rate_limit);
  v.modify_cq = &op_modify_cq;  // ex-cq
  v.post_srq_ops = &op_post_srq_ops;  // tag matching
  v.destroy_rwq_ind_table = &op_destroy_rwq_ind_table;  // RSS (verbs/wq.cpp)
  v.create_rwq_ind_table = &op_create_rwq_ind_table;
  v.destroy_wq = &op_destroy_wq;
  v.modify_wq = &op_modify_wq;
  v.create_wq = &op_create_wq;
  v.query_rt_values = &op_query_rt_values;  // ex-cq
  v.create_cq_ex = &op_create_cq_ex;        // ex-cq
  v.priv = nullptr;
  v.query_device_ex = &op_query_device_ex;
  v.ibv_destroy_flow = &op_destroy_flow;  // raw packet QPs' steering (verbs/flow.cpp)
  v.ibv_create_flow = &op_create_flow;
  // Binaries built against libibverbs 1.1.8 call the flow verbs through these two slots.
  v.ABI_placeholder1 = reinterpret_cast<void (*)()>(v.ibv_create_flow);
  v.ABI_placeholder2 = reinterpret_cast<void (*)()>(v.ibv_destroy_flow);
  v.open_qp = &op_open_qp;  // xrc
  v.create_qp_ex = &op_create_qp_ex;
  v.get_srq_num = &op_get_srq_num;  // xrc
  v.create_srq_ex = &op_create_srq_ex;  // ex-cq
  v.open_xrcd = &op_open_xrcd;  // xrc
  v.close_xrcd = &op_close_xrcd;
  // odp-dm: ODP prefetch, device memory, thread and parent domains.
  v.advise_mr = &op_advise_mr;
  v.alloc_dm = &op_alloc_dm;
  v.free_dm = &op_free_dm;
  v.reg_dm_mr = &op_reg_dm_mr;
  v.alloc_td = &op_alloc_td;
  v.dealloc_td = &op_dealloc_td;
  v.alloc_parent_domain = &op_alloc_parent_domain;
  v.sz = sizeof(verbs_context);
}

}  // namespace softverbs::abi
