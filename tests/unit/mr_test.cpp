// PDs, MRs and the key table: key generations, SGE resolution (bounds, PD, access),
// registration access rules and PD reference counting.
#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <vector>

#include "unit_support.hpp"
#include "wire/registry.hpp"

namespace softverbs::unit {
namespace {

constexpr unsigned kAllRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class MrTest : public ContextTest {
 protected:
  void SetUp() override {
    ContextTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    pd = make_pd();
    ASSERT_NE(pd, nullptr);
  }
  void TearDown() override {
    if (pd) {
      EXPECT_EQ(dealloc_pd(pd), 0);
    }
    ContextTest::TearDown();
  }

  Mr* reg(void* addr, size_t len, unsigned access, uint64_t iova) {
    ibv_mr* m = reg_mr(pd, addr, len, iova, access);
    EXPECT_NE(m, nullptr) << "reg_mr: errno " << errno;
    return m ? Mr::from(m) : nullptr;
  }
  Mr* reg(void* addr, size_t len, unsigned access) {
    return reg(addr, len, access, reinterpret_cast<uintptr_t>(addr));
  }
  // errno of a registration that must fail (0 if it succeeded, which the test then reports).
  int reg_errno(unsigned access) {
    errno = 0;
    ibv_mr* m = reg_mr(pd, buf.data(), buf.size(), reinterpret_cast<uintptr_t>(buf.data()), access);
    if (m) {
      dereg_mr(Mr::from(m));
      return 0;
    }
    return errno;
  }
  // resolve_sge under the key table's shared lock, as the data path calls it.
  bool resolve(Pd* p, uint32_t key, uint64_t addr, uint64_t len, unsigned need, iovec* out) {
    std::shared_lock lock(MrTable::instance().lock());
    return resolve_sge(p, key, addr, len, need, out);
  }
  bool resolve(uint32_t key, uint64_t addr, uint64_t len, unsigned need = 0) {
    iovec out{};
    return resolve(pd, key, addr, len, need, &out);
  }
  Mr* find(uint32_t key) {
    std::shared_lock lock(MrTable::instance().lock());
    return MrTable::instance().find(key);
  }

  Pd* pd = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
};

// --- key table ---------------------------------------------------------------------------

TEST_F(MrTest, KeysNameTheirMr) {
  Mr* a = reg(buf.data(), 100, IBV_ACCESS_LOCAL_WRITE);
  Mr* b = reg(buf.data() + 100, 100, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->ibv.lkey, b->ibv.lkey);
  EXPECT_NE(a->ibv.rkey, b->ibv.rkey);
  EXPECT_EQ(find(a->ibv.lkey), a);
  EXPECT_EQ(find(b->ibv.rkey), b);
  EXPECT_EQ(find(0), nullptr);
  EXPECT_EQ(dereg_mr(a), 0);
  EXPECT_EQ(dereg_mr(b), 0);
}

TEST_F(MrTest, KeysCarryOurRegistrySlotAndOtherSlotsNameNothing) {
  // Keys are host-wide (wire/registry.hpp): the same index under another process's slot
  // is that process's key, never ours (an imported key must not find one of our MRs).
  Mr* a = reg(buf.data(), 100, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(a, nullptr);
  const uint32_t key = a->ibv.lkey;
  EXPECT_EQ(wire::slot_of_key(key), wire::my_slot());
  EXPECT_NE(wire::key_index(key), 0u);
  for (int other : {0, 1, wire::my_slot() + 1, wire::kSlots - 1}) {
    if (other == wire::my_slot()) continue;
    uint32_t foreign = (((static_cast<uint32_t>(other) << wire::kKeySlotShift) |
                         wire::key_index(key)) << 8) | (key & 0xff);
    EXPECT_EQ(find(foreign), nullptr) << "slot " << other;
  }
  EXPECT_EQ(find(key), a);
  EXPECT_EQ(dereg_mr(a), 0);
}

TEST_F(MrTest, MaxMrAndMaxMwFitInOneProcessKeys) {
  EXPECT_LE(Limits::max_mr + Limits::max_mw, static_cast<int>(wire::kKeyIndexMask));
}

TEST_F(MrTest, DeregisteredKeyDoesNotResolveAfterItsSlotIsReused) {
  // Register and deregister repeatedly: each new MR may take the slot its predecessor
  // freed, and no earlier key may name it.
  std::vector<uint32_t> old_keys;
  for (int i = 0; i < 50; ++i) {
    Mr* mr = reg(buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    uint32_t key = mr->ibv.lkey;
    for (uint32_t old : old_keys) {
      ASSERT_NE(key, old) << "a key was handed out twice";
      EXPECT_EQ(find(old), nullptr) << "stale key " << old << " names a live MR";
      EXPECT_FALSE(resolve(old, reinterpret_cast<uintptr_t>(buf.data()), 1));
    }
    EXPECT_EQ(find(key), mr);
    EXPECT_TRUE(resolve(key, reinterpret_cast<uintptr_t>(buf.data()), 1));
    ASSERT_EQ(dereg_mr(mr), 0);
    EXPECT_EQ(find(key), nullptr);
    old_keys.push_back(key);
  }
}

TEST_F(MrTest, TableReusesSlotsWithANewGeneration) {
  // The table directly: an erased slot is reused under a different key.
  MrTable& table = MrTable::instance();
  Mr a{}, b{};
  uint32_t ka = table.insert(&a);
  table.erase(ka);
  uint32_t kb = table.insert(&b);
  EXPECT_NE(ka, kb);
  EXPECT_EQ(find(ka), nullptr);
  EXPECT_EQ(find(kb), &b);
  table.erase(kb);
  EXPECT_EQ(find(kb), nullptr);
}

// --- resolve_sge ---------------------------------------------------------------------------

TEST_F(MrTest, ResolveSgeBounds) {
  constexpr uint64_t kLen = 1024;
  uint8_t* base = buf.data() + 512;
  Mr* mr = reg(base, kLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  const uint32_t key = mr->ibv.lkey;
  const uint64_t start = reinterpret_cast<uintptr_t>(base);
  iovec out{};

  ASSERT_TRUE(resolve(pd, key, start, 1, 0, &out));  // first byte
  EXPECT_EQ(out.iov_base, base);
  EXPECT_EQ(out.iov_len, 1u);
  ASSERT_TRUE(resolve(pd, key, start, kLen, 0, &out));  // the whole region
  EXPECT_EQ(out.iov_base, base);
  EXPECT_EQ(out.iov_len, kLen);
  ASSERT_TRUE(resolve(pd, key, start + kLen - 1, 1, 0, &out));  // last byte
  EXPECT_EQ(out.iov_base, base + kLen - 1);
  ASSERT_TRUE(resolve(pd, key, start + 100, kLen - 100, 0, &out));  // up to the end exactly
  EXPECT_EQ(out.iov_base, base + 100);
  EXPECT_EQ(out.iov_len, kLen - 100);

  EXPECT_FALSE(resolve(key, start + kLen, 1)) << "one byte past the end";
  EXPECT_FALSE(resolve(key, start + 1, kLen)) << "ends one byte past the end";
  EXPECT_FALSE(resolve(key, start, kLen + 1)) << "one byte too long";
  EXPECT_FALSE(resolve(key, start - 1, 1)) << "one byte before the start";
  EXPECT_FALSE(resolve(key, start - 1, 2)) << "straddles the start";
  // Lengths and addresses whose sum wraps around 2^64.
  EXPECT_FALSE(resolve(key, start + 8, UINT64_MAX - 7));
  EXPECT_FALSE(resolve(key, start + 8, UINT64_MAX));
  EXPECT_FALSE(resolve(key, UINT64_MAX, 2));
  EXPECT_FALSE(resolve(key, UINT64_MAX - kLen + 2, kLen));
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, ResolveSgeUsesTheIovaTheMrWasRegisteredWith) {
  constexpr uint64_t kIova = 0x100000;
  Mr* mr = reg(buf.data(), 256, IBV_ACCESS_LOCAL_WRITE, kIova);
  ASSERT_NE(mr, nullptr);
  iovec out{};
  ASSERT_TRUE(resolve(pd, mr->ibv.lkey, kIova + 16, 32, 0, &out));
  EXPECT_EQ(out.iov_base, buf.data() + 16);
  EXPECT_EQ(out.iov_len, 32u);
  EXPECT_FALSE(resolve(mr->ibv.lkey, kIova + 256, 1));
  EXPECT_FALSE(resolve(mr->ibv.lkey, kIova - 1, 1));
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, ResolveSgeRejectsAnotherPd) {
  Mr* mr = reg(buf.data(), buf.size(), kAllRemote);
  ASSERT_NE(mr, nullptr);
  Pd* other = make_pd();
  ASSERT_NE(other, nullptr);
  iovec out{};
  uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
  EXPECT_FALSE(resolve(other, mr->ibv.lkey, addr, 8, 0, &out));
  EXPECT_FALSE(resolve(other, mr->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_WRITE, &out));
  EXPECT_TRUE(resolve(pd, mr->ibv.lkey, addr, 8, 0, &out));
  EXPECT_EQ(dealloc_pd(other), 0);
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, ResolveSgeChecksAccess) {
  const uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
  Mr* ro = reg(buf.data(), 64, 0);  // local read only
  Mr* lw = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  Mr* rr = reg(buf.data(), 64, IBV_ACCESS_REMOTE_READ);
  Mr* all = reg(buf.data(), 64, kAllRemote);
  ASSERT_TRUE(ro && lw && rr && all);

  EXPECT_TRUE(resolve(ro->ibv.lkey, addr, 8, 0));
  EXPECT_FALSE(resolve(ro->ibv.lkey, addr, 8, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_FALSE(resolve(ro->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_READ));

  EXPECT_TRUE(resolve(lw->ibv.lkey, addr, 8, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_FALSE(resolve(lw->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_READ));
  EXPECT_FALSE(resolve(lw->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_WRITE));

  EXPECT_TRUE(resolve(rr->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_READ));
  EXPECT_FALSE(resolve(rr->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_WRITE));
  EXPECT_FALSE(resolve(rr->ibv.lkey, addr, 8, IBV_ACCESS_LOCAL_WRITE));

  for (unsigned need : {0u, unsigned(IBV_ACCESS_LOCAL_WRITE), unsigned(IBV_ACCESS_REMOTE_READ),
                        unsigned(IBV_ACCESS_REMOTE_WRITE), unsigned(IBV_ACCESS_REMOTE_ATOMIC)})
    EXPECT_TRUE(resolve(all->ibv.rkey, addr, 8, need)) << "need 0x" << std::hex << need;
  // Every bit asked for must be granted.
  EXPECT_FALSE(resolve(rr->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));

  for (Mr* m : {ro, lw, rr, all}) EXPECT_EQ(dereg_mr(m), 0);
}

TEST_F(MrTest, DeregisteredMrDoesNotResolve) {
  Mr* mr = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  uint32_t key = mr->ibv.lkey;
  ASSERT_EQ(dereg_mr(mr), 0);
  EXPECT_FALSE(resolve(key, reinterpret_cast<uintptr_t>(buf.data()), 1));
}

// --- reg_mr access validation --------------------------------------------------------------

TEST_F(MrTest, RemoteWriteOrAtomicWithoutLocalWriteIsEinval) {
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_WRITE), EINVAL);
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_ATOMIC), EINVAL);
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ), EINVAL);
  // With local write they are fine; remote read alone needs nothing.
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE), 0);
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE), 0);
  EXPECT_EQ(reg_errno(IBV_ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(reg_errno(0), 0);
}

TEST_F(MrTest, KnownAccessBitsAreAccepted) {
  EXPECT_EQ(reg_errno(kAllRemote), 0);
  EXPECT_EQ(reg_errno(kAllRemote | IBV_ACCESS_MW_BIND), 0);
}

TEST_F(MrTest, OptionalAccessBitsAreIgnored) {
  // Bits 20..29 (IBV_ACCESS_OPTIONAL_RANGE) may be ignored by a device that lacks them.
  EXPECT_EQ(reg_errno(IBV_ACCESS_RELAXED_ORDERING), 0);
  EXPECT_EQ(reg_errno(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING), 0);
  EXPECT_EQ(reg_errno(IBV_ACCESS_LOCAL_WRITE | (1u << 29)), 0);
  // Ignored means ignored: it grants nothing and the other bits still work.
  Mr* mr = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  ASSERT_NE(mr, nullptr);
  uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
  EXPECT_TRUE(resolve(mr->ibv.lkey, addr, 8, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_FALSE(resolve(mr->ibv.rkey, addr, 8, IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, UnknownAccessBitIsEinval) {
  EXPECT_EQ(reg_errno(IBV_ACCESS_LOCAL_WRITE | (1u << 15)), EINVAL);
  EXPECT_EQ(reg_errno(IBV_ACCESS_LOCAL_WRITE | (1u << 30)), EINVAL);
  EXPECT_EQ(reg_errno(1u << 31), EINVAL);
}

TEST_F(MrTest, OnDemandPagingRegisters) {
  EXPECT_EQ(reg_errno(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), 0);  // odp_mr_test.cpp
}

TEST_F(MrTest, RegMrFillsTheHandle) {
  Mr* mr = reg(buf.data() + 8, 100, kAllRemote);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->ibv.addr, buf.data() + 8);
  EXPECT_EQ(mr->ibv.length, 100u);
  EXPECT_EQ(mr->ibv.pd, &pd->ibv);
  EXPECT_EQ(mr->ibv.context, ctx->ibv());
  EXPECT_NE(mr->ibv.lkey, 0u);
  EXPECT_EQ(dereg_mr(mr), 0);
}

// --- rereg_mr ------------------------------------------------------------------------------

TEST_F(MrTest, ReregRejectsBadInputAndKeepsTheMr) {
  Mr* mr = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(rereg_mr(mr, 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT) << "no flags";
  EXPECT_EQ(rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                     IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_INPUT)
      << "remote write without local write";
  EXPECT_EQ(rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS | (1 << 10), nullptr, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT)
      << "unknown flag";
  // The MR is as it was.
  uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
  EXPECT_TRUE(resolve(mr->ibv.lkey, addr, 64, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, ReregChangesAccessAndTranslation) {
  Mr* mr = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  uint64_t old_addr = reinterpret_cast<uintptr_t>(buf.data());
  ASSERT_EQ(rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_TRUE(resolve(mr->ibv.rkey, old_addr, 8, IBV_ACCESS_REMOTE_READ));

  ASSERT_EQ(rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf.data() + 1024, 128, 0),
            0);
  uint64_t new_addr = old_addr + 1024;
  iovec out{};
  ASSERT_TRUE(resolve(pd, mr->ibv.lkey, new_addr + 100, 28, 0, &out));
  EXPECT_EQ(out.iov_base, buf.data() + 1124);
  EXPECT_FALSE(resolve(mr->ibv.lkey, old_addr, 8)) << "the old range is no longer registered";
  EXPECT_FALSE(resolve(mr->ibv.lkey, new_addr + 100, 29));
  EXPECT_EQ(dereg_mr(mr), 0);
}

TEST_F(MrTest, ReregMovesTheMrToAnotherPd) {
  Pd* other = make_pd();
  ASSERT_NE(other, nullptr);
  Mr* mr = reg(buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
  iovec out{};
  EXPECT_TRUE(resolve(other, mr->ibv.lkey, addr, 8, 0, &out));
  EXPECT_FALSE(resolve(pd, mr->ibv.lkey, addr, 8, 0, &out));
  EXPECT_EQ(dealloc_pd(other), EBUSY) << "the MR now counts on the new PD";
  EXPECT_EQ(dereg_mr(mr), 0);
  EXPECT_EQ(dealloc_pd(other), 0);
}

// --- PD reference counting -----------------------------------------------------------------

TEST_F(MrTest, DeallocPdWithAnMrIsEbusy) {
  Pd* p = make_pd();
  ASSERT_NE(p, nullptr);
  ibv_mr* m = reg_mr(p, buf.data(), 64, reinterpret_cast<uintptr_t>(buf.data()), 0);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(dealloc_pd(p), EBUSY);
  // The PD survived the refused call: the MR still resolves through it.
  iovec out{};
  EXPECT_TRUE(resolve(p, m->lkey, reinterpret_cast<uintptr_t>(buf.data()), 8, 0, &out));
  EXPECT_EQ(dereg_mr(Mr::from(m)), 0);
  EXPECT_EQ(dealloc_pd(p), 0);
}

TEST_F(MrTest, DeallocPdWithAnAhIsEbusy) {
  Pd* p = make_pd();
  ASSERT_NE(p, nullptr);
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.port_num = 1;
  attr.grh.sgid_index = 0;
  attr.grh.dgid = Device::instance().gids()[0].gid;
  ibv_ah* ah = create_ah(p, &attr);
  ASSERT_NE(ah, nullptr) << "create_ah: errno " << errno;
  EXPECT_EQ(dealloc_pd(p), EBUSY);
  EXPECT_EQ(destroy_ah(Ah::from(ah)), 0);
  EXPECT_EQ(dealloc_pd(p), 0);
}

}  // namespace
}  // namespace softverbs::unit
