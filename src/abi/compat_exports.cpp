// Compat (non-default) definitions of libibverbs.so.1: the 33 `name@IBVERBS_1.0` entry points and
// `ibv_register_driver@IBVERBS_1.1`.
//
// Why they only fail: the @IBVERBS_1.0 symbols take the pre-1.1 struct layouts (ibv_context_1_0,
// ibv_pd_1_0, ...) that only binaries linked against libibverbs < 1.1 (2006) use; nothing built
// since binds to them, but the real library defines them, so the drop-in must too. Each fails the
// way its man page says a failure looks: NULL + errno, a positive errno, or -1 + errno; void
// ones do nothing. ibv_register_driver@IBVERBS_1.1 was the pre-rdma-core-13 provider hook;
// providers now use verbs_register_driver_34.
//
// The local implementation names (sv_compat_*) are not in any global list of libibverbs.map, so
// its `local: *;` hides them; only the versioned aliases made by .symver are exported.

#include <cerrno>
#include <cstddef>
#include <cstdint>

#define SV_COMPAT_SYMVER(impl, versioned) __asm__(".symver " #impl ", " versioned)

namespace {

void *fail_ptr() {
    errno = EOPNOTSUPP;
    return nullptr;
}

int fail_minus_one() {
    errno = EOPNOTSUPP;
    return -1;
}

}  // namespace

extern "C" {

// --- device list and context -----------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_get_device_list_1_0, "ibv_get_device_list@IBVERBS_1.0");
void *sv_compat_get_device_list_1_0(int *num) {
    if (num)
        *num = 0;
    return fail_ptr();
}

SV_COMPAT_SYMVER(sv_compat_free_device_list_1_0, "ibv_free_device_list@IBVERBS_1.0");
void sv_compat_free_device_list_1_0(void *) {}

SV_COMPAT_SYMVER(sv_compat_get_device_name_1_0, "ibv_get_device_name@IBVERBS_1.0");
const char *sv_compat_get_device_name_1_0(void *) {
    return static_cast<const char *>(fail_ptr());
}

SV_COMPAT_SYMVER(sv_compat_get_device_guid_1_0, "ibv_get_device_guid@IBVERBS_1.0");
uint64_t sv_compat_get_device_guid_1_0(void *) {
    errno = EOPNOTSUPP;
    return 0;
}

SV_COMPAT_SYMVER(sv_compat_open_device_1_0, "ibv_open_device@IBVERBS_1.0");
void *sv_compat_open_device_1_0(void *) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_close_device_1_0, "ibv_close_device@IBVERBS_1.0");
int sv_compat_close_device_1_0(void *) { return fail_minus_one(); }

SV_COMPAT_SYMVER(sv_compat_get_async_event_1_0, "ibv_get_async_event@IBVERBS_1.0");
int sv_compat_get_async_event_1_0(void *, void *) { return fail_minus_one(); }

SV_COMPAT_SYMVER(sv_compat_ack_async_event_1_0, "ibv_ack_async_event@IBVERBS_1.0");
void sv_compat_ack_async_event_1_0(void *) {}

// --- queries -----------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_query_device_1_0, "ibv_query_device@IBVERBS_1.0");
int sv_compat_query_device_1_0(void *, void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_query_port_1_0, "ibv_query_port@IBVERBS_1.0");
int sv_compat_query_port_1_0(void *, uint8_t, void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_query_gid_1_0, "ibv_query_gid@IBVERBS_1.0");
int sv_compat_query_gid_1_0(void *, uint8_t, int, void *) { return fail_minus_one(); }

SV_COMPAT_SYMVER(sv_compat_query_pkey_1_0, "ibv_query_pkey@IBVERBS_1.0");
int sv_compat_query_pkey_1_0(void *, uint8_t, int, uint16_t *) { return fail_minus_one(); }

// --- PD and MR ---------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_alloc_pd_1_0, "ibv_alloc_pd@IBVERBS_1.0");
void *sv_compat_alloc_pd_1_0(void *) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_dealloc_pd_1_0, "ibv_dealloc_pd@IBVERBS_1.0");
int sv_compat_dealloc_pd_1_0(void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_reg_mr_1_0, "ibv_reg_mr@IBVERBS_1.0");
void *sv_compat_reg_mr_1_0(void *, void *, size_t, int) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_dereg_mr_1_0, "ibv_dereg_mr@IBVERBS_1.0");
int sv_compat_dereg_mr_1_0(void *) { return EOPNOTSUPP; }

// --- CQ ----------------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_create_cq_1_0, "ibv_create_cq@IBVERBS_1.0");
void *sv_compat_create_cq_1_0(void *, int, void *, void *, int) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_resize_cq_1_0, "ibv_resize_cq@IBVERBS_1.0");
int sv_compat_resize_cq_1_0(void *, int) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_destroy_cq_1_0, "ibv_destroy_cq@IBVERBS_1.0");
int sv_compat_destroy_cq_1_0(void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_get_cq_event_1_0, "ibv_get_cq_event@IBVERBS_1.0");
int sv_compat_get_cq_event_1_0(void *, void **, void **) { return fail_minus_one(); }

SV_COMPAT_SYMVER(sv_compat_ack_cq_events_1_0, "ibv_ack_cq_events@IBVERBS_1.0");
void sv_compat_ack_cq_events_1_0(void *, unsigned int) {}

// --- SRQ ---------------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_create_srq_1_0, "ibv_create_srq@IBVERBS_1.0");
void *sv_compat_create_srq_1_0(void *, void *) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_modify_srq_1_0, "ibv_modify_srq@IBVERBS_1.0");
int sv_compat_modify_srq_1_0(void *, void *, int) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_query_srq_1_0, "ibv_query_srq@IBVERBS_1.0");
int sv_compat_query_srq_1_0(void *, void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_destroy_srq_1_0, "ibv_destroy_srq@IBVERBS_1.0");
int sv_compat_destroy_srq_1_0(void *) { return EOPNOTSUPP; }

// --- QP ----------------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_create_qp_1_0, "ibv_create_qp@IBVERBS_1.0");
void *sv_compat_create_qp_1_0(void *, void *) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_query_qp_1_0, "ibv_query_qp@IBVERBS_1.0");
int sv_compat_query_qp_1_0(void *, void *, int, void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_modify_qp_1_0, "ibv_modify_qp@IBVERBS_1.0");
int sv_compat_modify_qp_1_0(void *, void *, int) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_destroy_qp_1_0, "ibv_destroy_qp@IBVERBS_1.0");
int sv_compat_destroy_qp_1_0(void *) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_attach_mcast_1_0, "ibv_attach_mcast@IBVERBS_1.0");
int sv_compat_attach_mcast_1_0(void *, const void *, uint16_t) { return EOPNOTSUPP; }

SV_COMPAT_SYMVER(sv_compat_detach_mcast_1_0, "ibv_detach_mcast@IBVERBS_1.0");
int sv_compat_detach_mcast_1_0(void *, const void *, uint16_t) { return EOPNOTSUPP; }

// --- AH ----------------------------------------------------------------------------------------

SV_COMPAT_SYMVER(sv_compat_create_ah_1_0, "ibv_create_ah@IBVERBS_1.0");
void *sv_compat_create_ah_1_0(void *, void *) { return fail_ptr(); }

SV_COMPAT_SYMVER(sv_compat_destroy_ah_1_0, "ibv_destroy_ah@IBVERBS_1.0");
int sv_compat_destroy_ah_1_0(void *) { return EOPNOTSUPP; }

// --- old provider registration ---------------------------------------------------------------

// Providers built before rdma-core 13 called this from their constructors; accept and ignore.
SV_COMPAT_SYMVER(sv_compat_register_driver_1_1, "ibv_register_driver@IBVERBS_1.1");
void sv_compat_register_driver_1_1(const char *, void *) {}

}  // extern "C"
