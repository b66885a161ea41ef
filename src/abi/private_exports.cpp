// IBVERBS_PRIVATE_34: the provider ABI of rdma-core 44 (its private driver.h, not installed).
//
// libmlx5.so.1 and libefa.so.1 are NEEDED by every perftest binary and by pyverbs' provider
// modules, and they are bound at load time (BIND_NOW), so every symbol they import must exist.
// Their constructors call verbs_register_driver_34() before main; that is accepted and ignored.
// No device is ever handed to those providers, so the command helpers below are never reached
// in practice: they fail cleanly (positive EOPNOTSUPP for int returns, NULL + errno for
// pointers, -1 + errno where rdma-core's convention is -1). verbs_init_cq and __verbs_log are
// implemented for real because they need no device.
//
// ibv_query_gid_type, the one public-facing member of this node, lives with the other device
// queries (verbs_exports.cpp).

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <pthread.h>

// Opaque rdma-core provider-side types: only pointers to them cross this ABI.
struct verbs_device_ops;
struct verbs_sysfs_dev;
struct verbs_context_ops;
struct verbs_xrcd;
struct verbs_mr;
struct verbs_cq;
struct verbs_srq;
struct verbs_qp;
struct verbs_dm;
struct verbs_counters;
struct verbs_flow_action;
struct ibv_command_buffer;
struct ibv_get_context;
struct ibv_query_port;
struct ibv_alloc_pd;
struct ibv_open_xrcd;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_alloc_mw;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_resize_cq;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_create_wq;
struct ibv_modify_wq;
struct ib_uverbs_get_context_resp;
struct ib_uverbs_ex_query_device_resp;
struct ib_uverbs_alloc_pd_resp;
struct ib_uverbs_open_xrcd_resp;
struct ib_uverbs_reg_mr_resp;
struct ib_uverbs_rereg_mr_resp;
struct ib_uverbs_alloc_mw_resp;
struct ib_uverbs_create_cq_resp;
struct ib_uverbs_ex_create_cq_resp;
struct ib_uverbs_resize_cq_resp;
struct ib_uverbs_create_srq_resp;
struct ib_uverbs_create_qp_resp;
struct ib_uverbs_ex_create_qp_resp;
struct ib_uverbs_ex_modify_qp_resp;
struct ib_uverbs_create_ah_resp;
struct ib_uverbs_ex_create_wq_resp;
struct ib_uverbs_ex_create_rwq_ind_table_resp;

namespace {

constexpr int kUnsupported = EOPNOTSUPP;

void *fail_ptr() {
    errno = EOPNOTSUPP;
    return nullptr;
}

// VERBS_LOG_LEVEL as rdma-core reads it (strtol base 0); 0, unset or invalid means silent.
long configured_log_level() {
    static const long level = [] {
        const char *env = getenv("VERBS_LOG_LEVEL");
        return env ? strtol(env, nullptr, 0) : 0L;
    }();
    return level;
}

}  // namespace

extern "C" {

// --- data ----------------------------------------------------------------------------------------

// rdma-core sets this from RDMAV_ALLOW_DISASSOC_DESTROY; providers read it after a destroy
// fails with EIO on a disassociated device, which cannot happen here.
bool verbs_allow_disassociate_destroy = false;

// --- core helpers --------------------------------------------------------------------------------

void __verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void __verbs_log(struct verbs_context *, uint32_t level, const char *fmt, ...) {
    long configured = configured_log_level();
    if (configured <= 0 || static_cast<long>(level) > configured || !fmt)
        return;
    int saved = errno;
    va_list args;
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    errno = saved;
}

void verbs_register_driver_34(const struct verbs_device_ops *) {}

void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
                   struct ibv_comp_channel *channel, void *cq_context) {
    cq->context = context;
    cq->channel = channel;
    if (channel) {
        pthread_mutex_lock(&context->mutex);
        ++channel->refcnt;
        pthread_mutex_unlock(&context->mutex);
    }
    cq->cq_context = cq_context;
    cq->comp_events_completed = 0;
    cq->async_events_completed = 0;
    pthread_mutex_init(&cq->mutex, nullptr);
    pthread_cond_init(&cq->cond, nullptr);
}

unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, struct ibv_command_buffer *) {
    // Linked command buffers only ever come from providers we never drive.
    return num_attrs;
}

int execute_ioctl(struct ibv_context *, struct ibv_command_buffer *) { return kUnsupported; }

void *_verbs_init_and_alloc_context(struct ibv_device *, int, size_t, struct verbs_context *,
                                    uint32_t) {
    return fail_ptr();
}

struct ibv_context *verbs_open_device(struct ibv_device *, void *) {
    return static_cast<ibv_context *>(fail_ptr());
}

void verbs_set_ops(struct verbs_context *, const struct verbs_context_ops *) {}

void verbs_uninit_context(struct verbs_context *) {}

int ibv_read_ibdev_sysfs_file(char *, size_t, struct verbs_sysfs_dev *sysfs_dev, const char *,
                              ...) {
    errno = sysfs_dev ? EOPNOTSUPP : EINVAL;
    return -1;
}

// --- ibv_cmd_*: device and context ---------------------------------------------------------------

int ibv_cmd_get_context(struct verbs_context *, struct ibv_get_context *, size_t,
                        struct ib_uverbs_get_context_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_query_context(struct ibv_context *, struct ibv_command_buffer *) {
    return kUnsupported;
}

int ibv_cmd_query_device_any(struct ibv_context *, const struct ibv_query_device_ex_input *,
                             struct ibv_device_attr_ex *, size_t,
                             struct ib_uverbs_ex_query_device_resp *, size_t *) {
    return kUnsupported;
}

int ibv_cmd_query_port(struct ibv_context *, uint8_t, struct ibv_port_attr *,
                       struct ibv_query_port *, size_t) {
    return kUnsupported;
}

// --- PD, XRCD, MR, MW, DM ------------------------------------------------------------------------

int ibv_cmd_alloc_pd(struct ibv_context *, struct ibv_pd *, struct ibv_alloc_pd *, size_t,
                     struct ib_uverbs_alloc_pd_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_dealloc_pd(struct ibv_pd *) { return kUnsupported; }

int ibv_cmd_open_xrcd(struct ibv_context *, struct verbs_xrcd *, int, struct ibv_xrcd_init_attr *,
                      struct ibv_open_xrcd *, size_t, struct ib_uverbs_open_xrcd_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_close_xrcd(struct verbs_xrcd *) { return kUnsupported; }

int ibv_cmd_reg_mr(struct ibv_pd *, void *, size_t, uint64_t, int, struct verbs_mr *,
                   struct ibv_reg_mr *, size_t, struct ib_uverbs_reg_mr_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_rereg_mr(struct verbs_mr *, uint32_t, void *, size_t, uint64_t, int, struct ibv_pd *,
                     struct ibv_rereg_mr *, size_t, struct ib_uverbs_rereg_mr_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_dereg_mr(struct verbs_mr *) { return kUnsupported; }

int ibv_cmd_query_mr(struct ibv_pd *, struct verbs_mr *, uint32_t) { return kUnsupported; }

int ibv_cmd_advise_mr(struct ibv_pd *, enum ibv_advise_mr_advice, uint32_t, struct ibv_sge *,
                      uint32_t) {
    return kUnsupported;
}

int ibv_cmd_reg_dmabuf_mr(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int,
                          struct verbs_mr *) {
    return kUnsupported;
}

int ibv_cmd_alloc_mw(struct ibv_pd *, enum ibv_mw_type, struct ibv_mw *, struct ibv_alloc_mw *,
                     size_t, struct ib_uverbs_alloc_mw_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_dealloc_mw(struct ibv_mw *) { return kUnsupported; }

int ibv_cmd_alloc_dm(struct ibv_context *, const struct ibv_alloc_dm_attr *, struct verbs_dm *,
                     struct ibv_command_buffer *) {
    return kUnsupported;
}

int ibv_cmd_free_dm(struct verbs_dm *) { return kUnsupported; }

int ibv_cmd_reg_dm_mr(struct ibv_pd *, struct verbs_dm *, uint64_t, size_t, unsigned int,
                      struct verbs_mr *, struct ibv_command_buffer *) {
    return kUnsupported;
}

// --- CQ ------------------------------------------------------------------------------------------

int ibv_cmd_create_cq(struct ibv_context *, int, struct ibv_comp_channel *, int, struct ibv_cq *,
                      struct ibv_create_cq *, size_t, struct ib_uverbs_create_cq_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_create_cq_ex(struct ibv_context *, const struct ibv_cq_init_attr_ex *,
                         struct verbs_cq *, struct ibv_create_cq_ex *, size_t,
                         struct ib_uverbs_ex_create_cq_resp *, size_t, uint32_t) {
    return kUnsupported;
}

// Poll convention: a negative return is the error (a positive one would count completions).
int ibv_cmd_poll_cq(struct ibv_cq *, int, struct ibv_wc *) {
    errno = EOPNOTSUPP;
    return -1;
}

int ibv_cmd_req_notify_cq(struct ibv_cq *, int) { return kUnsupported; }

int ibv_cmd_resize_cq(struct ibv_cq *, int, struct ibv_resize_cq *, size_t,
                      struct ib_uverbs_resize_cq_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_cq(struct ibv_cq *) { return kUnsupported; }

int ibv_cmd_modify_cq(struct ibv_cq *, struct ibv_modify_cq_attr *, struct ibv_modify_cq *,
                      size_t) {
    return kUnsupported;
}

// --- SRQ -----------------------------------------------------------------------------------------

int ibv_cmd_create_srq(struct ibv_pd *, struct ibv_srq *, struct ibv_srq_init_attr *,
                       struct ibv_create_srq *, size_t, struct ib_uverbs_create_srq_resp *,
                       size_t) {
    return kUnsupported;
}

int ibv_cmd_create_srq_ex(struct ibv_context *, struct verbs_srq *, struct ibv_srq_init_attr_ex *,
                          struct ibv_create_xsrq *, size_t, struct ib_uverbs_create_srq_resp *,
                          size_t) {
    return kUnsupported;
}

int ibv_cmd_modify_srq(struct ibv_srq *, struct ibv_srq_attr *, int, struct ibv_modify_srq *,
                       size_t) {
    return kUnsupported;
}

int ibv_cmd_query_srq(struct ibv_srq *, struct ibv_srq_attr *, struct ibv_query_srq *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_srq(struct ibv_srq *) { return kUnsupported; }

// --- QP ------------------------------------------------------------------------------------------

int ibv_cmd_create_qp(struct ibv_pd *, struct ibv_qp *, struct ibv_qp_init_attr *,
                      struct ibv_create_qp *, size_t, struct ib_uverbs_create_qp_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_create_qp_ex(struct ibv_context *, struct verbs_qp *, struct ibv_qp_init_attr_ex *,
                         struct ibv_create_qp *, size_t, struct ib_uverbs_create_qp_resp *,
                         size_t) {
    return kUnsupported;
}

int ibv_cmd_create_qp_ex2(struct ibv_context *, struct verbs_qp *, struct ibv_qp_init_attr_ex *,
                          struct ibv_create_qp_ex *, size_t, struct ib_uverbs_ex_create_qp_resp *,
                          size_t) {
    return kUnsupported;
}

int ibv_cmd_open_qp(struct ibv_context *, struct verbs_qp *, int, struct ibv_qp_open_attr *,
                    struct ibv_open_qp *, size_t, struct ib_uverbs_create_qp_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_query_qp(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *,
                     struct ibv_query_qp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_modify_qp(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_modify_qp *,
                      size_t) {
    return kUnsupported;
}

int ibv_cmd_modify_qp_ex(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_modify_qp_ex *,
                         size_t, struct ib_uverbs_ex_modify_qp_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_qp(struct ibv_qp *) { return kUnsupported; }

// Post helpers report the first work request that was not posted, as the verbs do.
int ibv_cmd_post_send(struct ibv_qp *, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
    if (bad_wr)
        *bad_wr = wr;
    return kUnsupported;
}

int ibv_cmd_post_recv(struct ibv_qp *, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    if (bad_wr)
        *bad_wr = wr;
    return kUnsupported;
}

int ibv_cmd_post_srq_recv(struct ibv_srq *, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    if (bad_wr)
        *bad_wr = wr;
    return kUnsupported;
}

int ibv_cmd_attach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t) {
    return kUnsupported;
}

int ibv_cmd_detach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t) {
    return kUnsupported;
}

// --- AH ------------------------------------------------------------------------------------------

int ibv_cmd_create_ah(struct ibv_pd *, struct ibv_ah *, struct ibv_ah_attr *,
                      struct ib_uverbs_create_ah_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_ah(struct ibv_ah *) { return kUnsupported; }

// --- flows and flow actions ----------------------------------------------------------------------

int ibv_cmd_create_flow(struct ibv_qp *, struct ibv_flow *, struct ibv_flow_attr *, void *,
                        size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_flow(struct ibv_flow *) { return kUnsupported; }

int ibv_cmd_create_flow_action_esp(struct ibv_context *, struct ibv_flow_action_esp_attr *,
                                   struct verbs_flow_action *, struct ibv_command_buffer *) {
    return kUnsupported;
}

int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action *, struct ibv_flow_action_esp_attr *,
                                   struct ibv_command_buffer *) {
    return kUnsupported;
}

int ibv_cmd_destroy_flow_action(struct verbs_flow_action *) { return kUnsupported; }

// --- WQ and RWQ indirection tables ---------------------------------------------------------------

int ibv_cmd_create_wq(struct ibv_context *, struct ibv_wq_init_attr *, struct ibv_wq *,
                      struct ibv_create_wq *, size_t, struct ib_uverbs_ex_create_wq_resp *,
                      size_t) {
    return kUnsupported;
}

int ibv_cmd_modify_wq(struct ibv_wq *, struct ibv_wq_attr *, struct ibv_modify_wq *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_wq(struct ibv_wq *) { return kUnsupported; }

int ibv_cmd_create_rwq_ind_table(struct ibv_context *, struct ibv_rwq_ind_table_init_attr *,
                                 struct ibv_rwq_ind_table *,
                                 struct ib_uverbs_ex_create_rwq_ind_table_resp *, size_t) {
    return kUnsupported;
}

int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table *) { return kUnsupported; }

// --- counters ------------------------------------------------------------------------------------

int ibv_cmd_create_counters(struct ibv_context *, struct ibv_counters_init_attr *,
                            struct verbs_counters *, struct ibv_command_buffer *) {
    return kUnsupported;
}

int ibv_cmd_destroy_counters(struct verbs_counters *) { return kUnsupported; }

int ibv_cmd_read_counters(struct verbs_counters *, uint64_t *, uint32_t, uint32_t,
                          struct ibv_command_buffer *) {
    return kUnsupported;
}

}  // extern "C"
