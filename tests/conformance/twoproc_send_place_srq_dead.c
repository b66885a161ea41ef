/*
 * A sender that dies between claiming an SRQ receive and committing its message
 * (docs/send-placement.md, "SRQ"): the receiver (parent) has two RC QPs on one SRQ with two
 * receives, QP 0 connected to a sender that claims the first receive for a small SEND and
 * exits before writing it (SOFTVERBS_TEST_DIE_AFTER_SRQ_CLAIM), QP 1 to a live sender.
 * When QP 0 goes to ERR (its peer is gone: IBV_EVENT_QP_FATAL after its retry budget, then
 * IBV_EVENT_QP_LAST_WQE_REACHED once it holds no SRQ receive), the claimed receive is given back and goes to the next message, in order: the live sender's
 * two SENDs land in receive 0 and then receive 1. Before, receive 0 stayed claimed for
 * good and the second SEND met RNR forever. Not between hosts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "common.h"

#define RECV_LEN 4096u
#define SEND_LEN 64u

static uint8_t pattern(unsigned msg, size_t off) { return (uint8_t)(msg * 53u + off * 3u + 1u); }

static void dying(int sock)
{
	CHECK(setenv("SOFTVERBS_TEST_DIE_AFTER_SRQ_CLAIM", "1", 1) == 0);
	struct sv_one_qp r;
	sv_one_qp_open(&r, NULL, 16, 4096);
	uint32_t peer = sv_trade_qpn(sock, r.qp);
	sv_one_qp_connect(&r, peer, 0, 0, 0);
	CHECK_EQ(sv_hear(sock), 1);
	CHECK_OK(sv_post_send(r.qp, 1, r.mr, 0, SEND_LEN, IBV_SEND_SIGNALED));
	/* Through the window this exits at the claim; anything else is a failure. */
	fprintf(stderr, "the SEND did not claim an SRQ receive through the window\n");
	_exit(3);
}

static void live(int sock)
{
	struct sv_one_qp r;
	sv_one_qp_open(&r, NULL, 16, 4096);
	uint32_t peer = sv_trade_qpn(sock, r.qp);
	sv_one_qp_connect(&r, peer, 0, 0, 0);
	CHECK_EQ(sv_hear(sock), 2);
	for (unsigned m = 0; m < 2; m++) {
		uint8_t *p = sv_ptr(r.mr, m * SEND_LEN);
		for (size_t i = 0; i < SEND_LEN; i++)
			p[i] = pattern(m, i);
		CHECK_OK(sv_post_send(r.qp, m, r.mr, m * SEND_LEN, SEND_LEN, IBV_SEND_SIGNALED));
		struct ibv_wc wc;
		sv_expect_wc(r.cq, m, IBV_WC_SUCCESS, r.qp, &wc);
	}
	CHECK_EQ(sv_hear(sock), 3);
	sv_one_qp_close(&r);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_send_place_srq_dead");
	pid_t child[2];
	int sock[2];
	sock[0] = sv_fork_peer(dying, &child[0]);
	sock[1] = sv_fork_peer(live, &child[1]);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.timeout = 8; /* ~1 ms: the dead peer's QP goes to ERR within a few */
	cfg.retry_cnt = 1;
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(dev.pd, &sa);
	CHECK(srq);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 2 * RECV_LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *qp[2];
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, srq, NULL);
		uint32_t peer = sv_trade_qpn(sock[i], qp[i]);
		sv_connect_remote(qp[i], &dev, &cfg, peer, NULL, 0, 0, 0);
	}
	for (unsigned s = 0; s < 2; s++)
		CHECK_OK(sv_post_srq_recv(srq, 100 + s, mr, (size_t)s * RECV_LEN, RECV_LEN));

	sv_step("the first sender claims receive 100 and dies before its commit");
	sv_say(sock[0], 1);
	int status = 0;
	CHECK(waitpid(child[0], &status, 0) == child[0]);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the dying sender: status %#x", status);

	sv_step("its QP goes to ERR and takes no more SRQ receives");
	/* Last WQE Reached: the QP will consume no more of the SRQ's receives, so the one its
	 * peer claimed is back by then. */
	int fatal = 0, last = 0;
	struct ibv_async_event ev;
	while (!last && sv_wait_async(dev.ctx, 5000, &ev)) {
		if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qp[0])
			fatal = 1;
		if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp[0])
			last = 1;
		ibv_ack_async_event(&ev);
	}
	CHECK(fatal && last);

	sv_step("the live sender's two SENDs take receive 100, then 101");
	sv_say(sock[1], 2);
	for (unsigned m = 0; m < 2; m++) {
		struct ibv_wc wc;
		sv_poll_one(cq, &wc);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_OPCODE(wc, IBV_WC_RECV);
		CHECK_EQ(wc.qp_num, qp[1]->qp_num);
		CHECK_EQ(wc.wr_id, 100 + m);
		CHECK_EQ(wc.byte_len, SEND_LEN);
		const uint8_t *p = sv_ptr(mr, (size_t)m * RECV_LEN);
		for (size_t i = 0; i < SEND_LEN; i++)
			CHECKF(p[i] == pattern(m, i), "message %u byte %zu", m, i);
	}
	sv_expect_empty(cq, "nothing else");

	sv_step("teardown");
	sv_say(sock[1], 3);
	sv_wait_peer(child[1], "the live sender");
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_OK(ibv_destroy_srq(srq));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
