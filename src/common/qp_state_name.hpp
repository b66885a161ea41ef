// The IBA name of a QP state (enum ibv_qp_state's values), for what softverbs prints about
// QPs: `softverbs check` reports and the `softverbs stat` tables.
#pragma once

#include <cstdint>

namespace softverbs {

// nullptr for a value that is no QP state (the stat tool reads it from another process).
inline const char* qp_state_name(int32_t state) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return state >= 0 && state < 7 ? names[state] : nullptr;
}

}  // namespace softverbs
