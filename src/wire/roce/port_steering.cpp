// The RoCE v2 port's steering (decision 0006): probe rounds that learn which process sits
// at which index of the SO_REUSEPORT group and attach the program that sends each DestQP to
// its owner; and the forwarding of a datagram the kernel gave to the wrong process.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "wire/roce/port.hpp"
#include "wire/roce/port_internal.hpp"
#include "wire/roce/steering.hpp"

namespace softverbs::wire::roce {

using namespace detail;

namespace {

// The seed never waits for the kernel's entropy: this runs on the port's thread, and soon
// after boot getrandom() (and std::random_device with it) blocks until the pool is ready:
// 1.3 s in the rxe-vm guest, while every arriving datagram waited and rxe retried.
uint64_t token_seed() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == ssize_t(sizeof seed)) return seed;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return uint64_t(now) ^ uint64_t(getpid()) << 40;
}

// splitmix64 from a random seed: 8 bytes of TLS (a dlopen'ed library gets little static
// TLS; std::mt19937_64 would take 2.5 KiB of it).
uint64_t random_token() {
  static thread_local uint64_t state = token_seed();
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::string forward_address(const std::string& state_dir, uint16_t udp_port, int slot) {
  // Abstract, like the agent's: nothing to clean up when a process dies. The state
  // directory is in the name because registries in different directories reuse slots.
  return std::string(1, '\0') + "softverbs-" + std::to_string(getuid()) + "-" +
         std::to_string(std::hash<std::string>{}(state_dir)) + "-roce" +
         std::to_string(udp_port) + "-" + std::to_string(slot);
}

void Port::nudge_group() {
  if (fd_senders_[0] < 0) return;
  Probe nudge{htonl(kNudgeMagic), htonl(0), 0};
  send_from(fd_senders_[0], IpAddress::loopback_v4(), &nudge, sizeof nudge);
}

bool Port::forward(const Datagram& d, int slot) {
  ForwardHeader h{};
  h.magic = kForwardMagic;
  h.src_port = d.src_port;
  h.tos = d.tos;
  h.ifindex = d.ifindex;
  std::memcpy(h.src, d.src.bytes.data(), 16);
  std::memcpy(h.dst, d.dst.bytes.data(), 16);
  iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t*>(d.data), d.size}};
  socklen_t len;
  // An adopted slot is served by its adopter's socket (verbs/xrc.cpp).
  const int host = host_slot(slot);
  sockaddr_un to = unix_sockaddr(forward_address(config_.state_dir, config_.udp_port, host), len);
  msghdr msg{};
  msg.msg_name = &to;
  msg.msg_namelen = len;
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  auto& congested_until = forward_congested_until_[size_t(slot)];
  const bool wait = Clock::now() >= congested_until;
  if (sendmsg(fd_forward_, &msg, wait ? 0 : MSG_DONTWAIT) >= 0) return true;
  if (wait && (errno == EAGAIN || errno == EWOULDBLOCK))
    congested_until = Clock::now() + kForwardCongested;
  return false;
}

void Port::handle_forwarded() {
  uint8_t* buf = forward_buffer_.data();
  for (;;) {
    iovec iov{buf, forward_buffer_.size()};
    alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(ucred))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd_forward_, &msg, MSG_DONTWAIT);
    if (n < 0) return;
    // Only our own user's processes may hand us datagrams (any user can reach the address).
    bool same_user = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        same_user = cred.uid == getuid();
      }
    }
    ForwardHeader h;
    if (n >= ssize_t(sizeof h)) std::memcpy(&h, buf, sizeof h);
    Datagram d;
    d.data = buf + sizeof h;
    d.size = n >= ssize_t(sizeof h) ? size_t(n) - sizeof h : 0;
    const int slot = destination_slot(d.data, d.size);
    if (!same_user || (msg.msg_flags & MSG_TRUNC) || n < ssize_t(sizeof h) ||
        h.magic != kForwardMagic || slot < 0 ||
        (slot != slot_ && !reserved_slot(slot) && !hosted_by_me(slot))) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.dropped;  // never forwarded twice: no loops
      continue;
    }
    std::memcpy(d.src.bytes.data(), h.src, 16);
    std::memcpy(d.dst.bytes.data(), h.dst, 16);
    d.src_port = h.src_port;
    d.tos = h.tos;
    d.ifindex = h.ifindex;
    d.forwarded = true;
    deliver(d);
  }
}

// ---- probe rounds ------------------------------------------------------------------------

void Port::answer_probe(const uint8_t* data, const IpAddress& src, uint16_t src_port) {
  Probe probe;
  std::memcpy(&probe, data, sizeof probe);
  ProbeAnswer answer{htonl(kAnswerMagic), probe.index, probe.token, slot_, int32_t(getpid())};
  sockaddr_storage to;
  const socklen_t len = to_sockaddr(src, src_port, ipv6_, to);
  if (len) sendto(fd_senders_[0], &answer, sizeof answer, MSG_DONTWAIT,
                  reinterpret_cast<sockaddr*>(&to), len);
}

void Port::start_round() {
  if (round_) {
    round_wanted_ = true;  // another once this one is done: something changed meanwhile
    return;
  }
  const auto now = Clock::now();
  if (now < last_round_end_ + kRoundSpacing) {
    schedule(kRoundRetry, last_round_end_ + kRoundSpacing);
    return;
  }
  // One round at a time in the whole group; a busy lock means try again shortly.
  struct flock lk{};
  lk.l_type = F_WRLCK;
  lk.l_whence = SEEK_SET;
  if (fcntl(fd_lock_, F_OFD_SETLK, &lk) != 0) {
    schedule(kRoundRetry, now + kLockRetry);
    return;
  }
  round_ = new Round;
  round_->token = random_token();
  schedule(kRoundDeadline, now + kRoundTimeout);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++rounds_started_;
  }
  send_probes(0, kProbesPerStep);
}

void Port::send_probes(uint32_t from, uint32_t to) {
  round_->slot_at.resize(to, -1);
  round_->sent = to;
  for (uint32_t k = from; k < to; ++k) {
    Probe probe{htonl(kProbeMagic), htonl(k), round_->token};
    send_from(fd_senders_[0], IpAddress::loopback_v4(), &probe, sizeof probe);
  }
}

void Port::handle_answers() {
  for (;;) {
    ProbeAnswer a;
    sockaddr_storage from;
    socklen_t from_len = sizeof from;
    const ssize_t n = recvfrom(fd_senders_[0], &a, sizeof a, MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) break;
    IpAddress src;
    uint16_t port;
    if (!round_ || n != ssize_t(sizeof a) || ntohl(a.magic) != kAnswerMagic ||
        a.token != round_->token || !from_sockaddr(from, from_len, src, port) ||
        !src.is_loopback())
      continue;
    const uint32_t index = ntohl(a.index);
    if (index < round_->sent && a.slot > 0 && a.slot < kSlots && round_->slot_at[index] < 0)
      round_->slot_at[index] = a.slot;
  }
  if (round_) finish_round_if_done(false);
}

// Indices below the group's size answer with distinct slots; the first index that answers
// with a slot already seen is past the end (the kernel hashed it). Every index up to there
// must have answered, unless the deadline passed (a stopped process cannot answer).
void Port::finish_round_if_done(bool deadline_passed) {
  if (!round_) return;
  std::vector<bool> seen(kSlots, false);
  bool complete = false;
  uint32_t size = 0;
  for (uint32_t k = 0; k < round_->sent; ++k) {
    const int s = round_->slot_at[k];
    if (s < 0) {
      if (!deadline_passed) return;
      continue;
    }
    if (seen[size_t(s)]) {
      complete = true;
      break;
    }
    seen[size_t(s)] = true;
    size = k + 1;
  }
  if (!complete && !deadline_passed) {
    if (round_->sent < kMaxProbes) send_probes(round_->sent, round_->sent + kProbesPerStep);
    return;
  }
  std::vector<Route> routes;
  std::fill(seen.begin(), seen.end(), false);
  for (uint32_t k = 0; k < size; ++k) {
    const int s = round_->slot_at[k];
    if (s < 0 || seen[size_t(s)]) continue;
    seen[size_t(s)] = true;
    // A member that handed its slot over as it ends: the slot goes to its adopter (below).
    if (host_slot(s) != s) {
      seen[size_t(s)] = false;
      continue;
    }
    routes.push_back({uint32_t(s), k});
  }
  // An adopted slot goes where its adopter is (an ended process's XRC TGT QPs).
  const size_t members = routes.size();
  for (const auto& [adopted, host] : adopted_slots())
    for (size_t i = 0; i < members; ++i)
      if (routes[i].slot == uint32_t(host) && !seen[size_t(adopted)]) {
        seen[size_t(adopted)] = true;
        routes.push_back({uint32_t(adopted), routes[i].index});
      }
  // QP1 (the CM's) and the reserved slots go to the member with the lowest slot.
  if (!routes.empty()) {
    const Route lowest = *std::min_element(routes.begin(), routes.begin() + long(members), [](auto& a, auto& b) {
      return a.slot < b.slot;
    });
    routes.push_back({0, lowest.index});
    routes.push_back({uint32_t(kSlots - 1), lowest.index});
  }
  std::vector<sock_filter> code = steering_program(routes, kNoIndex);
  sock_fprog prog{uint16_t(code.size()), code.data()};
  setsockopt(fd_group_, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog);

  struct flock lk{};
  lk.l_type = F_UNLCK;
  lk.l_whence = SEEK_SET;
  fcntl(fd_lock_, F_OFD_SETLK, &lk);
  cancel(kRoundDeadline);
  delete std::exchange(round_, nullptr);
  last_round_end_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.probe_rounds;
    stats_.group_size = size;
    ++rounds_done_;
  }
  rounds_cv_.notify_all();
  if (round_wanted_.exchange(false)) start_round();
}

bool Port::wait_rerouted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(stats_mu_);
  return rounds_cv_.wait_for(lock, timeout, [&] { return rounds_done_ >= reroute_ticket_; });
}

}  // namespace softverbs::wire::roce
