/*
 * err_loc_prot: local protection errors at the requester.
 *
 * A send WR whose SGE the local MR table does not cover completes with IBV_WC_LOC_PROT_ERR:
 * - an lkey that names no MR;
 * - a valid lkey with an SGE reaching past the end of its MR, or starting before it;
 * - an RDMA READ into an MR registered without IBV_ACCESS_LOCAL_WRITE.
 * The QP then is in the error state: the WRs posted after the failing one in the same list,
 * and WRs posted later, complete with IBV_WC_WR_FLUSH_ERR, in order. Nothing reaches B.
 * On error completions only wr_id, status and qp_num are checked (ibv_poll_cq(3)).
 */
#include "common.h"

static struct sv_dev dev;

/* Posts [bad, send, send] on a fresh pair, checks the three completions, the state, a later
 * post, and that B saw nothing. `bad` is wr_id 1 and is linked to the two followers here. */
static void run_case(const char *name, struct sv_pair *p, struct ibv_send_wr *bad_wr,
		     struct ibv_mr *mr_a, struct ibv_mr *mr_b)
{
	sv_step("%s", name);
	CHECK_OK(sv_post_recv(p->qp[1], 50, mr_b, 0, 1024));
	CHECK_OK(sv_post_recv(p->qp[1], 51, mr_b, 1024, 1024));
	struct ibv_send_wr w2, w3, *bad = NULL;
	struct ibv_sge s2, s3;
	/* FENCE: w2 must not start before an RDMA READ in bad_wr has completed. */
	sv_wr_init(&w2, &s2, 2, IBV_WR_SEND, mr_a, 0, 16, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
	sv_wr_init(&w3, &s3, 3, IBV_WR_SEND, mr_a, 0, 16, IBV_SEND_SIGNALED);
	bad_wr->wr_id = 1;
	bad_wr->next = &w2;
	w2.next = &w3;
	CHECK_OK(ibv_post_send(p->qp[0], bad_wr, &bad));
	sv_expect_wc(p->scq[0], 1, IBV_WC_LOC_PROT_ERR, p->qp[0], NULL);
	sv_expect_wc(p->scq[0], 2, IBV_WC_WR_FLUSH_ERR, p->qp[0], NULL);
	sv_expect_wc(p->scq[0], 3, IBV_WC_WR_FLUSH_ERR, p->qp[0], NULL);
	CHECK_EQ(sv_query_state(p->qp[0]), IBV_QPS_ERR);

	/* Posting to a QP in the error state is allowed; the WR is flushed. */
	CHECK_OK(sv_post_send(p->qp[0], 4, mr_a, 0, 16, IBV_SEND_SIGNALED));
	sv_expect_wc(p->scq[0], 4, IBV_WC_WR_FLUSH_ERR, p->qp[0], NULL);
	sv_expect_empty(p->scq[0], "after the flushed WRs");

	/* Nothing reached B: its receives are still posted, it is still RTS. */
	sv_expect_empty(p->rcq[1], "B received nothing");
	CHECK_EQ(sv_query_state(p->qp[1]), IBV_QPS_RTS);
}

int main(void)
{
	sv_init("err_loc_prot");
	sv_open(&dev);
	struct ibv_mr *mr_a = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *mr_b = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *mr_ro = sv_alloc_mr(dev.pd, 4096, IBV_ACCESS_REMOTE_READ);
	struct sv_pair p;
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	sv_pair_open(&dev, NULL, &p);
	sv_wr_init(&wr, &sge, 1, IBV_WR_SEND, mr_a, 0, 64, IBV_SEND_SIGNALED);
	uint32_t lkey = mr_a->lkey ^ 0x00a5a500;
	while (lkey == mr_a->lkey || lkey == mr_b->lkey || lkey == mr_ro->lkey)
		lkey += 0x100;
	sge.lkey = lkey;
	run_case("SEND with an lkey that names no MR", &p, &wr, mr_a, mr_b);
	sv_pair_destroy(&p);

	sv_pair_open(&dev, NULL, &p);
	sv_wr_init(&wr, &sge, 1, IBV_WR_SEND, mr_a, 4096 - 16, 64, IBV_SEND_SIGNALED);
	run_case("SEND with an SGE reaching past the end of its MR", &p, &wr, mr_a, mr_b);
	sv_pair_destroy(&p);

	sv_pair_open(&dev, NULL, &p);
	sv_wr_init(&wr, &sge, 1, IBV_WR_SEND, mr_a, 0, 64, IBV_SEND_SIGNALED);
	sge.addr -= 64;
	run_case("SEND with an SGE starting before its MR", &p, &wr, mr_a, mr_b);
	sv_pair_destroy(&p);

	sv_pair_open(&dev, NULL, &p);
	sv_wr_init(&wr, &sge, 1, IBV_WR_RDMA_READ, mr_ro, 0, 64, IBV_SEND_SIGNALED);
	wr.wr.rdma.remote_addr = sv_addr(mr_b, 2048);
	wr.wr.rdma.rkey = mr_b->rkey;
	run_case("RDMA READ into an MR without LOCAL_WRITE", &p, &wr, mr_a, mr_b);
	sv_pair_destroy(&p);

	sv_step("teardown");
	sv_free_mr(mr_a);
	sv_free_mr(mr_b);
	sv_free_mr(mr_ro);
	sv_close(&dev);
	sv_pass();
	return 0;
}
