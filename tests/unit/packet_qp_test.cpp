// engine/packet: two PacketQps back to back through a fake link with a virtual clock.
// Every operation at the sizes around the MTU, PSN wrap, SE/IMM, RNR, retry exhaustion,
// remote errors, the responder's PSN rules driven packet by packet, UC and UD, and a
// randomized run over a lossy, reordering, duplicating link.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>

#include "packet_link.hpp"
#include "wire/roce/grh.hpp"

namespace softverbs::unit {
namespace {

pk::SendWqe wqe(uint64_t wr_id, ibv_wr_opcode op, std::vector<pk::Iov> sg,
                unsigned flags = IBV_SEND_SIGNALED) {
  pk::SendWqe w;
  w.wr_id = wr_id;
  w.opcode = op;
  w.send_flags = flags;
  w.sg = std::move(sg);
  return w;
}

int count_opcode(const Node& n, uint8_t op) {
  int c = 0;
  for (const WirePacket& w : n.sent) c += (w.pkt.opcode & 0x1f) == op;
  return c;
}

uint32_t sizes_around(uint32_t mtu, int i) {
  const uint32_t s[] = {0, 1, mtu - 1, mtu, mtu + 1, 5 * mtu + 3};
  return s[i];
}

// --- every operation at every size ---------------------------------------------------

class SizesTest : public ::testing::TestWithParam<uint32_t> {};  // param: start PSN

TEST_P(SizesTest, SendAndWriteWithAndWithoutImm) {
  Connection c;
  c.psn_a = GetParam();
  c.psn_b = GetParam() ^ 0x5;
  Pair p(pk::QpType::kRc, c);
  const uint32_t mtu = 1024;
  uint64_t id = 1;
  for (int i = 0; i < 6; ++i) {
    uint32_t len = sizes_around(mtu, i);
    for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                             IBV_WR_RDMA_WRITE_WITH_IMM}) {
      SCOPED_TRACE(testing::Message() << "len " << len << " op " << op);
      fill_pattern(p.a.mem.data(), len, static_cast<uint32_t>(id));
      std::fill(p.b.mem.begin(), p.b.mem.begin() + 3 * 8192, 0xee);
      p.b.post_recv(900 + id, 8192, 8192);
      pk::SendWqe w = wqe(id, op, {p.a.iov(0, len)});
      w.imm = htonl(0xabc000 + static_cast<uint32_t>(id));
      w.remote_addr = p.b.va(100);
      w.rkey = p.b.rkey;
      size_t scq = p.a.scq.size(), rcq = p.b.rcq.size();
      ASSERT_EQ(p.a.qp.post_send(std::move(w)), 0);
      ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() > scq; }));
      const pk::Completion& s = p.a.scq.back();
      EXPECT_EQ(s.wr_id, id);
      EXPECT_EQ(s.status, IBV_WC_SUCCESS);
      EXPECT_EQ(s.byte_len, len);
      bool is_send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
      bool imm = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
      EXPECT_EQ(s.opcode, is_send ? IBV_WC_SEND : IBV_WC_RDMA_WRITE);
      uint8_t* dst = p.b.mem.data() + (is_send ? 8192 : 100);
      EXPECT_EQ(std::memcmp(dst, p.a.mem.data(), len), 0);
      EXPECT_EQ(dst[len], 0xee);  // nothing past the message
      p.link.run([] { return false; });
      if (is_send || imm) {
        ASSERT_EQ(p.b.rcq.size(), rcq + 1);
        const pk::Completion& r = p.b.rcq.back();
        EXPECT_EQ(r.wr_id, 900 + id);
        EXPECT_EQ(r.status, IBV_WC_SUCCESS);
        EXPECT_EQ(r.byte_len, len);
        EXPECT_EQ(r.opcode, is_send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM);
        EXPECT_EQ(r.qp_num, p.b.qp.qp_num());
        EXPECT_EQ(!!(r.wc_flags & IBV_WC_WITH_IMM), imm);
        if (imm) {
          EXPECT_EQ(r.imm_data, htonl(0xabc000 + static_cast<uint32_t>(id)));
        }
      } else {
        EXPECT_EQ(p.b.rcq.size(), rcq);  // a plain WRITE consumes no receive
        p.b.rq.clear();
      }
      ++id;
    }
  }
  EXPECT_EQ(p.a.qp.send_queue_depth(), 0u);
}

TEST_P(SizesTest, Read) {
  Connection c;
  c.psn_a = GetParam();
  Pair p(pk::QpType::kRc, c);
  for (int i = 0; i < 6; ++i) {
    uint32_t len = sizes_around(1024, i);
    SCOPED_TRACE(len);
    fill_pattern(p.b.mem.data() + 64, len, i + 3);
    std::fill(p.a.mem.begin(), p.a.mem.begin() + 16384, 0xee);
    // A scatter list of two pieces, split inside the second packet.
    uint32_t split = std::min<uint32_t>(len, 1500);
    pk::SendWqe w = wqe(i, IBV_WR_RDMA_READ, {p.a.iov(0, split), p.a.iov(8192, len - split)});
    w.remote_addr = p.b.va(64);
    w.rkey = p.b.rkey;
    ASSERT_EQ(p.a.qp.post_send(std::move(w)), 0);
    ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == size_t(i + 1); }));
    EXPECT_EQ(p.a.scq.back().status, IBV_WC_SUCCESS);
    EXPECT_EQ(p.a.scq.back().opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(p.a.scq.back().byte_len, len);
    EXPECT_EQ(std::memcmp(p.a.mem.data(), p.b.mem.data() + 64, split), 0);
    EXPECT_EQ(std::memcmp(p.a.mem.data() + 8192, p.b.mem.data() + 64 + split, len - split), 0);
    EXPECT_EQ(p.a.mem[split], 0xee);
  }
}

// 0xfffffd: every multi-packet message crosses the 24-bit wrap.
INSTANTIATE_TEST_SUITE_P(StartPsn, SizesTest, ::testing::Values(100u, 0xfffffdu));

// XRC: an INI QP sends on transport 0xA0 with its WQE's SRQ number in every request packet
// (XRCETH); the TGT QP asks for that SRQ before anything else, answers on 0xA0, and a
// number that is not of its domain is an invalid request (NAK, TGT QP to ERR).
TEST(PacketQp, XrcIniToTgt) {
  Pair p(pk::QpType::kRc);
  p.a.qp.set_xrc(pk::XrcRole::kIni);
  p.b.qp.set_xrc(pk::XrcRole::kTgt);
  p.b.xrc_srqs = {0x4242};
  const uint32_t len = 3000;  // three packets at MTU 1024
  fill_pattern(p.a.mem.data(), len, 7);
  p.b.post_recv(50, 8192, 8192);
  pk::SendWqe w = wqe(1, IBV_WR_SEND, {p.a.iov(0, len)});
  w.xrc_srqn = 0x4242;
  ASSERT_EQ(p.a.qp.post_send(std::move(w)), 0);
  ASSERT_TRUE(p.link.run([&] { return !p.a.scq.empty() && !p.b.rcq.empty(); }));
  EXPECT_EQ(p.a.scq.back().status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.b.rcq.back().status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.b.rcq.back().byte_len, len);
  EXPECT_EQ(std::memcmp(p.b.mem.data() + 8192, p.a.mem.data(), len), 0);
  for (const WirePacket& s : p.a.sent) {
    EXPECT_EQ(s.pkt.opcode & 0xe0, rw::kXrc);
    EXPECT_EQ(s.pkt.xrc_srqn, 0x4242u);
  }
  for (const WirePacket& s : p.b.sent) EXPECT_EQ(s.pkt.opcode, rw::kXrc | rw::kAck);
  EXPECT_EQ(p.b.xrc_selected, std::vector<uint32_t>(3, 0x4242));

  // An SRQ of another domain.
  pk::SendWqe bad = wqe(2, IBV_WR_SEND, {p.a.iov(0, 8)});
  bad.xrc_srqn = 0x999;
  p.b.post_recv(51, 8192, 8192);
  ASSERT_EQ(p.a.qp.post_send(std::move(bad)), 0);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 2; }));
  EXPECT_EQ(p.a.scq.back().status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_ERR);
  EXPECT_NE(std::find(p.b.events.begin(), p.b.events.end(), IBV_EVENT_QP_REQ_ERR), p.b.events.end());
}

// XRC, an SRQ of another process: the TGT QP stages a multi-packet SEND and hands it over
// whole at its last packet, which it acknowledges only after the answer; an RNR answer
// leaves the message staged for the retried last packet, no answer gets no ACK (the
// requester's retry brings it again), and nothing is handed over twice.
TEST(PacketQp, XrcSrqElsewhere) {
  Pair p(pk::QpType::kRc);
  p.a.qp.set_xrc(pk::XrcRole::kIni);
  p.b.qp.set_xrc(pk::XrcRole::kTgt);
  p.b.xrc_elsewhere = {0x7001};
  const uint32_t len = 3000;  // three packets at MTU 1024
  fill_pattern(p.a.mem.data(), len, 9);
  p.b.away_answers = {pk::XrcVerdict{pk::XrcVerdict::kRnr, 1, {}},
                      pk::XrcVerdict{pk::XrcVerdict::kNone, 0, {}},
                      pk::XrcVerdict{pk::XrcVerdict::kAck, 0, {}}};
  pk::SendWqe w = wqe(1, IBV_WR_SEND, {p.a.iov(0, len)});
  w.xrc_srqn = 0x7001;
  ASSERT_EQ(p.a.qp.post_send(std::move(w)), 0);
  ASSERT_TRUE(p.link.run([&] { return !p.a.scq.empty(); }));
  EXPECT_EQ(p.a.scq.back().status, IBV_WC_SUCCESS);
  ASSERT_EQ(p.b.away_calls.size(), 3u);  // RNR, unanswered, done: the same whole message
  for (const Node::AwayCall& c : p.b.away_calls) {
    EXPECT_EQ(c.opcode, IBV_WR_SEND);
    EXPECT_EQ(c.srqn, 0x7001u);
    ASSERT_EQ(c.payload.size(), len);
    EXPECT_EQ(std::memcmp(c.payload.data(), p.a.mem.data(), len), 0);
  }
  EXPECT_TRUE(p.b.rcq.empty());  // the receive completes in the SRQ's process
  EXPECT_EQ(count_opcode(p.b, rw::kAck), static_cast<int>(p.b.sent.size()));

  // READ and an atomic run there once; a WRITE goes whole; a NAK there fails the QP.
  pk::SendWqe r = wqe(2, IBV_WR_RDMA_READ, {p.a.iov(4096, 2500)});
  r.xrc_srqn = 0x7001;
  r.remote_addr = 0x1000;
  r.rkey = 77;
  ASSERT_EQ(p.a.qp.post_send(std::move(r)), 0);
  pk::SendWqe fa = wqe(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {p.a.iov(8192, 8)});
  fa.xrc_srqn = 0x7001;
  fa.remote_addr = 0x2000;
  ASSERT_EQ(p.a.qp.post_send(std::move(fa)), 0);
  pk::SendWqe wr = wqe(4, IBV_WR_RDMA_WRITE, {p.a.iov(0, len)});
  wr.xrc_srqn = 0x7001;
  wr.remote_addr = 0x3000;
  ASSERT_EQ(p.a.qp.post_send(std::move(wr)), 0);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 4; }));
  for (const pk::Completion& c : p.a.scq) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.a.mem[4096], 0x5a);
  EXPECT_EQ(p.a.mem[4096 + 2499], 0x5a);
  EXPECT_EQ(p.a.mem[8192], 0x5a);  // the atomic's original value, as answered there
  ASSERT_EQ(p.b.away_calls.size(), 6u);
  EXPECT_EQ(p.b.away_calls[3].opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(p.b.away_calls[4].opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(p.b.away_calls[5].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(p.b.away_calls[5].payload.size(), len);

  p.b.away_answers = {pk::XrcVerdict{pk::XrcVerdict::kNak, rw::kNakRemoteAccessError,
                                     IBV_EVENT_QP_ACCESS_ERR}};
  pk::SendWqe bad = wqe(5, IBV_WR_SEND, {p.a.iov(0, 8)});
  bad.xrc_srqn = 0x7001;
  ASSERT_EQ(p.a.qp.post_send(std::move(bad)), 0);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 5; }));
  EXPECT_EQ(p.a.scq.back().status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_ERR);
  EXPECT_NE(std::find(p.b.events.begin(), p.b.events.end(), IBV_EVENT_QP_ACCESS_ERR),
            p.b.events.end());
}

// The same over a lossy, duplicating link: every message is handed over exactly once.
TEST(PacketQp, XrcSrqElsewhereLossyLink) {
  Pair p(pk::QpType::kRc);
  p.a.qp.set_xrc(pk::XrcRole::kIni);
  p.b.qp.set_xrc(pk::XrcRole::kTgt);
  p.b.xrc_elsewhere = {0x7001};
  p.link.drop_rate = 0.1;
  p.link.dup_rate = 0.1;
  p.link.reorder_rate = 0.1;
  const int n = 20;
  for (int i = 0; i < n; ++i) {
    p.a.mem[i * 2048] = static_cast<uint8_t>(i);
    pk::SendWqe w = wqe(i, IBV_WR_SEND, {p.a.iov(i * 2048, 1500 + i)});
    w.xrc_srqn = 0x7001;
    ASSERT_EQ(p.a.qp.post_send(std::move(w)), 0);
  }
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == n; }));
  ASSERT_EQ(p.b.away_calls.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(p.a.scq[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(p.b.away_calls[i].payload.size(), 1500u + i);
    EXPECT_EQ(p.b.away_calls[i].payload[0], static_cast<uint8_t>(i));
  }
}

TEST(PacketQp, Atomics) {
  Pair p;
  uint64_t v = 40;
  std::memcpy(p.b.mem.data() + 64, &v, 8);
  auto atomic = [&](uint64_t id, ibv_wr_opcode op, uint64_t cmp_add, uint64_t swap) {
    pk::SendWqe w = wqe(id, op, {p.a.iov(8 * id, 8)});
    w.remote_addr = p.b.va(64);
    w.rkey = p.b.rkey;
    w.compare_add = cmp_add;
    w.swap = swap;
    EXPECT_EQ(p.a.qp.post_send(std::move(w)), 0);
  };
  atomic(1, IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0);    // 40 -> 42
  atomic(2, IBV_WR_ATOMIC_CMP_AND_SWP, 42, 1000);  // 42 -> 1000
  atomic(3, IBV_WR_ATOMIC_CMP_AND_SWP, 5, 7);      // no swap
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 3; }));
  uint64_t orig[3];
  std::memcpy(orig, p.a.mem.data() + 8, 24);
  EXPECT_EQ(orig[0], 40u);
  EXPECT_EQ(orig[1], 42u);
  EXPECT_EQ(orig[2], 1000u);
  std::memcpy(&v, p.b.mem.data() + 64, 8);
  EXPECT_EQ(v, 1000u);
  EXPECT_EQ(p.a.scq[0].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(p.a.scq[1].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(p.a.scq[0].byte_len, 8u);
  EXPECT_EQ(p.b.atomic_executions, 3);
}

TEST(PacketQp, SolicitedAndImmediateReachTheReceiveCompletion) {
  Pair p;
  for (int i = 0; i < 4; ++i) p.b.post_recv(i, 4096 * i, 4096);
  pk::SendWqe w = wqe(1, IBV_WR_SEND_WITH_IMM, {p.a.iov(0, 3000)},
                      IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  w.imm = htonl(0xdeadbeef);
  p.a.qp.post_send(w);
  p.a.qp.post_send(wqe(2, IBV_WR_SEND, {p.a.iov(0, 10)}));
  w = wqe(3, IBV_WR_RDMA_WRITE_WITH_IMM, {p.a.iov(0, 10)}, IBV_SEND_SOLICITED);
  w.remote_addr = p.b.va(50000);
  w.rkey = p.b.rkey;
  w.imm = htonl(7);
  p.a.qp.post_send(w);
  ASSERT_TRUE(p.link.run([&] { return p.b.rcq.size() == 3; }));
  EXPECT_TRUE(p.b.rcq[0].solicited);
  EXPECT_EQ(p.b.rcq[0].imm_data, htonl(0xdeadbeef));
  EXPECT_EQ(p.b.rcq[0].wc_flags, unsigned(IBV_WC_WITH_IMM));
  EXPECT_FALSE(p.b.rcq[1].solicited);
  EXPECT_EQ(p.b.rcq[1].wc_flags, 0u);
  EXPECT_TRUE(p.b.rcq[2].solicited);
  EXPECT_EQ(p.b.rcq[2].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(p.b.rcq[2].imm_data, htonl(7));
  EXPECT_EQ(p.b.rcq[2].byte_len, 10u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.b.rcq[i].src_qp, p.a.qp.qp_num());  // RC: the peer
  // Only the last packet of the first SEND carries SE.
  int se = 0;
  for (const WirePacket& wp : p.a.sent) se += wp.pkt.solicited;
  EXPECT_EQ(se, 2);
  p.link.run([] { return false; });
  EXPECT_EQ(p.a.scq.size(), 2u);  // WQE 3 was unsignaled
}

TEST(PacketQp, UnsignaledRetireSilentlyAndCompletionsStayInOrder) {
  Pair p;
  for (int i = 0; i < 10; ++i) p.b.post_recv(i, 1000 * i, 1000);
  for (int i = 0; i < 10; ++i)
    p.a.qp.post_send(wqe(i, IBV_WR_SEND, {p.a.iov(0, 100)}, i % 3 ? 0 : IBV_SEND_SIGNALED));
  ASSERT_TRUE(p.link.run([&] { return p.a.qp.send_queue_depth() == 0; }));
  ASSERT_EQ(p.a.scq.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.a.scq[i].wr_id, uint64_t(3 * i));
}

TEST(PacketQp, AckReqOnLastPacketAndPeriodically) {
  Pair p;
  p.b.post_recv(1, 0, 1 << 20);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 200 * 1024)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  int packets = 0, ack_req = 0;
  for (const WirePacket& wp : p.a.sent) {
    ++packets;
    ack_req += wp.pkt.ack_req;
  }
  EXPECT_EQ(packets, 200);
  EXPECT_EQ(ack_req, 4);  // packets 64, 128, 192 and the last
  EXPECT_TRUE(p.a.sent.back().pkt.ack_req);
  // ACKs answer AckReq only: far fewer ACKs than packets.
  EXPECT_EQ(count_opcode(p.b, rw::kAck), 4);
}

// Without ACKs the requester stops at its window: kMaxUnackedPsns PSNs by default, what
// set_max_unacked_psns allows (the engine's wider one where receive buffers are large).
TEST(PacketQp, TheWindowCapsPacketsInFlightWithoutAnAck) {
  for (uint32_t window : {pk::kMaxUnackedPsns, pk::kMaxUnackedPsnsLarge}) {
    Pair p;
    if (window != pk::kMaxUnackedPsns) p.a.qp.set_max_unacked_psns(window);
    p.b.post_recv(1, 0, 1 << 20);
    p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 400 * 1024)}));
    EXPECT_EQ(p.a.sent.size(), window);
    ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
    EXPECT_EQ(p.a.sent.size(), 400u);
  }
}

// --- RNR -----------------------------------------------------------------------------

TEST(PacketQp, RnrNakWaitsAndRetriesUntilAReceiveIsPosted) {
  Connection c;
  c.min_rnr_timer = 14;  // 1.28 ms
  Pair p(pk::QpType::kRc, c);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 3000)}));
  p.link.run_for(10'000'000);  // 10 ms
  int rnr = 0;
  for (const WirePacket& wp : p.b.sent) rnr += (wp.pkt.syndrome & 0xe0) == rw::kAethRnrNak;
  // One attempt at t=0 and one after every 1.28 ms wait: 8 by 10 ms.
  EXPECT_EQ(rnr, 8);
  EXPECT_EQ(p.b.sent.front().pkt.syndrome, rw::kAethRnrNak | 14);
  EXPECT_TRUE(p.a.scq.empty());
  p.b.post_recv(5, 0, 4096);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(p.b.rcq.size(), 1u);
  EXPECT_EQ(p.b.rcq[0].byte_len, 3000u);
  EXPECT_EQ(std::memcmp(p.b.mem.data(), p.a.mem.data(), 3000), 0);
}

TEST(PacketQp, RnrRetryExhaustion) {
  Connection c;
  c.rnr_retry = 2;
  Pair p(pk::QpType::kRc, c);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND_WITH_IMM, {p.a.iov(0, 10)}));
  p.a.qp.post_send(wqe(2, IBV_WR_SEND, {p.a.iov(0, 10)}, 0));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 2; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(p.a.scq[1].status, IBV_WC_WR_FLUSH_ERR);  // unsignaled, but an error
  EXPECT_EQ(p.a.qp.state(), IBV_QPS_ERR);
  EXPECT_EQ(count_opcode(p.a, rw::kSendOnlyImm), 3);  // first try + rnr_retry
}

TEST(PacketQp, RnrOnWriteWithImmediateResumesAtTheLastPacket) {
  Pair p;
  pk::SendWqe w = wqe(1, IBV_WR_RDMA_WRITE_WITH_IMM, {p.a.iov(0, 2500)});
  w.remote_addr = p.b.va(0);
  w.rkey = p.b.rkey;
  fill_pattern(p.a.mem.data(), 2500, 9);
  p.a.qp.post_send(w);
  p.link.run_for(100'000);
  EXPECT_TRUE(p.a.scq.empty());
  p.b.post_recv(3, 500000, 16);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(p.b.mem.data(), p.a.mem.data(), 2500), 0);
  ASSERT_EQ(p.b.rcq.size(), 1u);
  EXPECT_EQ(p.b.rcq[0].byte_len, 2500u);
  EXPECT_EQ(count_opcode(p.a, rw::kWriteFirst), 1);  // only the LAST was retried
}

// --- retransmission ------------------------------------------------------------------

TEST(PacketQp, RetryExhaustionAfterRetryCntPlusOneSends) {
  for (uint8_t retry_cnt : {0, 3, 7}) {
    Connection c;
    c.retry_cnt = retry_cnt;
    c.timeout = 12;  // 16.777 ms
    Pair p(pk::QpType::kRc, c);
    p.link.drop_rate = 1.0;
    p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 100)}));
    p.a.qp.post_send(wqe(2, IBV_WR_RDMA_READ, {p.a.iov(0, 100)}));
    ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 2; }));
    EXPECT_EQ(p.a.scq[0].status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(p.a.scq[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(count_opcode(p.a, rw::kSendOnly), retry_cnt + 1);
    EXPECT_EQ(p.link.now, uint64_t(retry_cnt + 1) * pk::ack_timeout_ns(12));
    EXPECT_EQ(p.a.qp.state(), IBV_QPS_ERR);
  }
}

TEST(PacketQp, TimeoutZeroNeverRetransmits) {
  Connection c;
  c.timeout = 0;
  Pair p(pk::QpType::kRc, c);
  p.link.drop_rate = 1.0;
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 100)}));
  EXPECT_FALSE(p.a.timer_on);
  p.link.run_for(3'600'000'000'000ull);  // an hour
  EXPECT_EQ(p.a.sent.size(), 1u);
  EXPECT_TRUE(p.a.scq.empty());
}

// The peer's QP is still in INIT when the first request comes (it drops it, as a QP
// before RTR does) and nothing else happens: only the local ACK timeout resends it.
void first_send_to_a_peer_in_init(Node& a, Node& b, Link& link, const Connection& c) {
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  ASSERT_EQ(b.qp.modify(init, IBV_QP_STATE), 0);
  b.post_recv(7, 0, 100);
  const uint64_t start = link.now;
  ASSERT_EQ(a.qp.post_send(wqe(1, IBV_WR_SEND, {a.iov(0, 100)})), 0);
  ASSERT_TRUE(a.timer_on) << "the only outstanding packet has no timer";
  EXPECT_EQ(a.timer_at, start + pk::ack_timeout_ns(c.timeout));
  link.run_for(pk::ack_timeout_ns(c.timeout) / 2);  // delivered and dropped: silence
  EXPECT_EQ(count_opcode(a, rw::kSendOnly), 1);
  EXPECT_TRUE(b.sent.empty());
  link.run_for(pk::ack_timeout_ns(c.timeout));  // the timeout: sent again, dropped again
  EXPECT_EQ(count_opcode(a, rw::kSendOnly), 2);
  bring_up(b, a, c.psn_b, c.psn_a, c);  // the peer is ready now: the next resend lands
  ASSERT_TRUE(link.run([&] { return a.scq.size() == 1; }));
  EXPECT_EQ(a.scq[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(count_opcode(a, rw::kSendOnly), 3);
  ASSERT_EQ(b.rcq.size(), 1u);
  EXPECT_EQ(b.rcq[0].wr_id, 7u);
}

TEST(PacketQp, AFirstSendDroppedByAPeerInInitIsResentOnTimeout) {
  Connection c;
  Link link;
  Node a(link, 0, pk::QpType::kRc, 0x11, 1 << 16), b(link, 1, pk::QpType::kRc, 0x22, 1 << 16);
  link.nodes = {&a, &b};
  bring_up(a, b, c.psn_a, c.psn_b, c);
  first_send_to_a_peer_in_init(a, b, link, c);
}

// The same after the requester's QP (same QPN) had a life that ended in ERR with a
// retransmission pending, then went through RESET: nothing of the old timer is left over.
TEST(PacketQp, AFirstSendIsResentOnTimeoutAfterTheQpFailedAndWasReset) {
  Connection c;
  Link link;
  Node a(link, 0, pk::QpType::kRc, 0x11, 1 << 16), b(link, 1, pk::QpType::kRc, 0x22, 1 << 16);
  link.nodes = {&a, &b};
  bring_up(a, b, c.psn_a, c.psn_b, c);
  link.deliver = false;  // the old peer is gone: the old life retries, then fails
  ASSERT_EQ(a.qp.post_send(wqe(9, IBV_WR_SEND, {a.iov(0, 100)})), 0);
  ASSERT_TRUE(link.run([&] { return a.scq.size() == 1; }));
  EXPECT_EQ(a.scq[0].status, IBV_WC_RETRY_EXC_ERR);
  ASSERT_EQ(a.qp.state(), IBV_QPS_ERR);
  ASSERT_EQ(a.qp.post_send(wqe(10, IBV_WR_SEND, {a.iov(0, 100)})), 0);  // flushed at once
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(a.qp.modify(reset, IBV_QP_STATE), 0);
  EXPECT_FALSE(a.timer_on);
  a.scq.clear();
  a.sent.clear();
  link.deliver = true;
  link.run_for(pk::ack_timeout_ns(c.timeout) * 4);
  c.psn_a = 7000;
  bring_up(a, b, c.psn_a, c.psn_b, c);
  first_send_to_a_peer_in_init(a, b, link, c);
}

// With nobody ever answering, the dropped first request is sent 1 + retry_cnt times, a
// timeout apart, then fails with RETRY_EXC_ERR.
TEST(PacketQp, AFirstSendToAPeerThatStaysInInitEndsInRetryExceeded) {
  Connection c;
  c.retry_cnt = 3;
  Link link;
  Node a(link, 0, pk::QpType::kRc, 0x11, 1 << 16), b(link, 1, pk::QpType::kRc, 0x22, 1 << 16);
  link.nodes = {&a, &b};
  bring_up(a, b, c.psn_a, c.psn_b, c);
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  ASSERT_EQ(b.qp.modify(init, IBV_QP_STATE), 0);
  ASSERT_EQ(a.qp.post_send(wqe(1, IBV_WR_SEND, {a.iov(0, 100)})), 0);
  ASSERT_TRUE(link.run([&] { return a.scq.size() == 1; }));
  EXPECT_EQ(a.scq[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(count_opcode(a, rw::kSendOnly), 1 + c.retry_cnt);
  EXPECT_EQ(link.now, uint64_t(1 + c.retry_cnt) * pk::ack_timeout_ns(c.timeout));
  EXPECT_EQ(a.qp.state(), IBV_QPS_ERR);
  EXPECT_TRUE(b.sent.empty());
}

TEST(PacketQp, LostAckIsRecoveredByTheTimerAndTheDuplicateIsReAcked) {
  Pair p;
  p.b.post_recv(1, 0, 8192);
  int acks = 0;
  p.link.drop_if = [&](const WirePacket& wp) {
    return wp.from == 1 && (wp.pkt.opcode & 0x1f) == rw::kAck && acks++ == 0;
  };
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 5000)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.b.rcq.size(), 1u);  // delivered once
  EXPECT_EQ(count_opcode(p.a, rw::kSendFirst), 2);
  EXPECT_EQ(p.link.now, pk::ack_timeout_ns(10) + 2 * p.link.latency_ns);
}

TEST(PacketQp, LostPacketTriggersOneSequenceNakAndGoBackN) {
  Pair p;
  p.b.post_recv(1, 0, 1 << 16);
  bool dropped = false;
  p.link.drop_if = [&](const WirePacket& wp) {
    if (wp.from != 0 || dropped || (wp.pkt.opcode & 0x1f) != rw::kSendMiddle) return false;
    return dropped = true;
  };
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 20 * 1024)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  int naks = 0;
  for (const WirePacket& wp : p.b.sent)
    naks += wp.pkt.syndrome == (pk::aeth_syndrome(rw::kAethNak, rw::kNakPsnSequenceError));
  EXPECT_EQ(naks, 1);
  EXPECT_LT(p.link.now, pk::ack_timeout_ns(10));  // no timeout needed
  EXPECT_EQ(std::memcmp(p.b.mem.data(), p.a.mem.data(), 20 * 1024), 0);
}

TEST(PacketQp, MaxRdAtomicLimitsOutstandingReads) {
  Connection c;
  c.rd_atomic = 2;
  Pair p(pk::QpType::kRc, c);
  p.link.drop_if = [](const WirePacket& wp) { return wp.from == 1; };  // no responses
  for (int i = 0; i < 5; ++i) {
    pk::SendWqe w = wqe(i, IBV_WR_RDMA_READ, {p.a.iov(0, 10)});
    w.remote_addr = p.b.va(0);
    w.rkey = p.b.rkey;
    p.a.qp.post_send(w);
  }
  p.link.run_for(1'000'000);
  EXPECT_EQ(count_opcode(p.a, rw::kReadRequest), 2);
  p.link.drop_if = nullptr;
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 5; }));
  for (const pk::Completion& wc : p.a.scq) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST(PacketQp, SqdFinishesWhatStartedAndReportsDrained) {
  Pair p;
  p.b.post_recv(1, 0, 1 << 16);
  p.b.post_recv(2, 0, 1 << 16);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 4000)}));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_SQD;
  ASSERT_EQ(p.a.qp.modify(a, IBV_QP_STATE), 0);
  p.a.qp.post_send(wqe(2, IBV_WR_SEND, {p.a.iov(0, 10)}));  // waits for RTS
  EXPECT_TRUE(p.a.events.empty());
  p.link.run([] { return false; });
  ASSERT_EQ(p.a.scq.size(), 1u);
  EXPECT_EQ(p.a.events, std::vector<ibv_event_type>{IBV_EVENT_SQ_DRAINED});
  EXPECT_EQ(count_opcode(p.a, rw::kSendOnly), 0);
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(p.a.qp.modify(a, IBV_QP_STATE), 0);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 2; }));
}

// --- remote errors -------------------------------------------------------------------

// IBA 1.5: ATOMIC WRITE stores 8 bytes, FLUSH names a range or the whole MR; each is one
// PSN answered by an empty READ RESPONSE ONLY (as rxe answers them).
TEST(PacketQp, AtomicWriteAndFlush) {
  Pair p;
  p.b.mr_access |= kAccessFlushGlobal;
  pk::SendWqe w = wqe(1, IBV_WR_ATOMIC_WRITE, {});
  w.remote_addr = p.b.va(64);
  w.rkey = p.b.rkey;
  w.compare_add = 0x0102030405060708ull;
  EXPECT_EQ(p.a.qp.post_send(w), 0);
  pk::SendWqe f = wqe(2, kWrFlush, {});
  f.remote_addr = p.b.va(0);
  f.rkey = p.b.rkey;
  f.flush_length = 4096;
  f.flush_type = kFlushGlobal;
  f.flush_level = kFlushRange;
  EXPECT_EQ(p.a.qp.post_send(f), 0);
  f.wr_id = 3;
  f.flush_level = kFlushMr;
  EXPECT_EQ(p.a.qp.post_send(f), 0);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 3; }));
  uint64_t v;
  std::memcpy(&v, p.b.mem.data() + 64, 8);
  EXPECT_EQ(v, 0x0102030405060708ull);
  EXPECT_EQ(p.a.scq[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(p.a.scq[0].byte_len, 8u);
  EXPECT_EQ(p.a.scq[1].opcode, kWcFlush);
  EXPECT_EQ(p.a.scq[1].byte_len, 4096u);
  EXPECT_EQ(p.a.scq[2].status, IBV_WC_SUCCESS);
  EXPECT_EQ(p.b.flushes, 2);
  EXPECT_EQ(count_opcode(p.a, rw::kAtomicWrite), 1);
  EXPECT_EQ(count_opcode(p.a, rw::kFlush), 2);
  EXPECT_EQ(count_opcode(p.b, rw::kReadResponseOnly), 3);
  // Not on UC.
  Pair uc(pk::QpType::kUc);
  EXPECT_EQ(uc.a.qp.post_send(w), EINVAL);
}

TEST(PacketQp, FlushWithoutTheFlushAccessIsARemoteAccessError) {
  Pair p;  // the MR has no flush access
  pk::SendWqe f = wqe(1, kWrFlush, {});
  f.remote_addr = p.b.va(0);
  f.rkey = p.b.rkey;
  f.flush_length = 64;
  f.flush_type = kFlushPersistent;
  p.a.qp.post_send(f);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_REM_ACCESS_ERR);
  ASSERT_EQ(p.b.events.size(), 1u);
  EXPECT_EQ(p.b.events[0], IBV_EVENT_QP_ACCESS_ERR);
}

TEST(PacketQp, AtomicWriteWithoutRemoteWriteIsARemoteAccessError) {
  Pair p;
  p.b.mr_access = IBV_ACCESS_REMOTE_READ;
  pk::SendWqe w = wqe(1, IBV_WR_ATOMIC_WRITE, {});
  w.remote_addr = p.b.va(64);
  w.rkey = p.b.rkey;
  p.a.qp.post_send(w);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_REM_ACCESS_ERR);
}

TEST(PacketQp, RemoteAccessErrorFailsBothSides) {
  Pair p;
  p.b.post_recv(7, 0, 100);
  pk::SendWqe w = wqe(1, IBV_WR_RDMA_WRITE, {p.a.iov(0, 100)});
  w.remote_addr = p.b.va(p.b.mem.size() - 50);  // runs past the MR
  w.rkey = p.b.rkey;
  p.a.qp.post_send(w);
  p.a.qp.post_send(wqe(2, IBV_WR_SEND, {p.a.iov(0, 10)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 2; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(p.a.scq[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(p.a.qp.state(), IBV_QPS_ERR);
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_ERR);
  ASSERT_EQ(p.b.events.size(), 1u);
  EXPECT_EQ(p.b.events[0], IBV_EVENT_QP_ACCESS_ERR);
  ASSERT_EQ(p.b.rcq.size(), 1u);
  EXPECT_EQ(p.b.rcq[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST(PacketQp, ReadWithoutRemoteReadAccessAndAtomicOnWrongKey) {
  {
    Pair p;
    p.b.mr_access = IBV_ACCESS_REMOTE_WRITE;
    pk::SendWqe w = wqe(1, IBV_WR_RDMA_READ, {p.a.iov(0, 100)});
    w.remote_addr = p.b.va(0);
    w.rkey = p.b.rkey;
    p.a.qp.post_send(w);
    ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
    EXPECT_EQ(p.a.scq[0].status, IBV_WC_REM_ACCESS_ERR);
  }
  {
    Pair p;
    pk::SendWqe w = wqe(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {p.a.iov(0, 8)});
    w.remote_addr = p.b.va(0);
    w.rkey = p.b.rkey + 1;
    p.a.qp.post_send(w);
    ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
    EXPECT_EQ(p.a.scq[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(p.b.atomic_executions, 0);
  }
}

TEST(PacketQp, ZeroLengthWriteNeedsNoValidRkey) {
  Pair p;
  pk::SendWqe w = wqe(1, IBV_WR_RDMA_WRITE, {});
  w.rkey = 0xbad;
  p.a.qp.post_send(w);
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, IBV_WC_SUCCESS);
}

// B's first receive (wr_id 7) fails with `status` when A sends `len` bytes into it; A's SEND
// fails with `send_status`, B's second receive is flushed and its QP is in the error state.
void expect_receive_fails(Pair& p, uint32_t len, ibv_wc_status send_status,
                          ibv_wc_status status) {
  p.b.post_recv(8, 2000, 1500);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, len)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 1; }));
  EXPECT_EQ(p.a.scq[0].status, send_status);
  ASSERT_EQ(p.b.rcq.size(), 2u);
  EXPECT_EQ(p.b.rcq[0].wr_id, 7u);
  EXPECT_EQ(p.b.rcq[0].status, status);
  EXPECT_EQ(p.b.rcq[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_ERR);
}

TEST(PacketQp, SendLongerThanTheReceive) {
  Pair p;
  p.b.post_recv(7, 0, 1500);
  expect_receive_fails(p, 2000, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR);
}

// A receive whose buffer failed its lkey check when it was taken (deregistered, or without
// local write): LOC_PROT_ERR, not LOC_LEN_ERR, and the QP fails as for any local error.
// The requester hears Remote Operational Error (the responder's own WQE is bad: rxe's
// malformed-WQE class, and the same-host path's answer), not Invalid Request.
TEST(PacketQp, SendIntoAReceiveWithABadKey) {
  Pair p;
  p.b.rq.push_back(pk::RecvWqe{7, {}, true});
  expect_receive_fails(p, 100, IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR);
}

TEST(PacketQp, PostSendChecksAndErrorState) {
  Pair p;
  EXPECT_EQ(p.a.qp.post_send(wqe(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {p.a.iov(0, 4)})), EINVAL);
  EXPECT_EQ(p.a.qp.post_send(wqe(1, IBV_WR_TSO, {})), EINVAL);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  p.b.post_recv(3, 0, 10);
  ASSERT_EQ(p.b.qp.modify(a, IBV_QP_STATE), 0);
  ASSERT_EQ(p.b.rcq.size(), 1u);
  EXPECT_EQ(p.b.rcq[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(p.b.qp.post_send(wqe(9, IBV_WR_SEND, {}, 0)), 0);
  ASSERT_EQ(p.b.scq.size(), 1u);
  EXPECT_EQ(p.b.scq[0].status, IBV_WC_WR_FLUSH_ERR);
  Node lone(p.link, 0, pk::QpType::kRc, 5, 64);
  EXPECT_EQ(lone.qp.post_send(wqe(1, IBV_WR_SEND, {})), EINVAL);  // RESET
}

// SEND_WITH_INV: the IETH rides on the LAST (or ONLY) packet; the receiver invalidates the
// key and reports it (IBV_WC_WITH_INV); a key it cannot invalidate fails both sides.
TEST(PacketQp, SendWithInvalidate) {
  Pair p;
  p.b.invalidatable = {0x1234, 0x5678};
  for (int i = 0; i < 3; ++i) p.b.post_recv(i, 8192 * i, 8192);
  pk::SendWqe w = wqe(1, IBV_WR_SEND_WITH_INV, {p.a.iov(0, 3000)});
  w.imm = 0x1234;  // host order, as ibv_send_wr.invalidate_rkey
  p.a.qp.post_send(w);
  w = wqe(2, IBV_WR_SEND_WITH_INV, {p.a.iov(0, 10)});
  w.imm = 0x5678;
  p.a.qp.post_send(w);
  ASSERT_TRUE(p.link.run([&] { return p.b.rcq.size() == 2 && p.a.scq.size() == 2; }));
  EXPECT_EQ(count_opcode(p.a, rw::kSendLastInv), 1);
  EXPECT_EQ(count_opcode(p.a, rw::kSendOnlyInv), 1);
  for (const WirePacket& wp : p.a.sent) {
    if ((wp.pkt.opcode & 0x1f) == rw::kSendLastInv) {
      EXPECT_EQ(wp.pkt.inv_rkey, 0x1234u);
    }
  }
  EXPECT_EQ(p.b.rcq[0].wc_flags, unsigned(IBV_WC_WITH_INV));
  EXPECT_EQ(p.b.rcq[0].imm_data, 0x1234u);
  EXPECT_EQ(p.b.rcq[0].byte_len, 3000u);
  EXPECT_EQ(p.b.rcq[1].imm_data, 0x5678u);
  EXPECT_EQ(p.a.scq[0].opcode, IBV_WC_SEND);
  EXPECT_TRUE(p.b.invalidatable.empty());
  w = wqe(3, IBV_WR_SEND_WITH_INV, {p.a.iov(0, 10)});
  w.imm = 0x1234;  // gone already
  p.a.qp.post_send(w);
  ASSERT_TRUE(p.link.run([&] { return p.b.rcq.size() == 3 && p.a.scq.size() == 3; }));
  EXPECT_EQ(p.b.rcq[2].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(p.a.scq[2].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_ERR);
}

// Local operations (bind, invalidate) send nothing and complete in posting order; a failed
// one fails the QP and flushes what follows.
TEST(PacketQp, LocalOperationsCompleteInOrder) {
  Pair p;
  for (int i = 0; i < 2; ++i) p.b.post_recv(i, 4096 * i, 4096);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 3000)}));
  p.a.qp.post_send(wqe(2, IBV_WR_BIND_MW, {}));
  p.a.qp.post_send(wqe(3, IBV_WR_SEND, {p.a.iov(0, 10)}));
  pk::SendWqe bad = wqe(4, IBV_WR_LOCAL_INV, {});
  bad.local_status = IBV_WC_LOC_QP_OP_ERR;
  p.a.qp.post_send(bad);
  p.a.qp.post_send(wqe(5, IBV_WR_SEND, {p.a.iov(0, 10)}));
  ASSERT_TRUE(p.link.run([&] { return p.a.scq.size() == 5; }));
  const uint64_t ids[] = {1, 2, 3, 4, 5};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p.a.scq[i].wr_id, ids[i]);
  EXPECT_EQ(p.a.scq[1].opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(p.a.scq[3].status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(p.a.scq[4].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(p.a.qp.state(), IBV_QPS_ERR);
}

// --- the responder, packet by packet ---------------------------------------------------

class ResponderTest : public ::testing::Test {
 protected:
  ResponderTest() : b(link, 1, pk::QpType::kRc, 0x22, 1 << 16), a(link, 0, pk::QpType::kRc, 0x11, 64) {
    link.deliver = false;
    Connection c;
    c.psn_a = 0xfffffe;
    bring_up(b, a, c.psn_b, c.psn_a, c, /*to_rts=*/false);  // COMM_EST on the first packet
  }
  pk::Packet request(uint8_t op, uint32_t psn, bool ack_req = true) {
    pk::Packet p;
    p.opcode = op;
    p.dest_qp = 0x22;
    p.psn = psn & pk::kPsnMask;
    p.ack_req = ack_req;
    return p;
  }
  pk::Packet atomic(uint32_t psn, uint64_t va) {
    pk::Packet p = request(rw::kFetchAdd, psn);
    p.va = va;
    p.rkey = b.rkey;
    p.swap_add = 1;
    return p;
  }
  Link link;
  Node b, a;
};

TEST_F(ResponderTest, FuturePsnGetsOneNakThenSilenceUntilTheExpectedPsn) {
  b.post_recv(1, 0, 100);
  b.post_recv(2, 100, 100);
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe + 2));
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe + 3));
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe + 5));
  ASSERT_EQ(b.sent.size(), 1u);
  EXPECT_EQ(b.sent[0].pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakPsnSequenceError));
  EXPECT_EQ(b.sent[0].pkt.psn, 0xfffffeu);
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe));
  b.qp.on_packet(request(rw::kSendOnly, 0xffffff));
  ASSERT_EQ(b.sent.size(), 3u);
  EXPECT_EQ(b.sent[2].pkt.syndrome, rw::kAethAck | 0x1f);
  EXPECT_EQ(b.sent[2].pkt.psn, 0xffffffu);
  EXPECT_EQ(b.sent[2].pkt.msn, 2u);
  EXPECT_EQ(b.qp.expected_psn(), 0u);  // wrapped
  // A gap again: a NAK again.
  b.qp.on_packet(request(rw::kSendOnly, 7));
  ASSERT_EQ(b.sent.size(), 4u);
  EXPECT_EQ(b.sent[3].pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakPsnSequenceError));
  EXPECT_EQ(b.sent[3].pkt.psn, 0u);
  EXPECT_EQ(b.events, std::vector<ibv_event_type>{IBV_EVENT_COMM_EST});  // once, in RTR
}

TEST_F(ResponderTest, DuplicateSendIsReAckedNotDeliveredTwice) {
  b.post_recv(1, 0, 100);
  b.post_recv(2, 100, 100);
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe));
  b.qp.on_packet(request(rw::kSendOnly, 0xfffffe));
  EXPECT_EQ(b.rcq.size(), 1u);
  ASSERT_EQ(b.sent.size(), 2u);
  EXPECT_EQ(b.sent[1].pkt.syndrome, rw::kAethAck | 0x1f);
  EXPECT_EQ(b.sent[1].pkt.psn, 0xfffffeu);
}

TEST_F(ResponderTest, DuplicateAtomicIsReplayedNeverExecutedTwice) {
  b.qp.on_packet(atomic(0xfffffe, b.va(8)));
  b.qp.on_packet(atomic(0xffffff, b.va(8)));
  b.qp.on_packet(atomic(0xfffffe, b.va(8)));  // duplicate of the first
  b.qp.on_packet(atomic(0xffffff, b.va(8)));
  EXPECT_EQ(b.atomic_executions, 2);
  ASSERT_EQ(b.sent.size(), 4u);
  EXPECT_EQ(b.sent[2].pkt.opcode, rw::kAtomicAck);
  EXPECT_EQ(b.sent[2].pkt.orig, 0u);
  EXPECT_EQ(b.sent[3].pkt.orig, 1u);
  // max_dest_rd_atomic is 4: older replies fall out of the cache and are dropped.
  for (uint32_t i = 0; i < 4; ++i) b.qp.on_packet(atomic(i, b.va(8)));
  b.qp.on_packet(atomic(0xfffffe, b.va(8)));
  EXPECT_EQ(b.atomic_executions, 6);
  EXPECT_EQ(b.sent.size(), 8u);
}

TEST_F(ResponderTest, DuplicateAtomicWriteIsAnsweredAgainNotExecutedAgain) {
  pk::Packet w = request(rw::kAtomicWrite, 0xfffffe);
  w.va = b.va(8);
  w.rkey = b.rkey;
  w.dma_len = 8;
  const uint64_t value = 77;
  w.payload = reinterpret_cast<const uint8_t*>(&value);
  w.payload_len = 8;
  b.qp.on_packet(w);
  uint64_t later = 5;
  std::memcpy(b.mem.data() + 8, &later, 8);  // someone wrote after it
  b.qp.on_packet(w);                           // its duplicate
  EXPECT_EQ(b.atomic_executions, 1);
  uint64_t v;
  std::memcpy(&v, b.mem.data() + 8, 8);
  EXPECT_EQ(v, 5u);
  ASSERT_EQ(b.sent.size(), 2u);
  EXPECT_EQ(b.sent[1].pkt.opcode, rw::kRc | rw::kReadResponseOnly);
  EXPECT_EQ(b.sent[1].pkt.psn, 0xfffffeu);
  EXPECT_TRUE(b.sent[1].payload.empty());
  // Misaligned, or not 8 bytes: invalid requests.
  w.psn = 0xffffff;
  w.payload_len = 4;
  b.qp.on_packet(w);
  EXPECT_EQ(b.sent.back().pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakInvalidRequest));
}

TEST_F(ResponderTest, DuplicateReadIsReExecutedFromItsOwnReth) {
  fill_pattern(b.mem.data(), 3000, 4);
  pk::Packet r = request(rw::kReadRequest, 0xfffffe);
  r.va = b.va(0);
  r.rkey = b.rkey;
  r.dma_len = 3000;
  b.qp.on_packet(r);
  ASSERT_EQ(b.sent.size(), 3u);
  EXPECT_EQ(b.qp.expected_psn(), 1u);
  // The requester retries the rest, from the second response on.
  r.psn = 0xffffff;
  r.va = b.va(1024);
  r.dma_len = 3000 - 1024;
  b.qp.on_packet(r);
  ASSERT_EQ(b.sent.size(), 5u);
  EXPECT_EQ(b.sent[3].pkt.opcode, rw::kReadResponseFirst);
  EXPECT_EQ(b.sent[3].pkt.psn, 0xffffffu);
  EXPECT_EQ(b.sent[4].pkt.psn, 0u);
  EXPECT_EQ(b.sent[4].payload, b.sent[2].payload);
  EXPECT_EQ(b.qp.expected_psn(), 1u);
}

TEST_F(ResponderTest, MiddleWithoutFirstIsAnInvalidRequest) {
  b.qp.on_packet(request(rw::kSendMiddle, 0xfffffe));
  ASSERT_EQ(b.sent.size(), 1u);
  EXPECT_EQ(b.sent[0].pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakInvalidRequest));
  EXPECT_EQ(b.qp.state(), IBV_QPS_ERR);
}

TEST_F(ResponderTest, MisalignedAtomicIsAnInvalidRequest) {
  b.qp.on_packet(atomic(0xfffffe, b.va(4)));
  ASSERT_EQ(b.sent.size(), 1u);
  EXPECT_EQ(b.sent[0].pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakInvalidRequest));
  EXPECT_EQ(b.atomic_executions, 0);
}

TEST_F(ResponderTest, MalformedLengthsAreInvalidRequests) {
  b.post_recv(1, 0, 10000);
  pk::Packet p = request(rw::kSendFirst, 0xfffffe);
  std::vector<uint8_t> data(1024);
  p.payload = data.data();
  p.payload_len = 1000;  // FIRST must carry exactly one MTU
  b.qp.on_packet(p);
  ASSERT_EQ(b.sent.size(), 1u);
  EXPECT_EQ(b.sent[0].pkt.syndrome, pk::aeth_syndrome(rw::kAethNak, rw::kNakInvalidRequest));
}

// --- UC and UD -------------------------------------------------------------------------

TEST(PacketQp, UcDropsABrokenMessageAndReusesItsReceive) {
  Pair p(pk::QpType::kUc);
  p.b.post_recv(1, 0, 8192);
  p.b.post_recv(2, 8192, 8192);
  bool dropped = false;
  p.link.drop_if = [&](const WirePacket& wp) {
    if (dropped || (wp.pkt.opcode & 0x1f) != rw::kSendMiddle) return false;
    return dropped = true;
  };
  fill_pattern(p.a.mem.data(), 5000, 1);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 4000)}));
  p.a.qp.post_send(wqe(2, IBV_WR_SEND_WITH_IMM, {p.a.iov(0, 5000)}));
  pk::SendWqe w = wqe(3, IBV_WR_RDMA_WRITE, {p.a.iov(0, 3000)});
  w.remote_addr = p.b.va(20000);
  w.rkey = p.b.rkey;
  p.a.qp.post_send(w);
  EXPECT_EQ(p.a.scq.size(), 3u);  // UC completes on transmission
  p.link.run([] { return false; });
  ASSERT_EQ(p.b.rcq.size(), 1u);
  EXPECT_EQ(p.b.rcq[0].wr_id, 1u);  // the receive of the broken message, reused
  EXPECT_EQ(p.b.rcq[0].byte_len, 5000u);
  EXPECT_EQ(std::memcmp(p.b.mem.data(), p.a.mem.data(), 5000), 0);
  EXPECT_EQ(std::memcmp(p.b.mem.data() + 20000, p.a.mem.data(), 3000), 0);
  EXPECT_TRUE(p.b.sent.empty());  // UC never answers
}

TEST(PacketQp, UcMissingReceiveDropsSilently) {
  Pair p(pk::QpType::kUc);
  p.a.qp.post_send(wqe(1, IBV_WR_SEND, {p.a.iov(0, 3000)}));
  p.link.run([] { return false; });
  EXPECT_TRUE(p.b.rcq.empty());
  EXPECT_TRUE(p.b.sent.empty());
  EXPECT_EQ(p.b.qp.state(), IBV_QPS_RTS);
}

TEST(PacketQp, UdQkeySrcQpGrhAndMtu) {
  Connection c;
  c.mtu = IBV_MTU_2048;
  Pair p(pk::QpType::kUd, c);
  for (int i = 0; i < 4; ++i) p.b.post_recv(i, 4096 * i, 4096);
  fill_pattern(p.a.mem.data(), 2048, 5);
  auto send = [&](uint64_t id, uint32_t len, uint32_t qkey) {
    pk::SendWqe w = wqe(id, IBV_WR_SEND_WITH_IMM, {p.a.iov(0, len)});
    w.remote_qpn = p.b.qp.qp_num();
    w.remote_qkey = qkey;
    w.imm = htonl(77);
    return p.a.qp.post_send(w);
  };
  EXPECT_EQ(send(1, 2049, c.qkey), EINVAL);  // more than one MTU
  EXPECT_EQ(send(2, 2048, c.qkey), 0);
  EXPECT_EQ(send(3, 10, c.qkey + 1), 0);      // wrong Q_Key: dropped
  EXPECT_EQ(send(4, 20, 0x80000000u), 0);     // high bit: the QP's own Q_Key
  p.link.run([] { return false; });
  ASSERT_EQ(p.b.rcq.size(), 2u);
  EXPECT_EQ(p.b.rcq[0].byte_len, 40u + 2048);
  EXPECT_EQ(p.b.rcq[0].src_qp, p.a.qp.qp_num());
  EXPECT_EQ(p.b.rcq[0].wc_flags, unsigned(IBV_WC_GRH | IBV_WC_WITH_IMM));
  EXPECT_EQ(p.b.rcq[0].imm_data, htonl(77));
  EXPECT_EQ(std::memcmp(p.b.mem.data() + 40, p.a.mem.data(), 2048), 0);
  EXPECT_EQ(p.b.rcq[1].byte_len, 60u);
  EXPECT_EQ(p.a.scq.size(), 3u);
}

// RoCE v2 UD: the completion's SL says what the GRH slot holds (wire/roce/grh.hpp), as
// ConnectX does; UCX's UD reads it to find the destination address in the slot.
TEST(PacketQp, UdReceiveSlSaysWhatTheGrhSlotHolds) {
  Connection c;
  Pair p(pk::QpType::kUd, c);
  p.link.deliver = false;  // delivered by hand below, with a GRH slot image
  for (int i = 0; i < 3; ++i) p.b.post_recv(i, 256 * i, 256);
  pk::SendWqe w = wqe(1, IBV_WR_SEND, {p.a.iov(0, 8)});
  w.remote_qpn = p.b.qp.qp_num();
  w.remote_qkey = c.qkey;
  ASSERT_EQ(p.a.qp.post_send(w), 0);
  ASSERT_EQ(p.a.sent.size(), 1u);
  pk::Packet pkt = p.a.sent[0].pkt;
  pkt.payload = p.a.sent[0].payload.data();
  uint8_t v4[40] = {}, v6[40] = {};
  v4[20] = 0x45;  // an IPv4 header in the second half
  v6[0] = 0x60;   // an IPv6 header
  v6[20] = 0x45;  // a source GID byte that looks like an IPv4 header start
  p.b.qp.on_packet(pkt, v4);
  p.b.qp.on_packet(pkt, v6);
  p.b.qp.on_packet(pkt);  // no GRH image: zeros
  ASSERT_EQ(p.b.rcq.size(), 3u);
  EXPECT_EQ(p.b.rcq[0].sl, rw::kL3Ipv4);
  EXPECT_EQ(p.b.rcq[1].sl, rw::kL3Ipv6);
  EXPECT_EQ(p.b.rcq[2].sl, rw::kL3Grh);
  EXPECT_EQ(p.b.mem[20], 0x45);
}

TEST(PacketQp, CommEstWhenTheFirstPacketArrivesInRtr) {
  Connection c;
  Link link;
  Node a(link, 0, pk::QpType::kRc, 0x11, 1 << 16), b(link, 1, pk::QpType::kRc, 0x22, 1 << 16);
  link.nodes = {&a, &b};
  bring_up(a, b, c.psn_a, c.psn_b, c);
  bring_up(b, a, c.psn_b, c.psn_a, c, /*to_rts=*/false);
  b.post_recv(1, 0, 100);
  b.post_recv(2, 0, 100);
  a.qp.post_send(wqe(1, IBV_WR_SEND, {a.iov(0, 10)}));
  a.qp.post_send(wqe(2, IBV_WR_SEND, {a.iov(0, 10)}));
  ASSERT_TRUE(link.run([&] { return a.scq.size() == 2; }));
  EXPECT_EQ(b.events, std::vector<ibv_event_type>{IBV_EVENT_COMM_EST});
  EXPECT_EQ(b.rcq.size(), 2u);
}

// A peer can send anything: random headers at a QP with work in both directions must
// neither crash (run this under ASan) nor reach outside the registered memory.
TEST(PacketQp, RandomPacketsFromAHostilePeer) {
  for (pk::QpType type : {pk::QpType::kRc, pk::QpType::kUc, pk::QpType::kUd}) {
    Pair p(type);
    p.link.deliver = false;
    std::mt19937_64 rng(42);
    std::vector<uint8_t> payload(5000, 0x5a);
    for (int round = 0; round < 20000; ++round) {
      if (round % 500 == 0) {
        for (int i = 0; i < 4; ++i) p.b.post_recv(i, 1000 * i, 1000);
        for (ibv_wr_opcode op : {IBV_WR_SEND, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP}) {
          pk::SendWqe w = wqe(round, op, {p.b.iov(8192, 3000)});
          w.remote_addr = 64;
          w.remote_qpn = p.a.qp.qp_num();
          p.b.qp.post_send(w);
        }
      }
      pk::Packet pkt;
      uint8_t transports[] = {rw::kRc, rw::kUc, rw::kUd, rw::kCnp};
      pkt.opcode = pk::bth_opcode(transports[rng() % 4], rng() % 0x20);
      pkt.dest_qp = rng() % 8 ? p.b.qp.qp_num() : rng();
      uint32_t near = rng() % 2 ? p.b.qp.expected_psn() : p.b.qp.next_send_psn();
      pkt.psn = (near + static_cast<uint32_t>(rng() % 64) - 32) & pk::kPsnMask;
      pkt.ack_req = rng() % 2;
      pkt.va = rng() % 2 ? p.b.va(rng() % p.b.mem.size()) : rng();
      pkt.rkey = rng() % 2 ? p.b.rkey : rng();
      pkt.dma_len = rng() % 3 ? rng() % 5000 : rng();
      pkt.syndrome = rng();
      pkt.qkey = rng() % 2 ? p.conn.qkey : rng();
      pkt.payload_len = rng() % 3 ? 0 : rng() % payload.size();
      pkt.payload = pkt.payload_len ? payload.data() : nullptr;
      pkt.orig = rng();
      p.b.qp.on_packet(pkt);
      if (rng() % 50 == 0) {
        p.link.now += 1'000'000;
        p.b.qp.on_timer();
      }
      if (p.b.qp.state() == IBV_QPS_ERR) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_RESET;
        p.b.qp.modify(a, IBV_QP_STATE);
        p.b.rq.clear();
        bring_up(p.b, p.a, 1000, 2000, p.conn);
      }
    }
    // Out-of-bounds accesses are ASan's to catch; here: the QP answered (RC: it did not
    // just drop everything) and stays in a defined state.
    if (type == pk::QpType::kRc) {
      EXPECT_GT(p.b.sent.size(), 1000u);
    }
    EXPECT_TRUE(p.b.qp.state() == IBV_QPS_RTS || p.b.qp.state() == IBV_QPS_ERR);
  }
}

// --- a lossy link ------------------------------------------------------------------------

// Both sides post a random mix of every operation over a link that drops 1 %, reorders
// 5 % and duplicates 1 % of the packets. Each WRITE and READ gets its own remote range;
// FETCH_ADDs share one counter (their original values must be 0..n-1, each once); each
// CMP_SWAP chain advances its own word by one, so it succeeds only if executed in order
// and exactly once.
class LossyLinkTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(LossyLinkTest, EveryByteLandsEveryAtomicRunsOnce) {
  Connection c;
  c.mtu = IBV_MTU_256;
  c.psn_a = 0xffff00;
  c.psn_b = 0xfffff0;
  c.timeout = 8;  // 1 ms
  Pair p(pk::QpType::kRc, c, GetParam(), 12 << 20);
  p.link.drop_rate = 0.01;
  p.link.reorder_rate = 0.05;
  p.link.dup_rate = 0.01;
  std::mt19937_64 rng(GetParam() * 7919);
  constexpr int kOps = 1000;
  constexpr size_t kRegion = kOps * 2048;
  constexpr size_t kSrc = 0, kRecv = kRegion, kWrite = 2 * kRegion, kReadSrc = 3 * kRegion,
                   kReadDst = 4 * kRegion, kAtomic = 5 * kRegion;
  constexpr size_t kSlot = 2048;  // per-operation range in each region
  struct Expect {
    ibv_wr_opcode op;
    uint32_t len;
    size_t slot;
  };
  for (Node* n : {&p.a, &p.b}) {
    fill_pattern(n->mem.data() + kSrc, kRegion, n == &p.a ? 11 : 22);
    fill_pattern(n->mem.data() + kReadSrc, kRegion, n == &p.a ? 33 : 44);
    for (int i = 0; i < kOps; ++i) n->post_recv(i, kRecv + i * kSlot, kSlot);
  }
  std::vector<Expect> expect[2];
  int faa[2] = {0, 0};
  int cas[2] = {0, 0};
  for (int i = 0; i < kOps; ++i) {
    int side = rng() % 2;
    Node& me = side ? p.b : p.a;
    Node& peer = side ? p.a : p.b;
    size_t slot = expect[side].size();
    uint32_t len = rng() % 3 == 0 ? rng() % 8 : rng() % kSlot;
    static const ibv_wr_opcode kOpsMix[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
                                            IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM,
                                            IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                            IBV_WR_ATOMIC_CMP_AND_SWP};
    ibv_wr_opcode op = kOpsMix[rng() % 7];
    pk::SendWqe w = wqe(slot, op, {me.iov(kSrc + slot * kSlot, len)});
    w.imm = htonl(static_cast<uint32_t>(slot));
    w.rkey = peer.rkey;
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      w.remote_addr = peer.va(kWrite + slot * kSlot);
    } else if (op == IBV_WR_RDMA_READ) {
      w.remote_addr = peer.va(kReadSrc + slot * kSlot);
      w.sg = {me.iov(kReadDst + slot * kSlot, len)};
    } else if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      w.remote_addr = peer.va(kAtomic);
      w.compare_add = 1;
      w.sg = {me.iov(kReadDst + slot * kSlot, 8)};
      len = 8;
      ++faa[side];
    } else if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      w.remote_addr = peer.va(kAtomic + 8);
      w.compare_add = cas[side];
      w.swap = cas[side] + 1;
      w.sg = {me.iov(kReadDst + slot * kSlot, 8)};
      len = static_cast<uint32_t>(cas[side]++);  // the value it must see
    }
    expect[side].push_back({op, len, slot});
    ASSERT_EQ(me.qp.post_send(std::move(w)), 0);
    if (rng() % 4 == 0) p.link.run_for(rng() % 20000);
  }
  ASSERT_TRUE(p.link.run([&] {
    return p.a.scq.size() == expect[0].size() && p.b.scq.size() == expect[1].size();
  })) << "hang at " << p.link.now;
  p.link.run([] { return false; });  // let the last ACKs land
  for (int side = 0; side < 2; ++side) {
    SCOPED_TRACE(side);
    Node& me = side ? p.b : p.a;
    Node& peer = side ? p.a : p.b;
    std::vector<uint64_t> faa_seen;
    size_t recv_index = 0;
    for (size_t i = 0; i < expect[side].size(); ++i) {
      const Expect& e = expect[side][i];
      const pk::Completion& wc = me.scq[i];
      ASSERT_EQ(wc.wr_id, i);  // in order
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "op " << e.op;
      const uint8_t* src = me.mem.data() + kSrc + e.slot * kSlot;
      if (e.op == IBV_WR_SEND || e.op == IBV_WR_SEND_WITH_IMM ||
          e.op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        // The peer's receives complete in the order of the messages that used them.
        ASSERT_LT(recv_index, peer.rcq.size());
        const pk::Completion& r = peer.rcq[recv_index++];
        ASSERT_EQ(r.status, IBV_WC_SUCCESS);
        EXPECT_EQ(r.byte_len, e.len);
        if (e.op != IBV_WR_SEND) {
          EXPECT_EQ(r.imm_data, htonl(static_cast<uint32_t>(e.slot)));
        }
        if (e.op != IBV_WR_RDMA_WRITE_WITH_IMM) {
          EXPECT_EQ(std::memcmp(peer.mem.data() + kRecv + r.wr_id * kSlot, src, e.len), 0);
        }
      }
      if (e.op == IBV_WR_RDMA_WRITE || e.op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        EXPECT_EQ(std::memcmp(peer.mem.data() + kWrite + e.slot * kSlot, src, e.len), 0);
      }
      uint8_t* dst = me.mem.data() + kReadDst + e.slot * kSlot;
      if (e.op == IBV_WR_RDMA_READ) {
        EXPECT_EQ(std::memcmp(dst, peer.mem.data() + kReadSrc + e.slot * kSlot, e.len), 0);
      }
      uint64_t orig;
      std::memcpy(&orig, dst, 8);
      if (e.op == IBV_WR_ATOMIC_FETCH_AND_ADD) faa_seen.push_back(orig);
      if (e.op == IBV_WR_ATOMIC_CMP_AND_SWP) {
        EXPECT_EQ(orig, e.len);
      }
    }
    EXPECT_EQ(recv_index, peer.rcq.size());
    std::sort(faa_seen.begin(), faa_seen.end());
    for (size_t i = 0; i < faa_seen.size(); ++i) EXPECT_EQ(faa_seen[i], i);
    uint64_t counter, chain;
    std::memcpy(&counter, peer.mem.data() + kAtomic, 8);
    std::memcpy(&chain, peer.mem.data() + kAtomic + 8, 8);
    EXPECT_EQ(counter, uint64_t(faa[side]));
    EXPECT_EQ(chain, uint64_t(cas[side]));
    EXPECT_EQ(peer.atomic_executions, faa[side] + cas[side]);
    EXPECT_EQ(me.qp.state(), IBV_QPS_RTS);
  }
  size_t sent = p.a.sent.size() + p.b.sent.size();
  int atomic_requests = count_opcode(p.a, rw::kFetchAdd) + count_opcode(p.a, rw::kCompareSwap) +
                        count_opcode(p.b, rw::kFetchAdd) + count_opcode(p.b, rw::kCompareSwap);
  std::printf("seed %llu: %zu packets sent, %llu delivered, %llu dropped, %llu reordered, "
              "%llu duplicated, %d atomic requests for %d atomics, %.3f ms virtual\n",
              (unsigned long long)GetParam(), sent, (unsigned long long)p.link.delivered,
              (unsigned long long)p.link.dropped, (unsigned long long)p.link.reordered,
              (unsigned long long)p.link.duplicated, atomic_requests,
              faa[0] + faa[1] + cas[0] + cas[1], p.link.now / 1e6);
  EXPECT_GT(p.link.dropped, 10u);  // the run did meet every kind of trouble
  EXPECT_GT(p.link.reordered, 50u);
  EXPECT_GT(p.link.duplicated, 10u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, LossyLinkTest, ::testing::Values(1u, 2u, 3u, 4u, 5u, 6u));

}  // namespace
}  // namespace softverbs::unit
