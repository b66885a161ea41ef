// On-demand paging, device memory, fd-mapped (dma-buf) MRs and parent domains, through the
// core API: what resolve_sge makes of an ODP MR's pages (faulted in, or the access error),
// implicit ODP, prefetch errors, DM bounds, a memfd registered the way a dma-buf is, and a
// receive ring that lives in a parent domain's allocator.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <shared_mutex>

#include "unit_support.hpp"

namespace softverbs::unit {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

class OdpDmTest : public ContextTest {
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
  bool resolve(uint32_t key, uint64_t addr, uint64_t len, unsigned need, iovec* out = nullptr) {
    iovec v{};
    std::shared_lock lock(MrTable::instance().lock());
    return resolve_sge(pd, key, addr, len, need, out ? out : &v);
  }
  Pd* pd = nullptr;
};

TEST_F(OdpDmTest, OdpPagesFaultInOrGiveTheAccessError) {
  auto* p = static_cast<char*>(mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + kPage, kPage, PROT_READ), 0);
  ASSERT_EQ(munmap(p + 2 * kPage, kPage), 0);
  const unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* mr = reg_mr(pd, p, 3 * kPage, reinterpret_cast<uintptr_t>(p), all | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(mr, nullptr) << "an ODP MR needs no mapping: errno " << errno;
  const uint64_t at = reinterpret_cast<uintptr_t>(p);
  EXPECT_TRUE(resolve(mr->lkey, at, kPage, IBV_ACCESS_REMOTE_WRITE));
  EXPECT_TRUE(resolve(mr->lkey, at + kPage, 16, IBV_ACCESS_REMOTE_READ));
  EXPECT_FALSE(resolve(mr->lkey, at + kPage, 16, IBV_ACCESS_REMOTE_WRITE));  // read only
  EXPECT_FALSE(resolve(mr->lkey, at + 2 * kPage, 16, 0));                     // unmapped
  EXPECT_FALSE(resolve(mr->lkey, at + kPage - 8, 16, IBV_ACCESS_LOCAL_WRITE));  // straddles
  // A mapping made after registration is reached.
  ASSERT_EQ(mmap(p + 2 * kPage, kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), p + 2 * kPage);
  EXPECT_TRUE(resolve(mr->lkey, at + 2 * kPage, 16, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(Mr::from(mr)->shm, 0u);  // ODP pages never move into the shared MR memfd
  EXPECT_EQ(dereg_mr(Mr::from(mr)), 0);
  munmap(p, 3 * kPage);
}

TEST_F(OdpDmTest, ImplicitOdpCoversTheAddressSpace) {
  ibv_mr* mr = reg_mr(pd, nullptr, SIZE_MAX, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->addr, nullptr);
  EXPECT_EQ(mr->length, SIZE_MAX);
  std::vector<char> heap(100, 'x');
  iovec v{};
  ASSERT_TRUE(resolve(mr->lkey, reinterpret_cast<uintptr_t>(heap.data()), 100,
                      IBV_ACCESS_LOCAL_WRITE, &v));
  EXPECT_EQ(v.iov_base, heap.data());
  EXPECT_FALSE(resolve(mr->lkey, kPage, 8, 0));  // below mmap_min_addr: never mapped
  // Prefetch: EFAULT only when asked to wait; ENOENT for a key without ON_DEMAND.
  ibv_sge sge{reinterpret_cast<uintptr_t>(heap.data()), 100, mr->lkey};
  EXPECT_EQ(advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), 0);
  ibv_sge bad{kPage, 8, mr->lkey};
  EXPECT_EQ(advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &bad, 1), EFAULT);
  EXPECT_EQ(advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &bad, 1), 0);
  EXPECT_EQ(advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0), EINVAL);
  EXPECT_EQ(advise_mr(pd, 99, 0, &sge, 1), EOPNOTSUPP);
  ibv_mr* pinned = reg_mr(pd, heap.data(), 100, reinterpret_cast<uintptr_t>(heap.data()),
                          IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(pinned, nullptr);
  ibv_sge p{reinterpret_cast<uintptr_t>(heap.data()), 100, pinned->lkey};
  EXPECT_EQ(advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &p, 1), ENOENT);
  EXPECT_EQ(dereg_mr(Mr::from(pinned)), 0);
  // The iova of an implicit MR is the virtual address.
  errno = 0;
  EXPECT_EQ(reg_mr(pd, nullptr, SIZE_MAX, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND),
            nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(reg_mr(pd, nullptr, SIZE_MAX, 0, IBV_ACCESS_LOCAL_WRITE), nullptr);  // not ODP
  EXPECT_EQ(dereg_mr(Mr::from(mr)), 0);
}

TEST_F(OdpDmTest, DeviceMemoryMrIsZeroBasedAndBounded) {
  ibv_alloc_dm_attr attr{};
  attr.length = 1000;
  ibv_dm* d = alloc_dm(ctx, &attr);
  ASSERT_NE(d, nullptr);
  Dm* dm = Dm::from(d);
  const uint32_t word = 0x12345678;
  EXPECT_EQ(d->memcpy_to_dm(d, 996, &word, 4), 0);
  EXPECT_EQ(d->memcpy_to_dm(d, 998, &word, 4), EFAULT);
  EXPECT_EQ(d->memcpy_to_dm(d, UINT64_MAX - 1, &word, 4), EFAULT);  // no wrap-around
  EXPECT_EQ(d->memcpy_to_dm(d, 2, &word, 4), EINVAL);
  ibv_mr* mr = reg_dm_mr(pd, dm, 500, 500, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->addr, nullptr);
  iovec v{};
  ASSERT_TRUE(resolve(mr->lkey, 496, 4, IBV_ACCESS_LOCAL_WRITE, &v));  // zero based
  EXPECT_EQ(std::memcmp(v.iov_base, &word, 4), 0);
  EXPECT_FALSE(resolve(mr->lkey, 497, 4, 0));
  EXPECT_EQ(free_dm(dm), EBUSY);
  EXPECT_EQ(reg_dm_mr(pd, dm, 500, 501, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED), nullptr);
  EXPECT_EQ(dereg_mr(Mr::from(mr)), 0);
  EXPECT_EQ(free_dm(dm), 0);
  attr.length = kMaxDmSize + 1;
  EXPECT_EQ(alloc_dm(ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(OdpDmTest, FdMappedMrReachesTheFilesPages) {
  // A memfd stands in for a dma-buf: the part after the dma-buf check maps any fd.
  int fd = memfd_create("odp_dm_test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(2 * kPage)), 0);
  EXPECT_EQ(reg_dmabuf_mr(pd, 0, kPage, 0, fd, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);  // not a dma-buf
  EXPECT_EQ(reg_dmabuf_mr(pd, 0, kPage, 0, -1, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EBADF);
  ibv_mr* mr = reg_fd_mr(pd, 100, 3000, 0x10000, fd, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mr->addr), 100u);
  iovec v{};
  ASSERT_TRUE(resolve(mr->lkey, 0x10000 + 8, 4, IBV_ACCESS_LOCAL_WRITE, &v));
  std::memcpy(v.iov_base, "abcd", 4);
  char got[4];
  ASSERT_EQ(pread(fd, got, 4, 108), 4);
  EXPECT_EQ(std::memcmp(got, "abcd", 4), 0);
  EXPECT_EQ(dereg_mr(Mr::from(mr)), 0);
  close(fd);
}

struct Calls {
  int allocs = 0, frees = 0;
  void* last = nullptr;
  uint64_t type = 0;
  ibv_pd* pd = nullptr;
};

void* counting_alloc(ibv_pd* pd, void* ctx, size_t size, size_t align, uint64_t type) {
  auto* c = static_cast<Calls*>(ctx);
  ++c->allocs;
  c->type = type;
  c->pd = pd;
  void* p = nullptr;
  if (posix_memalign(&p, align, size)) return nullptr;
  std::memset(p, 0, size);
  return c->last = p;
}

void counting_free(ibv_pd*, void* ctx, void* p, uint64_t) {
  auto* c = static_cast<Calls*>(ctx);
  ++c->frees;
  EXPECT_EQ(p, c->last);
  free(p);
}

TEST_F(OdpDmTest, ParentDomainAllocatorHoldsTheReceiveRing) {
  Calls calls;
  ibv_parent_domain_init_attr attr{};
  attr.pd = &pd->ibv;
  attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  attr.alloc = counting_alloc;
  attr.free = counting_free;
  attr.pd_context = &calls;
  ibv_pd* parent = alloc_parent_domain(ctx, &attr);
  ASSERT_NE(parent, nullptr);
  Pd* pp = Pd::from(parent);
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->prot, pd);
  EXPECT_EQ(dealloc_pd(pd), EBUSY);
  {
    RingQueue<RecvWqe> rq;
    ASSERT_TRUE(queue_memory_for(pp, &rq, kResourceQp, 8));
    EXPECT_EQ(calls.allocs, 1);
    EXPECT_EQ(calls.type, kResourceQp);
    EXPECT_EQ(calls.pd, parent);
    for (int i = 0; i < 8; ++i) rq.push_slot().wr_id = 0xabc0 + i;
    EXPECT_EQ(&rq.front(), calls.last);  // the ring is the memory the callback gave
    EXPECT_EQ(calls.allocs, 1);          // sized once: no regrowth up to max_wr
  }
  EXPECT_EQ(calls.frees, 1);
  // A plain PD: the heap, no callbacks.
  RingQueue<RecvWqe> plain;
  EXPECT_TRUE(queue_memory_for(pd, &plain, kResourceQp, 8));
  EXPECT_EQ(calls.allocs, 1);
  EXPECT_EQ(dealloc_pd(pp), 0);
}

}  // namespace
}  // namespace softverbs::unit
