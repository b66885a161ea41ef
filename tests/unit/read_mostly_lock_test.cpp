// ReadMostlyLock: readers never see a writer's half-done update, readers nest, writers wait
// for readers in flight, and threads that come and go leave no slot behind that a writer
// would wait for. Plain (non-atomic) data under the lock: a real race shows up under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/read_mostly_lock.hpp"

namespace softverbs {
namespace {

struct Table {
  ReadMostlyLock lock;
  long a = 0;  // a == b whenever no writer holds the lock
  long b = 0;
};

TEST(ReadMostlyLock, ReadersSeeWholeUpdatesOnly) {
  Table t;
  std::atomic<bool> stop{false};
  std::atomic<long> torn{0}, reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        std::shared_lock outer(t.lock);
        long a = t.a;
        {
          std::shared_lock inner(t.lock);  // nested read section
          if (t.b != a) torn++;
        }
        if (t.b != t.a) torn++;
        reads++;
      }
    });
  }
  std::thread writer([&] {
    for (long k = 1; k <= 2000; ++k) {
      std::unique_lock w(t.lock);
      t.a = k;
      std::this_thread::yield();  // give a reader every chance to look in between
      t.b = k;
    }
  });
  writer.join();
  stop = true;
  for (auto& th : readers) th.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(t.a, 2000);
  EXPECT_EQ(t.b, 2000);
}

TEST(ReadMostlyLock, WriterWaitsForReaderInFlight) {
  Table t;
  std::atomic<bool> inside{false}, writer_done{false};
  std::thread reader([&] {
    std::shared_lock r(t.lock);
    inside = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // The writer cannot have got in while we are here.
    EXPECT_FALSE(writer_done.load());
    EXPECT_EQ(t.a, 0);
  });
  while (!inside.load()) std::this_thread::yield();
  {
    std::unique_lock w(t.lock);
    t.a = 1;
  }
  writer_done = true;
  reader.join();
  EXPECT_EQ(t.a, 1);
}

TEST(ReadMostlyLock, ThreadsThatExitDoNotHoldWritersUp) {
  Table t;
  for (int round = 0; round < 50; ++round) {
    std::thread reader([&] {
      std::shared_lock r(t.lock);
      EXPECT_EQ(t.a, t.b);
    });
    reader.join();
    std::unique_lock w(t.lock);  // would wait forever on a slot left behind in a read
    ++t.a;
    ++t.b;
  }
  EXPECT_EQ(t.a, 50);
}

TEST(ReadMostlyLock, TwoLocksInOneThread) {
  Table x, y;
  std::shared_lock rx(x.lock);
  std::shared_lock ry(y.lock);
  std::thread writer([&] {
    std::unique_lock w(x.lock);  // waits for this thread's read of x only
    x.a = 1;
  });
  EXPECT_EQ(x.a, 0);
  rx.unlock();
  writer.join();
  EXPECT_EQ(x.a, 1);
  ry.unlock();
}

}  // namespace
}  // namespace softverbs
