// The object model's primitives, which every role of the engine uses: completions into a
// CQ, async events, the key table. Below the engine (which includes this) and above the
// wire; the verbs calls (verbs/verbs.hpp) are built on them too.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <shared_mutex>
#include <vector>

#include "common/page_fault.hpp"
#include "common/read_mostly_lock.hpp"
#include "core/objects.hpp"

namespace softverbs {

// Async events (core/events.cpp), to the object's context.
void raise_qp_event(Qp* qp, ibv_event_type type);
void raise_cq_event(Cq* cq, ibv_event_type type);
void raise_srq_event(Srq* srq, ibv_event_type type);
void raise_port_event(ibv_event_type type);  // to every open context

// Open contexts (core/events.cpp): open_context registers, close_context forgets.
void register_context(Context* ctx);
void unregister_context(Context* ctx);
// A context closed while it still runs XRC TGT QPs (verbs/context.cpp): for_each_qp walks
// its QPs until it is released, just before it is freed.
void hold_closed_context(Context* ctx);
void release_closed_context(Context* ctx);
// Calls fn for every open context (under the list's lock; fn must not open or close one).
void for_each_context(const std::function<void(Context*)>& fn);
// Calls fn for every QP of every open context (under their locks; fn must not create or
// destroy objects).
void for_each_qp(const std::function<void(Qp*)>& fn);
void for_each_cq(const std::function<void(Cq*)>& fn);

// Completions (core/cq_ring.cpp).
// Adds a completion; returns false if the CQ overran (the CQ and its QPs are then in error).
// `tm`: a tag matching completion's ibv_wc_read_tm_info (kept when the CQ asked for it).
// `flow_tag`: a raw packet QP's receive steered by a rule with IBV_FLOW_SPEC_ACTION_TAG.
bool cq_push(Cq* cq, const ibv_wc& wc, bool solicited, const ibv_wc_tm_info* tm = nullptr,
             uint32_t flow_tag = 0);
// While on (per thread), completions are held back and added when it is turned off. The
// agent answers a peer before the target's completions become visible: a target that exits
// as soon as it sees a message must not take the requester's acknowledgement with it.
void defer_completions(bool on);
bool completions_deferred();  // this thread holds completions back

// CQ moderation (core/cq_moderation.cpp).
// What a completion does to the CQ's arm: `fire` its event now (the CQ is disarmed; true
// at most once per arming), and whether the moderation deadline changed (`sync_timer`:
// call cq_moderation_sync_timer once produce_mu is released).
struct ArmStep {
  bool fire = false;
  bool sync_timer = false;
};
// Under cq->produce_mu, for a completion (`solicited`: it had the SE bit; `error`: its
// status is not SUCCESS). A moderated CQ counts it and holds the event back.
ArmStep cq_arm_step(Cq* cq, bool solicited, bool error);
// Under cq->produce_mu, as its event is handed out or fires: disarms the CQ, drops what
// moderation held; returns whether a moderation deadline was cleared (sync the timer).
bool cq_disarm_locked(Cq* cq);
// Sets the CQ's timerfd to its moderation deadline (or disarms it). Not under produce_mu.
void cq_moderation_sync_timer(Cq* cq);
// The channel's waiter, for each CQ of the channel: fires the event held by moderation
// once its period is over (`now_ns`: CLOCK_MONOTONIC). Returns true if it fired.
bool cq_moderation_expire(Cq* cq, uint64_t now_ns);
// The same for the CQs of `ch` whose timer is set (caller holds ch->cqs_mu).
void cq_moderation_expire_due(CompChannel* ch);
// ibv_modify_cq's moderation, values already checked: 0 or an errno value.
int cq_set_moderation(Cq* cq, uint16_t count, uint16_t period_us);
// destroy_cq, under the channel's cqs_mu: the timerfd leaves the channel and closes.
void cq_moderation_close(Cq* cq);
// Drops the completions of QP `qpn` not yet polled (a QP moved to RESET starts afresh,
// as hardware providers do it).
void cq_purge_qp(Cq* cq, uint32_t qpn);
// What happens when a CQ overruns (the engine's answer: CQ_ERR, its QPs to ERR); `first`
// is true for the completion that overran it, false for later ones. Set once.
void set_cq_overrun_handler(void (*handler)(Cq* cq, bool first));

// XRC SRQs of this process by number (core/xrc_srqs.cpp). A responder holds
// xrc_srq_lock() shared around the look-up and every use of the SRQ it found; nullptr when
// no SRQ of this process has the number in `domain`.
std::shared_mutex& xrc_srq_lock();
Srq* find_xrc_srq_locked(uint32_t srq_num, const XrcDomain* domain);
// The same for a message that arrived on a TGT QP of another process: the SRQ's domain
// must be the shared one of the file (dev, ino).
Srq* find_shared_xrc_srq_locked(uint32_t srq_num, uint64_t dev, uint64_t ino);
uint32_t add_xrc_srq(Srq* srq);  // its number; 0 when none is left
void remove_xrc_srq(uint32_t srq_num);

// The key table: lkeys/rkeys name MRs. Lookups run under a shared lock that the data path
// holds for a whole operation, so an MR cannot be deregistered mid-copy.
class MrTable {
 public:
  static MrTable& instance() {
    if (MrTable* t = instance_.load(std::memory_order_acquire)) return *t;
    return create();
  }
  ReadMostlyLock& lock() { return mu_; }
  uint32_t insert(Mr* mr);  // returns the key (lkey == rkey)
  void erase(uint32_t key);
  // Frees an MR's key unless memory windows are bound to it (false then: EBUSY).
  bool erase_unbound(Mr* mr);
  // Under lock(): the MR with this key, or nullptr. Our keys carry our registry slot
  // (wire::key_index): a key of another slot falls out of our range with one subtraction,
  // and only then are the MRs imported from other processes looked at.
  Mr* find(uint32_t key) const {
    uint32_t index = (key >> 8) - base_;
    if (index >= slots_.size()) [[unlikely]]
      return imported_.empty() ? nullptr : find_imported(key);
    if (index == 0 || generation_[index] != (key & 0xff)) return nullptr;
    return slots_[index];
  }
  // MRs imported from another process (ibv_import_mr(3), verbs/import.cpp): their keys are
  // the exporter's. They resolve while the exporter's MR exists and the exporter lives.
  void insert_imported(Mr* mr);
  void erase_imported(Mr* mr);
  // Under lock(): bumped under the exclusive lock whenever an MR goes or changes, so a
  // buffer resolved earlier under the same count is still valid (RecvWqe::place).
  uint64_t changes() const { return changes_; }
  void note_change() { ++changes_; }  // caller holds lock() exclusively
  // (Re)publishes an MR's entry in the shared MR table, for requesters in other processes.
  void publish(const Mr* mr);
  // This process's published table, in its arena (offset 0 if there is none).
  uint64_t shared_offset();

  // Memory windows (core/mw_table.cpp). A window's slot holds no MR, so find() never
  // returns one: a window's key is never an lkey.
  uint32_t insert_window(Mw* mw);  // returns its first key
  void erase_window(Mw* mw);       // unbinds it first
  // Under lock() (shared), as every role runs: IBV_WR_BIND_MW on a QP of PD `qp_pd`, number
  // `qpn`; IBV_WC_SUCCESS or IBV_WC_MW_BIND_ERR (the rules of IBA 10.6.7 as rxe checks them).
  ibv_wc_status bind_window(const MwBind& b, Pd* qp_pd, uint32_t qpn);
  // Under lock() (shared): invalidates the type 2 window named by `key` for a QP of PD
  // `qp_pd` (IBV_WR_LOCAL_INV; a SEND_WITH_INV into an XRC SRQ of that PD), or,
  // `match_qp`, for the SEND_WITH_INV that arrived on QP `qpn`, which must be the window's.
  // False when it cannot: no such window, a type 1 window (o10-37.2.26), not bound, another
  // PD or QP, or an MR's key (an MR is only ever registered by ibv_reg_mr: there are no
  // fast-registration MRs to invalidate).
  bool invalidate(uint32_t key, Pd* qp_pd, uint32_t qpn, bool match_qp);
  // Under lock() (shared): [addr, addr + length) through the window named by `key`, for a
  // QP of PD `pd` numbered `qpn`, with `need` access; false if anything does not fit.
  bool resolve_window(Pd* pd, uint32_t qpn, uint32_t key, uint64_t addr, uint64_t length,
                      unsigned need, iovec* out) const;
  // Type 2 windows bound to a QP that goes away are invalidated (its number is reused).
  void invalidate_windows_of(uint32_t qpn);

 private:
  uint32_t take_slot();  // caller holds mu_ exclusively; 0 when every index is taken
  uint32_t key_of(uint32_t index, uint8_t gen) const { return ((base_ | index) << 8) | gen; }
  Mr* find_imported(uint32_t key) const;
  void erase_locked(uint32_t key);  // caller holds mu_ exclusively
  void release_binding(Mw* mw);  // caller holds mw->mu; clears its published entry
  void publish_window(const Mw* mw);  // caller holds mw->mu and mu_ (shared or not)
  static MrTable& create();
  void write_shared_entry(const Mr* mr);  // caller holds mu_ and shared_ is set
  // Set once, never cleared: the table is immortal (the agent may use it during exit()).
  // Read on every work request, hence not a function-local static (a guard check per call).
  static inline std::atomic<MrTable*> instance_{nullptr};
  wire::MrShared* shared_ = nullptr;
  uint64_t shared_offset_ = 0;
  mutable ReadMostlyLock mu_;
  uint32_t base_ = 0;  // our registry slot << kKeySlotShift (taken anew in a forked child)
  std::vector<Mr*> imported_;  // other processes' MRs (ibv_import_mr), a handful at most
  std::vector<Mr*> slots_{nullptr};
  std::vector<Mw*> windows_{nullptr};  // the same slots, for memory windows
  std::vector<Mw*> type2_windows_;     // the type 2 ones among them (under mu_)
  std::vector<uint8_t> generation_{0};
  std::vector<uint32_t> free_;
  uint64_t changes_ = 0;
};

// The access that writes the memory (for an ODP fault: fault the pages in writable).
inline constexpr unsigned kWritingAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// Resolves one SGE against an MR of `pd` with the given access; returns false if the key,
// PD, range or access does not fit. Caller holds MrTable::lock(). Inline: every message
// resolves two or three SGEs.
inline bool resolve_sge(Pd* pd, uint32_t key, uint64_t addr, uint64_t length,
                        unsigned need_access, iovec* out) {
  Mr* mr = MrTable::instance().find(key);
  if (!mr || mr->pd->prot != pd->prot) return false;
  if ((mr->access & need_access) != need_access) return false;
  if (addr < mr->iova || length > mr->length || addr - mr->iova > mr->length - length)
    return false;
  out->iov_base = mr->host + (addr - mr->iova);
  out->iov_len = length;
  // On-demand paging: the pages need not be there until the access, which faults them in;
  // a fault that fails (unmapped, read only) is the access error, as on a NIC.
  if (mr->access & IBV_ACCESS_ON_DEMAND) [[unlikely]]
    return fault_in(out->iov_base, length, (need_access & kWritingAccess) != 0);
  return true;
}

// The responder's part of a FLUSH (IBA 1.5, as rxe): the MR named by `key` must grant the
// flush access its placement `type` asks for (verbs_ext.hpp) over the range the selectivity
// `level` names ([addr, addr + length), or the whole MR); then what landed there is made
// globally visible, and for PERSISTENT written back as far as the mapping's backing store
// goes (msync: a DAX or file mapping). False: an R_Key violation. Caller holds the key lock.
bool flush_memory(Pd* pd, uint32_t key, uint64_t addr, uint64_t length, uint8_t type,
                  uint8_t level);

// The responder's look-up of an R_Key: an MR of `pd`, or a memory window for QP `qpn` of
// `pd` (MrTable::resolve_window). Caller holds MrTable::lock().
inline bool resolve_rkey(Pd* pd, uint32_t qpn, uint32_t key, uint64_t addr, uint64_t length,
                         unsigned need_access, iovec* out) {
  return resolve_sge(pd, key, addr, length, need_access, out) ||
         MrTable::instance().resolve_window(pd, qpn, key, addr, length, need_access, out);
}

}  // namespace softverbs
