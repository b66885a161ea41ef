// A FIFO of events whose file descriptor is readable exactly while the FIFO is not empty.
// It backs completion channels (ibv_comp_channel::fd) and the context's async_fd.
//
// The fd is one end of an AF_UNIX datagram socketpair; we keep at most one datagram queued
// as the "non-empty" level. All changes happen under one mutex, so the fd's readability
// always matches the FIFO. poll/epoll/O_NONBLOCK on the fd behave as on a kernel channel.
// Syscalls only where the level changes: a waiter that turns a peer's wake-up into an
// event and takes it at once never raises the level at all, and sleeps and wakes in two
// (recv(MSG_PEEK), then recvmmsg).
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <mutex>

namespace softverbs {

template <typename T>
class EventQueue {
 public:
  EventQueue() = default;
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;
  ~EventQueue() { close_fds(); }

  // Returns 0 or an errno value.
  int open() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) return errno;
    read_fd_ = sv[0];
    write_fd_ = sv[1];
    return 0;
  }
  void close_fds() {
    if (read_fd_ >= 0) ::close(read_fd_);
    if (write_fd_ >= 0) ::close(write_fd_);
    read_fd_ = write_fd_ = -1;
  }
  int fd() const { return read_fd_; }
  // The other end: writing a byte to it makes fd() readable (how a peer wakes a waiter).
  int write_fd() const { return write_fd_; }

  void push(const T& item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(item);
    if (quiet_ == 0) raise_level();
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
    return wait_pop(out, deliver, [] {});
  }

  // The same, for a queue that peers may also wake (by writing to write_fd()) after they
  // left work that `refill` turns into events. A waiter refills first, then sleeps in one
  // recv(MSG_PEEK) on the fd (which blocks, or says EAGAIN if the application set
  // O_NONBLOCK, with no fcntl to ask), and consumes the wake-ups only after it woke: one
  // that arrives after a refill is still queued when the waiter looks, so none is lost.
  template <typename F, typename R>
  int wait_pop(T* out, F&& deliver, R&& refill) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++quiet_;  // what refill() pushes is taken below: no need to raise the level for it
      }
      refill();
      {
        std::lock_guard<std::mutex> lock(mu_);
        --quiet_;
        bool got = pop_locked(out, deliver);
        if (!items_.empty()) raise_level();  // events left (ours or other threads')
        if (got) return 0;
      }
      char c;
      if (::recv(read_fd_, &c, 1, MSG_PEEK) < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          errno = EAGAIN;
          return -1;
        }
        if (errno != EINTR) return -1;
      }
      std::lock_guard<std::mutex> lock(mu_);
      drain_level();  // the wake-ups, and our own level (raised again above if still due)
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
  // Our own datagram is queued while raised_; peers may add theirs (wake-ups) at any time.
  void raise_level() {
    if (raised_) return;
    char one = 1;
    raised_ = ::send(write_fd_, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1;
  }
  // Takes our datagram back. Any one will do: what counts is how many are queued, and the
  // peers' stay until a waiter drains them and turns them into events.
  void lower_level() {
    if (!raised_) return;
    char buf;
    (void)!::recv(read_fd_, &buf, 1, MSG_DONTWAIT);
    raised_ = false;
  }
  // Takes every queued datagram, ours and peers', in as few calls as possible.
  void drain_level() {
    constexpr int kBatch = 16;
    char bufs[kBatch];
    iovec iov[kBatch];
    mmsghdr msgs[kBatch] = {};
    for (int i = 0; i < kBatch; ++i) {
      iov[i] = {&bufs[i], 1};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    while (::recvmmsg(read_fd_, msgs, kBatch, MSG_DONTWAIT, nullptr) == kBatch) {
    }
    raised_ = false;
  }

  std::mutex mu_;
  std::deque<T> items_;
  bool raised_ = false;  // under mu_
  int quiet_ = 0;        // under mu_: waiters refilling (they settle the level afterwards)
  int read_fd_ = -1;
  int write_fd_ = -1;
};

}  // namespace softverbs
