// Tag matching's list and headers (core/tag_list.hpp): which entry a tag takes (posted
// order, masks, wildcards), handles, capacity, the phase counters that keep entries posted
// before a sync from matching, and TMH/RVH parsing of whatever bytes a peer sends.
#include <gtest/gtest.h>

#include <cstring>

#include "core/tag_list.hpp"

namespace softverbs::unit {
namespace {

TagEntry entry(uint64_t tag, uint64_t mask, uint64_t wr_id) {
  TagEntry e;
  e.tag = tag;
  e.mask = mask;
  e.wr_id = wr_id;
  return e;
}

uint64_t take(TagList& l, uint64_t tag) {
  auto h = l.find_match(tag);
  return h ? l.take(*h).wr_id : 0;
}

TEST(TagList, EarliestPostedMatchingEntryWins) {
  TagList l(8);
  ASSERT_TRUE(l.add(entry(0x100, ~0ull, 1)));
  ASSERT_TRUE(l.add(entry(0x200, 0xff00, 2)));
  ASSERT_TRUE(l.add(entry(0, 0, 3)));  // wildcard
  ASSERT_TRUE(l.add(entry(0x100, ~0ull, 4)));
  EXPECT_EQ(take(l, 0x100), 1u);
  EXPECT_EQ(take(l, 0x100), 3u);  // the wildcard was posted before the second 0x100
  EXPECT_EQ(take(l, 0x2ff), 2u);  // the mask ignores the low byte
  EXPECT_EQ(take(l, 0x100), 4u);
  EXPECT_EQ(take(l, 0x100), 0u);
  EXPECT_EQ(l.size(), 0u);
}

TEST(TagList, FindDoesNotConsume) {
  TagList l(2);
  auto h = l.add(entry(7, ~0ull, 70));
  ASSERT_TRUE(h);
  EXPECT_EQ(l.find_match(7), h);
  EXPECT_EQ(l.find_match(7), h);
  EXPECT_EQ(l.entry(*h).wr_id, 70u);
  EXPECT_EQ(l.size(), 1u);
}

TEST(TagList, HandlesCapacityAndRemove) {
  TagList l(2);
  auto a = l.add(entry(1, ~0ull, 1)), b = l.add(entry(2, ~0ull, 2));
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_FALSE(l.add(entry(3, ~0ull, 3)));  // full
  EXPECT_TRUE(l.remove(*a));
  EXPECT_FALSE(l.remove(*a));  // already gone
  EXPECT_FALSE(l.remove(99));  // never a handle
  EXPECT_EQ(take(l, 1), 0u);
  EXPECT_TRUE(l.add(entry(3, ~0ull, 3)));  // the slot is free again
  EXPECT_EQ(take(l, 2), 2u);
  EXPECT_FALSE(l.remove(*b));  // consumed by a message
}

TEST(TagList, EntriesPostedOutOfSyncWaitForTheSync) {
  TagList l(8);
  ASSERT_TRUE(l.add(entry(0x10, ~0ull, 1)));  // in sync: armed
  l.note_unexpected();                         // a message software has not seen yet
  EXPECT_FALSE(l.in_sync());
  EXPECT_EQ(l.unexpected(), 1u);
  ASSERT_TRUE(l.add(entry(0x20, ~0ull, 2)));  // posted without knowing of it
  EXPECT_EQ(take(l, 0x20), 0u);                // must not match yet
  EXPECT_EQ(take(l, 0x10), 1u);                // the older entry still does
  l.sync(0);                                   // a stale count changes nothing
  EXPECT_EQ(take(l, 0x20), 0u);
  l.sync(1);
  EXPECT_TRUE(l.in_sync());
  EXPECT_EQ(take(l, 0x20), 2u);
}

TEST(TmHeader, ParsesEagerAndRendezvous) {
  uint8_t b[32] = {};
  write_tmh(b, kTmhEager, 0x01020304, 0x1122334455667788ull);
  auto h = parse_tm_header(b, 16);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->op, kTmhEager);
  EXPECT_EQ(h->app_ctx, 0x01020304u);
  EXPECT_EQ(h->tag, 0x1122334455667788ull);
  b[0] = kTmhRndv;
  EXPECT_FALSE(parse_tm_header(b, 31));  // a rendezvous without its whole RVH
  const uint8_t rvh[16] = {0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0x2a, 0, 0, 0x20, 0};
  std::memcpy(b + 16, rvh, 16);
  h = parse_tm_header(b, 32);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->va, 0x1000u);
  EXPECT_EQ(h->rkey, 0x2au);
  EXPECT_EQ(h->len, 0x2000u);
}

TEST(TmHeader, RejectsWhatIsNoHeader) {
  uint8_t b[32];
  std::memset(b, 0xff, sizeof(b));
  EXPECT_FALSE(parse_tm_header(b, 32));  // opcode 0xff
  EXPECT_FALSE(parse_tm_header(b, 0));
  b[0] = kTmhNoTag;
  EXPECT_FALSE(parse_tm_header(b, 15));  // shorter than a TMH
  EXPECT_TRUE(parse_tm_header(b, 16));
  // Every opcode byte and length: no crash, and only 0..3 parse.
  for (int op = 0; op < 256; ++op)
    for (uint32_t n = 0; n <= 32; ++n) {
      b[0] = static_cast<uint8_t>(op);
      auto h = parse_tm_header(b, n);
      if (h) {
        EXPECT_LE(h->op, kTmhEager);
      }
    }
}

}  // namespace
}  // namespace softverbs::unit
