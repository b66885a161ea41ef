// Shared receive queues: receives taken by attached QPs in order, the limit event,
// attribute checks, and what an attached QP in error tells the application.
#include <gtest/gtest.h>

#include <cstring>

#include "qp_support.hpp"

namespace softverbs::unit {
namespace {

// a <-> b connected RC pair where b takes its receives from `srq`.
class SrqTest : public PairTest {
 protected:
  void SetUp() override {
    PairTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    ibv_srq_init_attr init{};
    init.attr.max_wr = 16;
    init.attr.max_sge = 2;
    init.srq_context = &marker;
    ibv_srq* s = create_srq(pd, &init);
    ASSERT_NE(s, nullptr) << "create_srq: errno " << errno;
    srq = Srq::from(s);
    EXPECT_GE(init.attr.max_wr, 16u);
    EXPECT_GE(init.attr.max_sge, 2u);
    ASSERT_EQ(destroy_qp(b), 0);
    b = make_qp(cq_b, 16, 0, srq);
    ASSERT_NE(b, nullptr);
    connect();
  }

  int marker = 0;
};

TEST_F(SrqTest, AttachedQpTakesReceivesInOrder) {
  for (uint64_t id : {1, 2, 3})
    ASSERT_EQ(post_one_srq_recv(srq, id, buf_b.data() + id * 100, 100, mr_b->ibv.lkey), 0);
  for (uint8_t i = 1; i <= 3; ++i) {
    buf_a[0] = i;
    ASSERT_EQ(SendWr(10 + i, IBV_WR_SEND, buf_a.data(), 1, mr_a->ibv.lkey).post(a), 0);
    ibv_wc r = one(cq_b);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS) << status_name(r.status);
    EXPECT_EQ(r.wr_id, uint64_t(i));
    EXPECT_EQ(r.qp_num, b->qpn());
    EXPECT_EQ(r.src_qp, a->qpn());
    EXPECT_EQ(buf_b[i * 100], i);
  }
}

TEST_F(SrqTest, PostRecvOnAnSrqQpIsEinval) {
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(post_one_recv(b, 1, buf_b.data(), 8, mr_b->ibv.lkey, &bad), EINVAL);
  EXPECT_NE(bad, nullptr);
}

TEST_F(SrqTest, AttachedQpReportsNoReceiveCaps) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(query_qp(b, &attr, IBV_QP_CAP, &init), 0);
  EXPECT_EQ(init.srq, &srq->ibv);
  EXPECT_EQ(attr.cap.max_recv_wr, 0u);
  EXPECT_EQ(attr.cap.max_recv_sge, 0u);
}

TEST_F(SrqTest, EmptySrqMeansRnrUntilAReceiveIsPosted) {
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  expect_cq_empty(cq_a);
  ASSERT_EQ(post_one_srq_recv(srq, 5, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_EQ(one(cq_b).wr_id, 5u);
}

TEST_F(SrqTest, LimitEventFiresOnceWhenTheQueueDropsBelowIt) {
  for (uint64_t id : {1, 2, 3})
    ASSERT_EQ(post_one_srq_recv(srq, id, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ibv_srq_attr attr{};
  attr.srq_limit = 2;
  ASSERT_EQ(modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);

  ASSERT_EQ(SendWr(11, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_b).wr_id, 1u);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd)) << "2 left: not below the limit of 2";

  ASSERT_EQ(SendWr(12, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_b).wr_id, 2u);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, &srq->ibv);
  EXPECT_EQ(ev.element.srq->srq_context, &marker);

  ASSERT_EQ(SendWr(13, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_b).wr_id, 3u);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd)) << "the limit is one-shot until re-armed";
}

TEST_F(SrqTest, QueryAndModify) {
  ibv_srq_attr attr{};
  ASSERT_EQ(query_srq(srq, &attr), 0);
  EXPECT_GE(attr.max_wr, 16u);
  EXPECT_GE(attr.max_sge, 2u);
  EXPECT_EQ(attr.srq_limit, 0u);

  attr.srq_limit = attr.max_wr + 1;
  EXPECT_EQ(modify_srq(srq, &attr, IBV_SRQ_LIMIT), EINVAL) << "a limit above max_wr";
  attr.srq_limit = 4;
  ASSERT_EQ(modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr now{};
  ASSERT_EQ(query_srq(srq, &now), 0);
  EXPECT_EQ(now.srq_limit, 4u);
}

TEST_F(SrqTest, ResizeBelowTheQueuedCountIsEinval) {
  for (uint64_t id = 0; id < 8; ++id)
    ASSERT_EQ(post_one_srq_recv(srq, id, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ibv_srq_attr attr{};
  attr.max_wr = 4;
  EXPECT_EQ(modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
  attr.max_wr = 32;
  EXPECT_EQ(modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
  ibv_srq_attr now{};
  ASSERT_EQ(query_srq(srq, &now), 0);
  EXPECT_GE(now.max_wr, 32u);
}

TEST_F(SrqTest, PostingBeyondMaxWrIsEnomem) {
  ibv_srq_attr attr{};
  ASSERT_EQ(query_srq(srq, &attr), 0);
  for (uint32_t i = 0; i < attr.max_wr; ++i)
    ASSERT_EQ(post_one_srq_recv(srq, i, buf_b.data(), 8, mr_b->ibv.lkey), 0) << i;
  EXPECT_EQ(post_one_srq_recv(srq, attr.max_wr, buf_b.data(), 8, mr_b->ibv.lkey), ENOMEM);
}

TEST_F(SrqTest, DestroySrqIsEbusyWhileAQpUsesIt) {
  EXPECT_EQ(destroy_srq(srq), EBUSY);
  ASSERT_EQ(destroy_qp(b), 0);
  b = nullptr;
  EXPECT_EQ(destroy_srq(srq), 0);
  srq = nullptr;
}

TEST_F(SrqTest, AttachedQpInErrorRaisesLastWqeReached) {
  ASSERT_EQ(post_one_srq_recv(srq, 1, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ASSERT_EQ(to_state(b, IBV_QPS_ERR), 0);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, b->qp());
  // The SRQ's receives belong to the SRQ, not to the QP: nothing is flushed.
  expect_cq_empty(cq_b);
}

TEST_F(SrqTest, TwoQpsShareOneSrq) {
  // c (on the SRQ) <-> d, beside a <-> b.
  Qp* c = make_qp(cq_b, 16, 0, srq);
  Qp* d = make_qp(cq_a);
  ASSERT_TRUE(c && d);
  ASSERT_EQ(to_init(c), 0);
  ASSERT_EQ(to_init(d), 0);
  ASSERT_EQ(to_rtr(c, d->qpn()), 0);
  ASSERT_EQ(to_rtr(d, c->qpn()), 0);
  ASSERT_EQ(to_rts(c), 0);
  ASSERT_EQ(to_rts(d), 0);
  ASSERT_EQ(post_one_srq_recv(srq, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(post_one_srq_recv(srq, 2, buf_b.data() + 64, 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(10, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(d), 0);
  ASSERT_EQ(SendWr(11, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  std::vector<ibv_wc> r = poll_until(cq_b, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 1u);
  EXPECT_EQ(r[0].qp_num, c->qpn());
  EXPECT_EQ(r[1].wr_id, 2u);
  EXPECT_EQ(r[1].qp_num, b->qpn());
  EXPECT_EQ(destroy_qp(c), 0);
  EXPECT_EQ(destroy_qp(d), 0);
}

TEST_F(SrqTest, CreateSrqRejectsBadAttributes) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 0;
  init.attr.max_sge = 1;
  EXPECT_EQ(create_errno([&] { return create_srq(pd, &init); }), EINVAL);
  init.attr.max_wr = Limits::max_srq_wr + 1;
  EXPECT_EQ(create_errno([&] { return create_srq(pd, &init); }), EINVAL);
  init.attr.max_wr = 4;
  init.attr.max_sge = Limits::max_sge + 1;
  EXPECT_EQ(create_errno([&] { return create_srq(pd, &init); }), EINVAL);
}

}  // namespace
}  // namespace softverbs::unit
