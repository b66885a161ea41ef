// The soft device: identity, limits, port and GID table, as ibv_query_device/_port/_gid
// report them. One per process (the device is the host itself).
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "wire/host.hpp"
#include "wire/registry.hpp"
#include "wire/transport.hpp"

namespace softverbs {

inline constexpr char kDeviceName[] = "softverbs0";
inline constexpr uint8_t kPortCount = 1;
inline constexpr uint32_t kVendorId = 0x5356;  // 'SV': not Mellanox (0x02c9) or Amazon (0x1d0f)
inline constexpr uint32_t kMaxMsgSize = wire::kMaxMsgSize;
inline constexpr uint16_t kDefaultPkey = 0xffff;

// The largest limits ibv_query_device may report (sizes of arrays depend on some); what it
// reports and what creating an object checks are DeviceLimits (below), at most these.
struct Limits {
  // A QPN's low bits number the QPs of one process (wire/registry.hpp): no more than that.
  static constexpr int max_qp = 1 << wire::kQpnSlotShift;
  static constexpr int max_qp_wr = 1 << 14;
  static constexpr int max_sge = wire::kMaxSge;
  static constexpr int max_inline = 1024;
  static constexpr int max_mcast_grp = 1024;          // groups per QP (and per device)
  static constexpr int max_mcast_qp_attach = 1024;    // QPs per group
  static constexpr int max_cq = 1 << 16;
  static constexpr int max_cqe = (1 << 20) - 1;
  // MRs and windows share the keys of a process: a key's index has kKeySlotShift bits
  // (the rest name the process, wire/registry.hpp), index 0 unused; both limits hold at once.
  static constexpr int max_mw = 1 << 12;
  static constexpr int max_mr = (1 << wire::kKeySlotShift) - 1 - max_mw;
  static constexpr int max_pd = 1 << 16;
  // rxe's (RXE_MAX_QP_RD_ATOM): perftest sets max_rd_atomic to the peer's max_qp_rd_atom,
  // so with a smaller one it cannot connect to rxe (ibv_modify_qp to RTS fails here).
  static constexpr int max_qp_rd_atom = 128;
  static constexpr int max_srq = 1 << 16;
  static constexpr int max_srq_wr = 1 << 14;
  static constexpr int max_ah = 1 << 16;
};

// The limits that hold in this process (the soft device is the process): the counts of
// objects and the sizes of queues that ibv_query_device reports and that creating an object
// checks. One more object than its count fails with ENOMEM, a queue larger than its size
// with EINVAL. The environment may lower them, so that tests reach them quickly:
// SOFTVERBS_LIMIT_SCALE=N divides each by N (at least 1 remains), and
// SOFTVERBS_LIMIT_<NAME>=V (SOFTVERBS_LIMIT_MAX_QP, ..._MAX_CQE, ...) sets one to V.
struct DeviceLimits {
  int max_qp = Limits::max_qp;
  int max_qp_wr = Limits::max_qp_wr;
  int max_cq = Limits::max_cq;
  int max_cqe = Limits::max_cqe;
  int max_mr = Limits::max_mr;
  int max_mw = Limits::max_mw;
  int max_pd = Limits::max_pd;
  int max_srq = Limits::max_srq;
  int max_srq_wr = Limits::max_srq_wr;
  int max_ah = Limits::max_ah;
};
const DeviceLimits& device_limits();

// The objects counted against DeviceLimits.
enum class Counted { Qp, Cq, Mr, Mw, Pd, Srq, Ah };
// Counts one more object of `kind`; false (nothing counted) when its limit is reached.
bool count_object(Counted kind);
void uncount_object(Counted kind);

using GidEntry = wire::HostAddress;  // {gid, ifindex}

class Device {
 public:
  static Device& instance();

  ibv_device* ibv() { return &ibv_; }
  uint64_t node_guid() const { return node_guid_; }  // network byte order
  // The host's addresses (wire/host.hpp): read again in a forked child, which may have
  // entered another network namespace, i.e. become a process of another host.
  const std::vector<GidEntry>& gids() const { return wire::host_addresses(); }
  // The GID table: the host's addresses first, then empty slots (as on a real port, whose
  // table is larger than the addresses it holds).
  int gid_table_len() const { return std::max<int>(16, static_cast<int>(gids().size())); }
  bool is_local_gid(const ibv_gid& gid) const;
  int num_comp_vectors() const { return comp_vectors_; }

  void fill_device_attr(ibv_device_attr* attr) const;
  void fill_port_attr(ibv_port_attr* attr) const;

  // Port state as the link would report it; toggled by `softverbs port up|down`.
  bool port_active() const { return port_active_.load(std::memory_order_relaxed); }
  void set_port_active(bool up) { port_active_.store(up, std::memory_order_relaxed); }

 private:
  Device();
  ibv_device ibv_{};
  uint64_t node_guid_ = 0;
  int comp_vectors_ = 1;
  std::atomic<bool> port_active_{true};
};

Device* device_from_ibv(ibv_device* dev);

}  // namespace softverbs
