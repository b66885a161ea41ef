// Writes this process's stat segment (common/stat_segment.hpp): one record per verbs
// object, rewritten at create/modify/destroy under one mutex. The data path never comes
// here. The file is made on the first object, removed at exit; segments of processes
// that died without exiting are removed by the next process that makes one.
#include "verbs/stat_publish.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <pthread.h>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/stat_segment.hpp"
#include "common/state_dir.hpp"
#include "engine/roce.hpp"

namespace softverbs::stat {

static_assert(sizeof(std::atomic<const wire::WindowSlot*>) == 8);
static_assert(int(kArmNone) == int(wire::kArmNone) && int(kArmSolicited) == int(wire::kArmSolicited) &&
              int(kArmNext) == int(wire::kArmNext));

namespace {

std::mutex g_mu;
Header* g_seg = nullptr;
pid_t g_seg_pid = 0;    // the process g_seg (or the failure to make it) belongs to
std::string* g_path = new std::string;  // immortal: the exit handler uses them
auto* g_slots = new std::unordered_map<const void*, uint32_t>;
auto* g_free = new std::vector<uint32_t>;

// A fork while another thread held g_mu would leave it locked for good in the child, whose
// first create would then hang: hold it across fork so the child's copy starts unlocked.
const int g_fork_handlers = pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                                           [] { g_mu.unlock(); });

Record* records(Header* h) {
  return reinterpret_cast<Record*>(reinterpret_cast<char*>(h) + sizeof(Header));
}

// Field 22 of /proc/self/stat (start time in clock ticks): with the pid it names a process.
uint64_t own_start_time() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = line.c_str() + close + 1;
  for (int field = 3; field < 22 && *p; ++field) {  // field 3 (state) starts after ") "
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

void remove_dead_segments(const std::string& dir, pid_t self) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end || pid == self) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

void unlink_at_exit() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_seg && g_seg_pid == getpid()) unlink(g_path->c_str());  // not a forked child's
}

Header* make_segment(pid_t self) {
  static const bool off = [] {
    const char* v = std::getenv("SOFTVERBS_STAT");
    return v && std::strcmp(v, "0") == 0;
  }();
  if (off) return nullptr;
  std::string dir = state_dir();
  mkdir(dir.c_str(), 0700);
  dir += "/stat";
  mkdir(dir.c_str(), 0700);
  remove_dead_segments(dir, self);
  std::string path = dir + "/" + std::to_string(self);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  void* p = ftruncate(fd, segment_size()) == 0
                ? mmap(nullptr, segment_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    unlink(path.c_str());
    return nullptr;
  }
  auto* h = static_cast<Header*>(p);
  h->version = kVersion;
  h->header_size = sizeof(Header);
  h->record_size = sizeof(Record);
  h->record_count = kMaxRecords;
  h->pid = self;
  h->start_time = own_start_time();
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  std::snprintf(h->exe, sizeof(h->exe), "%s", name.c_str());
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  *g_path = path;
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(unlink_at_exit); });
  return h;
}

// This process's segment (under g_mu); a forked child makes its own, leaving its parent's.
Header* segment_locked() {
  pid_t self = getpid();
  if (g_seg_pid == self) return g_seg;
  if (g_seg) munmap(g_seg, segment_size());
  g_slots->clear();
  g_free->clear();
  g_seg_pid = self;
  g_seg = make_segment(self);
  return g_seg;
}

Record* record_for(Header* h, const void* object) {
  if (auto it = g_slots->find(object); it != g_slots->end()) return &records(h)[it->second];
  uint32_t index;
  if (!g_free->empty()) {
    index = g_free->back();
    g_free->pop_back();
  } else {
    std::atomic_ref<uint32_t> used(h->used);
    index = used.load(std::memory_order_relaxed);
    if (index >= kMaxRecords) {
      std::atomic_ref<uint32_t>(h->dropped).fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    used.store(index + 1, std::memory_order_release);
  }
  (*g_slots)[object] = index;
  return &records(h)[index];
}

// Seqlock write: the reader takes a copy only when seq was even and unchanged around it.
void store(Record* r, const Record& body) {
  std::atomic_ref<uint32_t> seq_word(r->seq);
  uint32_t seq = seq_word.load(std::memory_order_relaxed);
  seq_word.store(seq | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  constexpr size_t kBody = offsetof(Record, kind);
  std::memcpy(reinterpret_cast<char*>(r) + kBody, reinterpret_cast<const char*>(&body) + kBody,
              sizeof(Record) - kBody);
  seq_word.store((seq | 1) + 1, std::memory_order_release);
}

// The record of `object` (`size` bytes, its tag at `magic_offset` reading `magic`), with
// what `fill` adds.
template <typename Fill>
void write_raw(const void* object, uint32_t size, uint32_t magic_offset, uint32_t magic, Kind kind,
               Fill&& fill) {
  Record body{};
  body.kind = kind;
  body.object = reinterpret_cast<uintptr_t>(object);
  body.object_size = size;
  body.magic_offset = magic_offset;
  body.magic = magic;
  fill(body);
  std::lock_guard<std::mutex> lock(g_mu);
  Header* h = segment_locked();
  if (!h) return;
  if (Record* r = record_for(h, object)) store(r, body);
}

template <typename Object, typename Fill>
void write(Object* object, Kind kind, uint32_t magic, Fill&& fill) {
  write_raw(object, sizeof(Object),
            static_cast<uint32_t>(reinterpret_cast<const char*>(&object->magic) -
                                  reinterpret_cast<const char*>(object)),
            magic, kind, std::forward<Fill>(fill));
}

uint32_t offset(const void* object, const void* field) {
  return static_cast<uint32_t>(static_cast<const char*>(field) - static_cast<const char*>(object));
}

uint64_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

void publish(Context* ctx) {
  write(ctx, kContext, kCtxMagic, [ctx](Record& r) {
    r.handle = r.context = address(ctx->ibv());
    const ibv_device* dev = ctx->ibv()->device;
    if (dev) std::snprintf(r.u.ctx.device, sizeof(r.u.ctx.device), "%s", dev->name);
    r.u.ctx.async_fd = ctx->async_queue.fd();
    r.u.ctx.async_level_fd = ctx->async_queue.level_fd();
    r.u.ctx.async_wake_fd = ctx->async_queue.wake_fd();
    r.hot[kCtxAsyncQueue] = offset(ctx, ctx->async_queue.items_address());
    r.elem_size = static_cast<uint32_t>(ctx->async_queue.item_size());
  });
}

void publish(Pd* pd) {
  write(pd, kPd, kPdMagic, [pd](Record& r) {
    r.handle = address(&pd->ibv);
    r.context = address(pd->ibv.context);
    r.u.pd.handle = pd->ibv.handle;
    r.u.pd.parent_domain = pd->parent != nullptr;
    r.u.pd.protection = address(&pd->prot->ibv);
    r.u.pd.imported = pd->imported;
  });
}

void publish(Mr* mr) {
  write(mr, kMr, kMrMagic, [mr](Record& r) {
    r.handle = address(&mr->ibv);
    r.context = address(mr->ibv.context);
    r.u.mr.pd = address(mr->ibv.pd);
    r.u.mr.addr = address(mr->ibv.addr);
    r.u.mr.length = mr->length;
    r.u.mr.iova = mr->iova;
    r.u.mr.lkey = mr->ibv.lkey;
    r.u.mr.rkey = mr->ibv.rkey;
    r.u.mr.access = mr->access;
    r.u.mr.imported = mr->imported;
  });
}

void publish(Cq* cq) {
  write(cq, kCq, kCqMagic, [cq](Record& r) {
    ibv_cq* c = cq->cq();
    r.handle = address(c);
    r.context = address(c->context);
    r.u.cq.channel = address(c->channel);
    r.hot[kCqHead] = offset(cq, &cq->head);
    r.hot[kCqTail] = offset(cq, &cq->tail);
    r.hot[kCqArmed] = offset(cq, &cq->armed);
    r.hot[kCqCompReported] = offset(cq, &cq->comp_events_reported);
    r.hot[kCqCompAcked] = offset(cq, &c->comp_events_completed);
    r.hot[kCqCapacity] = offset(cq, &cq->capacity);
    r.hot[kCqInError] = offset(cq, &cq->in_error);
    r.hot[kCqAsyncReported] = offset(cq, &cq->async_events_reported);
    r.hot[kCqAsyncAcked] = offset(cq, &c->async_events_completed);
  });
}

void publish(CompChannel* ch) {
  write(ch, kChannel, kChanMagic, [ch](Record& r) {
    r.handle = address(&ch->ibv);
    r.context = address(ch->ibv.context);
    r.u.chan.fd = ch->events.fd();
    r.u.chan.level_fd = ch->events.level_fd();
    r.u.chan.wake_fd = ch->events.wake_fd();
    r.hot[kChanQueue] = offset(ch, ch->events.items_address());
    r.elem_size = static_cast<uint32_t>(ch->events.item_size());
  });
}

void publish(Qp* qp) {
  ibv_qp_attr attr;
  pid_t peer;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    attr = qp->attr;
    peer = qp->peer_pid;
  }
  write(qp, kQp, kQpMagic, [&](Record& r) {
    ibv_qp* q = qp->qp();
    r.handle = address(q);
    r.context = address(q->context);
    QpInfo& i = r.u.qp;
    i.pd = address(q->pd);
    i.send_cq = address(q->send_cq);
    i.recv_cq = address(q->recv_cq);
    i.srq = address(q->srq);
    i.qp_num = qp->qpn();
    i.type = qp->type;
    i.port = attr.port_num;
    i.sq_psn = attr.sq_psn;
    i.rq_psn = attr.rq_psn;
    i.dest_qp_num = attr.dest_qp_num;
    std::memcpy(i.dgid, attr.ah_attr.grh.dgid.raw, sizeof(i.dgid));
    i.peer_pid = peer;
    i.max_send_wr = qp->cap.max_send_wr;
    i.max_recv_wr = qp->cap.max_recv_wr;
    i.max_send_sge = qp->cap.max_send_sge;
    i.max_recv_sge = qp->cap.max_recv_sge;
    i.max_inline_data = qp->cap.max_inline_data;
    i.qkey = attr.qkey;
    i.access = attr.qp_access_flags;
    i.path_mtu = static_cast<uint8_t>(attr.path_mtu);
    i.timeout = attr.timeout;
    i.retry_cnt = attr.retry_cnt;
    i.rnr_retry = attr.rnr_retry;
    i.min_rnr_timer = attr.min_rnr_timer;
    i.max_rd_atomic = attr.max_rd_atomic;
    i.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    i.sq_sig_all = qp->sq_sig_all;
    r.hot[kQpState] = offset(qp, &qp->state);
    r.hot[kQpSendQueue] = offset(qp, &qp->sq);
    r.elem_size = sizeof(SendWqe);
    r.hot[kQpRecvHead] = offset(qp, qp->rq.head_address());
    r.hot[kQpRecvTail] = offset(qp, qp->rq.tail_address());
    r.hot[kQpEventsReported] = offset(qp, &qp->events_reported);
    r.hot[kQpEventsAcked] = offset(qp, &q->events_completed);
    r.hot[kQpWindowSlots] = offset(qp, &qp->window_slots);
    r.hot[kQpWindowHead] = offset(qp, &qp->inbound.head);
    r.hot[kQpPeerWindow] = offset(qp, &qp->window_counts);
    i.window_slots = wire::kWindowSlots;
    i.window_slot_size = sizeof(wire::WindowSlot);
  });
  // Its RoCE v2 link, once it has one: the PSNs and WQEs in flight live there.
  engine::RoceStatView link;
  if (!engine::roce_stat_view(qp, &link)) return;
  write_raw(link.object, link.size, link.magic_offset, link.magic, kRoce, [&](Record& r) {
    r.handle = address(qp->qp());
    r.context = address(qp->qp()->context);
    r.u.roce.qp = address(qp->qp());
    r.hot[kRoceNextPsn] = link.next_psn;
    r.hot[kRoceExpectedPsn] = link.expected_psn;
    r.hot[kRoceSendQueue] = link.send_queue;
    r.elem_size = link.send_entry_size;
  });
}

void withdraw_link(Qp* qp) {
  engine::RoceStatView link;
  if (engine::roce_stat_view(qp, &link)) withdraw(link.object);
}

void publish(Td* td) {
  write(td, kTd, kTdMagic, [td](Record& r) {
    r.handle = address(&td->ibv);
    r.context = address(td->ibv.context);
    r.hot[kTdUsers] = offset(td, &td->users);
  });
}

void publish(Srq* srq) {
  write(srq, kSrq, kSrqMagic, [srq](Record& r) {
    r.handle = address(&srq->ibv);
    r.context = address(srq->ibv.context);
    r.u.srq.pd = address(srq->ibv.pd);
    r.u.srq.max_sge = srq->max_sge;
    r.u.srq.srq_num = srq->srq_num;
    r.u.srq.type = srq->tm ? IBV_SRQT_TM : srq->xrc_domain ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    r.hot[kSrqHead] = offset(srq, srq->rq.head_address());
    r.hot[kSrqTail] = offset(srq, srq->rq.tail_address());
    r.hot[kSrqLimit] = offset(srq, &srq->limit);
    r.hot[kSrqMaxWr] = offset(srq, &srq->max_wr);
  });
}

void publish(Mw* mw) {
  write(mw, kMw, kMwMagic, [mw](Record& r) {
    r.handle = address(&mw->ibv);
    r.context = address(mw->ibv.context);
    r.u.mw.pd = address(mw->ibv.pd);
    r.u.mw.type = mw->ibv.type;
    r.hot[kMwRkey] = offset(mw, &mw->rkey);
    r.hot[kMwMr] = offset(mw, &mw->mr);
    r.hot[kMwAddr] = offset(mw, &mw->addr);
    r.hot[kMwLength] = offset(mw, &mw->length);
    r.hot[kMwAccess] = offset(mw, &mw->access);
    r.hot[kMwQpn] = offset(mw, &mw->qpn);
  });
}

void publish(Ah* ah) {
  write(ah, kAh, kAhMagic, [ah](Record& r) {
    r.handle = address(&ah->ibv);
    r.context = address(ah->ibv.context);
    AhInfo& i = r.u.ah;
    i.pd = address(ah->ibv.pd);
    std::memcpy(i.dgid, ah->attr.grh.dgid.raw, sizeof(i.dgid));
    i.dlid = ah->attr.dlid;
    i.is_global = ah->attr.is_global;
    i.sgid_index = ah->attr.grh.sgid_index;
    i.port = ah->attr.port_num;
    i.sl = ah->attr.sl;
    i.hop_limit = ah->attr.grh.hop_limit;
    i.traffic_class = ah->attr.grh.traffic_class;
    i.flow_label = ah->attr.grh.flow_label;
  });
}

void publish(Xrcd* x, const char* path) {
  write(x, kXrcd, kXrcdMagic, [x, path](Record& r) {
    r.handle = address(&x->ibv);
    r.context = address(x->ibv.context);
    XrcdInfo& i = r.u.xrcd;
    i.shared = x->domain && x->domain->shared;
    i.dev = i.shared ? x->domain->dev : 0;
    i.ino = i.shared ? x->domain->ino : 0;
    std::snprintf(i.path, sizeof(i.path), "%s", path ? path : "");
    r.hot[kXrcdUsers] = offset(x, &x->users);
  });
}

void publish(Dm* dm) {
  write(dm, kDm, kDmMagic, [dm](Record& r) {
    r.handle = address(&dm->ibv);
    r.context = address(dm->ibv.context);
    r.u.dm.length = dm->mem ? dm->mem->length : 0;
    r.u.dm.base = dm->mem ? address(dm->mem->base) : 0;
    r.u.dm.handle = dm->ibv.handle;
    r.u.dm.imported = dm->imported;
  });
}

void withdraw(const void* object) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_seg || g_seg_pid != getpid()) return;
  auto it = g_slots->find(object);
  if (it == g_slots->end()) return;
  Record free{};
  store(&records(g_seg)[it->second], free);
  g_free->push_back(it->second);
  g_slots->erase(it);
}

}  // namespace softverbs::stat
