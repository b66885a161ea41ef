// Tag matching SRQs, the verbs side: ibv_create_srq_ex(3) with IBV_SRQT_TM and tm_cap,
// ibv_post_srq_ops(3) (IBV_WR_TAG_ADD/DEL/SYNC) and tm_caps in ibv_query_device_ex. The
// matching list and its phase counters are core/tag_list.hpp; what happens when a message
// arrives is engine/tm_responder.cpp. A list operation takes effect when it is posted (no
// hardware queue to wait for), so its completion, if any, is in the TM-SRQ's CQ when
// ibv_post_srq_ops returns.
#include <cerrno>
#include <mutex>

#include "core/device.hpp"
#include "core/tag_list.hpp"
#include "engine/engine.hpp"
#include "verbs/verbs.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {

// What we report in tm_caps: mlx5's rendezvous header room (TMH, RVH, 32 bytes of the
// sender's own), and list limits of our choosing (a list is searched linearly).
constexpr uint32_t kMaxRndvHdr = 64;
constexpr uint32_t kMaxTags = 256;
constexpr uint32_t kMaxOps = 256;
constexpr uint32_t kMaxTagSge = 16;

void push_op_completion(Srq* srq, const ibv_ops_wr* wr, ibv_wc_opcode op, ibv_wc_status st) {
  ibv_wc wc{};
  wc.wr_id = wr->wr_id;
  wc.opcode = op;
  wc.status = st;
  // The list and the software disagree about unexpected messages: ask for a SYNC.
  if (st == IBV_WC_SUCCESS && !srq->tm->list.in_sync()) wc.wc_flags = IBV_WC_TM_SYNC_REQ;
  cq_push(srq->tm->cq, wc, false);
}

int check_tag_sges(const ibv_ops_wr* wr) {
  const int n = wr->tm.add.num_sge;
  if (n < 0 || static_cast<uint32_t>(n) > kMaxTagSge || (n > 0 && !wr->tm.add.sg_list))
    return EINVAL;
  return 0;
}

// One list operation, under srq->mu. 0 or the errno ibv_post_srq_ops returns.
int run_op(Srq* srq, ibv_ops_wr* wr) {
  TagList& list = srq->tm->list;
  if (wr->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) return EINVAL;
  const bool signaled = wr->flags & IBV_OPS_SIGNALED;
  switch (wr->opcode) {
    case IBV_WR_TAG_ADD: {
      if (int err = check_tag_sges(wr)) return err;
      if (list.size() >= list.capacity()) return ENOMEM;
      if (wr->flags & IBV_OPS_TM_SYNC) list.sync(wr->tm.unexpected_cnt);
      TagEntry e;
      e.tag = wr->tm.add.tag;
      e.mask = wr->tm.add.mask;
      e.wr_id = wr->tm.add.recv_wr_id;
      for (int i = 0; i < wr->tm.add.num_sge; ++i) {
        const ibv_sge& s = wr->tm.add.sg_list[i];
        e.sges.push_back({s.addr, s.length, s.lkey});
      }
      wr->tm.handle = *list.add(std::move(e));
      if (signaled) push_op_completion(srq, wr, IBV_WC_TM_ADD, IBV_WC_SUCCESS);
      return 0;
    }
    case IBV_WR_TAG_DEL: {
      if (wr->tm.handle >= list.capacity()) return EINVAL;
      if (wr->flags & IBV_OPS_TM_SYNC) list.sync(wr->tm.unexpected_cnt);
      // A tag a message consumed meanwhile: IBV_WC_TM_ERR, reported even unsignaled.
      if (!list.remove(wr->tm.handle)) {
        push_op_completion(srq, wr, IBV_WC_TM_DEL, IBV_WC_TM_ERR);
      } else if (signaled) {
        push_op_completion(srq, wr, IBV_WC_TM_DEL, IBV_WC_SUCCESS);
      }
      return 0;
    }
    case IBV_WR_TAG_SYNC:
      list.sync(wr->tm.unexpected_cnt);  // SYNC always carries the count
      if (signaled) push_op_completion(srq, wr, IBV_WC_TM_SYNC, IBV_WC_SUCCESS);
      return 0;
    default:
      return EINVAL;
  }
}

}  // namespace

void fill_tm_caps(ibv_tm_caps* caps) {
  caps->max_rndv_hdr_size = kMaxRndvHdr;
  caps->max_num_tags = kMaxTags;
  caps->flags = IBV_TM_CAP_RC;
  caps->max_ops = kMaxOps;
  caps->max_sge = kMaxTagSge;
}

ibv_srq* create_tm_srq(Pd* pd, Cq* cq, ibv_srq_init_attr_ex* ex) {
  const ibv_tm_cap& cap = ex->tm_cap;
  if (cap.max_num_tags == 0 || cap.max_num_tags > kMaxTags || cap.max_ops > kMaxOps) {
    errno = EINVAL;
    return nullptr;
  }
  auto* tm = new (std::nothrow) TmSrq(cap.max_num_tags, cq, cap.max_ops ? cap.max_ops : kMaxOps);
  if (!tm) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_srq* s = create_srq_from_ex(pd, ex);
  if (!s) {
    delete tm;
    return nullptr;
  }
  Srq* srq = Srq::from(s);
  srq->tm = tm;
  srq->ibv.srq_context = ex->srq_context;
  cq->users++;  // its completions go there: the CQ stays while the SRQ does
  stat::publish(srq);  // again, as a tag matching SRQ
  return s;
}

void free_tm_srq(Srq* srq) {
  if (!srq->tm) return;
  srq->tm->cq->users--;
  delete srq->tm;
  srq->tm = nullptr;
}

int post_srq_ops(Srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  if (!srq->tm) {
    if (bad) *bad = wr;
    return EINVAL;  // not a tag matching SRQ
  }
  int err = 0;
  std::set<uint32_t> waiters;
  {
    std::lock_guard<QueueMutex> lock(srq->mu);
    for (; wr; wr = wr->next)
      if ((err = run_op(srq, wr))) break;
    // A new tag (or coming back in sync) may take a message that met no receive.
    waiters.swap(srq->rnr_waiters);
  }
  if (err && bad) *bad = wr;
  for (uint32_t qpn : waiters) engine::kick_qpn(qpn);
  return err;
}

}  // namespace softverbs
