#include "core/device.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

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
  a->max_qp = Limits::max_qp;
  a->max_qp_wr = Limits::max_qp_wr;
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
                        IBV_DEVICE_XRC;
  a->max_sge = Limits::max_sge;
  a->max_sge_rd = Limits::max_sge;
  a->max_cq = Limits::max_cq;
  a->max_cqe = Limits::max_cqe;
  a->max_mr = Limits::max_mr;
  a->max_mw = Limits::max_mw;
  a->max_pd = Limits::max_pd;
  a->max_qp_rd_atom = Limits::max_qp_rd_atom;
  a->max_res_rd_atom = Limits::max_qp_rd_atom * Limits::max_qp;
  a->max_qp_init_rd_atom = Limits::max_qp_rd_atom;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_ah = Limits::max_ah;
  a->max_srq = Limits::max_srq;
  a->max_srq_wr = Limits::max_srq_wr;
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
