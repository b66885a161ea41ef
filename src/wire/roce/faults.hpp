// Fault injection on the RoCE v2 port, for tests between hosts where the kernel has no netem
// (tests/hosts/README.md). SOFTVERBS_FAULTS, read once per process, e.g.
//   SOFTVERBS_FAULTS="drop=1,reorder=5,dup=1,delay_us=200,seed=42"
// makes Port::send lose 1 % of the datagrams it is given, hold 5 % back until `gap` (default
// 1) later datagrams have gone or delay_us passed, and send 1 % twice. Each datagram is
// drawn for in that order (a dropped one is neither held nor doubled). The draws come from
// a generator seeded with `seed`, so one thread sending the same datagrams sees the same
// faults every run; with several sending threads the interleaving decides which datagram
// gets which draw. Unset or empty: no faults, and the port pays one pointer test per send.
// At exit a process that had faults prints what it did to stderr ("softverbs faults: ...").
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace softverbs::wire::roce {

struct FaultConfig {
  unsigned drop = 0;        // percent (0..100) of datagrams never sent
  unsigned reorder = 0;     // percent held back, then sent after `gap` later ones
  unsigned dup = 0;         // percent sent twice in a row
  unsigned gap = 1;         // how many later datagrams overtake a held one (1..64)
  unsigned delay_us = 200;  // a held datagram leaves after this long at the latest
  uint64_t seed = 1;

  // Parses "key=value,..." with the keys above. False, with *error saying why, on an
  // unknown key, a value that is not a number, or one out of range.
  static bool parse(const std::string& text, FaultConfig* out, std::string* error);
  bool any() const { return drop || reorder || dup; }
};

struct FaultStats {
  uint64_t seen = 0;        // datagrams given to send()
  uint64_t dropped = 0;
  uint64_t held = 0;        // sent late, after later ones (or after delay_us)
  uint64_t duplicated = 0;  // sent twice
};

class Faults {
 public:
  // Sends one datagram as the port would; returns 0 or -errno.
  using Sender = std::function<int(const void* data, size_t size)>;

  explicit Faults(const FaultConfig& config);
  Faults(const Faults&) = delete;
  Faults& operator=(const Faults&) = delete;
  ~Faults();

  // Sends `data` through `sender` zero, one or two times, now, or later from a copy (from
  // this or another thread). Returns what the sender returned, 0 for a dropped or held one.
  int send(const void* data, size_t size, Sender sender);
  // Sends every held datagram now.
  void flush();
  FaultStats stats() const;
  const FaultConfig& config() const { return config_; }

  // The process's faults from SOFTVERBS_FAULTS, made on first use and never freed (the
  // port is immortal too); nullptr when unset, empty or all zero. A malformed value is
  // reported on stderr once and means no faults.
  static Faults* from_env();

 private:
  struct Held {
    std::vector<uint8_t> bytes;
    Sender sender;
    unsigned overtakes_left;
    uint64_t deadline_ns;
  };

  unsigned draw();  // 0..99
  void release_due(std::unique_lock<std::mutex>& lock, bool all, uint64_t now_ns);
  void start_timer_thread();  // caller holds mu_
  void timer_loop();

  const FaultConfig config_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  uint64_t rng_;
  std::deque<Held> held_;
  FaultStats stats_;
  int timer_pid_ = 0;  // the process whose timer thread runs (a forked child starts its own)
  int timer_threads_ = 0;  // running in this process; the destructor waits for them
  bool stop_ = false;
};

}  // namespace softverbs::wire::roce
