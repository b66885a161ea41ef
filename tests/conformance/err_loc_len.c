/*
 * err_loc_len: a receive buffer too small for the incoming message.
 *
 * B posts a 16-byte receive (then a 1024-byte one); A sends 100 bytes (then 16). Expected:
 * - B: the 16-byte receive completes with IBV_WC_LOC_LEN_ERR; B goes to the error state and
 *   its next receive is flushed (IBV_WC_WR_FLUSH_ERR);
 * - A: the SEND completes with IBV_WC_REM_INV_REQ_ERR (the responder NAKs it as an invalid
 *   request); A goes to the error state and its next SEND is flushed.
 * On error completions only wr_id, status and qp_num are checked (ibv_poll_cq(3)).
 */
#include "common.h"

int main(void)
{
	sv_init("err_loc_len");
	struct sv_fixture f;
	sv_fixture_open(&f, NULL, 0);
	struct sv_pair *p = &f.pair;
	struct ibv_mr *mr_a = f.mr[0], *mr_b = f.mr[1];

	sv_step("100-byte SEND into a 16-byte receive");
	CHECK_OK(sv_post_recv(p->qp[1], 10, mr_b, 0, 16));
	CHECK_OK(sv_post_recv(p->qp[1], 11, mr_b, 1024, 1024));
	CHECK_OK(sv_post_send(p->qp[0], 20, mr_a, 0, 100, IBV_SEND_SIGNALED));
	CHECK_OK(sv_post_send(p->qp[0], 21, mr_a, 0, 16, IBV_SEND_SIGNALED));

	sv_step("receiver: LOC_LEN_ERR, then its next receive is flushed");
	sv_expect_wc(p->rcq[1], 10, IBV_WC_LOC_LEN_ERR, p->qp[1], NULL);
	sv_expect_wc(p->rcq[1], 11, IBV_WC_WR_FLUSH_ERR, p->qp[1], NULL);
	sv_expect_empty(p->rcq[1], "two receives, two completions");
	CHECK_EQ(sv_query_state(p->qp[1]), IBV_QPS_ERR);

	sv_step("sender: REM_INV_REQ_ERR, then its next SEND is flushed");
	sv_expect_wc(p->scq[0], 20, IBV_WC_REM_INV_REQ_ERR, p->qp[0], NULL);
	sv_expect_wc(p->scq[0], 21, IBV_WC_WR_FLUSH_ERR, p->qp[0], NULL);
	sv_expect_empty(p->scq[0], "two sends, two completions");
	CHECK_EQ(sv_query_state(p->qp[0]), IBV_QPS_ERR);

	sv_step("teardown");
	/* Any async events the errors raised are acked before the QPs go. */
	sv_drain_async(f.dev.ctx, 0);
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
