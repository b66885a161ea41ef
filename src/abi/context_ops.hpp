#pragma once
#include "core/objects.hpp"

namespace softverbs::abi {
// Fills every slot of the context's ops tables (ibv_context_ops and verbs_context), as
// rdma-core does: implemented verbs point at us, the rest fail with EOPNOTSUPP. No slot is
// ever NULL, because the inline verbs in <infiniband/verbs.h> call some of them unchecked.
void fill_context_ops(Context* ctx);
}
