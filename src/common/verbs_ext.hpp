// Verbs constants newer than the rdma-core 44 headers we build against: FLUSH (rdma-core 45,
// kernel 6.2) and the device capability bits for it and for ATOMIC WRITE. Values are
// rdma-core's (libibverbs/verbs.h, kernel-headers/rdma/ib_user_verbs.h); programs built with
// newer headers pass exactly these numbers.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softverbs {

// enum ibv_wr_opcode / ibv_wc_opcode
inline constexpr ibv_wr_opcode kWrFlush = static_cast<ibv_wr_opcode>(14);
inline constexpr ibv_wc_opcode kWcFlush = static_cast<ibv_wc_opcode>(8);
// enum ibv_qp_create_send_ops_flags
inline constexpr uint64_t kQpExWithFlush = 1u << 11;
// enum ibv_access_flags: an MR (and a QP) that FLUSH may name
inline constexpr unsigned kAccessFlushGlobal = 1u << 8;
inline constexpr unsigned kAccessFlushPersistent = 1u << 9;
// enum ibv_placement_type / ibv_selectivity_level (ibv_wr_flush's type and level)
inline constexpr uint8_t kFlushGlobal = 1u << 0;
inline constexpr uint8_t kFlushPersistent = 1u << 1;
inline constexpr uint8_t kFlushRange = 0;
inline constexpr uint8_t kFlushMr = 1;
// ibv_device_attr_ex.device_cap_flags_ex (IB_UVERBS_DEVICE_*): what librpma tests
inline constexpr uint64_t kDeviceFlushGlobal = 1ull << 38;
inline constexpr uint64_t kDeviceFlushPersistent = 1ull << 39;
inline constexpr uint64_t kDeviceAtomicWrite = 1ull << 40;

// rdma-core 45's struct ibv_qp_ex ends with this pointer, after wr_atomic_write.
using WrFlushFn = void (*)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                           uint8_t type, uint8_t level);

}  // namespace softverbs
