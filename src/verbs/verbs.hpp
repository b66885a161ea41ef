// The verbs API: one function per verb, rdma-core return conventions (positive errno
// for int verbs, nullptr + errno for constructors). The abi layer forwards to these.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <shared_mutex>
#include <vector>

#include "core/core.hpp"
#include "core/objects.hpp"
#include "wire/shm/window.hpp"

namespace softverbs {

// Context and async events
// import_fd: the cmd_fd of an imported context (ibv_import_device), which it takes over;
// -1 for a new one.
ibv_context* open_context(ibv_device* dev, int import_fd = -1);
int close_context(Context* ctx);
// The rest of a close deferred while TGT QPs whose creator handle went run in the context
// (Context::hosted_tgt_qps): its hidden PD and CQ, and the context itself.
void free_closed_context(Context* ctx);
int get_async_event(Context* ctx, ibv_async_event* ev);
void ack_async_event(ibv_async_event* ev);
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
Context* context_from_cmd_fd(int fd);

// Importing (verbs/import.cpp): ibv_import_device(3), ibv_import_pd(3), ibv_import_mr(3).
// A context's cmd_fd is a memfd naming its device and creator; a dup of it, or one passed
// to another process, imports the context. nullptr + errno on failure.
ibv_context* import_device(int cmd_fd);
ibv_pd* import_pd(Context* ctx, uint32_t handle);
void unimport_pd(Pd* pd);
ibv_mr* import_mr(Pd* pd, uint32_t handle);
void unimport_mr(Mr* mr);
// ibv_dereg_mr / ibv_dealloc_pd of an import: the original goes for everyone (in this
// process or the exporter's), then the import. 0 or an errno value.
int dereg_imported_mr(Mr* mr);
int dealloc_imported_pd(Pd* pd);
// Destroying an original (verbs/mr.cpp) while its struct stays the application's: its keys,
// pages and counts go; the struct goes with the application's own ibv_dereg_mr /
// ibv_dealloc_pd. destroy_mr_locked under mr_destroy_mutex(): 0 or EBUSY (windows bound).
std::mutex& mr_destroy_mutex();
int destroy_mr_locked(Mr* mr);
// Under pd->ctx->shared->mu: false when it was destroyed already.
bool destroy_pd_locked(Pd* pd);
// Frees unimported PDs whose last user (a QP, SRQ, AH, MR made on them) is gone.
void sweep_unimported_pds();
// Writes the record import_device reads into a new context's cmd_fd; false + errno.
bool write_context_record(int cmd_fd, const char* device_name);

// PD, MR, AH
ibv_pd* alloc_pd(Context* ctx);
int dealloc_pd(Pd* pd);
ibv_mr* reg_mr(Pd* pd, void* addr, size_t length, uint64_t iova, unsigned access);
int rereg_mr(Mr* mr, int flags, Pd* pd, void* addr, size_t length, int access);
int dereg_mr(Mr* mr);
// The kinds of MR (verbs/device_memory.cpp, dmabuf.cpp) end in this registration: `host` is
// where the byte named by `iova` is in this process, `addr` what ibv_mr.addr shows.
// nullptr + errno on failure.
Mr* make_mr(Pd* pd, char* host, void* addr, size_t length, uint64_t iova, unsigned access);
int check_mr_access(unsigned access);  // 0 or EINVAL (unknown bits, remote write without local)

// On-demand paging (verbs/odp.cpp): ibv_advise_mr(3); 0 or an errno value.
int advise_mr(Pd* pd, uint32_t advice, uint32_t flags, const ibv_sge* sg_list, uint32_t num_sge);

// Device memory (verbs/device_memory.cpp): ibv_alloc_dm(3), ibv_reg_dm_mr, ibv_import_dm.
// What ibv_query_device_ex reports as max_dm_size: the most one process may hold at once.
inline constexpr size_t kMaxDmSize = 256 * 1024;
ibv_dm* alloc_dm(Context* ctx, const ibv_alloc_dm_attr* attr);
int free_dm(Dm* dm);
ibv_mr* reg_dm_mr(Pd* pd, Dm* dm, uint64_t offset, size_t length, unsigned access);
ibv_dm* import_dm(Context* ctx, uint32_t handle);
void unimport_dm(Dm* dm);

// dma-buf MRs (verbs/dmabuf.cpp): ibv_reg_dmabuf_mr(3). EBADF for a bad fd, EINVAL for one
// that is not a dma-buf (what the kernel answers); the bytes are reached through an mmap of
// the dma-buf. reg_fd_mr is the part after the dma-buf check, for any fd mmap accepts.
ibv_mr* reg_dmabuf_mr(Pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                      unsigned access);
ibv_mr* reg_fd_mr(Pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                  unsigned access);

// Tag matching SRQs (verbs/tag_matching.cpp): ibv_create_srq_ex(3) with IBV_SRQT_TM,
// ibv_post_srq_ops(3), and what ibv_query_device_ex reports in tm_caps.
ibv_srq* create_tm_srq(Pd* pd, Cq* cq, ibv_srq_init_attr_ex* ex);
int post_srq_ops(Srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad);
void fill_tm_caps(ibv_tm_caps* caps);
void free_tm_srq(Srq* srq);  // destroy_srq: the TM state, if any

// Thread and parent domains (verbs/domains.cpp): ibv_alloc_td(3), ibv_alloc_parent_domain(3).
ibv_td* alloc_td(Context* ctx, const ibv_td_init_attr* attr);
int dealloc_td(Td* td);
ibv_pd* alloc_parent_domain(Context* ctx, const ibv_parent_domain_init_attr* attr);
// Gives a new receive queue its ring from the parent domain's allocator, when `pd` is a
// parent domain with one; false (errno set) when that allocator failed.
bool queue_memory_for(Pd* pd, RingQueue<RecvWqe>* rq, uint64_t resource_type, size_t n);
// The queue memory of parent domain `pd`, or nullptr (a plain PD, or no allocator): for
// other queues a provider allocates (an extended CQ's ring, resource kResourceCq).
QueueMemory* queue_memory_of(Pd* pd);
void free_parent_domain(Pd* pd);  // ibv_dealloc_pd of a parent domain without users

ibv_ah* create_ah(Pd* pd, const ibv_ah_attr* attr);

// Memory windows (verbs/mw.cpp)
ibv_mw* alloc_mw(Pd* pd, ibv_mw_type type);
int dealloc_mw(Mw* mw);
// ibv_bind_mw(3) (type 1): posts IBV_WR_BIND_MW with the next key (ibv_inc_rkey) and
// writes that key to mw->ibv.rkey at once, as the man page says.
int bind_mw(Qp* qp, Mw* mw, const ibv_mw_bind* bind);
// Fills the bind of an IBV_WR_BIND_MW WQE (ibv_post_send, ibv_bind_mw, ibv_wr_bind_mw):
// EINVAL when `mw` is not a window of qp's context. The rules are checked when it runs.
int fill_bind_wqe(Qp* qp, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info& info, SendWqe* w);
// Queues (or runs) one WQE built by the caller, as ibv_post_send does with the WQEs it
// builds: EINVAL before RTS, ENOMEM when the send queue is full.
int post_wqe(Qp* qp, SendWqe&& w);
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
// How ibv_poll_cq and ibv_start_poll both begin: what waits outside the ring (receive
// windows; the wire, when the ring is empty) becomes completions in it. Returns the tail.
uint64_t cq_gather(Cq* cq);
// After the ibv_cq_ex poll API took completions: an early event (cq.cpp) of a CQ polled
// empty is taken back.
void cq_polled(Cq* cq);

// Extended CQs (verbs/cq_ex.cpp): the same Cq, its ring, events and overrun, read through
// the ibv_cq_ex poll API as well as ibv_poll_cq.
ibv_cq_ex* create_cq_ex(Context* ctx, const ibv_cq_init_attr_ex* attr);
// CQ moderation's limits (ibv_query_device_ex cq_mod_caps), mlx5's: the CQ context's
// cq_max_count (16 bits) and cq_period (12 bits, microseconds).
inline constexpr uint16_t kMaxCqModerationCount = 0xffff;
inline constexpr uint16_t kMaxCqModerationPeriod = 0xfff;
int modify_cq(Cq* cq, const ibv_modify_cq_attr* attr);  // IBV_CQ_ATTR_MODERATE; 0 or errno
// ibv_query_rt_values_ex: the completion clock now (IBV_VALUES_MASK_RAW_CLOCK).
int query_rt_values(ibv_values_ex* values);
// What ibv_query_device_ex reports about extended CQs (timestamps, moderation).
void fill_cq_ex_attr(ibv_device_attr_ex* attr);

// SRQ
ibv_srq* create_srq(Pd* pd, ibv_srq_init_attr* attr);
// create_srq from ibv_create_srq_ex's attributes (context, caps), the caps written back.
ibv_srq* create_srq_from_ex(Pd* pd, ibv_srq_init_attr_ex* ex);
int modify_srq(Srq* srq, ibv_srq_attr* attr, int mask);
int query_srq(Srq* srq, ibv_srq_attr* attr);
int destroy_srq(Srq* srq);
int post_srq_recv(Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
// ibv_create_srq_ex: a basic SRQ (XRC and tag-matching SRQs: EOPNOTSUPP).
ibv_srq* create_srq_ex(Context* ctx, ibv_srq_init_attr_ex* attr);

// XRC (verbs/xrc.cpp): domains, XRC SRQs, TGT QPs and their opened handles.
ibv_xrcd* open_xrcd(Context* ctx, const ibv_xrcd_init_attr* attr);
int close_xrcd(Xrcd* xrcd);
void close_xrcd_domain(const std::shared_ptr<XrcDomain>& domain);
void hold_xrcd_domain(const std::shared_ptr<XrcDomain>& domain);
ibv_srq* create_xrc_srq(Context* ctx, ibv_srq_init_attr_ex* attr);
void forget_xrc_srq(Srq* srq);  // destroy_srq: no message can reach it after this
int get_srq_num(Srq* srq, uint32_t* num);
ibv_qp* create_xrc_tgt_qp(Context* ctx, ibv_qp_init_attr_ex* attr);
ibv_qp* open_xrc_qp(Context* ctx, ibv_qp_open_attr* attr);
// Destroying a TGT QP handle: true when it was the QP's last (the QP goes now).
bool release_tgt_handle(Qp* handle);
void free_opened_handle(Qp* handle);
void free_tgt_resources(Context* ctx);  // close_context
// destroy_qp, after freeing a TGT QP whose creator handle had gone (Qp::xrc_creator_gone):
// the domain it held, and its context if that was closed meanwhile.
// An adopted QP's (its number in another process's slot) lets that slot go with the last.
void tgt_qp_destroyed(Context* ctx, const std::shared_ptr<XrcDomain>& domain, uint32_t qpn);
// A handle on a TGT QP of another process (Qp::xrc_remote_slot): through its agent.
int modify_remote_tgt(Qp* handle, ibv_qp_attr* attr, int mask);
int query_remote_tgt(Qp* handle, ibv_qp_attr* attr, ibv_qp_init_attr* init);
void destroy_remote_tgt(Qp* handle);

// QP
// qpn_wanted: that number (an adopted XRC TGT QP's, verbs/xrc.cpp), else a new one.
ibv_qp* create_qp(Pd* pd, ibv_qp_init_attr* attr, uint32_t qpn_wanted = 0);
int modify_qp(Qp* qp, ibv_qp_attr* attr, int mask);
int query_qp(Qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
int destroy_qp(Qp* qp);
// The destroy itself, once nothing holds the QP (a TGT QP's last handle gone).
int destroy_qp_now(Qp* qp);
// Makes a fresh UD QP this process's QP1 agent (IBV_QP_CREATE_SOURCE_QPN with source 1):
// false when the process has one already.
bool claim_gsi(Qp* qp);
// ibv_attach_mcast / ibv_detach_mcast: 0 or an errno value.
int attach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid);
int detach_mcast(Qp* qp, const ibv_gid* gid, uint16_t lid);
int post_send(Qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
// ibv_create_flow / ibv_destroy_flow on a raw packet QP (flow.cpp): errno / 0 or errno.
ibv_flow* create_flow(Qp* qp, ibv_flow_attr* attr);
int destroy_flow(ibv_flow* flow);
// Receive work queues, indirection tables and RSS QPs (wq.cpp); create_*: errno on NULL.
ibv_wq* create_wq(Context* ctx, ibv_wq_init_attr* attr);
int modify_wq(Wq* wq, ibv_wq_attr* attr);
int destroy_wq(Wq* wq);
ibv_rwq_ind_table* create_rwq_ind_table(Context* ctx, ibv_rwq_ind_table_init_attr* attr);
int destroy_rwq_ind_table(RwqIndTable* table);
// ibv_create_qp_ex with IBV_QP_INIT_ATTR_RX_HASH (and IND_TABLE): a receive-only raw QP.
ibv_qp* create_rss_qp(Context* ctx, ibv_qp_init_attr_ex* ex);
void forget_rss(Qp* qp);  // on destroy: its table is free again
// The hidden PD and CQ of a context (XRC TGT QPs, RSS QPs: QPs a CQ of the application's
// does not serve), made once (xrc.cpp).
bool ensure_tgt_resources(Context* ctx);
// The extended QP API (ibv_wr_post(3), qp_ex.cpp): which send_ops_flags this device can
// give a QP of `type` (EOPNOTSUPP for the rest), and the wr_* table of a QP created with them.
int check_send_ops_flags(ibv_qp_type type, uint64_t flags);
void install_qp_ex(Qp* qp, uint64_t send_ops_flags);
// wr_complete: posts the batch qp->ex built, all of it or, on error, none; 0 or an errno.
int post_send_batch(Qp* qp);
int post_recv(Qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
// Adds what a QP being destroyed posted through each send API to the process's tally
// (SOFTVERBS_API_COUNTS, send_api_tally.cpp).
void tally_destroyed_qp(const Qp& qp);
// Checks an ibv_modify_qp attribute mask against the IBA transition table (EINVAL if wrong).
int check_modify_mask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask);



}  // namespace softverbs
