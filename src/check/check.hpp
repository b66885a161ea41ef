// The verbs-usage checker (`softverbs check`, SOFTVERBS_CHECK=1; docs/check.md): the C ABI
// (src/abi) calls these around the verbs when `enabled`, and swaps the data-path ops of each
// context for checking ones (wrap_ops), so that with checking off a call costs at most the
// test of one flag that never changes. Each misuse is reported once per object and kind,
// with the call, the object and the man page's rule; at exit, leaks and a summary table.
#pragma once

#include <infiniband/verbs.h>

#include "core/objects.hpp"

namespace softverbs::check {

// SOFTVERBS_CHECK was set (to anything but "" or "0") when the library was loaded.
extern bool enabled;

// Where the application called us: the return address of our exported function.
using Site = const void*;

enum class Kind : uint8_t { Context, Pd, Mr, Mw, Cq, Channel, Qp, Srq, Ah };

// Object lifetimes: what leaks at exit, what keeps a PD busy, whose key was deregistered.
// `parent`: the PD (MR, MW, QP, SRQ, AH) or context (PD, CQ, channel) it was made on.
void created(Kind kind, const void* handle, const void* parent, Site site);
// A destroy call that is about to run, and its answer `rc` (EBUSY: what still uses it).
void before_destroy_cq(Cq* cq, Site site);
void before_dereg_mr(Mr* mr, Site site);  // its keys are remembered as deregistered
void after_destroy(Kind kind, const void* handle, int rc, Site site);

// Completion events.
void before_get_cq_event(CompChannel* ch, Site site);
void got_cq_event(ibv_cq* cq, Site site);

// Installs the checking versions of the data-path ops (post, poll, arm) in a new context.
void wrap_ops(Context* ctx);

}  // namespace softverbs::check
