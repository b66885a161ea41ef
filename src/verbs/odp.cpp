// On-demand paging (ibv_reg_mr(3) IBV_ACCESS_ON_DEMAND, ibv_advise_mr(3)). An ODP MR pins
// nothing and needs no mapping at registration; every access faults its pages in
// (resolve_sge, core/core.hpp), and one that cannot be served is the access error. Prefetch
// faults them in ahead of time. Error numbers as the kernel's mlx5 answers them: a key that
// names no ODP MR of this PD (or one not writable, for PREFETCH_WRITE) ENOENT, a range
// outside the MR or not in the address space EFAULT (only with IBV_ADVISE_MR_FLAG_FLUSH;
// without it the prefetch is best effort and its failures are not reported).
#include <cerrno>
#include <shared_mutex>

#include "verbs/verbs.hpp"

namespace softverbs {

int advise_mr(Pd* pd, uint32_t advice, uint32_t flags, const ibv_sge* sg_list, uint32_t num_sge) {
  if (flags & ~IBV_ADVISE_MR_FLAG_FLUSH) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (!sg_list || num_sge == 0) return EINVAL;
  const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  const bool sync = flags & IBV_ADVISE_MR_FLAG_FLUSH;
  std::shared_lock keys(MrTable::instance().lock());
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& s = sg_list[i];
    Mr* mr = MrTable::instance().find(s.lkey);
    if (!mr || mr->pd->prot != pd->prot || !(mr->access & IBV_ACCESS_ON_DEMAND) ||
        (write && !(mr->access & IBV_ACCESS_LOCAL_WRITE)))
      return ENOENT;
    if (s.addr < mr->iova || s.length > mr->length || s.addr - mr->iova > mr->length - s.length) {
      if (sync) return EFAULT;
      continue;
    }
    const char* at = mr->host + (s.addr - mr->iova);
    bool ok = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT ? range_mapped(at, s.length)
                                                                : fault_in(at, s.length, write);
    if (!ok && sync) return EFAULT;
  }
  return 0;
}

}  // namespace softverbs
