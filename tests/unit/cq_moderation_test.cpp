// CQ moderation (ibv_modify_cq): the argument checks, the limits ibv_query_device_ex
// reports, and when a moderated CQ's event fires: at the cq_count-th completion, at the
// period for fewer, at once for an error, never twice per arm, and without leaving the
// channel fd readable. No timing asserts: where the period could have run out meanwhile
// (a preempted test), the test accepts an early event only if the period did pass.
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <future>
#include <thread>

#include "unit_support.hpp"

namespace softverbs::unit {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC, the timer's clock

ibv_modify_cq_attr moderate(uint16_t count, uint16_t period_us,
                            uint32_t mask = IBV_CQ_ATTR_MODERATE) {
  ibv_modify_cq_attr attr{};
  attr.attr_mask = mask;
  attr.moderate.cq_count = count;
  attr.moderate.cq_period = period_us;
  return attr;
}

class ModerationTest : public ContextTest {
 protected:
  void SetUp() override {
    ContextTest::SetUp();
    ch = make_channel();
    ASSERT_NE(ch, nullptr);
    cq = make_cq(64, ch);
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
    ContextTest::TearDown();
  }
  void set(uint16_t count, uint16_t period_us) {
    ibv_modify_cq_attr attr = moderate(count, period_us);
    ASSERT_EQ(modify_cq(cq, &attr), 0);
  }
  void push(uint64_t wr_id, bool solicited = false, ibv_wc_status status = IBV_WC_SUCCESS) {
    ASSERT_TRUE(cq_push(cq, make_wc(wr_id, status), solicited));
  }
  // The next event without blocking: our CQ, or nullptr when none is pending.
  ibv_cq* event() {
    if (!readable(ch->ibv.fd)) return nullptr;
    ibv_cq* got = nullptr;
    void* context = nullptr;
    EXPECT_EQ(get_cq_event(ch, &got, &context), 0);
    if (got == cq->cq()) ++unacked;
    return got;
  }
  // Waits (kWaitLimit at most) for the channel fd, then takes the event.
  ibv_cq* wait_event() {
    pollfd p{ch->ibv.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kWaitLimit.count() * 1000)) != 1) return nullptr;
    return event();
  }
  static double elapsed_us(Clock::time_point since) {
    return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
  }

  CompChannel* ch = nullptr;
  Cq* cq = nullptr;
  unsigned unacked = 0;
};

TEST_F(ModerationTest, ModifyChecksTheMaskAndThePeriod) {
  ibv_modify_cq_attr none = moderate(4, 10, 0);
  EXPECT_EQ(modify_cq(cq, &none), EINVAL) << "no attribute (the kernel's check)";
  ibv_modify_cq_attr reserved = moderate(4, 10, IBV_CQ_ATTR_RESERVED);
  EXPECT_EQ(modify_cq(cq, &reserved), EINVAL) << "a reserved bit (rdma-core's check)";
  ibv_modify_cq_attr both = moderate(4, 10, IBV_CQ_ATTR_MODERATE | IBV_CQ_ATTR_RESERVED);
  EXPECT_EQ(modify_cq(cq, &both), EINVAL);
  ibv_modify_cq_attr too_long = moderate(4, kMaxCqModerationPeriod + 1);
  EXPECT_EQ(modify_cq(cq, &too_long), EINVAL) << "a period over max_cq_period";
  EXPECT_EQ(modify_cq(cq, nullptr), EINVAL);
  ibv_modify_cq_attr most = moderate(kMaxCqModerationCount, kMaxCqModerationPeriod);
  EXPECT_EQ(modify_cq(cq, &most), 0);
  ibv_modify_cq_attr off = moderate(0, 0);
  EXPECT_EQ(modify_cq(cq, &off), 0);
}

TEST_F(ModerationTest, QueryDeviceExReportsTheLimits) {
  ibv_device_attr_ex attr{};
  fill_cq_ex_attr(&attr);
  EXPECT_EQ(attr.cq_mod_caps.max_cq_count, 0xffff);
  EXPECT_EQ(attr.cq_mod_caps.max_cq_period, 0xfff);
}

TEST_F(ModerationTest, ACqWithoutChannelTakesTheSettingAndHasNothingToFire) {
  Cq* plain = make_cq(8);
  ASSERT_NE(plain, nullptr);
  ibv_modify_cq_attr attr = moderate(8, 100);
  EXPECT_EQ(modify_cq(plain, &attr), 0);
  EXPECT_EQ(plain->mod_timer_fd, -1) << "a timer with no channel to wake";
  ASSERT_EQ(req_notify_cq(plain, 0), 0);
  ASSERT_TRUE(cq_push(plain, make_wc(1), false));
  EXPECT_EQ(destroy_cq(plain), 0);
}

TEST_F(ModerationTest, TheEventWaitsForCqCountCompletions) {
  set(4, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  auto first = Clock::now();
  push(1);
  push(2);
  push(3);
  if (ibv_cq* early = event()) {
    EXPECT_EQ(early, cq->cq());
    EXPECT_GE(elapsed_us(first), kMaxCqModerationPeriod) << "fired before count and period";
  } else {
    push(4);
    EXPECT_EQ(event(), cq->cq()) << "the fourth completion fires it";
  }
  EXPECT_EQ(event(), nullptr) << "one event per arm";
  // The deadline was dropped with the event: the timer leaves the fd alone after it.
  std::this_thread::sleep_for(std::chrono::microseconds(2 * kMaxCqModerationPeriod));
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the period's timer outlived the event";
  push(5);
  EXPECT_EQ(event(), nullptr) << "not armed again";
}

TEST_F(ModerationTest, FewerCompletionsFireWhenThePeriodEnds) {
  set(100, 1000);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  auto first = Clock::now();
  push(1);
  EXPECT_EQ(wait_event(), cq->cq()) << "a lone completion's event was lost";
  EXPECT_GE(elapsed_us(first), 1000.0) << "fired before the period";
  EXPECT_FALSE(readable(ch->ibv.fd)) << "the fd stays readable after the event";
  ibv_wc wc[4];
  EXPECT_EQ(poll_cq(cq, 4, wc), 1);
  // Again, with a blocking waiter asleep in ibv_get_cq_event (the timer must wake it).
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  auto waiter = std::async(std::launch::async, [this] {
    ibv_cq* got = nullptr;
    void* context = nullptr;
    return get_cq_event(ch, &got, &context) == 0 ? got : nullptr;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  push(2);
  ASSERT_EQ(waiter.wait_for(kWaitLimit), std::future_status::ready) << "the waiter slept on";
  EXPECT_EQ(waiter.get(), cq->cq());
  ++unacked;
}

// Re-arming while moderation holds an event back queues no early event for the completions
// it holds: that event tells of them when the period ends, once.
TEST_F(ModerationTest, ReArmingOverAHeldEventQueuesNoEarlyOne) {
  set(100, 1000);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  EXPECT_FALSE(readable(ch->ibv.fd)) << "an early event beside the held one";
  EXPECT_EQ(wait_event(), cq->cq());
  EXPECT_EQ(event(), nullptr) << "two events for one completion";
}

TEST_F(ModerationTest, AnErrorCompletionFiresAtOnce) {
  set(100, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1, false, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(event(), cq->cq());
  // Also after successful ones were held.
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(2);
  push(3, false, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(event(), cq->cq());
  EXPECT_EQ(event(), nullptr);
}

TEST_F(ModerationTest, ASolicitedOnlyArmCountsTheCompletionsThatFireIt) {
  set(2, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  push(1);
  push(2);
  push(3);
  EXPECT_EQ(cq->mod_pending, 0u) << "unsolicited completions do not count";
  auto first = Clock::now();
  push(4, true);
  if (ibv_cq* early = event()) {
    EXPECT_EQ(early, cq->cq());
    EXPECT_GE(elapsed_us(first), kMaxCqModerationPeriod);
  } else {
    push(5, true);
    EXPECT_EQ(event(), cq->cq()) << "the second solicited completion fires it";
  }
  // A lone solicited completion still fires, at the period.
  ASSERT_EQ(req_notify_cq(cq, 1), 0);
  push(6, true);
  EXPECT_EQ(wait_event(), cq->cq());
}

TEST_F(ModerationTest, TurningModerationOffFiresWhatItHeld) {
  set(100, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1);
  set(0, 0);
  EXPECT_EQ(event(), cq->cq()) << "a held event is due once nothing holds it";
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(2);
  EXPECT_EQ(event(), cq->cq()) << "no moderation: each arm fires at the first completion";
}

TEST_F(ModerationTest, LoweringTheCountBelowWhatIsHeldFires) {
  set(100, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1);
  push(2);
  push(3);
  set(3, kMaxCqModerationPeriod);
  EXPECT_EQ(event(), cq->cq());
}

TEST_F(ModerationTest, CountOneIsNoModeration) {
  set(1, kMaxCqModerationPeriod);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1);
  EXPECT_EQ(event(), cq->cq());
  EXPECT_EQ(cq->mod_timer_fd, -1) << "nothing to time";
}

TEST_F(ModerationTest, DestroyWithAHeldEventClosesTheTimer) {
  set(100, 1000);
  ASSERT_EQ(req_notify_cq(cq, 0), 0);
  push(1);
  ASSERT_GE(cq->mod_timer_fd, 0);
  EXPECT_EQ(destroy_cq(cq), 0);
  cq = nullptr;
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  EXPECT_FALSE(readable(ch->ibv.fd)) << "a destroyed CQ's timer woke the channel";
}

}  // namespace
}  // namespace softverbs::unit
