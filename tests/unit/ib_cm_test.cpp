// The IB CM state machine (src/cm/ib_cm.*) between two instances joined by a fake MAD
// transport, with a fake clock: every transition, the timers and retries, duplicates,
// stray and garbage MADs.
#include "cm/ib_cm.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace softverbs::cm::ib;
namespace wr = softverbs::wire::roce;

wr::Gid gid(uint8_t last) {
  wr::Gid g{};
  g[10] = g[11] = 0xff;
  g[12] = 10;
  g[15] = last;
  return g;
}

struct Wire {
  struct Mad {
    Endpoint to;
    uint8_t bytes[wr::kMadBytes];
    wr::CmMad decoded() const {
      wr::CmMad m;
      EXPECT_EQ(wr::decode_cm(bytes, sizeof bytes, &m), wr::CmError::kOk);
      return m;
    }
    uint16_t attr() const { return uint16_t(bytes[16] << 8 | bytes[17]); }
  };
  std::deque<Mad> queue;
};

struct Side : MadSender, CmUser {
  Side(Wire& w, wr::Gid me, uint32_t prefix) : wire(w), self(me), cm(config(prefix), *this, *this) {}
  static Config config(uint32_t prefix) {
    Config c;
    c.id_prefix = prefix;
    return c;
  }
  Wire& wire;
  wr::Gid self;
  Cm cm;
  bool drop_out = false;  // lose everything this side sends
  int sent = 0;
  void send_mad(const Endpoint& to, const uint8_t (&mad)[wr::kMadBytes]) override {
    ++sent;
    if (drop_out) return;
    Wire::Mad m;
    m.to = to;
    std::memcpy(m.bytes, mad, sizeof mad);
    wire.queue.push_back(m);
  }
  // What the user sees.
  std::vector<std::string> events;
  bool listening = true;
  uint32_t last_conn = 0;
  int token = 1;
  wr::CmReq last_req;
  wr::CmRej last_rej;
  wr::CmRep last_rep;
  wr::CmSidrRep last_sidr_rep;
  void* on_req(uint32_t conn, const Endpoint& from, const wr::CmReq& req, uint16_t*) override {
    EXPECT_EQ(from.local, self);
    events.push_back("REQ");
    last_conn = conn;
    last_req = req;
    return listening ? &token : nullptr;
  }
  void* on_sidr_req(uint32_t conn, const Endpoint&, const wr::CmSidrReq&) override {
    events.push_back("SIDR_REQ");
    last_conn = conn;
    return listening ? &token : nullptr;
  }
  void on_rep(void*, const wr::CmRep& rep) override {
    events.push_back("REP");
    last_rep = rep;
  }
  void on_established(void*) override { events.push_back("ESTABLISHED"); }
  void on_rej(void*, const wr::CmRej& rej) override {
    events.push_back("REJ " + std::to_string(rej.reason));
    last_rej = rej;
  }
  void on_timeout(void*) override { events.push_back("TIMEOUT"); }
  void on_disconnect(void*) override { events.push_back("DISCONNECT"); }
  void on_timewait_exit(void*) override { events.push_back("TIMEWAIT_EXIT"); }
  void on_sidr_rep(void*, const wr::CmSidrRep& rep) override {
    events.push_back("SIDR_REP " + std::to_string(rep.status));
    last_sidr_rep = rep;
  }
};

class IbCm : public ::testing::Test {
 protected:
  Wire wire;
  Side a{wire, gid(1), 1u << 22};
  Side b{wire, gid(2), 2u << 22};
  Time now = 1'000'000'000;
  Endpoint a_to_b{gid(1), gid(2)};

  // Delivers queued MADs until none is left; returns how many.
  int pump() {
    int n = 0;
    while (!wire.queue.empty()) {
      Wire::Mad m = wire.queue.front();
      wire.queue.pop_front();
      Side& to = m.to.peer == a.self ? a : b;
      Side& from = &to == &a ? b : a;
      to.cm.on_mad(Endpoint{to.self, from.self}, m.bytes, sizeof m.bytes, now);
      ++n;
    }
    return n;
  }
  void advance(Time dt) {
    now += dt;
    a.cm.on_time(now);
    b.cm.on_time(now);
  }
  wr::CmReq req() {
    wr::CmReq r;
    r.service_id = wr::service_id(wr::PortSpace::kTcp, 7174);
    r.local_qpn = 0x400011;
    r.starting_psn = 0x123456;
    r.path_mtu = 3;
    r.primary.local_lid = r.primary.remote_lid = 0xffff;
    r.primary.local_gid = gid(1);
    r.primary.remote_gid = gid(2);
    r.primary.hop_limit = 64;
    return r;
  }
  wr::CmRep rep() {
    wr::CmRep r;
    r.local_qpn = 0x800012;
    r.starting_psn = 0x654321;
    return r;
  }
  // REQ -> REP -> RTU; returns (active conn, passive conn).
  std::pair<uint32_t, uint32_t> establish() {
    uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
    pump();
    uint32_t pc = b.last_conn;
    EXPECT_EQ(b.cm.state(pc), State::ReqRcvd);
    EXPECT_EQ(b.cm.accept(pc, rep(), now), 0);
    pump();
    EXPECT_EQ(a.cm.state(ac), State::RepRcvd);
    EXPECT_EQ(a.cm.send_rtu(ac, now), 0);
    pump();
    EXPECT_EQ(a.cm.state(ac), State::Established);
    EXPECT_EQ(b.cm.state(pc), State::Established);
    return {ac, pc};
  }
  const Time req_timeout = 2 * iba_time(18) + iba_time(20);  // the kernel's: ~6.4 s
};

TEST_F(IbCm, ReqRepRtuEstablishesWithKernelTimeoutsAndComms) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  ASSERT_EQ(wire.queue.size(), 1u);
  wr::CmMad m = wire.queue.front().decoded();
  auto& r = std::get<wr::CmReq>(m.body);
  EXPECT_EQ(r.local_comm_id, ac);
  EXPECT_EQ(ac >> 22, 1u);  // the slot prefix routes answers to this process
  EXPECT_EQ(r.remote_cm_response_timeout, 20);
  EXPECT_EQ(r.local_cm_response_timeout, 20);
  EXPECT_EQ(r.max_cm_retries, 15);
  EXPECT_EQ(r.primary.local_ack_timeout, 19);
  EXPECT_EQ(m.hdr.tid & 0xffffffff, ac);
  pump();
  ASSERT_EQ(b.events, std::vector<std::string>{"REQ"});
  EXPECT_EQ(b.last_req.local_qpn, 0x400011u);
  ASSERT_EQ(b.cm.accept(b.last_conn, rep(), now), 0);
  // The REP answers with the REQ's TID and both comm IDs.
  wr::CmMad rm = wire.queue.front().decoded();
  EXPECT_EQ(rm.hdr.tid, m.hdr.tid);
  EXPECT_EQ(std::get<wr::CmRep>(rm.body).remote_comm_id, ac);
  EXPECT_EQ(std::get<wr::CmRep>(rm.body).local_comm_id, b.last_conn);
  pump();
  ASSERT_EQ(a.events, std::vector<std::string>{"REP"});
  EXPECT_EQ(a.last_rep.local_qpn, 0x800012u);
  EXPECT_EQ(a.cm.send_rtu(ac, now), 0);
  EXPECT_EQ(a.cm.send_rtu(ac, now), EINVAL);  // once
  pump();
  EXPECT_EQ(b.events.back(), "ESTABLISHED");
  EXPECT_EQ(a.cm.next_deadline(), kNever);
  EXPECT_EQ(b.cm.next_deadline(), kNever);
}

TEST_F(IbCm, DisconnectDreqDrepThenTimewaitExit) {
  auto [ac, pc] = establish();
  a.events.clear();
  b.events.clear();
  EXPECT_EQ(a.cm.disconnect(ac, now), 0);
  EXPECT_EQ(a.cm.state(ac), State::DreqSent);
  wr::CmMad d = wire.queue.front().decoded();
  EXPECT_EQ(std::get<wr::CmDreq>(d.body).remote_qpn, 0x800012u);
  pump();
  EXPECT_EQ(b.events, std::vector<std::string>{"DISCONNECT"});
  EXPECT_EQ(a.events, std::vector<std::string>{"DISCONNECT"});
  EXPECT_EQ(a.cm.state(ac), State::TimeWait);
  EXPECT_EQ(b.cm.state(pc), State::TimeWait);
  advance(iba_time(19) - 1);
  EXPECT_EQ(a.cm.connections(), 1u);
  advance(2);
  EXPECT_EQ(a.events.back(), "TIMEWAIT_EXIT");
  EXPECT_EQ(b.events.back(), "TIMEWAIT_EXIT");
  EXPECT_EQ(a.cm.connections(), 0u);
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, DuplicateDreqInTimewaitGetsTheDrepAgain) {
  auto [ac, pc] = establish();
  a.cm.disconnect(ac, now);
  Wire::Mad dreq = wire.queue.front();
  pump();
  int before = b.sent;
  wire.queue.push_back(dreq);
  pump();
  EXPECT_EQ(b.sent, before + 1);
  EXPECT_EQ(b.cm.state(pc), State::TimeWait);
}

TEST_F(IbCm, DreqUnansweredIsResentThenDisconnects) {
  auto [ac, pc] = establish();
  b.cm.destroy(pc, now);  // b forgets it... and sends a DREQ itself: lose that
  wire.queue.clear();
  a.events.clear();
  b.drop_out = true;
  a.drop_out = true;
  a.cm.disconnect(ac, now);
  int sent = a.sent;
  for (int i = 0; i < 15; ++i) advance(req_timeout);
  EXPECT_EQ(a.sent, sent + 15);
  EXPECT_TRUE(a.events.empty());
  advance(req_timeout);
  EXPECT_EQ(a.events, std::vector<std::string>{"DISCONNECT"});
  advance(iba_time(19));
  EXPECT_EQ(a.events.back(), "TIMEWAIT_EXIT");
}

TEST_F(IbCm, NoListenerIsRejectedWithReason8AndCommId0) {
  b.listening = false;
  a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  EXPECT_EQ(a.events, std::vector<std::string>{"REJ 8"});
  EXPECT_EQ(a.last_rej.local_comm_id, 0u);
  EXPECT_EQ(b.cm.connections(), 0u);
  EXPECT_EQ(a.cm.connections(), 0u);
}

TEST_F(IbCm, RejectCarriesReason28AndPrivateData) {
  a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  const uint8_t pd[] = {1, 2, 3, 4};
  EXPECT_EQ(b.cm.reject(b.last_conn, wr::kRejConsumerDefined, pd, now), 0);
  pump();
  EXPECT_EQ(a.events, std::vector<std::string>{"REJ 28"});
  EXPECT_EQ(a.last_rej.private_data[3], 4);
  EXPECT_EQ(a.last_rej.local_comm_id >> 22, 2u);
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, ActiveRejectsTheRep) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  b.cm.accept(b.last_conn, rep(), now);
  pump();
  EXPECT_EQ(a.cm.reject(ac, wr::kRejConsumerDefined, {}, now), 0);
  pump();
  EXPECT_EQ(b.events.back(), "REJ 28");
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, UnansweredReqIsResentMaxCmRetriesTimesThenTimesOut) {
  b.listening = true;
  a.drop_out = true;
  a.cm.connect(&a.token, a_to_b, req(), now);
  EXPECT_EQ(a.sent, 1);
  EXPECT_EQ(a.cm.next_deadline(), now + req_timeout);
  advance(req_timeout - 1);
  EXPECT_EQ(a.sent, 1);
  for (int i = 0; i < 15; ++i) {
    advance(req_timeout);
    EXPECT_EQ(a.sent, 2 + i);
  }
  EXPECT_TRUE(a.events.empty());
  advance(req_timeout);
  EXPECT_EQ(a.events, std::vector<std::string>{"TIMEOUT"});
  EXPECT_EQ(a.cm.connections(), 0u);
}

TEST_F(IbCm, DuplicateReqWhileTheUserThinksIsAnsweredWithMra) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  Wire::Mad first = wire.queue.front();
  pump();
  EXPECT_EQ(b.events.size(), 1u);
  // a resends (its timer); b is still deciding.
  advance(req_timeout);
  ASSERT_EQ(wire.queue.size(), 1u);
  EXPECT_EQ(std::memcmp(wire.queue.front().bytes, first.bytes, wr::kMadBytes), 0);  // same REQ
  pump();
  EXPECT_EQ(b.events.size(), 1u);  // not a new request
  EXPECT_EQ(b.cm.state(b.last_conn), State::MraReqSent);
  EXPECT_EQ(a.cm.state(ac), State::MraReqRcvd);
  // The MRA gives b service timeout 24 (~69 s) more before a resends.
  advance(req_timeout);
  EXPECT_TRUE(wire.queue.empty());
  b.cm.accept(b.last_conn, rep(), now);
  pump();
  EXPECT_EQ(a.cm.state(ac), State::RepRcvd);
}

TEST_F(IbCm, DuplicateReqAfterRepGetsTheRepAgain) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  Wire::Mad reqmad = wire.queue.front();
  pump();
  b.cm.accept(b.last_conn, rep(), now);
  Wire::Mad repmad = wire.queue.front();
  wire.queue.clear();  // the REP is lost
  wire.queue.push_back(reqmad);
  pump();  // b answers the duplicate with the REP again, which a takes
  EXPECT_EQ(a.cm.state(ac), State::RepRcvd);
  EXPECT_EQ(b.events.size(), 1u);
  (void)repmad;
}

TEST_F(IbCm, LostRtuIsRecoveredByTheRepResend) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  b.cm.accept(b.last_conn, rep(), now);
  pump();
  a.cm.send_rtu(ac, now);
  wire.queue.clear();  // RTU lost
  advance(req_timeout);  // b resends its REP; a, established, sends the RTU again
  pump();
  EXPECT_EQ(b.events.back(), "ESTABLISHED");
}

TEST_F(IbCm, CommEstAfterALostRtuEstablishesAndTheLateRtuIsIgnored) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  uint32_t pc = b.last_conn;
  EXPECT_EQ(b.cm.establish(pc, now), EINVAL);  // REQ_RCVD: no REP sent yet
  ASSERT_EQ(b.cm.accept(pc, rep(), now), 0);
  pump();
  ASSERT_EQ(a.cm.send_rtu(ac, now), 0);
  Wire::Mad rtu = wire.queue.front();
  wire.queue.clear();  // the RTU is lost; the first SEND reaches b's QP (COMM_EST)
  b.events.clear();
  ASSERT_EQ(b.cm.establish(pc, now), 0);
  EXPECT_EQ(b.cm.state(pc), State::Established);
  EXPECT_EQ(b.events, std::vector<std::string>{"ESTABLISHED"});
  EXPECT_EQ(b.cm.next_deadline(), kNever);  // the REP is not resent any more
  EXPECT_EQ(b.cm.establish(pc, now), EISCONN);
  wire.queue.push_back(rtu);  // the RTU comes after all: nothing more happens
  pump();
  EXPECT_EQ(b.events, std::vector<std::string>{"ESTABLISHED"});
  advance(req_timeout);
  EXPECT_TRUE(wire.queue.empty());
  EXPECT_EQ(a.cm.establish(ac, now), EISCONN);  // the active side is established by its RTU
  EXPECT_EQ(b.cm.disconnect(pc, now), 0);  // and the connection ends as any other
  pump();
  EXPECT_EQ(a.events.back(), "DISCONNECT");
}

TEST_F(IbCm, ADeadProcesssConnectionIsDisconnectedByAnotherCm) {
  auto [ac, pc] = establish();
  auto published = b.cm.established();
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].local_id, pc);
  EXPECT_EQ(published[0].remote_id, ac);
  EXPECT_EQ(published[0].remote_qpn, 0x400011u);  // a's QPN, from its REQ
  // b's process dies; another CM of b's host (prefix 3) takes over what b published.
  Side heir{wire, gid(2), 3u << 22};
  a.events.clear();
  ASSERT_TRUE(heir.cm.disconnect_orphan(published[0], now));
  EXPECT_FALSE(heir.cm.disconnect_orphan(published[0], now));  // once
  wr::CmMad d = wire.queue.front().decoded();
  auto& dreq = std::get<wr::CmDreq>(d.body);
  EXPECT_EQ(dreq.local_comm_id, pc);  // the dead process's IDs: a knows no other
  EXPECT_EQ(dreq.remote_comm_id, ac);
  EXPECT_EQ(dreq.remote_qpn, 0x400011u);
  // a answers; its DREP names pc, which the host passes to the heir (engine/roce.cpp).
  while (!wire.queue.empty()) {
    Wire::Mad m = wire.queue.front();
    wire.queue.pop_front();
    Side& to = m.to.peer == a.self ? a : heir;
    to.cm.on_mad(Endpoint{to.self, m.to.peer == a.self ? gid(2) : a.self}, m.bytes, sizeof m.bytes, now);
  }
  EXPECT_EQ(a.events, std::vector<std::string>{"DISCONNECT"});
  EXPECT_EQ(heir.cm.state(pc), State::TimeWait);  // the DREP came: no DREQ resent
  EXPECT_TRUE(heir.events.empty());  // nobody to tell
  EXPECT_TRUE(heir.cm.established().empty());
}

TEST_F(IbCm, RepNeverAnsweredTimesOutWithRejTimeout) {
  a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  uint32_t pc = b.last_conn;
  a.drop_out = true;
  b.cm.accept(pc, rep(), now);
  pump();  // a gets the REP, never answers (it drops what it sends anyway)
  wire.queue.clear();
  for (int i = 0; i < 16; ++i) {
    advance(req_timeout);
    wire.queue.clear();
  }
  EXPECT_EQ(b.events.back(), "TIMEOUT");
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, DestroyWhileConnectingSendsRej) {
  uint32_t ac = a.cm.connect(&a.token, a_to_b, req(), now);
  pump();
  a.cm.destroy(ac, now);
  pump();
  EXPECT_EQ(b.events.back(), "REJ 4");
  EXPECT_EQ(a.cm.connections(), 0u);
  EXPECT_EQ(b.cm.connections(), 0u);
  EXPECT_TRUE(a.events.empty());
}

TEST_F(IbCm, DestroyEstablishedSendsDreqAndReportsNothing) {
  auto [ac, pc] = establish();
  a.events.clear();
  a.cm.destroy(ac, now);
  pump();
  EXPECT_EQ(b.events.back(), "DISCONNECT");
  advance(iba_time(19));
  EXPECT_TRUE(a.events.empty());
  EXPECT_EQ(a.cm.connections(), 0u);
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, SidrQueryAnsweredAndDuplicateAnsweredAlike) {
  wr::CmSidrReq q;
  q.service_id = wr::service_id(wr::PortSpace::kUdp, 7174);
  a.cm.sidr_query(&a.token, a_to_b, q, now);
  Wire::Mad reqmad = wire.queue.front();
  pump();
  ASSERT_EQ(b.events, std::vector<std::string>{"SIDR_REQ"});
  wr::CmSidrRep r;
  r.qpn = 0x400033;
  r.qkey = 0x01234567;
  r.service_id = q.service_id;
  EXPECT_EQ(b.cm.sidr_reply(b.last_conn, r, now), 0);
  Wire::Mad repmad = wire.queue.front();
  pump();
  EXPECT_EQ(a.events, std::vector<std::string>{"SIDR_REP 0"});
  EXPECT_EQ(a.last_sidr_rep.qpn, 0x400033u);
  EXPECT_EQ(a.last_sidr_rep.qkey, 0x01234567u);
  // The duplicate gets the same answer without a new request.
  wire.queue.push_back(reqmad);
  int sent = b.sent;
  pump();
  EXPECT_EQ(b.sent, sent + 1);
  EXPECT_EQ(b.events.size(), 1u);
  advance(req_timeout);
  EXPECT_EQ(b.cm.connections(), 0u);
  (void)repmad;
}

TEST_F(IbCm, SidrWithoutListenerIsStatus1AndUnansweredTimesOut) {
  b.listening = false;
  wr::CmSidrReq q;
  a.cm.sidr_query(&a.token, a_to_b, q, now);
  pump();
  EXPECT_EQ(a.events, std::vector<std::string>{"SIDR_REP 1"});
  EXPECT_EQ(a.last_sidr_rep.qpn, 0u);
  a.events.clear();
  a.drop_out = true;
  a.cm.sidr_query(&a.token, a_to_b, q, now);
  for (int i = 0; i < 16; ++i) advance(Time(4096) * 1000000);
  EXPECT_EQ(a.events, std::vector<std::string>{"TIMEOUT"});
  EXPECT_EQ(a.sent, 1 + 1 + 15);  // the first query, the second and its 15 resends
}

TEST_F(IbCm, StrayAnswersAreIgnored) {
  auto [ac, pc] = establish();
  a.events.clear();
  b.events.clear();
  // A REP, RTU, REJ and DREP naming our comm ID but from another host, or with the wrong
  // peer comm ID, change nothing.
  auto inject = [&](Side& to, const wr::Gid& from, const wr::CmBody& body) {
    wr::CmMad m{wr::cm_header(7), body};
    uint8_t buf[wr::kMadBytes];
    ASSERT_TRUE(wr::encode_cm(m, buf));
    to.cm.on_mad(Endpoint{to.self, from}, buf, sizeof buf, now);
  };
  wr::CmRej rej;
  rej.remote_comm_id = ac;
  rej.local_comm_id = pc;
  inject(a, gid(9), rej);  // wrong host
  rej.local_comm_id = pc + 1;
  inject(a, gid(2), rej);  // wrong comm ID
  wr::CmDreq dreq;
  dreq.remote_comm_id = pc;
  dreq.local_comm_id = ac + 1;
  inject(b, gid(1), dreq);
  wr::CmRtu rtu;
  rtu.remote_comm_id = ac;  // the active side never takes an RTU
  rtu.local_comm_id = pc;
  inject(a, gid(2), rtu);
  EXPECT_TRUE(a.events.empty());
  EXPECT_TRUE(b.events.empty());
  EXPECT_EQ(a.cm.state(ac), State::Established);
  EXPECT_EQ(b.cm.state(pc), State::Established);
}

// A DREQ for a connection we do not have (its process died and its slot was taken, or it
// is long over) gets a DREP all the same, as the kernel's cm_issue_drep sends.
TEST_F(IbCm, DreqForNoConnectionGetsADrep) {
  wr::CmDreq dreq;
  dreq.local_comm_id = 0x1234;
  dreq.remote_comm_id = 0x00c00077;
  wr::CmMad m{wr::cm_header(0x55), dreq};
  uint8_t buf[wr::kMadBytes];
  ASSERT_TRUE(wr::encode_cm(m, buf));
  b.cm.on_mad(Endpoint{b.self, a.self}, buf, sizeof buf, now);
  ASSERT_EQ(wire.queue.size(), 1u);
  wr::CmMad got = wire.queue.front().decoded();
  EXPECT_EQ(got.hdr.tid, 0x55u);
  const auto& drep = std::get<wr::CmDrep>(got.body);
  EXPECT_EQ(drep.local_comm_id, 0x00c00077u);
  EXPECT_EQ(drep.remote_comm_id, 0x1234u);
  EXPECT_EQ(wire.queue.front().to.peer, a.self);
  EXPECT_EQ(b.cm.connections(), 0u);
}

TEST_F(IbCm, UnsupportedGetIsAnsweredWithStatus0x0c) {
  uint8_t buf[wr::kMadBytes]{};
  wr::MadHeader h;
  h.method = wr::kMadGet;
  h.attr_id = 0x0001;  // ClassPortInfo
  h.tid = 99;
  wr::encode_mad_header(h, buf);
  b.cm.on_mad(Endpoint{b.self, a.self}, buf, sizeof buf, now);
  ASSERT_EQ(wire.queue.size(), 1u);
  wr::MadHeader r = wr::decode_mad_header(wire.queue.front().bytes);
  EXPECT_EQ(r.method, wr::kMadGetResp);
  EXPECT_EQ(r.status, wr::kMadStatusUnsupportedAttribute);
  EXPECT_EQ(r.tid, 99u);
}

// Fixed-seed fuzz: random bytes, and valid MADs of every kind with random fields and bit
// flips, into both sides in the middle of connections. Nothing may crash, and every
// connection still ends (timers) so that nothing leaks.
TEST_F(IbCm, FuzzNeverCrashesAndEverythingEnds) {
  std::mt19937_64 rng(12345);
  std::vector<Wire::Mad> seen;
  for (int round = 0; round < 200; ++round) {
    if (round % 10 == 0) a.cm.connect(&a.token, a_to_b, req(), now);
    if (round % 17 == 0) {
      wr::CmSidrReq q;
      a.cm.sidr_query(&a.token, a_to_b, q, now);
    }
    for (auto& m : wire.queue) seen.push_back(m);
    pump();
    if (b.last_conn && rng() % 2) b.cm.accept(b.last_conn, rep(), now);
    if (b.last_conn && rng() % 3 == 0) b.cm.sidr_reply(b.last_conn, {}, now);
    for (int k = 0; k < 20; ++k) {
      uint8_t buf[wr::kMadBytes];
      if (!seen.empty() && rng() % 2) {
        std::memcpy(buf, seen[rng() % seen.size()].bytes, sizeof buf);
        for (int f = 0, n = int(rng() % 8); f < n; ++f) buf[rng() % sizeof buf] ^= uint8_t(1u << (rng() % 8));
        // Point some at live connections.
        if (rng() % 2) {
          uint32_t id = (rng() % 2 ? 1u : 2u) << 22 | uint32_t(rng() % 40);
          buf[24 + 4] = uint8_t(id >> 24), buf[24 + 5] = uint8_t(id >> 16);
          buf[24 + 6] = uint8_t(id >> 8), buf[24 + 7] = uint8_t(id);
        }
      } else {
        for (auto& x : buf) x = uint8_t(rng());
        buf[0] = 1, buf[1] = 7, buf[2] = 2, buf[3] = uint8_t(rng() % 2 ? 3 : rng());
        buf[16] = 0, buf[17] = uint8_t(0x10 + rng() % 11);
      }
      size_t len = rng() % 16 == 0 ? rng() % sizeof buf : sizeof buf;
      Side& to = rng() % 2 ? a : b;
      Side& from = &to == &a ? b : a;
      to.cm.on_mad(Endpoint{to.self, from.self}, buf, len, now);
    }
    pump();
    advance(Time(rng() % 4) * 1'000'000'000);
  }
  // Let every timer run out: everything must end.
  for (int i = 0; i < 40; ++i) {
    advance(iba_time(24) + req_timeout);
    pump();
  }
  for (auto* s : {&a, &b}) {
    // Connections waiting for their user (REQ_RCVD, REP_RCVD, ESTABLISHED) stay until it acts:
    // the user goes away.
    for (uint32_t id = 0; id < 4096; ++id) {
      s->cm.destroy((1u << 22) | id, now);
      s->cm.destroy((2u << 22) | id, now);
    }
  }
  for (int i = 0; i < 40; ++i) {
    pump();
    advance(iba_time(24) + req_timeout);
  }
  EXPECT_EQ(a.cm.connections(), 0u);
  EXPECT_EQ(b.cm.connections(), 0u);
}

}  // namespace
