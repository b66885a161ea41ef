// rdma_cm over softverbs: event channels, ids and the per-process connection service.
// How it works and why is in docs/decisions/0004-rdma-cm.md. In short: every bound id holds
// an abstract AF_UNIX SOCK_SEQPACKET socket named after (state dir, port space, port), so
// port numbers are host-wide and need no daemon; a connect is a connect(2) to the
// listener's name, and the CM messages (cm/protocol.hpp) travel on that socket pair. One
// service thread per process sleeps in epoll_wait on all of them and turns messages into
// rdma_cm events. Everything here is under one mutex (cm::g_mu): connection setup is not a
// fast path, and one lock keeps ids, sockets and events consistent.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "cm/protocol.hpp"
#include "core/event_queue.hpp"

namespace softverbs::cm {

inline constexpr uint32_t kChannelMagic = 0x53564543;  // "SVEC"
inline constexpr uint32_t kIdMagic = 0x53564944;       // "SVID"
inline constexpr uint32_t kEventMagic = 0x53564556;    // "SVEV"
inline constexpr uint32_t kDeadMagic = 0xdeadc0de;

struct Id;

// What happens to the id's QP when the application takes the event. As in rdma-core, the
// QP is touched only then, in the application's thread: the application owns the QP and
// may destroy it (even with plain ibv_destroy_qp) at any time the CM is not running a call
// of its, so the service thread must never touch it.
enum class QpStep : uint8_t {
  None,
  ToError,  // REJECTED: the QP goes to ERR
  Connect,  // REP for an id with a QP: RTR, RTS, RTU sent; ESTABLISHED or CONNECT_ERROR
};

// One event as handed to the application; its private data lives with it until acked.
struct Event {
  rdma_cm_event ev;  // first: the application's pointer is &ev
  uint32_t magic;
  Id* owner;         // the id whose ack count this event holds
  QpStep step;
  uint8_t private_data[kMaxPrivate];
};

struct Channel {
  rdma_event_channel ch;  // first: applications see {fd}
  uint32_t magic = kChannelMagic;
  EventQueue<Event*> events;
  int ids = 0;             // under g_mu: ids whose events come here
  bool destroyed = false;  // under g_mu: the application destroyed it while ids remained
  static Channel* from(rdma_event_channel* c);
};

enum class IdState {
  Idle,
  Bound,          // has a port (bind_addr, or implicitly by resolve_addr)
  AddrQuery,      // resolve_addr to another host waits for the neighbour (ARP/ND)
  AddrResolved,
  RouteResolved,
  Listening,
  Connecting,     // REQ (or SIDR REQ) sent
  RepReceived,    // REP arrived: QP-less ids wait for rdma_establish, others for the event's take
  ReqReceived,    // passive side: CONNECT_REQUEST given, waiting for accept/reject
  Accepting,      // REP sent, waiting for RTU
  Connected,
  Disconnecting,  // DREQ sent, waiting for DREP
  Disconnected,
  Failed,
};

struct Id {
  rdma_cm_id id{};  // first: applications see this
  uint32_t magic = kIdMagic;
  // Everything below is under g_mu.
  Channel* channel = nullptr;
  bool sync = false;          // created without a channel: owns `channel`, calls block
  IdState state = IdState::Idle;
  int sock = -1;              // bound name, listening socket, or one end of a connection
  bool watched = false;       // `sock` is in the service's epoll set
  uint16_t port = 0;          // host order, once bound
  Id* listener = nullptr;     // passive ids: the listener whose request made them
  int sgid_index = -1;        // set wherever id.verbs is (bound to an address or resolved)
  ibv_gid sgid{};
  uint32_t psn = 0;           // our starting receive PSN (UD: send PSN), sent in REQ/REP
  uint32_t local_qpn = 0;     // QP-less ids: the QPN the application named
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7;
  uint8_t tos = 0, ack_timeout = 14;
  bool disconnect_reported = false;
  // Taking a REP failed (CONNECT_ERROR given): the REJECTED or DISCONNECTED that may
  // follow is not reported, as in rdma-core.
  bool connect_error = false;
  bool removal_reported = false;  // DEVICE_REMOVAL given
  // What the peer told us (REQ / REP / SIDR REP).
  bool have_remote = false;
  uint32_t remote_qpn = 0, remote_psn = 0, remote_qkey = 0;
  ibv_gid remote_gid{};
  uint8_t remote_responder_resources = 0, remote_initiator_depth = 0;
  uint8_t remote_retry_count = 7, remote_rnr_retry_count = 7;
  ibv_ece local_ece{}, remote_ece{};
  // CQs and channels rdma_create_qp made (destroyed with the QP).
  bool own_cqs = false;
  // rdma_create_ep on a passive id: what rdma_get_request gives each new id.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  ibv_sa_path_rec path{};     // route.path_rec points here once the route is resolved
  // Between hosts (cm/remote.cpp): the peer is another host's, reached by the IB CM over
  // QP1; `conn` is the CM's connection (0: none), `path_mtu` the path's (0: the device's).
  bool remote = false;
  uint32_t conn = 0;
  uint8_t path_mtu = 0;
  uint64_t sidr_service_id = 0;
  // Multicast groups joined (rdma_join_multicast), each attached to the QP unless send-only.
  struct Group {
    sockaddr_storage addr;
    ibv_gid mgid;
    bool attached;
  };
  std::vector<Group> groups;
  // Events handed out and not acked yet (destroy waits for 0). Atomic: counted under the
  // channel's queue lock, which is taken after g_mu, never before.
  std::atomic<int> unacked{0};
  // The service's bookkeeping (cm/service.cpp), kept here so that none of it needs a scan
  // over every id or socket of the process.
  bool listened = false;          // was a listener: ids it made may point back at it
  int pending_requests = 0;       // listener: accepted sockets whose request has not come
  bool in_timewait = false;       // in the service's time-wait queue, due at timewait_at
  std::chrono::steady_clock::time_point timewait_at{};
  bool connect_queued = false;    // its REQ waits for room in the listener's backlog
  static Id* from(rdma_cm_id* i);
};

extern std::mutex g_mu;

// ---- device (cm/device.cpp)
// The process-wide soft device context (what id->verbs always points to), or nullptr.
ibv_context* device_context();
ibv_pd* device_pd();
ibv_xrcd* device_xrcd();  // the XRC domain of XRC ids (nullptr if it cannot be opened)
const ibv_device_attr& device_attr();
enum ibv_mtu device_mtu();
// The GID index of a local address (any port), -1 if the address is not ours; a wildcard
// address gives -2.
int gid_index_of(const sockaddr* addr);
// The GID index of 127.0.0.1: "this host" for wildcard destinations. Not always 0: the
// interfaces' IPv4 addresses come first (src/wire/host.hpp).
int loopback_gid_index();
bool gid_at(int index, ibv_gid* out);
uint16_t port_of(const sockaddr* addr);  // host order
// A multicast IP address (224.0.0.0/4, ff00::/8), and the GID of its group on RoCE v2
// (IPv4-mapped for IPv4, the address itself for IPv6).
bool is_multicast_addr(const sockaddr* addr);
ibv_gid multicast_gid(const sockaddr* addr);
bool same_ip(const sockaddr* a, const sockaddr* b);
void set_port(sockaddr_storage* addr, uint16_t port);
socklen_t addr_len(const sockaddr* addr);

// ---- ids, sockets and the service (cm/service.cpp)
Id* new_id(Channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type);
// Binds id (under g_mu) to `addr` (port 0: any free one). Returns 0 or an errno value.
int bind_locked(Id* id, const sockaddr* addr);
int listen_locked(Id* id, int backlog);
int connect_locked(Id* id, const rdma_conn_param* param);
int accept_locked(Id* id, const rdma_conn_param* param);
int reject_locked(Id* id, const void* data, uint8_t len, int reason);
int establish_locked(Id* id);
int disconnect_locked(Id* id);
// Moves the QP through INIT (and RTR/RTS for UD) as rdma_create_qp does.
int init_qp_locked(Id* id, ibv_qp* qp);
int qp_attr_locked(Id* id, ibv_qp_attr* attr, int* mask);
void queue_event(Id* id, rdma_cm_event_type type, int status, const Msg* m = nullptr,
                 QpStep step = QpStep::None);
// The parts of queue_event, for events not built from a message (MULTICAST_JOIN).
Event* new_event(Id* id, rdma_cm_event_type type, int status);
void push_event(Id* id, Event* e);
// Stops watching and closes the id's socket; queued events of the id are dropped.
void detach_locked(Id* id);
// Blocks until every event handed out for id is acked (without g_mu).
void wait_acked(Id* id);
// Waits (unless the channel's fd is O_NONBLOCK) for the channel's next event, counted as
// handed out to its id, after its QP step (in the caller's thread). 0, or -1 with errno.
int take_event(Channel* ch, Event** out);
void ack_event(Event* e);
// Acks the event a synchronous id keeps in id->event, if any.
void drop_kept_event(Id* id);
// Synchronous ids: waits for the id's next event, keeps it in id->event (acking the one
// kept before). Returns 0, or -1 with errno from the event's status.
int complete_sync(Id* id);
Channel* new_channel();
// Frees the channel and its queued events, or, while ids still use it, marks it for the
// last of them (under g_mu).
void free_channel(Channel* ch);
// The id stops using its channel; a synchronous id's own channel goes with it.
void release_channel_locked(Id* id);

// ---- service internals other files use (cm/service.cpp)
void kick_service();  // the service recomputes its timeout
const std::set<Id*>& all_ids_locked();
// DISCONNECTED for an id whose time-wait the IB CM runs (TIMEWAIT_EXIT comes from it).
void report_disconnect_remote(Id* id);

// ---- between hosts: the IB CM over the QP1 agent (cm/remote.cpp, docs/decisions/0007)
int gid_index_of_gid(const ibv_gid& gid);
// The path MTU (enum ibv_mtu) of the interface holding `local`.
uint8_t path_mtu_for(const ibv_gid& local);
// The source address the kernel's routing table picks for `dst` (port 0): 0 or an errno
// value (EHOSTUNREACH, ENETUNREACH, EADDRNOTAVAIL when it is not one of the device's).
int resolve_remote_locked(Id* id, const sockaddr* dst, sockaddr_storage* source);
// The rest of rdma_resolve_addr to another host (the agent started, the id bound): the
// next hop's neighbour must be valid before ADDR_RESOLVED, as the kernel's ib_addr wants.
// Valid now: ADDR_RESOLVED queued. Else the kernel is made to resolve it, the id waits in
// AddrQuery and the service's timers poll it: ADDR_RESOLVED, or ADDR_ERROR -ETIMEDOUT
// after timeout_ms. Returns 0, or an errno value for rdma_resolve_addr to fail with (no
// route).
int remote_resolve_addr_locked(Id* id, const sockaddr_storage& source, int timeout_ms);
// Starts the process's MAD agent (QP1 and the IB CM) once; 0 or an errno value.
int remote_start_locked();
int remote_fd_locked();          // the agent's completion channel, -1 without one
int remote_timeout_ms_locked();  // to the CM's next timer, -1 none
void remote_service_locked();    // MADs that came, timers that are due
int remote_connect_locked(Id* id, const rdma_conn_param* param);
int remote_accept_locked(Id* id, const rdma_conn_param* param, uint8_t len);
int remote_reject_locked(Id* id, const void* data, uint8_t len, int reason);
int remote_rtu_locked(Id* id);
void remote_reject_rep_locked(Id* id);
int remote_disconnect_locked(Id* id);
// rdma_notify between hosts: COMM_EST establishes a passive id whose RTU has not come
// (Cm::establish); PATH_MIG is 0 once established (no alternate path to move to). 0 or an
// errno value (EINVAL, EISCONN), as the kernel's ib_cm_notify.
int remote_notify_locked(Id* id, ibv_event_type event);
void remote_destroy_locked(Id* id);

}  // namespace softverbs::cm
