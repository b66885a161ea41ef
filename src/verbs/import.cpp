// Importing a context and its objects: ibv_import_device(3), ibv_import_pd(3),
// ibv_import_mr(3). A context's cmd_fd is a memfd that holds a small record (which device,
// which process made it, that process's registry slot); the inode identifies the context.
// A dup of the fd in the process that made it imports that very context: the new context
// shares its PD handles, and PDs and MRs imported through it are the same protection domain
// and the same keys. Passed to another process (SCM_RIGHTS) it imports the device, and
// that process's PDs and MRs are imported through its agent (wire/shm/agent.hpp), which
// answers only for the context whose cmd_fd the asker holds: a PD becomes a local PD that
// stands for the exporter's (its imports, QPs and MRs share protection), an MR whose pages
// are in the exporter's MR memfd becomes a mapping of them under the exporter's keys (keys
// are host-wide: wire/registry.hpp), found by the key table after our own keys
// (MrTable::find). Other MRs (file mappings, unaligned, SOFTVERBS_NO_SHARED_MR) answer
// EOPNOTSUPP. ibv_dereg_mr / ibv_dealloc_pd of an import destroy the original for
// everyone, as the man pages say; ibv_unimport_* free only the import.
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/verbs_ext.hpp"
#include "core/device.hpp"
#include "verbs/stat_publish.hpp"
#include "verbs/verbs.hpp"
#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/shm/mr_shm.hpp"

namespace softverbs {

namespace {

// The record at offset 0 of a context's cmd_fd.
struct ContextRecord {
  static constexpr uint64_t kMagic = 0x31585443'56534653ull;  // "SFSVCTX1"
  uint64_t magic = kMagic;
  int32_t pid = 0;   // the process whose objects the context's handles name
  int32_t slot = 0;  // its registry slot (0: none), checked against the registry's owner
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

// A context of this process whose cmd_fd is the file (dev, ino).
Context* context_of_file(uint64_t dev, uint64_t ino) {
  Context* found = nullptr;
  for_each_context([&](Context* ctx) {
    struct stat have;
    if (!found && fstat(ctx->cmd_fd, &have) == 0 && have.st_ino == ino && have.st_dev == dev)
      found = ctx;
  });
  return found;
}

// The agent's side: what an importer in process `pid` asks about our context (dev, ino).
int serve_import(wire::ImportOp op, uint64_t dev, uint64_t ino, uint32_t handle, pid_t pid,
                 uint64_t* value) {
  (void)pid;  // the cmd_fd's inode is the capability; the kernel named the asker
  Context* ctx = context_of_file(dev, ino);
  if (!ctx || ctx->shared->foreign) return EINVAL;
  ContextShared* shared = ctx->shared.get();
  switch (op) {
    case wire::ImportOp::Pd:
    case wire::ImportOp::DeallocPd: {
      std::lock_guard<std::mutex> lock(shared->mu);
      auto it = shared->pds.find(handle);
      if (it == shared->pds.end()) return EINVAL;
      Pd* pd = it->second;
      *value = reinterpret_cast<uint64_t>(pd->prot);  // what its MRs' entries carry
      if (op == wire::ImportOp::Pd) return 0;
      if (pd->users.load() != 0) return EBUSY;  // its MRs, QPs or imports here
      destroy_pd_locked(pd);
      return 0;
    }
    case wire::ImportOp::Mr: {
      uint64_t table = MrTable::instance().shared_offset();  // publishes every MR
      std::shared_lock keys(MrTable::instance().lock());
      Mr* mr = MrTable::instance().find(handle);
      if (!mr || mr->imported || mr->pd->ctx->shared.get() != shared) return EINVAL;
      // Only pages in the MR memfd can be mapped by another process.
      if (!table || mr->shm < wire::kMrShmFirst || mr->shm_length < mr->length) return EOPNOTSUPP;
      *value = table;
      return 0;
    }
    case wire::ImportOp::DeregMr: {
      std::lock_guard<std::mutex> destroying(mr_destroy_mutex());
      Mr* mr;
      {
        std::shared_lock keys(MrTable::instance().lock());
        mr = MrTable::instance().find(handle);
      }
      // Under mr_destroy_mutex() no ibv_dereg_mr frees it meanwhile.
      if (!mr || mr->imported || mr->pd->ctx->shared.get() != shared) return EINVAL;
      return destroy_mr_locked(mr);
    }
  }
  return EINVAL;
}

void install_import_hooks() {
  static const bool installed = [] {
    wire::ImportHooks h;
    h.serve = serve_import;
    wire::set_import_hooks(h);
    return true;
  }();
  (void)installed;
}

// The PD `handle` of a foreign context's process, as a local PD in shared->pds (the `prot`
// its imports stand for): 0 or an errno value.
int adopt_foreign_pd(Context* ctx, uint32_t handle) {
  ContextShared* shared = ctx->shared.get();
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (shared->pds.count(handle)) return 0;
  }
  if (shared->exporter_slot <= 0) return EOPNOTSUPP;  // no registry, or the maker is gone
  uint64_t token = 0;
  int err = wire::agent_import(shared->exporter_slot, wire::ImportOp::Pd, shared->dev,
                               shared->ino, handle, &token, nullptr);
  if (err == ENXIO) return EOPNOTSUPP;  // the exporter does not answer (gone)
  if (err) return err;
  if (token == 0) return EPROTO;
  auto pd = std::make_shared<Pd>();
  pd->ibv.context = ctx->ibv();
  pd->ibv.handle = handle;
  pd->ctx = ctx;
  pd->foreign_token = token;
  std::lock_guard<std::mutex> lock(shared->mu);
  if (!shared->pds.count(handle)) {  // another thread may have adopted it meanwhile
    shared->pds[handle] = pd.get();
    shared->foreign_pds.push_back(std::move(pd));
  }
  return 0;
}

// An MR of the foreign context's process into `mr` (fields, keys, mapping): 0 or errno.
int import_foreign_mr(Pd* pd, uint32_t handle, Mr* mr) {
  ContextShared* shared = pd->ctx->shared.get();
  const uint64_t token = pd->prot->foreign_token;
  const int slot = shared->exporter_slot;
  if (slot <= 0 || token == 0) return EOPNOTSUPP;
  if (wire::slot_of_key(handle) != slot) return EINVAL;  // not a key of that process
  auto foreign = std::make_shared<ForeignMr>();
  foreign->slot = slot;
  uint64_t table_at = 0;
  int err = wire::agent_import(slot, wire::ImportOp::Mr, shared->dev, shared->ino, handle,
                               &table_at, &foreign->arena);
  if (err == ENXIO) return EOPNOTSUPP;
  if (err) return err;
  const wire::PeerArena& arena = foreign->arena;
  if (arena.pid != shared->exporter_pid) return EOPNOTSUPP;  // the slot has a new owner
  // Everything below is the exporter's word: checked before it decides where we copy.
  const auto* table = arena.published_at<wire::MrShared>(
      table_at, sizeof(wire::MrShared) * wire::kMrTableCap);
  wire::MrShared e{};
  if (!table || !wire::read_mr_entry(table, handle, &e)) return EINVAL;
  constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                    IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB |
                                    IBV_ACCESS_RELAXED_ORDERING | kAccessFlushGlobal |
                                    kAccessFlushPersistent;
  if (e.pd_token != token || e.qpn != 0 || (e.access & ~kKnownAccess) || e.length == 0)
    return EINVAL;
  if (e.shm < wire::kMrShmFirst || e.shm_length < e.length) return EOPNOTSUPP;
  uint64_t known_size = 0;
  char* host = wire::peer_mr_span(arena.mr, arena.mr_fd, e.shm, e.length, &known_size);
  if (!host) return EOPNOTSUPP;
  foreign->entry = &table[wire::key_index(handle)];
  foreign->pidfd = static_cast<int>(syscall(SYS_pidfd_open, arena.pid, 0));
  if (foreign->pidfd < 0) return EOPNOTSUPP;
  mr->iova = e.iova;
  mr->length = e.length;
  mr->access = e.access & ~IBV_ACCESS_ON_DEMAND;  // the pages are there: the exporter's
  mr->host = host;
  mr->ibv.length = e.length;
  mr->ibv.lkey = handle;
  mr->ibv.rkey = handle;
  mr->foreign = std::move(foreign);
  return 0;
}

}  // namespace

bool write_context_record(int cmd_fd, const char* device_name) {
  ContextRecord r;
  r.pid = getpid();
  r.slot = wire::my_slot();
  install_import_hooks();  // our agent answers importers of this context
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
  if (origin) {
    ctx->shared = origin->shared;
    return c;
  }
  ContextShared* shared = ctx->shared.get();  // another process's (or a closed) context
  shared->foreign = true;
  struct stat st;
  if (r.slot > 0 && r.slot < wire::kSlots && wire::slot_owner(r.slot) == r.pid &&
      fstat(cmd_fd, &st) == 0) {
    shared->exporter_pid = r.pid;
    shared->exporter_slot = r.slot;
    shared->dev = st.st_dev;
    shared->ino = st.st_ino;
  }
  return c;
}

ibv_pd* import_pd(Context* ctx, uint32_t handle) {
  if (ctx->shared->foreign)
    if (int err = adopt_foreign_pd(ctx, handle)) return fail<ibv_pd>(err);
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
  if (pd->prot->foreign_token) {
    if (int err = import_foreign_mr(pd, handle, mr)) {
      delete mr;
      return fail<ibv_mr>(err);
    }
  } else {
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
  if (mr->foreign) MrTable::instance().insert_imported(mr);
  stat::publish(mr);
  return &mr->ibv;
}

void unimport_mr(Mr* mr) {
  if (!mr->imported) return;
  stat::withdraw(mr);
  if (mr->foreign) MrTable::instance().erase_imported(mr);  // waits for operations using it
  mr->pd->users--;
  mr->magic = kDead;
  delete mr;
  sweep_unimported_pds();
}

int dereg_imported_mr(Mr* mr) {
  ContextShared* shared = mr->pd->ctx->shared.get();
  if (mr->foreign) {
    // The exporter destroys its MR; one that is gone already has nothing left to destroy.
    uint64_t unused = 0;
    int err = wire::agent_import(shared->exporter_slot, wire::ImportOp::DeregMr, shared->dev,
                                 shared->ino, mr->ibv.lkey, &unused, nullptr);
    if (err && err != ENXIO && err != EINVAL) return err;
  } else {
    std::lock_guard<std::mutex> destroying(mr_destroy_mutex());
    Mr* origin;
    {
      std::shared_lock keys(MrTable::instance().lock());
      origin = MrTable::instance().find(mr->ibv.lkey);
    }
    if (origin && !origin->imported && origin->pd->ctx->shared.get() == shared)
      if (int err = destroy_mr_locked(origin)) return err;
  }
  unimport_mr(mr);
  return 0;
}

int dealloc_imported_pd(Pd* pd) {
  ContextShared* shared = pd->ctx->shared.get();
  Pd* origin = pd->prot;
  // The PD is in use while anything but this import holds it (the kernel's EBUSY).
  if (origin->users.load() != 1) return EBUSY;
  if (origin->foreign_token) {
    uint64_t unused = 0;
    int err = wire::agent_import(shared->exporter_slot, wire::ImportOp::DeallocPd, shared->dev,
                                 shared->ino, pd->ibv.handle, &unused, nullptr);
    if (err && err != ENXIO && err != EINVAL) return err;
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->pds.erase(pd->ibv.handle);  // importing it again asks the exporter again
  } else {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (origin->users.load() != 1) return EBUSY;
    destroy_pd_locked(origin);
  }
  unimport_pd(pd);
  return 0;
}

}  // namespace softverbs
