#include "wire/registry.hpp"

#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>

#include "common/state_dir.hpp"

namespace softverbs::wire {

namespace {

struct Entry {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> flags;  // kSlotHasGsi...; reset by whoever claims the slot
};
static_assert(sizeof(Entry) == 8);

std::mutex g_mu;
std::atomic<Entry*> g_table{nullptr};  // set once, under g_mu
std::atomic<pid_t> g_owner{0};
std::atomic<int> g_slot{0};
std::atomic<pid_t> g_pid{0};

bool alive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

Entry* map_table() {
  if (Entry* t = g_table.load()) return t;
  std::string dir = state_dir();
  mkdir(dir.c_str(), 0700);
  std::string path = dir + "/registry";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  size_t size = sizeof(Entry) * kSlots;
  struct stat st;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) < size && ftruncate(fd, size) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  g_table.store(static_cast<Entry*>(p));
  return static_cast<Entry*>(p);
}

}  // namespace

pid_t self_pid() {
  if (pid_t pid = g_pid.load(std::memory_order_relaxed)) return pid;  // the data path's case
  static std::once_flag once;
  std::call_once(once, [] {
    g_pid = getpid();
    pthread_atfork(nullptr, nullptr, [] { g_pid = getpid(); });
  });
  return g_pid.load(std::memory_order_relaxed);
}

int my_slot() {
  pid_t self = self_pid();
  if (g_owner.load(std::memory_order_acquire) == self) return g_slot.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_owner.load() == self) return g_slot.load();
  g_slot = 0;
  Entry* table = map_table();
  if (!table) {
    g_owner.store(self, std::memory_order_release);
    return 0;
  }
  // Slot 0 and the last slot are never used: QPNs 0, 1 and 0xffffff are reserved. A dead
  // process's slot whose TGT QPs other processes held (or that it had adopted) is left to
  // those holders, one of which takes it over (verbs/xrc.cpp), unless no other is free.
  for (int pass = 0; pass < 2 && g_slot.load() == 0; ++pass) {
    for (int s = 1; s < kSlots - 1; ++s) {
      int32_t cur = table[s].pid.load();
      if (cur == self) {  // left over from an earlier process with our pid: take it over
        g_slot = s;
        table[s].flags.store(0);
        break;
      }
      if (cur > 0 && alive(cur)) continue;
      if (pass == 0 && cur > 0 && (table[s].flags.load() & (kSlotSharedTgt | kSlotAdopted))) continue;
      if (table[s].pid.compare_exchange_strong(cur, self)) {
        g_slot = s;
        table[s].flags.store(0);
        break;
      }
    }
  }
  // Other entries with our pid are a dead process's that had it (an adopter holds two):
  // ours is the one just taken.
  for (int s = 1; s < kSlots - 1 && g_slot.load() > 0; ++s) {
    int32_t stale = self;
    if (s == g_slot.load() || table[s].pid.load() != self) continue;
    table[s].flags.store(0);
    table[s].pid.compare_exchange_strong(stale, 0);
  }
  g_owner.store(self, std::memory_order_release);
  return g_slot.load();
}

pid_t slot_owner(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  if (!table || slot <= 0 || slot >= kSlots) return 0;
  int32_t pid = table[slot].pid.load();
  return pid > 0 ? pid : 0;
}

void set_my_slot_flag(uint32_t flag, bool on) {
  int slot = my_slot();
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  if (!table || slot <= 0) return;
  if (on) table[slot].flags.fetch_or(flag);
  else table[slot].flags.fetch_and(~flag);
}

int lowest_slot_with(uint32_t flag, int except) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  if (!table) return -1;
  for (int s = 1; s < kSlots - 1; ++s) {
    if (s == except || !(table[s].flags.load() & flag)) continue;
    int32_t pid = table[s].pid.load();
    if (alive(pid)) return s;  // a dead owner's flag is stale: skip it
  }
  return -1;
}

int slot_of_pid_with(pid_t pid, uint32_t flag) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  if (!table || pid <= 0) return -1;
  for (int s = 1; s < kSlots - 1; ++s)
    if (table[s].pid.load() == pid && (table[s].flags.load() & flag)) return alive(pid) ? s : -1;
  return -1;
}

namespace {

// host_slot's answer, under g_mu.
int host_slot_locked(Entry* table, int slot) {
  if (!table || slot <= 0 || slot >= kSlots) return slot;
  const uint32_t flags = table[slot].flags.load();
  const int host = static_cast<int>(flags >> kSlotHostShift);
  if (!(flags & kSlotAdopted) || host <= 0 || host >= kSlots) return slot;
  // Only while the adopter holds both entries: either may have changed hands since.
  const int32_t pid = table[slot].pid.load();
  return alive(pid) && table[host].pid.load() == pid ? host : slot;
}

}  // namespace

int host_slot(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  return host_slot_locked(map_table(), slot);
}

namespace {

// Under g_mu: `slot`'s entry from `from` to us, with `flags` (ours in the host bits). The
// flags go first, while `from` still holds the entry: whoever reads our pid in it reads
// them too. Put back if the entry was not `from`'s after all (a newcomer claimed it: it
// clears the flags itself, ours go back if it has not yet).
bool take_entry(Entry* table, int slot, pid_t from, uint32_t flags) {
  const int mine = g_slot.load();
  if (!table || slot <= 0 || slot >= kSlots || mine <= 0 || slot == mine || from <= 0) return false;
  uint32_t before = table[slot].flags.load();
  const uint32_t ours = flags | static_cast<uint32_t>(mine) << kSlotHostShift;
  if (table[slot].pid.load() != from || !table[slot].flags.compare_exchange_strong(before, ours))
    return false;
  int32_t expected = from;
  if (table[slot].pid.compare_exchange_strong(expected, self_pid())) return true;
  uint32_t mine_now = ours;
  table[slot].flags.compare_exchange_strong(mine_now, before);
  return false;
}

}  // namespace

bool take_slot(int slot, pid_t from) {
  my_slot();
  std::lock_guard<std::mutex> lock(g_mu);
  return take_entry(map_table(), slot, from, kSlotAdopted);
}

bool take_dead_slot(int slot, pid_t dead) {
  // (`dead` is the caller's word, from its pidfd: kill(2) would still find a zombie.)
  my_slot();
  std::lock_guard<std::mutex> lock(g_mu);
  return take_entry(map_table(), slot, dead, kSlotAdopted | kSlotAdoptedAfterDeath);
}

bool adopted_after_death(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  return host_slot_locked(table, slot) != slot && (table[slot].flags.load() & kSlotAdoptedAfterDeath);
}

pid_t adopter_of(int slot, bool* after_death) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  *after_death = false;
  if (!table || slot <= 0 || slot >= kSlots) return 0;
  const uint32_t flags = table[slot].flags.load();
  const int32_t pid = table[slot].pid.load();
  if (!(flags & kSlotAdopted) || pid <= 0) return 0;
  *after_death = (flags & kSlotAdoptedAfterDeath) != 0;
  return pid;
}

bool hosted_by_me(int slot) {
  Entry* table = g_table.load();  // mapped once, never unmapped
  if (!table) {
    std::lock_guard<std::mutex> lock(g_mu);
    table = map_table();
  }
  if (!table || slot <= 0 || slot >= kSlots) return false;
  return (table[slot].flags.load() & kSlotAdopted) && table[slot].pid.load() == self_pid();
}

std::vector<std::pair<int, int>> adopted_slots() {
  std::vector<std::pair<int, int>> out;
  std::lock_guard<std::mutex> lock(g_mu);  // once for the whole table (a probe round asks)
  Entry* table = map_table();
  for (int s = 1; s < kSlots - 1; ++s) {
    const int host = host_slot_locked(table, s);
    if (host != s) out.push_back({s, host});
  }
  return out;
}

void release_adopted_slot(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry* table = map_table();
  if (!table || slot <= 0 || slot >= kSlots) return;
  int32_t self = self_pid();
  if (slot == g_slot.load() && g_owner.load() == self) return;  // our own: never
  if (table[slot].pid.load() != self) return;
  // The flags while the entry is still ours: a newcomer's own flags are never touched.
  table[slot].flags.store(0);
  table[slot].pid.compare_exchange_strong(self, 0);
}

std::string agent_address(int slot) {
  // Abstract namespace: no file to clean up when a process dies.
  // The state directory is part of the name: registries in different directories (tests
  // use private ones) hand out the same slot numbers.
  return std::string(1, '\0') + "softverbs-" + std::to_string(getuid()) + "-" +
         std::to_string(std::hash<std::string>{}(state_dir())) + "-agent-" +
         std::to_string(slot);
}

}  // namespace softverbs::wire
