// A process killed after ESTABLISHED between hosts gets its connections disconnected as its
// kernel would have (the kernel's CM sends a DREQ for each when the process's rdma_cm file
// closes): docs/decisions/0007, "Connections of a dead process". Every CM process publishes
// its established connections in the state directory (cm-established-PID); the host's CM
// process (the lowest live registry slot with a QP1 agent, where DREPs naming a dead slot
// go) notices a published process that is gone, takes its file and sends the DREQs.
#pragma once

#include <cstdint>

#include "cm/ib_cm.hpp"

namespace softverbs::cm {

// Rewrites this process's file when its established connections changed (removes it when
// there are none). `slot` is this process's registry slot. Under g_mu.
void orphans_publish_locked(const ib::Cm& cm, uint32_t slot);
// In the host's CM process, once a second: takes over the connections of every published
// process that died (cm.disconnect_orphan). Under g_mu.
void orphans_scan_locked(ib::Cm& cm, uint32_t slot, ib::Time now);
// When orphans_scan_locked wants to run next.
ib::Time orphans_next_scan_locked();

}  // namespace softverbs::cm
