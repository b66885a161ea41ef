/*
 * Receive completions of one QP come out in the order the SENDs were posted, also when
 * consecutive SENDs from another process take different paths: a large one through our
 * agent (its completion is held back until the agent has answered the requester), the
 * next small one through our receive window, which the requester writes as soon as it has
 * that answer. The peer alternates 64 KiB and 64-byte SENDs, each after the previous one
 * completed; we poll all the time and check every completion's wr_id and length.
 */
#include "common.h"

#define ROUNDS 200
#define LARGE (64 * 1024)
#define SMALL 64

static int sock;

static uint32_t length_of(int i) { return i % 2 ? SMALL : LARGE; }

static void requester(int s)
{
	sock = s;
	struct sv_one_qp r;
	sv_requester_open(&r, sock);
	struct ibv_mr *big = sv_alloc_mr(r.dev.pd, LARGE, SV_ACCESS_ALL);
	CHECK_EQ(sv_hear(sock), 1);
	struct ibv_wc wc;
	for (int i = 0; i < ROUNDS; i++) {
		CHECK_OK(sv_post_send(r.qp, (uint64_t)i, big, 0, length_of(i), IBV_SEND_SIGNALED));
		sv_expect_wc(r.cq, (uint64_t)i, IBV_WC_SUCCESS, r.qp, &wc);
	}
	CHECK_EQ(sv_hear(sock), 2);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_order");
	pid_t child;
	sock = sv_fork_peer(requester, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = ROUNDS;
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, ROUNDS, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, (size_t)ROUNDS * LARGE, SV_ACCESS_ALL);
	sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), mr, 0, ROUNDS, LARGE);

	sv_step("%d SENDs alternating 64 KiB (agent) and 64 B (window), polled as they come", ROUNDS);
	sv_say(sock, 1);
	for (int i = 0; i < ROUNDS; i++) {
		struct ibv_wc wc;
		CHECKF(sv_poll(rcq, 1, &wc, SV_WAIT_MS) == 1, "receive %d did not complete", i);
		CHECKF(wc.wr_id == (uint64_t)i, "receive %d completed as #%llu: out of order", i,
		       (unsigned long long)wc.wr_id);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, length_of(i));
	}

	sv_step("teardown");
	sv_say(sock, 2);
	sv_wait_peer(child, "the peer");
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_cq(scq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
