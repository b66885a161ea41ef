// QPs end to end inside one process: two RC QPs connected to each other. Operations,
// completion fields, error statuses and states, flushes, caps. Completions may come from
// the progress thread (retries, deferred flushes), so every wait is a bounded poll, never
// a timing assertion.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "qp_support.hpp"

namespace softverbs::unit {
namespace {

using RcPairTest = PairTest;

// --- successful operations ---------------------------------------------------------------

TEST_F(RcPairTest, ConnectReachesRts) {
  connect();
  EXPECT_EQ(state_of(a), IBV_QPS_RTS);
  EXPECT_EQ(state_of(b), IBV_QPS_RTS);
  EXPECT_EQ(a->qp()->state, IBV_QPS_RTS);
  EXPECT_NE(a->qpn(), b->qpn());
}

TEST_F(RcPairTest, SendRecvDeliversPayloadAndCompletionFields) {
  connect();
  const char msg[] = "hello, soft verbs";
  std::memcpy(buf_a.data(), msg, sizeof(msg));
  ASSERT_EQ(post_one_recv(b, 0xb0b, buf_b.data(), 256, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(0xa11ce, IBV_WR_SEND, buf_a.data(), sizeof(msg), mr_a->ibv.lkey).post(a), 0);

  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 0xa11ceu);
  EXPECT_EQ(s.opcode, IBV_WC_SEND);
  EXPECT_EQ(s.qp_num, a->qpn());

  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS) << status_name(r.status);
  EXPECT_EQ(r.wr_id, 0xb0bu);
  EXPECT_EQ(r.opcode, IBV_WC_RECV);
  EXPECT_EQ(r.byte_len, sizeof(msg));
  EXPECT_EQ(r.qp_num, b->qpn());
  EXPECT_EQ(r.src_qp, a->qpn());
  EXPECT_FALSE(r.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), msg);
  expect_cq_empty(cq_a);
  expect_cq_empty(cq_b);
}

TEST_F(RcPairTest, SendWithImmediate) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND_WITH_IMM, buf_a.data(), 8, mr_a->ibv.lkey).imm(0xcafe).post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.opcode, IBV_WC_RECV);
  EXPECT_TRUE(r.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r.imm_data), 0xcafeu);
  EXPECT_EQ(r.byte_len, 8u);
}

TEST_F(RcPairTest, ZeroLengthSend) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  SendWr w(2, IBV_WR_SEND, nullptr, 0, 0);
  w.wr.num_sge = 0;
  ASSERT_EQ(w.post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.byte_len, 0u);
}

TEST_F(RcPairTest, UnsignaledSendMakesNoSendCompletion) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey, 0).post(a), 0);
  EXPECT_EQ(one(cq_b).status, IBV_WC_SUCCESS);
  // The receive completed, so the send is done: nothing may show on the sender's CQ.
  expect_cq_empty(cq_a);
}

TEST_F(RcPairTest, SqSigAllSignalsUnsignaledSends) {
  ASSERT_EQ(destroy_qp(a), 0);
  a = make_qp(cq_a, 16, /*sq_sig_all=*/1);
  ASSERT_NE(a, nullptr);
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey, 0).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS);
  EXPECT_EQ(s.wr_id, 2u);
}

TEST_F(RcPairTest, GatherAndScatterLists) {
  connect();
  std::memcpy(buf_a.data(), "abcd", 4);
  std::memcpy(buf_a.data() + 100, "efghij", 6);
  // Receive: 3 + 7 bytes in two pieces.
  ibv_sge rs[2] = {{reinterpret_cast<uintptr_t>(buf_b.data()), 3, mr_b->ibv.lkey},
                   {reinterpret_cast<uintptr_t>(buf_b.data() + 200), 7, mr_b->ibv.lkey}};
  ibv_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = rs;
  rwr.num_sge = 2;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(post_recv(b, &rwr, &rbad), 0);
  ibv_sge ss[2] = {{reinterpret_cast<uintptr_t>(buf_a.data()), 4, mr_a->ibv.lkey},
                   {reinterpret_cast<uintptr_t>(buf_a.data() + 100), 6, mr_a->ibv.lkey}};
  ibv_send_wr swr{};
  swr.wr_id = 2;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.sg_list = ss;
  swr.num_sge = 2;
  ibv_send_wr* sbad = nullptr;
  ASSERT_EQ(post_send(a, &swr, &sbad), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.byte_len, 10u);
  EXPECT_EQ(std::memcmp(buf_b.data(), "abc", 3), 0);
  EXPECT_EQ(std::memcmp(buf_b.data() + 200, "defghij", 7), 0);
}

TEST_F(RcPairTest, InlineSendCopiesAtPostTime) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  char local[16] = "inline payload";
  // Inline data needs no registered memory: the lkey is not looked at.
  ASSERT_EQ(SendWr(2, IBV_WR_SEND, local, sizeof(local), 0xdeadbeef,
                   IBV_SEND_SIGNALED | IBV_SEND_INLINE)
                .post(a),
            0);
  std::memset(local, 'x', sizeof(local));  // the buffer is ours again once post returns
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), "inline payload");
}

TEST_F(RcPairTest, ManySendsCompleteInOrder) {
  connect();
  constexpr int kCount = 12;
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(post_one_recv(b, 100 + i, buf_b.data() + i * 8, 8, mr_b->ibv.lkey), 0);
  for (int i = 0; i < kCount; ++i) {
    buf_a[i] = static_cast<uint8_t>(i);
    ASSERT_EQ(SendWr(i, IBV_WR_SEND, buf_a.data() + i, 1, mr_a->ibv.lkey).post(a), 0);
  }
  std::vector<ibv_wc> s = poll_until(cq_a, kCount);
  std::vector<ibv_wc> r = poll_until(cq_b, kCount);
  ASSERT_EQ(s.size(), size_t(kCount));
  ASSERT_EQ(r.size(), size_t(kCount));
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(s[i].wr_id, uint64_t(i));
    EXPECT_EQ(r[i].wr_id, uint64_t(100 + i));
    EXPECT_EQ(buf_b[i * 8], i);
  }
}

TEST_F(RcPairTest, RdmaWrite) {
  connect();
  for (size_t i = 0; i < 512; ++i) buf_a[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(SendWr(5, IBV_WR_RDMA_WRITE, buf_a.data(), 512, mr_a->ibv.lkey)
                .rdma(buf_b.data() + 1024, mr_b->ibv.rkey)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 5u);
  EXPECT_EQ(s.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(std::memcmp(buf_b.data() + 1024, buf_a.data(), 512), 0);
  EXPECT_EQ(buf_b[1023], 0);
  EXPECT_EQ(buf_b[1024 + 512], 0);
  expect_cq_empty(cq_b);  // a plain WRITE consumes no receive and completes nothing there
}

TEST_F(RcPairTest, RdmaWriteWithImmediateConsumesAReceive) {
  connect();
  std::memcpy(buf_a.data(), "written", 8);
  ASSERT_EQ(post_one_recv(b, 77, buf_b.data() + 2048, 16, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(6, IBV_WR_RDMA_WRITE_WITH_IMM, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), mr_b->ibv.rkey)
                .imm(0x1234)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS);
  EXPECT_EQ(s.opcode, IBV_WC_RDMA_WRITE);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.wr_id, 77u);
  EXPECT_EQ(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(r.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r.imm_data), 0x1234u);
  EXPECT_EQ(r.byte_len, 8u);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), "written");
  EXPECT_EQ(buf_b[2048], 0) << "the data goes to remote_addr, not to the receive buffer";
}

TEST_F(RcPairTest, RdmaRead) {
  connect();
  for (size_t i = 0; i < 300; ++i) buf_b[100 + i] = static_cast<uint8_t>(255 - i);
  ASSERT_EQ(SendWr(7, IBV_WR_RDMA_READ, buf_a.data() + 8, 300, mr_a->ibv.lkey)
                .rdma(buf_b.data() + 100, mr_b->ibv.rkey)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 7u);
  EXPECT_EQ(s.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(s.byte_len, 300u);
  EXPECT_EQ(std::memcmp(buf_a.data() + 8, buf_b.data() + 100, 300), 0);
  expect_cq_empty(cq_b);
}

TEST_F(RcPairTest, AtomicFetchAndAdd) {
  connect();
  uint64_t* target = reinterpret_cast<uint64_t*>(buf_b.data() + 64);
  uint64_t* result = reinterpret_cast<uint64_t*>(buf_a.data() + 128);
  *target = 5;
  ASSERT_EQ(SendWr(8, IBV_WR_ATOMIC_FETCH_AND_ADD, result, 8, mr_a->ibv.lkey)
                .atomic(target, mr_b->ibv.rkey, 3)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  EXPECT_EQ(s.opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(s.byte_len, 8u);
  EXPECT_EQ(*result, 5u) << "the original value comes back";
  EXPECT_EQ(*target, 8u);
}

TEST_F(RcPairTest, AtomicCompareAndSwap) {
  connect();
  uint64_t* target = reinterpret_cast<uint64_t*>(buf_b.data() + 64);
  uint64_t* result = reinterpret_cast<uint64_t*>(buf_a.data() + 128);
  *target = 8;
  // Matching compare: swapped.
  ASSERT_EQ(SendWr(9, IBV_WR_ATOMIC_CMP_AND_SWP, result, 8, mr_a->ibv.lkey)
                .atomic(target, mr_b->ibv.rkey, 8, 100)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS);
  EXPECT_EQ(s.opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(*result, 8u);
  EXPECT_EQ(*target, 100u);
  // Mismatch: unchanged, the current value comes back.
  ASSERT_EQ(SendWr(10, IBV_WR_ATOMIC_CMP_AND_SWP, result, 8, mr_a->ibv.lkey)
                .atomic(target, mr_b->ibv.rkey, 8, 200)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_EQ(*result, 100u);
  EXPECT_EQ(*target, 100u);
}

TEST_F(RcPairTest, AtomicWithWrongLengthIsRejectedAtPost) {
  connect();
  ibv_send_wr* bad = nullptr;
  SendWr w(11, IBV_WR_ATOMIC_FETCH_AND_ADD, buf_a.data(), 4, mr_a->ibv.lkey);
  w.atomic(buf_b.data(), mr_b->ibv.rkey, 1);
  EXPECT_EQ(w.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &w.wr);
}

TEST_F(RcPairTest, RnrRetryWaitsForAReceive) {
  ConnOpts o;
  o.rnr_retry = 7;  // infinite
  connect(o, o);
  std::memcpy(buf_a.data(), "late", 5);
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 5, mr_a->ibv.lkey).post(a), 0);
  // No receive yet: the send cannot have completed.
  expect_cq_empty(cq_a);
  expect_cq_empty(cq_b);
  ASSERT_EQ(post_one_recv(b, 2, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_SUCCESS) << status_name(s.status);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), "late");
}

TEST_F(RcPairTest, RnrRetriesThenGivesUp) {
  ConnOpts o;
  o.rnr_retry = 2;
  o.min_rnr_timer = 1;
  connect(o, o);
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 5, mr_a->ibv.lkey).post(a), 0);
  ibv_wc s = one(cq_a);  // after two timed retries, from the progress thread
  EXPECT_EQ(s.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 1u);
  EXPECT_TRUE(eventually([&] { return state_of(a) == IBV_QPS_ERR; }));
}

// --- errors --------------------------------------------------------------------------------

TEST_F(RcPairTest, BadLkeyIsLocalProtectionError) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  const uint32_t bad_key = unused_key(mr_a->ibv.lkey);
  ASSERT_EQ(SendWr(3, IBV_WR_SEND, buf_a.data(), 8, bad_key).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_LOC_PROT_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 3u);
  EXPECT_EQ(s.qp_num, a->qpn());
  EXPECT_TRUE(eventually([&] { return state_of(a) == IBV_QPS_ERR; }));
  expect_cq_empty(cq_b);  // nothing reached the peer
}

TEST_F(RcPairTest, LkeyOutsideItsMrIsLocalProtectionError) {
  connect();
  ASSERT_EQ(post_one_recv(b, 1, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(3, IBV_WR_SEND, buf_a.data() + kBufSize - 4, 8, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(RcPairTest, ReadIntoMemoryWithoutLocalWriteIsLocalProtectionError) {
  connect();
  Mr* ro = reg(buf_a, 0);  // readable only
  ASSERT_NE(ro, nullptr);
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_READ, buf_a.data(), 8, ro->ibv.lkey)
                .rdma(buf_b.data(), mr_b->ibv.rkey)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(dereg_mr(ro), 0);
}

TEST_F(RcPairTest, ErrorCompletionFlushesTheRestOfTheSendQueue) {
  connect();
  ibv_sge bad_sge{reinterpret_cast<uintptr_t>(buf_a.data()), 8, unused_key(mr_a->ibv.lkey)};
  ibv_sge good_sge{reinterpret_cast<uintptr_t>(buf_a.data()), 8, mr_a->ibv.lkey};
  ibv_send_wr second{};
  second.wr_id = 2;
  second.opcode = IBV_WR_RDMA_WRITE;
  second.send_flags = IBV_SEND_SIGNALED;
  second.sg_list = &good_sge;
  second.num_sge = 1;
  second.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_b.data());
  second.wr.rdma.rkey = mr_b->ibv.rkey;
  ibv_send_wr first = second;
  first.wr_id = 1;
  first.sg_list = &bad_sge;
  first.next = &second;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(post_send(a, &first, &bad), 0);
  std::vector<ibv_wc> s = poll_until(cq_a, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(s[1].qp_num, a->qpn());
}

TEST_F(RcPairTest, BadRkeyIsRemoteAccessErrorAndMovesThePeerToErr) {
  connect();
  const uint32_t bad_rkey = unused_key(mr_b->ibv.rkey);
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), bad_rkey)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_REM_ACCESS_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 4u);
  EXPECT_TRUE(eventually([&] { return state_of(a) == IBV_QPS_ERR; }));
  EXPECT_TRUE(eventually([&] { return state_of(b) == IBV_QPS_ERR; }));

  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b->qp());
}

TEST_F(RcPairTest, WriteOutsideTheRemoteMrIsRemoteAccessError) {
  connect();
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_WRITE, buf_a.data(), 16, mr_a->ibv.lkey)
                .rdma(buf_b.data() + kBufSize - 8, mr_b->ibv.rkey)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_b[kBufSize - 8], 0) << "nothing may be written on a failed check";
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
}

TEST_F(RcPairTest, WriteToMrWithoutRemoteWriteIsRemoteAccessError) {
  connect();
  Mr* rr = reg(buf_b, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(rr, nullptr);
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), rr->ibv.rkey)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_REM_ACCESS_ERR);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(dereg_mr(rr), 0);
}

TEST_F(RcPairTest, QpWithoutRemoteReadAccessRefusesReads) {
  ConnOpts ob;
  ob.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;  // no remote read on b
  connect({}, ob);
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_READ, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), mr_b->ibv.rkey)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_REM_ACCESS_ERR);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b->qp());
}

TEST_F(RcPairTest, TooSmallReceiveIsLengthErrorOnBothSides) {
  connect();
  ASSERT_EQ(post_one_recv(b, 21, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(22, IBV_WR_SEND, buf_a.data(), 64, mr_a->ibv.lkey).post(a), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_LOC_LEN_ERR) << status_name(r.status);
  EXPECT_EQ(r.wr_id, 21u);
  EXPECT_EQ(r.qp_num, b->qpn());
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_REM_INV_REQ_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 22u);
  EXPECT_TRUE(eventually([&] { return state_of(a) == IBV_QPS_ERR; }));
  EXPECT_TRUE(eventually([&] { return state_of(b) == IBV_QPS_ERR; }));
}

TEST_F(RcPairTest, ReceiveWithBadLkeyIsProtectionErrorOnBothSides) {
  connect();
  ASSERT_EQ(post_one_recv(b, 31, buf_b.data(), 64, unused_key(mr_b->ibv.lkey)), 0);
  ASSERT_EQ(SendWr(32, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_LOC_PROT_ERR) << status_name(r.status);
  EXPECT_EQ(r.wr_id, 31u);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_REM_OP_ERR) << status_name(s.status);
}

TEST_F(RcPairTest, RnrWithZeroRetriesFailsAtOnce) {
  ConnOpts o;
  o.rnr_retry = 0;
  connect(o, o);
  ASSERT_EQ(SendWr(41, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_RNR_RETRY_EXC_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 41u);
  EXPECT_TRUE(eventually([&] { return state_of(a) == IBV_QPS_ERR; }));
  // The responder did nothing wrong: it stays connected.
  EXPECT_EQ(state_of(b), IBV_QPS_RTS);
}

TEST_F(RcPairTest, RetryExceededWhenNobodyAnswers) {
  ConnOpts o;
  o.retry_cnt = 1;
  o.timeout = 1;  // 8 us
  ASSERT_EQ(to_init(a, o.access), 0);
  ASSERT_EQ(to_rtr(a, unused_qpn(a->qpn()), o), 0);
  ASSERT_EQ(to_rts(a, o), 0);
  ASSERT_EQ(SendWr(51, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_RETRY_EXC_ERR) << status_name(s.status);
  EXPECT_EQ(s.wr_id, 51u);
}

TEST_F(RcPairTest, PostSendBeforeRtsIsEinval) {
  SendWr w(1, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(w.post(a, &bad), EINVAL) << "RESET";
  EXPECT_EQ(bad, &w.wr);
  ASSERT_EQ(to_init(a, kAllAccess), 0);
  bad = nullptr;
  EXPECT_EQ(w.post(a, &bad), EINVAL) << "INIT";
  EXPECT_EQ(bad, &w.wr);
  ASSERT_EQ(to_rtr(a, b->qpn(), {}), 0);
  bad = nullptr;
  EXPECT_EQ(w.post(a, &bad), EINVAL) << "RTR";
  EXPECT_EQ(bad, &w.wr);
  expect_cq_empty(cq_a);
}

TEST_F(RcPairTest, PostRecvInResetIsEinvalButAllowedFromInit) {
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(post_one_recv(b, 1, buf_b.data(), 8, mr_b->ibv.lkey, &bad), EINVAL);
  EXPECT_NE(bad, nullptr);
  ASSERT_EQ(to_init(b, kAllAccess), 0);
  EXPECT_EQ(post_one_recv(b, 2, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  // The receive posted in INIT is used once the QPs are connected.
  ASSERT_EQ(to_init(a, kAllAccess), 0);
  ASSERT_EQ(to_rtr(a, b->qpn(), {}), 0);
  ASSERT_EQ(to_rtr(b, a->qpn(), {}), 0);
  ASSERT_EQ(to_rts(a, {}), 0);
  ASSERT_EQ(SendWr(3, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.wr_id, 2u);
  // b received while still in RTR: the first packet establishes the connection.
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_COMM_EST);
  EXPECT_EQ(ev.element.qp, b->qp());
}

TEST_F(RcPairTest, PostBeyondQueueDepthIsEnomem) {
  // b has max_recv_wr 16 (or more, as written back).
  const uint32_t depth = b->cap.max_recv_wr;
  ASSERT_EQ(to_init(b, kAllAccess), 0);
  for (uint32_t i = 0; i < depth; ++i)
    ASSERT_EQ(post_one_recv(b, i, buf_b.data(), 8, mr_b->ibv.lkey), 0) << i;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(post_one_recv(b, depth, buf_b.data(), 8, mr_b->ibv.lkey, &bad), ENOMEM);
  EXPECT_NE(bad, nullptr);
}

TEST_F(RcPairTest, SendQueueDepthIsEnforced) {
  connect();  // rnr_retry 7: with no receive at b, every send stays queued
  const uint32_t depth = a->cap.max_send_wr;
  for (uint32_t i = 0; i < depth; ++i)
    ASSERT_EQ(SendWr(i, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0) << i;
  SendWr extra(depth, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(extra.post(a, &bad), ENOMEM);
  EXPECT_EQ(bad, &extra.wr);
  // Receives let the queue drain, in order.
  for (uint32_t i = 0; i < depth; ++i)
    ASSERT_EQ(post_one_recv(b, 100 + i, buf_b.data(), 64, mr_b->ibv.lkey), 0);
  std::vector<ibv_wc> s = poll_until(cq_a, depth);
  ASSERT_EQ(s.size(), size_t(depth));
  for (uint32_t i = 0; i < depth; ++i) {
    EXPECT_EQ(s[i].wr_id, uint64_t(i));
    EXPECT_EQ(s[i].status, IBV_WC_SUCCESS) << status_name(s[i].status);
  }
  EXPECT_EQ(poll_until(cq_b, depth).size(), size_t(depth));
}

TEST_F(RcPairTest, ModifyToErrFlushesReceives) {
  connect();
  for (uint64_t id : {61, 62, 63})
    ASSERT_EQ(post_one_recv(b, id, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ASSERT_EQ(to_state(b, IBV_QPS_ERR), 0);
  EXPECT_EQ(state_of(b), IBV_QPS_ERR);
  std::vector<ibv_wc> r = poll_until(cq_b, 3);
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].wr_id, uint64_t(61 + i));
    EXPECT_EQ(r[i].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(r[i].qp_num, b->qpn());
  }
  expect_cq_empty(cq_b);
}

TEST_F(RcPairTest, PostRecvInErrIsFlushed) {
  connect();
  ASSERT_EQ(to_state(b, IBV_QPS_ERR), 0);
  ASSERT_EQ(post_one_recv(b, 71, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.wr_id, 71u);
  EXPECT_EQ(r.status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(RcPairTest, PostSendInErrIsFlushed) {
  connect();
  ASSERT_EQ(to_state(a, IBV_QPS_ERR), 0);
  ASSERT_EQ(SendWr(72, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey, 0).post(a), 0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.wr_id, 72u);
  EXPECT_EQ(s.status, IBV_WC_WR_FLUSH_ERR) << "flushed even though it was unsignaled";
}

TEST_F(RcPairTest, ModifyToErrFlushesAPendingSend) {
  ConnOpts o;
  o.rnr_retry = 7;  // the send waits for a receive for ever
  connect(o, o);
  ASSERT_EQ(SendWr(81, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ASSERT_EQ(SendWr(82, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  expect_cq_empty(cq_a);
  ASSERT_EQ(to_state(a, IBV_QPS_ERR), 0);
  std::vector<ibv_wc> s = poll_until(cq_a, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 81u);
  EXPECT_EQ(s[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(s[1].wr_id, 82u);
  EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(RcPairTest, ResetDiscardsWorkWithoutCompletionsAndAllowsReconnect) {
  connect();
  ASSERT_EQ(post_one_recv(b, 91, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ASSERT_EQ(to_state(b, IBV_QPS_RESET), 0);
  EXPECT_EQ(state_of(b), IBV_QPS_RESET);
  expect_cq_empty(cq_b);
  // Back to RTS, and the old receive is gone: a new one takes the message.
  ASSERT_EQ(to_init(b, kAllAccess), 0);
  ASSERT_EQ(to_rtr(b, a->qpn(), {}), 0);
  ASSERT_EQ(to_rts(b, {}), 0);
  ASSERT_EQ(post_one_recv(b, 92, buf_b.data(), 8, mr_b->ibv.lkey), 0);
  ASSERT_EQ(SendWr(93, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey).post(a), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.wr_id, 92u);
}

TEST_F(RcPairTest, MisalignedAtomicIsInvalidRequest) {
  connect();
  ASSERT_EQ(SendWr(12, IBV_WR_ATOMIC_FETCH_AND_ADD, buf_a.data(), 8, mr_a->ibv.lkey)
                .atomic(buf_b.data() + 4, mr_b->ibv.rkey, 1)
                .post(a),
            0);
  ibv_wc s = one(cq_a);
  EXPECT_EQ(s.status, IBV_WC_REM_INV_REQ_ERR) << status_name(s.status);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_REQ_ERR);
  EXPECT_EQ(ev.element.qp, b->qp());
  EXPECT_TRUE(eventually([&] { return state_of(b) == IBV_QPS_ERR; }));
}

TEST_F(RcPairTest, AtomicWithoutRemoteAtomicAccessOnTheQp) {
  ConnOpts ob;
  ob.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  connect({}, ob);
  uint64_t* target = reinterpret_cast<uint64_t*>(buf_b.data());
  *target = 1;
  ASSERT_EQ(SendWr(13, IBV_WR_ATOMIC_FETCH_AND_ADD, buf_a.data(), 8, mr_a->ibv.lkey)
                .atomic(target, mr_b->ibv.rkey, 1)
                .post(a),
            0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(*target, 1u);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
}

TEST_F(RcPairTest, PostSendValidatesEachWorkRequest) {
  connect();
  ibv_send_wr* bad = nullptr;
  // More SGEs than the QP was created with.
  ibv_sge sges[8];
  for (auto& g : sges) g = {reinterpret_cast<uintptr_t>(buf_a.data()), 1, mr_a->ibv.lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = sges;
  wr.num_sge = static_cast<int>(a->cap.max_send_sge) + 1;
  ASSERT_LE(wr.num_sge, 8);
  EXPECT_EQ(post_send(a, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  // Inline data beyond max_inline_data.
  std::vector<uint8_t> big(a->cap.max_inline_data + 1);
  SendWr inl(2, IBV_WR_SEND, big.data(), static_cast<uint32_t>(big.size()), 0,
             IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  bad = nullptr;
  EXPECT_EQ(inl.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &inl.wr);
  // An opcode RC does not have (TSO is for UD and raw packet QPs).
  SendWr tso(3, IBV_WR_TSO, buf_a.data(), 8, mr_a->ibv.lkey);
  bad = nullptr;
  EXPECT_EQ(tso.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &tso.wr);
  expect_cq_empty(cq_a);
  EXPECT_EQ(state_of(a), IBV_QPS_RTS) << "a refused post changes nothing";
}

TEST_F(RcPairTest, OpcodeOutsideTheEnumIsEinval) {
  // A C application can put any number in ibv_send_wr::opcode; the library must answer
  // EINVAL without undefined behaviour (UBSan checks that in the address build).
  connect();
  ibv_send_wr* bad = nullptr;
  SendWr odd(4, IBV_WR_SEND, buf_a.data(), 8, mr_a->ibv.lkey);
  const int garbage = 0x7f;
  std::memcpy(&odd.wr.opcode, &garbage, sizeof(garbage));
  static_assert(sizeof(odd.wr.opcode) == sizeof(garbage));
  EXPECT_EQ(odd.post(a, &bad), EINVAL);
  EXPECT_EQ(bad, &odd.wr);
  expect_cq_empty(cq_a);
}

TEST_F(RcPairTest, PostStopsAtTheFirstBadWorkRequest) {
  connect();
  ibv_sge r1, r2, r3;
  ibv_recv_wr w1, w2, w3;
  recv_wr(&w1, &r1, 1, buf_b.data(), 8, mr_b->ibv.lkey);
  recv_wr(&w2, &r2, 2, buf_b.data() + 8, 8, mr_b->ibv.lkey);
  recv_wr(&w3, &r3, 3, buf_b.data() + 16, 8, mr_b->ibv.lkey);
  w2.num_sge = static_cast<int>(b->cap.max_recv_sge) + 1;  // invalid
  w1.next = &w2;
  w2.next = &w3;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(post_recv(b, &w1, &bad), EINVAL);
  EXPECT_EQ(bad, &w2);
  // Only w1 was posted: one send completes into it, a second finds no receive (RNR).
  ASSERT_EQ(SendWr(10, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  ibv_wc r = one(cq_b);
  EXPECT_EQ(r.wr_id, 1u);
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  ASSERT_EQ(SendWr(11, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  EXPECT_EQ(one(cq_a).wr_id, 10u);
  expect_cq_empty(cq_b);
  expect_cq_empty(cq_a);
}

TEST_F(RcPairTest, DestroyQpWithARetryPending) {
  ConnOpts o;
  o.rnr_retry = 7;
  connect(o, o);
  ASSERT_EQ(SendWr(1, IBV_WR_SEND, buf_a.data(), 4, mr_a->ibv.lkey).post(a), 0);
  // The send waits for a receive (RNR, retried by the progress thread). Destroying the
  // QP must neither hang nor leave the timer touching freed memory.
  EXPECT_EQ(destroy_qp(a), 0);
  a = nullptr;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let a retry timer fire
}

TEST_F(RcPairTest, SqdHoldsNewWorkUntilRts) {
  connect();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  ASSERT_EQ(modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  EXPECT_EQ(state_of(a), IBV_QPS_SQD);
  ibv_async_event ev = take_async();
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(ev.element.qp, a->qp());

  // Posting in SQD is allowed; the WQE waits.
  std::memcpy(buf_a.data(), "held", 5);
  ASSERT_EQ(SendWr(5, IBV_WR_RDMA_WRITE, buf_a.data(), 5, mr_a->ibv.lkey)
                .rdma(buf_b.data(), mr_b->ibv.rkey)
                .post(a),
            0);
  expect_cq_empty(cq_a);
  EXPECT_EQ(buf_b[0], 0);
  ASSERT_EQ(to_state(a, IBV_QPS_RTS), 0);
  EXPECT_EQ(one(cq_a).status, IBV_WC_SUCCESS);
  EXPECT_STREQ(reinterpret_cast<char*>(buf_b.data()), "held");
}

TEST_F(RcPairTest, SqdWithoutNotifyRaisesNoEvent) {
  connect();
  ASSERT_EQ(to_state(a, IBV_QPS_SQD), 0);
  EXPECT_EQ(state_of(a), IBV_QPS_SQD);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd));
}

// --- modify / query / create ----------------------------------------------------------------

TEST_F(RcPairTest, ModifyRejectsABadTransitionAndKeepsTheState) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(modify_qp(a, &attr, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(state_of(a), IBV_QPS_RESET);
  ASSERT_EQ(to_init(a, kAllAccess), 0);
  // Missing required attributes for INIT -> RTR.
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_AV), EINVAL);
  EXPECT_EQ(state_of(a), IBV_QPS_INIT);
}

TEST_F(RcPairTest, ModifyRejectsBadValues) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 2;  // the device has one port
  attr.qp_access_flags = kAllAccess;
  EXPECT_EQ(modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                    IBV_QP_ACCESS_FLAGS),
            EINVAL);
  EXPECT_EQ(state_of(a), IBV_QPS_RESET);
  ASSERT_EQ(to_init(a, kAllAccess), 0);
  ConnOpts o;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTR;
  r.path_mtu = IBV_MTU_1024;
  r.dest_qp_num = b->qpn();
  r.max_dest_rd_atomic = o.max_dest_rd_atomic;
  r.min_rnr_timer = o.min_rnr_timer;
  r.ah_attr = loopback_av();
  r.ah_attr.is_global = 0;  // RoCE needs a GRH
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(modify_qp(a, &r, rtr_mask), EINVAL);
  r.ah_attr = loopback_av();
  r.dest_qp_num = 1u << 24;  // QPNs have 24 bits
  EXPECT_EQ(modify_qp(a, &r, rtr_mask), EINVAL);
  EXPECT_EQ(state_of(a), IBV_QPS_INIT);
}

TEST_F(RcPairTest, CurStateMustMatch) {
  connect();
  ibv_qp_attr attr{};
  attr.cur_qp_state = IBV_QPS_RTR;  // wrong: a is in RTS
  attr.min_rnr_timer = 3;
  EXPECT_EQ(modify_qp(a, &attr, IBV_QP_CUR_STATE | IBV_QP_MIN_RNR_TIMER), EINVAL);
  attr.cur_qp_state = IBV_QPS_RTS;
  EXPECT_EQ(modify_qp(a, &attr, IBV_QP_CUR_STATE | IBV_QP_MIN_RNR_TIMER), 0);
}

// perftest sets max_rd_atomic to the peer's max_qp_rd_atom, which is 128 on rxe.
TEST_F(RcPairTest, RdAtomicUpToRxesMaximum) {
  EXPECT_EQ(Limits::max_qp_rd_atom, 128);
  ConnOpts too_many;
  too_many.max_dest_rd_atomic = 129;
  ASSERT_EQ(to_init(a, too_many.access), 0);
  EXPECT_EQ(to_rtr(a, b->qpn(), too_many), EINVAL);
  ConnOpts o;
  o.max_rd_atomic = 128;
  o.max_dest_rd_atomic = 128;
  connect(o, o);
  ibv_qp_attr q{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(query_qp(a, &q, ~0, &init), 0);
  EXPECT_EQ(q.max_rd_atomic, 128);
  EXPECT_EQ(q.max_dest_rd_atomic, 128);
}

TEST_F(RcPairTest, QueryQpReturnsWhatWasSet) {
  ConnOpts o;
  o.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  o.rnr_retry = 3;
  o.min_rnr_timer = 12;
  o.retry_cnt = 5;
  o.timeout = 17;
  o.max_rd_atomic = 2;
  o.max_dest_rd_atomic = 3;
  connect(o, {});
  ibv_qp_attr q{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(query_qp(a, &q, ~0, &init), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.qp_access_flags, o.access);
  EXPECT_EQ(q.port_num, 1);
  EXPECT_EQ(q.pkey_index, 0);
  EXPECT_EQ(q.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(q.dest_qp_num, b->qpn());
  EXPECT_EQ(q.rq_psn, 0x123u);
  EXPECT_EQ(q.sq_psn, 0x456u);
  EXPECT_EQ(q.max_dest_rd_atomic, 3);
  EXPECT_EQ(q.max_rd_atomic, 2);
  EXPECT_EQ(q.min_rnr_timer, 12);
  EXPECT_EQ(q.rnr_retry, 3);
  EXPECT_EQ(q.retry_cnt, 5);
  EXPECT_EQ(q.timeout, 17);
  EXPECT_EQ(q.ah_attr.is_global, 1);
  EXPECT_EQ(q.ah_attr.grh.sgid_index, 0);
  EXPECT_EQ(q.ah_attr.port_num, 1);
  EXPECT_EQ(std::memcmp(q.ah_attr.grh.dgid.raw, Device::instance().gids()[0].gid.raw, 16), 0);
  EXPECT_GE(q.cap.max_send_wr, 16u);
  EXPECT_GE(q.cap.max_recv_wr, 16u);
  EXPECT_GE(q.cap.max_send_sge, 4u);
  EXPECT_GE(q.cap.max_recv_sge, 4u);

  EXPECT_EQ(init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(init.send_cq, cq_a->cq());
  EXPECT_EQ(init.recv_cq, cq_a->cq());
  EXPECT_EQ(init.srq, nullptr);
  EXPECT_EQ(init.sq_sig_all, 0);
  EXPECT_EQ(init.cap.max_send_wr, q.cap.max_send_wr);
  EXPECT_EQ(init.cap.max_recv_wr, q.cap.max_recv_wr);

  // Changing an attribute in RTS shows up too.
  ibv_qp_attr m{};
  m.min_rnr_timer = 20;
  ASSERT_EQ(modify_qp(a, &m, IBV_QP_MIN_RNR_TIMER), 0);
  ASSERT_EQ(query_qp(a, &q, IBV_QP_MIN_RNR_TIMER, &init), 0);
  EXPECT_EQ(q.min_rnr_timer, 20);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
}

TEST_F(RcPairTest, CreateQpWritesCapsBack) {
  ibv_qp_init_attr init{};
  init.send_cq = cq_a->cq();
  init.recv_cq = cq_b->cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 10;
  init.cap.max_recv_wr = 20;
  init.cap.max_send_sge = 2;
  init.cap.max_recv_sge = 3;
  init.cap.max_inline_data = 0;
  int marker = 0;
  init.qp_context = &marker;
  ibv_qp* q = create_qp(pd, &init);
  ASSERT_NE(q, nullptr) << "errno " << errno;
  EXPECT_GE(init.cap.max_send_wr, 10u);
  EXPECT_GE(init.cap.max_recv_wr, 20u);
  EXPECT_GE(init.cap.max_send_sge, 2u);
  EXPECT_GE(init.cap.max_recv_sge, 3u);
  EXPECT_EQ(q->qp_type, IBV_QPT_RC);
  EXPECT_EQ(q->state, IBV_QPS_RESET);
  EXPECT_EQ(q->send_cq, cq_a->cq());
  EXPECT_EQ(q->recv_cq, cq_b->cq());
  EXPECT_EQ(q->pd, &pd->ibv);
  EXPECT_EQ(q->context, ctx->ibv());
  EXPECT_EQ(q->qp_context, &marker);
  EXPECT_NE(q->qp_num, 0u);
  EXPECT_LE(q->qp_num, 0xffffffu);
  // What was written back is what query_qp reports.
  ibv_qp_attr attr{};
  ibv_qp_init_attr got{};
  ASSERT_EQ(query_qp(Qp::from(q), &attr, IBV_QP_CAP, &got), 0);
  EXPECT_EQ(attr.cap.max_send_wr, init.cap.max_send_wr);
  EXPECT_EQ(attr.cap.max_recv_wr, init.cap.max_recv_wr);
  EXPECT_EQ(attr.cap.max_send_sge, init.cap.max_send_sge);
  EXPECT_EQ(attr.cap.max_recv_sge, init.cap.max_recv_sge);
  EXPECT_EQ(attr.cap.max_inline_data, init.cap.max_inline_data);
  EXPECT_EQ(got.qp_context, &marker);
  EXPECT_EQ(destroy_qp(Qp::from(q)), 0);
}

TEST_F(RcPairTest, CreateQpRejectsCapsBeyondTheDevice) {
  ibv_qp_init_attr init{};
  init.send_cq = cq_a->cq();
  init.recv_cq = cq_a->cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = Limits::max_qp_wr + 1;
  init.cap.max_recv_wr = 1;
  EXPECT_EQ(create_errno([&] { return create_qp(pd, &init); }), EINVAL);
  init.cap.max_send_wr = 1;
  init.cap.max_send_sge = Limits::max_sge + 1;
  EXPECT_EQ(create_errno([&] { return create_qp(pd, &init); }), EINVAL);
  init.cap.max_send_sge = 1;
  init.cap.max_inline_data = Limits::max_inline + 1;
  EXPECT_EQ(create_errno([&] { return create_qp(pd, &init); }), EINVAL);
}

TEST_F(RcPairTest, QpKeepsItsPdAndCqsBusy) {
  EXPECT_EQ(dealloc_pd(pd), EBUSY);
  EXPECT_EQ(destroy_cq(cq_a), EBUSY);
  ASSERT_EQ(destroy_qp(a), 0);
  a = nullptr;
  EXPECT_EQ(destroy_cq(cq_a), 0);
  cq_a = nullptr;
}

TEST_F(RcPairTest, DestroyQpWaitsForDeliveredAsyncEventsToBeAcked) {
  connect();
  ASSERT_EQ(SendWr(4, IBV_WR_RDMA_WRITE, buf_a.data(), 8, mr_a->ibv.lkey)
                .rdma(buf_b.data(), unused_key(mr_b->ibv.rkey))
                .post(a),
            0);
  ASSERT_EQ(one(cq_a).status, IBV_WC_REM_ACCESS_ERR);
  ibv_async_event ev{};
  ASSERT_TRUE(next_async(&ev));
  ASSERT_EQ(ev.element.qp, b->qp());

  Qp* victim = std::exchange(b, nullptr);
  expect_destroy_waits_for_ack([&] { EXPECT_EQ(destroy_qp(victim), 0); },
                               [&] { ack_async_event(&ev); });
}

}  // namespace
}  // namespace softverbs::unit
