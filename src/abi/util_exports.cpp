// Pure utility exports of libibverbs.so.1 that need no device state: enum-to-string helpers, IB
// rate conversions, the kernel-ABI marshalling copies and the sysfs helpers.
// The strings and rate values are the ones rdma-core 44 returns (tests/abi compares them).

#include "abi/util_exports.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <unistd.h>

namespace {

const char kUnknown[] = "unknown";

// One row per ibv_rate: its multiple of 2.5 Gb/s (0 where IB defines none, i.e. the
// FDR/EDR-era rates whose lane speed is not a multiple of 2.5) and its Mb/s value.
struct RateRow {
    ibv_rate rate;
    int mult;
    int mbps;
};

constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},     {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},  {IBV_RATE_14_GBPS, 0, 14062},
    {IBV_RATE_56_GBPS, 0, 56250},     {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750},   {IBV_RATE_25_GBPS, 0, 25781},
    {IBV_RATE_100_GBPS, 0, 103125},   {IBV_RATE_200_GBPS, 0, 206250},
    {IBV_RATE_300_GBPS, 0, 309375},   {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},    {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500}, {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

const RateRow *find_rate(ibv_rate rate) {
    for (const RateRow &row : kRates)
        if (row.rate == rate)
            return &row;
    return nullptr;
}

// The longest sysfs root rdma-core accepts from $SYSFS_PATH (IBV_SYSFS_PATH_MAX).
constexpr size_t kSysfsPathMax = 256;

std::string compute_sysfs_path() {
    const char *env = nullptr;
    // Like rdma-core, trust the environment only when not running set-uid.
    if (getuid() == geteuid())
        env = getenv("SYSFS_PATH");
    if (!env)
        return "/sys";
    std::string path(env, strnlen(env, kSysfsPathMax));
    while (!path.empty() && path.back() == '/')
        path.pop_back();
    return path;
}

}  // namespace

extern "C" {

// --- enum strings ------------------------------------------------------------------------------

const char *ibv_node_type_str(enum ibv_node_type node_type) {
    switch (node_type) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return kUnknown;
    }
}

const char *ibv_port_state_str(enum ibv_port_state port_state) {
    switch (port_state) {
    case IBV_PORT_NOP: return "no state change (NOP)";
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "init";
    case IBV_PORT_ARMED: return "armed";
    case IBV_PORT_ACTIVE: return "active";
    case IBV_PORT_ACTIVE_DEFER: return "active defer";
    default: return kUnknown;
    }
}

const char *ibv_event_type_str(enum ibv_event_type event) {
    switch (event) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    case IBV_EVENT_WQ_FATAL: return "WQ fatal";
    default: return kUnknown;
    }
}

const char *ibv_wc_status_str(enum ibv_wc_status status) {
    switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    case IBV_WC_TM_ERR: return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
    default: return kUnknown;
    }
}

// --- rates -------------------------------------------------------------------------------------

int ibv_rate_to_mult(enum ibv_rate rate) {
    const RateRow *row = find_rate(rate);
    return row && row->mult ? row->mult : -1;
}

enum ibv_rate mult_to_ibv_rate(int mult) {
    for (const RateRow &row : kRates)
        if (row.mult && row.mult == mult)
            return row.rate;
    return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate) {
    const RateRow *row = find_rate(rate);
    return row ? row->mbps : -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps) {
    for (const RateRow &row : kRates)
        if (row.mbps == mbps)
            return row.rate;
    return IBV_RATE_MAX;
}

// --- kernel ABI marshalling --------------------------------------------------------------------

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src) {
    memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof dst->grh.dgid.raw);
    dst->grh.flow_label = src->grh.flow_label;
    dst->grh.sgid_index = src->grh.sgid_index;
    dst->grh.hop_limit = src->grh.hop_limit;
    dst->grh.traffic_class = src->grh.traffic_class;
    dst->dlid = src->dlid;
    dst->sl = src->sl;
    dst->src_path_bits = src->src_path_bits;
    dst->static_rate = src->static_rate;
    dst->is_global = src->is_global;
    dst->port_num = src->port_num;
}

// As in rdma-core, qp_state and the attribute mask are not copied: the caller owns those.
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src) {
    dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
    dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
    dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
    dst->qkey = src->qkey;
    dst->rq_psn = src->rq_psn;
    dst->sq_psn = src->sq_psn;
    dst->dest_qp_num = src->dest_qp_num;
    dst->qp_access_flags = src->qp_access_flags;

    dst->cap.max_send_wr = src->max_send_wr;
    dst->cap.max_recv_wr = src->max_recv_wr;
    dst->cap.max_send_sge = src->max_send_sge;
    dst->cap.max_recv_sge = src->max_recv_sge;
    dst->cap.max_inline_data = src->max_inline_data;

    ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
    ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

    dst->pkey_index = src->pkey_index;
    dst->alt_pkey_index = src->alt_pkey_index;
    dst->en_sqd_async_notify = src->en_sqd_async_notify;
    dst->sq_draining = src->sq_draining;
    dst->max_rd_atomic = src->max_rd_atomic;
    dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
    dst->min_rnr_timer = src->min_rnr_timer;
    dst->port_num = src->port_num;
    dst->timeout = src->timeout;
    dst->retry_cnt = src->retry_cnt;
    dst->rnr_retry = src->rnr_retry;
    dst->alt_port_num = src->alt_port_num;
    dst->alt_timeout = src->alt_timeout;
}

}  // extern "C"

namespace {

// ibv_sa_path_rec and ib_user_path_rec carry the same fields with different widths and order;
// one template copies either way (every field is assigned, widths follow the destination).
template <typename Dst, typename Src>
void copy_path_rec_fields(Dst *dst, const Src *src) {
    dst->dlid = src->dlid;
    dst->slid = src->slid;
    dst->raw_traffic = src->raw_traffic;
    dst->flow_label = src->flow_label;
    dst->hop_limit = src->hop_limit;
    dst->traffic_class = src->traffic_class;
    dst->reversible = src->reversible;
    dst->numb_path = src->numb_path;
    dst->pkey = src->pkey;
    dst->sl = src->sl;
    dst->mtu_selector = src->mtu_selector;
    dst->mtu = src->mtu;
    dst->rate_selector = src->rate_selector;
    dst->rate = src->rate;
    dst->packet_life_time = src->packet_life_time;
    dst->preference = src->preference;
    dst->packet_life_time_selector = src->packet_life_time_selector;
}

}  // namespace

extern "C" {

void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src) {
    memcpy(dst->dgid.raw, src->dgid, sizeof dst->dgid.raw);
    memcpy(dst->sgid.raw, src->sgid, sizeof dst->sgid.raw);
    copy_path_rec_fields(dst, src);
}

void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src) {
    memcpy(dst->dgid, src->dgid.raw, sizeof dst->dgid);
    memcpy(dst->sgid, src->sgid.raw, sizeof dst->sgid);
    copy_path_rec_fields(dst, src);
}

// --- sysfs -------------------------------------------------------------------------------------

const char *ibv_get_sysfs_path(void) {
    static const std::string path = compute_sysfs_path();
    return path.c_str();
}

// Reads DIR/FILE into BUF. On success the content is NUL-terminated with one trailing newline
// removed, and its length is returned; -1 when the file cannot be opened or read, or when the
// content fills BUF with no room left for the terminator.
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) {
    if (!dir || !file || !buf)
        return -1;
    std::string path = std::string(dir) + "/" + file;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len;
    do {
        len = read(fd, buf, size);
    } while (len < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    errno = saved;
    if (len <= 0)
        return static_cast<int>(len);
    if (buf[len - 1] == '\n')
        buf[--len] = '\0';
    else if (static_cast<size_t>(len) < size)
        buf[len] = '\0';
    else
        return -1;
    return static_cast<int>(len);
}

}  // extern "C"
