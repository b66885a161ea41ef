// The key table: lkeys/rkeys name MRs; with its copy published for peers on this host.
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "core/core.hpp"
#include "common/verbs_ext.hpp"
#include "wire/registry.hpp"
#include "wire/shm/arena.hpp"

namespace softverbs {

MrTable& MrTable::create() {
  static MrTable* table = new MrTable;  // thread-safe once; immortal
  instance_.store(table, std::memory_order_release);
  return *table;
}

uint32_t MrTable::take_slot() {
  // Keys carry our registry slot; a forked child has a slot of its own, so its new keys do
  // not collide with its parent's (the inherited ones then name nothing here).
  const uint32_t base = static_cast<uint32_t>(wire::my_slot()) << wire::kKeySlotShift;
  if (base != base_) {
    base_ = base;
    note_change();
    // A forked child's published table is its own arena's, made anew on first use (the
    // inherited pointer is into its parent's).
    shared_ = nullptr;
    shared_offset_ = 0;
  }
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    if (index > wire::kKeyIndexMask) return 0;  // every key of this process is taken
    slots_.push_back(nullptr);
    windows_.push_back(nullptr);
    generation_.push_back(0);
  }
  return index;
}

uint32_t MrTable::insert(Mr* mr) {
  std::unique_lock lock(mu_);
  uint32_t index = take_slot();
  if (index == 0) return 0;
  slots_[index] = mr;
  // The low byte changes on every reuse, so a stale key does not name the new MR.
  uint8_t gen = ++generation_[index];
  return key_of(index, gen);
}

void MrTable::insert_imported(Mr* mr) {
  std::unique_lock lock(mu_);
  imported_.push_back(mr);
}

void MrTable::erase_imported(Mr* mr) {
  std::unique_lock lock(mu_);  // waits for operations that found it
  std::erase(imported_, mr);
  note_change();
}

Mr* MrTable::find_imported(uint32_t key) const {
  for (Mr* mr : imported_)
    if (mr->ibv.lkey == key) return mr->foreign && mr->foreign->live(key) ? mr : nullptr;
  return nullptr;
}

bool ForeignMr::live(uint32_t key) const {
  if (!entry || entry->key.load(std::memory_order_acquire) != key) return false;  // deregistered
  pollfd p{pidfd, POLLIN, 0};
  return pidfd >= 0 && poll(&p, 1, 0) == 0;  // readable: the exporter has exited
}

ForeignMr::~ForeignMr() {
  wire::unmap_peer_arena(arena);
  if (pidfd >= 0) close(pidfd);
}

void MrTable::erase(uint32_t key) {
  std::unique_lock lock(mu_);
  erase_locked(key);
}

void MrTable::erase_locked(uint32_t key) {
  uint32_t index = wire::key_index(key);
  if (index < slots_.size() && slots_[index]) {
    slots_[index] = nullptr;
    free_.push_back(index);
  }
  note_change();
  if (shared_ && index < wire::kMrTableCap) shared_[index].key.store(0, std::memory_order_release);
}

bool MrTable::erase_unbound(Mr* mr) {
  // Binds run under the shared lock: none is half-way through while we hold it exclusively.
  std::unique_lock lock(mu_);
  if (mr->bound_windows.load(std::memory_order_relaxed) > 0) return false;
  erase_locked(mr->ibv.lkey);
  return true;
}

uint64_t MrTable::shared_offset() {
  {
    // Made once: every later call (each receive window opened) only reads it, and the
    // exclusive lock costs a membarrier, an interrupt on every CPU we run on.
    std::shared_lock lock(mu_);
    if (shared_) return shared_offset_;
  }
  std::unique_lock lock(mu_);
  if (!shared_) {
    wire::Arena* arena = wire::Arena::self();
    // In the read-only published region: no peer may change what another peer relies on.
    uint64_t off = arena ? arena->allocate_published(sizeof(wire::MrShared) * wire::kMrTableCap) : 0;
    if (!off) return 0;
    shared_offset_ = off;
    shared_ = arena->published_at<wire::MrShared>(off);
    for (uint32_t i = 1; i < slots_.size() && i < wire::kMrTableCap; ++i) {
      // Only our own keys: a forked child's inherited MRs name nothing here.
      if (Mr* mr = slots_[i]; mr && (mr->ibv.lkey >> 8) - base_ == i) write_shared_entry(mr);
      if (Mw* mw = windows_[i]; mw && (mw->rkey >> 8) - base_ == i) {
        std::lock_guard<SpinLock> g(mw->mu);
        publish_window(mw);
      }
    }
  }
  return shared_offset_;
}

void MrTable::publish(const Mr* mr) {
  std::unique_lock lock(mu_);
  if (shared_) write_shared_entry(mr);
}

void MrTable::write_shared_entry(const Mr* mr) {
  uint32_t index = wire::key_index(mr->ibv.lkey);
  wire::MrShared& e = shared_[index];
  e.key.store(0, std::memory_order_release);  // readers re-check the key after reading
  e.access = mr->access;
  e.pd_token = reinterpret_cast<uint64_t>(mr->pd->prot);
  e.iova = mr->iova;
  e.length = mr->length;
  e.addr = reinterpret_cast<uint64_t>(mr->host);
  e.shm = mr->shm;
  e.shm_length = mr->shm_length;
  e.qpn = 0;
  e.key.store(mr->ibv.lkey, std::memory_order_release);
}

bool flush_memory(Pd* pd, uint32_t key, uint64_t addr, uint64_t length, uint8_t type,
                  uint8_t level) {
  unsigned need = ((type & kFlushGlobal) ? kAccessFlushGlobal : 0) |
                  ((type & kFlushPersistent) ? kAccessFlushPersistent : 0);
  if (need == 0) return false;
  Mr* mr = MrTable::instance().find(key);
  if (!mr) return false;
  if (level == kFlushMr) {
    addr = mr->iova;
    length = mr->length;
  }
  iovec at{};
  if (!resolve_sge(pd, key, addr, length, need, &at)) return false;
  // Every write that reached us before this FLUSH is in memory already (we copy in order):
  // a fence is all global visibility needs.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if ((type & kFlushPersistent) && length) {
    auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    auto start = reinterpret_cast<uintptr_t>(at.iov_base) & ~(page - 1);
    auto end = reinterpret_cast<uintptr_t>(at.iov_base) + length;
    msync(reinterpret_cast<void*>(start), end - start, MS_SYNC);
  }
  return true;
}

}  // namespace softverbs
