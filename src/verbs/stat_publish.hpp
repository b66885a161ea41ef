// Publishing this process's verbs objects for `softverbs stat` (common/stat_segment.hpp).
// Called on the cold paths only: create, modify, destroy. SOFTVERBS_STAT=0 turns it off.
#pragma once

#include "core/objects.hpp"

namespace softverbs::stat {

// Writes (or rewrites) the object's record. Never fails the verb: a full table or a state
// directory that cannot be written only leaves the object out.
void publish(Context* ctx);
void publish(Pd* pd);
void publish(Mr* mr);
void publish(Cq* cq);
void publish(CompChannel* ch);
void publish(Qp* qp);
void publish(Srq* srq);
void publish(Mw* mw);
void publish(Ah* ah);
// `path`: the file the domain was opened on, or "" (fd -1).
void publish(Xrcd* xrcd, const char* path);
void publish(Dm* dm);
// Frees the record of `object` (call before the object is freed).
void withdraw(const void* object);

}  // namespace softverbs::stat
