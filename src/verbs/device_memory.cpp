// Device memory (ibv_alloc_dm(3)): an allocation the application reaches only through
// ibv_memcpy_to_dm / ibv_memcpy_from_dm (the inline functions call the pointers we put in
// struct ibv_dm) and through MRs on it, which are zero based (ibv_reg_dm_mr). Ours is page
// aligned host memory, so peers on this host RDMA into it like into any MR (decision 0005).
// Error numbers as mlx5, the provider that has it: a size above max_dm_size EINVAL, a copy
// outside the allocation EFAULT, an offset or length not a multiple of 4 EINVAL.
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "verbs/stat_publish.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

constexpr uint32_t kDmAllowedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                      IBV_ACCESS_ZERO_BASED | IBV_ACCESS_OPTIONAL_RANGE;
constexpr uint64_t kDmGranule = 4;  // copies move whole 32-bit words, as on mlx5 MEMIC

std::atomic<size_t> dm_in_use{0};  // bytes of device memory this process holds

// Allocations by handle, for ibv_import_dm from another context of this process.
struct Handles {
  std::mutex mu;
  uint32_t next = 1;
  std::map<uint32_t, std::weak_ptr<DmMemory>> live;
};
Handles& handles() {
  static Handles* h = new Handles;  // immortal: DMs may be freed during exit
  return *h;
}

// A copy of `length` bytes at `offset`: 0, or the errno mlx5 gives.
int check_copy(const Dm* dm, uint64_t offset, size_t length) {
  if (offset > dm->mem->length || length > dm->mem->length - offset) return EFAULT;
  if (offset % kDmGranule || length % kDmGranule) return EINVAL;
  return 0;
}

int copy_to_dm(ibv_dm* d, uint64_t offset, const void* host, size_t length) {
  Dm* dm = Dm::from(d);
  if (!dm) return EINVAL;
  if (int err = check_copy(dm, offset, length)) return err;
  if (length) std::memcpy(dm->mem->base + offset, host, length);
  return 0;
}

int copy_from_dm(void* host, ibv_dm* d, uint64_t offset, size_t length) {
  Dm* dm = Dm::from(d);
  if (!dm) return EINVAL;
  if (int err = check_copy(dm, offset, length)) return err;
  if (length) std::memcpy(host, dm->mem->base + offset, length);
  return 0;
}

Dm* new_dm(Context* ctx, std::shared_ptr<DmMemory> mem, uint32_t handle) {
  auto* dm = new (std::nothrow) Dm{};
  if (!dm) return nullptr;
  dm->ibv.context = ctx->ibv();
  dm->ibv.memcpy_to_dm = &copy_to_dm;
  dm->ibv.memcpy_from_dm = &copy_from_dm;
  dm->ibv.comp_mask = 0;
  dm->ibv.handle = handle;
  dm->ctx = ctx;
  dm->mem = std::move(mem);
  return dm;
}

}  // namespace

DmMemory::~DmMemory() {
  if (base) munmap(base, mapped);
  dm_in_use.fetch_sub(length);
}

Dm* Dm::from(ibv_dm* d) {
  auto* dm = reinterpret_cast<Dm*>(d);
  return d && dm->magic == kDmMagic ? dm : nullptr;
}

ibv_dm* alloc_dm(Context* ctx, const ibv_alloc_dm_attr* attr) {
  // log_align_req: our allocations are page aligned, so up to a page is always met.
  if (!attr || attr->comp_mask || attr->length == 0 || attr->length > kMaxDmSize ||
      attr->log_align_req > 12) {
    errno = EINVAL;
    return nullptr;
  }
  // The device's memory is shared by everything on it: past max_dm_size, none is left.
  size_t before = dm_in_use.fetch_add(attr->length);
  auto mem = std::make_shared<DmMemory>();
  mem->length = attr->length;  // the destructor gives it back from here on
  if (before + attr->length > kMaxDmSize) {
    errno = ENOMEM;
    return nullptr;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  mem->mapped = (attr->length + page - 1) / page * page;
  void* p = mmap(nullptr, mem->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    errno = ENOMEM;
    return nullptr;
  }
  mem->base = static_cast<char*>(p);
  uint32_t handle;
  {
    std::lock_guard<std::mutex> lock(handles().mu);
    handle = handles().next++;
    handles().live[handle] = mem;
  }
  Dm* dm = new_dm(ctx, std::move(mem), handle);
  if (!dm) {
    std::lock_guard<std::mutex> lock(handles().mu);
    handles().live.erase(handle);
    errno = ENOMEM;
    return nullptr;
  }
  stat::publish(dm);
  return &dm->ibv;
}

int free_dm(Dm* dm) {
  if (dm->mem->mrs.load() != 0) return EBUSY;  // MRs on it: deregister them first
  {
    std::lock_guard<std::mutex> lock(handles().mu);
    handles().live.erase(dm->ibv.handle);
  }
  stat::withdraw(dm);
  dm->magic = kDead;
  delete dm;  // the memory goes with the last handle on it (an imported one may remain)
  return 0;
}

ibv_dm* import_dm(Context* ctx, uint32_t handle) {
  std::shared_ptr<DmMemory> mem;
  {
    std::lock_guard<std::mutex> lock(handles().mu);
    auto it = handles().live.find(handle);
    if (it != handles().live.end()) mem = it->second.lock();
  }
  if (!mem) {
    errno = ENOENT;
    return nullptr;
  }
  Dm* dm = new_dm(ctx, std::move(mem), handle);
  if (!dm) {
    errno = ENOMEM;
    return nullptr;
  }
  dm->imported = true;
  stat::publish(dm);
  return &dm->ibv;
}

void unimport_dm(Dm* dm) {
  stat::withdraw(dm);
  dm->magic = kDead;
  delete dm;
}

ibv_mr* reg_dm_mr(Pd* pd, Dm* dm, uint64_t offset, size_t length, unsigned access) {
  // The kernel takes only zero-based DM MRs; mlx5 only these access bits.
  if ((access & ~kDmAllowedAccess) || !(access & IBV_ACCESS_ZERO_BASED) ||
      check_mr_access(access) || pd->ctx != dm->ctx || offset > dm->mem->length ||
      length > dm->mem->length - offset) {
    errno = EINVAL;
    return nullptr;
  }
  Mr* mr = make_mr(pd, dm->mem->base + offset, nullptr, length, 0, access);
  if (!mr) return nullptr;
  mr->dm = dm->mem;
  dm->mem->mrs++;
  return &mr->ibv;
}

}  // namespace softverbs
