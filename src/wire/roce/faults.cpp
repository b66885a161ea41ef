// Fault injection on the RoCE v2 port (see faults.hpp): drop, hold back and duplicate the
// datagrams Port::send is given, as SOFTVERBS_FAULTS says.
#include "wire/roce/faults.hpp"

#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace softverbs::wire::roce {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

bool FaultConfig::parse(const std::string& text, FaultConfig* out, std::string* error) {
  FaultConfig c;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* rest = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(value.c_str(), &rest, 10);
    if (value.empty() || *rest || errno || value[0] == '-') {
      *error = "'" + item + "': want KEY=NUMBER";
      return false;
    }
    struct Field {
      const char* name;
      unsigned* to;
      unsigned long long min, max;
    };
    const Field fields[] = {{"drop", &c.drop, 0, 100},
                            {"reorder", &c.reorder, 0, 100},
                            {"dup", &c.dup, 0, 100},
                            {"gap", &c.gap, 1, 64},
                            {"delay_us", &c.delay_us, 0, 10'000'000}};
    bool known = false;
    for (const Field& f : fields) {
      if (key != f.name) continue;
      if (n < f.min || n > f.max) {
        *error = "'" + item + "': " + key + " is " + std::to_string(f.min) + ".." +
                 std::to_string(f.max);
        return false;
      }
      *f.to = unsigned(n);
      known = true;
    }
    if (key == "seed") {
      c.seed = n;
      known = true;
    }
    if (!known) {
      *error = "unknown key '" + key + "' (drop, reorder, dup, gap, delay_us, seed)";
      return false;
    }
  }
  *out = c;
  return true;
}

Faults::Faults(const FaultConfig& config)
    : config_(config), rng_(config.seed ^ 0x9e3779b97f4a7c15ull) {}

Faults::~Faults() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_ = true;
  wake_.notify_all();
  wake_.wait(lock, [this] { return timer_threads_ == 0; });
}

// splitmix64: small, and the same sequence for the same seed everywhere.
unsigned Faults::draw() {
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return unsigned((z ^ (z >> 31)) % 100);
}

int Faults::send(const void* data, size_t size, Sender sender) {
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.seen;
  // Three draws for every datagram, whatever the first ones decide, so that the fate of
  // the n-th datagram depends on the seed and n only.
  const bool drop = draw() < config_.drop;
  const bool hold = draw() < config_.reorder;
  const bool twice = draw() < config_.dup;
  int result = 0;
  if (drop) {
    ++stats_.dropped;
  } else if (hold) {
    ++stats_.held;
    const auto* bytes = static_cast<const uint8_t*>(data);
    held_.push_back({std::vector<uint8_t>(bytes, bytes + size), std::move(sender), config_.gap,
                     now_ns() + uint64_t(config_.delay_us) * 1000});
    start_timer_thread();
    wake_.notify_all();
    return 0;
  } else {
    result = sender(data, size);
    if (twice) {
      ++stats_.duplicated;
      sender(data, size);
    }
  }
  // What was held behind this one moves one step closer to leaving.
  for (Held& h : held_)
    if (h.overtakes_left > 0 && !drop) --h.overtakes_left;
  release_due(lock, false, now_ns());
  return result;
}

// Sends the held datagrams that are due (all of them with `all`), oldest first. Caller
// holds mu_ through `lock`.
void Faults::release_due(std::unique_lock<std::mutex>& lock, bool all, uint64_t now) {
  (void)lock;
  for (auto it = held_.begin(); it != held_.end();) {
    if (all || it->overtakes_left == 0 || it->deadline_ns <= now) {
      it->sender(it->bytes.data(), it->bytes.size());
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

void Faults::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  release_due(lock, true, 0);
}

FaultStats Faults::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Faults::start_timer_thread() {
  // One thread per process: a forked child has none of its parent's threads.
  const int pid = int(getpid());
  if (timer_pid_ == pid) return;
  timer_pid_ = pid;
  ++timer_threads_;
  std::thread([this] { timer_loop(); }).detach();
}

void Faults::timer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (held_.empty()) {
      wake_.wait(lock);
      continue;
    }
    uint64_t first = held_.front().deadline_ns;
    for (const Held& h : held_) first = std::min(first, h.deadline_ns);
    const uint64_t now = now_ns();
    if (first > now) {
      wake_.wait_for(lock, std::chrono::nanoseconds(first - now));
      continue;
    }
    release_due(lock, false, now);
  }
  // The destructor waits for this, under mu_; nothing of *this is touched after the unlock.
  --timer_threads_;
  wake_.notify_all();
}

Faults* Faults::from_env() {
  static Faults* const faults = []() -> Faults* {
    const char* text = std::getenv("SOFTVERBS_FAULTS");
    if (!text || !*text) return nullptr;
    FaultConfig config;
    std::string error;
    if (!FaultConfig::parse(text, &config, &error)) {
      std::fprintf(stderr, "softverbs: SOFTVERBS_FAULTS ignored: %s\n", error.c_str());
      return nullptr;
    }
    if (!config.any()) return nullptr;
    auto* f = new Faults(config);  // immortal, like the port that calls it
    std::atexit([] {
      const FaultStats s = from_env()->stats();
      std::fprintf(stderr,
                   "softverbs faults (pid %d): %" PRIu64 " datagrams, %" PRIu64
                   " dropped, %" PRIu64 " held back, %" PRIu64 " duplicated\n",
                   int(getpid()), s.seen, s.dropped, s.held, s.duplicated);
    });
    return f;
  }();
  return faults;
}

}  // namespace softverbs::wire::roce
