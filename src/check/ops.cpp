// The checking data-path ops: with checking on, each new context's post, poll and arm slots
// (which the inline verbs of <infiniband/verbs.h> call) and its extended create slots point
// here; these check and call the real ones. With checking off nothing is swapped, so the
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
  if (got > 0) explain_completions(wc, got, SV_SITE);
  return got;
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  if (Cq* c = Cq::from(cq)) before_req_notify(c, SV_SITE);
  return real.req_notify_cq(cq, solicited_only);
}

ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  ibv_qp* qp = real.create_qp_ex(ctx, attr);
  if (qp) created(Kind::Qp, qp, attr->comp_mask & IBV_QP_INIT_ATTR_PD ? attr->pd : nullptr, SV_SITE);
  return qp;
}

ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  ibv_cq_ex* cq = real.create_cq_ex(ctx, attr);
  if (cq) created(Kind::Cq, ibv_cq_ex_to_cq(cq), ctx, SV_SITE);
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
