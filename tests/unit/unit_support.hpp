// Helpers shared by the unit tests: a fixture that opens a device context through the core
// API, fd readiness checks, and bounded waits for completions that a progress thread may
// produce. Nothing here asserts on timing: waits only bound how long a broken build hangs.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "core/device.hpp"
#include "verbs/verbs.hpp"

namespace softverbs::unit {

inline constexpr std::chrono::seconds kWaitLimit{5};

// True if `fd` is readable right now (poll with a zero timeout).
inline bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// A readable name for a completion status (the core has no ibv_wc_status_str).
inline const char* status_name(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "SUCCESS";
    case IBV_WC_LOC_LEN_ERR: return "LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR: return "LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR: return "LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR: return "WR_FLUSH_ERR";
    case IBV_WC_REM_INV_REQ_ERR: return "REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR: return "REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR: return "REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR_RETRY_EXC_ERR";
    default: return "other";
  }
}

// A completion as the engine would write it; only wr_id/status/opcode matter to the CQ.
inline ibv_wc make_wc(uint64_t wr_id, ibv_wc_status status = IBV_WC_SUCCESS,
                      ibv_wc_opcode opcode = IBV_WC_RECV) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  return wc;
}

// Polls `cq` until `n` completions have arrived, the CQ reports an error, or kWaitLimit
// has passed; returns what it found (the caller checks the count).
inline std::vector<ibv_wc> poll_until(Cq* cq, size_t n) {
  std::vector<ibv_wc> out;
  auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  while (out.size() < n) {
    ibv_wc wc[8];
    // Never take more than asked for: the rest stays queued for the caller's next look.
    int got = poll_cq(cq, static_cast<int>(std::min<size_t>(8, n - out.size())), wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got == 0) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return out;
}

// Waits (bounded) until `pred()` holds; returns its last value.
template <typename P>
bool eventually(P&& pred) {
  auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// errno of a constructor call (create_cq, create_qp, ...) that is expected to fail; 0 if it
// returned an object after all (the test then fails; the object is not cleaned up).
template <typename F>
int create_errno(F&& create) {
  errno = 0;
  return create() ? 0 : errno;
}

// Checks that `destroy` (run on another thread) does not return before `ack` (run here)
// has begun. The short pause only gives a wrong destroy the chance to return early; the
// verdict comes from the order of two atomic flags, not from timing.
template <typename D, typename A>
void expect_destroy_waits_for_ack(D&& destroy, A&& ack) {
  std::atomic<bool> acked{false};
  std::atomic<bool> returned_before_ack{false};
  std::thread destroyer([&] {
    destroy();
    returned_before_ack = !acked.load();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  acked = true;
  ack();
  destroyer.join();
  EXPECT_FALSE(returned_before_ack.load()) << "destroy returned while an event was unacked";
}

// Opens a context on the soft device for each test and closes it afterwards.
class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ibv_context* c = open_context(Device::instance().ibv());
    ASSERT_NE(c, nullptr) << "open_context: errno " << errno;
    ctx = Context::from(c);
    ASSERT_NE(ctx, nullptr);
  }
  void TearDown() override {
    if (ctx) {
      EXPECT_EQ(close_context(ctx), 0);
    }
  }

  Pd* make_pd() {
    ibv_pd* p = alloc_pd(ctx);
    EXPECT_NE(p, nullptr) << "alloc_pd: errno " << errno;
    return p ? Pd::from(p) : nullptr;
  }
  Cq* make_cq(int cqe, CompChannel* ch = nullptr, void* cq_context = nullptr) {
    ibv_cq* c = create_cq(ctx, cqe, cq_context, ch, 0);
    EXPECT_NE(c, nullptr) << "create_cq: errno " << errno;
    return c ? Cq::from(c) : nullptr;
  }
  CompChannel* make_channel() {
    ibv_comp_channel* c = create_comp_channel(ctx);
    EXPECT_NE(c, nullptr) << "create_comp_channel: errno " << errno;
    return c ? CompChannel::from(c) : nullptr;
  }

  Context* ctx = nullptr;
};

}  // namespace softverbs::unit
