// bench/icrc: what the RoCE v2 ICRC costs per datagram, receiving (icrc_check over the whole
// datagram) and sending (IcrcBuilder fed a header, a payload and the pad from separate
// buffers, as the port's sender does). Run by hand: `cmake --build build --target icrc_bench
// && build/bench/icrc/icrc_bench`. Prints ns per datagram, the median of several runs, for
// the lengths a stream and a ping-pong carry at 1 KiB and 4 KiB path MTUs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "wire/roce/icrc.hpp"

using softverbs::wire::roce::IcrcBuilder;
using softverbs::wire::roce::IcrcContext;

namespace {

constexpr int kRuns = 7;

template <typename F>
double median_ns_per_call(long calls, F&& f) {
  std::vector<double> ns;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) f(i);
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(calls));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

int main() {
  const uint8_t src[4] = {10, 77, 1, 1}, dst[4] = {10, 77, 1, 2};
  const IcrcContext ctx = IcrcContext::from_ipv4(src, dst, 49152);
  struct Shape {
    const char* what;
    size_t header, payload;
  };
  // BTH 12; +RETH 16; +AETH 4; the ICRC 4 follows.
  const Shape shapes[] = {{"ACK (BTH+AETH)", 16, 0},        {"SEND 8 B", 12, 8},
                          {"WRITE_MIDDLE 1 KiB", 12, 1024}, {"WRITE_FIRST 1 KiB", 28, 1024},
                          {"SEND_MIDDLE 4 KiB", 12, 4096}};
  std::printf("| datagram | bytes | icrc_check (receive) ns | IcrcBuilder (send) ns | receive GB/s |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const size_t len = s.header + s.payload + 4;
    std::vector<uint8_t> dgram(len);
    for (size_t i = 0; i < len; ++i) dgram[i] = uint8_t(i * 131 + 7);
    softverbs::wire::roce::icrc_fill(ctx, dgram.data(), len);
    const long calls = 2000000 / long(1 + len / 256);
    unsigned sink = 0;
    const double rx = median_ns_per_call(calls, [&](long) {
      sink += softverbs::wire::roce::icrc_check(ctx, dgram.data(), len).ok();
    });
    std::vector<uint8_t> header(dgram.begin(), dgram.begin() + long(s.header));
    std::vector<uint8_t> payload(dgram.begin() + long(s.header), dgram.end() - 4);
    const double tx = median_ns_per_call(calls, [&](long) {
      IcrcBuilder b(ctx, len);
      b.add(header.data(), header.size());
      if (!payload.empty()) b.add(payload.data(), payload.size());
      sink += b.value();
    });
    if (sink == 0xdeadbeef) std::puts("");  // keeps the work
    std::printf("| %s | %zu | %.1f | %.1f | %.2f |\n", s.what, len, rx, tx, double(len) / rx);
  }
  return 0;
}
