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
  uint32_t rnr = 0;                // the peer has no receive: RNR NAK
  int rnr_timer = -1;              // its min_rnr_timer code; -1: this QP's own
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
  bool any_fault() const { return fail || rnr || drop || delay || dup; }
  // A QP whose peer is on another host: its next datagrams lost or sent twice on the wire
  // (engine/roce.cpp's send_packet, under the link's lock, not sq_mu).
  std::atomic<uint32_t> wire_drop{0};
  std::atomic<uint32_t> wire_dup{0};
};

// Takes one from a wire counter; false when it was 0.
inline bool take_one(std::atomic<uint32_t>& n) {
  uint32_t v = n.load(std::memory_order_relaxed);
  while (v && !n.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) {
  }
  return v != 0;
}

}  // namespace softverbs
