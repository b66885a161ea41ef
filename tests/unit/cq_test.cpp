// CQs and completion channels: ring order and capacity, overrun, arming rules, event
// delivery and acknowledgement, destroy ordering, resize.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <utility>

#include "unit_support.hpp"

namespace softverbs::unit {
namespace {

class CqTest : public ContextTest {
 protected:
  // Pushes `n` successful completions with wr_ids first, first+1, ...
  void push_n(Cq* cq, int n, uint64_t first = 1) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(cq_push(cq, make_wc(first + i), false));
  }
  // Pops the channel's next event without blocking; returns the CQ or nullptr.
  ibv_cq* next_event(CompChannel* ch, void** cq_context = nullptr) {
    if (!readable(ch->ibv.fd)) return nullptr;
    ibv_cq* cq = nullptr;
    void* c = nullptr;
    EXPECT_EQ(get_cq_event(ch, &cq, &c), 0);
    if (cq_context) *cq_context = c;
    return cq;
  }
};

TEST_F(CqTest, CreateGivesAtLeastTheRequestedEntries) {
  for (int want : {1, 2, 3, 16, 17, 100, 4096}) {
    int marker = 0;
    Cq* cq = make_cq(want, nullptr, &marker);
    ASSERT_NE(cq, nullptr);
    EXPECT_GE(cq->cq()->cqe, want);
    EXPECT_EQ(cq->cq()->cq_context, &marker);
    EXPECT_EQ(cq->cq()->context, ctx->ibv());
    EXPECT_EQ(cq->cq()->channel, nullptr);
    EXPECT_EQ(destroy_cq(cq), 0);
  }
}

// A CQ's shared block (arm word and doorbell, what peers in other processes see) goes back
// to the arena when the CQ is destroyed: a program that makes and destroys CQs all its life
// keeps them reachable from other processes. The arena holds 65536 such blocks.
TEST_F(CqTest, DestroyedCqsGiveTheirSharedBlockBack) {
  Cq* first = make_cq(1);
  ASSERT_NE(first, nullptr);
  uint64_t offset = first->shared_offset;
  ASSERT_NE(offset, 0u) << "no shared arena in this process";
  ASSERT_EQ(destroy_cq(first), 0);
  for (int i = 0; i < 70000; ++i) {
    Cq* cq = make_cq(1);
    ASSERT_NE(cq, nullptr);
    ASSERT_NE(cq->shared_offset, 0u) << "the arena ran out after " << i << " CQs";
    ASSERT_EQ(cq->arm->load(), wire::kArmNone);
    ASSERT_EQ(destroy_cq(cq), 0);
  }
}

TEST_F(CqTest, CreateRejectsBadArguments) {
  const int vectors = ctx->ibv()->num_comp_vectors;
  for (auto [cqe, vector] : {std::pair{0, 0}, {-1, 0}, {Limits::max_cqe + 1, 0}, {4, vectors},
                             {4, -1}})
    EXPECT_EQ(create_errno([&] { return create_cq(ctx, cqe, nullptr, nullptr, vector); }), EINVAL)
        << "cqe " << cqe << " comp_vector " << vector;
}

TEST_F(CqTest, PollReturnsCompletionsInOrderUpToNumEntries) {
  Cq* cq = make_cq(16);
  ASSERT_NE(cq, nullptr);
  ibv_wc wc[16];
  EXPECT_EQ(poll_cq(cq, 16, wc), 0) << "a new CQ is empty";
  push_n(cq, 5);
  ASSERT_EQ(poll_cq(cq, 2, wc), 2);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  ASSERT_EQ(poll_cq(cq, 1, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 3u);
  ASSERT_EQ(poll_cq(cq, 16, wc), 2);
  EXPECT_EQ(wc[0].wr_id, 4u);
  EXPECT_EQ(wc[1].wr_id, 5u);
  EXPECT_EQ(poll_cq(cq, 16, wc), 0);
  EXPECT_EQ(poll_cq(cq, 0, wc), 0);
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, CompletionFieldsArePreserved) {
  Cq* cq = make_cq(4);
  ASSERT_NE(cq, nullptr);
  ibv_wc in = make_wc(0x1122334455667788ull, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV_RDMA_WITH_IMM);
  in.byte_len = 12345;
  in.imm_data = 0xabcdef01;
  in.qp_num = 77;
  in.src_qp = 78;
  in.wc_flags = IBV_WC_WITH_IMM;
  ASSERT_TRUE(cq_push(cq, in, false));
  ibv_wc out{};
  ASSERT_EQ(poll_cq(cq, 1, &out), 1);
  EXPECT_EQ(out.wr_id, in.wr_id);
  EXPECT_EQ(out.status, in.status);
  EXPECT_EQ(out.opcode, in.opcode);
  EXPECT_EQ(out.byte_len, in.byte_len);
  EXPECT_EQ(out.imm_data, in.imm_data);
  EXPECT_EQ(out.qp_num, in.qp_num);
  EXPECT_EQ(out.src_qp, in.src_qp);
  EXPECT_EQ(out.wc_flags, in.wc_flags);
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, RingWrapsAroundManyTimes) {
  Cq* cq = make_cq(3);
  ASSERT_NE(cq, nullptr);
  const int cap = cq->cq()->cqe;
  uint64_t next_in = 1, next_out = 1;
  for (int round = 0; round < 50; ++round) {
    push_n(cq, cap, next_in);
    next_in += cap;
    ibv_wc wc[8];
    int got;
    while ((got = poll_cq(cq, 2, wc)) > 0)
      for (int i = 0; i < got; ++i) ASSERT_EQ(wc[i].wr_id, next_out++);
    ASSERT_EQ(got, 0);
  }
  EXPECT_EQ(next_out, next_in);
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, FullCqHoldsExactlyCqeEntries) {
  Cq* cq = make_cq(8);
  ASSERT_NE(cq, nullptr);
  const int cap = cq->cq()->cqe;
  push_n(cq, cap);
  ibv_wc wc[64];
  ASSERT_EQ(poll_cq(cq, 64, wc), cap);
  for (int i = 0; i < cap; ++i) EXPECT_EQ(wc[i].wr_id, uint64_t(i + 1));
  EXPECT_EQ(poll_cq(cq, 64, wc), 0) << "filling a CQ to cqe is no overrun";
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, OverrunPutsTheCqInErrorAndRaisesCqErr) {
  Cq* cq = make_cq(4);
  ASSERT_NE(cq, nullptr);
  const int cap = cq->cq()->cqe;
  push_n(cq, cap);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd));
  EXPECT_FALSE(cq_push(cq, make_wc(999), false)) << "one past cqe must overrun";
  EXPECT_FALSE(cq_push(cq, make_wc(1000), false)) << "a CQ in error takes nothing";

  ASSERT_TRUE(readable(ctx->ibv()->async_fd));
  ibv_async_event ev{};
  ASSERT_EQ(get_async_event(ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, cq->cq());
  ack_async_event(&ev);
  EXPECT_FALSE(readable(ctx->ibv()->async_fd)) << "CQ_ERR is raised once";

  // What was in the ring before the overrun can still be polled; then the error shows.
  ibv_wc wc[64];
  ASSERT_EQ(poll_cq(cq, 64, wc), cap);
  for (int i = 0; i < cap; ++i) EXPECT_EQ(wc[i].wr_id, uint64_t(i + 1));
  EXPECT_EQ(poll_cq(cq, 64, wc), -1);
  EXPECT_EQ(poll_cq(cq, 1, wc), -1);
  EXPECT_EQ(destroy_cq(cq), 0);
}

// A CQ of 16 entries on a completion channel; events taken with next_event() are acked
// at the end of the test unless the test acked them itself.
class ChannelTest : public CqTest {
 protected:
  void SetUp() override {
    CqTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    ch = make_channel();
    ASSERT_NE(ch, nullptr);
    cq = make_cq(16, ch, &marker);
    ASSERT_NE(cq, nullptr);
  }
  void TearDown() override {
    if (cq) {
      ack_cq_events(cq, unacked);
      EXPECT_EQ(destroy_cq(cq), 0);
    }
    if (ch) {
      EXPECT_EQ(destroy_comp_channel(ch), 0);
    }
    CqTest::TearDown();
  }
  // next_event on our channel, counting the events of `cq` still to be acked.
  ibv_cq* event(void** cq_context = nullptr) {
    ibv_cq* got = next_event(ch, cq_context);
    if (cq && got == cq->cq()) ++unacked;
    return got;
  }

  int marker = 0;
  CompChannel* ch = nullptr;
  Cq* cq = nullptr;
  unsigned unacked = 0;
};

TEST_F(ChannelTest, NextCompletionNotificationIsOneShot) {
  EXPECT_EQ(cq->cq()->channel, &ch->ibv);
  push_n(cq, 1, 1);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "an unarmed CQ raises no event";

  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push_n(cq, 1, 2);
  ASSERT_TRUE(readable(ch->ibv.fd));
  void* got_context = nullptr;
  EXPECT_EQ(event(&got_context), cq->cq());
  EXPECT_EQ(got_context, &marker);
  EXPECT_FALSE(readable(ch->ibv.fd));

  push_n(cq, 2, 3);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the arm was used up by the first completion";

  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);  // arming twice still gives one event
  push_n(cq, 2, 5);
  EXPECT_EQ(event(), cq->cq());
  EXPECT_EQ(event(), nullptr);
}

// One thread waits in ibv_get_cq_event while another adds completions, arms and polls, in
// every order: the waiter hears of each round (the early event may be taken back by the
// poll, but then the round's new completion fires), and nothing hangs.
TEST_F(ChannelTest, AWaiterThreadHearsEveryRoundOfAnArmingPoller) {
  std::atomic<int> heard{0};
  std::atomic<bool> stop{false};
  std::thread waiter([&] {
    while (!stop.load()) {
      ibv_cq* got = nullptr;
      void* context = nullptr;
      if (get_cq_event(ch, &got, &context) != 0) break;
      ack_cq_events(Cq::from(got), 1);
      heard.fetch_add(1);
    }
  });
  ibv_wc wc[16];
  uint64_t id = 1;
  for (int round = 0; round < 2000; ++round) {
    const int before = heard.load();
    push_n(cq, round % 3, id);  // 0 to 2 completions no event told of
    id += round % 3;
    ASSERT_EQ(req_notify_cq(cq, 0), 0);
    if (round % 2) while (poll_cq(cq, 16, wc) > 0) {}  // may take the early event back
    push_n(cq, 1, id++);  // after the arm: an event for it, or the early one stands
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (heard.load() == before && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    ASSERT_GT(heard.load(), before) << "round " << round << ": the waiter slept on";
    while (poll_cq(cq, 16, wc) > 0) {}
  }
  stop.store(true);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push_n(cq, 1, id);  // wakes the waiter to see `stop`
  waiter.join();
}

// Completions no event told of, unpolled when the CQ is armed: their event is queued at
// once (an early event, as on mlx4/mlx5), and the arm is spent when it is taken.
TEST_F(ChannelTest, ArmingOverUnannouncedCompletionsQueuesAnEarlyEvent) {
  push_n(cq, 3);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(readable(ch->ibv.fd));
  ASSERT_EQ(req_notify_cq(cq, 0), 0);  // arming again queues no second one
  EXPECT_EQ(event(), cq->cq());
  EXPECT_FALSE(readable(ch->ibv.fd));
  push_n(cq, 1, 4);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the early event spent the arm";
}

// Polled empty before it is taken, the early event goes away and the CQ stays armed.
TEST_F(ChannelTest, EarlyEventIsTakenBackWhenTheCqIsPolledEmpty) {
  push_n(cq, 3);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(readable(ch->ibv.fd));
  ibv_wc wc[16];
  ASSERT_EQ(poll_cq(cq, 2, wc), 2);
  EXPECT_TRUE(readable(ch->ibv.fd)) << "one completion is still unpolled";
  ASSERT_EQ(poll_cq(cq, 16, wc), 1);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "polled empty: the early event is taken back";
  push_n(cq, 1, 4);
  EXPECT_EQ(event(), cq->cq()) << "the arm is still pending";
  EXPECT_EQ(event(), nullptr);
}

// A completion that comes while the early event waits makes it the CQ's ordinary event:
// one event, and polling does not take it back.
TEST_F(ChannelTest, NewCompletionTurnsTheEarlyEventIntoTheEvent) {
  push_n(cq, 1);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push_n(cq, 1, 2);
  ibv_wc wc[16];
  ASSERT_EQ(poll_cq(cq, 16, wc), 2);
  EXPECT_EQ(event(), cq->cq());
  EXPECT_EQ(event(), nullptr);
  push_n(cq, 1, 3);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the arm was spent";
}

// An ordinary event still queued when the CQ is armed again over new completions: the
// early event queues behind it, and handing out the older one leaves the early one to be
// taken back by a poll that empties the CQ.
TEST_F(ChannelTest, AnOlderEventHandedOutLeavesTheEarlyOneToTakeBack) {
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push_n(cq, 1);                       // fires, not taken yet
  push_n(cq, 1, 2);                    // after that event
  ASSERT_EQ(req_notify_cq(cq, 0), 0);  // early event behind the first
  EXPECT_EQ(event(), cq->cq());        // the first
  ibv_wc wc[16];
  ASSERT_EQ(poll_cq(cq, 16, wc), 2);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "an event left with nothing behind it";
  push_n(cq, 1, 3);
  EXPECT_EQ(event(), cq->cq()) << "the second arm is still pending";
  EXPECT_EQ(event(), nullptr);
}

// A QP reset purges its completions: what the last event told of shrinks with the ring,
// so completions that come afterwards are still ones no event told of.
TEST_F(ChannelTest, APurgeKeepsTheAnnouncedMarkOnWhatIsLeft) {
  auto push_for = [this](uint32_t qpn, uint64_t id) {
    ibv_wc wc = make_wc(id);
    wc.qp_num = qpn;
    ASSERT_TRUE(cq_push(cq, wc, false));
  };
  push_for(7, 1);
  push_for(8, 2);
  push_for(7, 3);
  push_for(8, 4);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  EXPECT_EQ(event(), cq->cq());  // it told of all four
  cq_purge_qp(cq, 7);            // two left
  push_for(8, 5);
  push_for(8, 6);                // no event told of these
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  EXPECT_TRUE(readable(ch->ibv.fd)) << "the purge left the mark past the new completions";
  EXPECT_EQ(event(), cq->cq());
}

// Completions the last event told of make no second event when the CQ is re-armed with
// them still unpolled (the man page's loop arms before it polls).
// A completion that came after the event, before the re-arm, is one no event told of.
TEST_F(ChannelTest, ArmingOverAnnouncedCompletionsFiresNothing) {
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push_n(cq, 1);
  EXPECT_EQ(event(), cq->cq());
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the event told of the one completion";
  push_n(cq, 1, 2);
  EXPECT_EQ(event(), cq->cq());
  push_n(cq, 1, 3);  // after that event: no event told of it
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  EXPECT_EQ(event(), cq->cq());
}

TEST_F(ChannelTest, SolicitedOnlyFiresOnSolicitedOrErrorCompletions) {
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  ASSERT_TRUE(cq_push(cq, make_wc(2, IBV_WC_SUCCESS, IBV_WC_SEND), false));
  EXPECT_FALSE(readable(ch->ibv.fd)) << "unsolicited successful completions do not fire";
  ASSERT_TRUE(cq_push(cq, make_wc(3), true));
  EXPECT_EQ(event(), cq->cq()) << "a solicited completion fires";

  // An unsuccessful completion counts as solicited.
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(4, IBV_WC_WR_FLUSH_ERR), false));
  EXPECT_EQ(event(), cq->cq()) << "an error completion fires a solicited-only arm";

  // One-shot as well.
  ASSERT_TRUE(cq_push(cq, make_wc(5), true));
  EXPECT_FALSE(readable(ch->ibv.fd));
}

TEST_F(ChannelTest, NextCompletionArmWinsOverSolicitedOnly) {
  // Solicited-only, then next: the stronger request holds.
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  EXPECT_EQ(event(), cq->cq());

  // Next, then solicited-only: a solicited-only request does not weaken an armed "next"
  // (IBA 11.4.2.2).
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(2), false));
  EXPECT_EQ(event(), cq->cq());
}

TEST_F(ChannelTest, EventsOfSeveralCqsShareOneChannelInOrder) {
  int other_marker = 0;
  Cq* other = make_cq(4, ch, &other_marker);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_EQ(req_notify_cq(other, 0), 0);
  ASSERT_TRUE(cq_push(other, make_wc(1), false));
  ASSERT_TRUE(cq_push(cq, make_wc(2), false));
  void* c = nullptr;
  EXPECT_EQ(event(&c), other->cq());
  EXPECT_EQ(c, &other_marker);
  EXPECT_EQ(event(&c), cq->cq());
  EXPECT_EQ(c, &marker);
  EXPECT_EQ(event(), nullptr);
  ack_cq_events(other, 1);
  EXPECT_EQ(destroy_cq(other), 0);
}

TEST_F(ChannelTest, GetCqEventOnNonBlockingChannelFailsWithEagain) {
  int flags = fcntl(ch->ibv.fd, F_GETFL);
  ASSERT_EQ(fcntl(ch->ibv.fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_cq* got = nullptr;
  void* c = nullptr;
  errno = 0;
  EXPECT_EQ(get_cq_event(ch, &got, &c), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(ChannelTest, GetCqEventBlocksUntilAnArmedCqCompletes) {
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  std::atomic<bool> pushed{false};
  std::atomic<bool> early{false};
  ibv_cq* got = nullptr;
  int rc = -2;
  std::thread waiter([&] {
    void* c;
    rc = get_cq_event(ch, &got, &c);
    early = !pushed.load();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pushed = true;
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  waiter.join();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(got, cq->cq());
  EXPECT_FALSE(early.load()) << "get_cq_event returned before any completion";
  ++unacked;
}

TEST_F(ChannelTest, DestroyWaitsForDeliveredEventsToBeAcked) {
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  ASSERT_EQ(next_event(ch), cq->cq());  // delivered, not yet acked
  Cq* victim = std::exchange(cq, nullptr);
  expect_destroy_waits_for_ack([&] { EXPECT_EQ(destroy_cq(victim), 0); },
                               [&] { ack_cq_events(victim, 1); });
}

TEST_F(ChannelTest, DestroyDropsEventsNotYetDelivered) {
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  ASSERT_TRUE(readable(ch->ibv.fd));
  EXPECT_EQ(destroy_cq(std::exchange(cq, nullptr)), 0) << "an undelivered event needs no ack";
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the destroyed CQ's event is gone from the channel";
}

TEST_F(ChannelTest, DestroyCompChannelIsEbusyWhileACqUsesIt) {
  EXPECT_EQ(destroy_comp_channel(ch), EBUSY);
  // Still usable after the refusal.
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  ASSERT_TRUE(cq_push(cq, make_wc(1), false));
  EXPECT_EQ(event(), cq->cq());
}

TEST_F(CqTest, DestroyWaitsForDeliveredAsyncEventsToBeAcked) {
  Cq* cq = make_cq(1);
  ASSERT_NE(cq, nullptr);
  push_n(cq, cq->cq()->cqe);
  ASSERT_FALSE(cq_push(cq, make_wc(99), false));
  ibv_async_event ev{};
  ASSERT_EQ(get_async_event(ctx, &ev), 0);
  ASSERT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  expect_destroy_waits_for_ack([&] { EXPECT_EQ(destroy_cq(cq), 0); },
                               [&] { ack_async_event(&ev); });
}

TEST_F(CqTest, CreateCqRejectsAChannelOfAnotherContext) {
  ibv_context* other_ibv = open_context(Device::instance().ibv());
  ASSERT_NE(other_ibv, nullptr);
  Context* other = Context::from(other_ibv);
  CompChannel* foreign = CompChannel::from(create_comp_channel(other));
  ASSERT_NE(foreign, nullptr);
  EXPECT_EQ(create_errno([&] { return create_cq(ctx, 4, nullptr, foreign, 0); }), EINVAL);
  EXPECT_EQ(destroy_comp_channel(foreign), 0);
  EXPECT_EQ(close_context(other), 0);
}

TEST_F(CqTest, ResizeKeepsEntriesInOrder) {
  Cq* cq = make_cq(4);
  ASSERT_NE(cq, nullptr);
  push_n(cq, 3);
  ibv_wc wc[256];
  ASSERT_EQ(poll_cq(cq, 1, wc), 1);  // head no longer at the ring's start
  push_n(cq, 1, 4);
  ASSERT_EQ(resize_cq(cq, 100), 0);
  EXPECT_GE(cq->cq()->cqe, 100);
  ASSERT_EQ(poll_cq(cq, 256, wc), 3);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[1].wr_id, 3u);
  EXPECT_EQ(wc[2].wr_id, 4u);
  // The new size is usable in full.
  const int cap = cq->cq()->cqe;
  push_n(cq, cap, 10);
  ASSERT_EQ(poll_cq(cq, 256, wc), std::min(cap, 256));
  EXPECT_EQ(wc[0].wr_id, 10u);
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, ResizeRefusesToShrinkBelowTheQueuedCount) {
  Cq* cq = make_cq(32);
  ASSERT_NE(cq, nullptr);
  push_n(cq, 10);
  EXPECT_EQ(resize_cq(cq, 4), EINVAL);
  EXPECT_EQ(resize_cq(cq, 0), EINVAL);
  EXPECT_GE(cq->cq()->cqe, 32) << "a refused resize leaves the CQ as it was";
  ibv_wc wc[32];
  ASSERT_EQ(poll_cq(cq, 32, wc), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(wc[i].wr_id, uint64_t(i + 1));
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, ResizeChecksTheRequestNotTheRoundedSize) {
  // ibv_resize_cq(3): "cqe must be at least the number of unpolled entries in the CQ",
  // whatever size the device would round the request up to (rxe checks the same).
  Cq* cq = make_cq(32);
  ASSERT_NE(cq, nullptr);
  push_n(cq, 10);
  EXPECT_EQ(resize_cq(cq, 9), EINVAL);
  ibv_wc wc[32];
  EXPECT_EQ(poll_cq(cq, 32, wc), 10);
  EXPECT_EQ(destroy_cq(cq), 0);
}

TEST_F(CqTest, ResizeDownToTheQueuedCountKeepsThem) {
  Cq* cq = make_cq(64);
  ASSERT_NE(cq, nullptr);
  push_n(cq, 10);
  ASSERT_EQ(resize_cq(cq, 10), 0);
  EXPECT_GE(cq->cq()->cqe, 10);
  ibv_wc wc[64];
  ASSERT_EQ(poll_cq(cq, 64, wc), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(wc[i].wr_id, uint64_t(i + 1));
  EXPECT_EQ(destroy_cq(cq), 0);
}

}  // namespace
}  // namespace softverbs::unit
