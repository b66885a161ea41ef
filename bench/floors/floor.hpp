// Shared helpers for the floor programs: command line, clock, median, CPU pinning, a page
// shared between a parent and its forked child, and the one result line each program prints.
//
// Every floor program prints exactly one line on stdout:
//   NAME VALUE UNIT (median of R runs: DETAILS)
// bench/run reads the first three fields; the rest is for people.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <vector>

namespace floors {

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

struct Options {
  int runs;          // -r: measured runs; the median of them is printed
  long iters;        // -n: operations per run
  std::string mode;  // optional positional argument, for programs that have modes
};

// -r RUNS -n ITERS [MODE]; defaults come from the program.
inline Options parse(int argc, char** argv, int runs, long iters, const char* usage_tail) {
  Options o{runs, iters, {}};
  int c;
  while ((c = getopt(argc, argv, "r:n:h")) != -1) {
    switch (c) {
      case 'r': o.runs = std::atoi(optarg); break;
      case 'n': o.iters = std::atol(optarg); break;
      default:
        std::fprintf(stderr, "usage: %s [-r RUNS (default %d)] [-n ITERS (default %ld)]%s\n",
                     argv[0], runs, iters, usage_tail);
        std::exit(c == 'h' ? 0 : 2);
    }
  }
  if (optind < argc) o.mode = argv[optind];
  if (o.runs < 1 || o.iters < 1) {
    std::fprintf(stderr, "%s: RUNS and ITERS must be positive\n", argv[0]);
    std::exit(2);
  }
  return o;
}

inline double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The CPUs this process may run on, in ascending order.
inline std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) die("sched_getaffinity");
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  return cpus;
}

inline void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

// Anonymous memory that stays shared between this process and children forked later.
template <class T>
T* shared_object() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  return new (p) T();
}

// Forks; the child runs body() and exits with its result. Returns the child's pid.
template <class F>
pid_t fork_child(F body) {
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) std::_Exit(body());
  return pid;
}

inline void reap(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) die("waitpid");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "child %d failed (status 0x%x)\n", int(pid), status);
    std::exit(1);
  }
}

inline void report(const char* name, const std::vector<double>& samples, const char* unit,
                   const std::string& details) {
  std::printf("%s %.3f %s (median of %zu runs: %s)\n", name, median(samples), unit, samples.size(),
              details.c_str());
}

// Optimisation barrier: the compiler must assume memory was read and written here.
inline void clobber_memory() { asm volatile("" ::: "memory"); }

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace floors
