// memcpy bandwidth at 1 MiB, one thread: the ceiling for any copy that a process makes
// itself (e.g. into memory a peer has mapped).
#include <cstdint>

#include "floor.hpp"

int main(int argc, char** argv) {
  const floors::Options o = floors::parse(argc, argv, 11, 4000, "");
  const size_t size = floors::kMiB;
  auto* src = static_cast<unsigned char*>(std::aligned_alloc(4096, size));
  auto* dst = static_cast<unsigned char*>(std::aligned_alloc(4096, size));
  if (!src || !dst) floors::die("aligned_alloc");
  std::memset(src, 0x5a, size);  // fault every page in before timing
  std::memset(dst, 0xa5, size);

  auto run = [&](long iters) {
    const double t0 = floors::now_ns();
    for (long i = 0; i < iters; ++i) {
      std::memcpy(dst, src, size);
      floors::clobber_memory();
    }
    return double(size) * double(iters) / (floors::now_ns() - t0);  // bytes/ns = GB/s
  };
  run(std::max(1L, o.iters / 10));  // warm-up
  std::vector<double> gbps;
  for (int r = 0; r < o.runs; ++r) gbps.push_back(run(o.iters));
  floors::report("memcpy_1MiB", gbps, "GB/s",
                 std::to_string(o.iters) + " copies of 1 MiB each, one thread, 1 GB = 1e9 bytes");
  std::free(src);
  std::free(dst);
  return 0;
}
