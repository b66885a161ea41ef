// The InfiniBand Communication Manager's protocol (IBA vol. 1 ch. 12) for rdma_cm between
// hosts: the connection state machine, its timers and retries, duplicate and stray MADs,
// SIDR. Pure logic: MADs go out through a MadSender, time comes in as numbers, and what
// happens is told to a CmUser. No sockets, no threads, no locks of its own (the caller
// serialises every call), so the unit tests drive it with a fake transport and a fake clock
// (tests/unit/ib_cm_test.cpp). The rdma_cm glue over the QP1 agent is cm/remote.cpp; the
// protocol, states and timers are described in docs/roce-cm.md.
//
// Everything that arrives is untrusted: on_mad decodes (wire/roce/cm_msg) and drops what
// does not decode, what names no connection of ours, and what does not fit the state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "wire/roce/cm_msg.hpp"
#include "wire/roce/mad.hpp"

namespace softverbs::cm::ib {

namespace wr = wire::roce;

// Times are nanoseconds on a monotonic clock.
using Time = int64_t;
inline constexpr Time kNever = std::numeric_limits<Time>::max();
// IBA's time encoding: 4.096 us * 2^value (a 5-bit field; larger values are clamped).
constexpr Time iba_time(uint8_t value) { return Time(4096) << (value > 31 ? 31 : value); }

// Where a connection's MADs go: our GID (the source address) and the peer's.
struct Endpoint {
  wr::Gid local{};
  wr::Gid peer{};
  bool operator==(const Endpoint&) const = default;
};

class MadSender {
 public:
  virtual ~MadSender() = default;
  // One 256-byte MAD to the peer's QP1. Best effort: a lost MAD is what the timers are for.
  virtual void send_mad(const Endpoint& to, const uint8_t (&mad)[wr::kMadBytes]) = 0;
};

// What the CM tells the rdma_cm layer. `user` is the cookie given at connect/sidr_query or
// returned by on_req/on_sidr_req. Once a connection is over for its user (REJ, a timeout,
// TIMEWAIT_EXIT, destroy), it is never named again.
class CmUser {
 public:
  virtual ~CmUser() = default;
  // A new REQ (not a duplicate): return a cookie to take it (the connection waits in
  // ReqRcvd for accept or reject), or nullptr when nobody listens on its service ID (REJ
  // reason 8, invalid service ID, is sent: what Linux sends). `reason` may be set to
  // another REJ reason for a refused request (e.g. 28, consumer defined).
  virtual void* on_req(uint32_t conn, const Endpoint& from, const wr::CmReq& req,
                       uint16_t* reason) = 0;
  // A new SIDR_REQ: a cookie, or nullptr (SIDR_REP status 1, no listener, is sent).
  virtual void* on_sidr_req(uint32_t conn, const Endpoint& from, const wr::CmSidrReq& req) = 0;
  virtual void on_rep(void* user, const wr::CmRep& rep) = 0;        // active: answer with rtu
  virtual void on_established(void* user) = 0;                      // passive: RTU came
  virtual void on_rej(void* user, const wr::CmRej& rej) = 0;        // connection over
  virtual void on_timeout(void* user) = 0;  // REQ, REP or SIDR_REQ retries spent: over
  virtual void on_disconnect(void* user) = 0;  // DREQ came (DREP sent), DREP came, or DREQ timed out
  virtual void on_timewait_exit(void* user) = 0;  // connection over
  virtual void on_sidr_rep(void* user, const wr::CmSidrRep& rep) = 0;  // over
};

enum class State : uint8_t {
  Idle,         // no such connection
  ReqSent,      // active: REQ out, waiting for REP (or REJ, MRA)
  MraReqRcvd,   // active: the peer asked for more time (MRA for our REQ)
  RepRcvd,      // active: REP came, the user sends RTU (or rejects)
  ReqRcvd,      // passive: REQ given to the user, waiting for accept/reject
  MraReqSent,   // passive: a duplicate REQ came while waiting; MRA sent
  RepSent,      // passive: REP out, waiting for RTU
  Established,
  DreqSent,     // DREQ out, waiting for DREP
  TimeWait,     // over; stray MADs for it die out, then TIMEWAIT_EXIT
  SidrReqSent,  // SIDR_REQ out, waiting for SIDR_REP
  SidrReqRcvd,  // SIDR_REQ given to the user
  SidrRepSent,  // answered; kept a while to answer duplicates the same way
};
const char* state_name(State s);

struct Config {
  // High bits of every local comm ID and SIDR request ID we hand out: the process's
  // registry slot (slot << 22), so that a host's processes never clash and an answer
  // names the process it is for (docs/decisions/0007).
  uint32_t id_prefix = 0;
  uint32_t tid_agent = 1;  // high 32 bits of our transaction IDs (rxe: its MAD agent's)
  // The kernel's rdma_cm values over RoCE (cma.c), so interop timing is the kernel's:
  uint8_t response_timeout = 20;   // CMA_CM_RESPONSE_TIMEOUT: both CM response timeouts
  uint8_t max_cm_retries = 15;     // CMA_MAX_CM_RETRIES
  uint8_t packet_life_time = 18;   // CMA_IBOE_PACKET_LIFETIME (REQ's local ACK timeout = +1)
  uint8_t mra_service_timeout = 24;  // CMA_CM_MRA_SETTING
  Time sidr_timeout = Time(4096) * 1000000;  // cma.c: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms
};

class Cm {
 public:
  Cm(Config config, MadSender& sender, CmUser& user) : cfg_(config), out_(sender), user_(user) {}

  // ---- active side
  // Sends `req` (local comm ID, timeouts and retries are filled here) and returns the new
  // connection's local comm ID, the handle for the calls below.
  uint32_t connect(void* user, const Endpoint& to, wr::CmReq req, Time now);
  // RepRcvd -> Established: sends RTU. EINVAL in any other state.
  int send_rtu(uint32_t conn, Time now);
  // SIDR_REQ (request ID filled here); the answer comes as on_sidr_rep or on_timeout.
  uint32_t sidr_query(void* user, const Endpoint& to, wr::CmSidrReq req, Time now);

  // ---- passive side
  // ReqRcvd/MraReqSent -> RepSent: sends `rep` (comm IDs filled here), resent until RTU.
  int accept(uint32_t conn, wr::CmRep rep, Time now);
  // REJ in ReqRcvd/MraReqSent (passive) or RepRcvd (active); the connection is over.
  int reject(uint32_t conn, uint16_t reason, std::span<const uint8_t> private_data, Time now);
  // Answers a SIDR_REQ given to the user (request ID and service ID filled here).
  int sidr_reply(uint32_t conn, wr::CmSidrRep rep, Time now);

  // The user saw traffic on the QP before the RTU (COMM_EST, rdma_notify): RepSent ->
  // Established as the kernel's cm_establish (the REP's resends stop, on_established is
  // told, a late RTU is ignored). EISCONN when established already, EINVAL otherwise.
  int establish(uint32_t conn, Time now);

  // Established (or RepSent/RepRcvd) -> DreqSent. EINVAL in other states.
  int disconnect(uint32_t conn, Time now);
  // The user goes away: what IBA sends in that state (REJ while connecting, DREQ when
  // established), after which the connection no longer reports to anyone.
  void destroy(uint32_t conn, Time now);

  // ---- a dead process's connections (docs/decisions/0007: its kernel would send DREQs)
  // What a DREQ for an established connection needs.
  struct Established {
    uint32_t local_id = 0;
    uint32_t remote_id = 0;
    uint32_t remote_qpn = 0;
    Endpoint ep;
    bool operator==(const Established&) const = default;
  };
  // Every established connection, by local comm ID.
  std::vector<Established> established() const;
  // Takes over an established connection of a process of this host that died without its
  // DREQ: sends the DREQ under the dead process's comm IDs, resent as ours until the DREP
  // (or the retries) end it; nobody is told. False when the local ID is in use here.
  bool disconnect_orphan(const Established& e, Time now);

  // One MAD from QP1 (from: its source GID and the local GID it came to).
  void on_mad(const Endpoint& from, const uint8_t* mad, size_t len, Time now);
  // Fires the timers due at `now`.
  void on_time(Time now);
  Time next_deadline() const;

  // Where the local IDs start (a restarted process must not reuse its predecessor's).
  void seed(uint32_t value) { next_ = value & 0x3fffff; }

  State state(uint32_t conn) const;
  size_t connections() const { return conns_.size(); }

 private:
  struct Conn {
    uint32_t local_id = 0;
    uint32_t remote_id = 0;
    Endpoint ep;
    State state = State::Idle;
    void* user = nullptr;
    bool active = false;
    uint64_t tid = 0;        // of the REQ / SIDR_REQ exchange (answers echo it)
    uint64_t dreq_tid = 0;   // of the DREQ we sent or answer
    uint32_t remote_qpn = 0;
    uint32_t local_qpn = 0;
    Time deadline = kNever;
    Time timeout = 0;        // between resends
    uint8_t retries_left = 0;
    uint8_t last[wr::kMadBytes]{};  // what a resend or a duplicate's answer sends again
    bool has_last = false;
  };

  Conn* find(uint32_t local_id);
  Conn* find_remote(const Endpoint& from, uint32_t remote_id, bool sidr);
  uint32_t new_id();
  uint64_t new_tid(uint32_t local_id) const { return uint64_t(cfg_.tid_agent) << 32 | local_id; }
  void send(Conn& c, const wr::CmMad& m, bool keep);
  void send_once(const Endpoint& to, const wr::CmMad& m);
  void resend(Conn& c);
  void arm(Conn& c, Time now, Time timeout, uint8_t retries);
  void enter_timewait(Conn& c, Time now);
  // A new connection under a fresh local ID (tid 0: a new transaction of ours).
  Conn& open(const Endpoint& ep, bool active, uint32_t remote_id, uint64_t tid, State state);
  void drop(uint32_t local_id);
  Time cm_timeout(uint8_t response_timeout) const;

  void on_req(const Endpoint& from, const wr::MadHeader& h, const wr::CmReq& m, Time now);
  void on_mra(const wr::CmMra& m, Time now);
  void on_rej(const Endpoint& from, const wr::CmRej& m, Time now);
  void on_rep(const Endpoint& from, const wr::MadHeader& h, const wr::CmRep& m, Time now);
  void on_rtu(const wr::CmRtu& m, Time now);
  void on_dreq(const Endpoint& from, const wr::MadHeader& h, const wr::CmDreq& m, Time now);
  void on_drep(const wr::CmDrep& m, Time now);
  void on_sidr_req(const Endpoint& from, const wr::MadHeader& h, const wr::CmSidrReq& m,
                   Time now);
  void on_sidr_rep(const wr::CmSidrRep& m, Time now);

  Config cfg_;
  MadSender& out_;
  CmUser& user_;
  std::map<uint32_t, Conn> conns_;  // by local comm ID (or SIDR request ID)
  uint32_t next_ = 0;
};

}  // namespace softverbs::cm::ib
