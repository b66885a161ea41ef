// eventfd ping-pong between two processes: the floor for event-mode (`-e`) latency.
//
// Two eventfds, one per direction. The parent writes "ping" and blocks in read() on the
// other; the forked child blocks in read(), then writes "pong". Every message is one
// blocking wake-up of a sleeping process, which is what a completion-channel event costs
// at best. One-way latency = run time / (2 x round trips).
//
// CPU placement (optional argument): "free" (default) leaves it to the scheduler, as for
// perftest, which pins nothing; "cross" pins the two processes to different CPUs (every
// wake-up crosses CPUs); "same" pins both to one CPU.
#include <sys/eventfd.h>

#include <cstdint>

#include "floor.hpp"

namespace {

constexpr uint64_t kPing = 1;
constexpr uint64_t kStop = 2;

uint64_t take(int fd) {
  uint64_t v;
  if (read(fd, &v, sizeof v) != sizeof v) floors::die("read(eventfd)");
  return v;
}

void give(int fd, uint64_t v) {
  if (write(fd, &v, sizeof v) != sizeof v) floors::die("write(eventfd)");
}

double round_trips(int to_child, int to_parent, long iters) {
  const double t0 = floors::now_ns();
  for (long i = 0; i < iters; ++i) {
    give(to_child, kPing);
    take(to_parent);
  }
  return floors::now_ns() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(argc, argv, 11, 20000, " [free|cross|same]");
  const std::string placement = o.mode.empty() ? "free" : o.mode;
  if (placement != "free" && placement != "cross" && placement != "same") {
    std::fprintf(stderr, "%s: placement must be free, cross or same\n", argv[0]);
    return 2;
  }
  const std::vector<int> cpus = floors::allowed_cpus();
  const bool cross = placement == "cross" && cpus.size() >= 2;
  const bool same = placement == "same" || (placement == "cross" && cpus.size() < 2);

  const int to_child = eventfd(0, EFD_CLOEXEC);
  const int to_parent = eventfd(0, EFD_CLOEXEC);
  if (to_child < 0 || to_parent < 0) floors::die("eventfd");

  const pid_t child = floors::fork_child([&] {
    if (cross) floors::pin_to(cpus[1]);
    if (same) floors::pin_to(cpus[0]);
    while (take(to_child) == kPing) give(to_parent, kPing);
    return 0;
  });
  if (cross || same) floors::pin_to(cpus[0]);

  round_trips(to_child, to_parent, std::max(1L, o.iters / 10));  // warm-up
  std::vector<double> one_way_us;
  for (int r = 0; r < o.runs; ++r)
    one_way_us.push_back(round_trips(to_child, to_parent, o.iters) / (2.0 * o.iters) / 1000.0);
  give(to_child, kStop);
  floors::reap(child);

  std::string where = "scheduler places the processes";
  if (cross) where = "pinned to cpus " + std::to_string(cpus[0]) + "," + std::to_string(cpus[1]);
  if (same) where = "both pinned to cpu " + std::to_string(cpus[0]);
  floors::report("eventfd_oneway", one_way_us, "us",
                 std::to_string(o.iters) + " round trips each, " + where);
  return 0;
}
