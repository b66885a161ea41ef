// common/fast_tls.hpp: one heap object per thread behind an initial-exec pointer, freed at
// the thread's exit, and never handed out freed while the thread is torn down.
#include "common/fast_tls.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace softverbs {
namespace {

std::atomic<int> g_made{0};
std::atomic<int> g_freed{0};

struct Counted {
  Counted() { ++g_made; }
  ~Counted() { ++g_freed; }
  int value = 7;
};

TEST(FastTlsHeap, EachThreadHasItsOwnAndItIsFreedAtExit) {
  using Heap = FastTlsHeap<Counted>;
  g_made = g_freed = 0;
  Counted* mine = &Heap::get();
  EXPECT_EQ(Heap::peek(), mine);
  EXPECT_EQ(&Heap::get(), mine);  // the same one again
  Counted* theirs = nullptr;
  std::thread t([&] {
    EXPECT_EQ(Heap::peek(), nullptr);  // none until asked for
    theirs = &Heap::get();
    theirs->value = 9;
  });
  t.join();
  EXPECT_NE(theirs, mine);
  EXPECT_EQ(g_made.load(), 2);
  EXPECT_EQ(g_freed.load(), 1);  // the thread's, at its exit
  EXPECT_EQ(mine->value, 7);
}

// A thread_local destroyed after the heap's owner asks for it again: it gets a live object,
// not the freed one (ASan would see a use after free), and that one is freed too (LSan).
struct Tag {};
using LateHeap = FastTlsHeap<Counted, Tag>;
std::atomic<int> g_late_value{0};
struct AsksAtExit {
  ~AsksAtExit() {
    Counted& c = LateHeap::get();
    c.value += 1;
    g_late_value = c.value;
  }
};

TEST(FastTlsHeap, AskedForDuringTheThreadsTeardownItIsNeverTheFreedOne) {
  g_made = g_freed = 0;
  std::thread t([] {
    thread_local AsksAtExit asks;  // constructed first: destroyed after the heap's owner
    (void)&asks;
    LateHeap::get().value = 100;
  });
  t.join();
  EXPECT_EQ(g_made.load(), 2);
  EXPECT_EQ(g_freed.load(), 2);
  EXPECT_EQ(g_late_value.load(), 8);  // a fresh object (7 + 1), not the freed one's 101
}

}  // namespace
}  // namespace softverbs
