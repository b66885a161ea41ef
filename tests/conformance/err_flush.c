/*
 * err_flush: moving a QP to the error state flushes its work queues.
 *
 * - B holds five posted receives; ibv_modify_qp(B, ERR) completes all five with
 *   IBV_WC_WR_FLUSH_ERR, in posting order, with their wr_ids and B's qp_num. A receive posted
 *   while B is in the error state is accepted and flushed too.
 * - A holds three SENDs that cannot complete (B has no receive and rnr_retry = 7 retries
 *   forever); ibv_modify_qp(A, ERR) flushes them, in order. A SEND posted afterwards is
 *   accepted and flushed.
 * On error completions only wr_id, status and qp_num are checked (ibv_poll_cq(3)).
 */
#include "common.h"

int main(void)
{
	sv_init("err_flush");
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 8192, SV_ACCESS_ALL);
	struct sv_pair p;

	sv_step("posted receives are flushed in order when B moves to ERR");
	sv_pair_open(&dev, NULL, &p);
	for (uint64_t i = 0; i < 5; i++)
		CHECK_OK(sv_post_recv(p.qp[1], 100 + i, mr, 1024 * i, 1024));
	sv_sleep_ms(SV_QUIET_MS);
	sv_expect_empty(p.rcq[1], "nothing was sent");
	CHECK_OK(sv_modify_state(p.qp[1], IBV_QPS_ERR));
	CHECK_EQ(sv_query_state(p.qp[1]), IBV_QPS_ERR);
	for (uint64_t i = 0; i < 5; i++)
		sv_expect_wc(p.rcq[1], 100 + i, IBV_WC_WR_FLUSH_ERR, p.qp[1], NULL);
	sv_expect_empty(p.rcq[1], "five receives, five flushes");

	sv_step("a receive posted in the error state is flushed");
	CHECK_OK(sv_post_recv(p.qp[1], 105, mr, 0, 1024));
	sv_expect_wc(p.rcq[1], 105, IBV_WC_WR_FLUSH_ERR, p.qp[1], NULL);
	sv_expect_empty(p.scq[1], "B never sent");
	sv_pair_destroy(&p);

	sv_step("outstanding SENDs are flushed in order when A moves to ERR");
	sv_pair_open(&dev, NULL, &p); /* rnr_retry 7: the SENDs wait for receives forever */
	for (uint64_t i = 0; i < 3; i++)
		CHECK_OK(sv_post_send(p.qp[0], 200 + i, mr, 0, 64, IBV_SEND_SIGNALED));
	sv_sleep_ms(SV_QUIET_MS);
	sv_expect_empty(p.scq[0], "no receive at B, the SENDs cannot complete");
	CHECK_OK(sv_modify_state(p.qp[0], IBV_QPS_ERR));
	for (uint64_t i = 0; i < 3; i++)
		sv_expect_wc(p.scq[0], 200 + i, IBV_WC_WR_FLUSH_ERR, p.qp[0], NULL);
	sv_expect_empty(p.scq[0], "three sends, three flushes");

	sv_step("a SEND posted in the error state is flushed");
	CHECK_OK(sv_post_send(p.qp[0], 203, mr, 0, 64, IBV_SEND_SIGNALED));
	sv_expect_wc(p.scq[0], 203, IBV_WC_WR_FLUSH_ERR, p.qp[0], NULL);
	sv_expect_empty(p.rcq[1], "B received nothing");
	CHECK_EQ(sv_query_state(p.qp[1]), IBV_QPS_RTS);
	sv_pair_destroy(&p);

	sv_step("teardown");
	sv_free_mr(mr);
	sv_close(&dev);
	sv_pass();
	return 0;
}
