// The TM-SRQ matching list and the tag matching headers (see tag_list.hpp).
#include "core/tag_list.hpp"

#include <endian.h>

#include <cstring>

namespace softverbs {

namespace {
uint32_t load_be32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return be32toh(v);
}
uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return be64toh(v);
}
}  // namespace

std::optional<TmHeader> parse_tm_header(const uint8_t* bytes, uint32_t n) {
  if (n < kTmhBytes) return std::nullopt;
  TmHeader h;
  h.op = bytes[0];
  // The reserved bytes are not checked: rdma-core's own test leaves payload bytes there.
  if (h.op > kTmhEager) return std::nullopt;
  h.app_ctx = load_be32(bytes + 4);
  h.tag = load_be64(bytes + 8);
  if (h.op == kTmhRndv) {
    if (n < kTmhBytes + kRvhBytes) return std::nullopt;
    h.va = load_be64(bytes + 16);
    h.rkey = load_be32(bytes + 24);
    h.len = load_be32(bytes + 28);
  }
  return h;
}

void write_tmh(uint8_t* out, uint8_t op, uint32_t app_ctx, uint64_t tag) {
  std::memset(out, 0, kTmhBytes);
  out[0] = op;
  uint32_t ctx = htobe32(app_ctx);
  uint64_t t = htobe64(tag);
  std::memcpy(out + 4, &ctx, 4);
  std::memcpy(out + 8, &t, 8);
}

std::optional<uint32_t> TagList::add(TagEntry entry) {
  for (uint32_t h = 0; h < slots_.size(); ++h) {
    Slot& s = slots_[h];
    if (s.posted) continue;
    s.posted = true;
    s.armed = in_sync();
    s.order = next_order_++;
    s.entry = std::move(entry);
    ++posted_;
    return h;
  }
  return std::nullopt;
}

bool TagList::remove(uint32_t handle) {
  if (handle >= slots_.size() || !slots_[handle].posted) return false;
  slots_[handle].posted = false;
  --posted_;
  return true;
}

std::optional<uint32_t> TagList::find_match(uint64_t tag) const {
  std::optional<uint32_t> best;
  for (uint32_t h = 0; h < slots_.size(); ++h) {
    const Slot& s = slots_[h];
    if (!s.posted || !s.armed || (tag & s.entry.mask) != (s.entry.tag & s.entry.mask)) continue;
    if (!best || s.order < slots_[*best].order) best = h;
  }
  return best;
}

TagEntry TagList::take(uint32_t handle) {
  slots_[handle].posted = false;
  --posted_;
  return std::move(slots_[handle].entry);
}

void TagList::sync(uint32_t handled) {
  handled_ = handled;
  if (!in_sync()) return;
  for (Slot& s : slots_)
    if (s.posted) s.armed = true;
}

}  // namespace softverbs
