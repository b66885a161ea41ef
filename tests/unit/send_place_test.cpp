// Large SENDs placed by the requester (engine/shm_send_place.cpp): the receive window's
// layout with the receive places (wire/shm/recv_place.hpp), and which receives the target
// publishes as placeable (publish_place) and how.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <shared_mutex>
#include <vector>

#include "engine/engine.hpp"
#include "unit_support.hpp"
#include "wire/shm/window.hpp"

namespace softverbs::unit {
namespace {

TEST(SendPlaceLayout, PlacesLieBetweenCapacitiesAndSlots) {
  for (uint32_t rq_cap : {2u, 64u, 1024u, 1u << 20}) {
    uint64_t places = wire::window_places_at(sizeof(wire::WindowHeader), rq_cap);
    uint64_t bytes = wire::window_bytes(rq_cap);
    uint64_t slots = bytes - uint64_t{wire::kWindowSlots} * sizeof(wire::WindowSlot);
    EXPECT_EQ(places % 64, 0u) << rq_cap;
    EXPECT_GE(places, sizeof(wire::WindowHeader) + uint64_t{rq_cap} * 4) << rq_cap;  // after rq_len
    EXPECT_EQ(places + uint64_t{rq_cap} * sizeof(wire::RecvPlace), slots) << rq_cap;
    EXPECT_EQ(slots % 64, 0u) << rq_cap;
  }
}

class SendPlaceTest : public ContextTest {
 protected:
  void SetUp() override {
    ContextTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    pd = make_pd();
    ASSERT_NE(pd, nullptr);
    buf = static_cast<char*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(buf, MAP_FAILED);
  }
  void TearDown() override {
    for (Mr* m : mrs) EXPECT_EQ(dereg_mr(m), 0);
    if (buf) munmap(buf, kLen);
    if (pd) {
      EXPECT_EQ(dealloc_pd(pd), 0);
    }
    ContextTest::TearDown();
  }
  Mr* reg(size_t off, size_t len, unsigned access) {
    ibv_mr* m = reg_mr(pd, buf + off, len, reinterpret_cast<uintptr_t>(buf + off), access);
    EXPECT_NE(m, nullptr) << "reg_mr: errno " << errno;
    if (m) mrs.push_back(Mr::from(m));
    return m ? Mr::from(m) : nullptr;
  }
  uint64_t at(size_t off) const { return reinterpret_cast<uintptr_t>(buf + off); }
  wire::RecvPlace publish(const RecvWqe& r, uint32_t capacity) {
    wire::RecvPlace p{};
    p.nsge = 77;  // whatever the slot held before
    std::shared_lock keys(MrTable::instance().lock());
    engine::publish_place(p, r, capacity);
    return p;
  }

  static constexpr size_t kLen = 1 << 20;
  Pd* pd = nullptr;
  char* buf = nullptr;
  std::vector<Mr*> mrs;
};

TEST_F(SendPlaceTest, ReceiveBuffersArePublishedInOrderWithoutEmptyOnes) {
  Mr* a = reg(0, 65536, IBV_ACCESS_LOCAL_WRITE);
  Mr* b = reg(65536, 65536, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(a && b);
  RecvWqe r;
  r.sges.resize(4);
  r.sges[0] = {at(100), 1000, a->ibv.lkey};
  r.sges[1] = {at(200), 0, a->ibv.lkey};  // empty: no place of its own
  r.sges[2] = {at(70000), 3000, b->ibv.lkey};
  r.sges[3] = {at(5000), 1000, a->ibv.lkey};
  wire::RecvPlace p = publish(r, 5000);
  ASSERT_EQ(p.nsge, 3u);
  EXPECT_EQ(p.sge[0].addr, at(100));
  EXPECT_EQ(p.sge[0].length, 1000u);
  EXPECT_EQ(p.sge[0].lkey, a->ibv.lkey);
  EXPECT_EQ(p.sge[1].addr, at(70000));
  EXPECT_EQ(p.sge[1].lkey, b->ibv.lkey);
  EXPECT_EQ(p.sge[2].addr, at(5000));
}

TEST_F(SendPlaceTest, WhatTheRequesterMustNotPlaceIsNotPublished) {
  Mr* a = reg(0, 65536, IBV_ACCESS_LOCAL_WRITE);
  Mr* odp = reg(65536, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_TRUE(a && odp);
  RecvWqe r;
  r.sges.resize(1);
  r.sges[0] = {at(0), 4096, a->ibv.lkey};
  EXPECT_EQ(publish(r, 0).nsge, 0u) << "a receive that failed its checks (capacity 0)";
  r.sges[0] = {at(65536), 4096, odp->ibv.lkey};
  EXPECT_EQ(publish(r, 4096).nsge, 0u) << "on-demand paging: the agent faults the pages in";
  r.sges.resize(wire::kPlaceSges + 1);
  for (uint32_t i = 0; i <= wire::kPlaceSges; ++i) r.sges[i] = {at(i * 4096), 4096, a->ibv.lkey};
  EXPECT_EQ(publish(r, 4096 * (wire::kPlaceSges + 1)).nsge, 0u) << "more buffers than a place holds";
  r.sges.resize(wire::kPlaceSges);
  EXPECT_EQ(publish(r, 4096 * wire::kPlaceSges).nsge, wire::kPlaceSges);
}

TEST_F(SendPlaceTest, LocalWriteMrsMoveToTheSharedMemfd) {
  // A peer's SEND lands in LOCAL_WRITE memory: registered page-aligned private memory
  // moves where the peer can copy into it (decision 0005), unless turned off.
  Mr* a = reg(0, 65536, IBV_ACCESS_LOCAL_WRITE);
  Mr* ro = reg(65536, 65536, 0);
  ASSERT_TRUE(a && ro);
  if (getenv("SOFTVERBS_NO_SHARED_MR")) GTEST_SKIP() << "SOFTVERBS_NO_SHARED_MR set";
  EXPECT_NE(a->shm, 0u);
  EXPECT_EQ(a->shm_length, 65536u);
  EXPECT_EQ(ro->shm, 0u) << "nothing of a peer's lands in memory without LOCAL_WRITE";
}

}  // namespace
}  // namespace softverbs::unit
