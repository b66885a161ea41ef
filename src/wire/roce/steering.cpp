// The reuseport group's classic BPF program (see steering.hpp).
#include "wire/roce/steering.hpp"

#include <algorithm>

#include "wire/registry.hpp"

namespace softverbs::wire::roce {

namespace {

// Emits a binary search over routes[lo, hi) (sorted by slot) on A = slot; every miss
// returns `fallback`. Conditional jumps only skip one instruction; long ones are `ja`.
void emit_search(std::vector<sock_filter>& code, const std::vector<Route>& routes, size_t lo,
                 size_t hi, uint32_t fallback) {
  if (hi - lo <= 3) {
    for (size_t i = lo; i < hi; ++i) {
      code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, routes[i].slot, 0, 1));
      code.push_back(BPF_STMT(BPF_RET | BPF_K, routes[i].index));
    }
    code.push_back(BPF_STMT(BPF_RET | BPF_K, fallback));
    return;
  }
  const size_t mid = lo + (hi - lo) / 2;
  code.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, routes[mid].slot, 0, 1));
  const size_t to_right = code.size();
  code.push_back(BPF_STMT(BPF_JMP | BPF_JA, 0));
  emit_search(code, routes, lo, mid, fallback);
  code[to_right].k = uint32_t(code.size() - to_right - 1);
  emit_search(code, routes, mid, hi, fallback);
}

}  // namespace

std::vector<sock_filter> steering_program(std::vector<Route> routes, uint32_t fallback) {
  std::stable_sort(routes.begin(), routes.end(),
                   [](const Route& a, const Route& b) { return a.slot < b.slot; });
  routes.erase(std::unique(routes.begin(), routes.end(),
                           [](const Route& a, const Route& b) { return a.slot == b.slot; }),
               routes.end());
  std::vector<sock_filter> code = {
      BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
      // A load past the end would end the program with 0, i.e. index 0: check first.
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 8, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, kNoIndex),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kProbeBytes, 0, 5),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kProbeMagic, 1, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kNudgeMagic, 0, 2),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
      BPF_STMT(BPF_RET | BPF_A, 0),
      // BTH bytes 4..7: reserved, DestQP (24 bits, big-endian).
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xffffff),
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, kQpnSlotShift),
  };
  emit_search(code, routes, 0, routes.size(), fallback);
  return code;
}

int destination_slot(const uint8_t* payload, size_t size) {
  if (size < 8) return -1;
  const uint32_t qpn = uint32_t(payload[5]) << 16 | uint32_t(payload[6]) << 8 | payload[7];
  return slot_of_qpn(qpn);
}

}  // namespace softverbs::wire::roce
