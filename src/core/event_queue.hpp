// A FIFO of events whose file descriptor is readable exactly while the FIFO is not empty
// (or a peer's wake-up waits to be turned into events). It backs completion channels
// (ibv_comp_channel::fd) and the context's async_fd.
//
// The fd the application sees is an epoll instance over two eventfds: our own "non-empty"
// level, which only we write, and the wake-up fd, which peers in other processes write to
// make a sleeping waiter look at their work. poll/epoll/O_NONBLOCK on the fd behave as on a
// kernel channel. A peer cannot block us whatever it writes (both eventfds are
// non-blocking and a full wake-up counter is simply read back to zero). An eventfd
// write/read costs about a third of the AF_UNIX datagram send/recv this used before, and a
// wake-up through it one to two microseconds less on this VM (decision 0002). All changes
// happen under one mutex, so the level always matches the FIFO. Syscalls only where the
// level changes: a waiter that turns a peer's wake-up into an event and takes it at once
// never raises the level at all.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>

namespace softverbs {

// Another fd a blocking waiter sleeps on beside the queue's, and what it does around that
// sleep: a waiter on a CQ fed from the wire sleeps on the port's socket too, and receives
// what arrives itself (refill), one wake-up instead of the port thread's and then ours.
struct SleepAlso {
  int fd = -1;
  void (*begin)() = nullptr;  // before the first sleep
  void (*end)() = nullptr;    // on the way out, when begin ran
};

template <typename T>
class EventQueue {
 public:
  EventQueue() = default;
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;
  ~EventQueue() { close_fds(); }

  // Returns 0 or an errno value.
  int open() {
    level_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    fd_ = epoll_create1(EPOLL_CLOEXEC);
    int err = level_fd_ < 0 || wake_fd_ < 0 || fd_ < 0 ? errno : 0;
    for (int member : {level_fd_, wake_fd_}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = member;
      if (!err && epoll_ctl(fd_, EPOLL_CTL_ADD, member, &ev) != 0) err = errno;
    }
    if (err) close_fds();
    return err;
  }
  void close_fds() {
    for (int* f : {&fd_, &level_fd_, &wake_fd_}) {
      if (*f >= 0) ::close(*f);
      *f = -1;
    }
  }
  int fd() const { return fd_; }
  // Writing an 8-byte count to it makes fd() readable: how a peer wakes a waiter.
  int write_fd() {
    handed_out_.store(true, std::memory_order_relaxed);
    return wake_fd_;
  }

  // Adds `fd` to what makes fd() readable (a CQ's moderation timer): a waiter wakes for it
  // and its refill must read it. Returns 0 or an errno value.
  int watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return epoll_ctl(fd_, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
  }
  void unwatch(int fd) { epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr); }

  void push(const T& item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(item);
    if (quiet_ == 0) raise_level();
  }

  // Pushes `item` if `decide()`, which runs under the queue lock, says so. Returns that.
  template <typename D>
  bool push_if(const T& item, D&& decide) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!decide()) return false;
    items_.push_back(item);
    if (quiet_ == 0) raise_level();
    return true;
  }

  // Removes one queued event equal to `item` if `decide()`, which runs under the queue
  // lock, says so (events equal to it are alike: which one goes does not matter).
  template <typename D>
  void take_back_if(const T& item, D&& decide) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!decide()) return;
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (*it == item) {
        items_.erase(it);
        if (items_.empty()) lower_level();
        return;
      }
  }

  // Whether an event equal to `item` is still queued. Only from `deliver` (below), which
  // runs under the queue lock.
  bool queued_locked(const T& item) const {
    for (const T& i : items_)
      if (i == item) return true;
    return false;
  }

  // Pops the oldest event. `deliver(item)` runs under the queue lock, so an event is
  // either still queued or already counted as handed out, never in between (destroy
  // relies on that to know which events it must wait for).
  template <typename F>
  bool try_pop(T* out, F&& deliver) {
    std::lock_guard<std::mutex> lock(mu_);
    return pop_locked(out, deliver);
  }

  // Blocks unless the application set O_NONBLOCK on the fd. Returns 0, or -1 with errno.
  template <typename F>
  int wait_pop(T* out, F&& deliver) {
    return wait_pop(out, deliver, [](uint64_t) {});
  }

  // The same, for a queue that peers may also wake (by writing to write_fd()) after they
  // left work that `refill(wakeups)` turns into events. A waiter consumes the wake-ups so
  // far (their count goes to refill), then refills, then sleeps in epoll_wait on the fd
  // (or says EAGAIN if the application set O_NONBLOCK on it). Consumed before the refill,
  // a wake-up for work the refill takes does not leave the fd readable with nothing
  // pending; one that arrives after it stays counted, so none is lost.
  template <typename F, typename R>
  int wait_pop(T* out, F&& deliver, R&& refill, const SleepAlso& also = {}) {
    bool began = false;
    struct EndOnExit {
      const SleepAlso& also;
      bool& began;
      ~EndOnExit() {
        if (began && also.end) also.end();
      }
    } end_on_exit{also, began};
    for (;;) {
      uint64_t wakeups = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++quiet_;  // what refill() pushes is taken below: no need to raise the level for it
        if (handed_out_.load(std::memory_order_relaxed)) wakeups = drain_wakeups();
      }
      refill(wakeups);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --quiet_;
        bool got = pop_locked(out, deliver);
        if (!items_.empty()) raise_level();  // events left (ours or other threads')
        if (got) return 0;
      }
      int flags = ::fcntl(fd_, F_GETFL);  // only on the way to sleep
      if (flags < 0) return -1;
      bool nonblocking = flags & O_NONBLOCK;
      int ready;
      if (also.fd >= 0 && !nonblocking) {
        if (!began && also.begin) {  // what arrived before it waits in also.fd: poll sees it
          also.begin();
          began = true;
        }
        pollfd fds[2] = {{fd_, POLLIN, 0}, {also.fd, POLLIN, 0}};
        ready = ::poll(fds, 2, -1);
      } else {
        epoll_event ev;
        ready = ::epoll_wait(fd_, &ev, 1, nonblocking ? 0 : -1);
      }
      if (ready < 0 && errno != EINTR) return -1;
      if (ready == 0 && nonblocking) {
        errno = EAGAIN;
        return -1;
      }
    }
  }

  // Removes queued (not yet handed out) events matching `pred`; returns how many.
  template <typename P>
  size_t remove_if(P&& pred) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t before = items_.size();
    for (auto it = items_.begin(); it != items_.end();)
      it = pred(*it) ? items_.erase(it) : it + 1;
    if (before && items_.empty()) lower_level();
    return before - items_.size();
  }

  bool empty() {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.empty();
  }
  // Where `softverbs stat` looks (verbs/stat_publish.cpp): the FIFO, read from another
  // process, and the eventfds whose counts say whether fd() is readable.
  const void* items_address() const { return &items_; }
  size_t item_size() const { return sizeof(T); }
  int level_fd() const { return level_fd_; }
  int wake_fd() const { return wake_fd_; }

 private:
  template <typename F>
  bool pop_locked(T* out, F&& deliver) {
    if (items_.empty()) return false;
    *out = items_.front();
    items_.pop_front();
    if (items_.empty()) lower_level();
    deliver(*out);
    return true;
  }
  // Our own level: a count of 1 while raised_ (nobody else writes level_fd_).
  void raise_level() {
    if (raised_) return;
    uint64_t one = 1;
    raised_ = ::write(level_fd_, &one, sizeof(one)) == sizeof(one);
  }
  void lower_level() {
    if (!raised_) return;
    uint64_t count;
    (void)!::read(level_fd_, &count, sizeof(count));
    raised_ = false;
  }
  // Takes every peer wake-up so far at once (an eventfd read returns and clears the count).
  uint64_t drain_wakeups() {
    uint64_t count = 0;
    return ::read(wake_fd_, &count, sizeof(count)) == sizeof(count) ? count : 0;
  }

  std::mutex mu_;
  std::deque<T> items_;
  bool raised_ = false;  // under mu_
  int quiet_ = 0;        // under mu_: waiters refilling (they settle the level afterwards)
  std::atomic<bool> handed_out_{false};  // write_fd() was given to peers: drain before refill
  int fd_ = -1;          // epoll over the two below: what the application sees
  int level_fd_ = -1;    // eventfd: 1 while the FIFO is not empty
  int wake_fd_ = -1;     // eventfd: peers' wake-ups
};

}  // namespace softverbs
