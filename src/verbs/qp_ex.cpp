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

Qp* qp_of(ibv_qp_ex* q) { return Qp::from(&q->qp_base); }

void latch(ExBatch& b, int err) {
  if (!b.error) b.error = err;
}

// A new WR for `op`, with the wr_id and flags the application set last.
ExWr* begin_wr(ibv_qp_ex* q, ibv_wr_opcode op) {
  Qp* qp = qp_of(q);
  ExBatch& b = qp->ex;
  if (!b.open) {
    latch(b, EINVAL);  // a WR outside wr_start/wr_complete
    return nullptr;
  }
  if (b.count == b.wrs.size()) b.wrs.emplace_back();
  ExWr& e = b.wrs[b.count++];
  e.wr = ibv_send_wr{};
  e.wr.wr_id = q->wr_id;
  e.wr.send_flags = q->wr_flags;
  e.wr.opcode = op;
  e.sges.clear();
  e.inline_data.clear();
  e.flush_length = 0;
  e.flush_type = e.flush_level = 0;
  e.atomic_value = 0;
  return &e;
}

// The WR the wr_set_* calls apply to: the last one started.
ExWr* current_wr(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  if (!b.open || b.count == 0) {
    latch(b, EINVAL);
    return nullptr;
  }
  return &b.wrs[b.count - 1];
}

void wr_start(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  b.count = 0;
  b.error = 0;
  b.open = true;
}

int wr_complete(ibv_qp_ex* q) {
  Qp* qp = qp_of(q);
  if (!qp->ex.open) return EINVAL;
  return post_send_batch(qp);
}

void wr_abort(ibv_qp_ex* q) {
  ExBatch& b = qp_of(q)->ex;
  b.count = 0;
  b.error = 0;
  b.open = false;
}

void wr_send(ibv_qp_ex* q) { begin_wr(q, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* q, __be32 imm) {
  if (ExWr* e = begin_wr(q, IBV_WR_SEND_WITH_IMM)) e->wr.imm_data = imm;
}

// SEND_WITH_INV, BIND_MW and LOCAL_INV are the WQEs ibv_post_send makes of the same
// opcodes: they succeed or fail exactly as there (memory windows).
void wr_send_inv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  if (ExWr* e = begin_wr(q, IBV_WR_SEND_WITH_INV)) e->wr.invalidate_rkey = invalidate_rkey;
}

void wr_bind_mw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  ExWr* e = begin_wr(q, IBV_WR_BIND_MW);
  if (!e) return;
  e->wr.bind_mw.mw = mw;
  e->wr.bind_mw.rkey = rkey;
  if (info) e->wr.bind_mw.bind_info = *info;
}

void wr_local_inv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  if (ExWr* e = begin_wr(q, IBV_WR_LOCAL_INV)) e->wr.invalidate_rkey = invalidate_rkey;
}

void set_rdma(ExWr* e, uint32_t rkey, uint64_t remote_addr) {
  e->wr.wr.rdma.remote_addr = remote_addr;
  e->wr.wr.rdma.rkey = rkey;
}

void wr_rdma_write(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  if (ExWr* e = begin_wr(q, IBV_WR_RDMA_WRITE)) set_rdma(e, rkey, remote_addr);
}

void wr_rdma_write_imm(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, __be32 imm) {
  ExWr* e = begin_wr(q, IBV_WR_RDMA_WRITE_WITH_IMM);
  if (!e) return;
  set_rdma(e, rkey, remote_addr);
  e->wr.imm_data = imm;
}

void wr_rdma_read(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  if (ExWr* e = begin_wr(q, IBV_WR_RDMA_READ)) set_rdma(e, rkey, remote_addr);
}

void wr_atomic_cmp_swp(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
                       uint64_t swap) {
  ExWr* e = begin_wr(q, IBV_WR_ATOMIC_CMP_AND_SWP);
  if (!e) return;
  e->wr.wr.atomic = {remote_addr, compare, swap, rkey};
}

void wr_atomic_fetch_add(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  ExWr* e = begin_wr(q, IBV_WR_ATOMIC_FETCH_AND_ADD);
  if (!e) return;
  e->wr.wr.atomic = {remote_addr, add, 0, rkey};
}

// The 8 bytes are taken now: the caller's buffer is free once the call returns.
void wr_atomic_write(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, const void* value) {
  ExWr* e = begin_wr(q, IBV_WR_ATOMIC_WRITE);
  if (!e) return;
  set_rdma(e, rkey, remote_addr);
  if (!value) {
    latch(qp_of(q)->ex, EINVAL);
    return;
  }
  std::memcpy(&e->atomic_value, value, 8);
}

void wr_flush(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
              uint8_t level) {
  ExWr* e = begin_wr(q, kWrFlush);
  if (!e) return;
  set_rdma(e, rkey, remote_addr);
  e->flush_length = len;
  e->flush_type = type;
  e->flush_level = level;
}

void wr_set_sge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  ExWr* e = current_wr(q);
  if (!e) return;
  e->inline_data.clear();
  e->sges.resize(1);
  e->sges[0] = {addr, length, lkey};
}

void wr_set_sge_list(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  ExWr* e = current_wr(q);
  if (!e) return;
  if (n > qp_of(q)->cap.max_send_sge || (n && !list)) {
    latch(qp_of(q)->ex, EINVAL);
    return;
  }
  e->inline_data.clear();
  e->sges.resize(n);
  if (n) std::memcpy(e->sges.data(), list, n * sizeof(ibv_sge));
}

// Inline data is copied at the call (ibv_wr_post(3): the buffers may be reused at once).
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
}

void wr_set_inline_data(ibv_qp_ex* q, void* addr, size_t len) {
  ExWr* e = current_wr(q);
  if (!e) return;
  e->sges.clear();
  e->inline_data.clear();
  append_inline(q, e, addr, len);
}

void wr_set_inline_data_list(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  ExWr* e = current_wr(q);
  if (!e) return;
  e->sges.clear();
  e->inline_data.clear();
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
  uint64_t ok = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  // An XRC INI QP: RC's sends, writes, reads and atomics (no IBA 1.5 operations, no windows).
  if (type == IBV_QPT_XRC_SEND) {
    ok |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
          IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
          IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    return (flags & ~ok) ? EOPNOTSUPP : 0;
  }
  if (type == IBV_QPT_RC || type == IBV_QPT_UC)
    ok |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  if (type == IBV_QPT_RC)
    ok |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
          IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE | kQpExWithFlush;
  // As rxe: memory windows on RC and UC; invalidation on RC (IBA has IETH opcodes for RC
  // only, and ibv_post_send refuses SEND_WITH_INV on UC too).
  if (type != IBV_QPT_UD && device_has(IBV_DEVICE_MEM_WINDOW)) ok |= IBV_QP_EX_WITH_BIND_MW;
  if (type == IBV_QPT_RC && device_has(IBV_DEVICE_MEM_MGT_EXTENSIONS))
    ok |= IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV;
  if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD) return EOPNOTSUPP;
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
