// The checking data-path ops: with checking on, each new context's post, poll and arm slots
// (which the inline verbs of <infiniband/verbs.h> call) and its extended create slots point
// here, and so do the post slots of each extended QP (ibv_wr_complete, ibv_wr_set_*) and
// the poll slots of each extended CQ (ibv_start_poll, ibv_next_poll) those make; these
// check and call the real ones. With checking off nothing is swapped, so the
// data path is exactly what it is without the checker.
#include "check/state.hpp"

namespace softverbs::check {

RealOps real;

namespace {

// Where the application called the inline verb that called us.
#define SV_SITE __builtin_return_address(0)

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return checked_post_send(qp, wr, bad, SV_SITE);
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return checked_post_recv(qp, wr, bad, SV_SITE);
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return checked_post_srq_recv(srq, wr, bad, SV_SITE);
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  int got = real.poll_cq(cq, n, wc);
  if (got > 0) explain_completions(wc, got, SV_SITE, "ibv_poll_cq");
  return got;
}

// The extended QP's slots: ibv_wr_complete and the wr_set_* calls that can refuse a WR.
int wr_complete(ibv_qp_ex* q) { return checked_wr_complete(q, SV_SITE); }

void wr_set_sge_list(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  check_wr_set_sges(q, n, SV_SITE);
  real.wr_set_sge_list(q, n, list);
}

void wr_set_inline_data(ibv_qp_ex* q, void* addr, size_t len) {
  check_wr_set_inline(q, len, SV_SITE);
  real.wr_set_inline_data(q, addr, len);
}

void wr_set_inline_data_list(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  uint64_t bytes = 0;
  for (size_t i = 0; bufs && i < n; ++i) bytes += bufs[i].length;
  check_wr_set_inline(q, bytes, SV_SITE);
  real.wr_set_inline_data_list(q, n, bufs);
}

// The extended CQ's poll API: each completion it makes current is explained as
// ibv_poll_cq's are (the error ones: RNR retries exhausted, remote access refused ...).
void explain_current(ibv_cq_ex* cq, Site site, const char* verb) {
  if (cq->status == IBV_WC_SUCCESS || cq->status == IBV_WC_WR_FLUSH_ERR) return;
  ibv_wc wc{};
  wc.wr_id = cq->wr_id;
  wc.status = cq->status;
  wc.qp_num = cq->read_qp_num(cq);
  explain_completions(&wc, 1, site, verb);
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  int rc = real.start_poll(cq, attr);
  if (rc == 0) explain_current(cq, SV_SITE, "ibv_start_poll");
  return rc;
}

int next_poll(ibv_cq_ex* cq) {
  int rc = real.next_poll(cq);
  if (rc == 0) explain_current(cq, SV_SITE, "ibv_next_poll");
  return rc;
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  if (Cq* c = Cq::from(cq)) before_req_notify(c, SV_SITE);
  return real.req_notify_cq(cq, solicited_only);
}

ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  ibv_qp* qp = real.create_qp_ex(ctx, attr);
  if (!qp) return qp;
  created(Kind::Qp, qp, attr->comp_mask & IBV_QP_INIT_ATTR_PD ? attr->pd : nullptr, SV_SITE);
  Qp* q = Qp::from(qp);
  if (q && q->is_qp_ex) {
    ibv_qp_ex& x = q->ibv;
    if (!real.wr_complete) {
      real.wr_complete = x.wr_complete;
      real.wr_set_sge_list = x.wr_set_sge_list;
      real.wr_set_inline_data = x.wr_set_inline_data;
      real.wr_set_inline_data_list = x.wr_set_inline_data_list;
    }
    x.wr_complete = &wr_complete;
    x.wr_set_sge_list = &wr_set_sge_list;
    x.wr_set_inline_data = &wr_set_inline_data;
    x.wr_set_inline_data_list = &wr_set_inline_data_list;
  }
  return qp;
}

ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  ibv_cq_ex* cq = real.create_cq_ex(ctx, attr);
  if (!cq) return cq;
  created(Kind::Cq, ibv_cq_ex_to_cq(cq), ctx, SV_SITE);
  if (!real.start_poll) {
    real.start_poll = cq->start_poll;
    real.next_poll = cq->next_poll;
  }
  cq->start_poll = &start_poll;
  cq->next_poll = &next_poll;
  return cq;
}

}  // namespace

void wrap_ops(Context* ctx) {
  ibv_context_ops& ops = ctx->vctx.context.ops;
  verbs_context& v = ctx->vctx;
  // Every context gets the same ops: the first one tells us which they are.
  if (!real.post_send) {
    real.post_send = ops.post_send;
    real.post_recv = ops.post_recv;
    real.post_srq_recv = ops.post_srq_recv;
    real.poll_cq = ops.poll_cq;
    real.req_notify_cq = ops.req_notify_cq;
    real.create_qp_ex = v.create_qp_ex;
    real.create_cq_ex = v.create_cq_ex;
  }
  ops.post_send = &post_send;
  ops.post_recv = &post_recv;
  ops.post_srq_recv = &post_srq_recv;
  ops.poll_cq = &poll_cq;
  ops.req_notify_cq = &req_notify_cq;
  v.create_qp_ex = &create_qp_ex;
  v.create_cq_ex = &create_cq_ex;
}

}  // namespace softverbs::check
