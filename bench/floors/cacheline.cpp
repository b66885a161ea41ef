// Cache-line ping-pong between two processes: the floor for polling-mode latency.
//
// Parent and forked child share one page. The parent stores an odd sequence number in a
// cache line; the child, spinning on that line, answers with the next even number; the
// parent spins until it sees it. Each round trip moves the line across twice, so one-way
// latency = run time / (2 x round trips). With two or more CPUs the processes are pinned to
// different ones (polling on a shared core only measures the scheduler); with one CPU the
// spinners yield instead.
//
// Mode "two-lines": each side writes its own line and spins on the other's, as perftest's
// ib_write_lat does (each side's buffer is written by the peer) and as any transport with
// one ring per direction does. The writer must first take its line away from the reader
// spinning on it, so this costs more than one shared line, whose reader becomes its next
// writer (cacheline2_oneway).
#include <atomic>
#include <cstdio>
#include <cstdint>

#include "floor.hpp"

namespace {

struct alignas(64) Line {
  std::atomic<uint64_t> value{0};
};

struct Shared {
  Line seq;   // odd: written by the parent; even: written by the child
  Line stop;  // nonzero: the child exits
  Line child_seq;  // two-lines mode: the child's answers (seq then only has the parent's)
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "needs lock-free 64-bit atomics");

inline void spin_hint(bool yield) {
  if (yield) sched_yield();
}

// The line the child answers on: the parent's own, or its own in two-lines mode.
Line& answer_line(Shared* s, bool two_lines) { return two_lines ? s->child_seq : s->seq; }

int responder(Shared* s, bool yield, bool two_lines) {
  Line& answer = answer_line(s, two_lines);
  for (;;) {
    const uint64_t v = s->seq.value.load(std::memory_order_acquire);
    if ((v & 1) && answer.value.load(std::memory_order_relaxed) != v + 1) {
      answer.value.store(v + 1, std::memory_order_release);
    } else if (s->stop.value.load(std::memory_order_relaxed)) {
      return 0;
    } else {
      spin_hint(yield);
    }
  }
}

// Runs `iters` round trips starting from sequence number *seq; returns nanoseconds.
double round_trips(Shared* s, uint64_t* seq, long iters, bool yield, bool two_lines) {
  Line& answer = answer_line(s, two_lines);
  uint64_t v = *seq;
  const double t0 = floors::now_ns();
  for (long i = 0; i < iters; ++i) {
    s->seq.value.store(v + 1, std::memory_order_release);
    while (answer.value.load(std::memory_order_acquire) != v + 2) spin_hint(yield);
    v += 2;
  }
  const double t1 = floors::now_ns();
  *seq = v;
  return t1 - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(argc, argv, 11, 200000, " [one-line|two-lines]");
  if (!o.mode.empty() && o.mode != "one-line" && o.mode != "two-lines") {
    std::fprintf(stderr, "%s: mode must be one-line or two-lines\n", argv[0]);
    return 2;
  }
  const bool two_lines = o.mode == "two-lines";
  const std::vector<int> cpus = floors::allowed_cpus();
  const bool pinned = cpus.size() >= 2;
  Shared* s = floors::shared_object<Shared>();

  const pid_t child = floors::fork_child([&] {
    if (pinned) floors::pin_to(cpus[1]);
    return responder(s, !pinned, two_lines);
  });
  if (pinned) floors::pin_to(cpus[0]);

  uint64_t seq = 0;
  round_trips(s, &seq, std::max(1L, o.iters / 10), !pinned, two_lines);  // warm-up: both sides running
  std::vector<double> one_way_us;
  for (int r = 0; r < o.runs; ++r)
    one_way_us.push_back(round_trips(s, &seq, o.iters, !pinned, two_lines) / (2.0 * o.iters) / 1000.0);
  s->stop.value.store(1, std::memory_order_relaxed);
  floors::reap(child);

  const std::string where = pinned ? "pinned to cpus " + std::to_string(cpus[0]) + "," +
                                         std::to_string(cpus[1])
                                   : std::string("one cpu, yielding");
  floors::report(two_lines ? "cacheline2_oneway" : "cacheline_oneway", one_way_us, "us",
                 std::to_string(o.iters) + " round trips each, " + where);
  return 0;
}
