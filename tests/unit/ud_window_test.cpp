// UD windows, target side (engine/shm_ud.cpp, wire/shm/ud_window.hpp), inside one process:
// the test opens a window of UD QP b for QP a as a's agent would, and plays the sender by
// writing slots itself, garbage included. ibv_poll_cq on b's CQ must turn what is valid into
// UD receive completions and drop or refuse the rest without touching anything else.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.hpp"
#include "qp_support.hpp"
#include "wire/registry.hpp"
#include "wire/roce/grh.hpp"
#include "wire/shm/ud_window.hpp"

namespace softverbs::unit {
namespace {

class UdWindowTest : public PairTest {
 protected:
  UdWindowTest() { type = IBV_QPT_UD; }
  void SetUp() override {
    PairTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    if (wire::my_slot() == 0 || !cq_b->shared_offset) GTEST_SKIP() << "no registry or arena here";
    connect();
    gid = Device::instance().gids()[0].gid;
  }

  // b's window for sender QP `peer` (owned by process `pid`), as b's agent opens it.
  wire::UdWindowHeader* open(uint32_t peer, pid_t pid = wire::self_pid()) {
    uint64_t off = engine::open_ud_window(b, peer, pid);
    return off ? wire::Arena::self()->at<wire::UdWindowHeader>(off) : nullptr;
  }
  static wire::UdSlot& slot(wire::UdWindowHeader* h, uint64_t n) {
    auto* slots = reinterpret_cast<wire::UdSlot*>(reinterpret_cast<char*>(h) + wire::ud_window_slots_at());
    return slots[n % wire::kWindowSlots];
  }
  // Writes datagram #n into the window, as a sender does (seq last), and rings the doorbell.
  void put(wire::UdWindowHeader* h, uint64_t n, const char* text, uint32_t qkey = kQkey,
           uint8_t opcode = wire::kUdSend, uint32_t length = 0, uint32_t imm = 0) {
    wire::UdSlot& s = slot(h, n);
    uint32_t len = static_cast<uint32_t>(std::strlen(text) + 1);
    std::memcpy(s.data, text, len);
    s.length = static_cast<uint16_t>(length ? length : len);
    s.opcode = opcode;
    s.flags = 0;
    s.imm = imm;
    s.qkey = qkey;
    std::memcpy(s.sgid, gid.raw, 16);
    std::memcpy(s.dgid, gid.raw, 16);
    s.seq.store(n + 1, std::memory_order_release);
    cq_b->shared->doorbell.fetch_add(1);
  }
  int post(uint64_t wr_id, uint32_t len = kGrhBytes + 64) {
    return post_one_recv(b, wr_id, buf_b.data() + 128 * (wr_id % 16), len, mr_b->ibv.lkey);
  }
  const char* landed(uint64_t wr_id) {
    return reinterpret_cast<const char*>(buf_b.data() + 128 * (wr_id % 16) + kGrhBytes);
  }
  int poll(ibv_wc* wc) { return poll_cq(cq_b, 1, wc); }

  ibv_gid gid{};
};

TEST_F(UdWindowTest, OnlyTheOwnerOfTheSenderQpnGetsAWindow) {
  EXPECT_EQ(open(a->qpn(), wire::self_pid() + 1), nullptr) << "another process may not write as a";
  uint32_t elsewhere = static_cast<uint32_t>((wire::my_slot() % (wire::kSlots - 1)) + 1) << wire::kQpnSlotShift;
  if (wire::slot_of_qpn(elsewhere) != wire::my_slot()) {
    EXPECT_EQ(open(elsewhere | 5), nullptr) << "a QPN of another registry slot";
  }
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->magic, wire::kUdWindowMagic);
  EXPECT_EQ(h->qpn, b->qpn());
  EXPECT_EQ(h->peer_qpn, a->qpn());
  EXPECT_EQ(h->live.load(), 1u);
}

TEST_F(UdWindowTest, DatagramLandsWithGrhSourceAndImmediate) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(post(1), 0);
  put(h, 0, "through the window", kQkey, wire::kUdSendImm, 0, htonl(99));
  ibv_wc wc{};
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << status_name(wc.status);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.qp_num, b->qpn());
  EXPECT_EQ(wc.src_qp, a->qpn());
  EXPECT_EQ(wc.byte_len, kGrhBytes + 19);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wc.imm_data), 99u);
  EXPECT_EQ(wc.sl, wire::roce::kL3Ipv4);
  EXPECT_STREQ(landed(1), "through the window");
  EXPECT_EQ(buf_b[128 + 20], 0x45) << "an IPv4 header in the GRH slot";
  EXPECT_EQ(h->head.load(), 1u) << "the slot is the sender's again";
}

TEST_F(UdWindowTest, WrongQkeyIsDroppedAndTheReceiveStays) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(post(1), 0);
  put(h, 0, "wrong key", kQkey + 1);
  ibv_wc wc{};
  EXPECT_EQ(poll(&wc), 0);
  put(h, 1, "right key");
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_STREQ(landed(1), "right key");
}

TEST_F(UdWindowTest, NoReceiveDropsTheDatagram) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  put(h, 0, "lost");
  ibv_wc wc{};
  EXPECT_EQ(poll(&wc), 0);
  ASSERT_EQ(post(2), 0);
  put(h, 1, "kept");
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_STREQ(landed(2), "kept") << "a datagram is not held for a later receive";
}

TEST_F(UdWindowTest, TooSmallReceiveIsLocalLengthErrorAndTheQpGoesOn) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(post(1, kGrhBytes + 4), 0);
  ASSERT_EQ(post(2), 0);
  put(h, 0, "too long for it");
  put(h, 1, "fits");
  ibv_wc wc{};
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << status_name(wc.status);
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(landed(2), "fits");
  EXPECT_EQ(state_of(b), IBV_QPS_RTS);
}

// A slot that no sender could have written (an opcode or a length UD does not have) closes
// that window: nothing lands, nothing else changes, and the sender gets a new one.
TEST_F(UdWindowTest, GarbageInASlotClosesTheWindow) {
  for (int bad = 0; bad < 2; ++bad) {
    wire::UdWindowHeader* h = open(a->qpn());
    ASSERT_NE(h, nullptr);
    ASSERT_EQ(post(1), 0);
    if (bad == 0) put(h, 0, "opcode", kQkey, 7);
    else put(h, 0, "length", kQkey, wire::kUdSend, wire::kUdPayload + 1);
    ibv_wc wc{};
    EXPECT_EQ(poll(&wc), 0);
    EXPECT_EQ(h->live.load(), 0u);
    EXPECT_EQ(state_of(b), IBV_QPS_RTS);
    wire::UdWindowHeader* fresh = open(a->qpn());
    ASSERT_NE(fresh, nullptr);
    put(fresh, 0, "after");
    ASSERT_EQ(poll(&wc), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_STREQ(landed(1), "after");
  }
}

// The target keeps its own count and never reads the header back.
TEST_F(UdWindowTest, GarbageInTheHeaderIsIgnored) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(post(1), 0);
  ASSERT_EQ(post(2), 0);
  put(h, 0, "first");
  ibv_wc wc{};
  ASSERT_EQ(poll(&wc), 1);
  h->magic = 0xdeadbeef;
  h->qpn = h->peer_qpn = 0xffffff;
  h->cq_offset = ~0ull;
  h->owner_pid = -1;
  h->slots_offset = 12345;
  h->head.store(77);
  put(h, 1, "second");
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.src_qp, a->qpn());
  EXPECT_STREQ(landed(2), "second");
  EXPECT_EQ(h->head.load(), 2u);
}

// A sender that asks again (it lost its window) gets a fresh one; what it left in the old
// one was sent first and lands first.
TEST_F(UdWindowTest, ReopeningDeliversWhatTheOldWindowHeld) {
  wire::UdWindowHeader* old = open(a->qpn());
  ASSERT_NE(old, nullptr);
  ASSERT_EQ(post(1), 0);
  ASSERT_EQ(post(2), 0);
  put(old, 0, "old");
  wire::UdWindowHeader* fresh = open(a->qpn());
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(old->live.load(), 0u);
  put(fresh, 0, "new");
  ibv_wc wc{};
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_STREQ(landed(1), "old");
  ASSERT_EQ(poll(&wc), 1);
  EXPECT_STREQ(landed(2), "new");
}

// Two senders: two windows, drained when the doorbell rings (no single slot to watch).
TEST_F(UdWindowTest, TwoWindowsBothDrain) {
  wire::UdWindowHeader* from_a = open(a->qpn());
  wire::UdWindowHeader* from_b = open(b->qpn());
  ASSERT_TRUE(from_a && from_b);
  ASSERT_EQ(post(1), 0);
  ASSERT_EQ(post(2), 0);
  put(from_a, 0, "from a");
  put(from_b, 0, "from b");
  ibv_wc wc[2]{};
  int n = 0;
  for (int tries = 0; tries < 10 && n < 2; ++tries) n += poll_cq(cq_b, 2 - n, wc + n);
  ASSERT_EQ(n, 2);
  EXPECT_NE(wc[0].src_qp, wc[1].src_qp);
  for (const ibv_wc& w : wc) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_TRUE(w.src_qp == a->qpn() || w.src_qp == b->qpn());
  }
}

// A QP moved to RESET closes its windows, and opens none until it listens again.
TEST_F(UdWindowTest, ResetClosesTheWindows) {
  wire::UdWindowHeader* h = open(a->qpn());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(to_state(b, IBV_QPS_RESET), 0);
  EXPECT_EQ(h->live.load(), 0u);
  EXPECT_EQ(open(a->qpn()), nullptr) << "a QP in RESET takes no datagrams";
}

}  // namespace
}  // namespace softverbs::unit
