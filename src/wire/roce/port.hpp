// The RoCE v2 port: this process's share of UDP port 4791, which every RoCE v2 peer sends
// to, whichever process on this host owns the destination QP (decision 0006).
//
// Every process binds the port with SO_REUSEPORT; a classic BPF program attached to the
// group reads the datagram's DestQP and hands it to the socket of the process whose registry
// slot owns that QPN. Which socket sits at which group index is learned by probing
// (steering.hpp) whenever a process joins or leaves, or a datagram arrives at the wrong
// process; such a datagram is forwarded to its owner over a Unix datagram socket, so a stale
// program (a process died and the kernel moved another socket into its place) costs a hop,
// never a lost packet for a live process. No root, no daemon, no eBPF.
//
// One thread per open port sleeps in epoll on the socket, the forwarding socket and a
// timerfd; it delivers datagrams and fires timers through the handlers given at
// construction. Sends come from any thread, from unconnected sockets with DF set, so IPv4
// packets carry ID 0 (the ICRC covers the ID).
#pragma once

#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {

// An IP address as a RoCE v2 GID holds it: IPv6, with IPv4 as ::ffff:a.b.c.d.
struct IpAddress {
  std::array<uint8_t, 16> bytes{};

  static IpAddress from_gid(const uint8_t (&gid)[16]);
  static IpAddress v4(uint32_t network_order);
  static IpAddress loopback_v4() { return v4(0x0100007f); }  // 127.0.0.1 in memory order
  bool is_v4() const;
  uint32_t v4_network_order() const;  // meaningful only when is_v4()
  bool is_loopback() const;
  bool is_multicast() const;  // 224.0.0.0/4 (as ::ffff:224.0.0.0/100) or ff00::/8
  std::string to_string() const;
  bool operator==(const IpAddress&) const = default;
  auto operator<=>(const IpAddress&) const = default;
};

// One datagram that arrived on the port. `data` is the UDP payload (BTH onwards, ICRC
// included), valid only during the callback; nothing in it has been checked but its length.
struct Datagram {
  IpAddress src;
  uint16_t src_port = 0;
  IpAddress dst;        // the local address it was sent to
  int ifindex = 0;      // where it came in (0 when unknown)
  uint8_t tos = 0;      // IPv4 TOS / IPv6 traffic class: DSCP and ECN
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool forwarded = false;  // came through another process (the steering was stale)
  // Another datagram of the same receive buffer (a UDP GRO buffer: one flow) follows this
  // one; PortConfig::on_buffer_end runs after the buffer's last.
  bool more = false;
};

// One datagram to send (send_batch).
struct OutDatagram {
  IpAddress dst;
  uint32_t flow = 0;  // entropy: picks the source socket (and so the UDP source port)
  const void* data = nullptr;
  size_t size = 0;
  const IpAddress* src = nullptr;  // the source address to carry (see send), or the kernel's
  // Nonzero: `data` is several datagrams of this size back to back (the last may be
  // shorter), sent as one UDP GSO send (UDP_SEGMENT) that the kernel cuts up.
  uint16_t segment = 0;
  // When set, the bytes are gathered from these (`size` in all) instead of `data`: headers
  // in one place, payload straight from registered memory.
  const iovec* iov = nullptr;
  size_t iovcnt = 0;
  // To a multicast group: the interface it leaves by and its IP TTL / hop limit (0: the
  // kernel's choices). Unicast ignores them.
  int ifindex = 0;
  uint8_t hop_limit = 0;
};

struct PortConfig {
  uint16_t udp_port = kRoceV2Port;  // tests use their own
  int slot = 0;                     // our registry slot; 0: wire::my_slot() at open
  std::string state_dir;            // for the group's lock file; empty: the state directory
  // How long the socket stays left to an application after its last poll (Port::poll_idle);
  // negative: SOFTVERBS_POLL_PARK (microseconds; default 1000, 0: never left to it).
  int64_t park_grace_ns = -1;
  // Runs after the datagrams of a receive buffer that had any for this process were handed
  // out, on the thread that handled them (nullptr: nothing): what the datagram handler kept
  // for the buffer (Datagram::more) it lets go there.
  void (*on_buffer_end)() = nullptr;
};

struct PortStats {
  uint64_t delivered = 0;        // handed to on_datagram (forwarded ones included)
  uint64_t forwarded_in = 0;     // of those, came through another process
  uint64_t forwarded_out = 0;    // arrived here for another process, passed on
  uint64_t dropped = 0;          // too short, truncated, for no live process, bad forward
  uint64_t coalesced = 0;        // datagrams that came in a UDP GRO super-datagram
  uint64_t parked = 0;           // times the socket was left to a polling application
  bool eager_unpark = false;     // a poll that found completions gives the socket back
  uint64_t kept_for_ride = 0;    // ... but kept it: the peer's next request came with them
  uint64_t probe_rounds = 0;     // programs attached by this process
  uint32_t group_size = 0;       // members our last round found
};

class Port {
 public:
  using DatagramHandler = std::function<void(const Datagram&)>;
  using TimerHandler = std::function<void(uint64_t timer_id)>;
  using Clock = std::chrono::steady_clock;
  // Given to the timer handler (on the port's thread) each time the parked socket's recheck
  // runs, at most park_grace_ns apart while it is parked and once after it was given back:
  // the owner's backstop for what it holds back while an application receives (ACKs).
  static constexpr uint64_t kRecheckTimerId = uint64_t{1} << 62;

  // Handlers run on the port's thread, one at a time; they must not call release().
  Port(PortConfig config, DatagramHandler on_datagram, TimerHandler on_timer);
  ~Port();
  Port(const Port&) = delete;
  Port& operator=(const Port&) = delete;

  // The first acquire opens the port (binds, joins the group, starts the thread); the last
  // release closes it. Returns 0 or -errno (-EADDRINUSE: another user, or the kernel's own
  // RoCE, holds the port).
  int acquire();
  void release();
  bool is_open() const { return fd_group_ >= 0; }
  // The slots this process serves changed (it adopted one): the group learns them again.
  void relearn_steering() { nudge_group(); }
  // This process, ending, handed its slot to another (verbs/xrc.cpp): that one's now.
  void own_slot_handed_over() {
    slot_handed_over_.store(true, std::memory_order_relaxed);
    nudge_group();
  }
  // The group socket's receive buffer, as the kernel set it (SO_RCVBUF asks 4 MiB; the
  // kernel caps it at net.core.rmem_max and doubles it); 0 before the first open.
  size_t receive_buffer_bytes() const { return rcvbuf_bytes_.load(std::memory_order_relaxed); }

  // Sends one datagram to (dst, udp_port). Returns 0 or -errno (-EMSGSIZE past the path
  // MTU: DF is set; -ENOTCONN when the port is not open).
  // `src`, when given, is the source address the datagram must carry (the QP's GID: the
  // ICRC covers it), instead of the one the kernel's routing would pick.
  // `ifindex` and `hop_limit` as in OutDatagram.
  int send(const IpAddress& dst, const void* data, size_t size, uint32_t flow = 0,
           const IpAddress* src = nullptr, int ifindex = 0, uint8_t hop_limit = 0);
  // sendmmsg per source socket; returns how many were sent (in order), or -errno when none.
  int send_batch(const OutDatagram* datagrams, size_t count);
  // The UDP source port that datagrams of `flow` carry (a kernel-chosen ephemeral port).
  uint16_t source_port(uint32_t flow) const;

  // Receives and hands on what is waiting on the port now, on the caller's thread (an
  // application polling its CQ: its packets then need no wake-up of the port's thread, nor
  // a CPU for it). 0 when nothing was waiting or the port's thread is receiving already.
  int poll();
  // What the application's poll found, after poll(): nothing (poll_idle; several in a row
  // mean it waits on its CQ, so the port's thread leaves the socket to it and is not woken
  // for every packet), or completions (poll_found). After completions the socket stays
  // with the application, which in a ping-pong polls again within microseconds; unless
  // once an application went away after completions (to poll memory for an RDMA WRITE,
  // say) and the recheck had to give the socket back: from then on (eager_unpark) every
  // poll that finds completions gives it back at once, as a WRITE may come next. Unless
  // `rode`: that poll's receive brought a request along with the completion and holds its
  // ACK for the application's reply (a one-sided ping-pong's ACK rode with the peer's next
  // WRITE): nothing more comes before the reply, so it stays parked, up to kRideMisses
  // times that the recheck then found a datagram waiting for nobody.
  void poll_idle();
  void poll_found(bool rode = false);
  // Whether completions give the socket back (see poll_found).
  bool eager() const { return eager_unpark_.load(std::memory_order_relaxed); }
  // The application stops polling (it is about to sleep until a completion event): the
  // port's thread receives again at once. Unless this thread came out of wait_end within
  // the park grace: it sleeps in ibv_get_cq_event in a loop, where it receives itself.
  void poll_stop();
  // How many rechecks must see a program run away from its CQs after completions before
  // they give the socket back at once (poll_found).
  static constexpr int kEagerVotes = 2;
  static constexpr int kRideMisses = 4;
  // Whether the socket is left to polling applications now.
  bool parked() const { return group_parked_.load(std::memory_order_seq_cst); }
  // While parked, the port's thread rechecks at most this far apart (0: never parks).
  int64_t park_grace_ns() const { return config_.park_grace_ns; }
  // A thread that sleeps in ibv_get_cq_event on the group socket too (group_fd), and
  // receives what wakes it with poll(): meanwhile the port's thread is not woken for packets.
  int group_fd() const { return fd_group_; }
  // After the wait the socket stays with the application: an event loop (get the event,
  // poll, post, arm, wait again) is back within microseconds and receives what came
  // meanwhile itself; giving the socket back and taking it again cost two epoll_ctl calls
  // and woke the port's thread for the packets of those microseconds (~0.8 a message in
  // ib_send_lat -e), which then fought the application for the socket's lock. If the
  // program does not come back, the recheck gives the socket back within two park graces.
  void wait_begin();
  void wait_end();

  // Timers, on the port's thread: on_timer(id) once at `when` (or soon after). Scheduling
  // an id that is pending moves it. Any thread; they fire only while the port is open.
  // Ids with the top bit set are the port's own.
  void schedule(uint64_t timer_id, Clock::time_point when);
  bool cancel(uint64_t timer_id);  // false when it was not pending

  // Passes a datagram this process received (on_datagram) to the process in `slot`, as a
  // misrouted one is (QP1 datagrams for the host's MAD agent: decision 0007). False when
  // that slot has no live owner or it would not take it in time.
  bool pass_to(const Datagram& d, int slot);

  // IP multicast membership of this process (decision 0008), counted per (group, interface):
  // the first join opens a socket of its own bound to (group, udp_port) and to the interface,
  // and joins the group there (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP); the last leave closes
  // it; closing the port (or the process dying) closes them all. The kernel gives each such
  // socket its own copy of every datagram to the group, so every process that joined gets
  // one; the port's thread hands them on as it does the others. 0 or -errno (-ENOTCONN when
  // the port is not open, -EINVAL for an address that is not multicast).
  int join_group(const IpAddress& group, int ifindex);
  int leave_group(const IpAddress& group, int ifindex);
  // How many joins of (group, ifindex) this process holds (tests).
  int group_joins(const IpAddress& group, int ifindex) const;

  // Re-learn the group's indices now (tests; the port does it by itself when needed).
  void request_reroute();
  // Waits until the round asked for by the last request_reroute (or acquire) is done.
  bool wait_rerouted(std::chrono::milliseconds timeout);
  PortStats stats() const;

 private:
  struct Round;
  static constexpr int kSenders = 4;

  void close_fds();
  void loop();
  void handle_group();
  // Receives from `fd` (the group socket, or a multicast group's socket); caller holds
  // group_mu_.
  int receive_locked(int fd, bool once, bool multicast);
  int route_received(msghdr& msg, size_t size, bool multicast);
  void handle_multicast(int fd);
  void close_multicast_fds();
  int open_multicast_socket(const IpAddress& group, int ifindex);
  void rearm_group();  // the port's thread, after a wake-up on the group socket
  void recheck_parked();  // the port's thread, kGroupRecheck
  void recheck_give_back();
  void give_back();  // the socket back to the port's thread, unless a thread waits on it
  void handle_forwarded();
  void handle_answers();
  void handle_timers();
  void handle_commands();
  void route(const Datagram& d);
  void deliver(const Datagram& d);
  void answer_probe(const uint8_t* data, const IpAddress& src, uint16_t src_port);
  bool forward(const Datagram& d, int slot);
  void start_round();
  void send_probes(uint32_t from, uint32_t to);
  void finish_round_if_done(bool deadline_passed);
  void arm_timerfd();
  void nudge_group();
  int send_from(int fd, const IpAddress& dst, const void* data, size_t size,
                const IpAddress* src = nullptr, int ifindex = 0, uint8_t hop_limit = 0);

  PortConfig config_;
  DatagramHandler on_datagram_;
  TimerHandler on_timer_;

  mutable std::mutex open_mu_;
  int users_ = 0;
  // join_group's sockets and counts, under open_mu_ (port_multicast.cpp); the sockets are
  // also in multicast_fds_, under group_mu_, for the port's thread.
  struct Joined {
    int fd;
    int count;
  };
  std::map<std::pair<IpAddress, int>, Joined> joins_;
  std::set<int> multicast_fds_;
  int slot_ = 0;
  std::atomic<bool> slot_handed_over_{false};  // own_slot_handed_over
  bool ipv6_ = true;  // sockets are dual-stack AF_INET6 (else AF_INET only)
  int fd_group_ = -1;
  int fd_forward_ = -1;
  int fd_senders_[kSenders] = {-1, -1, -1, -1};
  uint16_t sender_ports_[kSenders] = {};
  int fd_lock_ = -1;
  int fd_epoll_ = -1;
  int fd_timer_ = -1;
  int fd_wake_ = -1;
  pthread_t thread_{};
  bool thread_running_ = false;
  std::atomic<bool> stop_{false};

  // Timers: pending ids by deadline, and each id's deadline. Internal timers (round retry
  // and deadline) use ids with the top bit set.
  mutable std::mutex timer_mu_;
  std::set<std::pair<Clock::time_point, uint64_t>> timer_queue_;
  std::map<uint64_t, Clock::time_point> timer_when_;
  Clock::time_point timerfd_at_ = Clock::time_point::max();  // what the timerfd is set for

  // Probe rounds: only the port's thread touches these.
  Round* round_ = nullptr;
  std::atomic<bool> round_wanted_{false};
  Clock::time_point last_round_end_{};

  // Stats and round counts: written by the port's thread, read anywhere.
  mutable std::mutex stats_mu_;
  PortStats stats_;
  // Counted per datagram, on the receive path: atomics, not stats_mu_ (stats() adds them).
  std::atomic<uint64_t> delivered_{0}, forwarded_in_{0};
  std::atomic<size_t> rcvbuf_bytes_{0};
  uint64_t rounds_started_ = 0;
  uint64_t rounds_done_ = 0;
  uint64_t reroute_ticket_ = 0;  // the round wait_rerouted waits for
  std::condition_variable rounds_cv_;

  // Whoever receives from the group socket (the port's thread, or poll()) holds this: the
  // receive buffers, forwarding and the datagram handler are one receiver's at a time.
  std::mutex group_mu_;
  // When an application last polled the group socket itself (steady clock, ns; 0: it
  // stopped), its empty polls in a row, and whether the port's thread left the socket to it
  // (not armed in epoll; changed under park_mu_, with the epoll_ctl that makes it true).
  std::atomic<int64_t> app_polled_ns_{0};
  std::atomic<int> idle_polls_{0};
  std::atomic<bool> group_parked_{false};
  std::atomic<bool> recheck_pending_{false};  // kGroupRecheck is scheduled
  std::atomic<int> waiters_{0};               // threads between wait_begin and wait_end
  std::atomic<bool> last_poll_found_{false};  // the application's last poll found completions
  std::atomic<bool> eager_unpark_{false};     // see poll_found
  std::atomic<int> eager_votes_{0};           // rechecks that saw it (recheck_give_back)
  std::atomic<bool> kept_for_ride_{false};    // the last found poll kept it (poll_found)
  std::atomic<int> ride_misses_{0};           // ... and the recheck then found it a miss
  std::atomic<uint64_t> kept_for_ride_count_{0};
  // The process's CPU time at the park or the last recheck (park_mu_): whether it ran
  // while it was away from its CQs (recheck_give_back).
  int64_t sample_cpu_ns_ = -1;
  int64_t sample_wall_ns_ = 0;
  void sample_app_cpu();
  std::mutex park_mu_;
  void park_group();
  void unpark_group();
  void arm_group_locked(bool armed);  // park_mu_ held
  std::unique_ptr<uint8_t[]> rx_buffers_;     // kBatch x kRxBufferBytes, under group_mu_
  std::vector<uint8_t> forward_buffer_;        // the port's thread's, for handle_forwarded
  std::vector<Clock::time_point> forward_congested_until_;  // by slot

  friend struct PortForkGuard;
};

// The abstract Unix address a misrouted datagram for `slot` is forwarded to.
std::string forward_address(const std::string& state_dir, uint16_t udp_port, int slot);

}  // namespace softverbs::wire::roce
