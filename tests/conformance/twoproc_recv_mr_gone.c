/*
 * A receive whose memory region goes away after it was posted, with the sender in another
 * process (the receive-window path, where the target resolves a receive's buffer once, when
 * it publishes the receive to the sender). B (child) posts a receive, then deregisters its
 * MR on one QP and takes IBV_ACCESS_LOCAL_WRITE away with ibv_rereg_mr on another; A sends
 * a small SEND on each. B's receives complete with IBV_WC_LOC_PROT_ERR, its QPs go to the
 * error state, and not one byte lands in either buffer (ibv_post_recv(3): the buffer must
 * stay registered with local write access until the receive completes).
 */
#include "common.h"


#define MSG 64

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static int all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static void responder(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq[2];
	struct ibv_qp *qp[2];
	uint32_t mine[2], peer[2];
	for (int i = 0; i < 2; i++) {
		rcq[i] = sv_create_cq(&dev, 16, NULL, NULL); /* one QP each: the solo drain */
		qp[i] = sv_create_qp(&dev, &cfg, scq, rcq[i], NULL, NULL);
		mine[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, mine, peer, sizeof(mine));
	for (int i = 0; i < 2; i++)
		sv_trade_gid(sock, qp[i]); /* between hosts only */
	struct ibv_mr *keep = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *gone = sv_alloc_mr(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *re = sv_alloc_mr(dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint8_t *gone_buf = gone->addr;
	for (int i = 0; i < 2; i++) {
		CHECK_OK(sv_modify_init(qp[i], &cfg));
		CHECK_OK(sv_post_recv(qp[i], 1, keep, (size_t)i * MSG, MSG));
		CHECK_OK(sv_modify_rtr(qp[i], &dev, peer[i], &cfg));
		CHECK_OK(sv_modify_rts(qp[i], &cfg));
	}
	say(1);

	/* 1: a SEND on each QP lands: the peer now writes into our receive windows */
	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;
	for (int i = 0; i < 2; i++) {
		sv_expect_wc(rcq[i], 1, IBV_WC_SUCCESS, qp[i], &wc);
		CHECK_EQ(wc.byte_len, MSG);
		CHECK_EQ(sv_ptr(keep, (size_t)i * MSG)[0], 0xc0 + i);
	}

	/* 2: receives posted, then their MRs deregistered / without local write */
	CHECK_OK(sv_post_recv(qp[0], 2, gone, 0, MSG));
	CHECK_OK(ibv_dereg_mr(gone)); /* the buffer stays allocated: we look at it below */
	CHECK_OK(sv_post_recv(qp[1], 2, re, 0, MSG));
	CHECK_EQ(ibv_rereg_mr(re, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 0), 0);
	say(2);
	CHECK_EQ(hear(), 2);
	for (int i = 0; i < 2; i++) {
		sv_expect_wc(rcq[i], 2, IBV_WC_LOC_PROT_ERR, qp[i], &wc);
		CHECK_EQ(sv_query_state(qp[i]), IBV_QPS_ERR);
	}
	CHECKF(all_zero(gone_buf, 4096), "a SEND landed in a deregistered buffer");
	CHECKF(all_zero(re->addr, 4096), "a SEND landed in a buffer without local write access");
	say(3);

	CHECK_EQ(hear(), 4);
	for (int i = 0; i < 2; i++) {
		CHECK_OK(ibv_destroy_qp(qp[i]));
		CHECK_OK(ibv_destroy_cq(rcq[i]));
	}
	free(gone_buf);
	sv_free_mr(re);
	sv_free_mr(keep);
	CHECK_OK(ibv_destroy_cq(scq));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_recv_mr_gone");
	pid_t child;
	sock = sv_fork_peer(responder, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_qp *qp[2];
	uint32_t mine[2], peer[2];
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		mine[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, mine, peer, sizeof(mine));
	for (int i = 0; i < 2; i++)
		sv_trade_gid(sock, qp[i]); /* between hosts only */
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	for (int i = 0; i < 2; i++)
		sv_connect_remote(qp[i], &dev, &cfg, peer[i], NULL, 0, 0, 0);
	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;

	sv_step("a small SEND on each QP to another process");
	for (int i = 0; i < 2; i++) {
		memset(sv_ptr(mr, (size_t)i * MSG), 0xc0 + i, MSG);
		CHECK_OK(sv_post_send(qp[i], 10 + i, mr, (size_t)i * MSG, MSG, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, 10 + i, IBV_WC_SUCCESS, qp[i], &wc);
	}
	say(1);

	sv_step("SENDs into receives whose MR was deregistered / lost local write after posting");
	CHECK_EQ(hear(), 2);
	memset(sv_ptr(mr, 0), 0xee, MSG);
	for (int i = 0; i < 2; i++) {
		CHECK_OK(sv_post_send(qp[i], 20 + i, mr, 0, MSG, IBV_SEND_SIGNALED));
		/* The sender's own status is not the point here (the receive window has
		 * accepted the message before the target looks at the buffer). */
		CHECKF(sv_poll(cq, 1, &wc, SV_WAIT_MS) == 1, "no completion for SEND %d", 20 + i);
		CHECK_EQ(wc.wr_id, 20u + i);
	}
	say(2);
	CHECK_EQ(hear(), 3);

	sv_step("teardown");
	say(4);
	sv_wait_peer(child, "the responder");
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
