// Extended CQs: ibv_create_cq_ex and the ibv_cq_ex poll API (ibv_start_poll, next_poll,
// end_poll and the ibv_wc_read_* readers). An extended CQ is an ordinary Cq (verbs/cq.cpp)
// with the function pointers filled in: the same ring, arm state, events, overrun and
// destroy, so ibv_poll_cq, ibv_req_notify_cq and completion channels work on it unchanged
// (ibv_cq_ex_to_cq). What the readers return is the ibv_wc that ibv_poll_cq would have
// returned for the same completion, plus the timestamps taken when it was generated.
#include <cerrno>
#include <cstring>

#include "core/completion_clock.hpp"
#include "core/device.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

// The wc_flags a software device can fill. CVLAN (no VLAN stripping: a raw packet QP gets
// the tag in the frame) is not offered: asking for it gives EOPNOTSUPP, as a provider
// without it does. TM_INFO: tag matching SRQs. FLOW_TAG: raw packet QPs' receives steered
// by a rule with IBV_FLOW_SPEC_ACTION_TAG (docs/raw-packet.md; 0 for any other).
constexpr uint64_t kSupportedWcFlags =
    uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
    uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK} | uint64_t{IBV_WC_EX_WITH_TM_INFO} |
    uint64_t{IBV_WC_EX_WITH_FLOW_TAG};
constexpr uint32_t kSupportedCreateFlags =
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
constexpr uint32_t kKnownCompMask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;

// The poll API's entry points get the ibv_cq_ex the CQ embeds first (objects.hpp): no
// magic check on this path, as ibv_poll_cq's op does none.
Cq* of(ibv_cq_ex* ex) { return reinterpret_cast<Cq*>(ex); }
uint64_t current_slot(const Cq* cq) {
  return cq->head.load(std::memory_order_relaxed) & (cq->ring.size() - 1);
}
const ibv_wc& current(const Cq* cq) { return cq->ring[current_slot(cq)]; }

void load_current(Cq* cq) {
  const ibv_wc& wc = current(cq);
  cq->ibv.status = wc.status;
  cq->ibv.wr_id = wc.wr_id;
}

// An empty CQ: ENOENT; one that overran and has nothing left, an error (ibv_poll_cq's -1).
int empty_result(const Cq* cq) {
  return cq->in_error.load(std::memory_order_relaxed) ? EOVERFLOW : ENOENT;
}

int start_poll(ibv_cq_ex* ex, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  Cq* cq = of(ex);
  // Only an empty ring gathers (what waits there is newer than what the ring holds): a
  // completion gathered now, right after the program re-armed the CQ, would fire an event
  // and be taken in this same pass, and rc_pingpong -e -t, which wakes on that event,
  // would then find nothing (ENOENT is fatal to it).
  const uint64_t head = cq->head.load(std::memory_order_relaxed);
  if (cq->tail.load(std::memory_order_acquire) == head && cq_gather(cq) == head) {
    cq_polled(cq);
    return empty_result(cq);
  }
  if (!cq->single_threaded) cq->consume_mu.lock();
  const uint64_t tail = cq->tail.load(std::memory_order_acquire);
  if (tail == cq->head.load(std::memory_order_relaxed)) {
    if (!cq->single_threaded) cq->consume_mu.unlock();  // another poller took it
    return empty_result(cq);
  }
  cq->poll_end = tail;
  cq->polling = cq->poll_current = true;
  load_current(cq);
  return 0;
}

// The next of the completions that were in the ring when start_poll looked. Those generated
// since wait for the next start_poll: our sends complete inside ibv_post_send, so a program
// that posts between start and end would otherwise take, in this pass, the completion
// whose event it then waits for in vain (rc_pingpong -e -t). Nothing is gathered here
// either: that would push into the ring under consume_mu, against the produce-then-consume
// lock order of purge and resize.
int next_poll(ibv_cq_ex* ex) {
  Cq* cq = of(ex);
  if (!cq->poll_current) return ENOENT;
  uint64_t head = cq->head.load(std::memory_order_relaxed) + 1;
  cq->head.store(head, std::memory_order_release);  // the slot is free for producers
  if (head == cq->poll_end) {
    cq->poll_current = false;
    return ENOENT;
  }
  load_current(cq);
  return 0;
}

// Safe after a start_poll that failed (pyverbs calls it then): nothing is held.
void end_poll(ibv_cq_ex* ex) {
  Cq* cq = of(ex);
  if (!cq->polling) return;
  if (cq->poll_current)
    cq->head.store(cq->head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  cq->polling = cq->poll_current = false;
  if (!cq->single_threaded) cq->consume_mu.unlock();
  cq_polled(cq);
}

ibv_wc_opcode read_opcode(ibv_cq_ex* ex) { return current(of(ex)).opcode; }
uint32_t read_vendor_err(ibv_cq_ex* ex) { return current(of(ex)).vendor_err; }
uint32_t read_byte_len(ibv_cq_ex* ex) { return current(of(ex)).byte_len; }
// Network order, as in ibv_wc; also ibv_wc_read_invalidated_rkey (the same union).
__be32 read_imm_data(ibv_cq_ex* ex) { return current(of(ex)).imm_data; }
uint32_t read_qp_num(ibv_cq_ex* ex) { return current(of(ex)).qp_num; }
uint32_t read_src_qp(ibv_cq_ex* ex) { return current(of(ex)).src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* ex) { return current(of(ex)).wc_flags; }
uint32_t read_slid(ibv_cq_ex* ex) { return current(of(ex)).slid; }
uint8_t read_sl(ibv_cq_ex* ex) { return current(of(ex)).sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* ex) { return current(of(ex)).dlid_path_bits; }
// 0 when the CQ was not created with the flag (there is no stamp to read then).
uint64_t read_completion_ts(ibv_cq_ex* ex) {
  Cq* cq = of(ex);
  return (cq->stamp_kinds & CqeStamp::kRaw) ? cq->stamps[current_slot(cq)].raw : 0;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex* ex) {
  Cq* cq = of(ex);
  return (cq->stamp_kinds & CqeStamp::kWall) ? cq->stamps[current_slot(cq)].wall : 0;
}
// Never filled (see kSupportedWcFlags), but no slot of ibv_cq_ex may be NULL.
uint16_t read_cvlan(ibv_cq_ex*) { return 0; }
uint32_t read_flow_tag(ibv_cq_ex* ex) {
  Cq* cq = of(ex);
  return (cq->stamp_kinds & CqeStamp::kFlowTag) ? cq->stamps[current_slot(cq)].flow_tag : 0;
}
// The TMH's tag and app_ctx of a matched message; zero for every other completion.
void read_tm_info(ibv_cq_ex* ex, ibv_wc_tm_info* info) {
  Cq* cq = of(ex);
  if (!info) return;
  *info = (cq->stamp_kinds & CqeStamp::kTm) ? cq->stamps[current_slot(cq)].tm : ibv_wc_tm_info{};
}

void fill_poll_ops(ibv_cq_ex* ex) {
  ex->start_poll = &start_poll;
  ex->next_poll = &next_poll;
  ex->end_poll = &end_poll;
  ex->read_opcode = &read_opcode;
  ex->read_vendor_err = &read_vendor_err;
  ex->read_byte_len = &read_byte_len;
  ex->read_imm_data = &read_imm_data;
  ex->read_qp_num = &read_qp_num;
  ex->read_src_qp = &read_src_qp;
  ex->read_wc_flags = &read_wc_flags;
  ex->read_slid = &read_slid;
  ex->read_sl = &read_sl;
  ex->read_dlid_path_bits = &read_dlid_path_bits;
  ex->read_completion_ts = &read_completion_ts;
  ex->read_cvlan = &read_cvlan;
  ex->read_flow_tag = &read_flow_tag;
  ex->read_tm_info = &read_tm_info;
  ex->read_completion_wallclock_ns = &read_completion_wallclock_ns;
}

}  // namespace

ibv_cq_ex* create_cq_ex(Context* ctx, const ibv_cq_init_attr_ex* attr) {
  if (!attr || (attr->comp_mask & ~kKnownCompMask)) {
    errno = EINVAL;
    return nullptr;
  }
  const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
  if ((attr->wc_flags & ~kSupportedWcFlags) || (flags & ~kSupportedCreateFlags)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // A parent domain (IBV_CQ_INIT_ATTR_MASK_PD) only names allocators for the CQ's buffer,
  // which is not device memory here: any PD of this context is accepted, and anything
  // else is not supported (parent domains of their own kind would hook in here).
  if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    Pd* pd = Pd::from(attr->parent_domain);
    if (!pd || pd->ctx != ctx) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
  }
  CompChannel* ch = attr->channel ? CompChannel::from(attr->channel) : nullptr;
  if ((attr->channel && !ch) || attr->cqe == 0 || attr->cqe > uint32_t(device_limits().max_cqe) ||
      attr->comp_vector > uint32_t(INT32_MAX)) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_cq* c = create_cq(ctx, static_cast<int>(attr->cqe), attr->cq_context, ch,
                        static_cast<int>(attr->comp_vector));
  if (!c) return nullptr;
  Cq* cq = Cq::from(c);
  // No QP can feed it yet: set up before any producer sees it.
  cq->wc_flags = attr->wc_flags;
  cq->ignore_overrun = (flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) != 0;
  cq->single_threaded = (flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED) != 0;
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) cq->stamp_kinds |= CqeStamp::kRaw;
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
    cq->stamp_kinds |= CqeStamp::kWall;
  if (attr->wc_flags & IBV_WC_EX_WITH_TM_INFO) cq->stamp_kinds |= CqeStamp::kTm;
  if (attr->wc_flags & IBV_WC_EX_WITH_FLOW_TAG) cq->stamp_kinds |= CqeStamp::kFlowTag;
  if (cq->stamp_kinds) cq->stamps.resize(cq->ring.size());
  cq->ibv.comp_mask = 0;
  fill_poll_ops(&cq->ibv);
  return &cq->ibv;
}

// CQ moderation (core/cq_moderation.cpp has the semantics). The checks are those of the
// stack mlx5 sits in: rdma-core's ibv_cmd_modify_cq (a mask bit from IBV_CQ_ATTR_RESERVED
// up: EINVAL), the kernel's ib_uverbs_ex_modify_cq (no bit: EINVAL) and mlx5_ib_modify_cq
// (a period over the 12-bit CQ context field: EINVAL); the count is 16 bits, as there.
int modify_cq(Cq* cq, const ibv_modify_cq_attr* attr) {
  if (!attr || attr->attr_mask == 0 || attr->attr_mask >= IBV_CQ_ATTR_RESERVED) return EINVAL;
  static_assert(sizeof(attr->moderate.cq_count) == 2 && kMaxCqModerationCount == 0xffff,
                "every cq_count fits; only the period has a limit below its type's");
  if (attr->moderate.cq_period > kMaxCqModerationPeriod) return EINVAL;
  return cq_set_moderation(cq, attr->moderate.cq_count, attr->moderate.cq_period);
}

// comp_mask in: what is asked; out: what was filled (bits we do not know stay unanswered).
int query_rt_values(ibv_values_ex* values) {
  if (!values) return EINVAL;
  uint32_t filled = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    // As providers report it: the raw counter in tv_nsec, tv_sec 0.
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(completion_clock_now());
    filled |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = filled;
  return 0;
}

void fill_cq_ex_attr(ibv_device_attr_ex* attr) {
  attr->completion_timestamp_mask = kCompletionTimestampMask;
  attr->hca_core_clock = kCompletionClockKhz;
  attr->cq_mod_caps.max_cq_count = kMaxCqModerationCount;
  attr->cq_mod_caps.max_cq_period = kMaxCqModerationPeriod;
}

}  // namespace softverbs
