// UC and UD QPs inside one process: what differs from RC. No acknowledgements (remote
// errors and missing receives are silent), send errors take the QP to SQE rather than
// ERR, and UD receives carry a 40-byte GRH slot.
#include <gtest/gtest.h>

#include <cstring>

#include "qp_support.hpp"
#include "wire/roce/grh.hpp"

namespace softverbs::unit {
namespace {

class UcPairTest : public PairTest {
 protected:
  UcPairTest() { type = IBV_QPT_UC; }
};

class UdPairTest : public PairTest {
 protected:
  UdPairTest() { type = IBV_QPT_UD; }
  void SetUp() override {
    PairTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    ibv_ah_attr av = loopback_av();
    ibv_ah* h = create_ah(pd, &av);
    ASSERT_NE(h, nullptr) << "create_ah: errno " << errno;
    ah = h;
    connect();
  }
  void TearDown() override {
    if (ah) {
      EXPECT_EQ(destroy_ah(Ah::from(ah)), 0);
    }
    PairTest::TearDown();
  }
  ibv_ah* ah = nullptr;
};

// --- UC ---------------------------------------------------------------------------------

TEST_F(UcPairTest, SendRecv) {
  connect();
  std::memcpy(buf_a.data(), "uc", 3);
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 3, mr_a->ibv.lkey).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.opcode, IBV_WC_SEND);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.byte_len, 3u);
  EXPECT_EQ(r.src_qp, a->qpn());
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), "uc");
}

TEST_F(UcPairTest, RdmaWrite) {
  connect();
  std::memcpy(buf_a.data(), "uc write", 9);
  ASSERT_EQ(SendWr(3, IBV_WR_RDMA_WRITE, buf_a.data(), 9, mr_a->ibv.lkey)
                .rdma(buf_b.data() + 10, mr_b->ibv.rkey)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data() + 10), "uc write");
}

TEST_F(UcPairTest, ReadAndAtomicsAreNotUcOperations) {
  connect();
  ibv_send_wr* bad = nullptr;
  SendWr rd(4, IBV_WR_RDMA_READ, buf_a.data(), 8, mr_a->ibv.lkey);
  rd.rdma(buf_b.data(), mr_b->ibv.rkey);
  EXPECT_EQ(rd.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &rd.wr);
  SendWr at(5, IBV_WR_ATOMIC_FETCH_AND_ADD, buf_a.data(), 8, mr_a->ibv.lkey);
  at.atomic(buf_b.data(), mr_b->ibv.rkey, 1);
  EXPECT_EQ(at.post(a, &bad), EINVAL);
  expect_cq_empty(cq_a);
}

TEST_F(UcPairTest, SendWithoutAReceiveIsDropped) {
  connect();
  ASSERT_EQ(SendWr(6, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS) << "UC has no RNR: the sender is done";
  expect_cq_empty(cq_b);
  // The lost message does not reappear in a receive posted later.
  ASSERT_EQ(post_one_recv(b, 7, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  expect_cq_empty(cq_b);
  EXPECT_EQ(state_of(a), IBV_QPS_RTS);
  EXPECT_EQ(state_of(b), IBV_QPS_RTS);
}

TEST_F(UcPairTest, WriteWithBadRkeyIsSilentlyDropped) {
  connect();
  ASSERT_EQ(SendWr(8, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), unused_key(mr_b->ibv.rkey))
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS) << "UC requesters learn nothing of remote errors";
  EXPECT_EQ(state_of(b), IBV_QPS_RTS);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd));
}

TEST_F(UcPairTest, LocalErrorMovesTheQpToSqeAndRtsRecovers) {
  connect();
  ASSERT_EQ(post_one_recv(a, 20, buf_a.data() + 2048, 64, mr_a->ibv.lkey), 0);
  ASSERT_EQ(SendWr(9, IBV_WR_SEND, buf_a.data(), 8, unused_key(mr_a->ibv.lkey)).post(a), 0);
  ASSERT_EQ(SendWr(10, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  std::vector<ibv_wc> s = poll_until(cq_a, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 9u);
  EXPECT_EQ(s[0].status, IBV_WC_LOC_PROT_ERR) << status_name(s[0].status);
  EXPECT_EQ(s[1].wr_id, 10u);
  EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(state_of(a), IBV_QPS_SQE);

  // The receive side goes on in SQE.
  ASSERT_EQ(SendWr(11, IBV_WR_SEND, buf_b.data(), 4, mr_b->ibv.lkey).post(b), 0);
  EXPECT_EQ(one(cq_b).status, IBV_WC_SUCCESS);
  ibv_wc r = one(cq_a);
  EXPECT_EQ(r.wr_id, 20u);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);

  // SQE -> RTS, and sending works again.
  ASSERT_EQ(to_state(a, IBV_QPS_RTS), 0);
  ASSERT_EQ(post_one_recv(b, 21, buf_b.data() + 2048, 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(12, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_EQ(one(cq_b).wr_id, 21u);
}

// --- UD ---------------------------------------------------------------------------------

TEST_F(UdPairTest, SendCarriesAGrhSlotAndTheSource) {
  std::memcpy(buf_a.data(), "datagram", 9);
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), kGrhBytes + 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 9, mr_a->ibv.lkey).ud(ah, b->qpn()).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.opcode, IBV_WC_SEND);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS) << status_name(r.status);
  EXPECT_EQ(r.opcode, IBV_WC_RECV);
  EXPECT_EQ(r.byte_len, kGrhBytes + 9) << "byte_len counts the GRH";
  EXPECT_TRUE(r.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(r.src_qp, a->qpn());
  EXPECT_EQ(r.qp_num, b->qpn());
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data() + kGrhBytes), "datagram");
}

// Over the same host too, the GRH slot is what a RoCE v2 NIC gives for the AH's IPv4-mapped
// GIDs (an IPv4 header in its last 20 bytes, the destination address last), and the
// completion's SL says so (wire/roce/grh.hpp): UCX's UD looks for its own address there.
TEST_F(UdPairTest, GrhSlotHoldsAnIpv4HeaderAndSlSaysSo) {
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), kGrhBytes + 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).ud(ah, b->qpn()).post(a), 0);
  ibv_wc r = one(cq_b);
  ASSERT_EQ(r.status, IBV_WC_SUCCESS) << status_name(r.status);
  EXPECT_EQ(r.sl, wire::roce::kL3Ipv4);
  const uint8_t* slot = buf_b.data();
  EXPECT_EQ(slot[20], 0x45) << "IPv4, 20-byte header";
  const ibv_gid& dgid = Device::instance().gids()[0].gid;  // IPv4-mapped: an IPv4 address
  EXPECT_EQ(std::memcmp(slot + 36, dgid.raw + 12, 4), 0) << "destination address";
}

TEST_F(UdPairTest, SendWithImmediate) {
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), kGrhBytes + 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND_WITH_IMM, buf_a.data(), 4, mr_a->ibv.lkey)
                .ud(ah, b->qpn())
                .imm(77)
                .post(a),
            0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(r.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r.imm_data), 77u);
}

TEST_F(UdPairTest, WrongQkeyIsDropped) {
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), kGrhBytes + 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey)
                .ud(ah, b->qpn(), kQkey + 1)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  expect_cq_empty(cq_b);
  // The receive is still there for a datagram with the right Q_Key.
  ASSERT_EQ(SendWr(3, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).ud(ah, b->qpn()).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_EQ(one(cq_b).wr_id, 1u);
}

TEST_F(UdPairTest, UnknownDestinationQpIsDropped) {
  ASSERT_EQ(
      SendWr(2, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).ud(ah, unused_qpn(b->qpn())).post(a),
      0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_EQ(state_of(a), IBV_QPS_RTS);
}

TEST_F(UdPairTest, TooSmallReceiveIsLocalLengthError) {
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), kGrhBytes + 4, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 64, mr_a->ibv.lkey).ud(ah, b->qpn()).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS) << "UD senders learn nothing of the receiver";
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.wr_id, 1u);
  EXPECT_EQ(r.status, IBV_WC_LOC_LEN_ERR) << status_name(r.status);
}

TEST_F(UdPairTest, MessageLargerThanTheMtuIsLocalLengthError) {
  std::vector<uint8_t> big(8192);
  ibv_mr* m = reg_mr(pd, big.data(), big.size(), reinterpret_cast<uintptr_t>(big.data()), 0);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, big.data(), 4097, m->lkey).ud(ah, b->qpn()).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_LOC_LEN_ERR) << status_name(s.status);
  EXPECT_EQ(state_of(a), IBV_QPS_SQE) << "a UD send error stops only the send queue";
  EXPECT_EQ(to_state(a, IBV_QPS_RTS), 0);
  EXPECT_EQ(dereg_mr(Mr::from(m)), 0);
}

TEST_F(UdPairTest, RdmaIsNotAUdOperation) {
  ibv_send_wr* bad = nullptr;
  SendWr w(1, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey);
  w.rdma(buf_b.data(), mr_b->ibv.rkey).ud(ah, b->qpn());
  EXPECT_EQ(w.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &w.wr);
}

TEST_F(UdPairTest, SendWithoutAnAhIsEinval) {
  ibv_send_wr* bad = nullptr;
  SendWr w(1, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey);
  w.ud(nullptr, b->qpn());
  EXPECT_EQ(w.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &w.wr);
}

TEST_F(UdPairTest, AhNeedsAGrhOnRoce) {
  ibv_ah_attr av = loopback_av();
  av.is_global = 0;
  EXPECT_EQ(create_errno([&] { return create_ah(pd, &av); }), EINVAL);
  av = loopback_av();
  av.grh.sgid_index = static_cast<uint8_t>(Device::instance().gids().size());
  EXPECT_EQ(create_errno([&] { return create_ah(pd, &av); }), EINVAL);
}

TEST_F(UdPairTest, QkeyFromQueryQp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(query_qp(b, &attr, IBV_QP_QKEY, &init), 0);
  EXPECT_EQ(attr.qkey, kQkey);
  EXPECT_EQ(init.qp_type, IBV_QPT_UD);
}

}  // namespace
}  // namespace softverbs::unit
