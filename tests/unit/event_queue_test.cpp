// EventQueue: the fd-backed FIFO behind completion channels and the async event fd.
#include "core/event_queue.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <thread>
#include <vector>

#include "unit_support.hpp"

namespace softverbs::unit {
namespace {

class EventQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(q.open(), 0);
    ASSERT_GE(q.fd(), 0);
  }

  // Pops without a delivery callback.
  bool pop(int* out) {
    return q.try_pop(out, [](int) {});
  }

  EventQueue<int> q;
};

TEST_F(EventQueueTest, FdReadableExactlyWhileNonEmpty) {
  EXPECT_FALSE(readable(q.fd()));
  EXPECT_TRUE(q.empty());
  q.push(1);
  EXPECT_TRUE(readable(q.fd()));
  q.push(2);
  EXPECT_TRUE(readable(q.fd()));
  int v = 0;
  ASSERT_TRUE(pop(&v));
  EXPECT_TRUE(readable(q.fd())) << "one item is still queued";
  ASSERT_TRUE(pop(&v));
  EXPECT_FALSE(readable(q.fd()));
  EXPECT_TRUE(q.empty());
  // And again after being drained: the level follows every empty/non-empty change.
  q.push(3);
  EXPECT_TRUE(readable(q.fd()));
  ASSERT_TRUE(pop(&v));
  EXPECT_FALSE(readable(q.fd()));
}

TEST_F(EventQueueTest, FifoOrder) {
  for (int i = 0; i < 100; ++i) q.push(i);
  for (int i = 0; i < 100; ++i) {
    int v = -1;
    ASSERT_TRUE(pop(&v));
    EXPECT_EQ(v, i);
  }
  int v;
  EXPECT_FALSE(pop(&v));
}

TEST_F(EventQueueTest, TryPopOnEmptyReturnsFalseAndLeavesOutput) {
  int v = 42;
  bool delivered = false;
  EXPECT_FALSE(q.try_pop(&v, [&](int) { delivered = true; }));
  EXPECT_EQ(v, 42);
  EXPECT_FALSE(delivered);
}

TEST_F(EventQueueTest, WaitPopNonBlockingOnEmptyFailsWithEagain) {
  int flags = fcntl(q.fd(), F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(fcntl(q.fd(), F_SETFL, flags | O_NONBLOCK), 0);
  int v = 0;
  errno = 0;
  EXPECT_EQ(q.wait_pop(&v, [](int) {}), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Non-blocking does not mean failing when there is something to pop.
  q.push(7);
  EXPECT_EQ(q.wait_pop(&v, [](int) {}), 0);
  EXPECT_EQ(v, 7);
}

TEST_F(EventQueueTest, WaitPopReturnsAtOnceWhenNonEmpty) {
  q.push(5);
  int v = 0;
  EXPECT_EQ(q.wait_pop(&v, [](int) {}), 0);
  EXPECT_EQ(v, 5);
}

TEST_F(EventQueueTest, WaitPopBlocksUntilAnotherThreadPushes) {
  std::atomic<bool> pushed{false};
  std::atomic<bool> returned{false};
  std::atomic<bool> returned_before_push{false};
  int got = 0;
  int rc = -2;
  std::thread waiter([&] {
    rc = q.wait_pop(&got, [](int) {});
    returned_before_push = !pushed.load();
    returned = true;
  });
  // Give the waiter a chance to block; correctness does not depend on how long this is.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(returned.load()) << "wait_pop returned on an empty queue";
  pushed = true;
  q.push(99);
  waiter.join();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(got, 99);
  EXPECT_FALSE(returned_before_push.load());
  EXPECT_FALSE(readable(q.fd()));
}

TEST_F(EventQueueTest, ManyWaitersEachGetOneItem) {
  constexpr int kThreads = 4;
  std::vector<int> got(kThreads, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] { EXPECT_EQ(q.wait_pop(&got[i], [](int) {}), 0); });
  for (int i = 0; i < kThreads; ++i) q.push(100 + i);
  for (auto& t : threads) t.join();
  std::vector<bool> seen(kThreads, false);
  for (int v : got) {
    ASSERT_GE(v, 100);
    ASSERT_LT(v, 100 + kThreads);
    EXPECT_FALSE(seen[v - 100]) << v << " delivered twice";
    seen[v - 100] = true;
  }
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(readable(q.fd()));
}

TEST_F(EventQueueTest, RemoveIfRemovesMatchingItemsAndKeepsOrder) {
  for (int i = 1; i <= 6; ++i) q.push(i);
  EXPECT_EQ(q.remove_if([](int v) { return v % 2 == 0; }), 3u);
  EXPECT_TRUE(readable(q.fd()));
  for (int want : {1, 3, 5}) {
    int v = 0;
    ASSERT_TRUE(pop(&v));
    EXPECT_EQ(v, want);
  }
  EXPECT_FALSE(readable(q.fd()));
}

TEST_F(EventQueueTest, RemoveIfEmptyingTheQueueLowersReadability) {
  q.push(1);
  q.push(1);
  ASSERT_TRUE(readable(q.fd()));
  EXPECT_EQ(q.remove_if([](int v) { return v == 1; }), 2u);
  EXPECT_FALSE(readable(q.fd()));
  EXPECT_TRUE(q.empty());
  int v;
  EXPECT_FALSE(pop(&v));
  // The level still works after being lowered by remove_if.
  q.push(2);
  EXPECT_TRUE(readable(q.fd()));
}

TEST_F(EventQueueTest, RemoveIfWithoutMatchKeepsReadability) {
  q.push(1);
  EXPECT_EQ(q.remove_if([](int v) { return v == 2; }), 0u);
  EXPECT_TRUE(readable(q.fd()));
  EXPECT_EQ(q.remove_if([](int) { return false; }), 0u);
  EXPECT_TRUE(readable(q.fd()));
}

TEST_F(EventQueueTest, RemoveIfOnEmptyQueue) {
  EXPECT_EQ(q.remove_if([](int) { return true; }), 0u);
  EXPECT_FALSE(readable(q.fd()));
  q.push(4);
  EXPECT_TRUE(readable(q.fd()));
}

TEST_F(EventQueueTest, DeliverRunsOnceForEachPoppedItem) {
  std::vector<int> delivered;
  q.push(10);
  q.push(20);
  q.push(30);
  int v = 0;
  ASSERT_TRUE(q.try_pop(&v, [&](int x) { delivered.push_back(x); }));
  EXPECT_EQ(q.wait_pop(&v, [&](int x) { delivered.push_back(x); }), 0);
  ASSERT_TRUE(q.try_pop(&v, [&](int x) { delivered.push_back(x); }));
  EXPECT_FALSE(q.try_pop(&v, [&](int x) { delivered.push_back(x); }));
  EXPECT_EQ(delivered, (std::vector<int>{10, 20, 30}));
}

// A completion channel's waiter compares the peers' wake-ups with the hints they left
// (verbs/cq.cpp): refill gets how many came since the last look, each counted once.
TEST_F(EventQueueTest, RefillGetsThePeersWakeupsOnce) {
  const int wake = q.write_fd();
  uint64_t three = 3;
  ASSERT_EQ(write(wake, &three, sizeof(three)), static_cast<ssize_t>(sizeof(three)));
  std::vector<uint64_t> seen;
  int v = 0;
  auto refill = [&](uint64_t wakeups) {
    seen.push_back(wakeups);
    if (seen.size() == 1) q.push(7);
  };
  ASSERT_EQ(q.wait_pop(&v, [](int) {}, refill), 0);
  EXPECT_EQ(v, 7);
  q.push(8);
  ASSERT_EQ(q.wait_pop(&v, [](int) {}, refill), 0);
  EXPECT_EQ(seen, (std::vector<uint64_t>{3, 0}));
  EXPECT_FALSE(readable(q.fd()));
}

TEST(EventQueueFds, CloseFdsIsIdempotentAndFdsAreCloexec) {
  EventQueue<int> q;
  EXPECT_EQ(q.fd(), -1);
  ASSERT_EQ(q.open(), 0);
  int fd = q.fd();
  int fdflags = fcntl(fd, F_GETFD);
  ASSERT_GE(fdflags, 0);
  EXPECT_TRUE(fdflags & FD_CLOEXEC);
  q.close_fds();
  EXPECT_EQ(q.fd(), -1);
  q.close_fds();
  EXPECT_EQ(q.fd(), -1);
}

}  // namespace
}  // namespace softverbs::unit
