// The XRC SRQs of this process by number (ibv_get_srq_num): what a responder looks up
// when an XRC message names one (XRCETH). Numbers are built like QP numbers (this
// process's registry slot in the high bits), so that one never names an SRQ of another
// process of this host by accident.
#include <map>
#include <mutex>
#include <shared_mutex>

#include "core/core.hpp"
#include "wire/registry.hpp"

namespace softverbs {

namespace {

std::shared_mutex g_mu;
std::map<uint32_t, Srq*> g_srqs;
uint32_t g_next_index = 0;

}  // namespace

std::shared_mutex& xrc_srq_lock() { return g_mu; }

Srq* find_xrc_srq_locked(uint32_t srq_num, const XrcDomain* domain) {
  auto it = g_srqs.find(srq_num);
  if (it == g_srqs.end() || it->second->xrc_domain.get() != domain) return nullptr;
  return it->second;
}

Srq* find_shared_xrc_srq_locked(uint32_t srq_num, uint64_t dev, uint64_t ino) {
  auto it = g_srqs.find(srq_num);
  if (it == g_srqs.end()) return nullptr;
  const XrcDomain* d = it->second->xrc_domain.get();
  if (!d || !d->shared || static_cast<uint64_t>(d->dev) != dev || static_cast<uint64_t>(d->ino) != ino)
    return nullptr;
  return it->second;
}

uint32_t add_xrc_srq(Srq* srq) {
  const uint32_t base = static_cast<uint32_t>(wire::my_slot()) << wire::kQpnSlotShift;
  std::unique_lock lock(g_mu);
  for (uint32_t tries = 0; tries <= wire::kQpnIndexMask; ++tries) {
    g_next_index = (g_next_index + 1) & wire::kQpnIndexMask;
    uint32_t n = base | g_next_index;
    if (n < 2 || n >= 0xffffff || g_srqs.count(n)) continue;
    g_srqs[n] = srq;
    return n;
  }
  return 0;
}

void remove_xrc_srq(uint32_t srq_num) {
  std::unique_lock lock(g_mu);  // waits for every responder still using it
  g_srqs.erase(srq_num);
}

}  // namespace softverbs
