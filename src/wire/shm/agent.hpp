// The agent: one thread per process that serves requests from other processes of this
// host for the QPs of this process. It sleeps in poll(2) on its sockets (never spins),
// runs the responder on the target QP and answers; payload moves directly between the
// requester's buffers and ours with cross-memory attach, so no copy goes through the socket.
#pragma once

#include "wire/shm/arena.hpp"
#include "wire/transport.hpp"

namespace softverbs::wire {

// What the engine does for the agent besides responding (wire::EngineHooks), on QPs of this
// process: the receive windows (see window.hpp) and their completions.
struct ShmHooks {
  // Opens the receive window of `target` for the peer QP `peer_qpn` in process `peer_pid`
  // (as the kernel names the process that asked): its arena offset, or 0.
  uint64_t (*open_window)(Qp* target, uint32_t peer_qpn, pid_t peer_pid) = nullptr;
  // Turns what a peer left in `target`'s receive window into completions now (the peer
  // saw the receive CQ armed: a blocked ibv_get_cq_event must hear of them).
  void (*drain)(Qp* target) = nullptr;
  // The fd that wakes `target`'s receive CQ's completion channel, or -1 (no channel).
  int (*wake_fd)(Qp* target) = nullptr;
  // Holds completions back while on (this thread), adds them when turned off.
  void (*defer_completions)(bool on) = nullptr;
};

// Starts the agent of this process (once, and again in a forked child), after set_engine.
void start_agent(const ShmHooks& hooks);
// Sends `req` to the agent of `slot` and waits for its answer. A peer that is gone, or
// does not answer within the deadline, is NoResponse.
Reply agent_call(int slot, const Request& req);
// Asks the agent of `slot` to retry the send queue of QP `qpn` (no answer expected).
void agent_kick(int slot, uint32_t qpn);
// Asks the agent of `slot` for the receive window of its QP `dst_qpn` for our QP
// `src_qpn`: maps that process's arena here and returns the window's offset, or 0.
// *wake_fd gets an fd that wakes the target's completion channel (or -1); ours to close.
// Each answer (to connecting's probe, to the ask) is waited for at most `wait_ms` (0: the
// agent's usual deadline, seconds); one that does not come drops the connection.
uint64_t agent_open_window(int slot, uint32_t src_qpn, uint32_t dst_qpn, PeerArena* arena,
                           int* wake_fd, int wait_ms = 0);
// True when SOFTVERBS_NO_CMA asks for payload through sockets instead of cross-memory attach.
bool cross_memory_disabled();
// Asks the agent of `slot` to drain the receive window of its QP `dst_qpn` (no answer).
void agent_drain(int slot, uint32_t dst_qpn);

// XRC TGT QPs of this process opened by other processes of their domain (ibv_open_qp(3)),
// and those processes' handles on them. verbs/xrc.cpp installs these; the agent calls them
// with the asker's pid as the kernel names it (SO_PEERCRED) and, for Open, the registry
// slot it says is its own (checked against that pid). Each returns 0 or an errno value.
struct XrcHooks {
  int (*open)(uint32_t qpn, uint64_t dev, uint64_t ino, pid_t pid, int slot) = nullptr;
  int (*modify)(uint32_t qpn, ibv_qp_attr* attr, int mask, pid_t pid) = nullptr;
  int (*query)(uint32_t qpn, ibv_qp_attr* attr, pid_t pid) = nullptr;
  int (*close)(uint32_t qpn, pid_t pid) = nullptr;
  // At an opener: TGT QP `qpn` of the process in `slot` raised async event `type`.
  void (*event)(uint32_t qpn, int type, int slot) = nullptr;
  // At a holder: process `pid`, ending, hands its TGT QP over (the snapshot read from its
  // memory, unchecked); then, once it stopped serving its slot, commits `slot` (takes the
  // slot and serves it), or aborts it (drops what it adopted of it).
  int (*adopt)(const struct XrcSnapshot& snap, pid_t pid) = nullptr;
  int (*commit)(int slot, pid_t pid) = nullptr;
  int (*abort)(int slot, pid_t pid) = nullptr;
  // At the holder that took the slot of a killed process: process `pid` (in `slot`) holds
  // `handles` handles on TGT QP `qpn` of domain (dev, ino), which it rebuilt (or builds).
  int (*rejoin)(uint32_t qpn, uint64_t dev, uint64_t ino, pid_t pid, int slot, int handles) = nullptr;
};

// What a process that ends hands over of a TGT QP that other processes hold (verbs/xrc.cpp).
// Everything in it comes from another process: the adopter checks it before use.
inline constexpr uint32_t kXrcSnapshotMagic = 0x58534e50;  // "XSNP"
inline constexpr int kMaxXrcSnapshotHolders = 64;
inline constexpr int kMaxXrcSnapshotAtomics = 128;
struct XrcSnapshot {
  uint32_t magic;
  uint32_t qpn;
  uint64_t dev, ino;  // the domain's file
  ibv_qp_attr attr;   // as ibv_query_qp reads it
  uint32_t comm_est;  // 1: Communication Established was raised already (not again)
  uint32_t nholders;
  struct {
    int32_t pid;
    int32_t slot;
  } holders[kMaxXrcSnapshotHolders];  // one entry per handle, as the host counts them
  // RoCE v2: the responder's place in its connection (has_link 0: none), and the atomic
  // replies it answers duplicates from (the device's max_qp_rd_atom at most).
  uint32_t has_link;
  uint32_t epsn;
  uint32_t msn;
  uint32_t natomic;
  struct {
    uint32_t psn;
    uint32_t reserved;
    uint64_t orig;
  } atomics[kMaxXrcSnapshotAtomics];
};
void set_xrc_hooks(const XrcHooks& hooks);
enum class XrcOp : uint32_t { Open = 6, Modify = 7, Query = 8, Close = 9 };
// Asks the agent of `slot` (the TGT QP's process): 0 or an errno value (ENXIO: no answer).
// Modify sends *attr, Query fills it (both through cross-memory attach); Open names the
// domain by (dev, ino).
int agent_xrc(int slot, XrcOp op, uint32_t qpn, uint64_t dev, uint64_t ino, ibv_qp_attr* attr,
              int mask);
// The hand-over (verbs/xrc.cpp): the ending process stops its agent for good (its address
// is free then; true once the thread has stopped), asks the holder in `slot` to adopt each
// QP, then to commit the adopted slot (the holder takes it in the registry and serves its
// agent address) or, when one QP could not be adopted, to abort it.
bool stop_agent();
int agent_xrc_adopt(int slot, const XrcSnapshot* snap);
int agent_xrc_commit(int slot, int adopted_slot, bool abort = false);
// After a kill: our `handles` handles on TGT QP `qpn` count at the holder that took the
// QP's slot (0 or an errno value).
int agent_xrc_rejoin(int slot, uint32_t qpn, uint64_t dev, uint64_t ino, int handles);
// At the adopter: a thread like the agent's on `slot`'s address; false if it is taken.
bool serve_adopted_slot(int slot);
// ... until no TGT QP of that slot is left here (`release`: the thread gives the slot back
// to the registry once the address is free), or we hand it on as we end (`wait`: until the
// thread has stopped and the address is free).
void stop_serving_slot(int slot, bool wait, bool release);
// XRC SRQs of another process (same host): a message our TGT QP `tgt.tgt_qpn` took for
// XRC SRQ req.xrc_srqn goes to that process's delivery thread (started by
// start_xrc_delivery when a process opens an XRC domain), with its payload (or room for
// READ data, an atomic's result) in req.local of this process. False when that process
// cannot be reached (gone, or never opened a domain): the SRQ number names nothing.
// *tgt_error: kXrcTgtFine, or the event (-1: none) our TGT QP goes to ERR with.
void start_xrc_delivery();
bool agent_xrc_deliver(int slot, const Request& req, const XrcTarget& tgt, Reply* out,
                       int* tgt_error);
// Tells the opener in `slot` that TGT QP `qpn` of ours raised `type` (no answer).
void agent_xrc_event(int slot, uint32_t qpn, int type);

// ibv_import_pd(3) / ibv_import_mr(3) across processes (verbs/import.cpp). The importer
// names the exporter's context by the file (dev, ino) of its cmd_fd, which it must hold.
enum class ImportOp : uint32_t {
  Pd = 0,         // *value: the PD's token (what its MRs' published entries carry)
  Mr = 1,         // *value: the offset of the exporter's published MR table; maps its arena
  DeregMr = 2,    // the importer deregistered its import: the MR goes for everyone
  DeallocPd = 3,  // the same for a PD (EBUSY while anything of the exporter's uses it)
};
struct ImportHooks {
  // At the exporter: answers `op` about `handle` for process `pid` (kernel-named): 0 or an
  // errno value.
  int (*serve)(ImportOp op, uint64_t dev, uint64_t ino, uint32_t handle, pid_t pid,
               uint64_t* value) = nullptr;
};
void set_import_hooks(const ImportHooks& hooks);
// Asks the agent of `slot`: 0 or an errno value (ENXIO: no answer). For ImportOp::Mr,
// *arena is the exporter's arena mapped here (unmap_peer_arena when done).
int agent_import(int slot, ImportOp op, uint64_t dev, uint64_t ino, uint32_t handle,
                 uint64_t* value, PeerArena* arena);

}  // namespace softverbs::wire
