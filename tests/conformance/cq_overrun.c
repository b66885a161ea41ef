/*
 * cq_overrun: a CQ that receives more completions than it can hold.
 *
 * ibv_poll_cq(3): "In case of a CQ overrun, the async event IBV_EVENT_CQ_ERR will be triggered,
 * and the CQ cannot be used." The CQ is created with cqe = 4; cq->cqe (>= 4) is its actual
 * size. A's send queue feeds it cq->cqe + 1 signaled RDMA WRITEs while nobody polls. Expected:
 * - IBV_EVENT_CQ_ERR on ctx->async_fd with element.cq = that CQ;
 * - the QP feeding it goes to the error state with its own IBV_EVENT_QP_FATAL, and
 *   ibv_query_qp reports IBV_QPS_ERR.
 * Every event is acked before anything is destroyed.
 */
#include "common.h"

int main(void)
{
	sv_init("cq_overrun");
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);

	sv_step("a small send CQ for A");
	struct ibv_cq *small = sv_create_cq(&dev, 4, NULL, NULL);
	int size = small->cqe;
	printf("requested 4 CQEs, cq->cqe = %d\n", size);
	CHECKF(size + 4 <= dev.dev_attr.max_qp_wr, "cq->cqe %d too large for this test", size);
	cfg.max_send_wr = (uint32_t)size + 4;
	struct ibv_cq *a_rcq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *b_cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_qp *qa = sv_create_qp(&dev, &cfg, small, a_rcq, NULL, NULL);
	cfg.max_send_wr = 32;
	struct ibv_qp *qb = sv_create_qp(&dev, &cfg, b_cq, b_cq, NULL, NULL);
	sv_connect(&dev, qa, qb, &cfg);
	struct ibv_mr *mr_a = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *mr_b = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);

	sv_step("async fd is quiet before the overrun");
	CHECK(!sv_fd_readable(dev.ctx->async_fd, 0));

	sv_step("post cq->cqe + 1 = %d signaled RDMA WRITEs without polling", size + 1);
	int n = size + 1;
	struct ibv_send_wr *wr = calloc((size_t)n, sizeof(*wr));
	struct ibv_sge *sge = calloc((size_t)n, sizeof(*sge));
	CHECK(wr && sge);
	for (int i = 0; i < n; i++) {
		sv_wr_init(&wr[i], &sge[i], (uint64_t)i, IBV_WR_RDMA_WRITE, mr_a, 8 * (size_t)i % 4096,
			   8, IBV_SEND_SIGNALED);
		wr[i].wr.rdma.remote_addr = sv_addr(mr_b, 8 * (size_t)i % 4096);
		wr[i].wr.rdma.rkey = mr_b->rkey;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	CHECK_OK(ibv_post_send(qa, wr, &bad));

	sv_step("IBV_EVENT_CQ_ERR for the CQ and IBV_EVENT_QP_FATAL for A, in any order");
	int cq_err = 0, qp_fatal = 0;
	long long deadline = sv_now_ms() + SV_WAIT_MS;
	while (!(cq_err && qp_fatal)) {
		int left = (int)(deadline - sv_now_ms());
		struct ibv_async_event ev;
		CHECKF(left > 0 && sv_wait_async(dev.ctx, left, &ev),
		       "missing async event(s): CQ_ERR %s, QP_FATAL %s", cq_err ? "seen" : "missing",
		       qp_fatal ? "seen" : "missing");
		void *el = sv_async_element(&ev);
		printf("   async event %s for %p\n", sv_event_name(ev.event_type), el);
		if (ev.event_type == IBV_EVENT_CQ_ERR) {
			CHECKF(el == small, "CQ_ERR for %p, expected the overrun CQ %p", el,
			       (void *)small);
			cq_err++;
		} else if (ev.event_type == IBV_EVENT_QP_FATAL) {
			CHECKF(el == qa, "QP_FATAL for %p, expected A %p", el, (void *)qa);
			qp_fatal++;
		} else {
			CHECKF(0, "unexpected async event %s", sv_event_name(ev.event_type));
		}
		ibv_ack_async_event(&ev);
	}
	CHECK_EQ(cq_err, 1);
	CHECK_EQ(qp_fatal, 1);

	sv_step("A is in the error state; B is not affected");
	CHECK_EQ(sv_query_state(qa), IBV_QPS_ERR);
	CHECK_EQ(sv_query_state(qb), IBV_QPS_RTS);

	sv_step("teardown");
	CHECK_OK(ibv_destroy_qp(qa));
	CHECK_OK(ibv_destroy_qp(qb));
	CHECK_OK(ibv_destroy_cq(small));
	CHECK_OK(ibv_destroy_cq(a_rcq));
	CHECK_OK(ibv_destroy_cq(b_cq));
	free(wr);
	free(sge);
	sv_free_mr(mr_a);
	sv_free_mr(mr_b);
	sv_close(&dev);
	sv_pass();
	return 0;
}
