// The progress thread: timed retries (RNR NAK, no response), deferred flushes, and peers
// that die. It sleeps in poll(2) on an eventfd (new work) and on one pidfd per peer
// process this process is connected to, with a timeout at the next retry deadline; it
// never spins.
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "core/core.hpp"
#include "wire/registry.hpp"
#include "wire/router.hpp"
#include "wire/transport.hpp"

namespace softverbs::engine {

namespace {

// Called with each watched process's pid once it died, after peer_died (watch_pid's).
std::atomic<void (*)(pid_t)> g_death_hook{nullptr};

class Progress {
 public:
  void kick_at(uint32_t qpn, Clock::time_point when) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    timers_.emplace(when, qpn);
    wake();
  }
  // QP `qpn` fails at `when` unless it left `connection` (was reset) meanwhile.
  void fail_at(uint32_t qpn, uint64_t connection, Clock::time_point when) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    fatals_.emplace(when, std::make_pair(qpn, connection));
    wake();
  }
  void flush(uint32_t qpn) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    flushes_.push_back(qpn);
    wake();
  }
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }  // the child restarts the thread on first use

  // Watched by pid: a process that starts in a dead one's slot must not hide that death.
  void watch(pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    if (peers_.count(pid)) return;
    int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) {  // already gone
      dead_pids_.push_back(pid);
    } else {
      peers_[pid] = fd;
    }
    wake();
  }

 private:
  void wake() {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // Started on first use, and again in a forked child (threads do not survive fork).
  void start_locked() {
    if (owner_ == wire::self_pid()) return;
    owner_ = wire::self_pid();
    timers_.clear();
    fatals_.clear();
    flushes_.clear();
    dead_pids_.clear();
    for (auto& [pid, pidfd] : peers_) close(pidfd);
    peers_.clear();
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    std::thread([this] { run(); }).detach();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!flushes_.empty()) {
        uint32_t qpn = flushes_.front();
        flushes_.pop_front();
        lock.unlock();
        if (wire::QpRef qp = wire::find_local(qpn)) engine::flush(qp.get());
        lock.lock();
        continue;
      }
      if (!dead_pids_.empty()) {
        pid_t pid = dead_pids_.front();
        dead_pids_.pop_front();
        lock.unlock();
        peer_died(pid);
        if (void (*hook)(pid_t) = g_death_hook.load(std::memory_order_acquire)) hook(pid);
        lock.lock();
        continue;
      }
      auto fatal = fatals_.begin();
      if (fatal != fatals_.end() && fatal->first <= Clock::now()) {
        auto [qpn, connection] = fatal->second;
        fatals_.erase(fatal);
        lock.unlock();
        if (wire::QpRef qp = wire::find_local(qpn))
          fail_if_still_connected(qp.get(), connection);
        lock.lock();
        continue;
      }
      auto next = timers_.begin();
      if (next != timers_.end() && next->first <= Clock::now()) {
        uint32_t qpn = next->second;
        timers_.erase(next);
        lock.unlock();
        if (wire::QpRef qp = wire::find_local(qpn)) kick(qp.get());
        lock.lock();
        continue;
      }
      // ppoll's nanosecond timeout: RNR timers are tens of microseconds, well under the
      // millisecond (and scheduler-tick) granularity of poll's.
      timespec ts{};
      timespec* timeout = nullptr;
      Clock::time_point due = Clock::time_point::max();
      if (next != timers_.end()) due = next->first;
      if (fatal != fatals_.end()) due = std::min(due, fatal->first);
      if (due != Clock::time_point::max()) {
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(due - Clock::now());
        int64_t n = std::max<int64_t>(0, ns.count());
        ts.tv_sec = static_cast<time_t>(n / 1000000000);
        ts.tv_nsec = static_cast<long>(n % 1000000000);
        timeout = &ts;
      }
      std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
      std::vector<pid_t> pids{0};
      for (auto& [pid, pidfd] : peers_) {
        fds.push_back({pidfd, POLLIN, 0});
        pids.push_back(pid);
      }
      lock.unlock();
      int n = ppoll(fds.data(), fds.size(), timeout, nullptr);
      lock.lock();
      if (n <= 0) continue;
      uint64_t drain;
      if (fds[0].revents) (void)!read(wake_fd_, &drain, sizeof(drain));
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto it = peers_.find(pids[i]);
        if (it == peers_.end() || it->second != fds[i].fd) continue;
        close(it->second);
        peers_.erase(it);
        dead_pids_.push_back(pids[i]);
      }
    }
  }

  std::mutex mu_;
  std::multimap<Clock::time_point, uint32_t> timers_;
  std::multimap<Clock::time_point, std::pair<uint32_t, uint64_t>> fatals_;  // qpn, connection
  std::deque<uint32_t> flushes_;
  std::deque<pid_t> dead_pids_;
  std::map<pid_t, int> peers_;  // pidfd of each peer process watched
  int wake_fd_ = -1;
  pid_t owner_ = 0;
};

Progress& progress() {
  // Never destroyed: the detached thread may still use it while the process exits.
  static Progress* p = [] {
    auto* made = new Progress;
    // The thread holds mu_ while it works: a fork then must not leave the child a mutex
    // locked by a thread it does not have (its first verb would hang there).
    pthread_atfork([] { progress().lock_for_fork(); }, [] { progress().unlock_after_fork(); },
                   [] { progress().unlock_after_fork(); });
    return made;
  }();
  return *p;
}

}  // namespace

void schedule_kick(uint32_t qpn, Clock::time_point when) { progress().kick_at(qpn, when); }
void schedule_flush(uint32_t qpn) { progress().flush(qpn); }

void watch_pid(pid_t pid, void (*on_death)(pid_t)) {
  g_death_hook.store(on_death, std::memory_order_release);
  progress().watch(pid);
}

void watch_peer_of(Qp* qp) {
  if (qp->type == IBV_QPT_UD || qp->type == IBV_QPT_RAW_PACKET) return;  // no peer QP
  static std::atomic<uint64_t> connections{0};
  int slot;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    // A peer on another host: its QPN's slot is of that host's registry, and no process of
    // ours (the RoCE link's retries find out whether the peer is there).
    if (wire::route(qp->attr.ah_attr.grh.dgid, qp->attr.dest_qp_num) != wire::Route::Shm) return;
    slot = wire::slot_of_qpn(qp->attr.dest_qp_num);
  }
  pid_t pid = wire::slot_owner(slot);
  if (pid <= 0) return;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    qp->connection = ++connections;
    qp->peer_pid = pid;
  }
  progress().watch(pid);
}

namespace {

bool connected(Qp* qp) {
  int st = qp->state.load();
  return qp->type != IBV_QPT_UD && st >= IBV_QPS_RTR && st != IBV_QPS_ERR;
}

}  // namespace

void fail_if_still_connected(Qp* qp, uint64_t connection) {
  if (!connected(qp)) return;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    if (qp->connection != connection) return;  // reset since (and maybe connected anew)
  }
  set_error(qp, IBV_EVENT_QP_FATAL);
}

void peer_died(pid_t pid) {
  // A connected QP whose peer process is gone will never hear from it again. A NIC would
  // find out when its retries run out; we make it fail after that same time (timeout x
  // (retry_cnt + 1)), so a program that finishes right after its peer did is not disturbed
  // and a program waiting for a message that can never come does not hang: ERR,
  // IBV_EVENT_QP_FATAL, outstanding work flushed. The timer is for this connection only:
  // the QP may be reset and connected to another process meanwhile, even one that took the
  // dead one's slot and QPN.
  std::vector<pid_t> hosts;
  for_each_qp([pid, &hosts](Qp* qp) {
    if (!connected(qp)) return;
    uint64_t connection;
    uint8_t timeout, retry;
    {
      std::lock_guard<std::mutex> lock(qp->attr_mu);
      if (qp->peer_pid != pid) return;
      // An XRC INI QP's TGT QP was handed over as its process ended (verbs/xrc.cpp): the
      // process that adopted the slot runs it now, so the connection lives on.
      // (Followed even if it died since: its death brings us back here for it.)
      if (qp->type == IBV_QPT_XRC_SEND) {
        bool after_death;
        const pid_t host = wire::adopter_of(wire::slot_of_qpn(qp->attr.dest_qp_num), &after_death);
        if (host > 0 && host != pid && !after_death) {
          qp->peer_pid = host;
          hosts.push_back(host);
          return;
        }
      }
      connection = qp->connection;
      timeout = qp->attr.timeout;
      retry = qp->attr.retry_cnt;
    }
    Clock::duration budget = ack_timeout(timeout) * (retry + 1);
    progress().fail_at(qp->qpn(), connection, Clock::now() + budget);
  });
  for (pid_t host : hosts)
    if (host != wire::self_pid()) progress().watch(host);
}

}  // namespace softverbs::engine
