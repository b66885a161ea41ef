// Message rings between two processes: does one ring shared by both directions beat one
// ring per direction? (Not a floor for bench/run's table: the question behind
// docs/decisions/0003, "the polled path".)
//
// Parent and forked child play ping-pong through 32-slot rings of 8-byte messages; a slot
// has a sequence word written last, as in wire/window.hpp. Mode "per-direction": each side
// writes its own ring and spins on the other's. Mode "shared": line n of one ring carries
// message n in its first half and the answer in its second, so the answer goes into the
// line the question arrived in. ":WORK" (e.g. "shared:300") makes the answering side spin
// WORK iterations of a loop between reading a message and answering it, standing for
// the software a real receiver runs there (poll, post a receive, post the answer).
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "floor.hpp"

namespace {

constexpr uint64_t kSlots = 32;

struct alignas(32) Half {
  std::atomic<uint64_t> seq{0};
  uint32_t opcode = 0, length = 0;
  uint64_t payload = 0;
};
struct alignas(64) SharedLine {
  Half question, answer;
};
struct alignas(64) OwnLine {
  Half message;
};
static_assert(sizeof(SharedLine) == 64 && sizeof(OwnLine) == 64, "one cache line per slot");

struct Rings {
  SharedLine shared[kSlots];
  OwnLine questions[kSlots];
  OwnLine answers[kSlots];
};

void put(Half& h, uint64_t n, uint64_t payload) {
  h.opcode = 1;
  h.length = 8;
  h.payload = payload;
  h.seq.store(n, std::memory_order_release);
}

uint64_t get(Half& h, uint64_t n) {
  while (h.seq.load(std::memory_order_acquire) != n) {
  }
  return h.payload + h.length;
}

void work(long iters) {
  for (long i = 0; i < iters; ++i) floors::clobber_memory();  // not optimised away
}

Half& question(Rings* r, bool shared, uint64_t n) {
  return shared ? r->shared[n % kSlots].question : r->questions[n % kSlots].message;
}
Half& answer(Rings* r, bool shared, uint64_t n) {
  return shared ? r->shared[n % kSlots].answer : r->answers[n % kSlots].message;
}

}  // namespace

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(argc, argv, 11, 200000, " [per-direction|shared][:WORK]");
  std::string mode = o.mode.empty() ? "per-direction" : o.mode;
  long work_iters = 0;
  if (size_t colon = mode.find(':'); colon != std::string::npos) {
    work_iters = std::atol(mode.c_str() + colon + 1);
    mode.resize(colon);
  }
  if (mode != "per-direction" && mode != "shared") {
    std::fprintf(stderr, "%s: mode must be per-direction or shared (optionally :WORK)\n", argv[0]);
    return 2;
  }
  const bool shared = mode == "shared";
  const std::vector<int> cpus = floors::allowed_cpus();
  if (cpus.size() < 2) {
    std::fprintf(stderr, "%s: needs two CPUs to spin on\n", argv[0]);
    return 2;
  }
  Rings* r = floors::shared_object<Rings>();
  const long total = o.iters * (o.runs + 1);

  const pid_t child = floors::fork_child([&] {
    floors::pin_to(cpus[1]);
    for (long i = 1; i <= total; ++i) {
      const uint64_t n = static_cast<uint64_t>(i);
      const uint64_t p = get(question(r, shared, n), n);
      work(work_iters);
      put(answer(r, shared, n), n, p);
    }
    return 0;
  });
  floors::pin_to(cpus[0]);

  uint64_t n = 1, acc = 0;
  std::vector<double> one_way_ns;
  for (int run = 0; run <= o.runs; ++run) {  // run 0 warms up
    const double t0 = floors::now_ns();
    for (long i = 0; i < o.iters; ++i, ++n) {
      put(question(r, shared, n), n, acc);
      acc = get(answer(r, shared, n), n);
    }
    const double t1 = floors::now_ns();
    if (run > 0) one_way_ns.push_back((t1 - t0) / (2.0 * o.iters));
  }
  floors::reap(child);
  floors::report("ring_oneway", one_way_ns, "ns",
                 std::to_string(o.iters) + " round trips each, " + mode + ", answer after " +
                     std::to_string(work_iters) + " loop iterations, pinned to cpus " +
                     std::to_string(cpus[0]) + "," + std::to_string(cpus[1]));
  return 0;
}
