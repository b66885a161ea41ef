// Where the layers below the verbs calls tell the usage checker (src/check/, `softverbs
// check`) what only they see: a CQ that overran, a send that met an RNR NAK. The checker
// sets these when SOFTVERBS_CHECK is on; otherwise they stay null and each site costs one
// load of a pointer, on paths that are slow anyway (an overrun, an RNR wait).
#pragma once

namespace softverbs {
struct Cq;
struct Qp;

namespace check_hooks {
inline void (*cq_overrun)(Cq* cq) = nullptr;   // the completion that overran the CQ
inline void (*rnr_wait)(Qp* qp) = nullptr;     // a send of `qp` waits: the peer had no receive
}  // namespace check_hooks
}  // namespace softverbs
