#include "core/device.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "wire/host.hpp"

namespace softverbs {
namespace {

// FNV-1a: a stable hash of the host identity, for the node GUID.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string host_identity() {
  std::ifstream in("/etc/machine-id");
  std::string id;
  if (in >> id && !id.empty()) return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

Device& Device::instance() {
  static Device* dev = new Device;  // immortal: background threads use it during exit()
  return *dev;
}

Device* device_from_ibv(ibv_device* dev) {
  return dev == Device::instance().ibv() ? &Device::instance() : nullptr;
}

Device::Device() {
  ibv_.node_type = IBV_NODE_CA;
  ibv_.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(ibv_.name, sizeof(ibv_.name), "%s", kDeviceName);
  std::snprintf(ibv_.dev_name, sizeof(ibv_.dev_name), "uverbs-%s", kDeviceName);
  // No sysfs entry exists for a soft device; the paths only need to be well-formed.
  std::snprintf(ibv_.dev_path, sizeof(ibv_.dev_path), "/sys/class/infiniband_verbs/uverbs-%s",
                kDeviceName);
  std::snprintf(ibv_.ibdev_path, sizeof(ibv_.ibdev_path), "/sys/class/infiniband/%s",
                kDeviceName);
  // Locally administered EUI-64 derived from the host identity: stable across runs.
  uint64_t guid = fnv1a(host_identity() + kDeviceName);
  guid = (guid & ~(0x03ull << 56)) | (0x02ull << 56);
  node_guid_ = htobe64(guid);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  comp_vectors_ = cpus > 0 ? static_cast<int>(cpus) : 1;
}

namespace {

// SOFTVERBS_LIMIT_<NAME> if set, else `value` / SOFTVERBS_LIMIT_SCALE; never above `value`
// (the largest that holds) nor below 1.
int lowered(const char* name, int value, long scale) {
  long v = value / scale;
  std::string var = std::string("SOFTVERBS_LIMIT_") + name;
  if (const char* set = std::getenv(var.c_str()); set && *set) v = std::strtol(set, nullptr, 0);
  return static_cast<int>(std::clamp<long>(v, 1, value));
}

std::atomic<int> g_counts[7];

int limit_of(Counted kind) {
  const DeviceLimits& l = device_limits();
  switch (kind) {
    case Counted::Qp: return l.max_qp;
    case Counted::Cq: return l.max_cq;
    case Counted::Mr: return l.max_mr;
    case Counted::Mw: return l.max_mw;
    case Counted::Pd: return l.max_pd;
    case Counted::Srq: return l.max_srq;
    case Counted::Ah: return l.max_ah;
  }
  return 0;
}

}  // namespace

const DeviceLimits& device_limits() {
  static const DeviceLimits limits = [] {
    long scale = 1;
    if (const char* s = std::getenv("SOFTVERBS_LIMIT_SCALE"); s && *s)
      scale = std::max(1L, std::strtol(s, nullptr, 0));
    DeviceLimits l;
    l.max_qp = lowered("MAX_QP", l.max_qp, scale);
    l.max_qp_wr = lowered("MAX_QP_WR", l.max_qp_wr, scale);
    l.max_cq = lowered("MAX_CQ", l.max_cq, scale);
    l.max_cqe = lowered("MAX_CQE", l.max_cqe, scale);
    l.max_mr = lowered("MAX_MR", l.max_mr, scale);
    l.max_mw = lowered("MAX_MW", l.max_mw, scale);
    l.max_pd = lowered("MAX_PD", l.max_pd, scale);
    l.max_srq = lowered("MAX_SRQ", l.max_srq, scale);
    l.max_srq_wr = lowered("MAX_SRQ_WR", l.max_srq_wr, scale);
    l.max_ah = lowered("MAX_AH", l.max_ah, scale);
    return l;
  }();
  return limits;
}

bool count_object(Counted kind) {
  std::atomic<int>& n = g_counts[static_cast<int>(kind)];
  const int limit = limit_of(kind);
  for (int cur = n.load(std::memory_order_relaxed); cur < limit;)
    if (n.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed)) return true;
  return false;
}

void uncount_object(Counted kind) { g_counts[static_cast<int>(kind)].fetch_sub(1, std::memory_order_relaxed); }

bool Device::is_local_gid(const ibv_gid& gid) const {
  for (const auto& e : gids())
    if (std::memcmp(e.gid.raw, gid.raw, 16) == 0) return true;
  return false;
}

void Device::fill_device_attr(ibv_device_attr* a) const {
  std::memset(a, 0, sizeof(*a));
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs-0.1");
  a->node_guid = node_guid_;
  a->sys_image_guid = node_guid_;
  a->max_mr_size = ~0ull;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = kVendorId;
  a->vendor_part_id = 0;
  a->hw_ver = 1;
  const DeviceLimits& l = device_limits();
  a->max_qp = l.max_qp;
  a->max_qp_wr = l.max_qp_wr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SHUTDOWN_PORT |
                        IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_SRQ_RESIZE |
                        // Memory windows: type 1 and type 2B (a type 2 window serves the one
                        // QP it is bound to, of its PD), as rxe and mlx5 report them.
                        IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B |
                        // LOCAL_INV and SEND_WITH_INV (of type 2 windows; user verbs have no
                        // fast registration), as rxe reports it.
                        IBV_DEVICE_MEM_MGT_EXTENSIONS |
                        // XRC domains, XRC SRQs, INI and TGT QPs (verbs/xrc.cpp).
                        IBV_DEVICE_XRC |
                        // ibv_create_flow on raw packet QPs (docs/raw-packet.md): the bit
                        // ibv_create_flow(3) asks for, as mlx4/mlx5 report it.
                        IBV_DEVICE_MANAGED_FLOW_STEERING;
  a->max_sge = Limits::max_sge;
  a->max_sge_rd = Limits::max_sge;
  a->max_cq = l.max_cq;
  a->max_cqe = l.max_cqe;
  a->max_mr = l.max_mr;
  a->max_mw = l.max_mw;
  a->max_pd = l.max_pd;
  a->max_qp_rd_atom = Limits::max_qp_rd_atom;
  a->max_res_rd_atom = Limits::max_qp_rd_atom * l.max_qp;
  a->max_qp_init_rd_atom = Limits::max_qp_rd_atom;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_ah = l.max_ah;
  a->max_srq = l.max_srq;
  a->max_srq_wr = l.max_srq_wr;
  a->max_srq_sge = Limits::max_sge;
  a->max_mcast_grp = Limits::max_mcast_grp;
  a->max_mcast_qp_attach = Limits::max_mcast_qp_attach;
  a->max_total_mcast_qp_attach = Limits::max_mcast_grp * Limits::max_mcast_qp_attach;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = kPortCount;
}

void Device::fill_port_attr(ibv_port_attr* a) const {
  std::memset(a, 0, sizeof(*a));
  bool up = port_active();
  a->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = gid_table_len();
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  a->max_msg_sz = kMaxMsgSize;
  a->pkey_tbl_len = 1;
  a->max_vl_num = 1;
  a->active_width = 2;    // 4X
  a->active_speed = 32;   // EDR: 4X EDR = 100 Gb/s
  a->phys_state = up ? 5 : 3;  // LinkUp / Disabled
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  a->flags = IBV_QPF_GRH_REQUIRED;
}

}  // namespace softverbs
