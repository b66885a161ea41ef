/*
 * A requester's first SEND reaches a peer QP that is still in INIT (dropped there, as a QP
 * before RTR drops everything) and nothing else happens: only the requester's local ACK
 * timeout can send it again, and once the peer comes up to RTR/RTS, ~50 ms later, the SEND
 * must complete. Each round the requester first has another QP fail (RETRY_EXC_ERR against
 * the same peer QP in INIT) and destroys it: between hosts that was its last RoCE QP, so
 * its port closes with the parked socket's recheck timer still pending and opens again for
 * the next QP (a reopened port whose timerfd was never set retransmitted nothing at all).
 * The peer (on host B between hosts) is the requester; we are the responder.
 */
#include "common.h"

#define ROUNDS 3
#define LEN 64

static void requester(int sock)
{
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct sv_pair_cfg fast, normal;
	sv_pair_cfg_init(&normal);  /* timeout 14: 67 ms, retry_cnt 7 */
	sv_pair_cfg_init(&fast);
	fast.timeout = 8;  /* 1 ms */
	fast.retry_cnt = 1;
	struct ibv_wc wc;
	for (int round = 0; round < ROUNDS; round++) {
		/* A QP that fails: its SENDs go to a QP in INIT, unanswered. */
		struct ibv_qp *doomed = sv_create_qp(&dev, &fast, cq, cq, NULL, NULL);
		sv_connect_remote(doomed, &dev, &fast, sv_trade_qpn(sock, doomed), NULL, 0, 0, 0);
		CHECK_OK(sv_post_send(doomed, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, 1, IBV_WC_RETRY_EXC_ERR, doomed, &wc);
		CHECK_OK(ibv_destroy_qp(doomed));

		/* The next QP's first SEND goes while the peer's QP is still in INIT. */
		struct ibv_qp *qp = sv_create_qp(&dev, &normal, cq, cq, NULL, NULL);
		sv_connect_remote(qp, &dev, &normal, sv_trade_qpn(sock, qp), NULL, 0, 0, 0);
		CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
		sv_say(sock, 1);
		sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp, &wc);
		CHECK_EQ(sv_hear(sock), 2);
		CHECK_OK(ibv_destroy_qp(qp));
	}
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_rexmit");
	pid_t child;
	int sock = sv_fork_peer(requester, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	for (int round = 0; round < ROUNDS; round++) {
		sv_step("round %d: the peer's QP fails against ours in INIT", round);
		struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		CHECK_OK(sv_modify_init(qp, &cfg));
		CHECK_OK(sv_post_recv(qp, 10 + (uint64_t)round, mr, 0, 4096));
		sv_trade_qpn(sock, qp);  /* for the QP that fails */

		sv_step("round %d: its next QP's first SEND is dropped here; RTR/RTS 50 ms later", round);
		uint32_t peer_qpn = sv_trade_qpn(sock, qp);
		CHECK_EQ(sv_hear(sock), 1);
		sv_sleep_ms(50);
		CHECK_OK(sv_modify_rtr(qp, &dev, peer_qpn, &cfg));
		CHECK_OK(sv_modify_rts(qp, &cfg));
		struct ibv_wc wc;
		sv_expect_wc(cq, 10 + (uint64_t)round, IBV_WC_SUCCESS, qp, &wc);
		CHECK_EQ(wc.byte_len, LEN);
		sv_say(sock, 2);
		CHECK_OK(ibv_destroy_qp(qp));
	}

	sv_step("teardown");
	sv_wait_peer(child, "the requester");
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
