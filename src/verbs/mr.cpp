// Protection domains, memory regions and their key table.
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <mutex>

#include "core/device.hpp"
#include "common/verbs_ext.hpp"
#include "verbs/verbs.hpp"
#include "wire/shm/arena.hpp"
#include "wire/shm/mr_shm.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {
constexpr unsigned kAccessKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                  IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB |
                                  kAccessFlushGlobal | kAccessFlushPersistent;
// Bits 20..29 are optional (e.g. RELAXED_ORDERING): a device may ignore them.
constexpr unsigned kAccessOptional = 0x3ff00000u;

// Only memory a peer may write, read or update needs to be where peers can reach it:
// through the MR's own key, through memory windows bound to it, or (LOCAL_WRITE) as the
// buffer of a receive a peer's large SEND is placed in (docs/send-placement.md).
bool peers_may_access(unsigned access) {
  return access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                   IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE);
}

// Whether an MR's pages move into the shared MR memfd (decision 0005). Not ODP ones: their
// range need not be mapped, and peers reach them by cross-memory attach (which faults the
// pages in, or fails cleanly), or through our agent, whose access faults them in.
bool movable(const Mr* mr) {
  return peers_may_access(mr->access) && !(mr->access & IBV_ACCESS_ON_DEMAND) && mr->host &&
         mr->length;
}

int check_access(unsigned access) {
  access &= ~kAccessOptional;
  if (access & ~kAccessKnown) return EINVAL;
  // IBA: remote write or atomic access requires local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}
}  // namespace


ibv_pd* alloc_pd(Context* ctx) {
  if (!count_object(Counted::Pd)) {  // device_limits().max_pd
    errno = ENOMEM;
    return nullptr;
  }
  auto* pd = new (std::nothrow) Pd{};
  if (!pd) {
    uncount_object(Counted::Pd);
    errno = ENOMEM;
    return nullptr;
  }
  // Handles are unique in the process, so one never names a PD of another context.
  static std::atomic<uint32_t> next_handle{1};
  pd->ibv.context = ctx->ibv();
  pd->ibv.handle = next_handle.fetch_add(1, std::memory_order_relaxed);
  pd->ctx = ctx;
  {
    std::lock_guard<std::mutex> lock(ctx->shared->mu);
    ctx->shared->pds[pd->ibv.handle] = pd;
  }
  stat::publish(pd);
  return &pd->ibv;
}

int dealloc_pd(Pd* pd) {
  if (pd->users.load() != 0) return EBUSY;
  if (pd->parent) {
    free_parent_domain(pd);
    return 0;
  }
  if (pd->imported) {  // the kernel would destroy the PD; ours stays with its creator
    unimport_pd(pd);
    return 0;
  }
  {
    std::lock_guard<std::mutex> lock(pd->ctx->shared->mu);
    pd->ctx->shared->pds.erase(pd->ibv.handle);
  }
  stat::withdraw(pd);
  pd->magic = kDead;
  delete pd;
  uncount_object(Counted::Pd);
  return 0;
}

int check_mr_access(unsigned access) { return check_access(access); }

// The registration every kind of MR ends in: `host` is where the byte named by `iova` is in
// this process, `addr` what the application sees in ibv_mr.addr.
Mr* make_mr(Pd* pd, char* host, void* addr, size_t length, uint64_t iova, unsigned access) {
  if (!count_object(Counted::Mr)) {  // device_limits().max_mr
    errno = ENOMEM;
    return nullptr;
  }
  auto* mr = new (std::nothrow) Mr{};
  if (!mr) {
    uncount_object(Counted::Mr);
    errno = ENOMEM;
    return nullptr;
  }
  mr->pd = pd;
  mr->iova = iova;
  mr->length = length;
  mr->access = access & ~kAccessOptional;
  mr->host = host;
  mr->ibv.context = pd->ibv.context;
  mr->ibv.pd = &pd->ibv;
  mr->ibv.addr = addr;
  mr->ibv.length = length;
  size_t shared = 0;
  mr->shm = movable(mr) ? wire::mr_shm_acquire(host, length, &shared) : 0;
  mr->shm_length = shared;
  uint32_t key = MrTable::instance().insert(mr);
  mr->ibv.handle = key;
  mr->ibv.lkey = key;
  mr->ibv.rkey = key;
  MrTable::instance().publish(mr);
  pd->users++;
  stat::publish(mr);
  return mr;
}

ibv_mr* reg_mr(Pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  if (int err = check_access(access)) {
    errno = err;
    return nullptr;
  }
  // Implicit ODP (ibv_reg_mr(3)): (NULL, SIZE_MAX, ON_DEMAND) covers the whole address
  // space, addresses are virtual addresses, so the iova must be 0.
  const bool implicit = !addr && length == SIZE_MAX && (access & IBV_ACCESS_ON_DEMAND);
  if ((implicit && iova != 0) ||
      (!implicit && (length == 0 || !addr ||
                     length > ~0ull - reinterpret_cast<uintptr_t>(addr)))) {
    errno = EINVAL;
    return nullptr;
  }
  Mr* mr = make_mr(pd, static_cast<char*>(addr), addr, length, iova, access);
  return mr ? &mr->ibv : nullptr;
}

int rereg_mr(Mr* mr, int flags, Pd* pd, void* addr, size_t length, int access) {
  if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
                IBV_REREG_MR_CHANGE_ACCESS) || flags == 0)
    return IBV_REREG_MR_ERR_INPUT;
  if (mr->imported) return IBV_REREG_MR_ERR_INPUT;  // only its creator changes the MR
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && check_access(access))
    return IBV_REREG_MR_ERR_INPUT;
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || length == 0))
    return IBV_REREG_MR_ERR_INPUT;
  if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) return IBV_REREG_MR_ERR_INPUT;
  // Device memory, dma-buf and implicit ODP MRs have no user address to move to.
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && mr->host != mr->ibv.addr)
    return IBV_REREG_MR_ERR_INPUT;
  std::unique_lock lock(MrTable::instance().lock());
  // Windows bound to it keep what they were bound to (as ibv_dereg_mr fails, IBA 10.6.7.2.6).
  if (mr->bound_windows.load(std::memory_order_relaxed) > 0) return IBV_REREG_MR_ERR_INPUT;
  MrTable::instance().note_change();
  // The pages moved for the old translation or access go back; the new ones move if they may.
  if (mr->shm) wire::mr_shm_release(mr->host);
  mr->shm = mr->shm_length = 0;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->ibv.addr = addr;
    mr->host = static_cast<char*>(addr);
    mr->ibv.length = length;
    mr->iova = reinterpret_cast<uintptr_t>(addr);
    mr->length = length;
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS)
    mr->access = static_cast<unsigned>(access) & ~kAccessOptional;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    mr->pd->users--;
    mr->pd = pd;
    mr->ibv.pd = &pd->ibv;
    pd->users++;
  }
  if (movable(mr)) {
    size_t shared = 0;
    mr->shm = wire::mr_shm_acquire(mr->host, mr->length, &shared);
    mr->shm_length = shared;
  }
  lock.unlock();
  MrTable::instance().publish(mr);
  stat::publish(mr);
  return 0;
}

int dereg_mr(Mr* mr) {
  if (mr->imported) {
    unimport_mr(mr);
    return 0;
  }
  // Waits for in-flight operations (shared lock); fails while memory windows are bound to
  // it (ibv_alloc_mw(3): "ibv_dereg_mr() fails if any memory window is still bound to this
  // MR"). EBUSY, as for a PD still in use; rxe answers EINVAL.
  if (!MrTable::instance().erase_unbound(mr)) return EBUSY;
  if (mr->shm) wire::mr_shm_release(mr->host);
  if (mr->dmabuf_map) munmap(mr->dmabuf_map, mr->dmabuf_map_length);
  if (mr->dm) mr->dm->mrs--;
  mr->pd->users--;
  stat::withdraw(mr);
  mr->magic = kDead;
  delete mr;
  uncount_object(Counted::Mr);
  return 0;
}

ibv_ah* create_ah(Pd* pd, const ibv_ah_attr* attr) {
  // RoCE: an address vector must carry a GRH (IBV_QPF_GRH_REQUIRED).
  if (attr->port_num != 1 || !attr->is_global ||
      attr->grh.sgid_index >= Device::instance().gids().size()) {
    errno = EINVAL;
    return nullptr;
  }
  if (!count_object(Counted::Ah)) {  // device_limits().max_ah
    errno = ENOMEM;
    return nullptr;
  }
  auto* ah = new (std::nothrow) Ah{};
  if (!ah) {
    uncount_object(Counted::Ah);
    errno = ENOMEM;
    return nullptr;
  }
  ah->ibv.context = pd->ibv.context;
  ah->ibv.pd = &pd->ibv;
  ah->pd = pd;
  ah->attr = *attr;
  pd->users++;
  stat::publish(ah);
  return &ah->ibv;
}

int destroy_ah(Ah* ah) {
  stat::withdraw(ah);
  ah->pd->users--;
  ah->magic = kDead;
  delete ah;
  uncount_object(Counted::Ah);
  return 0;
}

}  // namespace softverbs
