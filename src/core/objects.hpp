// The verbs object model. Each object embeds the rdma-core struct the application sees
// as its first member (so the C handle and our object are one allocation, and the inline
// verbs in <infiniband/verbs.h> find their ops through `->context`), followed by our state.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "common/queue_mutex.hpp"
#include "common/stat_segment.hpp"
#include "common/spin_lock.hpp"
#include "core/event_queue.hpp"
#include "core/debug_hooks.hpp"
#include "core/ring_queue.hpp"
#include "core/small_vec.hpp"
#include "wire/shm/arena.hpp"
#include "wire/router.hpp"
#include "wire/shm/ud_window.hpp"
#include "wire/shm/window.hpp"

namespace softverbs {

namespace engine {
struct RoceLink;  // a QP's RoCE v2 path (engine/roce.cpp)
}

using Clock = std::chrono::steady_clock;

// Tags that mark our objects, so C entry points can reject pointers we did not hand out.
enum Magic : uint32_t {
  kCtxMagic = 0x53564358,  // "SVCX"
  kPdMagic = 0x53565044,
  kMrMagic = 0x53564d52,
  kCqMagic = 0x53564351,
  kChanMagic = 0x53564348,
  kQpMagic = 0x53565150,
  kSrqMagic = 0x53565352,
  kAhMagic = 0x53564148,
  kDmMagic = 0x5356444d,
  kTdMagic = 0x53565444,
  kMwMagic = 0x5356574d,
  kXrcdMagic = 0x53565844,
  kWqMagic = 0x53565751,
  kIndTableMagic = 0x53564954,
  kDead = 0xdeaddead,
};

struct Context;
struct Pd;
struct Mr;
struct Mw;
struct Cq;
struct CompChannel;
struct Qp;
struct Srq;
struct Xrcd;
// One XRC domain of this process, however many handles name it (verbs/xrc.cpp). Shared
// ones are named by (dev, ino) of the file, on the whole host.
struct XrcDomain {
  bool shared = false;
  dev_t dev = 0;
  ino_t ino = 0;
  int handles = 0;  // open Xrcd handles in this process (under verbs/xrc.cpp's lock)
};

// What a context shares with the contexts imported from it (ibv_import_device(3)): its PD
// handles, so that ibv_import_pd finds them (verbs/import.cpp). The last context holding it
// frees it, as the kernel keeps a uverbs file while any fd of it is open.
struct ContextShared {
  std::mutex mu;
  std::map<uint32_t, Pd*> pds;  // plain PDs created on any of the contexts, by handle
  // Imported from a cmd_fd whose context is not in this process: the handles the
  // application has name objects we cannot reach (verbs/import.cpp says why).
  bool foreign = false;
  // The foreign context's maker: its pid and registry slot (from the cmd_fd's record), and
  // the cmd_fd's file, which names the context to that process's agent.
  pid_t exporter_pid = 0;
  int exporter_slot = 0;
  uint64_t dev = 0, ino = 0;
  // The PDs of that process imported here (each the `prot` of its imports), by handle in
  // `pds`; owned here.
  std::vector<std::shared_ptr<Pd>> foreign_pds;
};

struct Context {
  verbs_context vctx;  // ibv_context is its last member; the application sees &vctx.context
  uint32_t magic = kCtxMagic;
  EventQueue<ibv_async_event> async_queue;
  std::mutex objects_mu;  // guards the object lists below
  std::set<Qp*> qps;
  std::set<Cq*> cqs;
  std::set<Srq*> srqs;
  int cmd_fd = -1;
  std::shared_ptr<ContextShared> shared = std::make_shared<ContextShared>();
  // What XRC TGT QPs of this context use for the PD and CQs they do not have (under
  // objects_mu; made on first use, freed with the context; verbs/xrc.cpp).
  Pd* xrc_pd = nullptr;
  Cq* xrc_cq = nullptr;
  // TGT QPs of this context whose creator handle is gone while other handles (in other
  // processes too) hold them, and whether ibv_close_device came: the context is freed by
  // the later of its close and the last such QP's destroy (under objects_mu; verbs/xrc.cpp).
  int hosted_tgt_qps = 0;
  bool closed = false;

  ibv_context* ibv() { return &vctx.context; }
  static Context* from(ibv_context* c);
  void post_async(const ibv_async_event& ev) { async_queue.push(ev); }
};

struct ParentDomain;
struct DmMemory;
struct TmSrq;  // a tag matching SRQ's list and counters (core/tag_list.hpp)

struct Pd {
  ibv_pd ibv;
  uint32_t magic = kPdMagic;
  Context* ctx;
  std::atomic<int> users{0};  // MRs, QPs, SRQs, AHs
  // What protection checks compare: the PD itself, or for a parent domain the PD it extends
  // ("completely interchangeable with the struct ibv_pd used to create it",
  // ibv_alloc_parent_domain(3)).
  Pd* prot = this;
  ParentDomain* parent = nullptr;  // a parent domain's TD and allocator (verbs/domains.cpp)
  // ibv_import_pd(3): this handle stands for `prot`, a PD of a context it was imported
  // from; freeing it frees only this handle (the PD stays in use while any import is).
  bool imported = false;
  // A PD of another process this one stands for (the `prot` of its imports): that PD's
  // token in the exporter's published MR entries; 0 for our own PDs.
  uint64_t foreign_token = 0;
  // Destroyed through an import (ibv_dealloc_pd(3) of an imported PD): no longer importable;
  // the application's own ibv_dealloc_pd only frees the struct.
  bool destroyed = false;
  static Pd* from(ibv_pd* p);
};

// An MR imported from another process of this host (ibv_import_mr(3), verbs/import.cpp):
// the exporter's MR memfd mapped here, and what says whether that MR still exists.
struct ForeignMr {
  wire::PeerArena arena;                  // the exporter's arena and MR memfd, mapped here
  const wire::MrShared* entry = nullptr;  // the MR's entry in its published (read-only) table
  int pidfd = -1;                         // readable once the exporter has exited
  int slot = 0;                           // the exporter's registry slot
  // The exporter's MR named by `key` is still registered and the exporter alive
  // (core/mr_table.cpp): one load and one poll(2), on imported keys only.
  bool live(uint32_t key) const;
  ~ForeignMr();
};

struct Mr {
  ibv_mr ibv;
  uint32_t magic = kMrMagic;
  Pd* pd;           // as given (a parent domain stays one); checks compare pd->prot
  uint64_t iova;    // address the remote side names (iova2)
  uint64_t length;
  unsigned access;
  // Where the byte named by `iova` is in this process. ibv.addr for an ordinary MR; not it
  // for a device-memory MR (addr NULL, zero based), a dma-buf MR (addr = the offset), or an
  // implicit ODP MR (NULL, covering the whole address space: host == iova == 0).
  char* host = nullptr;
  std::shared_ptr<DmMemory> dm;  // a device-memory MR's allocation (kept while the MR lives)
  void* dmabuf_map = nullptr;    // a dma-buf MR's mapping of the dma-buf, unmapped at dereg
  size_t dmabuf_map_length = 0;
  uint64_t shm = 0;  // offset of ibv.addr in the MR memfd when its pages were moved there
  uint64_t shm_length = 0;  // bytes from ibv.addr on that were moved
  // Memory windows bound to it (changed under the key lock, shared, and the window's mu):
  // while any is, ibv_dereg_mr and ibv_rereg_mr fail (ibv_alloc_mw(3), IBA 10.6.7.2.6).
  std::atomic<int> bound_windows{0};
  // ibv_import_mr(3): a handle of another MR (the key table names that one); it holds
  // nothing but its PD's use, and deregistering it only unimports it.
  bool imported = false;
  // Imported from another process: its memory and liveness (host points into the mapping).
  std::shared_ptr<ForeignMr> foreign;
  // The import's ibv_dereg_mr destroyed it (ibv_import_mr(3)): its keys are gone, the
  // application's own ibv_dereg_mr only frees the struct.
  bool destroyed = false;
  static Mr* from(ibv_mr* m);
};

// Device memory (ibv_alloc_dm): host memory of the allocating process, page aligned so that
// an MR over it with remote access moves into the shared MR memfd like any other
// (decision 0005) and peers on this host reach it with loads and stores.
struct DmMemory {
  char* base = nullptr;
  size_t length = 0;          // as allocated
  size_t mapped = 0;          // length rounded up to pages
  std::atomic<int> mrs{0};    // MRs on it: ibv_free_dm answers EBUSY while there are any
  ~DmMemory();
};

struct Dm {
  ibv_dm ibv;
  uint32_t magic = kDmMagic;
  Context* ctx;
  std::shared_ptr<DmMemory> mem;
  bool imported = false;  // ibv_import_dm: unimport frees only this handle
  static Dm* from(ibv_dm* d);
};

// A thread domain (ibv_alloc_td): objects on it are used by one thread at a time. We keep
// our locks anyway (uncontended they are cheap), which the man page allows.
struct Td {
  ibv_td ibv;
  uint32_t magic = kTdMagic;
  Context* ctx;
  std::atomic<int> users{0};  // parent domains using it
  static Td* from(ibv_td* t);
};

// An XRC domain handle (ibv_open_xrcd(3)): several handles, in this process or others,
// name one domain when opened on the same file (verbs/xrc.cpp).
struct Xrcd {
  ibv_xrcd ibv;
  uint32_t magic = kXrcdMagic;
  Context* ctx;
  std::shared_ptr<XrcDomain> domain;
  std::atomic<int> users{0};  // SRQs and TGT QPs created or opened with this handle
  static Xrcd* from(ibv_xrcd* x);
};

// A memory window (ibv_alloc_mw(3), IBA 10.6.7): a key for remote access to part of an MR,
// bound and invalidated by work requests (core/mw_table.cpp). Its key lives in the key
// table's slot like an MR's; the binding below is read and changed under `mu` (with the
// key lock held shared), so that a bind on one QP and a lookup for another never race.
struct Mw {
  ibv_mw ibv;  // ibv.rkey: the application's copy (ibv_bind_mw writes the next key there)
  uint32_t magic = kMwMagic;
  Pd* pd;
  uint32_t index = 0;  // the key table slot (rkey >> 8)
  SpinLock mu;
  uint32_t rkey = 0;   // the key the window answers to now
  Mr* mr = nullptr;    // bound to; nullptr: not bound (type 1) or invalidated (type 2)
  uint64_t addr = 0;   // the window: [addr, addr + length) of the MR's iova space
  uint64_t length = 0;
  unsigned access = 0;     // IBV_ACCESS_REMOTE_* and IBV_ACCESS_ZERO_BASED
  uint32_t qpn = 0;        // type 2: the QP it is bound to (only that QP may use it)
  static Mw* from(ibv_mw* m);
};

struct CompChannel {
  ibv_comp_channel ibv;
  uint32_t magic = kChanMagic;
  Context* ctx;
  EventQueue<Cq*> events;
  // Its CQs: a peer that woke the channel left messages in their receive windows.
  std::mutex cqs_mu;
  std::vector<Cq*> cqs;
  // The same by Cq::channel_slot (nullptr: a free slot, in free_slots), under cqs_mu. A
  // CQ's bit in the ready sets below is its slot % wire::kReadyBits.
  std::vector<Cq*> by_slot;
  std::vector<uint32_t> free_slots;
  // Which CQs a waiter looks at (verbs/cq.cpp, get_cq_event), instead of all of them:
  // `looks`, ours (armed since the last look, or left with messages), and `peer_ready` in
  // the shared arena, set by requesters in other processes when they wake us: hints.
  wire::ReadyBits looks{};
  wire::ReadyBits* peer_ready = nullptr;
  uint64_t peer_ready_offset = 0;  // in this process's arena; 0: none
  // Under cqs_mu: bits taken from peer_ready whose wake-up may still be on its way.
  uint64_t ready_credit = 0;
  std::atomic<int> wire_cqs{0};  // of them fed by QPs on the wire (Cq::roce_fed)
  // CQs whose moderation timer is set (core/cq_moderation.cpp): the waiter expires those.
  std::mutex timed_mu;
  std::vector<Cq*> timed;
  std::vector<Cq*> timed_scratch;  // under cqs_mu: the waiter's copy of `timed`
  static CompChannel* from(ibv_comp_channel* c);
};


// A completion's timestamps (ibv_wc_read_completion_ts / _wallclock_ns), taken only for
// the kinds its CQ asked for.
struct CqeStamp {
  static constexpr unsigned kRaw = 1, kWall = 2, kTm = 4, kFlowTag = 8;
  uint64_t raw = 0;   // the completion clock (core/completion_clock.hpp)
  uint64_t wall = 0;  // CLOCK_REALTIME, ns
  ibv_wc_tm_info tm{};  // kTm: ibv_wc_read_tm_info (tag matching completions)
  uint32_t flow_tag = 0;  // kFlowTag: ibv_wc_read_flow_tag (raw packet QPs' tagged rules)
};

struct Cq {
  ibv_cq_ex ibv;  // ibv_cq prefix; cq_ex so that later extended CQs share the layout
  uint32_t magic = kCqMagic;
  Context* ctx;
  CompChannel* channel;
  uint32_t channel_slot = 0;  // in channel->by_slot

  // Ring of completions: producers serialise on produce_mu, pollers on consume_mu.
  // head/tail count entries ever consumed/produced; the fast empty check is one load.
  SpinLock produce_mu;
  SpinLock consume_mu;
  std::vector<ibv_wc> ring;
  uint64_t capacity = 0;  // == ibv.cqe
  std::atomic<uint64_t> head{0};
  std::atomic<uint64_t> tail{0};
  // The arm state (wire::ArmWord). `armed` is the truth, changed under produce_mu; `arm`
  // mirrors it in the shared arena when there is one, so that requesters in other
  // processes know to wake us. Peers can write the mirror, so nothing of ours trusts it:
  // a peer that zeroes it must not cost us the event of our own completions.
  std::atomic<int> armed{wire::kArmNone};
  // The ring's tail when the CQ's last event fired (written under produce_mu). Completions
  // past it and past head are unpolled and no event told of them (they came while the CQ
  // was not armed): arming queues an early event for them (req_notify_cq).
  std::atomic<uint64_t> announced{0};
  // That early event sits in the channel's FIFO and the CQ is still armed. Set under the
  // channel's queue lock and produce_mu, cleared under produce_mu (and, but for a new
  // completion, the queue lock too), read under produce_mu. A new completion makes it an
  // ordinary event, handing it out disarms the CQ, and a poll that empties the CQ first
  // takes it back (cq.cpp). `early_hint` mirrors it for ibv_poll_cq's one relaxed load.
  bool early_pending = false;
  std::atomic<bool> early_hint{false};
  // Completions the agent holds back until it has answered their requester (see
  // defer_completions): receive windows feeding this CQ wait, so that a message the
  // requester sends after that answer cannot overtake them.
  std::atomic<int> held_back{0};
  wire::CqShared* shared = &shared_local;
  wire::CqShared shared_local{};
  uint64_t shared_offset = 0;  // in this process's arena; 0 if `shared` is local
  std::atomic<int>* arm = &shared_local.arm;
  std::atomic<uint64_t> doorbell_seen{0};  // the doorbell value last drained for
  // The next look at the windows looks at every one (a drain left messages behind).
  std::atomic<bool> look_all{false};
  // Looks since the last look at every window (a hint: updated without a lock).
  std::atomic<uint32_t> looks_since_full{0};
  // QPs whose receive windows feed this CQ: ibv_poll_cq drains them first.
  SpinLock inbound_mu;
  std::vector<Qp*> inbound;
  // Which window each rung bit names (under inbound_mu; nullptr: a free index), how many
  // are handed out, and the block of leaf bits (wire::CqRung, in our arena, made when the
  // direct bits run short; engine/shm_rung.cpp).
  std::vector<Qp*> rung_qps;
  std::vector<uint32_t> rung_free;
  std::atomic<uint32_t> rung_used{0};
  std::atomic<wire::CqRung*> rung_block{nullptr};
  std::atomic<uint64_t> rung_offset{0};
  uint32_t rung_cursor = 0;  // under inbound_mu: the rung bit the last look stopped at
  size_t scan_cursor = 0;  // under inbound_mu: where a look at every window starts
  // What an empty ibv_poll_cq reads besides the ring's head and tail, on one cache line
  // of its own: fewer lines for a polling loop, and a layout that unrelated members do not
  // shift. Where this sits in its page matters: at page offset 0x2c0 of perftest's heap
  // ib_send_lat -s 4096 took 0.43 µs instead of 0.34 (docs/analysis/send-lat-4k-layout.md).
  // QPs feed this CQ through receive windows (inbound is not empty).
  alignas(64) std::atomic<bool> has_inbound{false};
  // With exactly one window feeding it, the CQ watches that window's next slot instead of
  // its rung bits: their cache line then stays with the requester, and a message
  // costs one line transfer (the slot) instead of two. Both point into our own arena, which
  // is never unmapped, so a stale pair only gives a wrong hint (drained under the locks).
  std::atomic<const wire::WindowSlot*> solo_slots{nullptr};
  std::atomic<const std::atomic<uint64_t>*> solo_head{nullptr};
  std::atomic<bool> in_error{false};
  // Fed by a QP on the wire (RoCE v2): an empty poll receives from the port (engine/roce.hpp).
  std::atomic<bool> roce_fed{false};
  // Fed by a raw packet QP's rules (or an RSS QP's WQs): an empty poll takes frames from the
  // port's interface itself (engine/raw_packet.cpp). In the padding before `users`.
  std::atomic<bool> raw_fed{false};
  bool destroying = false;       // under produce_mu
  std::atomic<int> users{0};     // QPs feeding it
  // Events handed out by ibv_get_cq_event / ibv_get_async_event (under ibv.mutex).
  uint32_t comp_events_reported = 0;
  uint32_t async_events_reported = 0;

  // What ibv_create_cq_ex asked for (verbs/cq_ex.cpp); a plain CQ has none of it.
  uint64_t wc_flags = 0;         // IBV_WC_EX_WITH_*
  bool ignore_overrun = false;   // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: a full CQ drops the new one
  bool single_threaded = false;  // IBV_CREATE_CQ_ATTR_SINGLE_THREADED: the poll API takes no lock
  // Completion timestamps, one per ring slot, taken when the completion is generated;
  // empty unless wc_flags asks for one of them (the ring of ibv_wc stays as it is).
  unsigned stamp_kinds = 0;      // CqeStamp::kRaw | kWall
  std::vector<CqeStamp> stamps;
  uint64_t last_raw = 0;  // the newest raw stamp in the ring (under produce_mu)
  // ibv_start_poll .. ibv_end_poll (under consume_mu unless single_threaded): the entry at
  // `head` is the current one while `poll_current`; the pass ends at `poll_end`, the tail
  // start_poll saw.
  uint64_t poll_end = 0;
  bool polling = false;
  bool poll_current = false;

  // CQ moderation (ibv_modify_cq; core/cq_moderation.cpp). While `moderated`, an armed CQ
  // holds its event until mod_count CQEs that would fire it have come, or mod_period_us
  // after the first of them, whichever is first. The period is a timerfd in the channel's
  // epoll set, so a waiter on the channel fd wakes for it (no thread, no spinning).
  bool moderated = false;       // under produce_mu: mod_count > 1, a period, a timer
  uint16_t mod_count = 0;       // under produce_mu
  uint16_t mod_period_us = 0;   // under produce_mu
  uint32_t mod_pending = 0;     // under produce_mu: CQEs held since the CQ was armed
  uint64_t mod_first_ns = 0;    // under produce_mu: CLOCK_MONOTONIC of the first of them
  std::atomic<uint64_t> mod_deadline_ns{0};  // when the held event is due; 0: none held
  std::mutex mod_timer_mu;      // orders the timerfd's settings (set outside produce_mu)
  int mod_timer_fd = -1;        // created by the first ibv_modify_cq that needs it
  std::atomic<uint64_t> mod_timer_at{0};  // what the timerfd is set to (0: disarmed)
  bool timed = false;           // in channel->timed (under its timed_mu)

  ibv_cq* cq() { return ibv_cq_ex_to_cq(&ibv); }
  static Cq* from(ibv_cq* c);
};

// One scatter/gather element, resolved or not.
struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// Most work requests carry one or two SGEs and a few inline bytes: those stay in place.
using SgeList = SmallVec<Sge, 2>;

struct RecvWqe {
  uint64_t wr_id;
  SgeList sges;
  // A receive with one buffer, resolved when its capacity was published (receive windows):
  // where a message lands, valid while MrTable::changes() still equals `place_changes`.
  // Saves the drain a key lookup on the polled critical path.
  void* place = nullptr;
  uint32_t place_len = 0;
  uint64_t place_changes = 0;
};

// What an IBV_WR_BIND_MW work request binds (ibv_post_send for type 2, ibv_bind_mw for
// type 1 with rkey = ibv_inc_rkey(mw->rkey)); checked when it runs (IBV_WC_MW_BIND_ERR).
struct MwBind {
  Mw* mw = nullptr;       // compared with the key table's slot mw_index before any use
  uint32_t mw_index = 0;
  uint32_t rkey = 0;      // the window's key once bound
  uint32_t mr_lkey = 0;   // the MR (0 with length 0: a type 1 window is unbound)
  uint64_t addr = 0;
  uint64_t length = 0;
  unsigned access = 0;    // mw_access_flags
};

// Work a tag matching SRQ gives the QP a rendezvous arrived on (engine/tm_responder.cpp):
// the RDMA READ of the sender's buffer into the tagged buffer, then the FIN message. Neither
// is the application's: their completions become the TM-SRQ's, or nothing.
struct TmWork {
  enum Kind : uint8_t { kNone, kRndvRead, kFin } kind = kNone;
  uint64_t recv_wr_id = 0;  // the tagged buffer's
  uint64_t tag = 0;
  uint32_t app_ctx = 0;
};

struct SendWqe {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  // Network order, as posted. IBV_WR_SEND_WITH_INV and IBV_WR_LOCAL_INV: the R_Key to
  // invalidate, in host order (ibv_send_wr's union of imm_data and invalidate_rkey).
  uint32_t imm = 0;
  MwBind bind;  // IBV_WR_BIND_MW
  SgeList sges;
  SmallVec<uint8_t, 64> inline_data;  // IBV_SEND_INLINE: copied at post time
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  // Atomics: compare (or add) and swap. ATOMIC_WRITE: compare_add holds the 8 bytes to
  // store, as they lie in memory. FLUSH: compare_add is the placement type, swap the
  // selectivity level (verbs_ext.hpp), total_length the range.
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // UD addressing, copied from the AH at post time.
  ibv_gid sgid{};
  ibv_gid dgid{};
  uint8_t hop_limit = 0;  // the AH's; a multicast datagram's IP TTL / hop limit
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  uint32_t xrc_srqn = 0;  // XRC INI: the remote XRC SRQ (XRCETH)
  uint64_t total_length = 0;
  // Retry bookkeeping for this WQE (RNR NAK / no response).
  bool started = false;
  int rnr_left = 0;
  int retry_left = 0;
  TmWork tm;
};

// A receive work queue (ibv_create_wq(3), verbs/wq.cpp): a receive queue with its own CQ,
// fed by the RSS QPs whose indirection tables name it. Its receives are a hidden SRQ's
// (`rq`, whose xrc_cq is the WQ's CQ: a receive's completion goes there, as an XRC SRQ's).
struct Wq {
  ibv_wq ibv;
  uint32_t magic = kWqMagic;
  Context* ctx = nullptr;
  Srq* rq = nullptr;
  std::atomic<int> state{IBV_WQS_RESET};  // frames land only in RDY
  std::atomic<int> users{0};              // indirection tables naming it
  static Wq* from(ibv_wq* w);
};

// ibv_create_rwq_ind_table(3): 2^log_size WQs, indexed by a frame's hash.
struct RwqIndTable {
  ibv_rwq_ind_table ibv;
  uint32_t magic = kIndTableMagic;
  Context* ctx = nullptr;
  std::vector<Wq*> wqs;
  std::atomic<int> users{0};  // RSS QPs using it
  static RwqIndTable* from(ibv_rwq_ind_table* t);
};

// An RSS QP's hash (ibv_rx_hash_conf): Toeplitz over the fields the mask selects.
struct RxHash {
  std::vector<uint8_t> key;
  uint64_t fields = 0;
  RwqIndTable* table = nullptr;
};

struct Srq {
  ibv_srq ibv;
  uint32_t magic = kSrqMagic;
  Context* ctx;
  Pd* pd;
  QueueMutex mu;
  RingQueue<RecvWqe> rq;
  uint32_t max_wr;
  uint32_t max_sge;
  uint32_t limit = 0;  // armed limit; 0 = disarmed
  std::atomic<int> users{0};
  uint32_t events_reported = 0;  // under ibv.mutex
  std::set<uint32_t> rnr_waiters;  // under mu: QPNs of senders to retry when a receive is posted
  TmSrq* tm = nullptr;  // IBV_SRQT_TM: its matching list (under mu) and CQ; else nullptr
  // XRC SRQ (ibv_create_srq_ex with IBV_SRQT_XRC, verbs/xrc.cpp): its domain, the CQ its
  // receives complete on, and its number (what an XRC INI QP names in XRCETH). The domain
  // is held by shared_ptr so that it outlives the xrcd handle it was created with.
  std::shared_ptr<XrcDomain> xrc_domain;
  Xrcd* xrcd = nullptr;
  Cq* xrc_cq = nullptr;
  uint32_t srq_num = 0;
  // Once a QP of it opened a receive window (engine/srq_claims.cpp): the block through
  // which senders in other processes claim its receives (never freed: they may still
  // write it). From then on (under mu) rq[i] is receive number popped + i, posted is
  // popped + rq.size(), receives are consumed in any order (a claimed one when its
  // message is drained) and leave rq once all before them went too.
  std::atomic<wire::SrqShared*> shared{nullptr};
  uint64_t posted = 0;
  uint64_t popped = 0;
  uint32_t consumed_ahead = 0;         // consumed, still in rq behind an earlier one
  std::vector<uint8_t> consumed;       // by number % wire::kSrqNumbers
  std::set<uint64_t> given_back;       // claimed and given back: the next local consumer's
  uint32_t next_claimer = 1;           // the next window's `who`
  static Srq* from(ibv_srq* s);
};

struct Ah {
  ibv_ah ibv;
  uint32_t magic = kAhMagic;
  Pd* pd;
  ibv_ah_attr attr;
  static Ah* from(ibv_ah* a);
};

// The work requests an ibv_qp_ex is building between wr_start and wr_complete (qp_ex.cpp):
// each is what ibv_post_send would have been given, plus what ibv_send_wr cannot say. The
// wr_* calls write it in place, so wr_complete hands it to the checks as it is.
struct ExWr {
  // Where wr.sg_list points (kept pointing there when the batch's storage moves).
  enum class Gather : uint8_t { kNone, kOne, kList, kInline };
  ibv_send_wr wr;        // only what the checks and the WQE read is set (begin_wr)
  unsigned app_flags;    // qp->wr_flags when the WR was started
  Gather gather;
  uint64_t length;       // the bytes of its gather list or inline data, summed when set
  ibv_sge sge;           // wr_set_sge's one SGE, or the inline bytes as one SGE
  SmallVec<ibv_sge, 2> sges;          // wr_set_sge_list
  SmallVec<uint8_t, 64> inline_data;  // wr_set_inline_data(_list): copied at the call
  uint64_t flush_length;              // FLUSH: the range
  uint8_t flush_type;
  uint8_t flush_level;
  uint64_t atomic_value;              // ATOMIC_WRITE: the 8 bytes
};
struct ExBatch {
  std::vector<ExWr> wrs;  // [0, count): this batch; the rest keep their storage for reuse
  ExWr* slots = nullptr;  // wrs.data(), for the wr_* calls' fast path
  size_t limit = 0;       // wrs.size() while open, else 0: count < limit, room for a WR
  size_t count = 0;
  int error = 0;          // the first error a wr_* call met: wr_complete returns it
  bool open = false;      // between wr_start and wr_complete/wr_abort
};

struct Qp {
  ibv_qp_ex ibv;  // ibv_qp prefix
  // rdma-core 45 appended wr_flush to ibv_qp_ex; programs built with its headers find it here.
  void (*wr_flush)(ibv_qp_ex*, uint32_t, uint64_t, size_t, uint8_t, uint8_t) = nullptr;
  uint32_t magic = kQpMagic;
  Context* ctx;
  Pd* pd;
  Cq* send_cq;
  Cq* recv_cq;
  Srq* srq;
  ibv_qp_type type;
  bool sq_sig_all;
  ibv_qp_cap cap;

  // Attributes set by ibv_modify_qp; under attr_mu (the data path copies what it needs).
  std::mutex attr_mu;
  ibv_qp_attr attr{};
  std::vector<ibv_gid> mcast_groups;  // under attr_mu: multicast groups attached (UD)
  bool block_self_mcast = false;      // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
  // Created by ibv_create_qp_ex: ibv_qp_to_qp_ex hands out `ibv`, whose wr_* build `ex`.
  bool is_qp_ex = false;
  uint64_t send_ops_flags = 0;
  ExBatch ex;  // under sq_mu only while being posted; the wr_* calls are the caller's
  // IBV_QP_CREATE_SOURCE_QPN: a UD QP that speaks as this QPN on the wire (only 1, QP1: the
  // CM's MAD agent, docs/decisions/0007). It sends with DETH SrcQP 1 and receives what
  // arrives for DestQP 1. 0: the QP's own number.
  uint32_t source_qpn = 0;
  // XRC (verbs/xrc.cpp). A TGT QP (IBV_QPT_XRC_RECV) belongs to an XRC domain: its
  // receives land in the XRC SRQ each message names, which must be of the same domain.
  // It has no PD, CQs or queues of the application's: `pd`, `send_cq` and `recv_cq` are the
  // context's hidden ones (never polled). `xrc_opened_from`: this handle is an ibv_open_qp of
  // that TGT QP (modify, query and destroy act on it); `xrc_openers` the handles opened on
  // this one, which hear its async events too (under xrc_mu).
  Xrcd* xrcd = nullptr;
  std::shared_ptr<XrcDomain> xrc_domain;
  Qp* xrc_opened_from = nullptr;
  std::mutex xrc_mu;
  std::vector<Qp*> xrc_openers;
  int xrc_handles = 1;  // the creator's handle plus the opened ones
  // The creator destroyed its handle: the QP no longer counts on the creator's Xrcd
  // handle (xrcd is null) but holds the domain itself, and counts in its context's
  // hosted_tgt_qps, as the kernel's QP holds its xrcd, not the creator's file.
  bool xrc_creator_gone = false;
  // Other processes' handles on this TGT QP (ibv_open_qp through our agent): their pid and
  // registry slot, one entry per handle; they hear its events through their agents.
  std::vector<std::pair<pid_t, int>> xrc_remote_openers;
  // This handle names a TGT QP of the process in this registry slot (0: not such a handle);
  // modify, query and destroy ask that process's agent.
  int xrc_remote_slot = 0;
  // That process (its pid when the handle was opened); once it died the QP is gone with it
  // and the handle shows a fatal error (verbs/xrc.cpp creator_died).
  std::atomic<pid_t> xrc_remote_pid{0};  // (follows the QP when it moves: verbs/xrc.cpp)
  std::atomic<bool> xrc_remote_dead{false};
  // Its host was killed and another holder took the QP over: this handle is being counted
  // there again (rejoin); a destroy meanwhile sends its close after that (under g_remote_mu).
  bool xrc_rejoining = false;
  // This process is ending and handed the TGT QP over to a holder (verbs/xrc.cpp
  // handover_at_exit): what is left here is a copy nobody reaches, which tells no one.
  std::atomic<bool> xrc_moved{false};
  std::atomic<int> state{IBV_QPS_RESET};
  // The connection to a peer process (under attr_mu): a number unique in this process, given
  // when the QP enters RTR, and the peer's pid then; RESET clears both. A dead peer's timer
  // names these, not the peer's registry slot, which the next process to start takes over
  // (QPNs included) and this QP may be connected to by the time the timer fires.
  uint64_t connection = 0;
  pid_t peer_pid = 0;

  QueueMutex sq_mu;  // lock order: a QP's sq_mu before any rq lock; never two sq_mu
  std::deque<SendWqe> sq;
  // Work requests posted through each API (under sq_mu; send_api_tally.cpp sums them).
  uint64_t posted_by_post_send = 0;
  uint64_t posted_by_wr_api = 0;
  bool sq_drain_notify = false;  // SQD entered with en_sqd_async_notify
  Clock::time_point retry_at{};  // head WQE waits until then (RNR / no response)
  bool retry_scheduled = false;
  // What the requester reads of `attr` for every WQE, copied under sq_mu (then attr_mu)
  // whenever ibv_modify_qp changes it, so posting takes no attr_mu.
  struct SendPath {
    uint32_t dest_qpn = 0;
    ibv_gid dgid{};
    wire::Route route = wire::Route::Roce;  // how dgid/dest_qpn is reached (wire/router.hpp)
    uint32_t qkey = 0;
    uint8_t timeout = 0;
    uint8_t retry_cnt = 0;
    uint8_t rnr_retry = 0;
  } send_path;

  // Tag matching work for this QP's send queue (TmWork), queued by the responder, which
  // may not take sq_mu; run_send_queue moves it into `sq`.
  SpinLock tm_mu;
  std::vector<SendWqe> tm_pending;
  std::atomic<bool> has_tm_pending{false};

  QueueMutex rq_mu;
  RingQueue<RecvWqe> rq;
  std::set<uint32_t> rnr_waiters;  // under rq_mu: QPNs of senders waiting (RNR)
  bool comm_est_raised = false;  // under rq_mu
  bool last_wqe_raised = false;  // under rq_mu

  std::atomic<int> users{0};  // in-flight lookups by peers and the progress thread
  uint32_t events_reported = 0;  // under ibv.qp_base.mutex

  // Target side: the receive window a remote requester writes into (under rq_mu). The
  // peer can write anywhere in it, so what we index with is kept here, not read back.
  std::atomic<wire::WindowHeader*> window{nullptr};
  // Its slots, for a CQ's look at whether anything is waiting without taking rq_mu.
  std::atomic<const wire::WindowSlot*> window_slots{nullptr};
  wire::InboundWindow inbound;
  uint32_t rung_index = UINT32_MAX;  // in recv_cq->rung_qps (under recv_cq->inbound_mu)
  uint64_t rung_idle_since = 0;      // when its window was first found idle (same lock)
  size_t inbound_pos = SIZE_MAX;     // in recv_cq->inbound (under recv_cq->inbound_mu)
  // Requester side: the peer's window, when the peer is another process (under sq_mu).
  wire::PeerWindow peer_window;
  stat::PeerWindowCounts window_counts{};  // under sq_mu; `softverbs stat` reads them
  // UD windows (wire/shm/ud_window.hpp, engine/shm_ud.cpp). Target side: one per sender QP
  // of another process, under ud_mu (taken after the key lock, before rq_mu or the SRQ's
  // lock). Sender side: windows into other processes' UD QPs, by QPN (under sq_mu).
  QueueMutex ud_mu;
  std::vector<wire::UdInboundWindow> ud_inbound;
  std::vector<wire::UdPeerWindow> ud_peers;
  uint64_t ud_opens = 0;  // under sq_mu: numbers ud_peers' entries in the order opened
  // With one window, its slots and a count of what was consumed from it, for the CQ to
  // watch (Cq::solo_slots; the slot layouts match): set under ud_mu, read under the CQ's
  // inbound_mu. The count is ud_watch, a word of ours (shm_ud.cpp), not the window's head.
  std::atomic<const wire::WindowSlot*> ud_solo_slots{nullptr};
  std::atomic<const std::atomic<uint64_t>*> ud_solo_head{nullptr};
  std::atomic<uint64_t>* ud_watch = nullptr;
  // Its RoCE v2 path, when its peer is on another host or it is UD (engine/roce.hpp):
  // set at RTR, freed on destroy.
  std::atomic<engine::RoceLink*> roce{nullptr};
  // `softverbs inject` faults and `softverbs trace` sequence numbers (core/debug_hooks.hpp).
  QpDebug debug;
  // A raw packet QP: its steering rules (engine/raw_packet.cpp; under that file's lock). A
  // QP with rules cannot be destroyed (EBUSY), as the kernel counts them as its users.
  int raw_flows = 0;
  pid_t raw_owner = 0;  // the process that made it (a forked child's copy is not its own)
  // An RSS QP (a raw packet QP made with an indirection table): how a frame picks its WQ.
  struct RxHash* rss = nullptr;

  ibv_qp* qp() { return &ibv.qp_base; }
  uint32_t qpn() const { return ibv.qp_base.qp_num; }
  static Qp* from(ibv_qp* q);
};

}  // namespace softverbs
