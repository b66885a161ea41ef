// Ids, their sockets, the connection handshake and the service thread that turns the
// peer's messages into events (see cm.hpp and docs/decisions/0004-rdma-cm.md).
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cm/cm.hpp"
#include "cm/random.hpp"
#include "common/cm_port_name.hpp"
#include "common/state_dir.hpp"

namespace softverbs::cm {

std::mutex g_mu;

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// What a socket in the epoll set is: an id's socket, or an accepted connection whose first
// message (the request) has not come yet, for `listener`.
struct Watch {
  Id* id = nullptr;
  Id* listener = nullptr;
};

// A REQ waiting for room in the listener's backlog (connect(2) said EAGAIN). The IB CM
// resends a REQ nobody answered; so do we, with a growing pause, until the time the IB
// CM would give up (rdma-core's CM response timeout and retries, as the kernel's cma.c).
struct QueuedConnect {
  Msg req;
  SteadyTime next;
  SteadyTime give_up;
  std::chrono::microseconds pause;
};
constexpr auto kFirstConnectRetry = std::chrono::microseconds(500);
constexpr auto kLongestConnectRetry = std::chrono::milliseconds(50);
// CMA_CM_RESPONSE_TIMEOUT 20 (4.096 us << 20, ~4.3 s) times (CMA_MAX_CM_RETRIES 15 + 1).
constexpr auto kConnectGiveUp = std::chrono::microseconds((4096ull << 20) / 1000 * 16);

struct Service {
  pid_t owner = 0;  // the process the thread runs in (a forked child starts its own)
  int wake = -1;    // eventfd: the set of sockets changed
  int state = -1;   // inotify on the state directory: device teardown (softverbs inject)
  int epoll = -1;   // every socket the service reads, the three fds above included
  int remote = -1;  // the QP1 agent's fd as last added to the epoll set
  std::string device_token;  // the "device" file's content when last read
  std::unordered_map<int, Watch> watched;  // by fd: the sockets in the epoll set
  std::set<Id*> ids;  // every live id, for listeners going away before their children
  // Disconnected ids waiting out their time-wait (then TIMEWAIT_EXIT), soonest first.
  std::multimap<SteadyTime, Id*> timewait;
  // Connects waiting for room in a listener's backlog, by id and by when to try again.
  std::unordered_map<Id*, QueuedConnect> queued;
  std::multimap<SteadyTime, Id*> queued_next;
  // The thread is in (or about to enter) epoll_wait. A socket closed meanwhile is gone
  // from the set at once; the flag stays for settle_closed_names_locked's sake.
  std::atomic<bool> polling{false};
};
// Never destroyed: the service thread may still run while the process exits.
Service& g_svc = *new Service;

constexpr int kMaxPendingPerListener = 1024;


void wake_service() {
  uint64_t one = 1;
  (void)!write(g_svc.wake, &one, sizeof(one));
}

void run_service();

// Adds fd to the epoll set (or changes what it is there for).
void epoll_add(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(g_svc.epoll, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
    epoll_ctl(g_svc.epoll, EPOLL_CTL_MOD, fd, &ev);
}

// Takes fd out of the epoll set (before it is closed, or handed on).
void epoll_remove(int fd) {
  if (fd >= 0) epoll_ctl(g_svc.epoll, EPOLL_CTL_DEL, fd, nullptr);
}

void start_service_locked() {
  if (g_svc.owner == getpid()) return;
  // After fork the parent's thread is not here: start over, forgetting its sockets (the
  // epoll set is shared with the parent: a new one).
  g_svc.watched.clear();
  g_svc.queued.clear();
  g_svc.queued_next.clear();
  if (g_svc.epoll >= 0) close(g_svc.epoll);
  g_svc.epoll = epoll_create1(EPOLL_CLOEXEC);
  g_svc.remote = -1;
  if (g_svc.wake >= 0) close(g_svc.wake);
  g_svc.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g_svc.state >= 0) close(g_svc.state);
  g_svc.state = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (g_svc.state >= 0 &&
      inotify_add_watch(g_svc.state, state_dir().c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    close(g_svc.state);
    g_svc.state = -1;
  }
  g_svc.device_token = read_state_word("device");  // the baseline: no event for it
  epoll_add(g_svc.wake);
  if (g_svc.state >= 0) epoll_add(g_svc.state);
  g_svc.owner = getpid();
  std::thread(run_service).detach();
}

void watch_locked(Id* id) {
  if (id->watched || id->sock < 0) return;
  start_service_locked();
  id->watched = true;
  g_svc.watched[id->sock] = Watch{id, nullptr};
  epoll_add(id->sock);
}

void unwatch_locked(Id* id) {
  if (!id->watched) return;
  id->watched = false;
  auto it = g_svc.watched.find(id->sock);
  if (it != g_svc.watched.end() && it->second.id == id) g_svc.watched.erase(it);
  epoll_remove(id->sock);
}

// An accepted socket waits for its request (counted against the listener).
void watch_pending_locked(int fd, Id* listener) {
  ++listener->pending_requests;
  g_svc.watched[fd] = Watch{nullptr, listener};
  epoll_add(fd);
}

// The accepted socket's request came (the fd is the new id's now) or it never will.
void forget_pending_locked(int fd, Id* listener) {
  if (listener->pending_requests-- == kMaxPendingPerListener && listener->watched)
    epoll_add(listener->sock);  // accepting again
  auto it = g_svc.watched.find(fd);
  if (it != g_svc.watched.end() && !it->second.id) g_svc.watched.erase(it);
}

void close_sock_locked(Id* id) {
  unwatch_locked(id);
  if (id->sock >= 0) close(id->sock);
  id->sock = -1;
}

bool send_msg(int fd, const Msg& m) {
  return fd >= 0 && send(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(m));
}

Msg msg_from(Id* id, MsgType type, const void* data, uint8_t len) {
  Msg m = make_msg(type);
  m.qpn = (id->id.qp ? id->id.qp->qp_num : id->local_qpn) & 0xffffff;
  m.psn = id->psn;
  std::memcpy(m.gid, id->sgid.raw, 16);
  m.responder_resources = id->responder_resources;
  m.initiator_depth = id->initiator_depth;
  m.retry_count = id->retry_count;
  m.rnr_retry_count = id->rnr_retry_count;
  m.qp_type = static_cast<uint8_t>(id->id.qp_type);
  m.ece_vendor = id->local_ece.vendor_id;
  m.ece_options = id->local_ece.options;
  std::memcpy(&m.src, &id->id.route.addr.src_storage, sizeof(m.src));
  std::memcpy(&m.dst, &id->id.route.addr.dst_storage, sizeof(m.dst));
  if (len) std::memcpy(m.private_data, data, len);
  m.private_len = len;
  return m;
}

void remember_peer(Id* id, const Msg& m) {
  id->have_remote = true;
  id->remote_qpn = m.qpn;
  id->remote_psn = m.psn;
  std::memcpy(id->remote_gid.raw, m.gid, 16);
  id->remote_responder_resources = m.responder_resources;
  id->remote_initiator_depth = m.initiator_depth;
  id->remote_retry_count = m.retry_count;
  id->remote_rnr_retry_count = m.rnr_retry_count;
  id->remote_ece = {m.ece_vendor, m.ece_options, 0};
}

int modify(Id* id, ibv_qp_state state) {
  ibv_qp_attr a{};
  a.qp_state = state;
  int mask = 0;
  if (int err = qp_attr_locked(id, &a, &mask)) return err;
  return ibv_modify_qp(id->id.qp, &a, mask);
}

// RTR then RTS on the id's own QP, once the peer's numbers are known.
int connect_qp(Id* id) {
  if (!id->id.qp) return 0;
  if (int err = modify(id, IBV_QPS_RTR)) return err;
  return modify(id, IBV_QPS_RTS);
}

void qp_to_error(Id* id) {
  if (!id->id.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->id.qp, &a, IBV_QP_STATE);
}

// The QP is left alone: IB CM does not touch a QP on DREQ (rdma_disconnect moves it to ERR).
void report_disconnect(Id* id) {
  id->state = IdState::Disconnected;
  if (id->disconnect_reported) return;
  id->disconnect_reported = true;
  queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
  // IB CM keeps a closed connection in time-wait for about one ACK timeout, so that stray
  // packets die out; rdma_cm reports the end as TIMEWAIT_EXIT (then the QP may be reused).
  auto wait = std::chrono::nanoseconds(4096ull << std::min<int>(id->ack_timeout, 19));
  auto at = std::chrono::steady_clock::now() + std::max<std::chrono::nanoseconds>(wait, std::chrono::milliseconds(10));
  if (!id->in_timewait) {
    id->in_timewait = true;
    id->timewait_at = at;
    g_svc.timewait.emplace(at, id);
  }
  wake_service();
}

}  // namespace

void report_disconnect_remote(Id* id) {
  id->state = IdState::Disconnected;
  if (id->disconnect_reported) return;
  id->disconnect_reported = true;
  queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
}

void kick_service() {
  if (g_svc.wake >= 0) wake_service();
}

const std::set<Id*>& all_ids_locked() { return g_svc.ids; }

namespace {

// Fires the time-waits that are over; returns the milliseconds to the next one, or -1.
int expire_timewaits_locked() {
  auto now = std::chrono::steady_clock::now();
  auto& tw = g_svc.timewait;
  while (!tw.empty() && tw.begin()->first <= now) {
    Id* id = tw.begin()->second;
    tw.erase(tw.begin());
    id->in_timewait = false;
    queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
  }
  if (tw.empty()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(tw.begin()->first - now);
  return static_cast<int>(left.count()) + 1;
}

void leave_timewait_locked(Id* id) {
  if (!id->in_timewait) return;
  id->in_timewait = false;
  auto [first, last] = g_svc.timewait.equal_range(id->timewait_at);
  for (auto it = first; it != last; ++it) {
    if (it->second != id) continue;
    g_svc.timewait.erase(it);
    return;
  }
}

uint8_t clamp_rd(uint8_t v, int max) { return static_cast<uint8_t>(std::min<int>(v, max)); }

// ---- what the peer's messages do

void on_request(int fd, Id* listener, const Msg& m) {
  bool ud = listener->id.ps == RDMA_PS_UDP;
  bool matches = ud ? m.type == MsgType::SidrReq : m.type == MsgType::Req;
  // A listener bound to one address takes requests for that address only.
  const sockaddr* bound = &listener->id.route.addr.src_addr;
  int bound_index = gid_index_of(bound);
  int asked_index = gid_index_of(reinterpret_cast<const sockaddr*>(&m.dst));
  if (asked_index == -2) asked_index = loopback_gid_index();
  if (!matches || listener->state != IdState::Listening || asked_index < 0 ||
      (bound_index >= 0 && bound_index != asked_index) ||
      (!ud && m.qp_type != IBV_QPT_RC && m.qp_type != IBV_QPT_UC &&
       m.qp_type != IBV_QPT_XRC_SEND)) {
    Msg no = make_msg(ud ? MsgType::SidrRep : MsgType::Rej);
    no.status = ud ? kSidrUnsupported : kRejInvalidServiceId;
    send_msg(fd, no);
    close(fd);
    return;
  }
  Channel* ch = listener->channel;
  // An XRC INI QP connects to an XRC TGT QP.
  ibv_qp_type type = ud ? IBV_QPT_UD : static_cast<ibv_qp_type>(m.qp_type);
  if (type == IBV_QPT_XRC_SEND) type = IBV_QPT_XRC_RECV;
  Id* id = new_id(ch, listener->id.context, listener->id.ps, type);
  id->sync = false;  // rdma_get_request makes it synchronous if the listener is
  id->listener = listener;
  id->id.verbs = device_context();
  id->id.pd = device_pd();  // as rdma-core: an id on a device has its PD
  id->id.port_num = 1;
  id->sgid_index = asked_index;
  gid_at(asked_index, &id->sgid);
  std::memcpy(&id->id.route.addr.src_storage, &m.dst, sizeof(m.dst));
  std::memcpy(&id->id.route.addr.dst_storage, &m.src, sizeof(m.src));
  id->port = listener->port;
  remember_peer(id, m);
  id->sock = fd;
  id->state = IdState::ReqReceived;
  watch_locked(id);
  queue_event(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &m);
}

void on_message(Id* id, const Msg& m) {
  switch (m.type) {
    case MsgType::Rep:
      if (id->state != IdState::Connecting || id->id.ps == RDMA_PS_UDP) return;
      remember_peer(id, m);
      // What we may read from the peer is what it grants, and the other way round.
      id->responder_resources = std::min(id->responder_resources, m.initiator_depth);
      id->initiator_depth = std::min(id->initiator_depth, m.responder_resources);
      id->state = IdState::RepReceived;
      // With a QP, the take connects it (take_event): CONNECT_RESPONSE becomes ESTABLISHED.
      queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &m, id->id.qp ? QpStep::Connect : QpStep::None);
      return;
    case MsgType::Rej:
      if (id->state != IdState::Connecting && id->state != IdState::Accepting &&
          id->state != IdState::RepReceived)
        return;
      id->state = IdState::Failed;
      queue_event(id, RDMA_CM_EVENT_REJECTED, static_cast<int>(m.status), &m, QpStep::ToError);
      return;
    case MsgType::Rtu:
      if (id->state != IdState::Accepting) return;
      id->state = IdState::Connected;
      queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
      return;
    case MsgType::Dreq:
      if (id->state != IdState::Connected && id->state != IdState::Accepting &&
          id->state != IdState::RepReceived && id->state != IdState::Disconnecting)
        return;
      send_msg(id->sock, make_msg(MsgType::Drep));
      report_disconnect(id);
      return;
    case MsgType::Drep:
      if (id->state == IdState::Disconnecting) report_disconnect(id);
      return;
    case MsgType::SidrRep:
      if (id->state != IdState::Connecting || id->id.ps != RDMA_PS_UDP) return;
      if (m.status != 0) {
        id->state = IdState::Failed;
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(m.status), &m);
        return;
      }
      remember_peer(id, m);
      id->remote_qkey = m.qkey;
      id->state = IdState::Connected;
      queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &m);
      return;
    default:
      return;  // a request on an established socket: not ours to answer
  }
}

// The peer closed its end: it destroyed its id or its process died. A kernel CM would
// have sent what IB CM sends when an id goes away in that state.
void on_peer_gone(Id* id) {
  close_sock_locked(id);
  switch (id->state) {
    case IdState::Connecting:
      id->state = IdState::Failed;
      if (id->id.ps == RDMA_PS_UDP) {
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      } else {
        queue_event(id, RDMA_CM_EVENT_REJECTED, kRejConsumerDefined, nullptr, QpStep::ToError);
      }
      return;
    case IdState::ReqReceived:
      if (id->id.ps == RDMA_PS_UDP) return;  // SIDR: nothing more was coming anyway
      id->state = IdState::Failed;
      queue_event(id, RDMA_CM_EVENT_REJECTED, kRejTimeout);
      return;
    case IdState::Accepting:
      id->state = IdState::Failed;
      queue_event(id, RDMA_CM_EVENT_REJECTED, kRejConsumerDefined, nullptr, QpStep::ToError);
      return;
    case IdState::Connected:
      if (id->id.ps == RDMA_PS_UDP) return;  // UD has no connection to lose
      report_disconnect(id);
      return;
    case IdState::RepReceived:
    case IdState::Disconnecting:
      report_disconnect(id);
      return;
    default:
      return;
  }
}

// Reads every packet waiting on fd: 1 = more may come, 0 = closed or garbage (the
// caller treats both as the peer going away: a peer that sends garbage is not a peer).
template <typename F>
int read_messages(int fd, F&& handle) {
  for (;;) {
    Msg m;
    ssize_t n = recv(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : 0;
    if (n == 0 || !valid_msg(m, static_cast<size_t>(n))) return 0;
    if (!handle(m)) return 1;
  }
}

void service_id(Id* id) {
  if (id->state == IdState::Listening) {
    for (;;) {
      if (id->pending_requests >= kMaxPendingPerListener) {
        // Enough sockets wait for their request already: the rest wait in the backlog
        // (their connects are retried) until forget_pending_locked resumes us.
        epoll_remove(id->sock);
        return;
      }
      int fd = accept4(id->sock, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      watch_pending_locked(fd, id);
    }
  }
  int sock = id->sock;
  int alive = read_messages(sock, [&](const Msg& m) {
    on_message(id, m);
    return id->sock == sock;  // the handler may have closed it
  });
  if (!alive && id->sock == sock) on_peer_gone(id);
}

void service_pending(int fd, Id* listener) {
  bool taken = false;
  int alive = read_messages(fd, [&](const Msg& m) {
    // Taken off first: on_request hands the fd to a new id (or closes it).
    forget_pending_locked(fd, listener);
    taken = true;
    on_request(fd, listener, m);
    return false;
  });
  if (taken || alive) return;
  forget_pending_locked(fd, listener);
  epoll_remove(fd);
  close(fd);
}

// connect(2) to the listener's name, then the REQ. EAGAIN: the listener's backlog is full
// (nothing happened; try again later). 0: sent, or the id failed and has its event.
int send_request_locked(Id* id, const Msg& m) {
  bool ud = id->id.ps == RDMA_PS_UDP;
  sockaddr_un un;
  socklen_t un_len = cm_port_name(id->id.ps, port_of(&id->id.route.addr.dst_addr), &un);
  if (::connect(id->sock, reinterpret_cast<sockaddr*>(&un), un_len) != 0) {
    int err = errno;
    if (err == EAGAIN) return EAGAIN;
    id->state = IdState::Failed;
    if (err == ECONNREFUSED || err == ENOENT) {
      // Nobody listens there: the remote CM answers at once.
      if (ud) queue_event(id, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(kSidrUnsupported));
      else queue_event(id, RDMA_CM_EVENT_REJECTED, kRejInvalidServiceId, nullptr, QpStep::ToError);
    } else {
      queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    }
    return 0;
  }
  watch_locked(id);
  if (!send_msg(id->sock, m)) on_peer_gone(id);
  return 0;
}

void queue_connect_locked(Id* id, const Msg& m) {
  start_service_locked();
  auto now = std::chrono::steady_clock::now();
  QueuedConnect q{m, now + kFirstConnectRetry, now + kConnectGiveUp, kFirstConnectRetry};
  g_svc.queued_next.emplace(q.next, id);
  g_svc.queued[id] = q;
  id->connect_queued = true;
  wake_service();
}

void unqueue_connect_locked(Id* id) {
  if (!id->connect_queued) return;
  id->connect_queued = false;
  auto it = g_svc.queued.find(id);
  if (it == g_svc.queued.end()) return;
  auto [first, last] = g_svc.queued_next.equal_range(it->second.next);
  for (auto n = first; n != last; ++n) {
    if (n->second != id) continue;
    g_svc.queued_next.erase(n);
    break;
  }
  g_svc.queued.erase(it);
}

// Tries the queued connects that are due; returns the milliseconds to the next, or -1.
int retry_connects_locked() {
  auto now = std::chrono::steady_clock::now();
  auto& next = g_svc.queued_next;
  while (!next.empty() && next.begin()->first <= now) {
    Id* id = next.begin()->second;
    next.erase(next.begin());
    auto it = g_svc.queued.find(id);
    if (it == g_svc.queued.end()) continue;
    QueuedConnect& q = it->second;
    int err = id->state == IdState::Connecting ? send_request_locked(id, q.req) : 0;
    if (err == EAGAIN && now < q.give_up) {
      q.pause = std::min<std::chrono::microseconds>(q.pause * 2, kLongestConnectRetry);
      q.next = now + q.pause;
      next.emplace(q.next, id);
      continue;
    }
    if (err == EAGAIN) {  // as the IB CM after its last REQ went unanswered
      id->state = IdState::Failed;
      queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    }
    id->connect_queued = false;
    g_svc.queued.erase(it);
  }
  if (next.empty()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next.begin()->first - now);
  return static_cast<int>(left.count()) + 1;
}

// The device went away (softverbs inject device-fatal): every id on it hears
// DEVICE_REMOVAL once, as rdma_cm(7) describes; the application destroys them.
void check_device_locked() {
  alignas(inotify_event) char buf[4096];
  bool device = false;
  for (ssize_t n; (n = read(g_svc.state, buf, sizeof(buf))) > 0;) {
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      if (ev->len && std::strcmp(ev->name, "device") == 0) device = true;
      p += sizeof(inotify_event) + ev->len;
    }
  }
  if (!device) return;
  std::string token = read_state_word("device");
  if (token == g_svc.device_token) return;
  g_svc.device_token = token;
  if (token.rfind("fatal", 0) != 0) return;
  for (Id* id : g_svc.ids) {
    if (!id->id.verbs || id->removal_reported) continue;
    id->removal_reported = true;
    queue_event(id, RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
  }
}

// The smaller of two poll timeouts in ms (-1: none).
int sooner(int a, int b) { return a < 0 ? b : (b < 0 || a < b ? a : b); }

void run_service() {
  constexpr int kBatch = 256;
  epoll_event events[kBatch];
  for (;;) {
    int timeout;
    int ep;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_svc.owner != getpid()) return;
      timeout = sooner(expire_timewaits_locked(), retry_connects_locked());
      timeout = sooner(timeout, remote_timeout_ms_locked());
      // The QP1 agent's CQ events: its fd appears once the agent starts.
      if (int remote = remote_fd_locked(); remote != g_svc.remote) {
        epoll_remove(g_svc.remote);
        g_svc.remote = remote;
        if (remote >= 0) epoll_add(remote);
      }
      ep = g_svc.epoll;
      g_svc.polling.store(true, std::memory_order_release);
    }
    int ready = epoll_wait(ep, events, kBatch, timeout);
    g_svc.polling.store(false, std::memory_order_release);
    if (ready < 0) continue;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_svc.owner != getpid()) return;
    for (int i = 0; i < ready; ++i) {
      int fd = events[i].data.fd;
      if (fd == g_svc.wake) {
        uint64_t n;
        (void)!read(g_svc.wake, &n, sizeof(n));
        continue;
      }
      if (fd == g_svc.state) {
        check_device_locked();
        continue;
      }
      // Looked up now: an earlier event of this batch may have closed it (or a new socket
      // got its number; reading that one finds nothing or its own messages).
      auto it = g_svc.watched.find(fd);
      if (it == g_svc.watched.end()) continue;
      Watch w = it->second;
      if (w.id) service_id(w.id);
      else service_pending(fd, w.listener);
    }
    remote_service_locked();  // MADs that came, CM timers that are due
  }
}

int open_name(int ps, uint16_t port, int* out) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  sockaddr_un un;
  socklen_t len = cm_port_name(ps, port, &un);
  if (bind(s, reinterpret_cast<sockaddr*>(&un), len) != 0) {
    int err = errno;
    close(s);
    return err == EADDRINUSE ? EADDRINUSE : err;
  }
  *out = s;
  return 0;
}

}  // namespace

Channel* Channel::from(rdma_event_channel* c) {
  auto* ch = reinterpret_cast<Channel*>(c);
  return c && ch->magic == kChannelMagic ? ch : nullptr;
}

Id* Id::from(rdma_cm_id* i) {
  auto* id = reinterpret_cast<Id*>(i);
  return i && id->magic == kIdMagic ? id : nullptr;
}

Channel* new_channel() {
  auto* ch = new (std::nothrow) Channel;
  if (!ch) return nullptr;
  if (int err = ch->events.open()) {
    delete ch;
    errno = err;
    return nullptr;
  }
  ch->ch.fd = ch->events.fd();
  return ch;
}

void free_channel(Channel* ch) {
  ch->events.remove_if([](Event* e) {
    e->magic = kDeadMagic;
    delete e;
    return true;
  });
  if (ch->ids > 0) {
    // Ids still use it (rdma_destroy_event_channel came too early): it goes with the last.
    ch->destroyed = true;
    return;
  }
  ch->magic = kDeadMagic;
  delete ch;
}

void release_channel_locked(Id* id) {
  Channel* ch = id->channel;
  id->channel = nullptr;
  if (--ch->ids == 0 && (ch->destroyed || id->sync)) {
    ch->destroyed = false;
    free_channel(ch);
  }
}

Id* new_id(Channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  auto* id = new (std::nothrow) Id;
  if (!id) return nullptr;
  if (!channel) {
    channel = new_channel();
    if (!channel) {
      delete id;
      return nullptr;
    }
    id->sync = true;
  }
  id->channel = channel;
  ++channel->ids;
  id->id.channel = &channel->ch;
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = qp_type;
  start_service_locked();  // it also watches for the device going away
  g_svc.ids.insert(id);
  return id;
}

// A port this process just gave up (rdma_destroy_id of its listener) may still be held by
// the service thread's poll: wake it and wait until it has left poll, so that the port
// can be bound again at once, as with the kernel's port space (perftest -R listens twice on
// one port). False when nothing was waited for.
bool settle_closed_names_locked() {
  if (g_svc.owner != getpid() || !g_svc.polling.load(std::memory_order_acquire)) return false;
  wake_service();
  for (int i = 0; i < 50000 && g_svc.polling.load(std::memory_order_acquire); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  return true;
}

int bind_locked(Id* id, const sockaddr* addr) {
  if (id->state != IdState::Idle) return EINVAL;
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return EAFNOSUPPORT;
  int index = gid_index_of(addr);
  if (index == -1) return ENODEV;  // not an address of the soft device
  uint16_t port = port_of(addr);
  int sock = -1;
  if (port) {
    int err = open_name(id->id.ps, port, &sock);
    if (err == EADDRINUSE && settle_closed_names_locked()) err = open_name(id->id.ps, port, &sock);
    if (err) return err;
  } else {
    // An ephemeral port, as the kernel's port space would hand out.
    for (int tries = 0; tries < 512 && sock < 0; ++tries) {
      uint16_t p = static_cast<uint16_t>(32768 + random24() % (61000 - 32768));
      if (open_name(id->id.ps, p, &sock) == 0) port = p;
    }
    if (sock < 0) return EADDRINUSE;
  }
  std::memset(&id->id.route.addr.src_storage, 0, sizeof(sockaddr_storage));
  std::memcpy(&id->id.route.addr.src_storage, addr, addr_len(addr));
  set_port(&id->id.route.addr.src_storage, port);
  if (index >= 0) {
    id->id.verbs = device_context();
    id->id.pd = device_pd();  // as rdma-core: an id on a device has its PD
    id->id.port_num = 1;
    id->sgid_index = index;
    gid_at(index, &id->sgid);
  }
  id->sock = sock;
  id->port = port;
  id->state = IdState::Bound;
  return 0;
}

int listen_locked(Id* id, int backlog) {
  if (id->state == IdState::Idle) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (int err = bind_locked(id, reinterpret_cast<sockaddr*>(&any))) return err;
  }
  if (id->state != IdState::Bound) return EINVAL;
  // Connects beyond the backlog wait and try again (queue_connect_locked), as the IB CM
  // resends a REQ: a small backlog costs time, never a connection.
  if (::listen(id->sock, std::max(backlog, SOMAXCONN)) != 0) return errno;
  id->state = IdState::Listening;
  id->listened = true;
  watch_locked(id);
  // Reachable from other hosts unless bound to loopback: the QP1 agent takes their REQs.
  // Without it (no RoCE port, say), peers on this host still connect.
  if (gid_index_of(&id->id.route.addr.src_addr) != loopback_gid_index())
    (void)remote_start_locked();
  return 0;
}

int connect_locked(Id* id, const rdma_conn_param* param) {
  if (id->state != IdState::RouteResolved) return EINVAL;
  bool ud = id->id.ps == RDMA_PS_UDP;
  uint8_t len = param ? param->private_data_len : 0;
  if (len > (ud ? kSidrReqPrivate : kReqPrivate) || (len && !param->private_data)) return EINVAL;
  if (!ud && !id->id.qp && !param) return EINVAL;  // no QP and no QPN to name
  const ibv_device_attr& dev = device_attr();
  if (param) {
    id->responder_resources = clamp_rd(param->responder_resources, dev.max_qp_rd_atom);
    id->initiator_depth = clamp_rd(param->initiator_depth, dev.max_qp_init_rd_atom);
    id->retry_count = std::min<uint8_t>(param->retry_count, 7);
    id->rnr_retry_count = std::min<uint8_t>(param->rnr_retry_count, 7);
    if (!id->id.qp) id->local_qpn = param->qp_num & 0xffffff;
  }
  if (id->psn == 0) id->psn = random24();  // an application-made QP may have it already
  if (id->remote) {
    if (int err = remote_connect_locked(id, param)) return err;
    return 0;
  }
  Msg m = msg_from(id, ud ? MsgType::SidrReq : MsgType::Req, param ? param->private_data : nullptr, len);
  if (param) m.flow_control = param->flow_control, m.srq = param->srq;
  if (id->id.srq) m.srq = 1;
  id->state = IdState::Connecting;
  if (send_request_locked(id, m) == EAGAIN) queue_connect_locked(id, m);
  return 0;
}

int accept_locked(Id* id, const rdma_conn_param* param) {
  if (id->state != IdState::ReqReceived || (id->sock < 0 && !id->remote)) return EINVAL;
  bool ud = id->id.ps == RDMA_PS_UDP;
  uint8_t len = param ? param->private_data_len : 0;
  if (len > (ud ? kSidrRepPrivate : kRepPrivate) || (len && !param->private_data)) return EINVAL;
  if (!id->id.qp && !param) return EINVAL;
  if (!id->id.qp) id->local_qpn = param->qp_num & 0xffffff;
  if (ud && id->remote) return remote_accept_locked(id, param, len);
  if (ud) {
    Msg rep = msg_from(id, MsgType::SidrRep, param ? param->private_data : nullptr, len);
    rep.qkey = RDMA_UDP_QKEY;
    if (!send_msg(id->sock, rep)) return ECONNRESET;
    id->state = IdState::Connected;
    return 0;
  }
  const ibv_device_attr& dev = device_attr();
  // Without parameters we grant what was asked for, as far as the device goes.
  uint8_t res = param ? param->responder_resources : id->remote_initiator_depth;
  uint8_t ini = param ? param->initiator_depth : id->remote_responder_resources;
  id->responder_resources = clamp_rd(res, dev.max_qp_rd_atom);
  id->initiator_depth = clamp_rd(ini, dev.max_qp_init_rd_atom);
  id->retry_count = id->remote_retry_count;  // the requester's choice (IBA 12.7.38)
  id->rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  // Once chosen, the PSN stays: an application that moves its own QP (rdma_init_qp_attr)
  // may have taken it for RTS before accepting, and the REP must carry the same.
  if (id->psn == 0) id->psn = random24();
  if (int err = connect_qp(id)) return err;
  if (id->remote) {
    int err = remote_accept_locked(id, param, len);
    if (err) qp_to_error(id);
    return err;
  }
  Msg rep = msg_from(id, MsgType::Rep, param ? param->private_data : nullptr, len);
  if (param) rep.flow_control = param->flow_control, rep.srq = param->srq;
  if (id->id.srq) rep.srq = 1;
  if (!send_msg(id->sock, rep)) {
    qp_to_error(id);
    return ECONNRESET;
  }
  id->state = IdState::Accepting;
  return 0;
}

int reject_locked(Id* id, const void* data, uint8_t len, int reason) {
  if (id->state != IdState::ReqReceived) return EINVAL;
  bool ud = id->id.ps == RDMA_PS_UDP;
  if (len > (ud ? kSidrRepPrivate : kRejPrivate) || (len && !data)) return EINVAL;
  if (id->remote) return remote_reject_locked(id, data, len, reason);
  Msg m = msg_from(id, ud ? MsgType::SidrRep : MsgType::Rej, data, len);
  m.status = ud ? kSidrReject : static_cast<uint32_t>(reason);
  send_msg(id->sock, m);
  id->state = IdState::Failed;
  return 0;
}

int establish_locked(Id* id) {
  if (id->state != IdState::RepReceived) return EINVAL;
  if (id->remote) {
    if (int err = remote_rtu_locked(id)) return err;
    id->state = IdState::Connected;
    return 0;
  }
  if (!send_msg(id->sock, msg_from(id, MsgType::Rtu, nullptr, 0))) return ECONNRESET;
  id->state = IdState::Connected;
  return 0;
}

int disconnect_locked(Id* id) {
  switch (id->state) {
    case IdState::Connected:
    case IdState::Accepting:
    case IdState::RepReceived:
      qp_to_error(id);
      if (id->id.ps == RDMA_PS_UDP) return 0;
      id->state = IdState::Disconnecting;
      if (id->remote) return remote_disconnect_locked(id);
      if (!send_msg(id->sock, make_msg(MsgType::Dreq))) report_disconnect(id);
      return 0;
    case IdState::Disconnecting:
    case IdState::Disconnected:
      qp_to_error(id);  // after the peer's DREQ: the QP leaves RTS only now
      return 0;
    default:
      return EINVAL;
  }
}

int qp_attr_locked(Id* id, ibv_qp_attr* a, int* mask) {
  bool ud = id->id.qp_type == IBV_QPT_UD;
  bool rc = id->id.qp_type == IBV_QPT_RC;
  // XRC: the INI side takes RC's send attributes, the TGT side RC's receive ones (the
  // kernel's qp_state_table); both RC's access.
  bool ini = id->id.qp_type == IBV_QPT_XRC_SEND, tgt = id->id.qp_type == IBV_QPT_XRC_RECV;
  ibv_qp_state state = a->qp_state;
  std::memset(a, 0, sizeof(*a));
  a->qp_state = state;
  *mask = IBV_QP_STATE;
  switch (state) {
    case IBV_QPS_INIT:
      a->pkey_index = 0;
      a->port_num = id->id.port_num ? id->id.port_num : 1;
      *mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        a->qkey = RDMA_UDP_QKEY;
        *mask |= IBV_QP_QKEY;
      } else {
        a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        if (rc || ini || tgt) a->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      if (ud) return 0;
      if (!id->have_remote) return EINVAL;
      a->path_mtu = id->path_mtu ? static_cast<ibv_mtu>(std::min<int>(id->path_mtu, device_mtu()))
                                 : device_mtu();
      a->dest_qp_num = id->remote_qpn;
      if (id->psn == 0) id->psn = random24();
      a->rq_psn = starting_psns(id->psn, id->remote_psn).rq_psn;
      a->ah_attr.is_global = 1;
      a->ah_attr.grh.dgid = id->remote_gid;
      a->ah_attr.grh.sgid_index = static_cast<uint8_t>(id->sgid_index);
      a->ah_attr.grh.hop_limit = 64;
      a->ah_attr.grh.traffic_class = id->tos;
      a->ah_attr.port_num = 1;
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (rc || tgt) {
        a->max_dest_rd_atomic = id->responder_resources;
        a->min_rnr_timer = 12;
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      if (id->psn == 0) id->psn = random24();
      a->sq_psn = ud ? id->psn : starting_psns(id->psn, id->remote_psn).sq_psn;
      *mask |= IBV_QP_SQ_PSN;
      if (tgt) {
        a->timeout = id->ack_timeout;
        *mask |= IBV_QP_TIMEOUT;
      }
      if (rc || ini) {
        a->timeout = id->ack_timeout;
        a->retry_cnt = id->retry_count;
        a->rnr_retry = id->rnr_retry_count;
        a->max_rd_atomic = id->initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default:
      return EINVAL;
  }
}

int init_qp_locked(Id* id, ibv_qp* qp) {
  ibv_qp* saved = id->id.qp;
  id->id.qp = qp;
  if (id->psn == 0) id->psn = random24();
  int err = modify(id, IBV_QPS_INIT);
  if (!err && id->id.qp_type == IBV_QPT_UD) {
    err = modify(id, IBV_QPS_RTR);
    if (!err) err = modify(id, IBV_QPS_RTS);
  }
  id->id.qp = saved;
  return err;
}

Event* new_event(Id* id, rdma_cm_event_type type, int status) {
  auto* e = new (std::nothrow) Event{};
  if (!e) return nullptr;  // nothing sensible left to do: the application sees no event
  e->magic = kEventMagic;
  e->owner = id;
  e->ev.id = &id->id;
  e->ev.event = type;
  e->ev.status = status;
  return e;
}

void push_event(Id* id, Event* e) {
  if (!e) return;
  if (id->channel->destroyed) {  // nobody can read it any more
    delete e;
    return;
  }
  id->channel->events.push(e);
}

void queue_event(Id* id, rdma_cm_event_type type, int status, const Msg* m, QpStep step) {
  Event* e = new_event(id, type, status);
  if (!e) return;
  e->step = step;
  rdma_cm_event& ev = e->ev;
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST && id->listener) ev.listen_id = &id->listener->id;
  if (m) {
    // Private data arrives in IB CM's fixed-size fields: the receiver sees all of it.
    uint8_t size = private_size(m->type);
    std::memcpy(e->private_data, m->private_data, std::min<size_t>(m->private_len, size));
    if (id->id.ps == RDMA_PS_UDP) {
      ev.param.ud.private_data = size ? e->private_data : nullptr;
      ev.param.ud.private_data_len = size;
      if (type == RDMA_CM_EVENT_ESTABLISHED) {
        ibv_ah_attr& ah = ev.param.ud.ah_attr;
        ah.is_global = 1;
        std::memcpy(ah.grh.dgid.raw, m->gid, 16);
        ah.grh.sgid_index = static_cast<uint8_t>(id->sgid_index);
        ah.grh.hop_limit = 64;
        ah.port_num = 1;
        ev.param.ud.qp_num = m->qpn;
        ev.param.ud.qkey = m->qkey;
      }
    } else {
      ev.param.conn.private_data = size ? e->private_data : nullptr;
      ev.param.conn.private_data_len = size;
      // The sender's resources seen from here: what it reads is what we answer, and back.
      ev.param.conn.responder_resources = m->initiator_depth;
      ev.param.conn.initiator_depth = m->responder_resources;
      ev.param.conn.flow_control = m->flow_control;
      ev.param.conn.retry_count = m->retry_count;
      ev.param.conn.rnr_retry_count = m->rnr_retry_count;
      ev.param.conn.srq = m->srq;
      ev.param.conn.qp_num = m->qpn;
    }
  }
  push_event(id, e);
}

void detach_locked(Id* id) {
  close_sock_locked(id);
  remote_destroy_locked(id);
  leave_timewait_locked(id);
  unqueue_connect_locked(id);
  g_svc.ids.erase(id);
  if (id->listened) {
    // Its accepted sockets whose request has not come close: the requesters hear that.
    if (id->pending_requests > 0) {
      for (auto it = g_svc.watched.begin(); it != g_svc.watched.end();) {
        if (it->second.id || it->second.listener != id) {
          ++it;
          continue;
        }
        epoll_remove(it->first);
        close(it->first);
        it = g_svc.watched.erase(it);
      }
      id->pending_requests = 0;
    }
    for (Id* other : g_svc.ids)  // ids it made outlive it, without it
      if (other->listener == id) other->listener = nullptr;
  }
  // Requests this listener never handed out die with it; the requesters hear the socket close.
  std::vector<Id*> orphans;
  id->channel->events.remove_if([&](Event* e) {
    if (e->ev.listen_id == &id->id && e->owner != id) orphans.push_back(e->owner);
    if (e->owner != id && e->ev.listen_id != &id->id) return false;
    e->magic = kDeadMagic;
    delete e;
    return true;
  });
  for (Id* o : orphans) {
    close_sock_locked(o);
    remote_destroy_locked(o);
    leave_timewait_locked(o);
    unqueue_connect_locked(o);
    release_channel_locked(o);
    g_svc.ids.erase(o);
    o->magic = kDeadMagic;
    delete o;
  }
}

void wait_acked(Id* id) {
  for (int n = id->unacked.load(); n > 0; n = id->unacked.load()) id->unacked.wait(n);
}

namespace {

// The REP's step, as rdma-core's rdma_get_cm_event does it: RTR and RTS, then RTU. If the
// connection ended while the event waited (state changed), the QP goes to ERR instead.
void connect_on_take_locked(Event* e) {
  Id* id = e->owner;
  int err = id->state == IdState::RepReceived ? connect_qp(id) : ECONNRESET;
  if (!err && id->remote) err = remote_rtu_locked(id);
  else if (!err && !send_msg(id->sock, msg_from(id, MsgType::Rtu, nullptr, 0))) err = ECONNRESET;
  if (!err) {
    id->state = IdState::Connected;
    e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
    return;
  }
  if (id->state == IdState::RepReceived && id->remote) {
    remote_reject_rep_locked(id);
    id->state = IdState::Failed;
  } else if (id->state == IdState::RepReceived) {
    Msg rej = msg_from(id, MsgType::Rej, nullptr, 0);
    rej.status = kRejConsumerDefined;
    send_msg(id->sock, rej);
    id->state = IdState::Failed;
  }
  qp_to_error(id);
  id->connect_error = true;
  e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
  e->ev.status = -err;
}

// Runs the event's QP step; false if the event is not to be reported (after a
// CONNECT_ERROR, the end of that connection).
bool finish_take_locked(Event* e) {
  Id* id = e->owner;
  if (id->connect_error &&
      (e->ev.event == RDMA_CM_EVENT_REJECTED || e->ev.event == RDMA_CM_EVENT_DISCONNECTED))
    return false;
  switch (e->step) {
    case QpStep::ToError:
      qp_to_error(id);
      break;
    case QpStep::Connect:
      connect_on_take_locked(e);
      break;
    case QpStep::None:
      break;
  }
  return true;
}

}  // namespace

int take_event(Channel* ch, Event** out) {
  for (;;) {
    if (ch->events.wait_pop(out, [](Event* e) { e->owner->unacked.fetch_add(1); }) != 0) return -1;
    std::lock_guard<std::mutex> lock(g_mu);
    if (finish_take_locked(*out)) return 0;
    ack_event(*out);
  }
}

void ack_event(Event* e) {
  Id* owner = e->owner;
  e->magic = kDeadMagic;
  delete e;
  owner->unacked.fetch_sub(1);
  owner->unacked.notify_all();
}

void drop_kept_event(Id* id) {
  if (!id->id.event) return;
  ack_event(reinterpret_cast<Event*>(id->id.event));
  id->id.event = nullptr;
}

int complete_sync(Id* id) {
  drop_kept_event(id);
  Event* e = nullptr;
  if (take_event(id->channel, &e) != 0) return -1;
  id->id.event = &e->ev;
  // As rdma-core: the event's status decides, not its type.
  int status = e->ev.status;
  if (status == 0) return 0;
  if (e->ev.event == RDMA_CM_EVENT_REJECTED) errno = ECONNREFUSED;
  else errno = status < 0 ? -status : status;
  return -1;
}

}  // namespace softverbs::cm
