// Importing a context and its objects: ibv_import_device(3), ibv_import_pd(3),
// ibv_import_mr(3). A context's cmd_fd is a memfd that holds a small record (which device,
// which process made it); the inode identifies the context. A dup of the fd in the process
// that made it imports that very context: the new context shares its PD handles, and PDs
// and MRs imported through it are the same protection domain and the same keys. Passed to
// another process (SCM_RIGHTS) it imports the device: a context of the same device with
// the same attributes, but no PD or MR handles, because our PDs and MRs live in the memory
// of the process that made them (keys come from that process's key table; a kernel gives
// every process of a uverbs file one key space): ibv_import_pd/mr there fail with
// EOPNOTSUPP.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/device.hpp"
#include "verbs/stat_publish.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

// The record at offset 0 of a context's cmd_fd.
struct ContextRecord {
  static constexpr uint64_t kMagic = 0x31585443'56534653ull;  // "SFSVCTX1"
  uint64_t magic = kMagic;
  int32_t pid = 0;   // the process whose objects the context's handles name
  uint32_t reserved = 0;
  char device[IBV_SYSFS_NAME_MAX] = {};
};

bool read_record(int fd, ContextRecord* r) {
  return pread(fd, r, sizeof(*r), 0) == static_cast<ssize_t>(sizeof(*r)) &&
         r->magic == ContextRecord::kMagic &&
         std::memchr(r->device, '\0', sizeof(r->device)) != nullptr;
}

// A context of this process that `fd` is (a dup of) the cmd_fd of.
Context* local_context(int fd) {
  struct stat want;
  if (fstat(fd, &want) != 0) return nullptr;
  Context* found = nullptr;
  for_each_context([&](Context* ctx) {
    struct stat have;
    if (!found && fstat(ctx->cmd_fd, &have) == 0 && have.st_ino == want.st_ino &&
        have.st_dev == want.st_dev)
      found = ctx;
  });
  return found;
}

template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

}  // namespace

bool write_context_record(int cmd_fd, const char* device_name) {
  ContextRecord r;
  r.pid = getpid();
  std::strncpy(r.device, device_name, sizeof(r.device) - 1);
  return pwrite(cmd_fd, &r, sizeof(r), 0) == static_cast<ssize_t>(sizeof(r));
}

Context* context_from_cmd_fd(int fd) {
  ContextRecord r;
  if (!read_record(fd, &r) || r.pid != getpid()) return nullptr;  // a forked child's copy too
  return local_context(fd);
}

ibv_context* import_device(int cmd_fd) {
  ContextRecord r;
  if (!read_record(cmd_fd, &r)) return fail<ibv_context>(EINVAL);
  ibv_device* dev = Device::instance().ibv();
  if (std::strcmp(r.device, dev->name) != 0) return fail<ibv_context>(ENODEV);
  Context* origin = context_from_cmd_fd(cmd_fd);
  ibv_context* c = open_context(dev, cmd_fd);
  if (!c) return nullptr;
  Context* ctx = Context::from(c);
  if (origin)
    ctx->shared = origin->shared;
  else
    ctx->shared->foreign = true;  // another process's (or a closed) context
  return c;
}

ibv_pd* import_pd(Context* ctx, uint32_t handle) {
  Pd* origin = nullptr;
  {
    std::lock_guard<std::mutex> lock(ctx->shared->mu);
    auto it = ctx->shared->pds.find(handle);
    if (it == ctx->shared->pds.end())
      return fail<ibv_pd>(ctx->shared->foreign ? EOPNOTSUPP : EINVAL);
    origin = it->second;
    origin->users++;  // under the lock: dealloc_pd cannot free it meanwhile (EBUSY)
  }
  auto* pd = new (std::nothrow) Pd{};
  if (!pd) {
    origin->users--;
    return fail<ibv_pd>(ENOMEM);
  }
  pd->ibv.context = ctx->ibv();
  pd->ibv.handle = handle;
  pd->ctx = ctx;
  pd->prot = origin;
  pd->imported = true;
  stat::publish(pd);
  return &pd->ibv;
}

namespace {
// Unimported PDs that objects created on them still name (rdma-core frees only its own
// struct at unimport; the kernel's PD lives on): freed once their last user is gone.
std::mutex g_orphans_mu;
std::vector<Pd*>* g_orphans = new std::vector<Pd*>;  // immortal: swept until exit

void free_import(Pd* pd) {
  pd->prot->users--;
  delete pd;
}
}  // namespace

void sweep_unimported_pds() {
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  std::erase_if(*g_orphans, [](Pd* pd) {
    if (pd->users.load() != 0) return false;
    free_import(pd);
    return true;
  });
}

void unimport_pd(Pd* pd) {
  if (!pd->imported) return;
  stat::withdraw(pd);
  pd->magic = kDead;  // no verb takes it any more
  if (pd->users.load() == 0) {
    free_import(pd);
  } else {
    std::lock_guard<std::mutex> lock(g_orphans_mu);
    g_orphans->push_back(pd);
  }
  sweep_unimported_pds();
}

ibv_mr* import_mr(Pd* pd, uint32_t handle) {
  auto* mr = new (std::nothrow) Mr{};
  if (!mr) return fail<ibv_mr>(ENOMEM);
  {
    std::shared_lock keys(MrTable::instance().lock());
    Mr* origin = MrTable::instance().find(handle);
    // The MR must be one of this context's (or a context it shares handles with), in the
    // protection domain `pd` stands for.
    if (!origin || origin->pd->ctx->shared != pd->ctx->shared || origin->pd->prot != pd->prot) {
      delete mr;
      return fail<ibv_mr>(pd->ctx->shared->foreign ? EOPNOTSUPP : EINVAL);
    }
    mr->iova = origin->iova;
    mr->length = origin->length;
    mr->access = origin->access;
    mr->host = origin->host;
    mr->ibv.length = origin->ibv.length;
    mr->ibv.lkey = origin->ibv.lkey;
    mr->ibv.rkey = origin->ibv.rkey;
  }
  mr->pd = pd;
  mr->imported = true;
  mr->ibv.context = pd->ibv.context;
  mr->ibv.pd = &pd->ibv;
  mr->ibv.addr = nullptr;  // ibv_import_mr(3): "not applicable, NULL value is expected"
  mr->ibv.handle = handle;
  pd->users++;
  stat::publish(mr);
  return &mr->ibv;
}

void unimport_mr(Mr* mr) {
  if (!mr->imported) return;
  stat::withdraw(mr);
  mr->pd->users--;
  mr->magic = kDead;
  delete mr;
  sweep_unimported_pds();
}

}  // namespace softverbs
