// Memory windows in the key table: their keys, binds, invalidations and the look-up of a
// window's R_Key by the responder, with each bound window published for same-host peers
// as an MR is. The rules are IBA 10.6.7's, with the requirement numbers rxe quotes
// (drivers/infiniband/sw/rxe/rxe_mw.c); where rxe is looser (it checks an access against
// the MR's range only) the window's own range is checked, as IBA requires.
#include <algorithm>
#include <mutex>

#include "core/core.hpp"
#include "core/errors.hpp"
#include "wire/shm/arena.hpp"

namespace softverbs {

namespace {

constexpr unsigned kRemoteAccess =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
// What mw_access_flags may hold: remote rights, zero-based addressing, and local write,
// which applications pass along (rdma-core's tests do) and a window has no use for.
constexpr unsigned kBindAccess = kRemoteAccess | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;
constexpr unsigned kAccessOptional = 0x3ff00000u;  // ignored, as for MRs

// Is [addr, addr + length) inside [base, base + size)?
bool inside(uint64_t addr, uint64_t length, uint64_t base, uint64_t size) {
  return addr >= base && length <= size && addr - base <= size - length;
}

}  // namespace

Mw* Mw::from(ibv_mw* m) {
  auto* mw = reinterpret_cast<Mw*>(m);
  return m && mw->magic == kMwMagic ? mw : nullptr;
}

uint32_t MrTable::insert_window(Mw* mw) {
  std::unique_lock lock(mu_);
  uint32_t index = take_slot();
  if (index == 0) return 0;
  windows_[index] = mw;
  if (mw->ibv.type == IBV_MW_TYPE_2) type2_windows_.push_back(mw);
  mw->index = index;
  uint8_t gen = ++generation_[index];
  return key_of(index, gen);
}

void MrTable::erase_window(Mw* mw) {
  std::unique_lock lock(mu_);
  {
    std::lock_guard<SpinLock> g(mw->mu);
    if (mw->mr) release_binding(mw);
    // The next user of the slot starts after the window's last key.
    generation_[mw->index] = static_cast<uint8_t>(mw->rkey);
  }
  windows_[mw->index] = nullptr;
  if (mw->ibv.type == IBV_MW_TYPE_2)
    type2_windows_.erase(std::find(type2_windows_.begin(), type2_windows_.end(), mw));
  free_.push_back(mw->index);
  note_change();
}

void MrTable::release_binding(Mw* mw) {
  mw->mr->bound_windows.fetch_sub(1, std::memory_order_relaxed);
  mw->mr = nullptr;
  mw->addr = mw->length = 0;
  mw->access = 0;
  mw->qpn = 0;
  if (shared_ && mw->index < wire::kMrTableCap)
    shared_[mw->index].key.store(0, std::memory_order_release);
}

void MrTable::publish_window(const Mw* mw) {
  if (!shared_ || mw->index >= wire::kMrTableCap) return;
  wire::MrShared& e = shared_[mw->index];
  e.key.store(0, std::memory_order_release);  // readers re-check the key after reading
  if (!mw->mr) return;
  const Mr* mr = mw->mr;
  uint64_t offset = mw->addr - mr->iova;  // where the window starts in the MR
  e.access = mw->access & kRemoteAccess;
  e.pd_token = reinterpret_cast<uint64_t>(mw->pd->prot);
  e.iova = (mw->access & IBV_ACCESS_ZERO_BASED) ? 0 : mw->addr;
  e.length = mw->length;
  e.addr = reinterpret_cast<uint64_t>(mr->host) + offset;
  e.shm = mr->shm && offset < mr->shm_length ? mr->shm + offset : 0;
  e.shm_length = e.shm ? mr->shm_length - offset : 0;
  e.qpn = mw->qpn;
  e.key.store(mw->rkey, std::memory_order_release);
}

ibv_wc_status MrTable::bind_window(const MwBind& b, Pd* qp_pd, uint32_t qpn) {
  constexpr ibv_wc_status kError = fault_rule(Fault::MwBind).requester_status;
  Mw* mw = b.mw_index < windows_.size() ? windows_[b.mw_index] : nullptr;
  if (!mw || mw != b.mw) return kError;  // deallocated since it was posted
  unsigned access = b.access & ~kAccessOptional;
  if (access & ~kBindAccess) return kError;
  std::lock_guard<SpinLock> g(mw->mu);
  const bool type2 = mw->ibv.type == IBV_MW_TYPE_2;
  // The new key keeps the window's index: a consumer chooses only its low 8 bits.
  if ((b.rkey >> 8) != (base_ | mw->index)) return kError;
  if (mw->pd->prot != qp_pd->prot) return kError;  // C10-72 (type 2); type 1 binds on a QP of its PD too
  if (type2) {
    if (mw->mr) return kError;                       // o10-37.2.30: bound; invalidate first
    if (b.length == 0) return kError;                // o10-37.2.40: not an unbind
  } else if (access & IBV_ACCESS_ZERO_BASED) {
    return kError;                                   // o10-36.2.2
  }
  Mr* mr = nullptr;
  if (b.length) {
    mr = find(b.mr_lkey);
    if (!mr || mr->pd->prot != mw->pd->prot) return kError;
    if (!(mr->access & IBV_ACCESS_MW_BIND)) return kError;        // C10-73
    if (mr->access & IBV_ACCESS_ZERO_BASED) return kError;
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(mr->access & IBV_ACCESS_LOCAL_WRITE))
      return kError;                                               // C10-74
    if (!inside(b.addr, b.length, mr->iova, mr->length)) return kError;  // C10-75
  }
  if (mw->mr) release_binding(mw);  // a type 1 window moves (or, length 0, is unbound)
  mw->rkey = b.rkey;
  if (mr) {
    mw->mr = mr;
    mr->bound_windows.fetch_add(1, std::memory_order_relaxed);
    mw->addr = b.addr;
    mw->length = b.length;
    mw->access = access & (kRemoteAccess | IBV_ACCESS_ZERO_BASED);
    mw->qpn = type2 ? qpn : 0;
  }
  publish_window(mw);
  return IBV_WC_SUCCESS;
}

bool MrTable::invalidate(uint32_t key, Pd* qp_pd, uint32_t qpn, bool match_qp) {
  uint32_t index = (key >> 8) - base_;  // another slot's key: out of range
  Mw* mw = index < windows_.size() ? windows_[index] : nullptr;
  if (!mw) return false;
  std::lock_guard<SpinLock> g(mw->mu);
  if (mw->rkey != key || mw->ibv.type != IBV_MW_TYPE_2 || !mw->mr || mw->pd->prot != qp_pd->prot)
    return false;
  if (match_qp && mw->qpn != qpn) return false;
  release_binding(mw);
  return true;
}

bool MrTable::resolve_window(Pd* pd, uint32_t qpn, uint32_t key, uint64_t addr,
                             uint64_t length, unsigned need, iovec* out) const {
  uint32_t index = (key >> 8) - base_;  // another slot's key: out of range
  Mw* mw = index < windows_.size() ? windows_[index] : nullptr;
  if (!mw) return false;
  std::lock_guard<SpinLock> g(mw->mu);
  const Mr* mr = mw->mr;
  if (!mr || mw->rkey != key || mw->pd->prot != pd->prot) return false;
  if (mw->ibv.type == IBV_MW_TYPE_2 && mw->qpn != qpn) return false;  // type 2B
  if ((mw->access & need) != need) return false;
  // Remote addresses count from the window's start when it is zero-based.
  uint64_t base = (mw->access & IBV_ACCESS_ZERO_BASED) ? 0 : mw->addr;
  if (!inside(addr, length, base, mw->length)) return false;
  uint64_t iova = mw->addr + (addr - base);
  out->iov_base = mr->host + (iova - mr->iova);
  out->iov_len = length;
  // A window on an ODP MR: its pages are faulted in as the MR's own key would (core.hpp).
  if (mr->access & IBV_ACCESS_ON_DEMAND)
    return fault_in(out->iov_base, length, (need & kWritingAccess) != 0);
  return true;
}

void MrTable::invalidate_windows_of(uint32_t qpn) {
  std::shared_lock lock(mu_);
  // Only type 2 windows are bound to a QP: not a walk over every key (a million MRs made
  // each QP's destroy take milliseconds).
  for (Mw* mw : type2_windows_) {
    std::lock_guard<SpinLock> g(mw->mu);
    if (mw->mr && mw->qpn == qpn) release_binding(mw);
  }
}

}  // namespace softverbs
