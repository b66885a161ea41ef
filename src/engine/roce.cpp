// The RoCE v2 path of a QP (see roce.hpp): a RoceLink is the packet roles' Env. It turns
// their packets into datagrams (headers, payload, ICRC) for the port, and their receive
// takes, key checks, completions and events into this process's objects. The port's thread
// (wire/roce/port.hpp) decodes what arrives, checks its ICRC and hands it to the QP's link.
//
// Locks, in order: a QP's sq_mu (posting), the key lock (shared), the link's mu, then the
// receive queue's and the CQs' own locks. The port's thread takes the key lock around
// every packet, so that an MR cannot go while its bytes are being read or written.
#include "engine/roce.hpp"

#include <net/if.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/cm_port_name.hpp"
#include "common/fast_tls.hpp"
#include "core/check_hooks.hpp"
#include "core/core.hpp"
#include "core/device.hpp"
#include "core/errors.hpp"
#include "engine/engine.hpp"
#include "engine/packet/packet_qp.hpp"
#include "engine/tm.hpp"
#include "wire/registry.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/cm_msg.hpp"
#include "wire/roce/mad.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/pcap.hpp"
#include "wire/roce/port.hpp"
#include "wire/router.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

namespace rw = wire::roce;

namespace {

// The biggest datagram a 4096-byte path MTU makes: headers (at most BTH + RETH + ImmDt, or
// BTH + AtomicETH), payload, pad and ICRC.
constexpr size_t kMaxDatagram = 4096 + 64;

// A CQ fed by a QP on the wire: an empty poll of it receives from the port, and its
// channel's waiters wait on the port's socket too (get_cq_event).
void feed_from_wire(Cq* cq) {
  if (cq->roce_fed.exchange(true)) return;
  if (CompChannel* ch = cq->channel) {
    std::lock_guard<std::mutex> lock(ch->cqs_mu);
    ch->wire_cqs++;
  }
}

uint64_t now_ns_steady() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The biggest IBA MTU whose packets fit the interface's MTU with IP, UDP, BTH, the largest
// extension headers and the ICRC around the payload (as rxe sizes a port's active MTU).
ibv_mtu interface_mtu(int ifindex, bool ipv6) {
  char name[IF_NAMESIZE] = {};
  int mtu = 1500;
  if (ifindex > 0 && if_indextoname(static_cast<unsigned>(ifindex), name)) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (fd >= 0 && ioctl(fd, SIOCGIFMTU, &ifr) == 0) mtu = ifr.ifr_mtu;
    if (fd >= 0) close(fd);
  }
  int overhead = (ipv6 ? 40 : 20) + 8 + rw::kBthBytes + 28 + rw::kIcrcBytes;
  for (int m = IBV_MTU_4096; m > IBV_MTU_256; --m)
    if ((128 << m) + overhead <= mtu) return static_cast<ibv_mtu>(m);
  return IBV_MTU_256;
}

// The interface of one of this host's GIDs (0 when it is not in the table).
int gid_ifindex(const ibv_gid& gid) {
  for (const GidEntry& e : Device::instance().gids())
    if (std::memcmp(e.gid.raw, gid.raw, 16) == 0) return e.ifindex;
  return 0;
}

bool is_ipv4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

ibv_gid gid_of(const rw::IpAddress& a) {
  ibv_gid g;
  std::memcpy(g.raw, a.bytes.data(), 16);
  return g;
}

packet::QpType packet_type(ibv_qp_type t) {
  return t == IBV_QPT_UD ? packet::QpType::kUd
                         : t == IBV_QPT_UC ? packet::QpType::kUc : packet::QpType::kRc;
}

rw::PcapWriter* trace() { return trace_writer(); }

void on_datagram(const rw::Datagram& d);
void on_timer(uint64_t qpn);
void end_of_buffer();

// The datagrams one call into a link produces (a burst of a message's packets, an ACK and
// a READ response...), sent with one sendmmsg when the call ends. Back-to-back packets of
// one size to one destination (a message's MIDDLE packets) form a group that leaves as one
// UDP GSO send (UDP_SEGMENT): the kernel cuts it into datagrams, each with its own IP and
// UDP header and, over IPv4, IDs counting up from 0, which is what each packet's ICRC is
// computed with (checked on the wire by hosts.gso). Per thread, on the heap (a dlopen'ed
// library has little static TLS), so a link costs no buffer of its own.
struct OutBatch {
  static constexpr size_t kMaxGroups = 32;
  static constexpr uint32_t kMaxSegments = 64;  // the kernel's UDP_MAX_SEGMENTS
  // A GSO send is one IP datagram at first: its UDP payload stays under 65507 bytes. 62
  // packets of a 1 KiB path MTU (1040 bytes each) fit: packet::kPacketsPerAckReq.
  static constexpr size_t kMaxGroupBytes = 65000;
  static constexpr size_t kBytes = kMaxGroups * kMaxGroupBytes;
  uint8_t data[kBytes];
  size_t used = 0;
  rw::OutDatagram out[kMaxGroups];
  rw::IpAddress src[kMaxGroups];
  uint32_t segments[kMaxGroups];  // packets in each group
  bool closed[kMaxGroups];         // a shorter last packet ends a group
  size_t n = 0;
  // Gathered sends: each group's pieces, in order (headers and trailers in `data`).
  static constexpr size_t kMaxIov = 2048;  // a sendmsg takes up to 1024 (UIO_MAXIOV)
  static constexpr size_t kMaxGroupIov = 1000;
  iovec iov[kMaxIov];
  size_t niov = 0;
};
// SOFTVERBS_FAULTS set: the fault injector drops, holds back and repeats single datagrams.
bool faults_on() {
  static const bool on = [] {
    const char* faults = std::getenv("SOFTVERBS_FAULTS");
    return faults && *faults;
  }();
  return on;
}
// An environment switch turned on: set, and not to something starting with 0.
bool switched_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && *v != '0';
}
// SOFTVERBS_NO_GSO=1: one datagram per send (for comparisons, and kernels without it).
// Off as well under fault injection (a datagram's ICRC counts on its place in its GSO send).
bool gso_enabled() {
  static const bool on = !switched_on("SOFTVERBS_NO_GSO") && !faults_on();
  return on;
}
// Payload is copied into the batch, a GSO send's datagrams back to back there and handed
// to the kernel as one iovec; SOFTVERBS_GATHER=1 gathers it from registered memory instead
// (sendmsg's iovecs: header, payload, trailer per datagram), except when each datagram must
// be whole in one place: for the trace, and for the fault injector (which also turns GSO
// off). The kernel copies 186 iovecs of a 62-datagram GSO send piece by piece, dearer than
// our copy and its one run (docs/roce.md, "Sending").
bool gather_enabled() {
  static const bool on = switched_on("SOFTVERBS_GATHER");
  return on && !faults_on() && !trace();
}

OutBatch& out_batch() { return FastTlsHeap<OutBatch>::get(); }

uint16_t roce_udp_port() {
  // Tests on one machine may move the whole RoCE v2 wire to another port.
  // Read once: every received packet's ICRC check asks for it.
  static const uint16_t port = [] {
    const char* p = std::getenv("SOFTVERBS_ROCE_PORT");
    return p && *p ? uint16_t(std::atoi(p)) : rw::kRoceV2Port;
  }();
  return port;
}

// This process's share of UDP port 4791, opened with the first link and closed with the
// last (Port::acquire / release count).
rw::Port& port() {
  static rw::Port* p = new rw::Port(rw::PortConfig{roce_udp_port(), 0, {}, -1, &end_of_buffer}, &on_datagram,
                                    &on_timer);  // immortal: its thread may outlive exit()
  return *p;
}

// ACKs held back while an application receives (RoceLink::hold_ack). An application that
// polls its CQ receives its QPs' packets itself; a plain ACK for what it received then
// waits for the QP's next packet to the same peer (its next SEND, in a ping-pong), to leave
// in the same UDP GSO send: one datagram's way through the kernel for both. IBA lets a
// responder coalesce ACKs; a NIC does so for microseconds. What bounds the wait here: the
// application's next call that is not a poll of the QP's CQs or a post to it
// (roce_flush_held), a poll that finds completions after hold_bound_ns, and, when the
// application stops calling, the parked socket's recheck (every park grace, 1 ms) or, for a
// QP whose peer would resend sooner, the hold timer (kHoldTimerId).
SV_FAST_TLS bool t_app_receive = false;  // this thread is in roce_poll and may hold ACKs
SV_FAST_TLS bool t_app_poll = false;     // this thread is in roce_poll (not the port's)
// The application's receive in roce_poll held an ACK back (roce_poll_result reads it).
SV_FAST_TLS bool t_held_in_poll = false;
// The port's thread hands a plain RDMA WRITE's last packet to its link: its ACK may wait
// for the application's reply (RoceLink::hold_ack).
SV_FAST_TLS bool t_write_request = false;
// A switch that is on unless the environment variable `name` starts with 0.
bool on_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return !(v && *v == '0');
}
// How many of a link's ACKs the port's thread held in a row that then left by the timer,
// not with a reply, before it holds none any more.
constexpr int kThreadHoldMisses = 3;
// The port's thread holds a plain WRITE's ACK for the reply (RoceLink::hold_ack);
// SOFTVERBS_WRITE_RIDE=0 turns that off (each WRITE ACKed at once, as before).
bool write_ride_enabled() {
  static const bool on = on_unless_zero("SOFTVERBS_WRITE_RIDE");
  return on;
}
// hosts.twoproc.inject.error_sync: SOFTVERBS_TEST_ERROR_SYNC_DELAY_US=N sleeps N µs between
// a link's error completion and its QP's move to ERR (sync_error), the window in which a
// program that polled the completion must still find the QP in ERR (roce_settle).
void test_error_sync_delay() {
  static const long us = [] {
    const char* v = std::getenv("SOFTVERBS_TEST_ERROR_SYNC_DELAY_US");
    return v ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}
// A plain ACK (credits unlimited), the only kind held back; NAKs and responses never are.
constexpr uint8_t kPlainAck = rw::kAethAck | 0x1f;
// Held back at most this many PSNs past the last ACK that left (the requester may have at
// most packet::kMaxUnackedPsns outstanding): a stream of messages keeps its window open.
constexpr int32_t kHoldAckPsns = 32;
// The port timer that sends every held ACK (engine's own id: the port's have the top bit,
// QPs' are their QPNs).
constexpr uint64_t kHoldTimerId = uint64_t{1} << 61;
// The receive buffer (as the kernel granted it) from which a QP may have
// packet::kMaxUnackedPsnsLarge PSNs in flight.
constexpr size_t kLargeWindowRcvbuf = size_t{2} << 20;
// SOFTVERBS_ACK_HOLD=0 turns holding off.
bool hold_enabled() {
  static const bool on = on_unless_zero("SOFTVERBS_ACK_HOLD");
  return on;
}
// The longest an ACK is held: SOFTVERBS_ACK_HOLD_US (default 100 µs). A QP's own local ACK
// timeout shortens it (hold_bound_ns): its peer's is likely alike.
int64_t hold_max_ns() {
  static const int64_t ns = [] {
    const char* v = std::getenv("SOFTVERBS_ACK_HOLD_US");
    const long us = v && *v ? std::atol(v) : 100;
    return int64_t(std::clamp(us, 0L, 100000L)) * 1000;
  }();
  return ns;
}
// The QPs that hold (or held) an ACK, with their CQs (compared, never dereferenced: a poll
// of one of them keeps the hold), and the hold timer's deadline (0: not pending).
struct HeldEntry {
  uint32_t qpn;
  const void* send_cq;
  const void* recv_cq;
  bool timed;  // its peer resends before the park recheck comes: the hold timer covers it
};
std::mutex g_held_mu;
std::vector<HeldEntry>* g_held = new std::vector<HeldEntry>;  // immortal (port thread)
// When the hold timer fires (steady ns; 0: not pending). Set under g_held_mu; read by the
// polling thread too, which sends what is held once it passed (a loaded CPU may run the
// port's thread late).
std::atomic<int64_t> g_hold_due{0};
// The earliest held_due of an ACK held now (steady ns; may be earlier than that, never
// later): a poll that finds completions past it sends the ACKs whose bound passed, so an
// application that keeps polling needs no timer for them.
std::atomic<int64_t> g_hold_earliest{INT64_MAX};
void lower_hold_earliest(int64_t due) {
  int64_t seen = g_hold_earliest.load(std::memory_order_relaxed);
  while (due < seen && !g_hold_earliest.compare_exchange_weak(seen, due, std::memory_order_relaxed)) {
  }
}

}  // namespace

// Links holding an ACK now (roce.hpp's roce_flush_held reads it).
std::atomic<int> g_roce_held_acks{0};

// SOFTVERBS_TRACE: every RoCE v2 datagram this process sends or receives, as a pcap file.
// The process whose pid is SOFTVERBS_TRACE_OWNER (the one the wrapper exec'ed) writes FILE,
// any other FILE.PID; nullptr when not tracing. A forked child opens its own FILE.PID when it
// first needs one: it must not write into its parent's file through the inherited stream.
namespace {
std::atomic<rw::PcapWriter*> g_trace{nullptr};
std::mutex g_trace_mu;     // opening; held across fork, so a child's copy starts unlocked
bool g_trace_failed = false;  // under g_trace_mu: said once, not retried per packet

const char* trace_file() {
  static const char* const file = [] {
    const char* f = std::getenv("SOFTVERBS_TRACE");
    return f && *f ? f : nullptr;
  }();
  return file;
}

void trace_before_fork() {
  g_trace_mu.lock();
  // Nothing buffered may be left for the child's exit to write into our file again.
  if (rw::PcapWriter* w = g_trace.load(std::memory_order_acquire)) w->flush();
}
void trace_after_fork_in_parent() { g_trace_mu.unlock(); }
void trace_after_fork_in_child() {
  g_trace.store(nullptr, std::memory_order_release);  // the parent's stays open, unused
  g_trace_failed = false;
  g_trace_mu.unlock();
}
}  // namespace

rw::PcapWriter* trace_writer() {
  if (!trace_file()) return nullptr;
  if (rw::PcapWriter* w = g_trace.load(std::memory_order_acquire)) return w;
  static const int fork_handlers [[maybe_unused]] = pthread_atfork(
      trace_before_fork, trace_after_fork_in_parent, trace_after_fork_in_child);
  std::lock_guard<std::mutex> lock(g_trace_mu);
  if (rw::PcapWriter* w = g_trace.load(std::memory_order_acquire)) return w;
  if (g_trace_failed) return nullptr;
  std::string path = trace_file();
  const char* owner = std::getenv("SOFTVERBS_TRACE_OWNER");
  if (!owner || std::atol(owner) != static_cast<long>(getpid()))
    path += "." + std::to_string(getpid());
  auto* w = new rw::PcapWriter;  // immortal: the port's thread writes until exit
  if (!w->open(path.c_str())) {
    std::fprintf(stderr, "softverbs: cannot write the trace %s: %s\n", path.c_str(),
                 std::strerror(errno));
    delete w;
    g_trace_failed = true;
    return nullptr;
  }
  g_debug_hooks.store(true);  // the send path records same-host exchanges too
  g_trace.store(w, std::memory_order_release);
  return w;
}

struct RoceLink final : packet::Env {
  RoceLink(Qp* q)
      : qp(q), pq(*this, packet_type(q->type), q->source_qpn ? q->source_qpn : q->qpn(), q->sq_sig_all),
        inline_ring(q->cap.max_send_wr + 1) {
    if (q->type == IBV_QPT_XRC_SEND) pq.set_xrc(packet::XrcRole::kIni);
    if (q->type == IBV_QPT_XRC_RECV) pq.set_xrc(packet::XrcRole::kTgt);
  }

  ~RoceLink() override { magic = 0; }

  uint32_t magic = kRoceLinkMagic;  // for `softverbs stat` (roce_stat_view)
  Qp* qp;
  std::mutex mu;
  packet::PacketQp pq;
  bool port_held = false;
  // Connected QPs: where packets go and come from (the QP's path, set at RTR).
  ibv_gid sgid{};
  ibv_gid dgid{};
  unsigned qp_access = 0;  // the QP's remote access flags, checked before any rkey
  std::optional<ibv_event_type> error_event;  // raised by sync_error, once the QP is in ERR
  bool sqd_notify = false;  // SQD entered with en_sqd_async_notify
  // UD: the address of each WQE handed over and not yet sent, in order (one packet each).
  struct UdDest {
    ibv_gid sgid, dgid;
    uint8_t hop_limit;
  };
  std::deque<UdDest> ud_dest;
  // Inline data outlives ibv_post_send here: a slot per WQE that can be in flight, plus one.
  std::vector<std::vector<uint8_t>> inline_ring;
  uint64_t posted = 0;
  // The ACK held back (hold_ack), whether our QPN is in g_held, and the last ACK sent.
  std::optional<rw::Packet> held_ack;
  bool held_since_timer = false;  // an ACK was held since the hold timer last ran
  bool held_by_thread = false;    // the port's thread holds it (hold_ack), not a poller
  int thread_hold_misses = 0;     // such holds in a row that the timer sent
  int64_t held_due = 0;           // when the ACK held now must have left (steady ns)
  // The longest an ACK of this QP is held while the application keeps polling: hold_max_ns,
  // or an eighth of the QP's local ACK timeout when that is shorter (0: never held). And an
  // eighth of that timeout alone (none: no timeout set): the most its peer can wait before
  // it resends, however long the application is away.
  int64_t hold_bound_ns = hold_enabled() ? hold_max_ns() : 0;
  int64_t hold_hard_ns = INT64_MAX;
  bool acked_any = false;
  uint32_t acked_psn = 0;
  // Tag matching (engine/tm_responder.cpp): the receive being filled, as matched
  // (tm_take_receive), and the FINs' TMHs, which outlive their WQEs like inline data (more
  // rendezvous than slots unacknowledged at once would be a sender of 256 of them).
  TmArrival tm_arrival;
  std::vector<std::array<uint8_t, kTmhBytes>> tm_fins = std::vector<std::array<uint8_t, kTmhBytes>>(256);
  uint64_t tm_fins_posted = 0;
  // XRC TGT: the XRC SRQ the request being handled names (select_xrc_srq), valid while
  // packet_to_qp holds xrc_srq_lock(); nullptr outside it.
  Srq* xrc_srq = nullptr;
  bool xrc_tgt() const { return qp->type == IBV_QPT_XRC_RECV; }
  // The PD remote accesses are checked against: the XRC SRQ's for a TGT QP (IBA 9.x).
  Pd* access_pd() const { return xrc_tgt() ? (xrc_srq ? xrc_srq->pd : nullptr) : qp->pd; }

  // ---- packet::Env -----------------------------------------------------------------------
  void send_packet(const rw::Packet& pkt, std::span<const packet::Iov> payload) override {
    if (debug_hooks_armed()) {
      // `softverbs inject drop|dup` on a QP of the wire: this datagram lost, or sent twice
      // (the peer's transport sees what a lossy network would give it).
      if (take_one(qp->debug.wire_drop)) {
        trace_dropped(pkt, payload);
        if (qp->type == IBV_QPT_UD && !ud_dest.empty()) ud_dest.pop_front();
        return;
      }
      if (take_one(qp->debug.wire_dup)) {
        if (qp->type == IBV_QPT_UD && !ud_dest.empty()) {
          const UdDest again = ud_dest.front();  // the copy's address, used up by the first
          ud_dest.push_front(again);
        }
        send_datagram(pkt, payload);
      }
    }
    send_datagram(pkt, payload);
  }

  // A datagram `softverbs inject drop` loses on the wire: the sender's trace still has it,
  // as a capture at a NIC's port would (the loss comes after the port).
  void trace_dropped(const rw::Packet& pkt, std::span<const packet::Iov> payload) {
    rw::PcapWriter* t = trace();
    if (!t) return;
    ibv_gid s = sgid, d = dgid;
    if (qp->type == IBV_QPT_UD) {
      if (ud_dest.empty()) return;
      s = ud_dest.front().sgid;
      d = ud_dest.front().dgid;
    }
    std::vector<uint8_t> buf(kMaxDatagram);
    const size_t header = rw::encode_headers(pkt, pkt.payload_len, buf.data(), buf.size());
    const uint8_t pad = rw::pad_bytes(pkt.payload_len);
    const size_t off = header + pkt.payload_len + pad + rw::kIcrcBytes;
    if (!header || off > buf.size()) return;
    size_t at = header;
    for (const packet::Iov& v : payload) {
      if (at + v.len > header + pkt.payload_len) return;
      std::memcpy(buf.data() + at, v.addr, v.len);
      at += v.len;
    }
    std::memset(buf.data() + at, 0, off - at);
    rw::IcrcContext ctx = rw::IcrcContext::from_gids(s.raw, d.raw, port().source_port(qp->qpn()));
    rw::icrc_fill(ctx, buf.data(), off);
    t->write(ctx, buf.data(), off);
  }

  void send_datagram(const rw::Packet& pkt, std::span<const packet::Iov> payload) {
    // A plain ACK may wait for the QP's next packet (hold_ack); everything else leaves now.
    const uint8_t op = pkt.opcode & 0x1f;
    if (op == rw::kAck && pkt.syndrome == kPlainAck) {
      if (hold_ack(pkt)) return;
      drop_held_ack();  // this one acknowledges everything the held one did
    } else if (held_ack && op >= rw::kReadResponseFirst && op <= rw::kAtomicAck) {
      emit_held_ack();  // the responder's packets leave in order
    }
    emit(pkt, payload);
    if (op == rw::kAck && (pkt.syndrome & 0xe0) == rw::kAethAck) {
      acked_any = true;
      acked_psn = pkt.psn & packet::kPsnMask;
    }
  }

  // Holds a plain ACK back when an application thread received its request while it has
  // the socket (parked), unless the requester may be running out of window. It leaves
  // with the QP's next packet (sync_error), or at the application's next call that is not
  // a poll of this QP's CQs or a post to it (roce_flush_held, roce_poll_result), the
  // socket's return to the port's thread, or the hold timer, at most hold_bound_ns after
  // the first ACK held.
  //
  // The port's thread holds one too, for the last packet of a plain RDMA WRITE, when the
  // program is one that polls memory after its completions (Port::eager: a one-sided
  // ping-pong, ib_write_lat): its reply WRITE then takes the ACK along, the peer's poll
  // for that ACK receives the reply with it, and from then on both sides' polls receive
  // everything (docs/roce.md, "One-sided ping-pongs"). The hold timer bounds it; a link
  // whose held ACKs keep leaving by the timer (no reply came) stops.
  bool hold_ack(const rw::Packet& pkt) {
    if (hold_bound_ns <= 0) return false;
    const bool by_app = t_app_receive && port().parked();
    const bool by_thread = !t_app_poll && t_write_request && write_ride_enabled() && port().eager() &&
                           thread_hold_misses < kThreadHoldMisses;
    if (!by_app && !by_thread) return false;
    const uint32_t psn = pkt.psn & packet::kPsnMask;
    if (!acked_any) {
      acked_any = true;
      acked_psn = packet::psn_add(psn, packet::kPsnMask);
    }
    if (packet::psn_diff(psn, acked_psn) >= kHoldAckPsns) return false;
    if (!held_ack) {
      g_roce_held_acks.fetch_add(1, std::memory_order_seq_cst);
      const int64_t due = int64_t(now_ns_steady()) + hold_bound_ns;
      held_due = due;
      held_since_timer = true;
      // While parked the port's thread rechecks every park grace and sends what is held
      // then: enough unless the peer would resend sooner. A timer for every hold would wake
      // that thread on the pinned poller's CPU every 100 µs of a ping-pong (each run
      // preempting the poller), for ACKs that rode with the next SEND long before.
      // (The recheck sends only ACKs past their bound while the application still polls,
      // so one may wait two park graces; the port's thread's holds have no recheck.)
      const bool timed = by_thread || hold_hard_ns < 2 * port().park_grace_ns();
      std::lock_guard<std::mutex> lock(g_held_mu);
      lower_hold_earliest(due);
      const uint32_t qpn = qp->qpn();
      auto it = std::find_if(g_held->begin(), g_held->end(), [qpn](const HeldEntry& e) { return e.qpn == qpn; });
      if (it == g_held->end()) g_held->push_back({qpn, qp->send_cq, qp->recv_cq, timed});
      else it->timed = timed;
      // One timer for all timed holds: moved earlier when this ACK is due first.
      const int64_t pending = g_hold_due.load(std::memory_order_relaxed);
      if (timed && (pending == 0 || due < pending)) {
        g_hold_due.store(due, std::memory_order_relaxed);
        port().schedule(kHoldTimerId, rw::Port::Clock::time_point(std::chrono::nanoseconds(due)));
      }
    }
    held_ack = pkt;
    held_by_thread = by_thread;
    if (by_app) t_held_in_poll = true;
    // Given back meanwhile: whoever gave it back may have looked at g_held already.
    if (by_app && !port().parked()) emit_held_ack();
    return true;
  }
  void drop_held_ack() {
    if (!held_ack) return;
    held_ack.reset();
    held_by_thread = false;
    g_roce_held_acks.fetch_sub(1, std::memory_order_seq_cst);
  }
  void emit_held_ack() {
    if (!held_ack) return;
    const rw::Packet ack = *held_ack;
    drop_held_ack();
    emit(ack, {});
    acked_any = true;
    acked_psn = ack.psn & packet::kPsnMask;
  }

  // Encodes one packet into this thread's send batch.
  void emit(const rw::Packet& pkt, std::span<const packet::Iov> payload) {
    ibv_gid s = sgid, d = dgid;
    uint8_t hop_limit = 0;
    if (qp->type == IBV_QPT_UD) {
      if (ud_dest.empty()) return;
      s = ud_dest.front().sgid;
      d = ud_dest.front().dgid;
      hop_limit = ud_dest.front().hop_limit;
      ud_dest.pop_front();
    }
    OutBatch& batch = out_batch();
    const bool gather = gather_enabled();
    if (batch.used + kMaxDatagram > OutBatch::kBytes || batch.n == OutBatch::kMaxGroups ||
        batch.niov + payload.size() + 2 > OutBatch::kMaxIov)
      flush();
    uint8_t* buf = batch.data + batch.used;
    const size_t header = rw::encode_headers(pkt, pkt.payload_len, buf, kMaxDatagram);
    const uint8_t pad = rw::pad_bytes(pkt.payload_len);
    const size_t off = header + pkt.payload_len + pad + rw::kIcrcBytes;  // the datagram
    if (!header || off > kMaxDatagram) return;
    size_t iovs = gather ? payload.size() + 2 : 1;  // header, payload..., trailer
    uint32_t flow = qp->qpn();  // one source socket per QP keeps its packets in order
    rw::IpAddress src = rw::IpAddress::from_gid(s.raw);
    rw::IpAddress dst = rw::IpAddress::from_gid(d.raw);
    const bool multicast = dst.is_multicast();  // UD to a group: never in a GSO send
    // Joins the last group when it goes the same way and this packet is no longer than its
    // packets; else it starts a group of its own.
    size_t g = batch.n;
    if (gso_enabled() && batch.n > 0 && !multicast) {
      size_t last = batch.n - 1;
      const rw::OutDatagram& o = batch.out[last];
      uint32_t seg = batch.segments[last] == 1 ? static_cast<uint32_t>(o.size) : o.segment;
      if (!batch.closed[last] && o.dst == dst && batch.src[last] == src && o.flow == flow &&
          off <= seg && batch.segments[last] < OutBatch::kMaxSegments &&
          o.size + off <= OutBatch::kMaxGroupBytes && o.iovcnt + iovs <= OutBatch::kMaxGroupIov &&
          (gather || static_cast<const uint8_t*>(o.data) + o.size == buf))
        g = last;
    }
    uint16_t ipv4_id = g == batch.n ? 0 : static_cast<uint16_t>(batch.segments[g]);
    rw::IcrcContext ctx = rw::IcrcContext::from_gids(s.raw, d.raw, port().source_port(flow));
    ctx.ipv4_id = ipv4_id;  // its place in the GSO group: the kernel numbers them so
    iovec* iov = batch.iov + batch.niov;
    if (gather) {
      // The header, then the payload where it lies, then pad and ICRC after the header.
      rw::IcrcBuilder crc(ctx, off);
      crc.add(buf, header);
      *iov++ = {buf, header};
      for (const packet::Iov& v : payload) {
        crc.add(v.addr, v.len);
        *iov++ = {const_cast<uint8_t*>(v.addr), v.len};
      }
      uint8_t* trailer = buf + header;
      std::memset(trailer, 0, pad);
      crc.add(trailer, pad);
      const uint32_t value = crc.value();
      std::memcpy(trailer + pad, &value, rw::kIcrcBytes);  // least significant byte first
      *iov++ = {trailer, size_t{pad} + rw::kIcrcBytes};
      batch.used += header + pad + rw::kIcrcBytes;
    } else {
      size_t at = header;
      for (const packet::Iov& v : payload) {
        std::memcpy(buf + at, v.addr, v.len);
        at += v.len;
      }
      std::memset(buf + at, 0, pad + rw::kIcrcBytes);
      rw::icrc_fill(ctx, buf, off);
      if (rw::PcapWriter* t = trace()) t->write(ctx, buf, off);
      // Right after the group's last datagram: one iovec for the group's bytes (the kernel
      // then copies a GSO send in one run, not a datagram at a time).
      iovec* prev = batch.niov > 0 ? &batch.iov[batch.niov - 1] : nullptr;
      if (g != batch.n && prev && static_cast<uint8_t*>(prev->iov_base) + prev->iov_len == buf) {
        prev->iov_len += off;
        iovs = 0;
      } else {
        *iov++ = {buf, off};
      }
      batch.used += off;
    }
    batch.niov += iovs;
    if (g == batch.n) {
      batch.src[g] = src;
      batch.out[g] = {dst, flow, buf, off, &batch.src[g]};
      batch.out[g].iov = iov - iovs;
      batch.out[g].iovcnt = iovs;
      if (multicast) {
        // Out of the interface of the AH's source GID, with its hop limit (at least 1:
        // TTL 0 would not leave the host), as a RoCE v2 NIC puts GRH.HopLmt in the TTL.
        batch.out[g].ifindex = gid_ifindex(s);
        batch.out[g].hop_limit = hop_limit ? hop_limit : 1;
      }
      batch.segments[g] = 1;
      batch.closed[g] = false;
      ++batch.n;
    } else {
      rw::OutDatagram& o = batch.out[g];
      if (batch.segments[g] == 1) o.segment = static_cast<uint16_t>(o.size);
      if (off < o.segment) batch.closed[g] = true;
      o.size += off;
      o.iovcnt += iovs;
      ++batch.segments[g];
    }
  }

  // Sends what this thread's calls into links produced. Called at the end of every call into
  // pq (link mu held: a QP's packets leave in order).
  static void flush() {
    OutBatch& batch = out_batch();
    if (batch.n) port().send_batch(batch.out, batch.n);
    batch.n = 0;
    batch.used = 0;
    batch.niov = 0;
  }

  uint64_t now_ns() override { return now_ns_steady(); }

  void arm_timer(uint64_t deadline_ns) override {
    port().schedule(qp->qpn(), rw::Port::Clock::time_point(std::chrono::nanoseconds(deadline_ns)));
  }
  void cancel_timer() override { port().cancel(qp->qpn()); }

  packet::RkeyResult resolve_rkey(uint32_t rkey, uint64_t va, uint32_t len, int access) override {
    if ((qp_access & static_cast<unsigned>(access)) != static_cast<unsigned>(access)) return {};
    iovec at{};
    const auto need = static_cast<unsigned>(access);
    Pd* pd = access_pd();
    if (!pd || !softverbs::resolve_rkey(pd, qp->qpn(), rkey, va, len, need, &at)) return {};
    return {static_cast<uint8_t*>(at.iov_base), true};
  }

  bool flush(uint32_t rkey, uint64_t va, uint32_t len, uint8_t type, uint8_t level) override {
    unsigned need = ((type & kFlushGlobal) ? kAccessFlushGlobal : 0) |
                    ((type & kFlushPersistent) ? kAccessFlushPersistent : 0);
    if ((qp_access & need) != need) return false;  // the QP's flush access too (as rxe)
    if (!access_pd()) return false;
    return flush_memory(access_pd(), rkey, va, len, type, level);
  }

  void rnr_nak_taken() override {
    if (check_hooks::rnr_wait) check_hooks::rnr_wait(qp);
  }

  // ---- `softverbs inject`'s responder faults (debug_respond.cpp) in the packets' terms
  packet::InjectedFault responder_fault(bool needs_receive, uint8_t min_rnr_timer) override {
    packet::InjectedFault out;
    if (!qp->debug.responder_faults()) return out;
    const ResponderFault f = take_responder_fault(qp, needs_receive, min_rnr_timer);
    const auto nak = [](ibv_wc_status s) -> uint8_t {
      return s == IBV_WC_REM_ACCESS_ERR    ? rw::kNakRemoteAccessError
             : s == IBV_WC_REM_INV_REQ_ERR ? rw::kNakInvalidRequest
                                           : rw::kNakRemoteOperationalError;
    };
    if (f.event >= 0) out.event = static_cast<ibv_event_type>(f.event);
    switch (f.kind) {
      case ResponderFault::kNone: break;
      case ResponderFault::kRnr: out.kind = packet::InjectedFault::kRnr; out.code = f.rnr_timer; break;
      case ResponderFault::kNak: out.kind = packet::InjectedFault::kNak; out.code = nak(f.requester_status); break;
      case ResponderFault::kReceive:
        out.kind = packet::InjectedFault::kReceive;
        out.code = nak(f.requester_status);
        out.recv_status = f.recv_status;
        break;
    }
    return out;
  }
  void give_back_fault() override { give_back_responder_fault(qp); }
  // ---- end

  // XRC TGT: a type 2 window of the XRC SRQ's PD, as on one host (engine/responder.cpp).
  bool invalidate_rkey(uint32_t rkey) override {
    Pd* pd = access_pd();
    return pd && MrTable::instance().invalidate(rkey, pd, qp->qpn(), !xrc_tgt());
  }

  packet::XrcSrqPlace select_xrc_srq(uint32_t srqn) override {
    xrc_srq = nullptr;
    if (!xrc_tgt()) return packet::XrcSrqPlace::kNone;
    // Another process's number: that process checks it (deliver_xrc_elsewhere).
    if (wire::slot_of_qpn(srqn) != wire::my_slot()) return packet::XrcSrqPlace::kElsewhere;
    xrc_srq = find_xrc_srq_locked(srqn, qp->xrc_domain.get());
    if (!xrc_srq) return packet::XrcSrqPlace::kNone;
    // Its CQ is fed from the wire from now on: an empty poll receives from the port.
    xrc_srq->xrc_cq->roce_fed.store(true, std::memory_order_relaxed);
    return packet::XrcSrqPlace::kHere;
  }

  // Runs a whole operation on another process's XRC SRQ, through its delivery thread
  // (which reads the payload from, and writes results into, this process's memory).
  packet::XrcVerdict xrc_forward(const packet::XrcAway& a) override {
    const bool back = !a.result.empty();
    iovec at{back ? static_cast<void*>(a.result.data()) : const_cast<uint8_t*>(a.payload.data()),
             back ? a.result.size() : a.payload.size()};
    wire::Request req;
    req.src_qpn = a.src_qpn;
    req.dst_qpn = qp->qpn();
    req.type = IBV_QPT_XRC_SEND;
    req.opcode = a.opcode;
    req.flags = a.solicited ? IBV_SEND_SOLICITED : 0;
    req.imm = a.imm;
    req.remote_addr = a.va;
    req.rkey = a.rkey;
    req.xrc_srqn = a.srqn;
    req.compare_add = a.compare_add;
    req.swap = a.swap;
    req.length = a.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || a.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD
                     ? 8 : at.iov_len;
    req.local = &at;
    req.nlocal = at.iov_len ? 1 : 0;
    req.pid = wire::self_pid();
    wire::XrcTarget x;  // the QP's attributes as this link holds them (mu, not attr_mu)
    x.access = qp_access;
    x.min_rnr_timer = a.min_rnr_timer;
    x.max_dest_rd_atomic = a.max_dest_rd_atomic;
    int tgt_error = wire::kXrcTgtFine;
    const Outcome out = deliver_xrc_elsewhere(req, qp, x, &tgt_error);
    packet::XrcVerdict v;
    switch (out.kind) {
      case Outcome::Ack: v.kind = packet::XrcVerdict::kAck; break;
      case Outcome::RnrNak: v.kind = packet::XrcVerdict::kRnr; v.code = out.rnr_timer; break;
      case Outcome::NoResponse: v.kind = packet::XrcVerdict::kNone; break;
      case Outcome::Error:
        v.kind = packet::XrcVerdict::kNak;
        v.code = out.status == IBV_WC_REM_ACCESS_ERR ? rw::kNakRemoteAccessError
                 : out.status == IBV_WC_REM_INV_REQ_ERR ? rw::kNakInvalidRequest
                                                        : rw::kNakRemoteOperationalError;
        // What the QP's process said: only the events the same-host path takes (agent.cpp).
        if (tgt_error >= 0) v.event = static_cast<ibv_event_type>(tgt_error);
        break;
    }
    return v;
  }

  std::optional<packet::RecvWqe> take_receive(std::span<const uint8_t> first) override {
    if (qp->type == IBV_QPT_UD) feed_from_wire(qp->recv_cq);  // a datagram from the wire
    Srq* srq = xrc_tgt() ? xrc_srq : qp->srq;
    if (xrc_tgt() && !srq) return std::nullopt;
    // An SRQ's receives are not this QP's to flush when it fails.
    if (srq && pq.state() == IBV_QPS_ERR) return std::nullopt;
    // A TM-SRQ matches the SEND's first bytes (a flush, with none, takes nothing of it).
    if (srq && srq->tm) {
      if (first.empty()) return std::nullopt;
      return tm_take_receive(qp, first, &tm_arrival);
    }
    QueueMutex& lock_mu = srq ? srq->mu : qp->rq_mu;
    RingQueue<RecvWqe>& q = srq ? srq->rq : qp->rq;
    std::lock_guard<QueueMutex> lock(lock_mu);
    // (An SRQ receive promised to a message in a receive window counts as not there.)
    uint64_t number = 0;
    if (srq ? !srq_take_local(srq, &number) : q.empty()) return std::nullopt;
    const RecvWqe& taken = srq ? srq_receive(srq, number) : q.front();
    packet::RecvWqe r;
    r.wr_id = taken.wr_id;
    for (const Sge& s : taken.sges) {
      if (s.length == 0) continue;
      iovec at{};
      // A buffer that fails its key check holds nothing: the message does not fit it, and
      // the receive completes with IBV_WC_LOC_PROT_ERR (as on the same host).
      if (!resolve_sge(srq ? srq->pd : qp->pd, s.lkey, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, &at)) {
        r.sg.clear();
        r.key_error = true;
        break;
      }
      r.sg.push_back({static_cast<uint8_t*>(at.iov_base), static_cast<uint32_t>(at.iov_len)});
    }
    if (srq)
      srq_consume(srq, number);  // (also raises the SRQ limit event)
    else
      q.pop_front();
    return r;
  }

  void push_completion(packet::WorkQueue queue, const packet::Completion& c) override {
    if (c.tm.kind) {  // tag matching's: a TM-SRQ receive, or the rendezvous' own work
      if (queue == packet::WorkQueue::kRecv)
        tm_complete_receive(qp, c, &tm_arrival);
      else
        tm_complete_work(qp, c);
      return;
    }
    ibv_wc wc{};
    wc.wr_id = c.wr_id;
    wc.status = c.status;
    wc.opcode = c.opcode;
    wc.vendor_err = c.vendor_err;
    wc.byte_len = c.byte_len;
    wc.imm_data = c.imm_data;
    wc.qp_num = qp->qpn();
    wc.src_qp = c.src_qp;
    wc.wc_flags = c.wc_flags;
    wc.pkey_index = c.pkey_index;
    wc.sl = c.sl;  // UD: the GRH slot's L3 header type (wire/roce/grh.hpp)
    if (c.status != IBV_WC_SUCCESS) {  // ibv_poll_cq(3): on error only these are valid
      wc.opcode = {};
      wc.byte_len = wc.imm_data = wc.src_qp = wc.wc_flags = 0;
    }
    Cq* cq = queue == packet::WorkQueue::kSend ? qp->send_cq : qp->recv_cq;
    // XRC TGT: a receive completes on its XRC SRQ's CQ, with the TGT QP's number.
    if (xrc_tgt() && queue == packet::WorkQueue::kRecv) {
      if (!xrc_srq) return;
      cq = xrc_srq->xrc_cq;
    }
    cq_push(cq, wc, c.solicited);
  }

  void raise_event(ibv_event_type type) override {
    // SQ_DRAINED only when the application asked for it on entering SQD.
    if (type == IBV_EVENT_SQ_DRAINED && !std::exchange(sqd_notify, false)) return;
    // An error event waits for sync_error: whoever reads it must find the QP in ERR already.
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_ACCESS_ERR ||
        type == IBV_EVENT_QP_REQ_ERR) {
      error_event = type;
      return;
    }
    raise_qp_event(qp, type);
  }

  uint64_t atomic_execute(uint8_t* addr, ibv_wr_opcode op, uint64_t compare_add,
                          uint64_t swap) override {
    auto* word = reinterpret_cast<uint64_t*>(addr);
    if (op == IBV_WR_ATOMIC_WRITE) return __atomic_exchange_n(word, compare_add, __ATOMIC_SEQ_CST);
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      uint64_t old = compare_add;
      __atomic_compare_exchange_n(word, &old, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return old;
    }
    return __atomic_fetch_add(word, compare_add, __ATOMIC_SEQ_CST);
  }

  // After any call into pq (link mu held): a QP whose protocol failed moves to ERR as a
  // whole, with what the verbs layer holds flushed too.
  // ... and sends what the call produced.
  void sync_error() {
    // ERR before the NAK leaves: a requester that saw it finds this QP in ERR.
    if (pq.state() == IBV_QPS_ERR && qp->state.load() != IBV_QPS_ERR) {
      test_error_sync_delay();
      set_error(qp, error_event ? int(*error_event) : -1);
    } else if (error_event) {
      raise_qp_event(qp, *error_event);
    }
    error_event.reset();
    // A held ACK goes with the packets this call produced (one GSO send, when it is no
    // longer than they are), or at once outside an application's receive, unless the
    // port's thread holds it for the reply.
    if (held_ack && out_batch().n > 0) {
      if (held_by_thread) thread_hold_misses = 0;  // it rode
      emit_held_ack();
    } else if (held_ack && !t_app_receive && !held_by_thread) {
      emit_held_ack();
    }
    flush();
  }
};

namespace {

// Runs `fn` on the link of each QP in g_held that `pick` picks (link mu held), then sends
// what it produced.
template <typename Pick, typename Fn>
void for_held_links(Pick pick, Fn fn) {
  thread_local std::vector<uint32_t> qpns;  // the port's thread and pollers: no allocation
  qpns.clear();
  {
    std::lock_guard<std::mutex> lock(g_held_mu);
    for (const HeldEntry& e : *g_held)
      if (pick(e)) qpns.push_back(e.qpn);
  }
  for (uint32_t qpn : qpns) {
    wire::QpRef qp = wire::find_local(qpn);
    if (!qp) continue;
    RoceLink* link = qp->roce.load(std::memory_order_acquire);
    if (!link) continue;
    std::lock_guard<std::mutex> lock(link->mu);
    fn(*link);
    RoceLink::flush();
  }
}

// Sends every ACK held back (RoceLink::hold_ack), but those of QPs `keep` keeps.
template <typename Keep>
void flush_held_acks_but(Keep keep) {
  if (g_roce_held_acks.load(std::memory_order_seq_cst) == 0) return;
  for_held_links([&](const HeldEntry& e) { return !keep(e); },
                 [](RoceLink& link) { link.emit_held_ack(); });
}
void flush_held_acks() {
  flush_held_acks_but([](const HeldEntry&) { return false; });
}

// The hold timer and the parked socket's recheck (port's thread): the held ACKs whose
// bound passed leave, and all of them when the recheck gave the socket back (the
// application went away). While the application polls, its polls send what is due; a
// recheck or timer run that sent one it still held for a reply broke a ping-pong's ride.
// While timed QPs keep holding the timer runs every hold_max_ns (a ping-pong's ACKs ride
// with its packets, and then it finds nothing), so that their holds need no timer call of
// their own; a QP that held nothing since the last run is taken off the list, and the
// timer stops once no timed QP is left on it.
void on_hold_timer(bool recheck) {
  if (!recheck) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    g_hold_due.store(0, std::memory_order_relaxed);
  }
  const bool all = recheck && !port().parked();
  const int64_t now = int64_t(now_ns_steady());
  for_held_links([](const HeldEntry&) { return true; }, [&](RoceLink& link) {
    if (link.held_ack && (all || link.held_due <= now)) {
      if (link.held_by_thread) ++link.thread_hold_misses;  // no reply took it
      link.emit_held_ack();
    }
    if (std::exchange(link.held_since_timer, false) || link.held_ack) return;
    // Taken off under the link's mu: a hold that came after this run saw the QP's entry
    // and did not add it again, so an entry erased later (after the link's mu was let go)
    // left that ACK held with nothing to ever send it.
    const uint32_t qpn = link.qp->qpn();
    std::lock_guard<std::mutex> lock(g_held_mu);
    std::erase_if(*g_held, [qpn](const HeldEntry& e) { return e.qpn == qpn; });
  });
  std::lock_guard<std::mutex> lock(g_held_mu);
  if (std::none_of(g_held->begin(), g_held->end(), [](const HeldEntry& e) { return e.timed; }) ||
      g_hold_due.load(std::memory_order_relaxed) != 0)
    return;
  const int64_t due = int64_t(now_ns_steady()) + hold_max_ns();
  g_hold_due.store(due, std::memory_order_relaxed);
  port().schedule(kHoldTimerId, rw::Port::Clock::time_point(std::chrono::nanoseconds(due)));
}

// Multicast groups this process's QPs are attached to (roce_attach_mcast): by group
// address, each attachment with what it holds of the port.
struct McastAttachment {
  uint32_t qpn;
  bool port_held;
  std::vector<int> ifindexes;  // the interfaces it joined the group on
};
using McastGroups = std::map<rw::IpAddress, std::vector<McastAttachment>>;
std::mutex g_mcast_mu;
McastGroups* g_mcast = new McastGroups;  // immortal: the port's thread reads it until exit

// The QPs of this process attached to `group` now.
std::vector<uint32_t> mcast_members_here(const rw::IpAddress& group) {
  std::vector<uint32_t> qpns;
  std::lock_guard<std::mutex> lock(g_mcast_mu);
  auto it = g_mcast->find(group);
  if (it != g_mcast->end())
    for (const McastAttachment& a : it->second) qpns.push_back(a.qpn);
  return qpns;
}

// The interfaces a group is joined on: every one with a GID of the group's family, but
// loopback (this host's members get their copies through shared memory).
std::vector<int> group_interfaces(const rw::IpAddress& group) {
  std::vector<int> ifs;
  for (const GidEntry& e : Device::instance().gids()) {
    rw::IpAddress a = rw::IpAddress::from_gid(e.gid.raw);
    if (e.ifindex <= 0 || a.is_loopback() || a.is_v4() != group.is_v4()) continue;
    if (std::find(ifs.begin(), ifs.end(), e.ifindex) == ifs.end()) ifs.push_back(e.ifindex);
  }
  return ifs;
}

// Builds the 40-byte GRH image a UD receive starts with, as a RoCE v2 NIC does.
void ud_grh(const rw::Datagram& d, uint32_t payload, uint8_t out[40]) {
  build_grh(out, gid_of(d.src), gid_of(d.dst), payload);
}

// The registry slot a CM answer names (the top 10 bits of the comm or request ID we gave
// it, decision 0007), or 0 for a request (REQ, SIDR_REQ) or anything else.
int cm_slot_named(const uint8_t* mad, uint32_t len) { return int(rw::cm_answer_id(mad, len) >> 22); }

// The registry slot of the process that listens on the service ID a REQ or SIDR_REQ asks
// for (it holds the port's rdma_cm name, decision 0004) and runs a QP1 agent; -1 when it
// is not a request, nobody listens there, or the listener has no agent.
int cm_slot_listening(const uint8_t* mad, uint32_t len) {
  uint64_t sid;
  rw::PortSpace ps;
  uint16_t udp_port;
  if (!rw::cm_request_service(mad, len, &sid) || !rw::parse_service_id(sid, &ps, &udp_port))
    return -1;
  pid_t pid = cm_port_holder(int(ps), udp_port);
  return pid > 0 ? wire::slot_of_pid_with(pid, wire::kSlotHasGsi) : -1;
}

bool is_drep(const uint8_t* mad, uint32_t len) {
  return len == rw::kMadBytes && mad[1] == rw::kMgmtClassCm &&
         (uint16_t(mad[16]) << 8 | mad[17]) == uint16_t(rw::CmAttr::kDrep);
}

bool slot_alive(int slot) {
  pid_t pid = wire::slot_owner(slot);
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

// What the host's CM answers for a MAD no CM process of this host will see (none runs, or
// it names a process that is gone): REJ 8, SIDR_REP status 1 or DREP, as the kernel's CM
// does (rw::cm_stateless_answer), sent from QP1 to the sender's QP1. One answer of the same
// size per request: nothing to amplify.
void answer_for_host(const rw::Datagram& d, const rw::Packet& pkt) {
  uint8_t mad[rw::kMadBytes];
  if (!rw::cm_stateless_answer(pkt.payload, pkt.payload_len, mad)) return;
  uint8_t buf[rw::kGmpDatagramBytes];
  size_t n = rw::encode_gmp(rw::Gmp{}, mad, buf, sizeof buf);
  if (!n) return;
  const uint32_t flow = rw::kGsiQpn;
  rw::IcrcContext ctx = rw::IcrcContext::from_gids(d.dst.bytes.data(), d.src.bytes.data(),
                                                   port().source_port(flow));
  rw::icrc_fill(ctx, buf, n);
  if (rw::PcapWriter* t = trace()) t->write(ctx, buf, n);
  rw::OutDatagram out{d.src, flow, buf, n, &d.dst};
  port().send_batch(&out, 1);
}

// The QPN of this process's QP1 agent (roce_claim_gsi), 0 when there is none.
std::atomic<uint32_t> g_gsi_qpn{0};

void packet_to_qp(uint32_t qpn, const rw::Datagram& d, const rw::Packet& pkt);

void on_datagram(const rw::Datagram& d) {
  rw::IcrcContext ctx = rw::IcrcContext::from_gids(d.src.bytes.data(), d.dst.bytes.data(),
                                                   d.src_port, roce_udp_port());
  // The IPv4 ID expected: the one after the last datagram's. A UDP GSO send's segments
  // carry 0, 1, 2...; the check then needs no search (icrc_check; 0 is tried too).
  SV_FAST_TLS uint16_t t_next_ipv4_id = 0;
  ctx.ipv4_id = t_next_ipv4_id;
  rw::Packet pkt;
  bool decoded = rw::decode_checked(d.data, d.size, &pkt) == rw::DecodeError::kOk;
  rw::IcrcCheck icrc = decoded ? rw::icrc_check(ctx, d.data, d.size) : rw::IcrcCheck{};
  ctx.ipv4_id = 0;
  if (icrc.ok()) t_next_ipv4_id = uint16_t(icrc.ipv4_id + 1);
  if (rw::PcapWriter* t = trace()) {
    // With the sender's IPv4 ID where the check found it, so the frame's ICRC holds.
    if (icrc.ok()) {
      ctx.ipv4_id = icrc.ipv4_id;
      ctx.ipv4_df = icrc.ipv4_df;
    }
    t->write(ctx, d.data, d.size);
  }
  if (!decoded || !icrc.ok()) return;  // malformed or damaged: never executed
  uint32_t dest = pkt.dest_qp;
  if (dest == packet::kMulticastQpn) {
    // To a group (decision 0008): the kernel gave this process its own copy because its
    // socket joined the group; each of its QPs attached to it gets one. Never forwarded:
    // every other process that has members got its own copy too.
    if (!d.dst.is_multicast()) return;
    for (uint32_t qpn : mcast_members_here(d.dst)) packet_to_qp(qpn, d, pkt);
    return;
  }
  if (dest == rw::kGsiQpn) {
    // A MAD for the host's CM (decision 0007): an answer names the process it is for (its
    // comm or request ID carries the slot); a request goes to our agent, or, without one,
    // to the lowest-slot process that runs one. The steering sends QP1 to the group's
    // lowest slot, which may have none.
    // A REQ or SIDR_REQ goes to the process listening on its service ID when that is
    // another one. A datagram is passed on at most once; what no CM process of this
    // host will see is answered here (answer_for_host).
    int mine = wire::my_slot();
    int named = cm_slot_named(pkt.payload, pkt.payload_len);
    dest = g_gsi_qpn.load(std::memory_order_acquire);
    if (named > 0 && named != mine) {
      // The named process may be gone. A DREP then answers a DREQ the host's CM process
      // (the lowest slot with an agent) sent for it (its connections, cm/orphans.hpp): it
      // goes to that one; anything else is answered here.
      bool drep = is_drep(pkt.payload, pkt.payload_len);
      if (d.forwarded) {
        if (!drep || !dest || slot_alive(named)) return;
      } else {
        if (port().pass_to(d, named) || slot_alive(named)) return;
        if (!drep) {
          answer_for_host(d, pkt);
          return;
        }
        int host_cm = wire::lowest_slot_with(wire::kSlotHasGsi, -1);
        if (host_cm != mine || !dest) {
          if (host_cm > 0) port().pass_to(d, host_cm);
          return;
        }
      }
    } else if (!d.forwarded) {
      int listener = cm_slot_listening(pkt.payload, pkt.payload_len);
      if (listener > 0 && listener != mine && port().pass_to(d, listener)) return;
    }
    if (!dest) {
      if (d.forwarded) return;
      if (int to = wire::lowest_slot_with(wire::kSlotHasGsi, mine); to > 0) port().pass_to(d, to);
      else answer_for_host(d, pkt);  // no CM process on this host
      return;
    }
  }
  packet_to_qp(dest, d, pkt);
}

// A receive buffer's datagrams are one flow (UDP GRO), a stream's mostly for one QP: the QP
// found for one is kept for the buffer's next (Datagram::more) and let go at the buffer's
// end (end_of_buffer), so a QP's destroy waits for one buffer at most. Saves the registry's
// lock, map look-up and reference count per packet (~5 % of a 1 MiB stream receiver's CPU).
struct BufferQp {
  uint32_t qpn = 0;
  wire::QpRef qp;
};

void end_of_buffer() {
  if (BufferQp* kept = FastTlsHeap<BufferQp>::peek()) kept->qp.reset();
}

// Hands a checked packet to the link of this process's QP `qpn`, if it has one.
void packet_to_qp(uint32_t qpn, const rw::Datagram& d, const rw::Packet& pkt) {
  BufferQp& kept = FastTlsHeap<BufferQp>::get();
  wire::QpRef found;
  if (!kept.qp || kept.qpn != qpn) {
    kept.qp.reset();
    found = wire::find_local(qpn);
    if (!found) return;
    if (d.more) {
      kept.qpn = qpn;
      kept.qp = std::move(found);
    }
  }
  Qp* qp = found ? found.get() : kept.qp.get();
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return;
  uint8_t grh[40];
  bool ud = qp->type == IBV_QPT_UD;
  if (ud) ud_grh(d, pkt.payload_len, grh);
  std::shared_lock keys(MrTable::instance().lock());
  // XRC TGT: the XRC SRQs stay while the packet is handled (keys, SRQ table, link).
  std::shared_lock xrc_srqs(xrc_srq_lock(), std::defer_lock);
  if (qp->type == IBV_QPT_XRC_RECV) xrc_srqs.lock();
  std::lock_guard<std::mutex> lock(link->mu);
  // A connected QP hears only its peer.
  if (!ud && std::memcmp(link->dgid.raw, d.src.bytes.data(), 16) != 0) return;
  const uint8_t op = pkt.opcode & 0x1f;
  t_write_request = !ud && (op == rw::kWriteOnly || op == rw::kWriteLast);
  link->pq.on_packet(pkt, ud ? grh : nullptr);
  t_write_request = false;
  link->xrc_srq = nullptr;
  link->sync_error();
}

void on_timer(uint64_t qpn) {
  if (qpn == rw::Port::kRecheckTimerId) return on_hold_timer(true);
  if (qpn == kHoldTimerId) return on_hold_timer(false);
  wire::QpRef qp = wire::find_local(static_cast<uint32_t>(qpn));
  if (!qp) return;
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return;
  std::shared_lock keys(MrTable::instance().lock());
  std::lock_guard<std::mutex> lock(link->mu);
  link->pq.on_timer();
  link->sync_error();
}

bool writes_local(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
         op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

}  // namespace

void roce_modify(Qp* qp, const ibv_qp_attr& attr, int mask) {
  if (qp->type == IBV_QPT_RAW_PACKET) return;  // Ethernet frames, not IBA packets
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  bool to_rtr = (mask & IBV_QP_STATE) && attr.qp_state == IBV_QPS_RTR;
  if (!link) {
    if (!to_rtr) return;
    if (qp->type != IBV_QPT_UD && qp->send_path.route != wire::Route::Roce) return;
    // A unit test's fake transport on the roce route takes the requests instead.
    if (wire::transport(wire::Route::Roce)) return;
    link = new RoceLink(qp);
    int err = port().acquire();
    link->port_held = err == 0;
    // A wider window where our receive buffer is large (the peer's, likely alike, holds
    // it): a 1 MiB stream between the namespaces went ~1.0 -> ~1.3 GB/s with 256 PSNs in
    // flight. With net.core.rmem_max at its default (208 KiB, 416 KiB granted) 512 PSNs
    // overflowed the receiver's socket (RcvbufErrors) and 256 came close: 128 there.
    if (port().receive_buffer_bytes() >= kLargeWindowRcvbuf)
      link->pq.set_max_unacked_psns(packet::kMaxUnackedPsnsLarge);
    if (err) {
      static std::once_flag told;
      std::call_once(told, [err] {
        std::fprintf(stderr, "softverbs: RoCE v2 port %u unavailable (%s): no traffic with other hosts\n",
                     roce_udp_port(), std::strerror(-err));
      });
    }
    // The protocol state starts where the QP is: INIT with its attributes so far.
    ibv_qp_attr init;
    {
      std::lock_guard<std::mutex> attrs(qp->attr_mu);
      init = qp->attr;
    }
    init.qp_state = IBV_QPS_INIT;
    {
      std::lock_guard<std::mutex> lock(link->mu);
      link->pq.modify(init, IBV_QP_STATE | IBV_QP_QKEY);
    }
    qp->roce.store(link, std::memory_order_release);
    // A UD QP's CQs only once it meets the wire (roce_post, take_receive): one that talks
    // to this host alone (shm_ud.cpp) then polls without a system call each time.
    if (qp->type != IBV_QPT_UD)
      for (Cq* cq : {qp->send_cq, qp->recv_cq}) feed_from_wire(cq);
  }
  ibv_qp_attr a = attr;
  {
    std::lock_guard<std::mutex> attrs(qp->attr_mu);
    const ibv_qp_attr& cur = qp->attr;
    int sgid_index = cur.ah_attr.grh.sgid_index;
    const auto& gids = Device::instance().gids();
    std::lock_guard<std::mutex> lock(link->mu);
    link->qp_access = cur.qp_access_flags;
    link->dgid = cur.ah_attr.grh.dgid;
    if (sgid_index < static_cast<int>(gids.size())) {
      link->sgid = gids[sgid_index].gid;
      if (mask & IBV_QP_PATH_MTU) {
        ibv_mtu fits = interface_mtu(gids[sgid_index].ifindex, !is_ipv4_mapped(link->sgid));
        if (a.path_mtu > fits) a.path_mtu = fits;
      }
    }
  }
  std::lock_guard<std::mutex> lock(link->mu);
  if ((mask & IBV_QP_TIMEOUT) && a.timeout && hold_enabled()) {
    // An eighth of the QP's local ACK timeout (4.096 µs x 2^timeout): its peer's is likely
    // alike, and a held ACK must not make that peer resend.
    const int64_t rto_ns = int64_t(4096) << std::min<int>(a.timeout, 31);
    link->hold_bound_ns = std::min(hold_max_ns(), rto_ns / 8);
    link->hold_hard_ns = rto_ns / 8;
  }
  if ((mask & IBV_QP_STATE) && a.qp_state == IBV_QPS_SQD)
    link->sqd_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && a.en_sqd_async_notify;
  link->pq.modify(a, mask);
  link->sync_error();
}

bool roce_post(Qp* qp, SendWqe& w) {
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return false;
  bool ud = qp->type == IBV_QPT_UD;
  const wire::Route route = ud ? wire::route(w.dgid, w.remote_qpn) : qp->send_path.route;
  // To a group: also on the wire (the caller gave this host's members their copies), unless
  // it leaves from a loopback GID, which reaches only this host, or names an interface-local
  // IPv6 group (ff01::/16: RFC 4291 keeps it on the node; perftest -g's default), or a group
  // of the other IP version than its source address (no socket sends that: it failed in
  // sendmmsg once per datagram, about 1 us each).
  const bool multicast = ud && route == wire::Route::Multicast;
  if (multicast) {
    const rw::IpAddress src = rw::IpAddress::from_gid(w.sgid.raw);
    const rw::IpAddress group = rw::IpAddress::from_gid(w.dgid.raw);
    const bool node_local = w.dgid.raw[0] == 0xff && (w.dgid.raw[1] & 0x0f) == 1;
    if (src.is_loopback() || node_local || src.is_v4() != group.is_v4()) return false;
  } else if (route != wire::Route::Roce) {
    return false;
  }
  if (ud) {  // on the wire now: its CQs hear from the port too
    feed_from_wire(qp->send_cq);
    feed_from_wire(qp->recv_cq);
  }
  int st = qp->state.load();
  packet::SendWqe p;
  p.wr_id = w.wr_id;
  p.tm = {static_cast<uint8_t>(w.tm.kind), w.tm.tag, w.tm.app_ctx};
  p.opcode = w.opcode;
  p.send_flags = w.flags;
  p.imm = w.imm;
  p.remote_addr = w.remote_addr;
  p.rkey = w.rkey;
  p.compare_add = w.compare_add;
  p.swap = w.swap;
  if (w.opcode == kWrFlush) {  // SendWqe keeps FLUSH's type and level in the atomic operands
    p.flush_length = static_cast<uint32_t>(w.total_length);
    p.flush_type = static_cast<uint8_t>(w.compare_add);
    p.flush_level = static_cast<uint8_t>(w.swap);
  }
  p.remote_qpn = multicast ? packet::kMulticastQpn : w.remote_qpn;
  p.remote_qkey = w.remote_qkey;
  p.xrc_srqn = w.xrc_srqn;
  if (w.total_length > kMaxMsgSize)
    return complete(qp, w, {Outcome::Error, fault_rule(Fault::LocalLength).requester_status}, st);
  if (is_local_op(w.opcode)) {
    // Runs now, in posting order; the link completes it behind what it has in flight. A QP
    // that failed meanwhile flushes it unrun.
    int now;
    {
      std::lock_guard<std::mutex> lock(link->mu);
      now = link->pq.state();
    }
    if (now == IBV_QPS_RTS || now == IBV_QPS_SQD) p.local_status = run_local_op(qp, w);
  } else if (w.tm.kind == TmWork::kFin) {  // tag matching's FIN: the TMH in a slot of its own
    auto& slot = link->tm_fins[link->tm_fins_posted++ % link->tm_fins.size()];
    std::memcpy(slot.data(), w.inline_data.data(), kTmhBytes);
    p.sg.push_back({slot.data(), kTmhBytes});
  } else if (!w.inline_data.empty()) {
    std::vector<uint8_t>& slot = link->inline_ring[link->posted % link->inline_ring.size()];
    slot.assign(w.inline_data.data(), w.inline_data.data() + w.inline_data.size());
    p.sg.push_back({slot.data(), static_cast<uint32_t>(slot.size())});
  } else {
    std::shared_lock keys(MrTable::instance().lock());
    unsigned need = writes_local(w.opcode) ? IBV_ACCESS_LOCAL_WRITE : 0;
    for (const Sge& s : w.sges) {
      if (s.length == 0) continue;
      iovec at{};
      if (!resolve_sge(qp->pd, s.lkey, s.addr, s.length, need, &at)) {
        keys.unlock();
        return complete(qp, w,
                        {Outcome::Error, fault_rule(Fault::LocalProtection).requester_status}, st);
      }
      p.sg.push_back({static_cast<uint8_t*>(at.iov_base), static_cast<uint32_t>(at.iov_len)});
    }
  }
  ++link->posted;
  int err;
  {
    std::shared_lock keys(MrTable::instance().lock());
    std::lock_guard<std::mutex> lock(link->mu);
    if (ud) link->ud_dest.push_back({w.sgid, w.dgid, w.hop_limit});
    err = link->pq.post_send(std::move(p));
    if (err && ud) link->ud_dest.pop_back();
    link->sync_error();
  }
  // What the protocol refuses (UD over the path MTU, an atomic not of 8 bytes): a local
  // length error, as the device would report it.
  if (err) return complete(qp, w, {Outcome::Error, fault_rule(Fault::LocalLength).requester_status}, st);
  return true;
}

bool roce_poll(bool hold_acks) {
  t_app_receive = hold_acks && hold_enabled();
  t_app_poll = true;
  t_held_in_poll = false;
  const int n = port().poll();
  t_app_receive = false;
  t_app_poll = false;
  return n > 0;
}

int roce_wait_fd() { return port().group_fd(); }
void roce_wait_begin() {
  port().wait_begin();
  flush_held_acks();  // about to sleep
}
void roce_wait_end() {
  port().wait_end();
  if (!port().parked()) flush_held_acks();
}

void roce_poll_result(const Cq* cq, bool found) {
  if (found) port().poll_found(std::exchange(t_held_in_poll, false));
  else port().poll_idle();
  if (g_roce_held_acks.load(std::memory_order_seq_cst) == 0) return;
  // Held ACKs wait only while the application has found completions and has the socket:
  // an empty poll means it waits for the peer, which may be waiting for them.
  if (!found || !port().parked()) return flush_held_acks();
  // Found: the QPs of this CQ hold on; a poll of another CQ is the application moving on.
  const auto on_cq = [cq](const HeldEntry& e) { return e.send_cq == cq || e.recv_cq == cq; };
  const int64_t now = int64_t(now_ns_steady());
  if (now < g_hold_earliest.load(std::memory_order_relaxed)) return flush_held_acks_but(on_cq);
  // An ACK's bound passed (the application kept finding completions; no timer runs for
  // it): what is due leaves here. Only that: the others keep their ride. The earliest due
  // is found again on the way (a hold meanwhile lowers it itself).
  g_hold_earliest.store(INT64_MAX, std::memory_order_relaxed);
  for_held_links([](const HeldEntry&) { return true; }, [&](RoceLink& link) {
    if (!link.held_ack) return;
    const HeldEntry e{0, link.qp->send_cq, link.qp->recv_cq, false};
    if (!on_cq(e) || link.held_due <= now) link.emit_held_ack();
    else lower_hold_earliest(link.held_due);
  });
}

void roce_poll_stop() {
  port().poll_stop();
  flush_held_acks();
}

void roce_flush_held_slow(const Qp* except) {
  const uint32_t qpn = except ? except->qpn() : 0;
  flush_held_acks_but([except, qpn](const HeldEntry& e) { return except && e.qpn == qpn; });
}

bool roce_stat_view(Qp* qp, RoceStatView* view) {
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return false;
  auto at = [link](const void* field) {
    return static_cast<uint32_t>(static_cast<const char*>(field) - reinterpret_cast<const char*>(link));
  };
  view->object = link;
  view->size = sizeof(RoceLink);
  view->magic_offset = at(&link->magic);
  view->magic = kRoceLinkMagic;
  view->next_psn = at(link->pq.next_psn_address());
  view->expected_psn = at(link->pq.expected_psn_address());
  view->send_queue = at(link->pq.send_queue_address());
  view->send_entry_size = static_cast<uint32_t>(packet::PacketQp::send_entry_size());
  return true;
}

size_t roce_in_flight(Qp* qp) {
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return 0;
  std::lock_guard<std::mutex> lock(link->mu);
  return link->pq.send_queue_depth();
}

void roce_settle(Qp* qp) {
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link) return;
  std::lock_guard<std::mutex> lock(link->mu);
}

bool roce_claim_gsi(Qp* qp) {
  uint32_t none = 0;
  if (!g_gsi_qpn.compare_exchange_strong(none, qp->qpn())) return false;
  qp->source_qpn = rw::kGsiQpn;
  wire::set_my_slot_flag(wire::kSlotHasGsi, true);
  return true;
}

void roce_release_gsi(Qp* qp) {
  if (!qp->source_qpn) return;
  uint32_t mine = qp->qpn();
  if (g_gsi_qpn.compare_exchange_strong(mine, 0)) wire::set_my_slot_flag(wire::kSlotHasGsi, false);
}

int roce_attach_mcast(Qp* qp, const ibv_gid& gid) {
  const rw::IpAddress group = rw::IpAddress::from_gid(gid.raw);
  if (!group.is_multicast()) return EINVAL;
  McastAttachment a{qp->qpn(), false, {}};
  // A unit test's fake transport on the roce route: no wire.
  const std::vector<int> ifs =
      wire::transport(wire::Route::Roce) ? std::vector<int>{} : group_interfaces(group);
  if (!ifs.empty()) {
    int err = port().acquire();
    a.port_held = err == 0;
    if (err) {
      static std::once_flag told;
      std::call_once(told, [err] {
        std::fprintf(stderr, "softverbs: RoCE v2 port %u unavailable (%s): multicast on this host only\n",
                     roce_udp_port(), std::strerror(-err));
      });
    }
  }
  if (a.port_held) {
    for (int ifindex : ifs) {
      if (int err = port().join_group(group, ifindex)) {
        for (int joined : a.ifindexes) port().leave_group(group, joined);
        port().release();
        return err == -ENOBUFS ? ENOMEM : -err;
      }
      a.ifindexes.push_back(ifindex);
    }
  }
  std::lock_guard<std::mutex> lock(g_mcast_mu);
  (*g_mcast)[group].push_back(std::move(a));
  return 0;
}

void roce_detach_mcast(Qp* qp, const ibv_gid& gid) {
  const rw::IpAddress group = rw::IpAddress::from_gid(gid.raw);
  std::optional<McastAttachment> gone;
  {
    std::lock_guard<std::mutex> lock(g_mcast_mu);
    auto it = g_mcast->find(group);
    if (it == g_mcast->end()) return;
    auto& v = it->second;
    auto at = std::find_if(v.begin(), v.end(),
                           [&](const McastAttachment& a) { return a.qpn == qp->qpn(); });
    if (at == v.end()) return;
    gone = std::move(*at);
    v.erase(at);
    if (v.empty()) g_mcast->erase(it);
  }
  // Outside g_mcast_mu: release() waits for the port's thread, which takes it.
  for (int ifindex : gone->ifindexes) port().leave_group(group, ifindex);
  if (gone->port_held) port().release();
}

void roce_destroy(Qp* qp, RoceResume* resume) {
  RoceLink* link = qp->roce.exchange(nullptr, std::memory_order_acq_rel);
  if (!link) return;
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->emit_held_ack();
    RoceLink::flush();
    if (resume) *resume = {true, link->pq.responder_state()};
  }
  {
    const uint32_t qpn = qp->qpn();
    std::lock_guard<std::mutex> lock(g_held_mu);
    std::erase_if(*g_held, [qpn](const HeldEntry& e) { return e.qpn == qpn; });
  }
  port().cancel(qp->qpn());
  if (link->port_held) port().release();
  delete link;
}

void roce_resume(Qp* qp, const RoceResume& resume) {
  RoceLink* link = qp->roce.load(std::memory_order_acquire);
  if (!link || !resume.has_link) return;
  std::lock_guard<std::mutex> lock(link->mu);
  link->pq.resume_responder(resume.responder);
}

void roce_steering_changed() {
  if (port().is_open()) port().relearn_steering();
}

void roce_slot_handed_over() { port().own_slot_handed_over(); }

}  // namespace softverbs::engine
