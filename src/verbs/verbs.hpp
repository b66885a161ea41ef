// The core verbs API: one function per verb, rdma-core return conventions (positive errno
// for int verbs, nullptr + errno for constructors). The abi layer forwards to these.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <shared_mutex>
#include <vector>

#include "common/read_mostly_lock.hpp"
#include "verbs/objects.hpp"
#include "wire/window.hpp"

namespace softverbs {

// Context and async events
ibv_context* open_context(ibv_device* dev);
int close_context(Context* ctx);
int get_async_event(Context* ctx, ibv_async_event* ev);
void ack_async_event(ibv_async_event* ev);
void raise_qp_event(Qp* qp, ibv_event_type type);
void raise_cq_event(Cq* cq, ibv_event_type type);
void raise_srq_event(Srq* srq, ibv_event_type type);
void raise_port_event(ibv_event_type type);  // to every open context
// What an async event's element names (ibv_get_async_event(3)).
enum class EventElement { Cq, Qp, Srq, Port };
EventElement event_element(ibv_event_type type);
// Destroying an object: its async events not yet handed out vanish, then we wait until
// every one handed out was acked.
void drop_async_events_of(Context* ctx, EventElement kind, const void* element);
// Blocks until `*completed` (acks) reaches `*reported` (events handed out).
void wait_acked(pthread_mutex_t* mutex, pthread_cond_t* cond, const uint32_t* completed,
                const uint32_t* reported);
// The device failed: DEVICE_FATAL on every open context, and every QP to the error state.
void raise_device_fatal();
// Calls fn for every QP of every open context (under their locks; fn must not create or
// destroy objects).
void for_each_qp(const std::function<void(Qp*)>& fn);
void for_each_cq(const std::function<void(Cq*)>& fn);
Context* context_from_cmd_fd(int fd);

// PD, MR, AH
ibv_pd* alloc_pd(Context* ctx);
int dealloc_pd(Pd* pd);
ibv_mr* reg_mr(Pd* pd, void* addr, size_t length, uint64_t iova, unsigned access);
int rereg_mr(Mr* mr, int flags, Pd* pd, void* addr, size_t length, int access);
int dereg_mr(Mr* mr);
ibv_ah* create_ah(Pd* pd, const ibv_ah_attr* attr);
int destroy_ah(Ah* ah);

// Completion channels and CQs
ibv_comp_channel* create_comp_channel(Context* ctx);
int destroy_comp_channel(CompChannel* ch);
ibv_cq* create_cq(Context* ctx, int cqe, void* cq_context, CompChannel* ch, int comp_vector);
int resize_cq(Cq* cq, int cqe);
int destroy_cq(Cq* cq);
int poll_cq(Cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq(Cq* cq, int solicited_only);
int get_cq_event(CompChannel* ch, ibv_cq** cq, void** cq_context);
void ack_cq_events(Cq* cq, unsigned int nevents);
// Adds a completion; returns false if the CQ overran (the CQ and its QPs are then in error).
bool cq_push(Cq* cq, const ibv_wc& wc, bool solicited);
// While on (per thread), completions are held back and added when it is turned off. The
// agent answers a peer before the target's completions become visible: a target that exits
// as soon as it sees a message must not take the requester's acknowledgement with it.
void defer_completions(bool on);
bool completions_deferred();  // this thread holds completions back
// Under cq->produce_mu: disarms the CQ if a completion (solicited or in error: `solicited`
// true) should fire it; returns true exactly once per arming.
bool cq_disarm_for(Cq* cq, bool solicited);
// Drops the completions of QP `qpn` not yet polled (a QP moved to RESET starts afresh,
// as hardware providers do it).
void cq_purge_qp(Cq* cq, uint32_t qpn);

// SRQ
ibv_srq* create_srq(Pd* pd, ibv_srq_init_attr* attr);
int modify_srq(Srq* srq, ibv_srq_attr* attr, int mask);
int query_srq(Srq* srq, ibv_srq_attr* attr);
int destroy_srq(Srq* srq);
int post_srq_recv(Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);

// QP
ibv_qp* create_qp(Pd* pd, ibv_qp_init_attr* attr);
int modify_qp(Qp* qp, ibv_qp_attr* attr, int mask);
int query_qp(Qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
int destroy_qp(Qp* qp);
// ibv_attach_mcast / ibv_detach_mcast: 0 or an errno value.
int attach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid);
int detach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid);
int post_send(Qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(Qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
// Checks an ibv_modify_qp attribute mask against the IBA transition table (EINVAL if wrong).
int check_modify_mask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask);

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
  // Under lock(): the MR with this key, or nullptr.
  Mr* find(uint32_t key) const {
    uint32_t index = key >> 8;
    if (index == 0 || index >= slots_.size() || generation_[index] != (key & 0xff)) return nullptr;
    return slots_[index];
  }
  // Under lock(): bumped under the exclusive lock whenever an MR goes or changes, so a
  // buffer resolved earlier under the same count is still valid (RecvWqe::place).
  uint64_t changes() const { return changes_; }
  void note_change() { ++changes_; }  // caller holds lock() exclusively
  // (Re)publishes an MR's entry in the shared MR table, for requesters in other processes.
  void publish(const Mr* mr);
  // This process's published table, in its arena (offset 0 if there is none).
  uint64_t shared_offset();

 private:
  static MrTable& create();
  void write_shared_entry(const Mr* mr);  // caller holds mu_ and shared_ is set
  // Set once, never cleared: the table is immortal (the agent may use it during exit()).
  // Read on every work request, hence not a function-local static (a guard check per call).
  static inline std::atomic<MrTable*> instance_{nullptr};
  wire::MrShared* shared_ = nullptr;
  uint64_t shared_offset_ = 0;
  mutable ReadMostlyLock mu_;
  std::vector<Mr*> slots_{nullptr};
  std::vector<uint8_t> generation_{0};
  std::vector<uint32_t> free_;
  uint64_t changes_ = 0;
};

// Resolves one SGE against an MR of `pd` with the given access; returns false if the key,
// PD, range or access does not fit. Caller holds MrTable::lock(). Inline: every message
// resolves two or three SGEs.
inline bool resolve_sge(Pd* pd, uint32_t key, uint64_t addr, uint64_t length,
                        unsigned need_access, iovec* out) {
  Mr* mr = MrTable::instance().find(key);
  if (!mr || mr->pd != pd) return false;
  if ((mr->access & need_access) != need_access) return false;
  if (addr < mr->iova || length > mr->length || addr - mr->iova > mr->length - length)
    return false;
  out->iov_base = static_cast<char*>(mr->ibv.addr) + (addr - mr->iova);
  out->iov_len = length;
  return true;
}

}  // namespace softverbs
