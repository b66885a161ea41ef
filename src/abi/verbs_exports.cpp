// The exported verbs of libibverbs.so.1 that need the device: C entry points that check
// their arguments the way rdma-core does and forward to the core (src/verbs).
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "abi/context_ops.hpp"
#include "check/check.hpp"
#include "core/device.hpp"
#include "verbs/verbs.hpp"

// verbs.h wraps these in macros that pick an inline path; we define the real symbols.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace softverbs;

namespace {
// rdma-core's private enum for ibv_query_gid_type (sysfs encoding).
enum GidTypeSysfs { kGidTypeIbRoceV1 = 0, kGidTypeRoceV2 = 1 };

template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}
}  // namespace

// ---- softverbs check (src/check, docs/check.md) ------------------------------------------
// With SOFTVERBS_CHECK unset a call pays one test of a flag set at load; `site` is where the
// application called us.
#define SV_CHECK(...)                                                \
  do {                                                               \
    if (check::enabled) [[unlikely]] {                               \
      [[maybe_unused]] const void* site = __builtin_return_address(0); \
      __VA_ARGS__;                                                   \
    }                                                                \
  } while (0)
using check::Kind;
// ---- end of softverbs check ---------------------------------------------------------------

extern "C" {

// ---- Devices -----------------------------------------------------------------------------

struct ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  list[0] = Device::instance().ibv();
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(struct ibv_device** list) { free(list); }

const char* ibv_get_device_name(struct ibv_device* device) {
  return device ? device->name : fail<const char>(EINVAL);
}

__be64 ibv_get_device_guid(struct ibv_device* device) {
  return device_from_ibv(device) ? Device::instance().node_guid() : 0;
}

int ibv_get_device_index(struct ibv_device* device) { return device_from_ibv(device) ? 0 : -1; }

struct ibv_context* ibv_open_device(struct ibv_device* device) {
  ibv_context* c = open_context(device);
  if (c) abi::fill_context_ops(Context::from(c));
  if (c) SV_CHECK(check::wrap_ops(Context::from(c)); check::created(Kind::Context, c, nullptr, site));
  return c;
}

int ibv_close_device(struct ibv_context* context) {
  Context* ctx = Context::from(context);
  int rc = ctx ? close_context(ctx) : EINVAL;
  SV_CHECK(check::after_destroy(Kind::Context, context, rc, site));
  return rc;
}

struct ibv_context* ibv_import_device(int cmd_fd) {
  ibv_context* c = import_device(cmd_fd);
  if (c) abi::fill_context_ops(Context::from(c));
  if (c) SV_CHECK(check::wrap_ops(Context::from(c)));
  return c;
}

int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* attr) {
  if (!Context::from(context) || !attr) return EINVAL;
  Device::instance().fill_device_attr(attr);
  return 0;
}

// The exported symbol serves binaries built before ibv_port_attr grew: it writes only the
// old 48-byte layout. New binaries reach verbs_context::query_port through the header macro.
int ibv_query_port(struct ibv_context* context, uint8_t port_num,
                   struct _compat_ibv_port_attr* port_attr) {
  if (!Context::from(context) || !port_attr) return EINVAL;
  if (port_num < 1 || port_num > kPortCount) return EINVAL;
  ibv_port_attr full;
  Device::instance().fill_port_attr(&full);
  std::memcpy(port_attr, &full, offsetof(ibv_port_attr, port_cap_flags2));
  return 0;
}

int ibv_query_gid(struct ibv_context* context, uint8_t port_num, int index, union ibv_gid* gid) {
  if (!Context::from(context) || port_num != 1 || index < 0 || !gid) return -1;
  const Device& dev = Device::instance();
  if (index >= dev.gid_table_len()) return -1;
  // An empty slot reads as the zero GID, as rdma-core reports it.
  *gid = static_cast<size_t>(index) < dev.gids().size() ? dev.gids()[index].gid : ibv_gid{};
  return 0;
}

int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                       int* type) {
  if (!Context::from(context) || port_num != 1 || !type) return -1;
  const Device& dev = Device::instance();
  if (index >= static_cast<unsigned>(dev.gid_table_len())) return -1;
  *type = index < dev.gids().size() ? kGidTypeRoceV2 : kGidTypeIbRoceV1;
  return 0;
}

int _ibv_query_gid_ex(struct ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      struct ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (!Context::from(context) || !entry || flags || port_num != 1 ||
      entry_size < sizeof(ibv_gid_entry))
    return EINVAL;
  const auto& gids = Device::instance().gids();
  if (gid_index >= static_cast<uint32_t>(Device::instance().gid_table_len())) return EINVAL;
  if (gid_index >= gids.size()) return ENODATA;  // an empty slot
  std::memset(entry, 0, entry_size);
  entry->gid = gids[gid_index].gid;
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  entry->ndev_ifindex = static_cast<uint32_t>(gids[gid_index].ifindex);
  return 0;
}

ssize_t _ibv_query_gid_table(struct ibv_context* context, struct ibv_gid_entry* entries,
                             size_t max_entries, uint32_t flags, size_t entry_size) {
  if (!Context::from(context) || flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  const auto& gids = Device::instance().gids();
  if (max_entries < gids.size()) return -EINVAL;
  for (size_t i = 0; i < gids.size(); ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
    if (int err = _ibv_query_gid_ex(context, 1, static_cast<uint32_t>(i), e, 0, entry_size))
      return -err;
  }
  return static_cast<ssize_t>(gids.size());
}

int ibv_query_pkey(struct ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!Context::from(context) || port_num != 1 || index != 0 || !pkey) return -1;
  *pkey = htons(kDefaultPkey);
  return 0;
}

int ibv_get_pkey_index(struct ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (!Context::from(context) || port_num != 1) return -EINVAL;
  // Full and limited membership of the default partition both live at index 0.
  return (ntohs(pkey) & 0x7fff) == 0x7fff ? 0 : -ENOENT;
}

// ---- Async events ------------------------------------------------------------------------

int ibv_get_async_event(struct ibv_context* context, struct ibv_async_event* event) {
  Context* ctx = Context::from(context);
  if (!ctx || !event) {
    errno = EINVAL;
    return -1;
  }
  return get_async_event(ctx, event);
}

void ibv_ack_async_event(struct ibv_async_event* event) {
  if (event) ack_async_event(event);
}

// ---- PD, MR, AH --------------------------------------------------------------------------

struct ibv_pd* ibv_alloc_pd(struct ibv_context* context) {
  Context* ctx = Context::from(context);
  ibv_pd* pd = ctx ? alloc_pd(ctx) : fail<ibv_pd>(EINVAL);
  SV_CHECK(check::created(Kind::Pd, pd, context, site));
  return pd;
}

int ibv_dealloc_pd(struct ibv_pd* pd) {
  Pd* p = Pd::from(pd);
  int rc = p ? dealloc_pd(p) : EINVAL;
  SV_CHECK(if (p) check::after_destroy(Kind::Pd, pd, rc, site));
  return rc;
}

struct ibv_pd* ibv_import_pd(struct ibv_context* context, uint32_t pd_handle) {
  Context* ctx = Context::from(context);
  return ctx ? import_pd(ctx, pd_handle) : fail<ibv_pd>(EINVAL);
}

void ibv_unimport_pd(struct ibv_pd* pd) {
  if (Pd* p = Pd::from(pd)) unimport_pd(p);
}

static ibv_mr* reg_mr_at(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  Pd* p = Pd::from(pd);
  return p ? reg_mr(p, addr, length, iova, access) : fail<ibv_mr>(EINVAL);
}

struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                unsigned int access) {
  ibv_mr* mr = reg_mr_at(pd, addr, length, iova, access);
  SV_CHECK(check::created(Kind::Mr, mr, pd, site));
  return mr;
}

struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  ibv_mr* mr = reg_mr_at(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                         static_cast<unsigned>(access));
  SV_CHECK(check::created(Kind::Mr, mr, pd, site));
  return mr;
}

struct ibv_mr* ibv_reg_mr_iova(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                               int access) {
  ibv_mr* mr = reg_mr_at(pd, addr, length, iova, static_cast<unsigned>(access));
  SV_CHECK(check::created(Kind::Mr, mr, pd, site));
  return mr;
}

struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access) {
  Pd* p = Pd::from(pd);
  ibv_mr* mr = p ? reg_dmabuf_mr(p, offset, length, iova, fd, static_cast<unsigned>(access))
                 : fail<ibv_mr>(EINVAL);
  SV_CHECK(check::created(Kind::Mr, mr, pd, site));
  return mr;
}

int ibv_rereg_mr(struct ibv_mr* mr, int flags, struct ibv_pd* pd, void* addr, size_t length,
                 int access) {
  Mr* m = Mr::from(mr);
  if (!m) return IBV_REREG_MR_ERR_INPUT;
  Pd* p = nullptr;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    p = Pd::from(pd);
    if (!p) return IBV_REREG_MR_ERR_INPUT;
  }
  return rereg_mr(m, flags, p, addr, length, access);
}

int ibv_dereg_mr(struct ibv_mr* mr) {
  Mr* m = Mr::from(mr);
  if (!m) return EINVAL;
  SV_CHECK(check::before_dereg_mr(m, site));
  int rc = dereg_mr(m);
  SV_CHECK(check::after_destroy(Kind::Mr, mr, rc, site));
  return rc;
}

struct ibv_mr* ibv_import_mr(struct ibv_pd* pd, uint32_t mr_handle) {
  Pd* p = Pd::from(pd);
  return p ? import_mr(p, mr_handle) : fail<ibv_mr>(EINVAL);
}

void ibv_unimport_mr(struct ibv_mr* mr) {
  if (Mr* m = Mr::from(mr)) unimport_mr(m);
}
struct ibv_dm* ibv_import_dm(struct ibv_context* context, uint32_t dm_handle) {
  Context* ctx = Context::from(context);
  return ctx ? import_dm(ctx, dm_handle) : fail<ibv_dm>(EINVAL);
}

void ibv_unimport_dm(struct ibv_dm* dm) {
  if (Dm* d = Dm::from(dm)) unimport_dm(d);
}

struct ibv_ah* ibv_create_ah(struct ibv_pd* pd, struct ibv_ah_attr* attr) {
  Pd* p = Pd::from(pd);
  ibv_ah* ah = p && attr ? create_ah(p, attr) : fail<ibv_ah>(EINVAL);
  SV_CHECK(check::created(Kind::Ah, ah, pd, site));
  return ah;
}

int ibv_destroy_ah(struct ibv_ah* ah) {
  Ah* a = Ah::from(ah);
  int rc = a ? destroy_ah(a) : EINVAL;
  SV_CHECK(if (a) check::after_destroy(Kind::Ah, ah, rc, site));
  return rc;
}

int ibv_init_ah_from_wc(struct ibv_context* context, uint8_t port_num, struct ibv_wc* wc,
                        struct ibv_grh* grh, struct ibv_ah_attr* ah_attr) {
  if (!Context::from(context) || !wc || !ah_attr || port_num != 1) return -1;
  std::memset(ah_attr, 0, sizeof(*ah_attr));
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH) || !grh) return 0;
  // The GRH slot holds an IPv6-format GRH, or for RoCE v2 over IPv4 an IPv4 header in its
  // last 20 bytes (ibv_ud_pingpong and udaddy reply to what they read here).
  ibv_gid sgid{}, dgid{};
  auto* raw = reinterpret_cast<uint8_t*>(grh);
  uint8_t hop_limit = 0xff;
  if ((raw[20] >> 4) == 4) {
    sgid.raw[10] = sgid.raw[11] = dgid.raw[10] = dgid.raw[11] = 0xff;
    std::memcpy(&sgid.raw[12], raw + 20 + 12, 4);
    std::memcpy(&dgid.raw[12], raw + 20 + 16, 4);
    hop_limit = raw[20 + 8];
  } else {
    sgid = grh->sgid;
    dgid = grh->dgid;
    hop_limit = grh->hop_limit;
  }
  const auto& gids = Device::instance().gids();
  int sgid_index = -1;
  for (size_t i = 0; i < gids.size(); ++i)
    if (std::memcmp(gids[i].gid.raw, dgid.raw, 16) == 0) sgid_index = static_cast<int>(i);
  if (sgid_index < 0) {
    errno = ENOENT;
    return -1;
  }
  ah_attr->is_global = 1;
  ah_attr->grh.dgid = sgid;  // reply to the sender
  ah_attr->grh.sgid_index = static_cast<uint8_t>(sgid_index);
  ah_attr->grh.hop_limit = hop_limit;
  return 0;
}

struct ibv_ah* ibv_create_ah_from_wc(struct ibv_pd* pd, struct ibv_wc* wc, struct ibv_grh* grh,
                                     uint8_t port_num) {
  if (!pd) return fail<ibv_ah>(EINVAL);
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context*, struct ibv_ah_attr*, uint8_t*, uint16_t*) {
  return EOPNOTSUPP;  // no Ethernet L2 behind a soft device
}

int ibv_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  Qp* q = Qp::from(qp);
  return q ? attach_mcast(q, gid, lid) : EINVAL;
}

int ibv_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  Qp* q = Qp::from(qp);
  return q ? detach_mcast(q, gid, lid) : EINVAL;
}

// ---- Completion channels and CQs ---------------------------------------------------------

struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* context) {
  Context* ctx = Context::from(context);
  ibv_comp_channel* ch = ctx ? create_comp_channel(ctx) : fail<ibv_comp_channel>(EINVAL);
  SV_CHECK(check::created(Kind::Channel, ch, context, site));
  return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel* channel) {
  CompChannel* ch = CompChannel::from(channel);
  int rc = ch ? destroy_comp_channel(ch) : EINVAL;
  SV_CHECK(if (ch) check::after_destroy(Kind::Channel, channel, rc, site));
  return rc;
}

struct ibv_cq* ibv_create_cq(struct ibv_context* context, int cqe, void* cq_context,
                             struct ibv_comp_channel* channel, int comp_vector) {
  Context* ctx = Context::from(context);
  CompChannel* ch = channel ? CompChannel::from(channel) : nullptr;
  if (!ctx || (channel && !ch)) return fail<ibv_cq>(EINVAL);
  ibv_cq* cq = create_cq(ctx, cqe, cq_context, ch, comp_vector);
  SV_CHECK(check::created(Kind::Cq, cq, context, site));
  return cq;
}

int ibv_resize_cq(struct ibv_cq* cq, int cqe) {
  Cq* c = Cq::from(cq);
  return c ? resize_cq(c, cqe) : EINVAL;
}

int ibv_destroy_cq(struct ibv_cq* cq) {
  Cq* c = Cq::from(cq);
  if (!c) return EINVAL;
  SV_CHECK(check::before_destroy_cq(c, site));
  int rc = destroy_cq(c);
  SV_CHECK(check::after_destroy(Kind::Cq, cq, rc, site));
  return rc;
}

int ibv_get_cq_event(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** cq_context) {
  CompChannel* ch = CompChannel::from(channel);
  if (!ch || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  SV_CHECK(check::before_get_cq_event(ch, site));
  int rc = get_cq_event(ch, cq, cq_context);
  SV_CHECK(if (rc == 0) check::got_cq_event(*cq, site));
  return rc;
}

void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  if (Cq* c = Cq::from(cq)) ack_cq_events(c, nevents);
}

// ---- SRQ ---------------------------------------------------------------------------------

struct ibv_srq* ibv_create_srq(struct ibv_pd* pd, struct ibv_srq_init_attr* attr) {
  Pd* p = Pd::from(pd);
  ibv_srq* srq = p && attr ? create_srq(p, attr) : fail<ibv_srq>(EINVAL);
  SV_CHECK(check::created(Kind::Srq, srq, pd, site));
  return srq;
}

int ibv_modify_srq(struct ibv_srq* srq, struct ibv_srq_attr* attr, int mask) {
  Srq* s = Srq::from(srq);
  return s && attr ? modify_srq(s, attr, mask) : EINVAL;
}

int ibv_query_srq(struct ibv_srq* srq, struct ibv_srq_attr* attr) {
  Srq* s = Srq::from(srq);
  return s && attr ? query_srq(s, attr) : EINVAL;
}

int ibv_destroy_srq(struct ibv_srq* srq) {
  Srq* s = Srq::from(srq);
  int rc = s ? destroy_srq(s) : EINVAL;
  SV_CHECK(if (s) check::after_destroy(Kind::Srq, srq, rc, site));
  return rc;
}

// ---- QP ----------------------------------------------------------------------------------

struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* attr) {
  Pd* p = Pd::from(pd);
  ibv_qp* qp = p && attr ? create_qp(p, attr) : fail<ibv_qp>(EINVAL);
  SV_CHECK(check::created(Kind::Qp, qp, pd, site));
  return qp;
}

int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask) {
  Qp* q = Qp::from(qp);
  return q && attr ? modify_qp(q, attr, attr_mask) : EINVAL;
}

int ibv_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                 struct ibv_qp_init_attr* init_attr) {
  Qp* q = Qp::from(qp);
  return q && attr ? query_qp(q, attr, attr_mask, init_attr) : EINVAL;
}

int ibv_destroy_qp(struct ibv_qp* qp) {
  Qp* q = Qp::from(qp);
  int rc = q ? destroy_qp(q) : EINVAL;
  SV_CHECK(if (q) check::after_destroy(Kind::Qp, qp, rc, site));
  return rc;
}

// QPs made by the ibv_create_qp_ex op are extended (as rxe's); ibv_create_qp's are not.
struct ibv_qp_ex* ibv_qp_to_qp_ex(struct ibv_qp* qp) {
  Qp* q = Qp::from(qp);
  return q && q->is_qp_ex ? &q->ibv : nullptr;
}

int ibv_query_qp_data_in_order(struct ibv_qp* qp, enum ibv_wr_opcode, uint32_t flags) {
  // Our payload lands in order and in full before the completion is written.
  return Qp::from(qp) && flags == 0 ? 1 : 0;
}

int ibv_query_ece(struct ibv_qp*, struct ibv_ece*) { return EOPNOTSUPP; }
int ibv_set_ece(struct ibv_qp*, struct ibv_ece*) { return EOPNOTSUPP; }

// ---- fork support ------------------------------------------------------------------------
// Registration does not pin pages (no DMA), so fork needs no madvise(DONTFORK) dance.

int ibv_fork_init(void) { return 0; }
enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

}  // extern "C"
