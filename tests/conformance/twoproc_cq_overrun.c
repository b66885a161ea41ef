/*
 * A CQ overrun by SENDs from another process: they wait in our receive window until we
 * poll, but they are completions a NIC would already have written, so a CQ too small for
 * them overruns (ibv_poll_cq(3): IBV_EVENT_CQ_ERR, the CQ cannot be used) instead of
 * handing them all out. The peer sends cq->cqe + 1 small SENDs into cq->cqe + 1 posted
 * receives while we do not poll; then we poll once. Expected: IBV_EVENT_CQ_ERR for the CQ,
 * IBV_EVENT_QP_FATAL for the QP, which is in the error state.
 */
#include "common.h"

#define MSG 32

static int sock;

static void requester(int s)
{
	sock = s;
	struct sv_one_qp r;
	sv_requester_open(&r, sock);
	int count = sv_hear(sock);
	struct ibv_wc wc;
	for (int i = 0; i < count; i++) {
		CHECK_OK(sv_post_send(r.qp, (uint64_t)i, r.mr, 0, MSG, IBV_SEND_SIGNALED));
		sv_expect_wc(r.cq, (uint64_t)i, IBV_WC_SUCCESS, r.qp, &wc);
	}
	sv_say(sock, count);
	CHECK_EQ(sv_hear(sock), 0);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_cq_overrun");
	pid_t child;
	sock = sv_fork_peer(requester, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *small = sv_create_cq(&dev, 4, NULL, NULL);
	int count = small->cqe + 1;
	CHECKF(count <= 32, "cq->cqe %d too large for this test", small->cqe);
	cfg.max_recv_wr = (uint32_t)count;
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, scq, small, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), mr, 0, count, MSG);

	sv_step("the peer sends cq->cqe + 1 = %d SENDs while we do not poll", count);
	sv_say(sock, count);
	CHECK_EQ(sv_hear(sock), count);

	sv_step("one poll: IBV_EVENT_CQ_ERR for the CQ and IBV_EVENT_QP_FATAL for the QP");
	struct ibv_wc wc[64];
	(void)ibv_poll_cq(small, 64, wc); /* what it returns once the CQ overran is not defined */
	int cq_err = 0, qp_fatal = 0;
	while (!cq_err || !qp_fatal) {
		struct ibv_async_event ev;
		CHECKF(sv_wait_async(dev.ctx, SV_WAIT_MS, &ev),
		       "missing async event(s): CQ_ERR %s, QP_FATAL %s", cq_err ? "seen" : "missing",
		       qp_fatal ? "seen" : "missing");
		if (ev.event_type == IBV_EVENT_CQ_ERR) {
			CHECK(ev.element.cq == small);
			cq_err = 1;
		} else if (ev.event_type == IBV_EVENT_QP_FATAL) {
			CHECK(ev.element.qp == qp);
			qp_fatal = 1;
		} else {
			CHECKF(0, "unexpected async event %d", ev.event_type);
		}
		ibv_ack_async_event(&ev);
	}
	CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);

	sv_step("teardown");
	sv_say(sock, 0);
	sv_wait_peer(child, "the peer");
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(small));
	CHECK_OK(ibv_destroy_cq(scq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
