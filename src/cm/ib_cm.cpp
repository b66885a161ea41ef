// The IB CM state machine (see ib_cm.hpp and docs/roce-cm.md). Facts from IBA vol. 1 ch. 12
// and the behaviour of the kernel's CM (drivers/infiniband/core/cm.c) as rxe shows it on the
// wire; the code is ours.
#include "cm/ib_cm.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace softverbs::cm::ib {

const char* state_name(State s) {
  switch (s) {
    case State::Idle: return "IDLE";
    case State::ReqSent: return "REQ_SENT";
    case State::MraReqRcvd: return "MRA_REQ_RCVD";
    case State::RepRcvd: return "REP_RCVD";
    case State::ReqRcvd: return "REQ_RCVD";
    case State::MraReqSent: return "MRA_REQ_SENT";
    case State::RepSent: return "REP_SENT";
    case State::Established: return "ESTABLISHED";
    case State::DreqSent: return "DREQ_SENT";
    case State::TimeWait: return "TIMEWAIT";
    case State::SidrReqSent: return "SIDR_REQ_SENT";
    case State::SidrReqRcvd: return "SIDR_REQ_RCVD";
    case State::SidrRepSent: return "SIDR_REP_SENT";
  }
  return "?";
}

namespace {

bool is_sidr(State s) {
  return s == State::SidrReqSent || s == State::SidrReqRcvd || s == State::SidrRepSent;
}

}  // namespace

// What the kernel waits for an answer: twice the packet life time (there and back) plus the
// peer's CM response time (cm.c: timeout_ms of a REQ, REP and DREQ).
Time Cm::cm_timeout(uint8_t response_timeout) const {
  return 2 * iba_time(cfg_.packet_life_time) + iba_time(response_timeout);
}

Cm::Conn* Cm::find(uint32_t local_id) {
  auto it = conns_.find(local_id);
  return it == conns_.end() ? nullptr : &it->second;
}

Cm::Conn* Cm::find_remote(const Endpoint& from, uint32_t remote_id, bool sidr) {
  for (auto& [id, c] : conns_)
    if (!c.active && c.remote_id == remote_id && c.ep.peer == from.peer && is_sidr(c.state) == sidr)
      return &c;
  return nullptr;
}

uint32_t Cm::new_id() {
  for (;;) {
    next_ = (next_ + 1) & 0x3fffff;
    uint32_t id = cfg_.id_prefix | next_;
    if (next_ != 0 && id != 0 && !conns_.count(id)) return id;
  }
}

void Cm::send_once(const Endpoint& to, const wr::CmMad& m) {
  uint8_t buf[wr::kMadBytes];
  if (!wr::encode_cm(m, buf)) return;  // a field out of range: nothing sane to send
  out_.send_mad(to, buf);
}

void Cm::send(Conn& c, const wr::CmMad& m, bool keep) {
  uint8_t buf[wr::kMadBytes];
  if (!wr::encode_cm(m, buf)) return;
  if (keep) {
    std::memcpy(c.last, buf, sizeof buf);
    c.has_last = true;
  }
  out_.send_mad(c.ep, buf);
}

void Cm::resend(Conn& c) {
  if (c.has_last) out_.send_mad(c.ep, c.last);
}

void Cm::arm(Conn& c, Time now, Time timeout, uint8_t retries) {
  c.timeout = timeout;
  c.retries_left = retries;
  c.deadline = now + timeout;
}

void Cm::enter_timewait(Conn& c, Time now) {
  c.state = State::TimeWait;
  // cm.c: a connection stays in time-wait for the path's ACK timeout, so that packets
  // still in flight die before its QP may be reused.
  c.deadline = now + iba_time(static_cast<uint8_t>(std::min(31, cfg_.packet_life_time + 1)));
}

Cm::Conn& Cm::open(const Endpoint& ep, bool active, uint32_t remote_id, uint64_t tid, State state) {
  uint32_t id = new_id();
  Conn& c = conns_[id];
  c.local_id = id;
  c.remote_id = remote_id;
  c.ep = ep;
  c.active = active;
  c.tid = tid ? tid : new_tid(id);
  c.state = state;
  return c;
}

void Cm::drop(uint32_t local_id) { conns_.erase(local_id); }

Time Cm::next_deadline() const {
  Time t = kNever;
  for (const auto& [id, c] : conns_) t = std::min(t, c.deadline);
  return t;
}

State Cm::state(uint32_t conn) const {
  auto it = conns_.find(conn);
  return it == conns_.end() ? State::Idle : it->second.state;
}

// ---- calls from the user

uint32_t Cm::connect(void* user, const Endpoint& to, wr::CmReq req, Time now) {
  Conn& c = open(to, true, 0, 0, State::ReqSent);
  uint32_t id = c.local_id;
  c.user = user;
  c.local_qpn = req.local_qpn;
  req.local_comm_id = id;
  req.remote_cm_response_timeout = cfg_.response_timeout;
  req.local_cm_response_timeout = cfg_.response_timeout;
  req.max_cm_retries = cfg_.max_cm_retries;
  if (!req.primary.local_ack_timeout)
    req.primary.local_ack_timeout = static_cast<uint8_t>(std::min(31, cfg_.packet_life_time + 1));
  arm(c, now, cm_timeout(req.remote_cm_response_timeout), cfg_.max_cm_retries);
  send(c, {wr::cm_header(c.tid), req}, true);
  return id;
}

int Cm::send_rtu(uint32_t conn, Time now) {
  (void)now;
  Conn* c = find(conn);
  if (!c || c->state != State::RepRcvd) return EINVAL;
  wr::CmRtu rtu;
  rtu.local_comm_id = c->local_id;
  rtu.remote_comm_id = c->remote_id;
  c->state = State::Established;
  c->deadline = kNever;
  send(*c, {wr::cm_header(c->tid), rtu}, true);  // kept: a duplicate REP gets it again
  return 0;
}

int Cm::establish(uint32_t conn, Time now) {
  (void)now;
  Conn* c = find(conn);
  if (c && c->state == State::Established) return EISCONN;
  // RepSent also covers the kernel's MRA_REP_RCVD (an MRA only pushes our deadline).
  if (!c || c->state != State::RepSent) return EINVAL;
  c->state = State::Established;
  c->deadline = kNever;
  if (c->user) user_.on_established(c->user);
  return 0;
}

uint32_t Cm::sidr_query(void* user, const Endpoint& to, wr::CmSidrReq req, Time now) {
  Conn& c = open(to, true, 0, 0, State::SidrReqSent);
  uint32_t id = c.local_id;
  c.user = user;
  req.request_id = id;
  arm(c, now, cfg_.sidr_timeout, cfg_.max_cm_retries);
  send(c, {wr::cm_header(c.tid), req}, true);
  return id;
}

int Cm::accept(uint32_t conn, wr::CmRep rep, Time now) {
  Conn* c = find(conn);
  if (!c || (c->state != State::ReqRcvd && c->state != State::MraReqSent)) return EINVAL;
  rep.local_comm_id = c->local_id;
  rep.remote_comm_id = c->remote_id;
  c->local_qpn = rep.local_qpn;
  c->state = State::RepSent;
  // Resent until the RTU comes, with the requester's response time and retries (kept in
  // timeout / retries_left since the REQ).
  c->deadline = now + c->timeout;
  send(*c, {wr::cm_header(c->tid), rep}, true);
  return 0;
}

int Cm::reject(uint32_t conn, uint16_t reason, std::span<const uint8_t> private_data, Time now) {
  (void)now;
  Conn* c = find(conn);
  if (!c) return EINVAL;
  wr::CmRej rej;
  if (c->state == State::ReqRcvd || c->state == State::MraReqSent) {
    rej.message_rejected = wr::kCmRespReq;
  } else if (c->state == State::RepRcvd) {
    rej.message_rejected = wr::kCmRespRep;
  } else {
    return EINVAL;
  }
  rej.local_comm_id = c->local_id;
  rej.remote_comm_id = c->remote_id;
  rej.reason = reason;
  if (!private_data.empty())  // an empty span's data() may be null, which memcpy may not take
    std::memcpy(rej.private_data.data(), private_data.data(),
                std::min(private_data.size(), rej.private_data.size()));
  send(*c, {wr::cm_header(c->tid), rej}, false);
  drop(conn);
  return 0;
}

int Cm::sidr_reply(uint32_t conn, wr::CmSidrRep rep, Time now) {
  Conn* c = find(conn);
  if (!c || c->state != State::SidrReqRcvd) return EINVAL;
  rep.request_id = c->remote_id;
  c->state = State::SidrRepSent;
  c->user = nullptr;  // nothing more to report
  // Kept for a while to answer a duplicate SIDR_REQ (our answer was lost) the same way.
  c->deadline = now + cm_timeout(cfg_.response_timeout);
  send(*c, {wr::cm_header(c->tid), rep}, true);
  return 0;
}

int Cm::disconnect(uint32_t conn, Time now) {
  Conn* c = find(conn);
  if (!c) return EINVAL;
  switch (c->state) {
    case State::Established: {
      wr::CmDreq dreq;
      dreq.local_comm_id = c->local_id;
      dreq.remote_comm_id = c->remote_id;
      dreq.remote_qpn = c->remote_qpn;
      c->dreq_tid = new_tid(c->local_id) ^ (uint64_t(1) << 31);  // a new transaction
      c->state = State::DreqSent;
      arm(*c, now, cm_timeout(cfg_.response_timeout), cfg_.max_cm_retries);
      send(*c, {wr::cm_header(c->dreq_tid), dreq}, true);
      return 0;
    }
    case State::DreqSent:
    case State::TimeWait:
      return 0;  // on its way out already
    default:
      return EINVAL;
  }
}

std::vector<Cm::Established> Cm::established() const {
  std::vector<Established> out;
  for (const auto& [id, c] : conns_)
    if (c.state == State::Established) out.push_back({c.local_id, c.remote_id, c.remote_qpn, c.ep});
  return out;
}

bool Cm::disconnect_orphan(const Established& e, Time now) {
  if (!e.local_id || conns_.count(e.local_id)) return false;
  Conn& c = conns_[e.local_id];
  c.local_id = e.local_id;
  c.remote_id = e.remote_id;
  c.remote_qpn = e.remote_qpn;
  c.ep = e.ep;
  c.tid = new_tid(e.local_id);
  c.state = State::Established;
  return disconnect(e.local_id, now) == 0;
}

void Cm::destroy(uint32_t conn, Time now) {
  Conn* c = find(conn);
  if (!c) return;
  c->user = nullptr;  // from here on, nobody hears of it
  switch (c->state) {
    case State::ReqSent:
    case State::MraReqRcvd: {
      // cm.c: a REQ withdrawn is rejected with reason "timeout".
      wr::CmRej rej;
      rej.local_comm_id = c->local_id;
      rej.reason = wr::kRejTimeout;
      rej.message_rejected = wr::kCmRespOther;
      send(*c, {wr::cm_header(c->tid), rej}, false);
      drop(conn);
      return;
    }
    case State::ReqRcvd:
    case State::MraReqSent:
    case State::RepRcvd:
    case State::RepSent: {
      wr::CmRej rej;
      rej.local_comm_id = c->local_id;
      rej.remote_comm_id = c->remote_id;
      rej.reason = wr::kRejConsumerDefined;
      rej.message_rejected = c->state == State::RepRcvd ? wr::kCmRespRep
                             : c->state == State::RepSent ? wr::kCmRespOther
                                                          : wr::kCmRespReq;
      send(*c, {wr::cm_header(c->tid), rej}, false);
      drop(conn);
      return;
    }
    case State::Established:
      disconnect(conn, now);  // DREQ; the time-wait that follows reports to nobody
      return;
    case State::SidrReqRcvd: {
      wr::CmSidrRep rep;
      rep.request_id = c->remote_id;
      rep.status = wr::kSidrReject;
      send(*c, {wr::cm_header(c->tid), rep}, false);
      drop(conn);
      return;
    }
    case State::SidrReqSent:
    case State::Idle:
      drop(conn);
      return;
    case State::DreqSent:
    case State::TimeWait:
    case State::SidrRepSent:
      return;  // finishes by itself
  }
}

// ---- MADs from the network

void Cm::on_mad(const Endpoint& from, const uint8_t* mad, size_t len, Time now) {
  wr::CmMad m;
  wr::CmError err = wr::decode_cm(mad, len, &m);
  if (err == wr::CmError::kUnsupported) {
    // LAP, APR, ClassPortInfo: a Get or Set is answered "unsupported", as the kernel's MAD
    // layer does; a Send is dropped.
    if (wr::mad_wants_answer(m.hdr)) {
      uint8_t buf[wr::kMadBytes]{};
      wr::encode_mad_header(wr::mad_error_response(m.hdr, wr::kMadStatusUnsupportedAttribute), buf);
      out_.send_mad(from, buf);
    }
    return;
  }
  if (err != wr::CmError::kOk) return;
  std::visit(
      [&](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, wr::CmReq>) on_req(from, m.hdr, body, now);
        else if constexpr (std::is_same_v<T, wr::CmMra>) on_mra(body, now);
        else if constexpr (std::is_same_v<T, wr::CmRej>) on_rej(from, body, now);
        else if constexpr (std::is_same_v<T, wr::CmRep>) on_rep(from, m.hdr, body, now);
        else if constexpr (std::is_same_v<T, wr::CmRtu>) on_rtu(body, now);
        else if constexpr (std::is_same_v<T, wr::CmDreq>) on_dreq(from, m.hdr, body, now);
        else if constexpr (std::is_same_v<T, wr::CmDrep>) on_drep(body, now);
        else if constexpr (std::is_same_v<T, wr::CmSidrReq>) on_sidr_req(from, m.hdr, body, now);
        else if constexpr (std::is_same_v<T, wr::CmSidrRep>) on_sidr_rep(body, now);
      },
      m.body);
}

void Cm::on_req(const Endpoint& from, const wr::MadHeader& h, const wr::CmReq& req, Time now) {
  if (Conn* dup = find_remote(from, req.local_comm_id, false)) {
    // The requester did not hear from us in time and sent the REQ again.
    switch (dup->state) {
      case State::ReqRcvd:
      case State::MraReqSent: {
        // Still with the user: ask for more time (MRA), as the kernel's rdma_cm does.
        wr::CmMra mra;
        mra.local_comm_id = dup->local_id;
        mra.remote_comm_id = dup->remote_id;
        mra.message_mraed = wr::kCmRespReq;
        mra.service_timeout = cfg_.mra_service_timeout;
        dup->state = State::MraReqSent;
        send(*dup, {wr::cm_header(dup->tid), mra}, false);
        return;
      }
      case State::RepSent:
        resend(*dup);  // our REP was lost
        return;
      default:
        return;  // established or over: a stale copy
    }
  }
  auto refuse = [&](uint16_t reason) {
    wr::CmRej rej;
    rej.local_comm_id = 0;  // what Linux sends when no id took the request
    rej.remote_comm_id = req.local_comm_id;
    rej.message_rejected = wr::kCmRespReq;
    rej.reason = reason;
    send_once(from, {wr::cm_header(h.tid), rej});
  };
  // RC, UC, and XRC (extended transport type 1, as the kernel sends it for an XRC INI QP).
  const bool xrc = req.transport_service_type == wr::kCmExtended && req.extended_transport_type == 1;
  if (req.transport_service_type != wr::kCmRc && req.transport_service_type != wr::kCmUc && !xrc) {
    refuse(wr::kRejInvalidTransportType);
    return;
  }
  Conn& c = open(from, false, req.local_comm_id, h.tid, State::ReqRcvd);
  uint32_t id = c.local_id;
  c.remote_qpn = req.local_qpn;
  // Our REP is resent with the requester's response time and retries.
  c.timeout = cm_timeout(req.local_cm_response_timeout);
  c.retries_left = req.max_cm_retries;
  uint16_t reason = wr::kRejInvalidServiceId;
  void* user = user_.on_req(id, from, req, &reason);
  Conn* still = find(id);
  if (!still) return;  // the user answered already (reject inside on_req)
  if (!user) {
    drop(id);
    refuse(reason);
    return;
  }
  still->user = user;
}

void Cm::on_mra(const wr::CmMra& m, Time now) {
  Conn* c = find(m.remote_comm_id);
  if (!c || (c->remote_id && m.local_comm_id != c->remote_id)) return;
  Time more = iba_time(m.service_timeout) + iba_time(static_cast<uint8_t>(cfg_.packet_life_time + 1));
  if (m.message_mraed == wr::kCmRespReq && (c->state == State::ReqSent || c->state == State::MraReqRcvd)) {
    c->state = State::MraReqRcvd;
    c->deadline = now + more;
  } else if (m.message_mraed == wr::kCmRespRep && c->state == State::RepSent) {
    c->deadline = now + more;
  }
}

void Cm::on_rej(const Endpoint& from, const wr::CmRej& m, Time now) {
  (void)now;
  Conn* c = m.remote_comm_id ? find(m.remote_comm_id) : nullptr;
  // A requester withdrawing its REQ does not know our comm ID yet: it names its own.
  if (!m.remote_comm_id) c = find_remote(from, m.local_comm_id, false);
  if (!c || c->ep.peer != from.peer) return;
  if (!m.remote_comm_id && c->state != State::ReqRcvd && c->state != State::MraReqSent) return;
  // Once we know the peer's comm ID, a REJ must carry it (a listener that never made an
  // id sends 0, which is fine only before the REP).
  if (c->remote_id && m.local_comm_id != c->remote_id) return;
  switch (c->state) {
    case State::ReqSent:
    case State::MraReqRcvd:
    case State::RepRcvd:
    case State::RepSent:
    case State::MraReqSent:
    case State::ReqRcvd:
      break;
    default:
      return;
  }
  void* user = c->user;
  drop(c->local_id);
  if (user) user_.on_rej(user, m);
}

void Cm::on_rep(const Endpoint& from, const wr::MadHeader& h, const wr::CmRep& m, Time now) {
  (void)h;
  (void)now;
  Conn* c = find(m.remote_comm_id);
  if (!c || !c->active || c->ep.peer != from.peer) return;
  switch (c->state) {
    case State::ReqSent:
    case State::MraReqRcvd:
      c->remote_id = m.local_comm_id;
      c->remote_qpn = m.local_qpn;
      c->state = State::RepRcvd;
      c->deadline = kNever;  // the user answers (RTU or REJ); the peer resends meanwhile
      if (c->user) user_.on_rep(c->user, m);
      return;
    case State::Established:
      if (m.local_comm_id == c->remote_id) resend(*c);  // our RTU was lost: again
      return;
    default:
      return;
  }
}

void Cm::on_rtu(const wr::CmRtu& m, Time now) {
  (void)now;
  Conn* c = find(m.remote_comm_id);
  if (!c || c->active || m.local_comm_id != c->remote_id || c->state != State::RepSent) return;
  c->state = State::Established;
  c->deadline = kNever;
  if (c->user) user_.on_established(c->user);
}

void Cm::on_dreq(const Endpoint& from, const wr::MadHeader& h, const wr::CmDreq& m, Time now) {
  Conn* c = find(m.remote_comm_id);
  if (!c || c->ep.peer != from.peer || m.local_comm_id != c->remote_id) {
    // No such connection (long gone, or its process died and another took its slot): a
    // DREP all the same, as the kernel's cm_issue_drep does, so the peer is done at once.
    wr::CmDrep drep;
    drep.local_comm_id = m.remote_comm_id;
    drep.remote_comm_id = m.local_comm_id;
    send_once(from, {wr::cm_header(h.tid), drep});
    return;
  }
  if (c->state == State::TimeWait) {
    if (c->dreq_tid == h.tid) resend(*c);  // our DREP was lost
    return;
  }
  if (c->state != State::Established && c->state != State::DreqSent && c->state != State::RepSent)
    return;
  // DREP at once: rdma_cm leaves the QP alone on a DREQ (rdma_disconnect moves it to ERR).
  wr::CmDrep drep;
  drep.local_comm_id = c->local_id;
  drep.remote_comm_id = c->remote_id;
  c->dreq_tid = h.tid;
  send(*c, {wr::cm_header(h.tid), drep}, true);
  enter_timewait(*c, now);
  if (c->user) user_.on_disconnect(c->user);
}

void Cm::on_drep(const wr::CmDrep& m, Time now) {
  Conn* c = find(m.remote_comm_id);
  if (!c || m.local_comm_id != c->remote_id || c->state != State::DreqSent) return;
  c->has_last = false;
  enter_timewait(*c, now);
  if (c->user) user_.on_disconnect(c->user);
}

void Cm::on_sidr_req(const Endpoint& from, const wr::MadHeader& h, const wr::CmSidrReq& req,
                     Time now) {
  if (Conn* dup = find_remote(from, req.request_id, true)) {
    if (dup->state == State::SidrRepSent) resend(*dup);
    return;
  }
  uint32_t id = open(from, false, req.request_id, h.tid, State::SidrReqRcvd).local_id;
  void* user = user_.on_sidr_req(id, from, req);
  Conn* still = find(id);
  if (!still || still->state != State::SidrReqRcvd) return;  // answered inside on_sidr_req
  if (user) {
    still->user = user;
    return;
  }
  wr::CmSidrRep rep;
  rep.status = wr::kSidrUnsupported;  // nobody listens: QPN 0, Q_Key 0, as rxe
  rep.service_id = req.service_id;
  sidr_reply(id, rep, now);
}

void Cm::on_sidr_rep(const wr::CmSidrRep& m, Time now) {
  (void)now;
  Conn* c = find(m.request_id);
  if (!c || c->state != State::SidrReqSent) return;
  void* user = c->user;
  drop(m.request_id);
  if (user) user_.on_sidr_rep(user, m);
}

// ---- timers

void Cm::on_time(Time now) {
  std::vector<uint32_t> due;
  for (const auto& [id, c] : conns_)
    if (c.deadline <= now) due.push_back(id);
  for (uint32_t id : due) {
    Conn* c = find(id);
    if (!c || c->deadline > now) continue;
    void* user = c->user;
    switch (c->state) {
      case State::ReqSent:
      case State::MraReqRcvd:
      case State::RepSent:
      case State::DreqSent:
      case State::SidrReqSent:
        if (c->retries_left > 0) {
          --c->retries_left;
          if (c->state == State::MraReqRcvd) c->state = State::ReqSent;
          c->deadline = now + c->timeout;
          resend(*c);
          break;
        }
        if (c->state == State::DreqSent) {  // the peer never answered: over anyway
          enter_timewait(*c, now);
          if (user) user_.on_disconnect(user);
          break;
        }
        if (c->state == State::RepSent) {  // no RTU: the connection attempt failed
          wr::CmRej rej;
          rej.local_comm_id = c->local_id;
          rej.remote_comm_id = c->remote_id;
          rej.message_rejected = wr::kCmRespOther;
          rej.reason = wr::kRejTimeout;
          send(*c, {wr::cm_header(c->tid), rej}, false);
        }
        drop(id);
        if (user) user_.on_timeout(user);
        break;
      case State::TimeWait:
        drop(id);
        if (user) user_.on_timewait_exit(user);
        break;
      case State::SidrRepSent:
        drop(id);
        break;
      default:
        c->deadline = kNever;
        break;
    }
  }
}

}  // namespace softverbs::cm::ib
