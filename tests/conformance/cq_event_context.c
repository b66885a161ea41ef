/*
 * cq_event_context: one completion channel serving several CQs.
 *
 * ibv_get_cq_event returns the CQ that fired and that CQ's cq_context (as given to
 * ibv_create_cq), and events come back in the order in which the CQs fired. Four CQs share
 * one channel: A's send and receive CQs and B's send and receive CQs, each with a distinct
 * cq_context; a fifth CQ with a NULL cq_context gets its NULL back.
 */
#include "common.h"

static struct sv_fixture f;
static struct ibv_mr *mr_a, *mr_b;

/* Waits for the completion of a signaled WR on `cq` (and nothing else). */
static void complete(struct ibv_cq *cq, uint64_t id, struct ibv_qp *qp)
{
	sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp, NULL);
	sv_expect_empty(cq, "one completion expected");
}

int main(void)
{
	sv_init("cq_event_context");
	sv_fixture_open(&f, NULL, 1);
	struct ibv_comp_channel *ch = f.ch;
	mr_a = f.mr[0];
	mr_b = f.mr[1];

	sv_step("arm all four CQs, then make them fire one at a time");
	for (int i = 0; i < 2; i++) {
		CHECK_OK(ibv_req_notify_cq(f.pair.scq[i], 0));
		CHECK_OK(ibv_req_notify_cq(f.pair.rcq[i], 0));
	}
	/* 1. A's send CQ: an RDMA WRITE produces no receive completion at B. */
	CHECK_OK(sv_post_rdma(f.pair.qp[0], 1, IBV_WR_RDMA_WRITE, mr_a, 0, 64, IBV_SEND_SIGNALED,
			      sv_addr(mr_b, 2048), mr_b->rkey));
	complete(f.pair.scq[0], 1, f.pair.qp[0]);
	/* 2. B's send CQ, the same way in the other direction. */
	CHECK_OK(sv_post_rdma(f.pair.qp[1], 2, IBV_WR_RDMA_WRITE, mr_b, 0, 64, IBV_SEND_SIGNALED,
			      sv_addr(mr_a, 2048), mr_a->rkey));
	complete(f.pair.scq[1], 2, f.pair.qp[1]);
	/* 3. A's receive CQ: a SEND from B (B's send CQ already fired and is not re-armed). */
	CHECK_OK(sv_post_recv(f.pair.qp[0], 3, mr_a, 0, 256));
	CHECK_OK(sv_post_send(f.pair.qp[1], 3, mr_b, 0, 64, IBV_SEND_SIGNALED));
	complete(f.pair.scq[1], 3, f.pair.qp[1]);
	complete(f.pair.rcq[0], 3, f.pair.qp[0]);
	/* 4. B's receive CQ: a SEND from A (A's send CQ already fired). */
	CHECK_OK(sv_post_recv(f.pair.qp[1], 4, mr_b, 0, 256));
	CHECK_OK(sv_post_send(f.pair.qp[0], 4, mr_a, 0, 64, IBV_SEND_SIGNALED));
	complete(f.pair.scq[0], 4, f.pair.qp[0]);
	complete(f.pair.rcq[1], 4, f.pair.qp[1]);

	sv_step("the four events come back in firing order with their CQ and cq_context");
	struct ibv_cq *order[4] = { f.pair.scq[0], f.pair.scq[1], f.pair.rcq[0], f.pair.rcq[1] };
	void *contexts[4] = { &f.pair.scq[0], &f.pair.scq[1], &f.pair.rcq[0], &f.pair.rcq[1] };
	for (int i = 0; i < 4; i++) {
		struct ibv_cq *cq = NULL;
		void *ctx = NULL;
		CHECKF(sv_wait_cq_event(ch, SV_WAIT_MS, &cq, &ctx), "event %d of 4 missing", i + 1);
		CHECKF(cq == order[i], "event %d: CQ %p, expected %p", i + 1, (void *)cq,
		       (void *)order[i]);
		CHECKF(ctx == contexts[i], "event %d: cq_context %p, expected %p", i + 1, ctx,
		       contexts[i]);
		CHECK(cq->cq_context == contexts[i]);
		ibv_ack_cq_events(cq, 1);
	}
	sv_expect_no_cq_event(ch, "each CQ fired once");

	sv_step("a CQ created with a NULL cq_context gets NULL back");
	struct ibv_cq *plain = sv_create_cq(&f.dev, 16, NULL, ch);
	struct ibv_qp *qa = sv_create_qp(&f.dev, &f.pair.cfg, plain, plain, NULL, NULL);
	struct ibv_qp *qb = sv_create_qp(&f.dev, &f.pair.cfg, plain, plain, NULL, NULL);
	sv_connect(&f.dev, qa, qb, &f.pair.cfg);
	CHECK_OK(ibv_req_notify_cq(plain, 0));
	CHECK_OK(sv_post_rdma(qa, 5, IBV_WR_RDMA_WRITE, mr_a, 0, 8, IBV_SEND_SIGNALED,
			      sv_addr(mr_b, 0), mr_b->rkey));
	complete(plain, 5, qa);
	struct ibv_cq *cq = NULL;
	void *ctx = (void *)&f.pair; /* must be overwritten with NULL */
	CHECK(sv_fd_readable(ch->fd, SV_WAIT_MS));
	CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0);
	CHECK(cq == plain);
	CHECK(ctx == NULL);
	ibv_ack_cq_events(cq, 1);

	sv_step("teardown");
	CHECK_OK(ibv_destroy_qp(qa));
	CHECK_OK(ibv_destroy_qp(qb));
	CHECK_OK(ibv_destroy_cq(plain));
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
