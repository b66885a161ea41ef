/*
 * async_fd: the context's async event fd and the affiliated QP events.
 *
 * - With O_NONBLOCK (fcntl), ibv_get_async_event on an empty queue returns -1/EAGAIN and poll()
 *   reports the fd not readable; an event makes it readable.
 * - IBV_EVENT_COMM_EST: a message arrives while the receiving QP is still in RTR.
 * - ibv_destroy_qp waits until the QP's retrieved async events are acked (a thread destroys
 *   while the main thread holds the COMM_EST event; checked by ordering flags).
 * - IBV_EVENT_SQ_DRAINED: RTS -> SQD with en_sqd_async_notify = 1.
 * - IBV_EVENT_QP_LAST_WQE_REACHED: a QP attached to an SRQ is moved to the error state.
 * - An event that was queued but never retrieved does not hold ibv_destroy_qp, and vanishes
 *   with its QP: the async fd stops being readable.
 */
#include "common.h"

static struct sv_dev dev;

static void expect_no_async(const char *why)
{
	struct ibv_async_event ev;
	if (sv_wait_async(dev.ctx, SV_QUIET_MS, &ev)) {
		void *el = sv_async_element(&ev);
		ibv_ack_async_event(&ev);
		CHECKF(0, "unexpected async event %s for %p (%s)", sv_event_name(ev.event_type), el,
		       why);
	}
}

static void ack_async(void *ev)
{
	ibv_ack_async_event(ev);
}

static void test_nonblocking_and_comm_est(void)
{
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct sv_pair p;
	sv_pair_create(&dev, &cfg, &p);
	struct ibv_qp *qa = p.qp[0], *qb = p.qp[1];

	sv_step("O_NONBLOCK: empty async queue gives -1/EAGAIN and is not readable");
	sv_set_nonblock(dev.ctx->async_fd, 1);
	struct ibv_async_event ev;
	errno = 0;
	CHECK_EQ(ibv_get_async_event(dev.ctx, &ev), -1);
	CHECK_EQ(errno, EAGAIN);
	CHECK(!sv_fd_readable(dev.ctx->async_fd, 0));

	sv_step("connect A fully, leave B in RTR");
	CHECK_OK(sv_modify_init(qa, &cfg));
	CHECK_OK(sv_modify_init(qb, &cfg));
	CHECK_OK(sv_modify_rtr(qa, &dev, qb->qp_num, &cfg));
	CHECK_OK(sv_modify_rtr(qb, &dev, qa->qp_num, &cfg));
	CHECK_OK(sv_modify_rts(qa, &cfg));
	CHECK(!sv_fd_readable(dev.ctx->async_fd, SV_QUIET_MS));

	sv_step("a message arriving at B in RTR raises COMM_EST for B");
	CHECK_OK(sv_post_recv(qb, 1, mr, 1024, 1024));
	CHECK_OK(sv_post_send(qa, 2, mr, 0, 64, IBV_SEND_SIGNALED));
	sv_expect_wc(p.rcq[1], 1, IBV_WC_SUCCESS, qb, NULL);
	sv_expect_wc(p.scq[0], 2, IBV_WC_SUCCESS, qa, NULL);
	CHECKF(sv_fd_readable(dev.ctx->async_fd, SV_WAIT_MS), "async fd not readable");
	struct ibv_async_event held; /* kept unacked until B's destroy is under way */
	memset(&held, 0, sizeof(held));
	CHECK_EQ(ibv_get_async_event(dev.ctx, &held), 0);
	CHECKF(held.event_type == IBV_EVENT_COMM_EST, "got %s, expected COMM_EST",
	       sv_event_name(held.event_type));
	CHECK(held.element.qp == qb);
	CHECK(!sv_fd_readable(dev.ctx->async_fd, 0));
	errno = 0;
	CHECK_EQ(ibv_get_async_event(dev.ctx, &ev), -1);
	CHECK_EQ(errno, EAGAIN);
	sv_set_nonblock(dev.ctx->async_fd, 0);

	sv_step("ibv_destroy_qp(B) waits for the COMM_EST event to be acked");
	sv_expect_destroy_waits(sv_destroy_qp_fn, qb, ack_async, &held, "ibv_destroy_qp");
	p.qp[1] = NULL;

	sv_pair_destroy(&p);
	sv_free_mr(mr);
}

static void test_sq_drained(void)
{
	sv_step("RTS -> SQD with en_sqd_async_notify raises SQ_DRAINED");
	struct sv_pair p;
	sv_pair_open(&dev, NULL, &p);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	/* Some traffic first, so the send queue has done something. */
	CHECK_OK(sv_post_rdma(p.qp[0], 1, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED,
			      sv_addr(mr, 2048), mr->rkey));
	sv_expect_wc(p.scq[0], 1, IBV_WC_SUCCESS, p.qp[0], NULL);
	expect_no_async("before SQD");
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_SQD;
	attr.en_sqd_async_notify = 1;
	CHECK_OK(ibv_modify_qp(p.qp[0], &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY));
	sv_expect_async(dev.ctx, IBV_EVENT_SQ_DRAINED, p.qp[0]);
	CHECK_EQ(sv_query_state(p.qp[0]), IBV_QPS_SQD);

	sv_step("SQD -> RTS, and the QP sends again");
	CHECK_OK(sv_modify_state(p.qp[0], IBV_QPS_RTS));
	CHECK_OK(sv_post_rdma(p.qp[0], 2, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED,
			      sv_addr(mr, 2048), mr->rkey));
	sv_expect_wc(p.scq[0], 2, IBV_WC_SUCCESS, p.qp[0], NULL);
	sv_free_mr(mr);
	sv_pair_destroy(&p);
}

static void test_last_wqe_reached(void)
{
	sv_step("a QP attached to an SRQ moved to ERR raises QP_LAST_WQE_REACHED");
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.use_srq = 1;
	struct sv_pair p;
	sv_pair_open(&dev, &cfg, &p);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	CHECK_OK(sv_post_srq_recv(p.srq, 1, mr, 0, 1024));
	CHECK_OK(sv_post_srq_recv(p.srq, 2, mr, 1024, 1024));
	/* One message through the SRQ first. */
	CHECK_OK(sv_post_send(p.qp[0], 3, mr, 2048, 64, IBV_SEND_SIGNALED));
	sv_expect_wc(p.scq[0], 3, IBV_WC_SUCCESS, p.qp[0], NULL);
	sv_expect_wc(p.rcq[1], 1, IBV_WC_SUCCESS, p.qp[1], NULL);
	expect_no_async("before moving B to ERR");
	CHECK_OK(sv_modify_state(p.qp[1], IBV_QPS_ERR));
	sv_expect_async(dev.ctx, IBV_EVENT_QP_LAST_WQE_REACHED, p.qp[1]);
	/* The SRQ's WQEs belong to the SRQ, not to B: receive 2 is not flushed. */
	sv_expect_empty(p.rcq[1], "SRQ receives are not flushed with the QP");
	sv_free_mr(mr);
	sv_pair_destroy(&p);
}

static void test_unretrieved_event_vanishes(void)
{
	sv_step("an async event never retrieved does not block ibv_destroy_qp and vanishes");
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.use_srq = 1;
	struct sv_pair p;
	sv_pair_open(&dev, &cfg, &p);
	CHECK(!sv_fd_readable(dev.ctx->async_fd, 0));
	CHECK_OK(sv_modify_state(p.qp[1], IBV_QPS_ERR)); /* queues QP_LAST_WQE_REACHED for B */
	CHECKF(sv_fd_readable(dev.ctx->async_fd, SV_WAIT_MS), "no async event for B");
	CHECK_OK(ibv_destroy_qp(p.qp[1])); /* the watchdog fails the test if this blocks */
	p.qp[1] = NULL;
	CHECKF(!sv_fd_readable(dev.ctx->async_fd, 0),
	       "async fd still readable after the QP of its only event was destroyed");
	sv_pair_destroy(&p);
}

int main(void)
{
	sv_init("async_fd");
	sv_open(&dev);
	test_nonblocking_and_comm_est();
	test_sq_drained();
	test_last_wqe_reached();
	test_unretrieved_event_vanishes();
	sv_step("teardown");
	expect_no_async("at the end");
	sv_close(&dev);
	sv_pass();
	return 0;
}
