// Receive work queues, indirection tables and RSS QPs (ibv_create_wq(3),
// ibv_create_rwq_ind_table(3), ibv_create_qp_ex(3) with IBV_QP_INIT_ATTR_RX_HASH): the
// receive side scaling of raw packet QPs. A frame a steering rule takes for an RSS QP goes
// to the WQ its Toeplitz hash picks (engine/raw_packet.cpp). docs/raw-packet.md.
#include <cerrno>
#include <mutex>
#include <new>

#include "core/core.hpp"
#include "engine/engine.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

std::atomic<uint32_t> g_next_wq_num{1};

void drain_wq(Wq* wq, bool flush);

int post_wq_recv(ibv_wq* w, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Wq* wq = Wq::from(w);
  if (!wq) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  int err = post_srq_recv(wq->rq, wr, bad);
  // In ERR a receive completes at once, flushed, as a QP's in ERR does.
  if (wq->state.load() == IBV_WQS_ERR) drain_wq(wq, true);
  return err;
}

// Takes every receive posted to the WQ. `flush` (to ERR): each completes with
// IBV_WC_WR_FLUSH_ERR, as a QP's do. Otherwise (to RESET) they go without completions, and
// so do its completions not polled yet (as libmlx5 cleans the CQ of the WQ's entries, and a
// QP's RESET here does).
void drain_wq(Wq* wq, bool flush) {
  Srq* srq = wq->rq;
  {
    std::lock_guard<QueueMutex> lock(srq->mu);
    uint64_t number;
    while (engine::srq_take_local(srq, &number)) {
      ibv_wc wc{};
      wc.wr_id = engine::srq_receive(srq, number).wr_id;
      engine::srq_consume(srq, number);
      if (!flush) continue;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = wq->ibv.wq_num;
      cq_push(srq->xrc_cq, wc, false);
    }
  }
  if (flush) return;
  cq_purge_qp(srq->xrc_cq, wq->ibv.wq_num);
  cq_polled(srq->xrc_cq);
}

}  // namespace

Wq* Wq::from(ibv_wq* w) {
  auto* wq = reinterpret_cast<Wq*>(w);
  return w && wq->magic == kWqMagic ? wq : nullptr;
}

RwqIndTable* RwqIndTable::from(ibv_rwq_ind_table* t) {
  auto* table = reinterpret_cast<RwqIndTable*>(t);
  return t && table->magic == kIndTableMagic ? table : nullptr;
}

ibv_wq* create_wq(Context* ctx, ibv_wq_init_attr* attr) {
  if (!attr) {
    errno = EINVAL;
    return nullptr;
  }
  Pd* pd = Pd::from(attr->pd);
  Cq* cq = Cq::from(attr->cq);
  if (attr->wq_type != IBV_WQT_RQ || !pd || !cq || pd->ctx != ctx || cq->ctx != ctx ||
      (attr->comp_mask & ~uint32_t(IBV_WQ_INIT_ATTR_FLAGS))) {
    errno = EINVAL;
    return nullptr;
  }
  // Stripping VLANs, scattering the FCS, delay drop, padding: NIC offloads softverbs has not.
  if ((attr->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && attr->create_flags) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = attr->max_wr;
  srq_attr.attr.max_sge = attr->max_sge;
  ibv_srq* s = create_srq(pd, &srq_attr);  // EINVAL for sizes past the device's
  if (!s) return nullptr;
  auto* wq = new (std::nothrow) Wq;
  if (!wq) {
    destroy_srq(Srq::from(s));
    errno = ENOMEM;
    return nullptr;
  }
  wq->ctx = ctx;
  wq->rq = Srq::from(s);
  wq->rq->xrc_cq = cq;
  cq->users++;
  attr->max_wr = srq_attr.attr.max_wr;  // the actual sizes, as for a QP
  attr->max_sge = srq_attr.attr.max_sge;
  ibv_wq& w = wq->ibv;
  w.context = ctx->ibv();
  w.pd = &pd->ibv;
  w.cq = cq->cq();
  w.wq_num = g_next_wq_num.fetch_add(1) & 0xffffff;
  w.handle = w.wq_num;
  w.state = IBV_WQS_RESET;
  w.wq_type = IBV_WQT_RQ;
  w.post_recv = &post_wq_recv;
  w.comp_mask = 0;
  // ibv_create_wq (verbs.h) sets wq_context, events_completed, the mutex and cond.
  return &wq->ibv;
}

int modify_wq(Wq* wq, ibv_wq_attr* attr) {
  if (!attr || !attr->attr_mask ||
      (attr->attr_mask & ~uint32_t(IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS)))
    return EINVAL;
  if ((attr->attr_mask & IBV_WQ_ATTR_FLAGS) && attr->flags_mask) return EOPNOTSUPP;
  int cur = wq->state.load();
  if ((attr->attr_mask & IBV_WQ_ATTR_CURR_STATE) && attr->curr_wq_state != cur) return EINVAL;
  if (!(attr->attr_mask & IBV_WQ_ATTR_STATE)) return 0;
  int next = attr->wq_state;
  // RESET -> RDY, RDY -> RDY, any -> RESET or ERR (the kernel's rules for a WQ).
  bool ok = next == IBV_WQS_RESET || next == IBV_WQS_ERR ||
            (next == IBV_WQS_RDY && (cur == IBV_WQS_RESET || cur == IBV_WQS_RDY));
  if (!ok) return EINVAL;
  wq->state.store(next);
  wq->ibv.state = static_cast<ibv_wq_state>(next);
  if (next == IBV_WQS_ERR && cur != IBV_WQS_ERR) drain_wq(wq, true);
  if (next == IBV_WQS_RESET) drain_wq(wq, false);
  return 0;
}

int destroy_wq(Wq* wq) {
  if (wq->users.load() != 0) return EBUSY;  // an indirection table names it
  Cq* cq = wq->rq->xrc_cq;
  cq_purge_qp(cq, wq->ibv.wq_num);  // its completions not polled go with it (libmlx5)
  cq_polled(cq);
  wq->rq->xrc_cq = nullptr;
  if (int err = destroy_srq(wq->rq)) {
    wq->rq->xrc_cq = cq;
    return err;
  }
  cq->users--;
  pthread_mutex_destroy(&wq->ibv.mutex);
  pthread_cond_destroy(&wq->ibv.cond);
  wq->magic = kDead;
  delete wq;
  return 0;
}

ibv_rwq_ind_table* create_rwq_ind_table(Context* ctx, ibv_rwq_ind_table_init_attr* attr) {
  constexpr uint32_t kMaxLogSize = 16;  // rss_caps.max_rwq_indirection_table_size 64 Ki
  if (!attr || attr->comp_mask || attr->log_ind_tbl_size > kMaxLogSize || !attr->ind_tbl) {
    errno = EINVAL;
    return nullptr;
  }
  auto* table = new (std::nothrow) RwqIndTable;
  if (!table) {
    errno = ENOMEM;
    return nullptr;
  }
  size_t n = size_t(1) << attr->log_ind_tbl_size;
  table->wqs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Wq* wq = Wq::from(attr->ind_tbl[i]);
    if (!wq || wq->ctx != ctx) {
      delete table;
      errno = EINVAL;
      return nullptr;
    }
    table->wqs.push_back(wq);
  }
  for (Wq* wq : table->wqs) wq->users++;
  static std::atomic<int> next_num{1};
  table->ctx = ctx;
  table->ibv.context = ctx->ibv();
  table->ibv.ind_tbl_num = next_num.fetch_add(1);
  table->ibv.ind_tbl_handle = table->ibv.ind_tbl_num;
  table->ibv.comp_mask = 0;
  return &table->ibv;
}

int destroy_rwq_ind_table(RwqIndTable* table) {
  if (table->users.load() != 0) return EBUSY;  // an RSS QP uses it
  for (Wq* wq : table->wqs) wq->users--;
  table->magic = kDead;
  delete table;
  return 0;
}

ibv_qp* create_rss_qp(Context* ctx, ibv_qp_init_attr_ex* ex) {
  constexpr uint64_t kFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                               IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP |
                               IBV_RX_HASH_DST_PORT_TCP | IBV_RX_HASH_SRC_PORT_UDP |
                               IBV_RX_HASH_DST_PORT_UDP;
  RwqIndTable* table = RwqIndTable::from(ex->rwq_ind_tbl);
  Pd* pd = Pd::from(ex->pd);
  const ibv_rx_hash_conf& h = ex->rx_hash_conf;
  if (ex->qp_type != IBV_QPT_RAW_PACKET || !table || !pd || table->ctx != ctx || pd->ctx != ctx ||
      !(ex->comp_mask & IBV_QP_INIT_ATTR_RX_HASH)) {
    errno = EINVAL;
    return nullptr;
  }
  // Toeplitz over IP addresses and TCP/UDP ports (ESP SPIs and inner headers: no).
  const uint64_t f = h.rx_hash_fields_mask;
  if (h.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || (f & ~kFields)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // mlx5's rules: a 40-byte key; IPv4 or IPv6 fields, TCP or UDP ones, not both; no fields
  // (no hash) only over a table of one WQ.
  constexpr uint64_t kV4 = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4;
  constexpr uint64_t kV6 = IBV_RX_HASH_SRC_IPV6 | IBV_RX_HASH_DST_IPV6;
  constexpr uint64_t kTcp = IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP;
  constexpr uint64_t kUdp = IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
  if ((f && (h.rx_hash_key_len != 40 || !h.rx_hash_key)) || ((f & kV4) && (f & kV6)) ||
      ((f & kTcp) && (f & kUdp)) || (!f && table->wqs.size() > 1)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* rss = new (std::nothrow) RxHash;
  if (!rss || !ensure_tgt_resources(ctx)) {
    delete rss;
    errno = ENOMEM;
    return nullptr;
  }
  rss->key.assign(h.rx_hash_key, h.rx_hash_key + (h.rx_hash_fields_mask ? h.rx_hash_key_len : 0));
  rss->fields = h.rx_hash_fields_mask;
  rss->table = table;
  // A receive-only raw QP: no queues of its own (its receives are the WQs'), the context's
  // hidden CQ where a QP needs one.
  ibv_qp_init_attr attr{};
  attr.qp_context = ex->qp_context;
  attr.send_cq = attr.recv_cq = ctx->xrc_cq->cq();
  attr.qp_type = IBV_QPT_RAW_PACKET;
  ibv_qp* q = create_qp(pd, &attr);
  if (!q) {
    delete rss;
    return nullptr;
  }
  Qp* qp = Qp::from(q);
  qp->rss = rss;
  qp->cap = {};
  ex->cap = {};
  q->send_cq = q->recv_cq = nullptr;
  table->users++;
  return q;
}

void forget_rss(Qp* qp) {
  if (!qp->rss) return;
  qp->rss->table->users--;
  delete qp->rss;
  qp->rss = nullptr;
}

}  // namespace softverbs
