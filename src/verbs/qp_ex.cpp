// The extended QP's post-send API (ibv_wr_post(3)): ibv_create_qp_ex with send_ops_flags
// gives a QP whose ibv_qp_ex table builds work requests between wr_start and wr_complete.
// Each wr_<op> starts a WR (taking qp->wr_id and qp->wr_flags as they are then), the
// wr_set_* calls fill in its buffers or address, and wr_complete posts the batch through
// the same checks and the same send-queue entries as ibv_post_send (qp.cpp): all of it, or,
// when any WR is wrong, none of it, returning the errno. The wr_* calls return nothing, so
// the first error they meet waits for wr_complete.
#include <cerrno>
#include <cstring>

#include "core/device.hpp"
#include "common/verbs_ext.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

// The ibv_qp_ex is the Qp's first member; the table is only reachable through a live QP
// (ibv_qp_to_qp_ex), so no magic check on every call.
Qp* qp_of(ibv_qp_ex* q) { return reinterpret_cast<Qp*>(q); }

void latch(ExBatch& b, int err) {
  if (!b.error) b.error = err;
}

// Points a WR's sg_list where its gather list lives now.
void point_gather(ExWr& e) {
  switch (e.gather) {
    case ExWr::Gather::kNone:
      e.wr.sg_list = nullptr;
      e.wr.num_sge = 0;
      break;
    case ExWr::Gather::kOne:
      e.wr.sg_list = &e.sge;
      e.wr.num_sge = 1;
      break;
    case ExWr::Gather::kList:
      e.wr.sg_list = e.sges.data();
      e.wr.num_sge = static_cast<int>(e.sges.size());
      break;
    case ExWr::Gather::kInline:
      e.sge = {reinterpret_cast<uintptr_t>(e.inline_data.data()),
               static_cast<uint32_t>(e.inline_data.size()), 0};
      e.wr.sg_list = &e.sge;
      e.wr.num_sge = 1;
      break;
  }
}

// A WR for `op` in slot `e`, with the wr_id and flags the application set last. Only the
// fields the checks and the WQE read are written: the operands by the wr_<op> call, sg_list
// and num_sge by the wr_set_* calls; the UD address starts empty (a WR without
// wr_set_ud_addr must fail, not reuse an earlier WR's AH).
inline ExWr* fill_wr(ExWr& e, ibv_qp_ex* q, ibv_wr_opcode op) {
  e.wr.wr_id = q->wr_id;
  e.wr.send_flags = e.app_flags = q->wr_flags;
  e.wr.opcode = op;
  e.wr.imm_data = 0;
  e.wr.sg_list = nullptr;
  e.wr.num_sge = 0;
  e.wr.wr.ud.ah = nullptr;
  e.gather = ExWr::Gather::kNone;
  e.length = 0;
  return &e;
}

// add_wr when the batch is closed or its storage full. Growing moves the WRs built so far
// (their in-place SGEs with them): their sg_list pointers follow.
[[gnu::noinline]] ExWr* begin_wr_slow(ibv_qp_ex* q, ibv_wr_opcode op) {
  ExBatch& b = qp_of(q)->ex;
  if (!b.open) {
    latch(b, EINVAL);  // a WR outside wr_start/wr_complete
    return nullptr;
  }
  b.wrs.emplace_back();
  b.slots = b.wrs.data();
  b.limit = b.wrs.size();
  for (size_t i = 0; i < b.count; ++i) point_gather(b.slots[i]);
  return fill_wr(b.slots[b.count++], q, op);
}

template <typename Operands>
[[gnu::noinline]] void add_wr_slow(ibv_qp_ex* q, ibv_wr_opcode op, Operands operands) {
  if (ExWr* e = begin_wr_slow(q, op)) operands(*e);
}

// Adds a WR for `op` at the end of the batch and has `operands` fill in what the op takes;
// outside a batch, the batch fails instead. The fast path calls nothing (the slow one is a
// tail call, so the fast one saves no registers).
template <typename Operands>
inline void add_wr(ibv_qp_ex* q, ibv_wr_opcode op, Operands operands) {
  ExBatch& b = qp_of(q)->ex;
  if (b.count < b.limit) [[likely]] {
    operands(*fill_wr(b.slots[b.count++], q, op));
    return;
  }
  add_wr_slow(q, op, operands);
}

// The WR the wr_set_* calls apply to: the last one started.
inline ExWr* current_wr(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  if (b.count == 0) [[unlikely]] {  // also outside a batch: wr_complete and wr_abort clear it
    latch(b, EINVAL);
    return nullptr;
  }
  return &b.slots[b.count - 1];
}

// A WR that carried inline data and now gets SGEs goes back to the application's flags.
inline void drop_inline(ExWr* e) {
  if (e->gather == ExWr::Gather::kInline) {
    e->wr.send_flags = e->app_flags;
    e->inline_data.clear();
  }
}

void wr_start(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  b.count = 0;
  b.error = 0;
  b.open = true;
  b.limit = b.wrs.size();
}

// ibv_wr_complete posts through post_send_batch (qp.cpp) directly.
int wr_complete(ibv_qp_ex* q) { return post_send_batch(qp_of(q)); }

void wr_abort(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  b.count = 0;
  b.error = 0;
  b.open = false;
  b.limit = 0;
}

void wr_send(ibv_qp_ex* q) {
  add_wr(q, IBV_WR_SEND, [](ExWr&) {});
}

void wr_send_imm(ibv_qp_ex* q, __be32 imm) {
  add_wr(q, IBV_WR_SEND_WITH_IMM, [=](ExWr& e) { e.wr.imm_data = imm; });
}

// SEND_WITH_INV, BIND_MW and LOCAL_INV are the WQEs ibv_post_send makes of the same
// opcodes: they succeed or fail exactly as there (memory windows).
void wr_send_inv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  add_wr(q, IBV_WR_SEND_WITH_INV, [=](ExWr& e) { e.wr.invalidate_rkey = invalidate_rkey; });
}

void wr_bind_mw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  add_wr(q, IBV_WR_BIND_MW, [=](ExWr& e) {
    e.wr.bind_mw.mw = mw;
    e.wr.bind_mw.rkey = rkey;
    e.wr.bind_mw.bind_info = info ? *info : ibv_mw_bind_info{};
  });
}

void wr_local_inv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  add_wr(q, IBV_WR_LOCAL_INV, [=](ExWr& e) { e.wr.invalidate_rkey = invalidate_rkey; });
}

void set_rdma(ExWr& e, uint32_t rkey, uint64_t remote_addr) {
  e.wr.wr.rdma.remote_addr = remote_addr;
  e.wr.wr.rdma.rkey = rkey;
}

void wr_rdma_write(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  add_wr(q, IBV_WR_RDMA_WRITE, [=](ExWr& e) { set_rdma(e, rkey, remote_addr); });
}

void wr_rdma_write_imm(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, __be32 imm) {
  add_wr(q, IBV_WR_RDMA_WRITE_WITH_IMM, [=](ExWr& e) {
    set_rdma(e, rkey, remote_addr);
    e.wr.imm_data = imm;
  });
}

void wr_rdma_read(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  add_wr(q, IBV_WR_RDMA_READ, [=](ExWr& e) { set_rdma(e, rkey, remote_addr); });
}

void wr_atomic_cmp_swp(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
                       uint64_t swap) {
  add_wr(q, IBV_WR_ATOMIC_CMP_AND_SWP,
         [=](ExWr& e) { e.wr.wr.atomic = {remote_addr, compare, swap, rkey}; });
}

void wr_atomic_fetch_add(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  add_wr(q, IBV_WR_ATOMIC_FETCH_AND_ADD,
         [=](ExWr& e) { e.wr.wr.atomic = {remote_addr, add, 0, rkey}; });
}

// The 8 bytes are taken now: the caller's buffer is free once the call returns.
void wr_atomic_write(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, const void* value) {
  add_wr(q, IBV_WR_ATOMIC_WRITE, [=](ExWr& e) {
    set_rdma(e, rkey, remote_addr);
    if (value) std::memcpy(&e.atomic_value, value, 8);
    else latch(qp_of(q)->ex, EINVAL);
  });
}

void wr_flush(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
              uint8_t level) {
  add_wr(q, kWrFlush, [=](ExWr& e) {
    set_rdma(e, rkey, remote_addr);
    e.flush_length = len;
    e.flush_type = type;
    e.flush_level = level;
  });
}

void wr_set_sge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  Qp* qp = qp_of(q);
  ExBatch& b = qp->ex;
  if (b.count == 0 || qp->cap.max_send_sge == 0) [[unlikely]] {  // count is 0 outside a batch
    latch(b, EINVAL);
    return;
  }
  ExWr& e = b.slots[b.count - 1];
  drop_inline(&e);
  e.sge = {addr, length, lkey};
  e.length = length;
  e.gather = ExWr::Gather::kOne;
  e.wr.sg_list = &e.sge;
  e.wr.num_sge = 1;
}

void wr_set_sge_list(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  ExWr* e = current_wr(q);
  if (!e) return;
  if (n > qp_of(q)->cap.max_send_sge || (n && !list)) {
    latch(qp_of(q)->ex, EINVAL);
    return;
  }
  drop_inline(e);
  e->sges.resize(n);
  if (n) std::memcpy(e->sges.data(), list, n * sizeof(ibv_sge));
  e->length = 0;
  for (size_t i = 0; i < n; ++i) e->length += list[i].length;
  e->gather = ExWr::Gather::kList;
  point_gather(*e);
}

// Inline data is copied at the call (ibv_wr_post(3): the buffers may be reused at once).
// It goes as one inline SGE over the copy.
void append_inline(ibv_qp_ex* q, ExWr* e, const void* addr, size_t len) {
  Qp* qp = qp_of(q);
  size_t have = e->inline_data.size();
  if (len > qp->cap.max_inline_data || have + len > qp->cap.max_inline_data ||
      (len && !addr)) {
    latch(qp->ex, EINVAL);
    return;
  }
  e->inline_data.resize(have + len);
  if (len) std::memcpy(e->inline_data.data() + have, addr, len);
  e->length = have + len;
  point_gather(*e);
}

// Starts the WR's inline data afresh.
void begin_inline(ExWr* e) {
  e->inline_data.clear();
  e->length = 0;
  e->gather = ExWr::Gather::kInline;
  e->wr.send_flags = e->app_flags | IBV_SEND_INLINE;
  point_gather(*e);
}

void wr_set_inline_data(ibv_qp_ex* q, void* addr, size_t len) {
  ExWr* e = current_wr(q);
  if (!e) return;
  begin_inline(e);
  append_inline(q, e, addr, len);
}

void wr_set_inline_data_list(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  ExWr* e = current_wr(q);
  if (!e) return;
  begin_inline(e);
  if (n && !bufs) {
    latch(qp_of(q)->ex, EINVAL);
    return;
  }
  for (size_t i = 0; i < n; ++i) append_inline(q, e, bufs[i].addr, bufs[i].length);
}

void wr_set_ud_addr(ibv_qp_ex* q, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  ExWr* e = current_wr(q);
  if (!e) return;
  if (qp_of(q)->type != IBV_QPT_UD) {
    latch(qp_of(q)->ex, EINVAL);
    return;
  }
  e->wr.wr.ud.ah = ah;
  e->wr.wr.ud.remote_qpn = remote_qpn;
  e->wr.wr.ud.remote_qkey = remote_qkey;
}

// The remote XRC SRQ of the WR being built (XRC INI QPs only).
void wr_set_xrc_srqn(ibv_qp_ex* q, uint32_t remote_srqn) {
  ExWr* e = current_wr(q);
  if (!e) return;
  // Only an XRC INI QP has it (like any op a QP was not made for: EOPNOTSUPP).
  if (qp_of(q)->type != IBV_QPT_XRC_SEND || remote_srqn > 0xffffff) {
    latch(qp_of(q)->ex, qp_of(q)->type != IBV_QPT_XRC_SEND ? EOPNOTSUPP : EINVAL);
    return;
  }
  e->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

// The ops the QP was not created for: the batch fails (rdma-core leaves them NULL; we never
// leave a slot the inline wrappers call unchecked empty).
template <typename... A>
void not_enabled(ibv_qp_ex* q, A...) {
  if (Qp* qp = qp_of(q)) latch(qp->ex, EOPNOTSUPP);
}

// Device capabilities that gate the memory-window opcodes (until memory windows exist,
// the device reports neither and asking for them fails).
bool device_has(unsigned flag) {
  ibv_device_attr a{};
  Device::instance().fill_device_attr(&a);
  return (a.device_cap_flags & flag) == flag;
}

}  // namespace

int check_send_ops_flags(ibv_qp_type type, uint64_t flags) {
  // A raw packet QP sends frames: plain SEND (mlx5 adds TSO, which softverbs has not).
  if (type == IBV_QPT_RAW_PACKET) return (flags & ~uint64_t(IBV_QP_EX_WITH_SEND)) ? EOPNOTSUPP : 0;
  uint64_t ok = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  // An XRC INI QP: RC's set without IBA 1.5's ATOMIC WRITE and FLUSH. mlx5's
  // MLX5_SUPPORTED_SEND_OPS_FLAGS_XRC is its RC set (windows and invalidation included, no
  // ATOMIC WRITE or FLUSH anywhere); rxe, the only provider with those two, has no XRC.
  const bool xrc_ini = type == IBV_QPT_XRC_SEND;
  const bool rc_like = type == IBV_QPT_RC || xrc_ini;
  if (rc_like || type == IBV_QPT_UC)
    ok |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  if (rc_like)
    ok |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
          IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  if (type == IBV_QPT_RC) ok |= IBV_QP_EX_WITH_ATOMIC_WRITE | kQpExWithFlush;
  // As rxe: memory windows on RC and UC; invalidation on RC (IBA has IETH opcodes for RC
  // only, and ibv_post_send refuses SEND_WITH_INV on UC too); XRC as mlx5, like RC.
  if (type != IBV_QPT_UD && device_has(IBV_DEVICE_MEM_WINDOW)) ok |= IBV_QP_EX_WITH_BIND_MW;
  if (rc_like && device_has(IBV_DEVICE_MEM_MGT_EXTENSIONS))
    ok |= IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV;
  if (!rc_like && type != IBV_QPT_UC && type != IBV_QPT_UD) return EOPNOTSUPP;
  return (flags & ~ok) ? EOPNOTSUPP : 0;
}

void install_qp_ex(Qp* qp, uint64_t f) {
  ibv_qp_ex& x = qp->ibv;
  qp->is_qp_ex = true;
  qp->send_ops_flags = f;
  x.comp_mask = 0;
  x.wr_id = 0;
  x.wr_flags = 0;
  x.wr_start = &wr_start;
  x.wr_complete = &wr_complete;
  x.wr_abort = &wr_abort;
  x.wr_set_sge = &wr_set_sge;
  x.wr_set_sge_list = &wr_set_sge_list;
  x.wr_set_inline_data = &wr_set_inline_data;
  x.wr_set_inline_data_list = &wr_set_inline_data_list;
  x.wr_set_ud_addr = &wr_set_ud_addr;
  x.wr_set_xrc_srqn = &wr_set_xrc_srqn;
  x.wr_send_tso = &not_enabled<void*, uint16_t, uint16_t>;
  x.wr_send = (f & IBV_QP_EX_WITH_SEND) ? &wr_send : &not_enabled<>;
  x.wr_send_imm = (f & IBV_QP_EX_WITH_SEND_WITH_IMM) ? &wr_send_imm : &not_enabled<__be32>;
  x.wr_send_inv = (f & IBV_QP_EX_WITH_SEND_WITH_INV) ? &wr_send_inv : &not_enabled<uint32_t>;
  x.wr_rdma_write = (f & IBV_QP_EX_WITH_RDMA_WRITE) ? &wr_rdma_write
                                                      : &not_enabled<uint32_t, uint64_t>;
  x.wr_rdma_write_imm = (f & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
                            ? &wr_rdma_write_imm
                            : &not_enabled<uint32_t, uint64_t, __be32>;
  x.wr_rdma_read = (f & IBV_QP_EX_WITH_RDMA_READ) ? &wr_rdma_read
                                                    : &not_enabled<uint32_t, uint64_t>;
  x.wr_atomic_cmp_swp = (f & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
                            ? &wr_atomic_cmp_swp
                            : &not_enabled<uint32_t, uint64_t, uint64_t, uint64_t>;
  x.wr_atomic_fetch_add = (f & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
                              ? &wr_atomic_fetch_add
                              : &not_enabled<uint32_t, uint64_t, uint64_t>;
  x.wr_atomic_write = (f & IBV_QP_EX_WITH_ATOMIC_WRITE)
                          ? &wr_atomic_write
                          : &not_enabled<uint32_t, uint64_t, const void*>;
  x.wr_bind_mw = (f & IBV_QP_EX_WITH_BIND_MW)
                     ? &wr_bind_mw
                     : &not_enabled<ibv_mw*, uint32_t, const ibv_mw_bind_info*>;
  x.wr_local_inv = (f & IBV_QP_EX_WITH_LOCAL_INV) ? &wr_local_inv : &not_enabled<uint32_t>;
  qp->wr_flush = (f & kQpExWithFlush) ? &wr_flush
                                      : &not_enabled<uint32_t, uint64_t, size_t, uint8_t, uint8_t>;
}

}  // namespace softverbs
