// ReadMostlyLock's slow paths: thread slots, stepping back, and the writer's side.
#include "common/read_mostly_lock.hpp"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace softverbs {

namespace {

int membarrier(int cmd) { return static_cast<int>(syscall(SYS_membarrier, cmd, 0, 0)); }

// Runs a full memory barrier on every CPU that runs one of our threads. Registration is
// repeated because a child after fork() starts unregistered.
bool barrier_on_our_cpus() {
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
         membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

// Registered once more when the library loads, while a program has one thread: the kernel
// registers a single-threaded process at once, but a multi-threaded one only after a
// synchronize_rcu() (kernel/sched/membarrier.c), ~10 ms here, which the first lock made
// later (e.g. by the first connection of an rdma_cm program, whose service thread runs
// by then) would pay. Later registrations find it done.
[[maybe_unused]] const bool g_registered_at_load =
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;

// The slots this thread made, unregistered when it exits.
struct ThreadSlots {
  std::vector<void*> slots;
  ~ThreadSlots();
};
thread_local ThreadSlots t_slots;
thread_local bool t_exited = false;  // trivially destructible: readable after ~ThreadSlots

// Orders a thread's exit against a lock's destruction (each touches the other's slots).
std::mutex& registry_mu() {
  static auto* mu = new std::mutex;  // immortal: threads exit after static destructors
  return *mu;
}
std::atomic<uint64_t> g_next_id{1};

// Every live lock, for the fork handlers (under registry_mu).
std::vector<ReadMostlyLock*>& all_locks() {
  static auto* v = new std::vector<ReadMostlyLock*>;
  return *v;
}

}  // namespace

void ReadMostlyLock::before_fork() noexcept {
  registry_mu().lock();
  for (ReadMostlyLock* l : all_locks()) {
    l->writers_.lock();
    l->slots_mu_.lock();
  }
}

void ReadMostlyLock::parent_after_fork() noexcept {
  for (ReadMostlyLock* l : all_locks()) {
    l->slots_mu_.unlock();
    l->writers_.unlock();
  }
  registry_mu().unlock();
}

void ReadMostlyLock::child_after_fork() noexcept {
  for (ReadMostlyLock* l : all_locks()) {
    for (Slot* s = l->slots_; s; s = s->next) {
      bool ours = !t_exited && std::find(t_slots.slots.begin(), t_slots.slots.end(), s) !=
                                   t_slots.slots.end();
      if (!ours) s->depth.store(0, std::memory_order_relaxed);  // its thread is gone
    }
    l->slots_mu_.unlock();
    l->writers_.unlock();
  }
  registry_mu().unlock();
}

ReadMostlyLock::ReadMostlyLock() : id_(g_next_id.fetch_add(1)) {
  {
    std::lock_guard<std::mutex> r(registry_mu());
    static bool handlers = (pthread_atfork(&before_fork, &parent_after_fork, &child_after_fork), true);
    (void)handlers;
    all_locks().push_back(this);
  }
  int cmds = membarrier(MEMBARRIER_CMD_QUERY);
  asymmetric_ = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

ReadMostlyLock::~ReadMostlyLock() {
  // Its slots stay with their threads, which free them when they exit.
  std::lock_guard<std::mutex> r(registry_mu());
  std::lock_guard<std::mutex> g(slots_mu_);
  for (Slot* s = slots_; s; s = s->next) s->lock = nullptr;
  auto& v = all_locks();
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
}

ReadMostlyLock::Slot* ReadMostlyLock::slot_slow() noexcept {
  if (!t_exited)
    for (void* p : t_slots.slots)
      if (static_cast<Slot*>(p)->lock_id == id_) return t_slot = static_cast<Slot*>(p);
  auto* s = new Slot;
  s->lock_id = id_;
  s->lock = this;
  {
    std::lock_guard<std::mutex> r(registry_mu());
    std::lock_guard<std::mutex> g(slots_mu_);
    s->next = slots_;
    slots_ = s;
  }
  // A thread in its exit path keeps its slot for good: a few bytes, never locked again.
  if (!t_exited) t_slots.slots.push_back(s);
  return t_slot = s;
}

void ReadMostlyLock::unregister_thread() noexcept {
  t_exited = true;
  t_slot = nullptr;
  std::lock_guard<std::mutex> r(registry_mu());
  for (void* p : t_slots.slots) {
    auto* s = static_cast<Slot*>(p);
    if (ReadMostlyLock* lock = s->lock) {
      std::lock_guard<std::mutex> g(lock->slots_mu_);
      for (Slot** at = &lock->slots_; *at; at = &(*at)->next) {
        if (*at == s) {
          *at = s->next;
          break;
        }
      }
    }
    delete s;
  }
  t_slots.slots.clear();
}

ThreadSlots::~ThreadSlots() { ReadMostlyLock::unregister_thread(); }

void ReadMostlyLock::step_back(Slot* s) noexcept {
  do {
    s->depth.store(0, std::memory_order_release);
    writer_.wait(1, std::memory_order_acquire);
    announce(s);
  } while (writer_.load(std::memory_order_acquire));
}

void ReadMostlyLock::lock() {
  writers_.lock();
  writer_.store(1, std::memory_order_seq_cst);
  if (asymmetric_ && !barrier_on_our_cpus()) {
    // Worked when we started; a kernel that stops honouring it leaves no safe way on.
    std::fputs("softverbs: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed\n", stderr);
    std::abort();
  }
  // Readers that got in before they could see us: wait (sleeping) until they are out.
  std::lock_guard<std::mutex> g(slots_mu_);
  for (Slot* s = slots_; s; s = s->next) {
    for (useconds_t us = 5; s->depth.load(std::memory_order_acquire) != 0;
         us = std::min<useconds_t>(us * 2, 1000))
      usleep(us);
  }
}

void ReadMostlyLock::unlock() {
  writer_.store(0, std::memory_order_release);
  writer_.notify_all();  // readers that stepped back
  writers_.unlock();
}

}  // namespace softverbs
