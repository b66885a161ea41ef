// What `softverbs inject` and `softverbs trace` hang on a QP, and the one process-wide flag
// that says whether any of it is in use. The send path tests the flag once per work request
// (engine/requester.cpp run_wqe, verbs/qp.cpp's post_now shortcut) and, while it is clear,
// never looks at the rest: off, both tools cost one predictable branch.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

namespace softverbs {

// Set for good once this process traces (SOFTVERBS_TRACE) or was given a fault to inject.
inline std::atomic<bool> g_debug_hooks{false};
inline bool debug_hooks_armed() {
  return __builtin_expect(g_debug_hooks.load(std::memory_order_relaxed), 0);
}

// Faults armed on one QP's send queue (verbs/inject.cpp arms them, engine/inject.cpp spends
// them) and the sequence numbers the same-host trace gives its packets. Under the QP's
// sq_mu.
struct QpDebug {
  // Each counter is the number of coming work requests / messages the fault still applies to.
  uint32_t fail = 0;               // complete with fail_status, as the NIC reports it
  ibv_wc_status fail_status = IBV_WC_GENERAL_ERR;
  uint32_t drop = 0;               // lost on the way (RC: retransmitted after the timeout)
  uint32_t delay = 0;              // held back delay_ms before it goes
  uint32_t delay_ms = 0;
  uint32_t dup = 0;                // sent twice
  bool head_delayed = false;       // the head WQE already had its delay
  // The same-host trace (engine/trace_shm.cpp): next request PSN and the responder's MSN.
  bool psn_known = false;
  uint32_t psn_base = 0;   // the sq_psn it counted from
  uint32_t psn = 0;
  uint32_t last_psns = 0;  // PSNs the last request took (a duplicate reuses them)
  uint32_t msn = 0;
  bool any_fault() const { return fail || drop || delay || dup; }
  // A QP whose peer is on another host: its next datagrams lost or sent twice on the wire
  // (engine/roce.cpp's send_packet, under the link's lock, not sq_mu).
  std::atomic<uint32_t> wire_drop{0};
  std::atomic<uint32_t> wire_dup{0};
  // ---- responder faults (engine/debug_respond.cpp, the RoCE link's responder): what this
  // QP does with the requests that reach it, same host or wire. Armed by the watcher
  // thread, spent by whichever thread runs the responder: atomics, no lock.
  std::atomic<uint32_t> resp_rnr{0};      // the next messages that need a receive find none
  std::atomic<int> resp_rnr_timer{-1};    // the RNR NAK's timer code; -1: min_rnr_timer
  std::atomic<uint32_t> resp_fail{0};     // the next requests fail here with resp_status:
  std::atomic<int> resp_status{0};        // REM_* (NAKed) or LOC_LEN/LOC_PROT (a receive)
  bool responder_faults() const {
    return resp_rnr.load(std::memory_order_relaxed) || resp_fail.load(std::memory_order_relaxed);
  }
  // ---- end responder faults
};

// Takes one from a wire counter; false when it was 0.
inline bool take_one(std::atomic<uint32_t>& n) {
  uint32_t v = n.load(std::memory_order_relaxed);
  while (v && !n.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) {
  }
  return v != 0;
}

}  // namespace softverbs
