// The engine against a fake transport: an RC QP whose destination GID is another host takes
// the roce route, where the test puts a transport that records each request and answers
// what the test scripts (ACK, RNR NAK, silence, a NAK with an error). This checks the
// requester and completer alone, with no responder behind them: the request's fields, the
// retry budgets (rnr_retry, retry_cnt), the error statuses and the flush that follows.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "qp_support.hpp"
#include "unit_support.hpp"
#include "wire/router.hpp"
#include "wire/transport.hpp"

namespace softverbs::unit {
namespace {

// 192.0.2.1 (TEST-NET-1): never one of this host's addresses.
ibv_gid other_host_gid() {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = 192;
  g.raw[13] = 0;
  g.raw[14] = 2;
  g.raw[15] = 1;
  return g;
}

class FakeTransport final : public wire::Transport {
 public:
  struct Seen {
    wire::Request req;
    std::vector<uint8_t> payload;  // the requester's gather list, copied
    ibv_gid dgid;
  };
  wire::Reply deliver(const ibv_gid& dgid, const wire::Request& req) override {
    std::lock_guard<std::mutex> lock(mu);
    Seen s{req, {}, dgid};
    for (int i = 0; i < req.nlocal; ++i) {
      auto* p = static_cast<const uint8_t*>(req.local[i].iov_base);
      s.payload.insert(s.payload.end(), p, p + req.local[i].iov_len);
    }
    s.req.local = nullptr;  // not ours to keep
    seen.push_back(s);
    return answer;
  }
  void kick(uint32_t) override {}

  std::mutex mu;
  std::vector<Seen> seen;
  wire::Reply answer{wire::Reply::Ack};
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return seen.size();
  }
};

class FakeTransportTest : public PairTest {
 protected:
  void SetUp() override {
    PairTest::SetUp();
    wire::set_transport(wire::Route::Roce, &fake);
  }
  void TearDown() override {
    PairTest::TearDown();
    wire::set_transport(wire::Route::Roce, nullptr);
  }
  // a to RTS towards QP 0x123456 on another host; b stays unused.
  void connect_away(const ConnOpts& o = {}) {
    ASSERT_EQ(to_init(a, o.access), 0);
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = kRemoteQpn;
    r.rq_psn = 0;
    r.ah_attr = loopback_av();
    r.ah_attr.grh.dgid = other_host_gid();
    r.max_dest_rd_atomic = o.max_dest_rd_atomic;
    r.min_rnr_timer = o.min_rnr_timer;
    ASSERT_EQ(modify_qp(a, &r,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    ASSERT_EQ(to_rts(a, o), 0);
    ASSERT_EQ(a->send_path.route, wire::Route::Roce);
  }
  static constexpr uint32_t kRemoteQpn = 0x123456;
  FakeTransport fake;
};

TEST_F(FakeTransportTest, RequestCarriesTheWorkRequest) {
  connect_away();
  std::memcpy(buf_a.data(), "hello, other host", 17);
  ASSERT_EQ(SendWr(7, IBV_WR_SEND_WITH_IMM, buf_a.data(), 17, mr_a->ibv.lkey,
                   IBV_SEND_SIGNALED | IBV_SEND_SOLICITED)
                .imm(0xabcd)
                .post(a),
            0);
  ibv_wc wc = one(cq_a);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  ASSERT_EQ(fake.count(), 1u);
  const FakeTransport::Seen& s = fake.seen[0];
  EXPECT_EQ(s.req.opcode, IBV_WR_SEND_WITH_IMM);
  EXPECT_EQ(s.req.dst_qpn, kRemoteQpn);
  EXPECT_EQ(s.req.src_qpn, a->qpn());
  EXPECT_EQ(s.req.imm, htonl(0xabcd));
  EXPECT_TRUE(s.req.flags & IBV_SEND_SOLICITED);
  EXPECT_EQ(s.req.length, 17u);
  EXPECT_EQ(std::string(s.payload.begin(), s.payload.end()), "hello, other host");
  EXPECT_EQ(std::memcmp(s.dgid.raw, other_host_gid().raw, 16), 0);

  ASSERT_EQ(SendWr(8, IBV_WR_RDMA_WRITE, buf_a.data(), 64, mr_a->ibv.lkey)
                .rdma(reinterpret_cast<void*>(0x1000), 0x77)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  ASSERT_EQ(fake.count(), 2u);
  EXPECT_EQ(fake.seen[1].req.remote_addr, 0x1000u);
  EXPECT_EQ(fake.seen[1].req.rkey, 0x77u);
}

// rnr_retry = 2: the first try and two retries, then RNR_RETRY_EXC_ERR and the QP in ERR.
TEST_F(FakeTransportTest, RnrBudgetThenError) {
  ConnOpts o;
  o.rnr_retry = 2;
  connect_away(o);
  fake.answer = {wire::Reply::RnrNak, IBV_WC_SUCCESS, 1};  // 0.01 ms
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  std::vector<ibv_wc> got = poll_until(cq_a, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(got[1].wr_id, 2u);
  EXPECT_EQ(got[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(fake.count(), 3u);  // never the second WQE
  EXPECT_EQ(state_of(a), IBV_QPS_ERR);
}

// No answer at all: retry_cnt = 3 retries after the first try, then RETRY_EXC_ERR.
TEST_F(FakeTransportTest, SilenceRetryBudgetThenError) {
  ConnOpts o;
  o.retry_cnt = 3;
  o.timeout = 1;  // 8.192 us
  connect_away(o);
  fake.answer = {wire::Reply::NoResponse};
  ASSERT_EQ(SendWr(1, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(reinterpret_cast<void*>(0x1000), 0x77)
                .post(a),
            0);
  ibv_wc wc = one(cq_a);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(fake.count(), 4u);
  EXPECT_EQ(state_of(a), IBV_QPS_ERR);
}

// A NAK with a remote error: that status, no retry, the QP in ERR.
TEST_F(FakeTransportTest, RemoteErrorIsFinal) {
  connect_away();
  fake.answer = {wire::Reply::Error, IBV_WC_REM_ACCESS_ERR};
  ASSERT_EQ(SendWr(1, IBV_WR_RDMA_READ, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(reinterpret_cast<void*>(0x1000), 0x77)
                .post(a),
            0);
  ibv_wc wc = one(cq_a);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc.qp_num, a->qpn());
  EXPECT_EQ(fake.count(), 1u);
  EXPECT_EQ(state_of(a), IBV_QPS_ERR);
}

// Without a transport for the route (this build has no RoCE yet), another host is a host
// that never answers: RETRY_EXC_ERR after the budget, as before.
TEST_F(FakeTransportTest, NoTransportIsSilence) {
  wire::set_transport(wire::Route::Roce, nullptr);
  ConnOpts o;
  o.retry_cnt = 1;
  o.timeout = 1;
  connect_away(o);
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(fake.count(), 0u);
}

TEST(RouterTest, RoutesByGidAndQpn) {
  ibv_gid here = Device::instance().gids()[0].gid;
  uint32_t mine = wire::allocate_qpn();
  EXPECT_EQ(wire::route(here, mine), wire::Route::Loop);
  // Another registry slot on this host (the slot's number is in the QPN's high bits).
  uint32_t other = mine ^ (1u << 20);
  EXPECT_EQ(wire::route(here, other), wire::Route::Shm);
  EXPECT_EQ(wire::route(other_host_gid(), mine), wire::Route::Roce);
  ibv_gid group{};
  group.raw[0] = 0xff;
  EXPECT_EQ(wire::route(group, 0xffffff), wire::Route::Multicast);
}

}  // namespace
}  // namespace softverbs::unit
