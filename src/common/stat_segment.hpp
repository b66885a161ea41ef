// The stat segment: a small shared-memory file each softverbs process publishes in
// $STATE_DIR/stat/<pid>, listing its verbs objects, for `softverbs stat` (tools/stat.cpp).
// The library writes a record when an object is created, modified or destroyed (cold paths
// only); the data path writes nothing here. What changes on the data path (ring indices,
// arm state, QP state) stays in the object, and the record says where: the reader copies
// it with process_vm_readv, which needs nothing from the target (a process stopped under a
// debugger shows as well as a running one). The reader trusts nothing it finds: the
// process may have died mid-write or the file may hold garbage.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softverbs::stat {

inline constexpr uint64_t kMagic = 0x3130544154535653;  // "SVSTAT01", little-endian
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMaxRecords = 4096;  // a process with more objects: `dropped` counts them

enum Kind : uint32_t {
  kFree = 0, kContext, kPd, kMr, kCq, kChannel, kQp, kSrq,
  kMw, kAh, kXrcd, kDm,  // appended: a reader skips kinds it does not know (>= its kKinds)
  kTd,    // a thread domain
  kRoce,  // the RoCE v2 link of a QP: its live PSNs and the WQEs it holds in flight
  kKinds
};

// Arm states as CQ records report them (the library's wire::ArmWord, asserted equal).
enum Arm : int32_t { kArmNone = 0, kArmSolicited = 1, kArmNext = 2 };

// Where the hot fields of each kind are, as indexes into Record::hot (offsets from
// Record::object; 0 = not published). Sizes are what the reader reads there.
enum CtxHot { kCtxAsyncQueue };  // std::deque of queued async events (elem_size)
enum CqHot {
  kCqHead,           // uint64: completions ever consumed
  kCqTail,           // uint64: completions ever produced
  kCqArmed,          // int32: Arm
  kCqCompReported,   // uint32: ibv_get_cq_event handed out
  kCqCompAcked,      // uint32: ibv_ack_cq_events acked
  kCqCapacity,       // uint64: ring capacity (ibv_resize_cq changes it)
  kCqInError,        // uint8: overrun
  kCqAsyncReported,  // uint32
  kCqAsyncAcked,     // uint32
};
enum ChanHot { kChanQueue };  // std::deque of queued CQ events (elem_size)
enum QpHot {
  kQpState,           // int32: ibv_qp_state
  kQpSendQueue,       // std::deque of send WQEs not completed (elem_size)
  kQpRecvHead,        // uint64: receive ring, consumed
  kQpRecvTail,        // uint64: receive ring, posted
  kQpEventsReported,  // uint32: async events handed out
  kQpEventsAcked,     // uint32
  // Its receive window (a same-host peer's small SENDs wait there until the next poll):
  kQpWindowSlots,     // uint64: address of slot 0 (0: no window); QpInfo has their count, size
  kQpWindowHead,      // uint64: messages taken from it (message n is in slot n % count,
                      // whose first uint64 reads n + 1 once it is there)
  kQpPeerWindow,      // PeerWindowCounts: as a requester, its use of the peer's window
};
// A same-host requester QP and its peer's receive window (kQpPeerWindow): when the window
// was opened, and why SENDs went through the target's agent (a wake-up of a thread that
// may share the target's CPU) instead. Counts since the QP was created, written by the
// posting thread only (under its sq_mu), read racily by the reader.
struct PeerWindowCounts {
  uint64_t opened_at_rts;   // windows opened as ibv_modify_qp took the QP to RTS
  uint64_t opened_at_post;  // windows opened at a post (the first one, or after one closed)
  uint64_t open_failed;     // asks that got no window (the target not at RTR yet, gone, ...)
  uint64_t ring_waited;     // SENDs that found the ring full and got room by waiting briefly
  // SENDs through the target's agent, by why:
  uint64_t agent_no_window;   // no window open (or being asked for again later)
  uint64_t agent_ring_full;   // its 32 slots still full after the brief wait
  uint64_t agent_no_receive;  // no receive posted: the agent answers RNR
  uint64_t agent_too_small;   // the next receive is too small: the agent answers the error
  uint64_t agent_srq;         // an SRQ: no receive to claim, or one given back not yet taken
  uint64_t agent_other;       // placement given up (a key, pages we cannot reach, ...)
};
enum SrqHot { kSrqHead, kSrqTail, kSrqLimit, kSrqMaxWr };  // uint64, uint64, uint32, uint32
// A window's binding changes on the data path (bind and invalidate WRs): read live.
enum MwHot {
  kMwRkey,    // uint32: the key it answers to now
  kMwMr,      // uint64: our Mr object it is bound to (matches an MR record's `object`), 0: none
  kMwAddr,    // uint64
  kMwLength,  // uint64
  kMwAccess,  // uint32
  kMwQpn,     // uint32: type 2, the QP it is bound to
};
enum XrcdHot { kXrcdUsers };  // int32: SRQs and TGT QPs using the handle
enum TdHot { kTdUsers };  // int32: parent domains using it
// A RoCE v2 link changes its PSNs with every packet: read live, never published.
enum RoceHot {
  kRoceNextPsn,      // uint32: the first PSN of the next WQE the requester sends
  kRoceExpectedPsn,  // uint32: the PSN the responder expects next
  kRoceSendQueue,    // std::deque of WQEs sent or to send and not yet acknowledged (elem_size)
};
inline constexpr int kMaxHot = 12;

struct CtxInfo {
  char device[64];
  int32_t async_fd;
  int32_t async_level_fd;  // eventfds whose count says whether async_fd is readable
  int32_t async_wake_fd;
};
struct PdInfo {
  uint32_t handle;
  uint32_t parent_domain;  // 1: an ibv_alloc_parent_domain
  uint64_t protection;     // the PD it extends (parent domain), else its own handle
  uint32_t imported;       // 1: ibv_import_pd
  uint32_t reserved;
};
struct MrInfo {
  uint64_t pd;
  uint64_t addr;
  uint64_t length;
  uint64_t iova;
  uint32_t lkey;
  uint32_t rkey;
  uint32_t access;
  uint32_t imported;  // 1: ibv_import_mr (addr is NULL then, as ibv_import_mr(3) says)
};
struct CqInfo {
  uint64_t channel;  // ibv_comp_channel*, 0: none
};
struct ChanInfo {
  int32_t fd;
  int32_t level_fd;  // eventfd: 1 while events are queued
  int32_t wake_fd;   // eventfd: peers' wake-ups not yet taken
};
struct QpInfo {
  uint64_t pd, send_cq, recv_cq, srq;
  uint32_t qp_num;
  uint32_t type;  // ibv_qp_type
  uint32_t port;
  uint32_t sq_psn, rq_psn;  // as last set by ibv_modify_qp
  uint32_t dest_qp_num;
  uint8_t dgid[16];
  int32_t peer_pid;  // the process of a same-host peer, once in RTR; 0 otherwise
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
  uint32_t qkey;
  uint32_t access;
  uint8_t path_mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic,
      max_dest_rd_atomic, sq_sig_all;
  uint32_t window_slots, window_slot_size;  // of the receive window (kQpWindowSlots)
};
struct SrqInfo {
  uint64_t pd;
  uint32_t max_sge;
  uint32_t srq_num;  // XRC SRQ number, else 0
  uint32_t type;     // ibv_srq_type
};

struct MwInfo {
  uint64_t pd;
  uint32_t type;  // ibv_mw_type: 1 or 2
};
struct AhInfo {
  uint64_t pd;
  uint8_t dgid[16];
  uint16_t dlid;
  uint8_t is_global, sgid_index, port, sl, hop_limit, traffic_class;
  uint32_t flow_label;
};
struct XrcdInfo {
  uint64_t dev, ino;  // of the file it was opened on (shared), else 0
  uint32_t shared;    // 1: opened on a file, other handles and processes may share it
  char path[84];      // that file, as /proc/self/fd named it at ibv_open_xrcd ("" if none)
};
struct DmInfo {
  uint64_t length;
  uint64_t base;    // where the library keeps it (the application reaches it by copies only)
  uint32_t handle;  // ibv_dm.handle, for ibv_import_dm
  uint32_t imported;
};

struct TdInfo {
  uint64_t reserved;
};
struct RoceInfo {
  uint64_t qp;  // the QP's handle (matches a QP record's `handle`)
};

struct Record {
  uint32_t seq;               // odd while the library writes the record (atomic_ref there)
  uint32_t kind;              // Kind
  uint64_t handle;            // the C handle the application holds (ibv_qp* ...)
  uint64_t context;           // its ibv_context*
  uint64_t object;            // our object: where the hot fields and its tag are
  uint32_t object_size;       // every hot field lies inside [object, object + object_size)
  uint32_t magic_offset;      // the object's tag: it must read `magic` while the object lives
  uint32_t magic;
  uint32_t elem_size;         // of the deque a hot field names
  uint32_t hot[kMaxHot];      // offsets from `object` (0: none)
  union {
    CtxInfo ctx;
    PdInfo pd;
    MrInfo mr;
    CqInfo cq;
    ChanInfo chan;
    QpInfo qp;
    SrqInfo srq;
    MwInfo mw;
    AhInfo ah;
    XrcdInfo xrcd;
    DmInfo dm;
    TdInfo td;
    RoceInfo roce;
  } u;
};

struct Header {
  uint64_t magic;         // kMagic, written last when the segment is made
  uint32_t version;       // kVersion
  uint32_t header_size;   // sizeof(Header)
  uint32_t record_size;   // sizeof(Record)
  uint32_t record_count;  // records after the header
  int32_t pid;
  uint32_t reserved;
  uint64_t start_time;    // /proc/PID/stat field 22: a reused pid has another
  char exe[64];           // the program's name (/proc/self/comm, then argv[0]'s base name)
  uint32_t used;     // records [0, used) may be in use (atomic_ref in the library)
  uint32_t dropped;  // objects not published (table full)
};

// Plain data: the reader copies it with pread, the writer changes the counters with
// std::atomic_ref.
static_assert(sizeof(Header) % 8 == 0 && sizeof(Record) % 8 == 0);

inline constexpr size_t segment_size() { return sizeof(Header) + sizeof(Record) * kMaxRecords; }

}  // namespace softverbs::stat
