/*
 * err_rnr: Receiver Not Ready.
 *
 * - rnr_retry = 1, min_rnr_timer = 1 (0.01 ms), no receive posted at B: A's SEND completes with
 *   IBV_WC_RNR_RETRY_EXC_ERR, the SEND behind it with IBV_WC_WR_FLUSH_ERR; A is in the error
 *   state. An RNR NAK is not an error at the responder: B stays in RTS and its receive CQ
 *   stays empty.
 * - rnr_retry = 7 (retry forever): a SEND posted before the receive is delivered once the
 *   receive shows up.
 */
#include "common.h"

int main(void)
{
	sv_init("err_rnr");
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_mr *mr_a = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *mr_b = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct sv_pair_cfg cfg;
	struct sv_pair p;

	sv_step("rnr_retry 1, no receive posted: RNR_RETRY_EXC_ERR");
	sv_pair_cfg_init(&cfg);
	cfg.rnr_retry = 1;
	cfg.min_rnr_timer = 1;
	sv_pair_open(&dev, &cfg, &p);
	CHECK_OK(sv_post_send(p.qp[0], 1, mr_a, 0, 64, IBV_SEND_SIGNALED));
	CHECK_OK(sv_post_send(p.qp[0], 2, mr_a, 0, 64, IBV_SEND_SIGNALED));
	sv_expect_wc(p.scq[0], 1, IBV_WC_RNR_RETRY_EXC_ERR, p.qp[0], NULL);
	sv_expect_wc(p.scq[0], 2, IBV_WC_WR_FLUSH_ERR, p.qp[0], NULL);
	sv_expect_empty(p.scq[0], "two sends, two completions");
	CHECK_EQ(sv_query_state(p.qp[0]), IBV_QPS_ERR);
	CHECK_EQ(sv_query_state(p.qp[1]), IBV_QPS_RTS);
	sv_expect_empty(p.rcq[1], "B had no receive");
	sv_pair_destroy(&p);

	sv_step("rnr_retry 7: a SEND waits for a receive posted later");
	sv_pair_cfg_init(&cfg);
	cfg.rnr_retry = 7;
	sv_pair_open(&dev, &cfg, &p);
	memcpy(sv_ptr(mr_a, 0), "late receive", 13);
	CHECK_OK(sv_post_send(p.qp[0], 3, mr_a, 0, 13, IBV_SEND_SIGNALED));
	sv_sleep_ms(SV_QUIET_MS); /* let it be refused a few times */
	sv_expect_empty(p.scq[0], "the SEND cannot complete before B posts a receive");
	CHECK_OK(sv_post_recv(p.qp[1], 4, mr_b, 0, 64));
	sv_expect_wc(p.scq[0], 3, IBV_WC_SUCCESS, p.qp[0], NULL);
	struct ibv_wc wc;
	sv_expect_wc(p.rcq[1], 4, IBV_WC_SUCCESS, p.qp[1], &wc);
	CHECK_EQ(wc.byte_len, 13);
	CHECK(memcmp(sv_ptr(mr_b, 0), "late receive", 13) == 0);
	CHECK_EQ(sv_query_state(p.qp[0]), IBV_QPS_RTS);
	sv_pair_destroy(&p);

	sv_step("teardown");
	sv_free_mr(mr_a);
	sv_free_mr(mr_b);
	sv_close(&dev);
	sv_pass();
	return 0;
}
