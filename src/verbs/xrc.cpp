// XRC (eXtended Reliable Connection): domains, XRC SRQs and the TGT QPs of a domain.
//  - ibv_open_xrcd(3): a domain opened on a file is named by the file's inode, so that every
//    process (and every handle in a process) that opens it on the same inode shares one
//    domain; fd -1 gives a domain of its own. Which processes hold a shared domain open is
//    a small file in the state directory, changed under flock(2) (released by the kernel
//    when a holder dies) and checked on every read: a dead holder's entry is dropped, a
//    file that is not ours is taken as empty.
//  - XRC SRQs have a number (ibv_get_srq_num) that INI QPs name per message (XRCETH); a
//    message lands only in an SRQ of the TGT QP's domain.
//  - TGT QPs (IBV_QPT_XRC_RECV) have no PD, CQs or queues; ibv_open_qp gives more handles
//    on one, and the QP lives until its last handle is destroyed. A process that ends
//    (exit) while other processes hold handles on a TGT QP it runs hands the QP over to one
//    of them, which runs it on from then on under the same number (docs/xrc.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/state_dir.hpp"
#include "core/device.hpp"
#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "verbs/verbs.hpp"
#include "wire/registry.hpp"
#include "wire/shm/agent.hpp"
#include "wire/transport.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {

// ---- Which processes hold a shared domain open (the state file) -------------------------

constexpr uint32_t kDomainFileMagic = 0x58524344;  // "XRCD"
constexpr int kMaxHolders = 256;

struct Holder {
  int32_t pid;
  uint32_t reserved;
  uint64_t start;  // the holder's start time (/proc/PID/stat), so a reused pid is not it
};
struct DomainFile {
  uint32_t magic;
  uint32_t count;
  Holder holders[kMaxHolders];
};

// /proc/PID/stat read into buf: what follows the command name's closing parenthesis (the
// name may hold spaces and parentheses), " S ppid ..." from field 3 on; nullptr without it.
const char* proc_stat_after_name(pid_t pid, char (&buf)[1024]) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return nullptr;
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  return std::strrchr(buf, ')');
}

uint64_t start_time_of(pid_t pid) {
  char buf[1024];
  // Field 22, counted after the command name.
  const char* p = proc_stat_after_name(pid, buf);
  if (!p) return 0;
  unsigned long long v = 0;
  int field = 2;
  for (++p; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  if (std::sscanf(p, "%llu", &v) != 1) return 0;
  return v;
}

bool holder_alive(const Holder& h) {
  if (h.pid <= 0) return false;
  if (kill(h.pid, 0) != 0 && errno != EPERM) return false;
  return start_time_of(h.pid) == h.start;
}

std::string domain_path(dev_t dev, ino_t ino) {
  return state_dir() + "/xrcd-" + std::to_string(static_cast<unsigned long long>(dev)) + "-" +
         std::to_string(static_cast<unsigned long long>(ino));
}

// The file of domain (dev, ino), locked; -1 with errno on failure. A file unlinked by the
// last holder between our open and our lock is opened again.
int lock_domain_file(dev_t dev, ino_t ino) {
  const std::string path = domain_path(dev, ino);
  for (int tries = 0; tries < 100; ++tries) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      return -1;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_nlink > 0) return fd;
    ::close(fd);
  }
  errno = EAGAIN;
  return -1;
}

// Reads the holders, keeping only live, distinct ones: whatever the file holds.
DomainFile read_holders(int fd) {
  DomainFile f{};
  DomainFile raw{};
  ssize_t n = pread(fd, &raw, sizeof(raw), 0);
  f.magic = kDomainFileMagic;
  if (n != static_cast<ssize_t>(sizeof(raw)) || raw.magic != kDomainFileMagic) return f;
  uint32_t count = std::min<uint32_t>(raw.count, kMaxHolders);
  for (uint32_t i = 0; i < count; ++i) {
    const Holder& h = raw.holders[i];
    bool dup = false;
    for (uint32_t j = 0; j < f.count; ++j) dup |= f.holders[j].pid == h.pid;
    if (!dup && holder_alive(h)) f.holders[f.count++] = h;
  }
  return f;
}

// Adds (`join`) or removes this process; `*existed` tells whether anyone else held it.
// 0 or an errno value. With `join` and `check`, the O_CREAT/O_EXCL rules come first.
int update_holders(dev_t dev, ino_t ino, bool join, int oflags, bool held_here) {
  int fd = lock_domain_file(dev, ino);
  if (fd < 0) return errno ? errno : EIO;
  DomainFile f = read_holders(fd);
  const pid_t self = getpid();
  int err = 0;
  uint32_t mine = f.count;
  for (uint32_t i = 0; i < f.count; ++i)
    if (f.holders[i].pid == self) mine = i;
  if (join) {
    // The kernel's rules (ib_uverbs_open_xrcd): no domain yet and no O_CREAT is EAGAIN,
    // one that exists with O_EXCL is EINVAL.
    bool exists = f.count > 0 || held_here;
    if (!exists && !(oflags & O_CREAT)) err = EAGAIN;
    else if (exists && (oflags & O_EXCL)) err = EINVAL;
    else if (mine == f.count) {
      if (f.count == kMaxHolders) err = ENOMEM;
      else f.holders[f.count++] = {self, 0, start_time_of(self)};
    }
  } else if (mine < f.count) {
    f.holders[mine] = f.holders[--f.count];
  }
  if (!err) {
    if (f.count == 0) {
      unlink(domain_path(dev, ino).c_str());  // under the lock: openers check st_nlink
    } else if (pwrite(fd, &f, sizeof(f), 0) != static_cast<ssize_t>(sizeof(f))) {
      err = EIO;
    }
  }
  ::close(fd);  // releases the lock
  return err;
}

std::mutex g_domains_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<XrcDomain>>& g_domains =
    *new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<XrcDomain>>;  // immortal: exit

}  // namespace

// The hidden PD and CQ (verbs.hpp), made once.
bool ensure_tgt_resources(Context* ctx) {
  static std::mutex mu;
  std::lock_guard<std::mutex> once(mu);
  if (ctx->xrc_pd) return true;
  ibv_pd* pd = alloc_pd(ctx);
  if (!pd) return false;
  ibv_cq* cq = create_cq(ctx, 1, nullptr, nullptr, 0);
  if (!cq) {
    dealloc_pd(Pd::from(pd));
    return false;
  }
  std::lock_guard<std::mutex> lock(ctx->objects_mu);
  ctx->cqs.erase(Cq::from(cq));  // not one of the application's
  ctx->xrc_cq = Cq::from(cq);
  ctx->xrc_pd = Pd::from(pd);
  return true;
}

void install_xrc_hooks();  // below: our agent's side of ibv_open_qp across processes
void ensure_handover_at_exit();  // below: TGT QPs others hold outlive our exit
void adopted_qp_gone(int slot);   // below: the last adopted QP of `slot` lets it go

Xrcd* Xrcd::from(ibv_xrcd* x) {
  auto* xrcd = reinterpret_cast<Xrcd*>(x);
  return x && xrcd->magic == kXrcdMagic ? xrcd : nullptr;
}

ibv_xrcd* open_xrcd(Context* ctx, const ibv_xrcd_init_attr* attr) {
  if (!attr || (attr->comp_mask & ~uint32_t(IBV_XRCD_INIT_ATTR_RESERVED - 1))) {
    errno = attr ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  // rdma-core's ibv_cmd_open_xrcd: both the fd and the flags must be given.
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
      (attr->oflags & ~(O_CREAT | O_EXCL))) {
    errno = EINVAL;
    return nullptr;
  }
  static std::once_flag hooks;
  std::call_once(hooks, install_xrc_hooks);  // our TGT QPs can be opened by other processes
  std::shared_ptr<XrcDomain> domain;
  if (attr->fd == -1) {
    domain = std::make_shared<XrcDomain>();  // a domain of its own
  } else {
    struct stat st;
    if (fstat(attr->fd, &st) != 0) {
      errno = EBADF;
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(g_domains_mu);
    const auto key = std::make_pair(st.st_dev, st.st_ino);
    domain = g_domains[key].lock();
    int err = update_holders(st.st_dev, st.st_ino, true, attr->oflags, domain != nullptr);
    if (err) {
      if (!domain) g_domains.erase(key);
      errno = err;
      return nullptr;
    }
    if (!domain) {
      domain = std::make_shared<XrcDomain>();
      domain->shared = true;
      domain->dev = st.st_dev;
      domain->ino = st.st_ino;
      g_domains[key] = domain;
    }
    ++domain->handles;
  }
  auto* x = new (std::nothrow) Xrcd{};
  if (!x) {
    close_xrcd_domain(domain);
    errno = ENOMEM;
    return nullptr;
  }
  x->ctx = ctx;
  x->domain = std::move(domain);
  x->ibv.context = ctx->ibv();
  // The file's name, for `softverbs stat` (what it was opened as; renames are not followed).
  char path[256] = "";
  if (attr->fd != -1) {
    const std::string link = "/proc/self/fd/" + std::to_string(attr->fd);
    ssize_t n = readlink(link.c_str(), path, sizeof(path) - 1);
    path[n > 0 ? n : 0] = '\0';
  }
  stat::publish(x, path);
  return &x->ibv;
}

// One more holder of the domain in this process: a TGT QP whose creator handle went.
void hold_xrcd_domain(const std::shared_ptr<XrcDomain>& d) {
  if (!d || !d->shared) return;
  std::lock_guard<std::mutex> lock(g_domains_mu);
  ++d->handles;
}

void close_xrcd_domain(const std::shared_ptr<XrcDomain>& d) {
  if (!d || !d->shared) return;
  std::lock_guard<std::mutex> lock(g_domains_mu);
  if (--d->handles > 0) return;
  g_domains.erase({d->dev, d->ino});
  update_holders(d->dev, d->ino, false, 0, false);
}

int close_xrcd(Xrcd* x) {
  if (x->users.load() != 0) return EBUSY;  // SRQs or TGT QPs still use it (as the kernel)
  close_xrcd_domain(x->domain);
  stat::withdraw(x);
  x->magic = kDead;
  delete x;
  return 0;
}

// ---- XRC SRQs ---------------------------------------------------------------------------

ibv_srq* create_xrc_srq(Context* ctx, ibv_srq_init_attr_ex* ex) {
  constexpr uint32_t kNeed = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  Pd* pd = (ex->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? Pd::from(ex->pd) : nullptr;
  Xrcd* xrcd = (ex->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) ? Xrcd::from(ex->xrcd) : nullptr;
  Cq* cq = (ex->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ? Cq::from(ex->cq) : nullptr;
  if ((ex->comp_mask & kNeed) != kNeed || !pd || !xrcd || !cq || pd->ctx != ctx ||
      xrcd->ctx != ctx || cq->ctx != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_srq* s = create_srq_from_ex(pd, ex);
  if (!s) return nullptr;
  Srq* srq = Srq::from(s);
  // Everything a responder reads is set before the number makes it findable.
  srq->xrc_domain = xrcd->domain;
  srq->xrcd = xrcd;
  srq->xrc_cq = cq;
  srq->srq_num = add_xrc_srq(srq);
  if (!srq->srq_num) {
    destroy_srq(srq);
    errno = ENOMEM;
    return nullptr;
  }
  xrcd->users++;
  cq->users++;
  stat::publish(srq);  // again, with its number
  // What ibv_srq shows of an XRC SRQ (verbs.h: srq_type, xrcd, cq in verbs_srq are the
  // provider's business; the application sees the number through ibv_get_srq_num).
  return s;
}

void forget_xrc_srq(Srq* srq) {
  if (!srq->srq_num) return;
  remove_xrc_srq(srq->srq_num);  // waits for every responder using it
  srq->xrcd->users--;
  srq->xrc_cq->users--;
  srq->srq_num = 0;
}

int get_srq_num(Srq* srq, uint32_t* num) {
  if (!srq->srq_num || !num) return EINVAL;
  *num = srq->srq_num;
  return 0;
}

// ---- TGT QPs ----------------------------------------------------------------------------

ibv_qp* create_xrc_tgt_qp(Context* ctx, ibv_qp_init_attr_ex* ex) {
  Xrcd* xrcd = (ex->comp_mask & IBV_QP_INIT_ATTR_XRCD) ? Xrcd::from(ex->xrcd) : nullptr;
  if (!xrcd || xrcd->ctx != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  if (!ensure_tgt_resources(ctx)) return nullptr;
  ibv_qp_init_attr attr{};
  attr.qp_context = ex->qp_context;
  attr.send_cq = ctx->xrc_cq->cq();
  attr.recv_cq = ctx->xrc_cq->cq();
  attr.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* q = create_qp(ctx->xrc_pd, &attr);
  if (!q) return nullptr;
  Qp* qp = Qp::from(q);
  qp->xrcd = xrcd;
  qp->xrc_domain = xrcd->domain;
  xrcd->users++;
  ensure_handover_at_exit();
  // A TGT QP has no PD, CQs, SRQ or work queues of its own (what ibv_query_qp shows).
  q->pd = nullptr;
  q->send_cq = q->recv_cq = nullptr;
  qp->cap = {};
  ex->cap = {};
  return q;
}

namespace {

// This process's handles on TGT QPs of other processes, by QP number (events find them).
std::mutex g_remote_mu;
std::multimap<uint32_t, Qp*>& g_remote_handles = *new std::multimap<uint32_t, Qp*>;  // immortal
// Handles destroyed while being counted again at a new host (Qp::xrc_rejoining), by QP
// number: their closes, sent once the rejoin is done (creator_died).
std::map<uint32_t, int>& g_rejoin_closes = *new std::map<uint32_t, int>;
// This process is ending: it adopts nothing more (its own hand-over may be under way).
std::atomic<bool> g_exiting{false};

// ---- the agent's side: other processes' handles on our TGT QPs -------------------------

// Our TGT QP `qpn`, if process `pid` holds a handle on it (or, `opening`, may take one).
wire::QpRef tgt_for(uint32_t qpn, pid_t pid, bool opening) {
  wire::QpRef ref = wire::find_local(qpn);
  Qp* t = ref.get();
  if (!t || t->type != IBV_QPT_XRC_RECV || t->xrc_opened_from) return {};
  if (opening) return ref;
  std::lock_guard<std::mutex> lock(t->xrc_mu);
  for (const auto& o : t->xrc_remote_openers)
    if (o.first == pid) return ref;
  return {};
}

void process_died(pid_t pid);

int remote_open(uint32_t qpn, uint64_t dev, uint64_t ino, pid_t pid, int slot) {
  wire::QpRef ref = tgt_for(qpn, pid, true);
  Qp* t = ref.get();
  if (!t) return ENOENT;
  const XrcDomain* d = t->xrc_domain.get();
  // Only a domain shared through a file: (dev, ino) names it on this host.
  if (!d->shared || d->dev != static_cast<dev_t>(dev) || d->ino != static_cast<ino_t>(ino)) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    if (t->xrc_handles <= 0) return ENOENT;  // going away
    t->xrc_remote_openers.push_back({pid, slot});
    ++t->xrc_handles;
  }
  // If we are killed, a holder takes the slot over: newcomers leave it alone meanwhile.
  if (wire::slot_of_qpn(qpn) == wire::my_slot()) wire::set_my_slot_flag(wire::kSlotSharedTgt, true);
  engine::watch_pid(pid, process_died);  // its handles go with it (openers_died)
  return 0;
}

int remote_modify(uint32_t qpn, ibv_qp_attr* attr, int mask, pid_t pid) {
  wire::QpRef ref = tgt_for(qpn, pid, false);
  return ref ? modify_qp(ref.get(), attr, mask) : ENOENT;
}

int remote_query(uint32_t qpn, ibv_qp_attr* attr, pid_t pid) {
  wire::QpRef ref = tgt_for(qpn, pid, false);
  return ref ? query_qp(ref.get(), attr, 0, nullptr) : ENOENT;
}

int remote_close(uint32_t qpn, pid_t pid) {
  wire::QpRef ref = tgt_for(qpn, pid, false);
  Qp* t = ref.get();
  if (!t) return ENOENT;
  bool last;
  {
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    auto& v = t->xrc_remote_openers;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it->first == pid) {
        v.erase(it);
        break;
      }
    last = --t->xrc_handles == 0;
  }
  ref.reset();  // the destroy waits for every pinned reference
  // The creator's handle went before: the QP goes with its last handle. (No open can take
  // a handle now: they refuse a count of 0.)
  if (last) destroy_qp_now(t);
  return 0;
}

// At the progress thread: process `pid`, which held handles on our TGT QPs, died without
// destroying them (the kernel closes a dead process's handles). Its handles go; a QP whose
// last handle that was goes too.
void openers_died(pid_t pid) {
  std::vector<uint32_t> qpns;
  for_each_qp([&](Qp* t) {
    if (t->type != IBV_QPT_XRC_RECV || t->xrc_opened_from || t->xrc_remote_slot) return;
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    for (const auto& o : t->xrc_remote_openers)
      if (o.first == pid) {
        qpns.push_back(t->qpn());
        return;
      }
  });
  for (uint32_t qpn : qpns) {
    wire::QpRef ref = wire::find_local(qpn);
    Qp* t = ref.get();
    if (!t || t->type != IBV_QPT_XRC_RECV) continue;
    bool last;
    {
      std::lock_guard<std::mutex> lock(t->xrc_mu);
      auto& v = t->xrc_remote_openers;
      const auto gone = std::erase_if(v, [pid](const std::pair<pid_t, int>& o) { return o.first == pid; });
      if (gone == 0 || t->xrc_handles <= 0) continue;
      t->xrc_handles -= static_cast<int>(gone);
      last = t->xrc_handles == 0;
    }
    ref.reset();
    if (last) destroy_qp_now(t);
  }
}

// At an opener: process `pid`, which hosted TGT QPs we hold handles on, died. In the kernel
// the QP would live on (its holders keep it); here it ran in that process and went with it
// (docs/xrc.md). Our handles see what a QP that met a fatal error shows: ERR and
// IBV_EVENT_QP_FATAL, once; after that query answers ERR, modify ENXIO, destroy works.
bool rebuild_after_death(int slot, pid_t dead);  // below

void creator_died(pid_t pid) {
  const pid_t self = wire::self_pid();
  std::vector<pid_t> hosts;
  struct Failed {
    int slot;
    uint64_t dev, ino;
    int handles;
  };
  std::map<uint32_t, Failed> failed;  // by QP number
  {
    std::lock_guard<std::mutex> lock(g_remote_mu);
    for (auto& [qpn, h] : g_remote_handles) {
      if (h->xrc_remote_pid != pid || h->xrc_remote_dead.load()) continue;
      // It ended cleanly and handed its slot, this QP with it, to a holder (handover_at_exit,
      // done before it exited): that process hosts it now; nothing for the handle to see.
      // (Watched even if it died since: its death brings us back here for it.)
      const int slot = h->xrc_remote_slot;
      bool after_death;
      const pid_t adopter = wire::adopter_of(slot, &after_death);
      if (adopter > 0 && adopter != pid && !after_death) {
        h->xrc_remote_pid = adopter;
        hosts.push_back(adopter);
        continue;
      }
      Failed& f = failed[qpn];
      f = {slot, static_cast<uint64_t>(h->xrc_domain->dev), static_cast<uint64_t>(h->xrc_domain->ino),
           f.handles + 1};
    }
    // Killed: the first holder to get here takes the slot and builds the QPs again (only
    // while the entry still names the dead process; not in a process that is ending).
    std::set<int> slots;
    for (const auto& [qpn, f] : failed) slots.insert(f.slot);
    for (int slot : slots)
      if (!g_exiting.load() && wire::take_dead_slot(slot, pid)) rebuild_after_death(slot, pid);
    // Handles of QPs another holder took: counted there again next; a destroy meanwhile
    // holds its close back until then.
    for (auto& [qpn, h] : g_remote_handles)
      if (h->xrc_remote_pid == pid && !h->xrc_remote_dead.load() && failed.count(qpn))
        h->xrc_rejoining = true;
  }
  for (pid_t host : hosts)
    if (host != self) engine::watch_pid(host, process_died);
  if (failed.empty()) return;
  // Where each QP lives on: ours, or the taker's, where our handles count again (asked
  // outside the lock: the taker's agent may need its own while ours waits). A taker that
  // does not answer is followed all the same: if it died, its death brings us back.
  std::map<uint32_t, pid_t> lives;
  for (const auto& [qpn, f] : failed) {
    bool after_death;
    const pid_t host = wire::adopter_of(f.slot, &after_death);
    if (host <= 0 || !after_death || host == pid) continue;
    if (host == self) {
      if (wire::find_local(qpn)) lives[qpn] = host;
      continue;
    }
    const int err = wire::agent_xrc_rejoin(f.slot, qpn, f.dev, f.ino, f.handles);
    if (err == 0 || err == ENXIO) lives[qpn] = host;
  }
  std::map<uint32_t, int> closes;
  {
    // Every handle sees the QP fail; where it lives on, the handle stays its handle.
    std::lock_guard<std::mutex> lock(g_remote_mu);
    for (auto& [qpn, h] : g_remote_handles) {
      if (h->xrc_remote_pid != pid || h->xrc_remote_dead.load() || !failed.count(qpn)) continue;
      h->xrc_rejoining = false;
      auto it = lives.find(qpn);
      if (it != lives.end()) h->xrc_remote_pid = it->second;
      else h->xrc_remote_dead.store(true);
      h->state.store(IBV_QPS_ERR);  // (ibv_qp::state is the application's threads': query sets it)
      ibv_async_event ev{};
      ev.element.qp = h->qp();
      ev.event_type = IBV_EVENT_QP_FATAL;
      h->ctx->post_async(ev);
    }
    for (const auto& [qpn, f] : failed) {
      auto it = g_rejoin_closes.find(qpn);
      if (it == g_rejoin_closes.end()) continue;
      if (lives.count(qpn)) closes[qpn] = it->second;
      g_rejoin_closes.erase(it);
    }
  }
  // The closes of handles destroyed while they were being counted again.
  for (const auto& [qpn, n] : closes)
    for (int i = 0; i < n; ++i)
      wire::agent_xrc(failed[qpn].slot, wire::XrcOp::Close, qpn, 0, 0, nullptr, 0);
  for (const auto& [qpn, host] : lives)
    if (host != self) engine::watch_pid(host, process_died);
}

// The one hook of engine::watch_pid: a process that held our TGT QPs' handles, that
// hosted TGT QPs we hold handles on, or that was handing us its QPs, died.
void adoptions_died(pid_t pid);  // below

void process_died(pid_t pid) {
  openers_died(pid);
  adoptions_died(pid);  // first: a QP it was handing us goes before any is built again
  creator_died(pid);
}

// At an opener: an event of a TGT QP in `slot`'s process, for each of our handles on it.
void remote_event(uint32_t qpn, int type, int slot) {
  std::lock_guard<std::mutex> lock(g_remote_mu);
  auto [from, to] = g_remote_handles.equal_range(qpn);
  for (auto it = from; it != to; ++it) {
    Qp* h = it->second;
    if (h->xrc_remote_slot != slot) continue;
    ibv_async_event ev{};
    ev.element.qp = h->qp();
    ev.event_type = static_cast<ibv_event_type>(type);
    h->ctx->post_async(ev);
  }
}

// A TGT QP handle of this process, not yet counted anywhere.
Qp* new_tgt_handle(Context* ctx, Xrcd* xrcd, const ibv_qp_open_attr* attr) {
  auto* h = new (std::nothrow) Qp{};
  if (!h) {
    errno = ENOMEM;
    return nullptr;
  }
  h->ctx = ctx;
  h->type = IBV_QPT_XRC_RECV;
  h->xrcd = xrcd;
  h->xrc_domain = xrcd->domain;
  ibv_qp* q = h->qp();
  q->context = ctx->ibv();
  q->qp_context = attr->qp_context;
  q->qp_type = IBV_QPT_XRC_RECV;
  q->qp_num = attr->qp_num & 0xffffff;
  q->handle = q->qp_num;
  pthread_mutex_init(&q->mutex, nullptr);
  pthread_cond_init(&q->cond, nullptr);
  xrcd->users++;
  return h;
}

// ---- the hand-over: a TGT QP outlives the process that runs it ---------------------------
//
// In the kernel a TGT QP belongs to no process: it lives while any process holds a handle.
// Here it runs in a process (its responder, its agent address, its RoCE steering), so when
// that process ends with exit() while other processes hold handles, it hands the QP over
// to one of them first: that holder builds the QP again under the same number, in the
// state and with the attributes it had, and takes over the ending process's whole registry
// slot, whose agent address it serves from then on (docs/xrc.md). The handles, the INI QPs
// connected to it and the XRC SRQs it delivers to see nothing of the move. An abrupt end
// (a signal, _exit) runs no code: then the holders' handles see the QP fail (creator_died).

// Adopted slots (of processes that ended): the TGT QPs of each that run here, the process
// that handed them over, and whether it committed (until then it may die or abort, and
// what we built of it goes). Immortal: an agent thread may still ask after static
// destructors ran.
struct Adoption {
  int qps = 0;
  pid_t from = 0;
  bool committed = false;
};
std::mutex g_adopted_mu;
std::map<int, Adoption>& g_adopted = *new std::map<int, Adoption>;

// Alive and not a zombie (kill(2) finds a zombie alive; it can adopt nothing).
bool pid_alive(pid_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  char buf[1024];
  const char* p = proc_stat_after_name(pid, buf);  // no /proc: kill's answer
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

// A TGT QP this process runs (created here, or adopted and committed), not handed over yet.
bool runs_here(Qp* t) {
  if (t->type != IBV_QPT_XRC_RECV || t->xrc_opened_from || t->xrc_remote_slot || t->xrc_moved.load())
    return false;
  const int slot = wire::slot_of_qpn(t->qpn());
  if (slot == wire::my_slot()) return true;
  std::lock_guard<std::mutex> lock(g_adopted_mu);
  auto it = g_adopted.find(slot);
  return it != g_adopted.end() && it->second.committed;
}

// The modify calls that take a new QP from RESET to the state `a` describes.
int replay_state(Qp* t, const ibv_qp_attr& a) {
  ibv_qp_attr step = a;
  const int st = a.qp_state;
  if (st == IBV_QPS_RESET) return 0;
  if (st == IBV_QPS_ERR) {
    step.qp_state = IBV_QPS_ERR;
    return modify_qp(t, &step, IBV_QP_STATE);
  }
  if (st != IBV_QPS_INIT && st != IBV_QPS_RTR && st != IBV_QPS_RTS) return EINVAL;
  step.qp_state = IBV_QPS_INIT;
  if (int err = modify_qp(t, &step, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return err;
  if (st == IBV_QPS_INIT) return 0;
  step = a;
  step.qp_state = IBV_QPS_RTR;
  if (int err = modify_qp(t, &step, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                        IBV_QP_MIN_RNR_TIMER))
    return err;
  if (st == IBV_QPS_RTR) return 0;
  step = a;
  step.qp_state = IBV_QPS_RTS;
  return modify_qp(t, &step, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN);
}

// Takes a hosted TGT QP's count to 0 so that we destroy it: false when it was 0 already
// (whoever takes it to 0 destroys it: a holder's death may race us).
bool claim_all_handles(Qp* t) {
  std::lock_guard<std::mutex> lock(t->xrc_mu);
  if (t->xrc_handles <= 0) return false;
  t->xrc_handles = 0;
  return true;
}

// Destroys the TGT QPs of `slot` we adopted from `from` and never got committed.
void drop_uncommitted(int slot, pid_t from) {
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(slot);
    if (it == g_adopted.end() || it->second.committed || it->second.from != from) return;
  }
  std::vector<uint32_t> qpns;
  for_each_qp([&](Qp* t) {
    if (t->type == IBV_QPT_XRC_RECV && !t->xrc_opened_from && !t->xrc_remote_slot &&
        wire::slot_of_qpn(t->qpn()) == slot)
      qpns.push_back(t->qpn());
  });
  for (uint32_t qpn : qpns) {
    wire::QpRef ref = wire::find_local(qpn);
    Qp* t = ref.get();
    if (!t) continue;
    if (!claim_all_handles(t)) continue;
    ref.reset();
    destroy_qp_now(t);
  }
}

// A TGT QP of another process's slot, here under its number `qpn`, in RESET (`in_err`: in
// ERR), held by
// `holders` (one entry per handle), in the context `ctx` of one of our handles; counted in
// g_adopted (its `from` and `committed` are the caller's).
int build_hosted_tgt(Context* ctx, const std::shared_ptr<XrcDomain>& domain, uint32_t qpn,
                     const std::vector<std::pair<pid_t, int>>& holders, Qp** out,
                     bool in_err = false) {
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    if (!g_adopted.count(wire::slot_of_qpn(qpn))) return ENOENT;  // the caller's to make
  }
  if (!ensure_tgt_resources(ctx)) return ENOMEM;
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = ctx->xrc_cq->cq();
  init.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* q = create_qp(ctx->xrc_pd, &init, qpn);
  if (!q) return errno ? errno : ENOMEM;
  Qp* t = Qp::from(q);
  t->xrc_domain = domain;
  q->pd = nullptr;
  q->send_cq = q->recv_cq = nullptr;
  t->cap = {};
  // As a TGT QP whose creator's handle went: it holds the domain and its context.
  hold_xrcd_domain(domain);
  t->xrc_creator_gone = true;
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    ++ctx->hosted_tgt_qps;
  }
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    ++g_adopted[wire::slot_of_qpn(qpn)].qps;  // (its entry stays while this QP lives)
  }
  {
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    t->xrc_remote_openers = holders;
    t->xrc_handles = static_cast<int>(holders.size());
  }
  for (const auto& h : holders)
    if (h.first != wire::self_pid()) engine::watch_pid(h.first, process_died);
  if (in_err) {  // after a kill: the connection state went with the process
    ibv_qp_attr err{};
    err.qp_state = IBV_QPS_ERR;
    modify_qp(t, &err, IBV_QP_STATE);
  }
  *out = t;
  return 0;
}

// ---- after a kill ------------------------------------------------------------------------
//
// A process killed while others hold handles on its TGT QPs runs no code: nothing of the
// QPs' state survives it. The first holder to notice takes the dead process's slot
// (take_dead_slot; a process starting meanwhile may take it first: then the QPs are gone)
// and builds each QP it holds a handle on again under its number, in ERR; the other
// holders count their handles there again (rejoin, which builds a QP the taker held no
// handle on). Every handle sees IBV_EVENT_QP_FATAL, and stays a handle on a live QP: reset
// and connected anew it works again, under the same number. (The kernel's QP would go on
// as it was; its connection state died with the process here: docs/xrc.md.)

// Under g_remote_mu, having taken `slot` of the killed process `dead`: builds its QPs our
// handles name, in ERR, and serves the slot. False if nothing could be built.
bool rebuild_after_death(int slot, pid_t dead) {
  std::map<uint32_t, std::pair<Qp*, int>> ours;  // qpn → (one of our handles, how many)
  for (auto& [qpn, h] : g_remote_handles)
    if (h->xrc_remote_slot == slot && h->xrc_remote_pid == dead && !h->xrc_remote_dead.load()) {
      auto& o = ours[qpn];
      o.first = h;
      ++o.second;
    }
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    Adoption& a = g_adopted[slot];
    a.from = dead;
    a.committed = true;
  }
  std::vector<Qp*> built;
  for (const auto& [qpn, o] : ours) {
    const std::vector<std::pair<pid_t, int>> holders(static_cast<size_t>(o.second),
                                                     {wire::self_pid(), wire::my_slot()});
    Qp* t = nullptr;
    if (build_hosted_tgt(o.first->ctx, o.first->xrc_domain, qpn, holders, &t, true) != 0) continue;
    built.push_back(t);
  }
  if (!built.empty() && wire::serve_adopted_slot(slot)) {
    engine::roce_steering_changed();
    ensure_handover_at_exit();
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    g_adopted[slot].committed = false;  // the slot was never served: nothing to stop
  }
  for (Qp* t : built)
    if (claim_all_handles(t)) destroy_qp_now(t);
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(slot);
    if (it != g_adopted.end() && it->second.qps == 0) g_adopted.erase(it);
  }
  wire::release_adopted_slot(slot);
  return false;
}

// At the taker: process `pid` holds `handles` handles on `qpn` of the slot we took after a
// kill; the QP is built if we held none on it (in ERR, as ours were).
int rejoin(uint32_t qpn, uint64_t dev, uint64_t ino, pid_t pid, int slot, int handles) {
  if (g_exiting.load()) return EBUSY;
  const int qp_slot = wire::slot_of_qpn(qpn);
  if (handles <= 0 || handles > wire::kMaxXrcSnapshotHolders || qpn > 0xffffff ||
      !wire::hosted_by_me(qp_slot) || !wire::adopted_after_death(qp_slot))
    return EINVAL;
  {
    // Only while we serve the slot (its last QP gone, it is being let go).
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(qp_slot);
    if (it == g_adopted.end() || !it->second.committed) return ENOENT;
  }
  auto same_domain = [dev, ino](const std::shared_ptr<XrcDomain>& d) {
    return d && d->shared && d->dev == static_cast<dev_t>(dev) && d->ino == static_cast<ino_t>(ino);
  };
  std::vector<std::pair<pid_t, int>> mine(static_cast<size_t>(handles), {pid, slot});
  wire::QpRef ref = wire::find_local(qpn);
  if (!ref) {
    // Built in the context of one of our handles on the slot's QPs, which the lock keeps
    // from being destroyed (and its context closed) meanwhile.
    std::lock_guard<std::mutex> lock(g_remote_mu);
    Context* ctx = nullptr;
    std::shared_ptr<XrcDomain> domain;
    for (auto& [q, h] : g_remote_handles)
      if (wire::slot_of_qpn(q) == qp_slot && same_domain(h->xrc_domain)) {
        ctx = h->ctx;
        domain = h->xrc_domain;
        break;
      }
    if (!ctx) return ENOENT;
    Qp* t = nullptr;
    return build_hosted_tgt(ctx, domain, qpn, mine, &t, true);
  }
  Qp* t = ref.get();
  if (t->type != IBV_QPT_XRC_RECV || t->xrc_opened_from || t->xrc_remote_slot || !same_domain(t->xrc_domain))
    return EINVAL;
  {
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    if (t->xrc_handles <= 0) return ENOENT;  // going away
    // Added to what `pid` has here already (handles it opened since we took the QP).
    t->xrc_remote_openers.insert(t->xrc_remote_openers.end(), mine.begin(), mine.end());
    t->xrc_handles += handles;
  }
  engine::watch_pid(pid, process_died);
  return 0;
}

// At a holder: the ending process `from` hands us its TGT QP. Everything in `s` is its
// word: checked here, and the QP is built by the verbs an application would call.
int adopt(const wire::XrcSnapshot& s, pid_t from) {
  if (g_exiting.load()) return EBUSY;
  const uint32_t qpn = s.qpn;
  const int slot = wire::slot_of_qpn(qpn);
  if (s.magic != wire::kXrcSnapshotMagic || qpn > 0xffffff || slot <= 0 || slot >= wire::kSlots ||
      slot == wire::my_slot() || wire::slot_owner(slot) != from || s.nholders == 0 ||
      s.nholders > static_cast<uint32_t>(wire::kMaxXrcSnapshotHolders) ||
      s.natomic > static_cast<uint32_t>(wire::kMaxXrcSnapshotAtomics))
    return EINVAL;
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(slot);
    if (it != g_adopted.end() && (it->second.committed || it->second.from != from)) return EINVAL;
  }
  if (wire::find_local(qpn)) return EEXIST;
  // One of our handles on it names the context and the domain it runs in here.
  Context* ctx = nullptr;
  std::shared_ptr<XrcDomain> domain;
  {
    std::lock_guard<std::mutex> lock(g_remote_mu);
    auto [first, last] = g_remote_handles.equal_range(qpn);
    for (auto it = first; it != last; ++it)
      if (it->second->xrc_remote_slot == slot) {
        ctx = it->second->ctx;
        domain = it->second->xrc_domain;
        break;
      }
  }
  if (!ctx || !domain || !domain->shared || domain->dev != static_cast<dev_t>(s.dev) ||
      domain->ino != static_cast<ino_t>(s.ino))
    return EINVAL;
  // Each holder is a live process in the slot it names (a garbage entry would keep the QP
  // forever).
  std::vector<std::pair<pid_t, int>> holders;
  for (uint32_t i = 0; i < s.nholders; ++i) {
    const auto& h = s.holders[i];
    if (h.slot > 0 && h.slot < wire::kSlots && h.pid > 0 && wire::slot_owner(h.slot) == h.pid &&
        pid_alive(h.pid))
      holders.push_back({h.pid, h.slot});
  }
  if (holders.empty()) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    g_adopted[slot].from = from;
  }
  Qp* t = nullptr;
  if (int err = build_hosted_tgt(ctx, domain, qpn, holders, &t)) return err;
  // On the wire, the connection goes on where the ending process's responder was.
  ibv_qp_attr attr = s.attr;
  if (s.has_link) attr.rq_psn = s.epsn & 0xffffff;
  if (int err = replay_state(t, attr)) {
    destroy_qp_now(t);
    return err;
  }
  engine::RoceResume resume;
  resume.has_link = s.has_link != 0;
  resume.responder.epsn = s.epsn;
  resume.responder.msn = s.msn;
  resume.responder.comm_est_raised = s.comm_est != 0;
  for (uint32_t i = 0; i < s.natomic; ++i)
    resume.responder.atomic_replies.push_back({s.atomics[i].psn, s.atomics[i].orig});
  engine::roce_resume(t, resume);
  if (s.comm_est) {
    std::lock_guard<QueueMutex> lock(t->rq_mu);
    t->comm_est_raised = true;
  }
  engine::watch_pid(from, process_died);  // dead before its commit: what we built goes
  ensure_handover_at_exit();  // and on again, if we end before its last handle goes
  return 0;
}

// At a holder: the ending process stopped serving `slot`'s agent address and adopted all
// of the slot's QPs it hands over to us: we serve the address and take the slot.
int commit(int slot, pid_t from) {
  if (g_exiting.load()) return EBUSY;
  if (slot <= 0 || slot >= wire::kSlots || slot == wire::my_slot()) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(slot);
    if (it == g_adopted.end() || it->second.from != from || it->second.committed) return ENOENT;
  }
  if (!wire::serve_adopted_slot(slot)) return EADDRINUSE;
  if (!wire::take_slot(slot, from)) {
    wire::stop_serving_slot(slot, true, false);
    return EPERM;
  }
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    g_adopted[slot].committed = true;
  }
  engine::roce_steering_changed();  // datagrams for the slot come here now
  return 0;
}

// At a holder: one of the slot's QPs could not be adopted: nothing of the slot moves.
int abort_adoption(int slot, pid_t from) {
  drop_uncommitted(slot, from);
  return 0;
}

// At a holder (the progress thread): a process that was handing us QPs died before its
// commit.
void adoptions_died(pid_t pid) {
  std::vector<int> slots;
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    for (const auto& [slot, a] : g_adopted)
      if (a.from == pid && !a.committed) slots.push_back(slot);
  }
  for (int slot : slots) drop_uncommitted(slot, pid);
}

std::atomic<pid_t> g_handover_registered{0};
std::atomic<pid_t> g_handover_done{0};

// Does any TGT QP we run have a live holder in another process?
bool held_elsewhere(pid_t self) {
  bool held = false;
  for_each_qp([&](Qp* t) {
    if (held || !runs_here(t)) return;
    std::lock_guard<std::mutex> lock(t->xrc_mu);
    for (const auto& o : t->xrc_remote_openers)
      held |= o.first != self && pid_alive(o.first);
  });
  return held;
}

// As the process ends (a library destructor: after the program's own atexit handlers and
// static destructors, so its teardown still reaches everything): hands each TGT QP we run
// that a live process elsewhere holds a handle on to such a process. All of a slot's QPs go
// to one process, which holds a handle on each (the one with the most handles), because
// the slot is what other processes and the RoCE port resolve a QP number by; when no
// holder can take all of them, or one adoption fails, none moves (the holders' handles
// then see the QPs fail, as after a kill).
void handover_at_exit() {
  g_exiting.store(true);
  const pid_t self = wire::self_pid();
  // Only in a process that runs TGT QPs (not in a forked child, which has copies of them).
  if (g_handover_registered.load() != self || g_handover_done.exchange(self) == self) return;
  if (!held_elsewhere(self)) return;
  // Nothing changes them from now on (no open, close or modify from other processes):
  // what we read next is their last state. Requests meanwhile find no one at the address
  // and are retried.
  if (!wire::stop_agent()) return;
  {
    std::vector<int> adopted;
    {
      std::lock_guard<std::mutex> lock(g_adopted_mu);
      for (const auto& [slot, a] : g_adopted)
        if (a.committed) adopted.push_back(slot);
    }
    for (int slot : adopted) wire::stop_serving_slot(slot, true, false);
  }
  struct Moving {
    Qp* qp;
    std::vector<std::pair<pid_t, int>> holders;
  };
  std::map<int, std::vector<Moving>> by_slot;
  std::vector<uint32_t> qpns;
  for_each_qp([&](Qp* t) {
    if (runs_here(t)) qpns.push_back(t->qpn());
  });
  for (uint32_t qpn : qpns) {
    wire::QpRef ref = wire::find_local(qpn);
    Qp* t = ref.get();
    if (!t) continue;
    std::vector<std::pair<pid_t, int>> holders;
    {
      std::lock_guard<std::mutex> lock(t->xrc_mu);
      if (t->xrc_handles <= 0) continue;  // going away
      for (const auto& o : t->xrc_remote_openers)
        if (o.first != self && pid_alive(o.first)) holders.push_back(o);
      if (holders.empty() || holders.size() > static_cast<size_t>(wire::kMaxXrcSnapshotHolders))
        continue;
      ++t->xrc_handles;  // ours now: no destroy (a holder's death, the program) frees it
    }
    by_slot[wire::slot_of_qpn(qpn)].push_back({t, std::move(holders)});
  }
  for (auto& [slot, moving] : by_slot) {
    // The adopter: a process with a handle on each of the slot's QPs, the most handles.
    std::map<pid_t, std::pair<int, int>> votes;  // pid → (its slot, handles)
    std::map<pid_t, size_t> covers;              // pid → QPs it holds
    for (const Moving& m : moving) {
      std::set<pid_t> seen;
      for (const auto& [pid, pid_slot] : m.holders) {
        votes[pid].first = pid_slot;
        ++votes[pid].second;
        if (seen.insert(pid).second) ++covers[pid];
      }
    }
    pid_t host = 0;
    int host_slot = 0, most = 0;
    for (const auto& [pid, v] : votes)
      if (covers[pid] == moving.size() && v.second > most) {
        host = pid;
        host_slot = v.first;
        most = v.second;
      }
    if (!host) continue;
    bool adopted_all = true;
    for (const Moving& m : moving) {
      Qp* t = m.qp;
      // Nothing reaches it here any more (the port's thread finds no QP), and its RoCE
      // responder's place in the connection is final.
      wire::unregister_qp(t->qpn());
      engine::RoceResume resume;
      engine::roce_destroy(t, &resume);
      auto snap = std::make_unique<wire::XrcSnapshot>();
      snap->magic = wire::kXrcSnapshotMagic;
      snap->qpn = t->qpn();
      snap->dev = static_cast<uint64_t>(t->xrc_domain->dev);
      snap->ino = static_cast<uint64_t>(t->xrc_domain->ino);
      if (query_qp(t, &snap->attr, 0, nullptr) != 0) {
        adopted_all = false;
        break;
      }
      {
        std::lock_guard<QueueMutex> lock(t->rq_mu);
        snap->comm_est = t->comm_est_raised || resume.responder.comm_est_raised ? 1 : 0;
      }
      snap->nholders = static_cast<uint32_t>(m.holders.size());
      for (size_t i = 0; i < m.holders.size(); ++i)
        snap->holders[i] = {m.holders[i].first, m.holders[i].second};
      snap->has_link = resume.has_link ? 1 : 0;
      snap->epsn = resume.responder.epsn;
      snap->msn = resume.responder.msn;
      const auto& atomics = resume.responder.atomic_replies;
      snap->natomic = static_cast<uint32_t>(std::min<size_t>(atomics.size(), wire::kMaxXrcSnapshotAtomics));
      for (uint32_t i = 0; i < snap->natomic; ++i) snap->atomics[i] = {atomics[i].first, 0, atomics[i].second};
      if (wire::agent_xrc_adopt(host_slot, snap.get()) != 0) {
        adopted_all = false;
        break;
      }
    }
    if (!adopted_all || wire::agent_xrc_commit(host_slot, slot) != 0) {
      wire::agent_xrc_commit(host_slot, slot, true);  // abort: what it built of the slot goes
      continue;
    }
    for (const Moving& m : moving) m.qp->xrc_moved.store(true);
    if (slot == wire::my_slot()) engine::roce_slot_handed_over();
  }
}

__attribute__((destructor)) void handover_at_library_end() { handover_at_exit(); }

}  // namespace

void ensure_handover_at_exit() { g_handover_registered.store(wire::self_pid()); }

void adopted_qp_gone(int slot) {
  if (slot == wire::my_slot()) return;
  {
    std::lock_guard<std::mutex> lock(g_adopted_mu);
    auto it = g_adopted.find(slot);
    if (it == g_adopted.end() || --it->second.qps > 0) return;
    const bool committed = it->second.committed;
    g_adopted.erase(it);
    if (!committed) return;
  }
  // Its last TGT QP here went: the slot is free for the next process to start, once the
  // thread serving its address has let the address go.
  wire::stop_serving_slot(slot, false, true);
}

void install_xrc_hooks() {
  wire::XrcHooks h;
  h.open = &remote_open;
  h.modify = &remote_modify;
  h.query = &remote_query;
  h.close = &remote_close;
  h.event = &remote_event;
  h.adopt = &adopt;
  h.commit = &commit;
  h.abort = &abort_adoption;
  h.rejoin = &rejoin;
  wire::set_xrc_hooks(h);
  // Our XRC SRQs take messages of other processes' TGT QPs of the domain.
  wire::start_xrc_delivery();
}

// ibv_open_qp of a TGT QP another process of the domain created: its agent counts our
// handle, and modify, query, destroy and events go through it.
ibv_qp* open_remote_tgt(Context* ctx, Xrcd* xrcd, ibv_qp_open_attr* attr) {
  const uint32_t qpn = attr->qp_num & 0xffffff;
  const int slot = wire::slot_of_qpn(qpn);
  const XrcDomain* d = xrcd->domain.get();
  if (!d->shared || slot <= 0 || wire::slot_owner(slot) <= 0) {
    errno = d->shared ? ENOENT : EINVAL;
    return nullptr;
  }
  // The process that hosts it, as it was before the open: a slot that changed hands
  // meanwhile (its process died, a newcomer took it) answered for a QP that is gone.
  const pid_t host = wire::slot_owner(slot);
  if (int err = wire::agent_xrc(slot, wire::XrcOp::Open, qpn, d->dev, d->ino, nullptr, 0)) {
    errno = err == ENXIO ? ENOENT : err;
    return nullptr;
  }
  if (host <= 0 || wire::slot_owner(slot) != host) {
    wire::agent_xrc(slot, wire::XrcOp::Close, qpn, 0, 0, nullptr, 0);
    errno = ENOENT;
    return nullptr;
  }
  Qp* h = new_tgt_handle(ctx, xrcd, attr);
  if (!h) {
    wire::agent_xrc(slot, wire::XrcOp::Close, qpn, 0, 0, nullptr, 0);
    return nullptr;
  }
  h->xrc_remote_slot = slot;
  h->xrc_remote_pid = host;
  ibv_qp_attr a{};
  if (wire::agent_xrc(slot, wire::XrcOp::Query, qpn, 0, 0, &a, 0) == 0) h->qp()->state = a.qp_state;
  {
    std::lock_guard<std::mutex> lock(g_remote_mu);
    g_remote_handles.insert({qpn, h});
  }
  // Its death takes the QP: our handle then shows a fatal error (creator_died).
  if (h->xrc_remote_pid > 0 && h->xrc_remote_pid != wire::self_pid())
    engine::watch_pid(h->xrc_remote_pid, process_died);
  return h->qp();
}

int modify_remote_tgt(Qp* h, ibv_qp_attr* attr, int mask) {
  if (h->xrc_remote_dead.load()) return ENXIO;  // the QP went with its process
  int err = wire::agent_xrc(h->xrc_remote_slot, wire::XrcOp::Modify, h->qpn(), 0, 0, attr, mask);
  if (!err && (mask & IBV_QP_STATE)) h->qp()->state = attr->qp_state;
  return err;
}

int query_remote_tgt(Qp* h, ibv_qp_attr* attr, ibv_qp_init_attr* init) {
  int err = 0;
  if (h->xrc_remote_dead.load()) {
    *attr = {};  // the QP went with its process: what is left to say is that it failed
    attr->qp_state = attr->cur_qp_state = IBV_QPS_ERR;
  } else {
    err = wire::agent_xrc(h->xrc_remote_slot, wire::XrcOp::Query, h->qpn(), 0, 0, attr, 0);
  }
  if (err) return err;
  h->qp()->state = attr->qp_state;
  if (init) {
    std::memset(init, 0, sizeof(*init));
    init->qp_context = h->qp()->qp_context;
    init->qp_type = IBV_QPT_XRC_RECV;
  }
  return 0;
}

void destroy_remote_tgt(Qp* h) {
  bool rejoining;
  {
    std::lock_guard<std::mutex> lock(g_remote_mu);
    auto [from, to] = g_remote_handles.equal_range(h->qpn());
    for (auto it = from; it != to; ++it)
      if (it->second == h) {
        g_remote_handles.erase(it);
        break;
      }
    // Being counted again at the QP's new host: the close goes once that is done.
    rejoining = h->xrc_rejoining;
    if (rejoining) ++g_rejoin_closes[h->qpn()];
  }
  // The TGT QP's process may be gone: then there is nothing left to release.
  if (!rejoining && !h->xrc_remote_dead.load())
    wire::agent_xrc(h->xrc_remote_slot, wire::XrcOp::Close, h->qpn(), 0, 0, nullptr, 0);
  free_opened_handle(h);
}

ibv_qp* open_xrc_qp(Context* ctx, ibv_qp_open_attr* attr) {
  constexpr uint32_t kNeed = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (!attr || (attr->comp_mask & kNeed) != kNeed ||
      (attr->comp_mask & ~uint32_t(IBV_QP_OPEN_ATTR_RESERVED - 1))) {
    errno = EINVAL;
    return nullptr;
  }
  Xrcd* xrcd = Xrcd::from(attr->xrcd);
  if (!xrcd || xrcd->ctx != ctx || attr->qp_type != IBV_QPT_XRC_RECV) {
    errno = EINVAL;
    return nullptr;
  }
  if (wire::slot_of_qpn(attr->qp_num & 0xffffff) != wire::my_slot())
    return open_remote_tgt(ctx, xrcd, attr);
  wire::QpRef ref = wire::find_local(attr->qp_num & 0xffffff);
  Qp* tgt = ref.get();
  // Only a TGT QP of this domain.
  if (!tgt || tgt->type != IBV_QPT_XRC_RECV || tgt->xrc_opened_from ||
      tgt->xrc_domain != xrcd->domain) {
    errno = tgt && tgt->type == IBV_QPT_XRC_RECV ? EINVAL : ENOENT;
    return nullptr;
  }
  Qp* h = new_tgt_handle(ctx, xrcd, attr);
  if (!h) return nullptr;
  h->pd = tgt->pd;
  h->send_cq = tgt->send_cq;
  h->recv_cq = tgt->recv_cq;
  h->xrc_opened_from = tgt;
  h->qp()->state = static_cast<ibv_qp_state>(tgt->state.load());
  {
    std::lock_guard<std::mutex> lock(tgt->xrc_mu);
    if (tgt->xrc_handles > 0) {
      tgt->xrc_openers.push_back(h);
      ++tgt->xrc_handles;
      return h->qp();
    }
  }
  free_opened_handle(h);  // its last handle went meanwhile: the QP is going away
  errno = ENOENT;
  return nullptr;
}

// Destroying one handle of a TGT QP: true when the QP itself must go now (its last).
bool release_tgt_handle(Qp* handle) {
  Qp* tgt = handle->xrc_opened_from ? handle->xrc_opened_from : handle;
  std::unique_lock<std::mutex> lock(tgt->xrc_mu);
  // Handles of processes that died without destroying them do not keep the QP.
  auto& remote = tgt->xrc_remote_openers;
  for (auto it = remote.begin(); it != remote.end();) {
    if (kill(it->first, 0) != 0 && errno == ESRCH) {
      it = remote.erase(it);
      --tgt->xrc_handles;
    } else {
      ++it;
    }
  }
  if (handle == tgt && !tgt->xrc_creator_gone && tgt->xrc_handles > 1) {
    tgt->xrc_creator_gone = true;
    lock.unlock();
    // Its events not yet handed out vanish, as for any destroyed QP, and those handed out
    // are acked first; our count still keeps the QP while we wait.
    drop_async_events_of(tgt->ctx, EventElement::Qp, tgt->qp());
    ibv_qp* q = tgt->qp();
    wait_acked(&q->mutex, &q->cond, &q->events_completed, &tgt->events_reported);
    // The creator holds no handle now: its Xrcd may close (ibv_close_xrcd is EBUSY only
    // while the process holds handles), the domain stays while the QP lives (held before
    // the Xrcd lets go, so that it is never unlisted between), and so does the context
    // it runs in, past ibv_close_device (tgt_qp_destroyed).
    hold_xrcd_domain(tgt->xrc_domain);
    if (tgt->xrcd) tgt->xrcd->users--;
    tgt->xrcd = nullptr;
    {
      std::lock_guard<std::mutex> objects(tgt->ctx->objects_mu);
      ++tgt->ctx->hosted_tgt_qps;
    }
    lock.lock();
  }
  if (handle != tgt) {
    auto& v = tgt->xrc_openers;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (*it == handle) {
        v.erase(it);
        break;
      }
  }
  return --tgt->xrc_handles == 0;
}

void free_opened_handle(Qp* h) {
  ibv_qp* q = h->qp();
  drop_async_events_of(h->ctx, EventElement::Qp, q);
  wait_acked(&q->mutex, &q->cond, &q->events_completed, &h->events_reported);
  h->xrcd->users--;
  pthread_mutex_destroy(&q->mutex);
  pthread_cond_destroy(&q->cond);
  h->magic = kDead;
  delete h;
}

void tgt_qp_destroyed(Context* ctx, const std::shared_ptr<XrcDomain>& domain, uint32_t qpn) {
  close_xrcd_domain(domain);
  adopted_qp_gone(wire::slot_of_qpn(qpn));
  bool last;
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    last = --ctx->hosted_tgt_qps == 0 && ctx->closed;
  }
  if (last) free_closed_context(ctx);
}

void free_tgt_resources(Context* ctx) {
  if (ctx->xrc_cq) destroy_cq(ctx->xrc_cq);
  if (ctx->xrc_pd) dealloc_pd(ctx->xrc_pd);
  ctx->xrc_cq = nullptr;
  ctx->xrc_pd = nullptr;
}

}  // namespace softverbs
