// Cross-memory attach bandwidth at 1 MiB between two processes: process_vm_writev (mode
// "writev", the default) or process_vm_readv ("readv"), one 1 MiB iovec on each side.
// This is the ceiling for a payload that one process copies straight into (or out of)
// another's registered buffer, as RDMA WRITE/SEND (writev) and RDMA READ (readv) do.
//
// The forked child allocates and touches its buffer, sends the address up a pipe and
// sleeps until the parent is done; only the parent's CPU does the copying.
#include <sys/uio.h>

#include <cstdint>

#include "floor.hpp"

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(argc, argv, 11, 2000, " [writev|readv]");
  const std::string mode = o.mode.empty() ? "writev" : o.mode;
  if (mode != "writev" && mode != "readv") {
    std::fprintf(stderr, "%s: mode must be writev or readv\n", argv[0]);
    return 2;
  }
  const bool writing = mode == "writev";
  const size_t size = floors::kMiB;

  int up[2], down[2];  // child -> parent: buffer address; parent -> child: done
  if (pipe(up) != 0 || pipe(down) != 0) floors::die("pipe");
  const pid_t child = floors::fork_child([&] {
    auto* buf = static_cast<unsigned char*>(std::aligned_alloc(4096, size));
    if (!buf) floors::die("aligned_alloc");
    std::memset(buf, 0x11, size);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(buf);
    if (write(up[1], &addr, sizeof addr) != sizeof addr) floors::die("write(pipe)");
    char done;
    return read(down[0], &done, 1) == 1 ? 0 : 1;
  });

  uintptr_t remote_addr;
  if (read(up[0], &remote_addr, sizeof remote_addr) != sizeof remote_addr)
    floors::die("read(pipe)");
  auto* local = static_cast<unsigned char*>(std::aligned_alloc(4096, size));
  if (!local) floors::die("aligned_alloc");
  std::memset(local, 0x22, size);
  const iovec liov{local, size};
  const iovec riov{reinterpret_cast<void*>(remote_addr), size};

  auto run = [&](long iters) {
    const double t0 = floors::now_ns();
    for (long i = 0; i < iters; ++i) {
      const ssize_t n = writing ? process_vm_writev(child, &liov, 1, &riov, 1, 0)
                                : process_vm_readv(child, &liov, 1, &riov, 1, 0);
      if (n != ssize_t(size)) floors::die(writing ? "process_vm_writev" : "process_vm_readv");
    }
    return double(size) * double(iters) / (floors::now_ns() - t0);  // bytes/ns = GB/s
  };
  run(std::max(1L, o.iters / 10));  // warm-up
  std::vector<double> gbps;
  for (int r = 0; r < o.runs; ++r) gbps.push_back(run(o.iters));
  if (write(down[1], "x", 1) != 1) floors::die("write(pipe)");
  floors::reap(child);

  const std::string name = "process_vm_" + mode + "_1MiB";
  floors::report(name.c_str(), gbps, "GB/s",
                 std::to_string(o.iters) + " calls of 1 MiB each, parent to forked child, "
                                           "1 GB = 1e9 bytes");
  std::free(local);
  return 0;
}
