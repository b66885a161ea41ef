// Queue pairs: creation with actual caps, the state machine, posting work requests.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "core/device.hpp"
#include "common/verbs_ext.hpp"
#include "verbs/verbs.hpp"
#include "wire/shm/mcast.hpp"
#include "wire/transport.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {

constexpr uint32_t kDefaultInline = 64;

bool valid_mtu(int mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096; }

// Checks attribute values (the mask rules are in qp_transitions.cpp).
int check_values(Qp* qp, const ibv_qp_attr* a, int mask) {
  const auto& dev = Device::instance();
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && !valid_mtu(a->path_mtu)) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > Limits::max_qp_rd_atom)
    return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > Limits::max_qp_rd_atom)
    return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_SQ_PSN) && a->sq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_RQ_PSN) && a->rq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                              kAccessFlushGlobal | kAccessFlushPersistent |
                              // odp-dm: an MR flag that applications (pyverbs' ODP tests)
                              // pass here too; the kernel takes and ignores it.
                              IBV_ACCESS_ON_DEMAND)))
    return EINVAL;
  if (mask & IBV_QP_AV) {
    // RoCE: the address vector must carry a GRH with a valid source GID index.
    const ibv_ah_attr& ah = a->ah_attr;
    if (!ah.is_global || ah.grh.sgid_index >= dev.gids().size()) return EINVAL;
    if (ah.port_num != 0 && ah.port_num != 1) return EINVAL;
  }
  if (mask & IBV_QP_CAP) return EINVAL;  // resizing a QP is not supported
  if ((mask & IBV_QP_ALT_PATH) || (mask & IBV_QP_PATH_MIG_STATE)) return EOPNOTSUPP;
  (void)qp;
  return 0;
}

void apply_attrs(Qp* qp, const ibv_qp_attr* a, int mask) {
  std::lock_guard<std::mutex> lock(qp->attr_mu);
  ibv_qp_attr& s = qp->attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_QKEY) s.qkey = a->qkey;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a->rq_psn;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a->sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = a->en_sqd_async_notify;
}

void refresh_send_path(Qp* qp) {
  std::lock_guard<QueueMutex> sq(qp->sq_mu);
  std::lock_guard<std::mutex> attrs(qp->attr_mu);
  Qp::SendPath& p = qp->send_path;
  const ibv_qp_attr& a = qp->attr;
  p.dest_qpn = a.dest_qp_num;
  p.dgid = a.ah_attr.grh.dgid;
  p.route = wire::route(p.dgid, p.dest_qpn);
  p.qkey = a.qkey;
  p.timeout = a.timeout;
  p.retry_cnt = a.retry_cnt;
  p.rnr_retry = a.rnr_retry;
  // A new sq_psn (a QP reset and connected again): the trace counts from it.
  if (qp->debug.psn_known && (a.sq_psn & 0xffffff) != qp->debug.psn_base) qp->debug.psn_known = false;
}

// RESET discards every WQE without a completion and forgets the connection.
void reset_queues(Qp* qp) {
  {
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    qp->sq.clear();
    qp->sq_drain_notify = false;
    // The window into the old peer's receive queue is over too: a new peer may get the
    // dead one's QPN, and its messages must not land in the dead one's still-mapped ring.
    engine::drop_peer_window(qp);
  }
  std::lock_guard<QueueMutex> lock(qp->rq_mu);
  qp->rq.clear();
  qp->comm_est_raised = false;
  qp->last_wqe_raised = false;
  std::lock_guard<std::mutex> alock(qp->attr_mu);
  ibv_qp_attr fresh{};
  qp->attr = fresh;
  qp->connection = 0;  // what a dead peer's timer was armed for is over
  qp->peer_pid = 0;
}

bool opcode_allowed(ibv_qp_type type, ibv_wr_opcode op) {
  if (type == IBV_QPT_XRC_RECV) return false;  // a TGT QP has no send queue
  if (type == IBV_QPT_RAW_PACKET) return op == IBV_WR_SEND;  // a frame, nothing more
  // An XRC INI QP has RC's operations, windows and invalidation included: ibv_post_send(3)'s
  // table, and mlx5's _mlx5_post_send (the XRC case falls through to RC's); XRC has the
  // IETH opcodes (0xB6, 0xB7).
  if (type == IBV_QPT_XRC_SEND) type = IBV_QPT_RC;
  switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return true;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return type != IBV_QPT_UD;
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return type == IBV_QPT_RC;
    // Memory windows (ibv_post_send(3)'s table: UC, RC, XRC). SEND_WITH_INV on RC (and
    // XRC) only: IBA has no UC opcode that carries an IETH, so no peer on the wire could
    // take it.
    case IBV_WR_LOCAL_INV:
    case IBV_WR_BIND_MW:
      return type == IBV_QPT_RC || type == IBV_QPT_UC;
    case IBV_WR_SEND_WITH_INV:
      return type == IBV_QPT_RC;
    default:
      return false;
  }
}

// The opcodes only the ibv_wr_* API can post (ibv_send_wr has no room for their operands):
// ATOMIC WRITE and FLUSH, RC only (IBA 1.5, as rxe).
bool extended_opcode_allowed(ibv_qp_type type, ibv_wr_opcode op, const ExWr& ex) {
  if (type != IBV_QPT_RC) return false;
  if (op == IBV_WR_ATOMIC_WRITE) return true;
  if (op != kWrFlush) return false;
  bool type_ok = ex.flush_type != 0 && !(ex.flush_type & ~(kFlushGlobal | kFlushPersistent));
  return type_ok && (ex.flush_level == kFlushRange || ex.flush_level == kFlushMr) &&
         ex.flush_length <= kMaxMsgSize;
}

// The checks of a WR's payload of `sum` bytes, for both APIs: atomics take 8 bytes and no
// inline, inline data fits, and a UD WR names an AH of this device (checked here, so that a
// batch of the ibv_wr_* API fails before any of it is posted).
[[gnu::always_inline]] inline int check_payload(Qp* qp, const ibv_send_wr* wr, uint64_t sum) {
  bool atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (atomic && (sum != 8 || (wr->send_flags & IBV_SEND_INLINE))) return EINVAL;
  bool inl = (wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ;
  if (inl && sum > qp->cap.max_inline_data) return EINVAL;
  if (qp->type == IBV_QPT_UD) {
    Ah* ah = Ah::from(wr->wr.ud.ah);
    if (!ah || ah->pd->ctx != qp->ctx) return EINVAL;
  }
  return 0;
}

// The argument checks of ibv_post_send(3) for one WR; *total gets its length.
int check_send_wr(Qp* qp, const ibv_send_wr* wr, uint64_t* total) {
  // A C caller may store any integer in the enum: look at it as one before trusting it.
  uint32_t raw;
  std::memcpy(&raw, &wr->opcode, sizeof(raw));
  auto op = static_cast<ibv_wr_opcode>(raw);
  if (raw > IBV_WR_SEND_WITH_INV || !opcode_allowed(qp->type, op)) return EINVAL;
  if (engine::is_local_op(op)) {  // no payload: the scatter/gather list is not looked at
    *total = 0;
    return 0;
  }
  if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge) return EINVAL;
  if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
  if (qp->type == IBV_QPT_XRC_SEND && wr->qp_type.xrc.remote_srqn > 0xffffff) return EINVAL;
  // Checksum offload of a raw frame: the device does not offer it (IBV_DEVICE_RAW_IP_CSUM).
  if ((wr->send_flags & IBV_SEND_IP_CSUM) && qp->type == IBV_QPT_RAW_PACKET) return EINVAL;
  uint64_t sum = 0;
  for (int i = 0; i < wr->num_sge; ++i) sum += wr->sg_list[i].length;
  *total = sum;
  return check_payload(qp, wr, sum);
}

// The same for a WR of the ibv_wr_* API, minus what its wr_* calls made sure of: its opcode
// is one the QP's send_ops_flags enabled (checked against the QP type at create, and only
// those ops are in its table); its SGE count and inline length were checked, and its
// length summed, when they were set (qp_ex.cpp).
[[gnu::always_inline]] inline int check_ex_wr(Qp* qp, const ExWr& e, uint64_t* total) {
  ibv_wr_opcode op = e.wr.opcode;
  if (op == IBV_WR_ATOMIC_WRITE || op == kWrFlush) {
    if (!extended_opcode_allowed(qp->type, op, e)) return EINVAL;
    *total = op == kWrFlush ? e.flush_length : 8;
    return 0;
  }
  if (engine::is_local_op(op)) {
    *total = 0;
    return 0;
  }
  *total = e.length;
  return check_payload(qp, &e.wr, e.length);
}

// Turns one checked send WR of `total` bytes into a WQE (copying inline data now: the
// application may reuse the buffer as soon as ibv_post_send returns).
int build_send_wqe(Qp* qp, const ibv_send_wr* wr, uint64_t total, SendWqe* w, const ExWr* ex) {
  w->wr_id = wr->wr_id;
  w->opcode = wr->opcode;
  w->flags = wr->send_flags;
  w->imm = wr->imm_data;
  w->total_length = total;
  if (qp->type == IBV_QPT_XRC_SEND) w->xrc_srqn = wr->qp_type.xrc.remote_srqn;
  if (wr->opcode == IBV_WR_BIND_MW) {
    // Type 2 only: a type 1 window is bound by ibv_bind_mw (IBA 10.6.7.2).
    if (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2) return EINVAL;
    return fill_bind_wqe(qp, wr->bind_mw.mw, wr->bind_mw.rkey, wr->bind_mw.bind_info, w);
  }
  if (wr->opcode == IBV_WR_LOCAL_INV) return 0;  // w->imm is the key (the union)
  // ATOMIC WRITE's 8 bytes and FLUSH's range are operands, not a gather list.
  bool no_data = ex && (wr->opcode == IBV_WR_ATOMIC_WRITE || wr->opcode == kWrFlush);
  bool inl = (wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ;
  if (no_data) {
    w->flags &= ~IBV_SEND_INLINE;
  } else if (inl) {
    w->inline_data.resize(total);
    size_t off = 0;
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      if (s.length) std::memcpy(w->inline_data.data() + off, reinterpret_cast<void*>(s.addr), s.length);
      off += s.length;
    }
  } else {
    w->sges.reserve(wr->num_sge);
    for (int i = 0; i < wr->num_sge; ++i)
      w->sges.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
  }
  switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      w->remote_addr = wr->wr.rdma.remote_addr;
      w->rkey = wr->wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      w->remote_addr = wr->wr.atomic.remote_addr;
      w->rkey = wr->wr.atomic.rkey;
      w->compare_add = wr->wr.atomic.compare_add;
      w->swap = wr->wr.atomic.swap;
      break;
    default:
      break;
  }
  if (ex && wr->opcode == IBV_WR_ATOMIC_WRITE) {
    w->remote_addr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    w->compare_add = ex->atomic_value;
  } else if (ex && wr->opcode == kWrFlush) {
    w->remote_addr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    w->compare_add = ex->flush_type;
    w->swap = ex->flush_level;
  }
  if (qp->type == IBV_QPT_UD) {
    Ah* ah = Ah::from(wr->wr.ud.ah);  // checked by check_send_wr
    if (!ah) return EINVAL;
    const auto& gids = Device::instance().gids();
    w->sgid = gids[ah->attr.grh.sgid_index].gid;
    w->dgid = ah->attr.grh.dgid;
    w->hop_limit = ah->attr.grh.hop_limit;
    w->remote_qpn = wr->wr.ud.remote_qpn;
    w->remote_qkey = wr->wr.ud.remote_qkey;
  }
  return 0;
}

int check_recv_wr(const ibv_recv_wr* wr, uint32_t max_sge) {
  if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge) return EINVAL;
  if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
  return 0;
}

// Fills a queue slot in place (it keeps the SGE storage of the WQE it held before).
// Under the queue's lock: the senders that met it empty (RNR), to kick once it is unlocked.
// Callers look first whether there are any (the data path's case: none, and then nothing is
// allocated, freed or called).
std::vector<uint32_t> take_rnr_waiters(std::set<uint32_t>& waiting) {
  std::vector<uint32_t> taken(waiting.begin(), waiting.end());
  waiting.clear();
  return taken;
}

RecvWqe& push_recv_wqe(RingQueue<RecvWqe>& q, const ibv_recv_wr* wr) {
  RecvWqe& r = q.push_slot();
  r.wr_id = wr->wr_id;
  r.place = nullptr;  // resolved again when published (receive_capacity)
  r.sges.resize(wr->num_sge);
  Sge* to = r.sges.data();
  for (int i = 0; i < wr->num_sge; ++i)
    to[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
  return r;
}

}  // namespace

Qp* Qp::from(ibv_qp* q) {
  auto* qp = reinterpret_cast<Qp*>(q);
  return q && qp->magic == kQpMagic ? qp : nullptr;
}

Ah* Ah::from(ibv_ah* a) {
  auto* ah = reinterpret_cast<Ah*>(a);
  return a && ah->magic == kAhMagic ? ah : nullptr;
}

Pd* Pd::from(ibv_pd* p) {
  auto* pd = reinterpret_cast<Pd*>(p);
  return p && pd->magic == kPdMagic ? pd : nullptr;
}

Mr* Mr::from(ibv_mr* m) {
  auto* mr = reinterpret_cast<Mr*>(m);
  return m && mr->magic == kMrMagic ? mr : nullptr;
}

ibv_qp* create_qp(Pd* pd, ibv_qp_init_attr* init, uint32_t qpn_wanted) {
  Context* ctx = pd->ctx;
  Cq* scq = Cq::from(init->send_cq);
  Cq* rcq = Cq::from(init->recv_cq);
  Srq* srq = init->srq ? Srq::from(init->srq) : nullptr;
  if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC && init->qp_type != IBV_QPT_UD &&
      init->qp_type != IBV_QPT_XRC_SEND && init->qp_type != IBV_QPT_XRC_RECV &&
      init->qp_type != IBV_QPT_RAW_PACKET) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp_cap& cap = init->cap;
  // An XRC INI QP sends only: no receive queue, SRQ or receive CQ (its receive caps are 0,
  // as ibv_create_qp_ex reports them); its completions are send completions.
  const bool xrc_ini = init->qp_type == IBV_QPT_XRC_SEND;
  if (xrc_ini) {
    if (init->srq) {
      errno = EINVAL;
      return nullptr;
    }
    rcq = scq;
    cap.max_recv_wr = cap.max_recv_sge = 0;
  }
  if (!scq || !rcq || scq->ctx != ctx || rcq->ctx != ctx || (init->srq && !srq) ||
      (srq && srq->ctx != ctx) || cap.max_send_wr > uint32_t(device_limits().max_qp_wr) ||
      (!srq && cap.max_recv_wr > uint32_t(device_limits().max_qp_wr)) || cap.max_send_sge > Limits::max_sge ||
      (!srq && cap.max_recv_sge > Limits::max_sge) || cap.max_inline_data > Limits::max_inline) {
    errno = EINVAL;
    return nullptr;
  }
  // A raw packet QP sends on the port's interface: the kernel's CAP_NET_RAW check for one
  // is ours opening its packet socket (EPERM without it).
  const bool raw = init->qp_type == IBV_QPT_RAW_PACKET;
  if (raw) {
    if (int err = engine::raw_qp_created()) {
      errno = err;
      return nullptr;
    }
  }
  // Counted (device_limits().max_qp), with a number of this process's (as many).
  if (!count_object(Counted::Qp)) {
    if (raw) engine::raw_qp_create_failed();
    errno = ENOMEM;
    return nullptr;
  }
  if (qpn_wanted && wire::find_local(qpn_wanted)) {  // that number names a QP here already
    uncount_object(Counted::Qp);
    if (raw) engine::raw_qp_create_failed();
    errno = EEXIST;
    return nullptr;
  }
  auto* qp = new (std::nothrow) Qp{};
  uint32_t qpn = qp ? (qpn_wanted ? qpn_wanted : wire::allocate_qpn()) : 0;
  if (!qpn) {
    delete qp;
    uncount_object(Counted::Qp);
    if (raw) engine::raw_qp_create_failed();
    errno = ENOMEM;
    return nullptr;
  }
  // The actual capacities, written back as ibv_create_qp(3) says (at least what was asked).
  cap.max_send_wr = std::max<uint32_t>(cap.max_send_wr, 1);
  cap.max_send_sge = std::max<uint32_t>(cap.max_send_sge, 1);
  cap.max_inline_data = std::max<uint32_t>(cap.max_inline_data, kDefaultInline);
  if (srq || xrc_ini) {
    cap.max_recv_wr = 0;
    cap.max_recv_sge = 0;
  } else {
    cap.max_recv_wr = std::max<uint32_t>(cap.max_recv_wr, 1);
    cap.max_recv_sge = std::max<uint32_t>(cap.max_recv_sge, 1);
  }
  // On a parent domain with an allocator, the receive ring is the application's memory.
  if (!srq && !queue_memory_for(pd, &qp->rq, kResourceQp, cap.max_recv_wr)) {
    delete qp;
    uncount_object(Counted::Qp);
    if (raw) engine::raw_qp_create_failed();
    return nullptr;
  }
  qp->ctx = ctx;
  qp->pd = pd;
  qp->send_cq = scq;
  qp->recv_cq = rcq;
  qp->srq = srq;
  qp->type = init->qp_type;
  if (raw) qp->raw_owner = wire::self_pid();
  qp->sq_sig_all = init->sq_sig_all != 0;
  qp->cap = cap;
  ibv_qp* q = qp->qp();
  q->context = ctx->ibv();
  q->qp_context = init->qp_context;
  q->pd = &pd->ibv;
  q->send_cq = init->send_cq;
  q->recv_cq = xrc_ini ? nullptr : init->recv_cq;
  q->srq = init->srq;
  q->qp_type = init->qp_type;
  q->state = IBV_QPS_RESET;
  q->events_completed = 0;
  pthread_mutex_init(&q->mutex, nullptr);
  pthread_cond_init(&q->cond, nullptr);
  q->qp_num = qpn;
  q->handle = q->qp_num;
  pd->users++;
  scq->users++;
  rcq->users++;
  if (srq) srq->users++;
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    ctx->qps.insert(qp);
  }
  wire::register_qp(qp->qpn(), qp, &qp->users);
  stat::publish(qp);
  return q;
}

int modify_qp(Qp* qp, ibv_qp_attr* attr, int mask) {
  engine::roce_flush_held();  // held ACKs never wait behind another verb (docs/roce.md)
  if (qp->rss) return ENOSYS;  // an RSS QP has no states, its WQs have (mlx5's answer)
  if (qp->xrc_remote_slot) return modify_remote_tgt(qp, attr, mask);
  if (Qp* tgt = qp->xrc_opened_from) {  // an opened TGT QP handle: the QP itself
    int err = modify_qp(tgt, attr, mask);
    qp->qp()->state = static_cast<ibv_qp_state>(tgt->state.load());
    return err;
  }
  // `softverbs stat` shows the attributes as they are after this call, whatever it returns.
  struct Republish {
    Qp* qp;
    ~Republish() { stat::publish(qp); }
  } republish{qp};
  auto cur = static_cast<ibv_qp_state>(qp->state.load());
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur &&
      !(cur == IBV_QPS_SQE && attr->cur_qp_state == IBV_QPS_RTS))
    return EINVAL;
  auto next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (int err = check_modify_mask(qp->type, cur, next, mask)) return err;
  if (int err = check_values(qp, attr, mask)) return err;
  apply_attrs(qp, attr, mask);
  refresh_send_path(qp);
  engine::roce_modify(qp, *attr, mask);  // a QP on the wire: the protocol state follows
  if (mask & IBV_QP_ACCESS_FLAGS) {
    // A peer writing or reading straight into our memory checks these too.
    std::lock_guard<QueueMutex> lock(qp->rq_mu);
    if (wire::WindowHeader* w = qp->window.load(std::memory_order_relaxed))
      w->qp_access.store(attr->qp_access_flags, std::memory_order_release);
  }
  if (!(mask & IBV_QP_STATE)) return 0;

  if (next == IBV_QPS_RESET) {
    engine::close_window(qp, false);  // RESET discards, ring included
    qp->state.store(IBV_QPS_RESET);
    reset_queues(qp);
    refresh_send_path(qp);
    cq_purge_qp(qp->send_cq, qp->qpn());
    if (qp->recv_cq != qp->send_cq) cq_purge_qp(qp->recv_cq, qp->qpn());
    // A CQ the purge emptied takes its early event back (nothing is left to tell of).
    cq_polled(qp->send_cq);
    if (qp->recv_cq != qp->send_cq) cq_polled(qp->recv_cq);
  } else if (next == IBV_QPS_ERR) {
    engine::close_window(qp, true);  // what the peer left there was acknowledged: it lands
    qp->state.store(IBV_QPS_ERR);
    engine::flush(qp);  // synchronously: flushed completions are there when we return
  } else if (next == IBV_QPS_SQD) {
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    qp->state.store(IBV_QPS_SQD);
    qp->sq_drain_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && attr->en_sqd_async_notify;
    engine::run_send_queue(qp);  // raises SQ_DRAINED at once if nothing is in flight
  } else {
    qp->state.store(next);
    if (next == IBV_QPS_RTR) engine::watch_peer_of(qp);
    // Into RTS: the same-host peer's window is asked for now, in the application's setup,
    // not at its first post (in its timed loop, where the peer may be spinning).
    if (next == IBV_QPS_RTS && cur != IBV_QPS_RTS) engine::open_window_at_rts(qp);
    if (next == IBV_QPS_RTS) engine::kick(qp);  // WQEs posted in SQD/SQE may run now
  }
  qp->qp()->state = next;
  return 0;
}

int query_qp(Qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
  if (qp->rss) return ENOSYS;  // as modify_qp
  if (qp->xrc_remote_slot) return query_remote_tgt(qp, attr, init);
  if (Qp* tgt = qp->xrc_opened_from) {
    int err = query_qp(tgt, attr, mask, init);
    if (init) init->qp_context = qp->qp()->qp_context;
    qp->qp()->state = attr->qp_state;
    return err;
  }
  (void)mask;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    *attr = qp->attr;
  }
  // A completion with an error may be polled while the port's thread still holds the link
  // it came from, before the QP it failed is in ERR: wait for that.
  engine::roce_settle(qp);
  auto st = static_cast<ibv_qp_state>(qp->state.load());
  attr->qp_state = st;
  attr->cur_qp_state = st;
  attr->cap = qp->cap;
  if (qp->srq || qp->type == IBV_QPT_XRC_SEND) attr->cap.max_recv_wr = attr->cap.max_recv_sge = 0;
  if (qp->type == IBV_QPT_XRC_RECV) attr->cap = {};
  attr->path_mig_state = IBV_MIG_MIGRATED;
  if (st == IBV_QPS_SQD) {
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    attr->sq_draining = !qp->sq.empty() && qp->sq.front().started;
  }
  if (init) {
    std::memset(init, 0, sizeof(*init));
    init->qp_context = qp->qp()->qp_context;
    init->send_cq = qp->qp()->send_cq;
    init->recv_cq = qp->qp()->recv_cq;
    init->srq = qp->qp()->srq;
    init->cap = attr->cap;
    init->qp_type = qp->type;
    init->sq_sig_all = qp->sq_sig_all;
  }
  qp->qp()->state = st;
  return 0;
}

int attach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid) {
  (void)lid;  // RoCE: groups are named by GID alone
  if (!gid || qp->type != IBV_QPT_UD || !wire::is_multicast_gid(*gid)) return EINVAL;
  std::lock_guard<std::mutex> lock(qp->attr_mu);
  for (const ibv_gid& g : qp->mcast_groups)
    if (std::memcmp(g.raw, gid->raw, 16) == 0) return 0;  // already a member
  if (qp->mcast_groups.size() >= static_cast<size_t>(Limits::max_mcast_grp)) return ENOMEM;
  if (int err = wire::mcast_attach(*gid, qp->qpn())) return err;
  // Other hosts' members: the group's IP address joined on the wire.
  if (int err = engine::roce_attach_mcast(qp, *gid)) {
    wire::mcast_detach(*gid, qp->qpn());
    return err;
  }
  qp->mcast_groups.push_back(*gid);
  return 0;
}

int detach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid) {
  (void)lid;
  if (!gid) return EINVAL;
  std::lock_guard<std::mutex> lock(qp->attr_mu);
  auto& v = qp->mcast_groups;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (std::memcmp(it->raw, gid->raw, 16) != 0) continue;
    v.erase(it);
    engine::roce_detach_mcast(qp, *gid);
    return wire::mcast_detach(*gid, qp->qpn());
  }
  return EINVAL;
}

bool claim_gsi(Qp* qp) { return engine::roce_claim_gsi(qp); }

int destroy_qp(Qp* qp) {
  engine::roce_flush_held();
  if (qp->xrc_remote_slot) {
    destroy_remote_tgt(qp);
    return 0;
  }
  if (qp->type == IBV_QPT_XRC_RECV) {
    // A TGT QP lives until its last handle goes (ibv_open_qp(3)).
    Qp* tgt = qp->xrc_opened_from ? qp->xrc_opened_from : qp;
    // (The creator's handle going while others stay waits there for its events handed
    // out to be acked, while its count still keeps the QP.)
    bool last = release_tgt_handle(qp);
    if (qp != tgt) free_opened_handle(qp);
    if (!last) return 0;
    qp = tgt;
  }
  // A raw QP's steering rules use it (ibv_destroy_flow them first), as in the kernel.
  if (qp->type == IBV_QPT_RAW_PACKET && engine::raw_qp_has_flows(qp)) return EBUSY;
  return destroy_qp_now(qp);
}

int destroy_qp_now(Qp* qp) {
  {
    // A destroyed QP leaves its groups, as the kernel detaches it.
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    for (const ibv_gid& g : qp->mcast_groups) {
      engine::roce_detach_mcast(qp, g);
      wire::mcast_detach(g, qp->qpn());
    }
    qp->mcast_groups.clear();
  }
  {
    std::lock_guard<std::mutex> lock(qp->ctx->objects_mu);
    qp->ctx->qps.erase(qp);
  }
  engine::close_window(qp, false);
  engine::roce_release_gsi(qp);
  wire::unregister_qp(qp->qpn());  // no peer or timer can reach it any more
  // Its number will name another QP: the type 2 windows bound to it go with it.
  MrTable::instance().invalidate_windows_of(qp->qpn());
  stat::withdraw_link(qp);
  engine::roce_destroy(qp);
  ibv_qp* q = qp->qp();
  drop_async_events_of(qp->ctx, EventElement::Qp, q);
  wait_acked(&q->mutex, &q->cond, &q->events_completed, &qp->events_reported);
  qp->pd->users--;
  qp->send_cq->users--;
  qp->recv_cq->users--;
  if (qp->srq) qp->srq->users--;
  if (qp->xrcd) qp->xrcd->users--;
  engine::drop_peer_window(qp);
  tally_destroyed_qp(*qp);
  pthread_mutex_destroy(&q->mutex);
  pthread_cond_destroy(&q->cond);
  stat::withdraw(qp);
  qp->magic = kDead;
  Context* ctx = qp->ctx;
  if (qp->type == IBV_QPT_RAW_PACKET) engine::raw_qp_destroyed(qp);
  forget_rss(qp);
  const bool hosted = qp->xrc_creator_gone;
  const uint32_t qpn = qp->qpn();
  std::shared_ptr<XrcDomain> domain = std::move(qp->xrc_domain);
  delete qp;
  uncount_object(Counted::Qp);
  if (hosted) tgt_qp_destroyed(ctx, domain, qpn);
  sweep_unimported_pds();  // an unimported PD it was created on may go now
  return 0;
}

namespace {

// The state in which a send WR may be posted; 0 if it may.
int send_state_error(int st) {
  return st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR ? EINVAL : 0;
}

// Posts one checked WR of `total` bytes (both APIs end here). Caller holds qp->sq_mu.
int post_checked_locked(Qp* qp, const ibv_send_wr* wr, uint64_t total, int st, const ExWr* ex) {
  // Nothing ahead of it: run it now, and queue it only if it must wait for a retry.
  bool now = qp->sq.empty() && st == IBV_QPS_RTS;
  // The shortcut skips run_wqe, where injected faults and the trace are applied.
  if (now && !debug_hooks_armed() && engine::post_now(qp, wr, total)) return 0;
  SendWqe w;
  if (int err = build_send_wqe(qp, wr, total, &w, ex)) return err;
  if (now && engine::run_wqe(qp, w, st)) return 0;
  qp->sq.push_back(std::move(w));
  return 0;
}

}  // namespace

int post_wqe(Qp* qp, SendWqe&& w) {
  engine::roce_flush_held(qp);  // another QP's held ACKs leave first; this one's ride along
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  int st = qp->state.load();
  if (int err = send_state_error(st)) return err;
  if (qp->sq.size() + engine::roce_in_flight(qp) >= qp->cap.max_send_wr) return ENOMEM;
  if (!(qp->sq.empty() && st == IBV_QPS_RTS && engine::run_wqe(qp, w, st)))
    qp->sq.push_back(std::move(w));
  engine::run_send_queue(qp);
  return 0;
}

int post_send(Qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  engine::roce_flush_held(qp);  // another QP's held ACKs leave first; this one's ride along
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  int err = 0;
  for (; wr; wr = wr->next) {
    int st = qp->state.load();
    if ((err = send_state_error(st))) break;
    if (qp->sq.size() + engine::roce_in_flight(qp) >= qp->cap.max_send_wr) {
      err = ENOMEM;
      break;
    }
    uint64_t total;
    if ((err = check_send_wr(qp, wr, &total))) break;
    if ((err = post_checked_locked(qp, wr, total, st, nullptr))) break;
    ++qp->posted_by_post_send;
  }
  if (err && bad) *bad = wr;
  engine::run_send_queue(qp);
  return err;
}

int post_send_batch(Qp* qp) {
  engine::roce_flush_held(qp);
  ExBatch& b = qp->ex;
  if (!b.open) return EINVAL;
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  int st = qp->state.load();
  int err = b.error ? b.error : send_state_error(st);
  if (!err && qp->sq.size() + engine::roce_in_flight(qp) + b.count > qp->cap.max_send_wr)
    err = ENOMEM;
  // The wr_* calls built each WR in place (qp_ex.cpp): what ibv_post_send would get.
  if (!err && b.count == 1) {  // the common batch: check it and post it
    uint64_t total;
    err = check_ex_wr(qp, b.slots[0], &total);
    if (!err) err = post_checked_locked(qp, &b.slots[0].wr, total, st, &b.slots[0]);
    if (!err) ++qp->posted_by_wr_api;
  } else if (!err) {
    // All or nothing (ibv_wr_post(3)): every WR is checked before the first is posted.
    uint64_t totals_inline[8];
    std::vector<uint64_t> totals_heap;
    uint64_t* totals = totals_inline;
    if (b.count > 8) {
      totals_heap.resize(b.count);
      totals = totals_heap.data();
    }
    for (size_t i = 0; !err && i < b.count; ++i)
      err = check_ex_wr(qp, b.slots[i], &totals[i]);
    for (size_t i = 0; !err && i < b.count; ++i) {
      err = post_checked_locked(qp, &b.slots[i].wr, totals[i], st, &b.slots[i]);
      if (!err) ++qp->posted_by_wr_api;
    }
  }
  b.count = 0;
  b.error = 0;
  b.open = false;
  b.limit = 0;  // the wr_* calls outside a batch take the slow path, which fails it
  engine::run_send_queue(qp);
  return err;
}

int post_recv(Qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  // (An RSS QP's receives are its WQs', ibv_post_wq_recv.)
  if (qp->srq || qp->type == IBV_QPT_XRC_SEND || qp->type == IBV_QPT_XRC_RECV || qp->rss) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  int err = 0;
  std::vector<uint32_t> waiters;
  {
    // Keys before queues: a remote requester reads each receive's capacity (its buffers
    // resolved against the key table) from the receive window.
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<QueueMutex> lock(qp->rq_mu);
    for (; wr; wr = wr->next) {
      if ((err = check_recv_wr(wr, qp->cap.max_recv_sge))) break;
      if (qp->state.load() == IBV_QPS_RESET) {
        err = EINVAL;
        break;
      }
      if (qp->rq.size() >= qp->cap.max_recv_wr) {
        err = ENOMEM;
        break;
      }
      RecvWqe& r = push_recv_wqe(qp->rq, wr);
      if (qp->window.load(std::memory_order_relaxed))
        engine::publish_receive_locked(qp, r, engine::receive_capacity(qp, r));
    }
    if (!qp->rnr_waiters.empty()) waiters = take_rnr_waiters(qp->rnr_waiters);
  }
  if (err && bad) *bad = wr;
  if (qp->state.load() == IBV_QPS_ERR) engine::flush(qp);
  // Senders that met an empty queue need not wait for their RNR timer.
  for (uint32_t qpn : waiters) engine::kick_qpn(qpn);
  return err;
}

// SRQs live here too: they share the receive-WQE validation above.
Srq* Srq::from(ibv_srq* s) {
  auto* srq = reinterpret_cast<Srq*>(s);
  return s && srq->magic == kSrqMagic ? srq : nullptr;
}

ibv_srq* create_srq(Pd* pd, ibv_srq_init_attr* init) {
  ibv_srq_attr& a = init->attr;
  if (a.max_wr == 0 || a.max_wr > uint32_t(device_limits().max_srq_wr) ||
      a.max_sge > Limits::max_sge || a.srq_limit > a.max_wr) {
    errno = EINVAL;
    return nullptr;
  }
  if (!count_object(Counted::Srq)) {  // device_limits().max_srq
    errno = ENOMEM;
    return nullptr;
  }
  auto* srq = new (std::nothrow) Srq{};
  if (!srq) {
    uncount_object(Counted::Srq);
    errno = ENOMEM;
    return nullptr;
  }
  a.max_sge = std::max<uint32_t>(a.max_sge, 1);
  if (!queue_memory_for(pd, &srq->rq, kResourceSrq, a.max_wr)) {
    delete srq;
    uncount_object(Counted::Srq);
    return nullptr;
  }
  srq->ctx = pd->ctx;
  srq->pd = pd;
  srq->max_wr = a.max_wr;
  srq->max_sge = a.max_sge;
  srq->limit = a.srq_limit;
  srq->ibv.context = pd->ibv.context;
  srq->ibv.srq_context = init->srq_context;
  srq->ibv.pd = &pd->ibv;
  pthread_mutex_init(&srq->ibv.mutex, nullptr);
  pthread_cond_init(&srq->ibv.cond, nullptr);
  pd->users++;
  {
    std::lock_guard<std::mutex> lock(pd->ctx->objects_mu);
    pd->ctx->srqs.insert(srq);
  }
  stat::publish(srq);
  return &srq->ibv;
}

ibv_srq* create_srq_ex(Context* ctx, ibv_srq_init_attr_ex* ex) {
  if (!ex || (ex->comp_mask & ~uint32_t(IBV_SRQ_INIT_ATTR_RESERVED - 1))) {
    errno = EINVAL;
    return nullptr;
  }
  const ibv_srq_type type =
      (ex->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? ex->srq_type : IBV_SRQT_BASIC;
  // Tag matching (verbs/tag_matching.cpp): a PD, a CQ for its completions, and tm_cap.
  if (type == IBV_SRQT_TM) {
    constexpr uint32_t kNeed = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    Pd* pd = (ex->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? Pd::from(ex->pd) : nullptr;
    Cq* cq = (ex->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ? Cq::from(ex->cq) : nullptr;
    if ((ex->comp_mask & kNeed) != kNeed || !pd || pd->ctx->shared != ctx->shared || !cq) {
      errno = EINVAL;
      return nullptr;
    }
    return create_tm_srq(pd, cq, ex);
  }
  if ((type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) || (ex->comp_mask & IBV_SRQ_INIT_ATTR_TM)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (type == IBV_SRQT_XRC) return create_xrc_srq(ctx, ex);
  // A basic SRQ has no XRC domain or CQ: those attributes are ignored, as the kernel does.
  Pd* pd = (ex->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? Pd::from(ex->pd) : nullptr;
  if (!pd || pd->ctx != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create_srq_from_ex(pd, ex);
}

ibv_srq* create_srq_from_ex(Pd* pd, ibv_srq_init_attr_ex* ex) {
  ibv_srq_init_attr init{};
  init.srq_context = ex->srq_context;
  init.attr = ex->attr;
  ibv_srq* srq = create_srq(pd, &init);
  if (srq) ex->attr = init.attr;
  return srq;
}

int modify_srq(Srq* srq, ibv_srq_attr* attr, int mask) {
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  std::lock_guard<QueueMutex> lock(srq->mu);
  uint32_t max_wr = (mask & IBV_SRQ_MAX_WR) ? attr->max_wr : srq->max_wr;
  if (max_wr == 0 || max_wr > uint32_t(device_limits().max_srq_wr) || max_wr < srq->rq.size())
    return EINVAL;
  if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > max_wr) return EINVAL;
  srq->max_wr = max_wr;
  if (mask & IBV_SRQ_LIMIT) srq->limit = attr->srq_limit;
  return 0;
}

int query_srq(Srq* srq, ibv_srq_attr* attr) {
  std::lock_guard<QueueMutex> lock(srq->mu);
  attr->max_wr = srq->max_wr;
  attr->max_sge = srq->max_sge;
  attr->srq_limit = srq->limit;
  return 0;
}

int destroy_srq(Srq* srq) {
  if (srq->users.load() != 0) return EBUSY;
  forget_xrc_srq(srq);  // an XRC SRQ: no responder finds it any more
  drop_async_events_of(srq->ctx, EventElement::Srq, &srq->ibv);
  wait_acked(&srq->ibv.mutex, &srq->ibv.cond, &srq->ibv.events_completed, &srq->events_reported);
  {
    std::lock_guard<std::mutex> lock(srq->ctx->objects_mu);
    srq->ctx->srqs.erase(srq);
  }
  srq->pd->users--;
  free_tm_srq(srq);
  pthread_mutex_destroy(&srq->ibv.mutex);
  pthread_cond_destroy(&srq->ibv.cond);
  stat::withdraw(srq);
  srq->magic = kDead;
  delete srq;
  uncount_object(Counted::Srq);
  return 0;
}

int post_srq_recv(Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  int err = 0;
  std::vector<uint32_t> waiters;
  {
    // Senders in other processes claim the receives of an SRQ whose QPs have receive
    // windows: each is counted for them with its capacity (checked under the key lock,
    // taken before the queue's as everywhere).
    std::shared_lock keys(MrTable::instance().lock(), std::defer_lock);
    std::unique_lock<QueueMutex> lock(srq->mu, std::defer_lock);
    for (;;) {
      if (!keys.owns_lock() && srq->shared.load(std::memory_order_acquire)) keys.lock();
      lock.lock();
      // Shared meanwhile (the agent opened a window to one of its QPs): without the keys
      // these receives would be published with capacity 0, never claimable by a window.
      if (keys.owns_lock() || !srq->shared.load(std::memory_order_acquire)) break;
      lock.unlock();
    }
    for (; wr; wr = wr->next) {
      if (engine::srq_full_locked(srq)) {
        err = ENOMEM;
        break;
      }
      if ((err = check_recv_wr(wr, srq->max_sge))) break;
      RecvWqe& r = push_recv_wqe(srq->rq, wr);
      engine::publish_srq_receive_locked(srq, r, keys.owns_lock());
    }
    if (!srq->rnr_waiters.empty()) waiters = take_rnr_waiters(srq->rnr_waiters);
  }
  if (err && bad) *bad = wr;
  for (uint32_t qpn : waiters) engine::kick_qpn(qpn);
  return err;
}

}  // namespace softverbs
