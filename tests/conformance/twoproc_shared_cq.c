/*
 * One CQ fed by QPs connected to peers in two other processes at once (the CQ then watches
 * its doorbell, not one window's slot). Both peers send ROUNDS small SENDs as fast as they
 * can, at the same time; we poll the one CQ. Every completion names the right QP and
 * source QP, carries its peer's payload, and each QP's receives complete in order. Then,
 * with the CQ armed, a SEND from either peer wakes a thread blocked in ibv_get_cq_event.
 */
#include "common.h"

#define ROUNDS 300
#define MSG 16

static int sock;

static void requester(int s)
{
	sock = s;
	struct sv_one_qp r;
	sv_requester_open(&r, sock);
	struct ibv_wc wc;
	for (int step; (step = sv_hear(sock)) != 0;) {
		int count = step == 1 ? ROUNDS : 1;
		for (int i = 0; i < count; i++) {
			uint8_t *p = sv_ptr(r.mr, 0);
			memcpy(p, &i, sizeof(i));
			memcpy(p + sizeof(i), &r.qp->qp_num, sizeof(r.qp->qp_num));
			CHECK_OK(sv_post_send(r.qp, (uint64_t)i, r.mr, 0, MSG, IBV_SEND_SIGNALED));
			sv_expect_wc(r.cq, (uint64_t)i, IBV_WC_SUCCESS, r.qp, &wc);
		}
		sv_say(sock, step);
	}
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_shared_cq");
	pid_t child[2];
	int peer_sock[2];
	for (int k = 0; k < 2; k++)
		peer_sock[k] = sv_fork_peer(requester, &child[k]);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = ROUNDS + 1;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(dev.ctx);
	CHECK(ch != NULL);
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, 2 * (ROUNDS + 1), NULL, ch);
	struct ibv_qp *qp[2];
	struct ibv_mr *mr[2];
	uint32_t peer[2];
	for (int k = 0; k < 2; k++) {
		qp[k] = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
		mr[k] = sv_alloc_mr(dev.pd, (size_t)(ROUNDS + 1) * MSG, SV_ACCESS_ALL);
		peer[k] = sv_trade_qpn(peer_sock[k], qp[k]);
		sv_connect_remote(qp[k], &dev, &cfg, peer[k], mr[k], 0, ROUNDS + 1, MSG);
	}

	sv_step("two peers send %d SENDs each, at once, into QPs that share one CQ", ROUNDS);
	for (int k = 0; k < 2; k++)
		sv_say(peer_sock[k], 1);
	int next[2] = {0, 0};
	for (int got = 0; got < 2 * ROUNDS;) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(rcq, 16, wc);
		CHECK(n >= 0);
		for (int j = 0; j < n; j++, got++) {
			int k = wc[j].qp_num == qp[1]->qp_num;
			CHECK_WC(wc[j], (uint64_t)next[k], IBV_WC_SUCCESS, qp[k]);
			CHECK_EQ(wc[j].src_qp, peer[k]);
			CHECK_EQ(wc[j].byte_len, MSG);
			int sent;
			uint32_t from;
			memcpy(&sent, sv_ptr(mr[k], (size_t)next[k] * MSG), sizeof(sent));
			memcpy(&from, sv_ptr(mr[k], (size_t)next[k] * MSG + sizeof(sent)), sizeof(from));
			CHECK_EQ(sent, next[k]);
			CHECK_EQ(from, peer[k]);
			next[k]++;
		}
	}
	for (int k = 0; k < 2; k++)
		CHECK_EQ(sv_hear(peer_sock[k]), 1);
	sv_expect_empty(rcq, "after both peers' SENDs");

	sv_step("armed: a SEND from either peer wakes ibv_get_cq_event");
	for (int k = 0; k < 2; k++) {
		CHECK_OK(ibv_req_notify_cq(rcq, 0));
		sv_say(peer_sock[k], 2);
		sv_expect_cq_event(ch, rcq);
		struct ibv_wc wc;
		sv_expect_wc(rcq, ROUNDS, IBV_WC_SUCCESS, qp[k], &wc);
		CHECK_EQ(sv_hear(peer_sock[k]), 2);
	}

	sv_step("teardown");
	for (int k = 0; k < 2; k++) {
		sv_say(peer_sock[k], 0);
		sv_wait_peer(child[k], "a peer");
		CHECK_OK(ibv_destroy_qp(qp[k]));
		sv_free_mr(mr[k]);
	}
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	sv_pass();
	return 0;
}
