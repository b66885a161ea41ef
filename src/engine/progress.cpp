// The progress thread: timed retries (RNR NAK, no response) and deferred flushes.
// It sleeps on a condition variable until the next deadline or new work; it never spins.
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

namespace {

class Progress {
 public:
  void kick_at(uint32_t qpn, Clock::time_point when) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    timers_.emplace(when, qpn);
    cv_.notify_one();
  }
  void flush(uint32_t qpn) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    flushes_.push_back(qpn);
    cv_.notify_one();
  }

 private:
  // Started on first use, and again in a forked child (threads do not survive fork).
  void start_locked() {
    if (owner_ == getpid()) return;
    owner_ = getpid();
    timers_.clear();
    flushes_.clear();
    std::thread([this] { run(); }).detach();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!flushes_.empty()) {
        uint32_t qpn = flushes_.front();
        flushes_.pop_front();
        lock.unlock();
        if (wire::QpRef qp = wire::transport().find_local(qpn)) engine::flush(qp.get());
        lock.lock();
        continue;
      }
      if (timers_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto next = timers_.begin();
      if (next->first > Clock::now()) {
        cv_.wait_until(lock, next->first);
        continue;
      }
      uint32_t qpn = next->second;
      timers_.erase(next);
      lock.unlock();
      if (wire::QpRef qp = wire::transport().find_local(qpn)) kick(qp.get());
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, uint32_t> timers_;
  std::deque<uint32_t> flushes_;
  pid_t owner_ = 0;
};

Progress& progress() {
  // Never destroyed: the detached thread may still use it while the process exits.
  static Progress* p = new Progress;
  return *p;
}

}  // namespace

void schedule_kick(uint32_t qpn, Clock::time_point when) { progress().kick_at(qpn, when); }
void schedule_flush(uint32_t qpn) { progress().flush(qpn); }

}  // namespace softverbs::engine
