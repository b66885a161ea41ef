// Tag matching (ibv_create_srq_ex(3) IBV_SRQT_TM, ibv_post_srq_ops(3), rdma-core's
// Documentation/tag_matching.md): the matching list of a TM-SRQ and the phase counters that
// keep it coherent with the software's unexpected-message handling. Pure bookkeeping, no
// locks (the SRQ's lock guards it), so that unit tests drive it directly.
//
// Matching: an incoming tag T matches a posted entry (tag, mask) when (T & mask) ==
// (tag & mask) (the man page's "TMH.tag & entry.mask == entry.tag" for entries whose tag lies
// within their mask; a mask of 0 is a wildcard). Among the entries that match, the earliest
// posted one is taken, so later entries may be consumed first when earlier ones do not match.
//
// Phases: every message that carries a tag and finds no entry is "unexpected" and counted
// (unexpected()). The software reports how many it has handled (sync(), IBV_OPS_TM_SYNC).
// While the two differ, entries added since are not armed: an entry posted by software that
// has not yet seen an unexpected message must not match a later message (ordering, the
// document's m1/m2/b1 example). Entries added while in sync stay armed. Once the counts
// agree again, every entry is armed.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/objects.hpp"

namespace softverbs {

// The wire headers (tm_types.h: struct ibv_tmh, struct ibv_rvh), big endian, at the start of
// a SEND's payload.
inline constexpr uint32_t kTmhBytes = 16;
inline constexpr uint32_t kRvhBytes = 16;
enum TmhOp : uint8_t { kTmhNoTag = 0, kTmhRndv = 1, kTmhFin = 2, kTmhEager = 3 };
struct TmHeader {
  uint8_t op = kTmhNoTag;
  uint32_t app_ctx = 0;
  uint64_t tag = 0;
  // Rendezvous only:
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t len = 0;
};
// Parses the first `n` bytes of a message. nullopt: no valid TMH (too short or an unknown
// opcode), or a rendezvous request without its RVH.
std::optional<TmHeader> parse_tm_header(const uint8_t* bytes, uint32_t n);
// Writes a TMH (16 bytes) for op, app_ctx and tag.
void write_tmh(uint8_t* out, uint8_t op, uint32_t app_ctx, uint64_t tag);

struct TagEntry {
  uint64_t tag = 0;
  uint64_t mask = 0;
  uint64_t wr_id = 0;  // recv_wr_id: the TM_RECV completion's wr_id
  SgeList sges;
};

class TagList {
 public:
  explicit TagList(uint32_t capacity) : slots_(capacity) {}
  uint32_t capacity() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t size() const { return posted_; }

  // IBV_WR_TAG_ADD: the new entry's handle, or nullopt when the list is full.
  std::optional<uint32_t> add(TagEntry entry);
  // IBV_WR_TAG_DEL: false when `handle` names no posted entry (consumed or deleted).
  bool remove(uint32_t handle);
  // The handle of the earliest posted armed entry that matches `tag`; the entry stays
  // posted until take() (the message may still fail to arrive).
  std::optional<uint32_t> find_match(uint64_t tag) const;
  const TagEntry& entry(uint32_t handle) const { return slots_[handle].entry; }
  // Takes a posted entry off the list (remove() that hands the entry over).
  TagEntry take(uint32_t handle);

  // A tagged message found no entry.
  void note_unexpected() { ++unexpected_; }
  uint32_t unexpected() const { return unexpected_; }
  // The software has handled `handled` unexpected messages (IBV_OPS_TM_SYNC).
  void sync(uint32_t handled);
  bool in_sync() const { return handled_ == unexpected_; }

 private:
  struct Slot {
    bool posted = false;
    bool armed = false;
    uint64_t order = 0;  // when it was posted: earlier entries match first
    TagEntry entry;
  };
  std::vector<Slot> slots_;
  uint32_t posted_ = 0;
  uint64_t next_order_ = 0;
  uint32_t unexpected_ = 0;
  uint32_t handled_ = 0;
};

// A TM-SRQ's tag matching state (Srq::tm): its list, under the SRQ's lock, and the CQ
// that receives its completions (list operations and every receive of the SRQ).
struct TmSrq {
  TagList list;
  Cq* cq;
  uint32_t max_ops;
  TmSrq(uint32_t max_num_tags, Cq* c, uint32_t ops) : list(max_num_tags), cq(c), max_ops(ops) {}
};

}  // namespace softverbs
