// Which post-send API a process used: the work requests each QP posted through
// ibv_post_send and through the ibv_wr_* API are counted on the QP (plain counters under its
// sq_mu, so posting pays one add), summed here when it is destroyed, and, with
// SOFTVERBS_API_COUNTS=FILE, appended to FILE as one line when the process exits:
//   PID PROGRAM ibv_post_send N ibv_wr M window_rts A window_post B window_failed C
//   ring_waited D via_agent no_window/ring_full/no_receive/too_small/srq/other E/F/G/H/I/J
// Tests use it to see which API a program (perftest) really took; the rest (its QPs' same-host
// receive windows, stat::PeerWindowCounts summed) shows what a benchmark's SENDs met.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

std::atomic<uint64_t> g_post_send{0};
std::atomic<uint64_t> g_wr_api{0};
constexpr int kWindowCounts = sizeof(stat::PeerWindowCounts) / sizeof(uint64_t);
static_assert(kWindowCounts == 10, "the line below names each count");
std::atomic<uint64_t> g_window[kWindowCounts];

void write_tally() {
  const char* file = std::getenv("SOFTVERBS_API_COUNTS");
  if (!file || !*file) return;
  char line[512];
  uint64_t c[kWindowCounts];
  for (int i = 0; i < kWindowCounts; ++i) c[i] = g_window[i].load();
  int n = std::snprintf(line, sizeof line,
                        "%d %s ibv_post_send %" PRIu64 " ibv_wr %" PRIu64 " window_rts %" PRIu64
                        " window_post %" PRIu64 " window_failed %" PRIu64 " ring_waited %" PRIu64
                        " via_agent no_window/ring_full/no_receive/too_small/srq/other %" PRIu64
                        "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "\n",
                        int(getpid()), program_invocation_short_name, g_post_send.load(),
                        g_wr_api.load(), c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]);
  if (n <= 0) return;
  // One write of one short line with O_APPEND: the lines of several processes do not mix.
  int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "softverbs: cannot write SOFTVERBS_API_COUNTS %s: %s\n", file,
                 std::strerror(errno));
    return;
  }
  ssize_t w = write(fd, line, std::min<size_t>(size_t(n), sizeof line - 1));
  (void)w;
  close(fd);
}

// Registered when the library is loaded, only if asked for.
const bool g_registered = [] {
  const char* file = std::getenv("SOFTVERBS_API_COUNTS");
  return file && *file && std::atexit(write_tally) == 0;
}();

}  // namespace

void tally_destroyed_qp(const Qp& qp) {
  g_post_send.fetch_add(qp.posted_by_post_send, std::memory_order_relaxed);
  g_wr_api.fetch_add(qp.posted_by_wr_api, std::memory_order_relaxed);
  uint64_t c[kWindowCounts];
  std::memcpy(c, &qp.window_counts, sizeof(c));
  for (int i = 0; i < kWindowCounts; ++i) g_window[i].fetch_add(c[i], std::memory_order_relaxed);
}

}  // namespace softverbs
