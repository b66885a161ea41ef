/*
 * cq_ex_api: the extended-CQ verbs in one process.
 * - ibv_query_device_ex reports completion timestamps (mask, hca_core_clock) and CQ
 *   moderation's limits (ibv_modify_cq checks them); ibv_query_rt_values_ex's raw
 *   clock moves forward;
 * - ibv_create_cq_ex accepts every wc_flag a software device can fill and both create flags,
 *   refuses CVLAN (EOPNOTSUPP; TM_INFO and FLOW_TAG are accepted, for tag matching and raw
 *   packet QPs' flow tags), bad
 *   sizes, vectors and masks (EINVAL);
 * - an extended CQ overruns like any CQ (CQ_ERR, its QP to ERR, start_poll then fails where
 *   ibv_poll_cq returns -1), unless created with IGNORE_OVERRUN (completions beyond its size
 *   are lost, nothing else happens, it keeps working);
 * - a SINGLE_THREADED CQ polls, and ibv_resize_cq keeps the completions' timestamps;
 * - ibv_create_srq_ex makes a basic SRQ that receives; XRC: EOPNOTSUPP; a TM SRQ without
 *   its tm_cap: EINVAL.
 */
#include "common.h"

static struct sv_dev dev;

static struct ibv_cq_ex *create_ex(uint32_t cqe, uint64_t wc_flags, uint32_t mask, uint32_t flags)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = cqe, .wc_flags = wc_flags, .comp_mask = mask, .flags = flags,
	};
	return ibv_create_cq_ex(dev.ctx, &attr);
}

static void expect_create_fails(uint32_t cqe, uint64_t wc_flags, uint32_t mask, uint32_t flags,
				uint32_t comp_vector, int err, const char *what)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = cqe, .comp_vector = comp_vector, .wc_flags = wc_flags,
		.comp_mask = mask, .flags = flags,
	};
	errno = 0;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(dev.ctx, &attr);
	CHECKF(cq == NULL && errno == err, "%s: got %p, errno %d, expected errno %d", what,
	       (void *)cq, errno, err);
}

/* n signaled RDMA WRITEs of 8 bytes from qa into mr_b. */
static void post_writes(struct ibv_qp *qa, struct ibv_mr *mr_a, struct ibv_mr *mr_b, int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr wr, *bad = NULL;
		struct ibv_sge sge;
		sv_wr_init(&wr, &sge, (uint64_t)i, IBV_WR_RDMA_WRITE, mr_a, 8 * (size_t)i % 4096, 8,
			   IBV_SEND_SIGNALED);
		wr.wr.rdma.remote_addr = sv_addr(mr_b, 8 * (size_t)i % 4096);
		wr.wr.rdma.rkey = mr_b->rkey;
		CHECK_OK(ibv_post_send(qa, &wr, &bad));
	}
}

/* Polls up to max completions with the poll API (one pass after the first found);
 * returns how many, and the last start_poll's result in *last_rc. */
static int ex_drain(struct ibv_cq_ex *cq, int max, uint64_t *ts, int *last_rc)
{
	int got = 0;
	long long deadline = sv_now_ms() + SV_WAIT_MS;
	for (;;) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(cq, &attr);
		*last_rc = rc;
		if (rc == ENOENT && got == 0 && sv_now_ms() < deadline)
			continue;
		if (rc != 0)
			return got;
		do {
			CHECK_EQ(cq->status, IBV_WC_SUCCESS);
			if (ts)
				ts[got] = ibv_wc_read_completion_ts(cq);
			got++;
		} while (got < max && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
		if (got == max)
			return got;
	}
}

/* A pair whose A sends into `scq`; B has its own CQ. */
struct rig {
	struct ibv_cq *a_rcq, *b_cq;
	struct ibv_qp *qa, *qb;
	struct ibv_mr *mr_a, *mr_b;
};
static void rig_open(struct rig *r, struct ibv_cq *scq, uint32_t max_send_wr)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_send_wr = max_send_wr;
	r->a_rcq = sv_create_cq(&dev, 16, NULL, NULL);
	r->b_cq = sv_create_cq(&dev, 16, NULL, NULL);
	r->qa = sv_create_qp(&dev, &cfg, scq, r->a_rcq, NULL, NULL);
	cfg.max_send_wr = 32;
	r->qb = sv_create_qp(&dev, &cfg, r->b_cq, r->b_cq, NULL, NULL);
	sv_connect(&dev, r->qa, r->qb, &cfg);
	r->mr_a = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	r->mr_b = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
}
static void rig_close(struct rig *r)
{
	CHECK_OK(ibv_destroy_qp(r->qa));
	CHECK_OK(ibv_destroy_qp(r->qb));
	sv_free_mr(r->mr_a);
	sv_free_mr(r->mr_b);
	CHECK_OK(ibv_destroy_cq(r->a_rcq));
	CHECK_OK(ibv_destroy_cq(r->b_cq));
}

int main(void)
{
	sv_init("cq_ex_api");
	sv_open(&dev);

	sv_step("ibv_query_device_ex: timestamps, their clock, CQ moderation's limits (mlx5's)");
	struct ibv_device_attr_ex ax;
	CHECK_OK(ibv_query_device_ex(dev.ctx, NULL, &ax));
	CHECK(ax.completion_timestamp_mask != 0);
	CHECK(ax.hca_core_clock != 0);
	CHECK_EQ(ax.cq_mod_caps.max_cq_count, 0xffff);
	CHECK_EQ(ax.cq_mod_caps.max_cq_period, 0xfff);
	printf("completion_timestamp_mask 0x%llx, hca_core_clock %llu kHz\n",
	       (unsigned long long)ax.completion_timestamp_mask,
	       (unsigned long long)ax.hca_core_clock);

	sv_step("ibv_query_rt_values_ex: the raw clock moves forward");
	struct ibv_values_ex v1 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK }, v2 = v1;
	CHECK_OK(ibv_query_rt_values_ex(dev.ctx, &v1));
	sv_sleep_ms(2);
	CHECK_OK(ibv_query_rt_values_ex(dev.ctx, &v2));
	CHECK_EQ(v1.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
	uint64_t c1 = (uint64_t)v1.raw_clock.tv_sec * 1000000000u + (uint64_t)v1.raw_clock.tv_nsec;
	uint64_t c2 = (uint64_t)v2.raw_clock.tv_sec * 1000000000u + (uint64_t)v2.raw_clock.tv_nsec;
	CHECKF(c2 > c1, "raw clock %llu then %llu", (unsigned long long)c1, (unsigned long long)c2);

	sv_step("ibv_create_cq_ex: what a software device can fill");
	const uint64_t ok_flags[] = {
		IBV_WC_EX_WITH_BYTE_LEN, IBV_WC_EX_WITH_IMM, IBV_WC_EX_WITH_QP_NUM,
		IBV_WC_EX_WITH_SRC_QP, IBV_WC_EX_WITH_SLID, IBV_WC_EX_WITH_SL,
		IBV_WC_EX_WITH_DLID_PATH_BITS, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
		IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, IBV_WC_STANDARD_FLAGS, 0,
	};
	for (size_t i = 0; i < sizeof(ok_flags) / sizeof(ok_flags[0]); i++) {
		struct ibv_cq_ex *cq = create_ex(10, ok_flags[i], 0, 0);
		CHECKF(cq != NULL, "wc_flags 0x%llx: errno %d", (unsigned long long)ok_flags[i], errno);
		CHECK(ibv_cq_ex_to_cq(cq)->cqe >= 10);
		CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)));
	}
	const uint32_t ok_create[] = { IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
				       IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN };
	for (size_t i = 0; i < 2; i++) {
		struct ibv_cq_ex *cq = create_ex(10, 0, IBV_CQ_INIT_ATTR_MASK_FLAGS, ok_create[i]);
		CHECK(cq != NULL);
		CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)));
	}
	expect_create_fails(10, IBV_WC_EX_WITH_CVLAN, 0, 0, 0, EOPNOTSUPP, "CVLAN");
	struct ibv_cq_ex *tm_cq = create_ex(10, IBV_WC_EX_WITH_TM_INFO, 0, 0);
	CHECK(tm_cq != NULL); /* tag matching (twoproc_tag_matching) */
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(tm_cq)));
	struct ibv_cq_ex *tag_cq = create_ex(10, IBV_WC_EX_WITH_FLOW_TAG, 0, 0);
	CHECK(tag_cq != NULL); /* raw packet QPs' flow tags (raw_packet) */
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(tag_cq)));
	expect_create_fails(10, 1ull << 40, 0, 0, 0, EOPNOTSUPP, "an unknown wc_flag");
	expect_create_fails(10, 0, IBV_CQ_INIT_ATTR_MASK_FLAGS, 1u << 7, 0, EOPNOTSUPP,
			    "an unknown create flag");
	expect_create_fails(10, 0, 1u << 5, 0, 0, EINVAL, "an unknown comp_mask bit");
	expect_create_fails(0, 0, 0, 0, 0, EINVAL, "cqe 0");
	expect_create_fails((uint32_t)dev.dev_attr.max_cqe + 1, 0, 0, 0, 0, EINVAL, "max_cqe + 1");
	expect_create_fails(10, 0, 0, 0, (uint32_t)dev.ctx->num_comp_vectors, EINVAL,
			    "comp_vector = num_comp_vectors");

	sv_step("ibv_modify_cq: moderation within cq_mod_caps; bad masks and periods EINVAL");
	struct ibv_cq_ex *plain = create_ex(10, 0, 0, 0);
	CHECK(plain != NULL);
	struct ibv_cq *pc = ibv_cq_ex_to_cq(plain);
	struct ibv_modify_cq_attr mod = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					  .moderate = { .cq_count = 4, .cq_period = 10 } };
	CHECK_OK(ibv_modify_cq(pc, &mod));
	mod.moderate.cq_count = ax.cq_mod_caps.max_cq_count;
	mod.moderate.cq_period = ax.cq_mod_caps.max_cq_period;
	CHECK_OK(ibv_modify_cq(pc, &mod));
	mod.moderate.cq_period = ax.cq_mod_caps.max_cq_period + 1;
	CHECK_ERR(ibv_modify_cq(pc, &mod), EINVAL);
	mod.moderate.cq_count = 0;
	mod.moderate.cq_period = 0;
	CHECK_OK(ibv_modify_cq(pc, &mod)); /* no moderation */
	mod.attr_mask = 0;
	CHECK_ERR(ibv_modify_cq(pc, &mod), EINVAL);
	mod.attr_mask = IBV_CQ_ATTR_MODERATE | IBV_CQ_ATTR_RESERVED;
	CHECK_ERR(ibv_modify_cq(pc, &mod), EINVAL);
	CHECK_OK(ibv_destroy_cq(pc));

	sv_step("an extended CQ overruns like any CQ");
	struct ibv_cq_ex *small = create_ex(4, IBV_WC_STANDARD_FLAGS, 0, 0);
	CHECK(small != NULL);
	int size = ibv_cq_ex_to_cq(small)->cqe;
	struct rig r;
	rig_open(&r, ibv_cq_ex_to_cq(small), (uint32_t)size + 4);
	post_writes(r.qa, r.mr_a, r.mr_b, size + 1);
	sv_expect_async(dev.ctx, IBV_EVENT_CQ_ERR, ibv_cq_ex_to_cq(small));
	CHECK_EQ(sv_query_state(r.qa), IBV_QPS_ERR);
	int rc;
	CHECK_EQ(ex_drain(small, size + 1, NULL, &rc), size);
	CHECKF(rc != 0 && rc != ENOENT, "start_poll on an overrun, empty CQ returned %d", rc);
	struct ibv_wc wc;
	CHECK_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(small), 1, &wc), -1);
	sv_drain_async(dev.ctx, 0);
	rig_close(&r);
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(small)));

	sv_step("IGNORE_OVERRUN: the extra completion is lost, nothing else happens");
	small = create_ex(4, 0, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN);
	CHECK(small != NULL);
	size = ibv_cq_ex_to_cq(small)->cqe;
	rig_open(&r, ibv_cq_ex_to_cq(small), (uint32_t)size + 4);
	post_writes(r.qa, r.mr_a, r.mr_b, size + 1);
	CHECK_EQ(ex_drain(small, size + 1, NULL, &rc), size);
	CHECK_EQ(rc, ENOENT);
	CHECK_EQ(sv_query_state(r.qa), IBV_QPS_RTS);
	CHECK(!sv_fd_readable(dev.ctx->async_fd, SV_QUIET_MS));
	post_writes(r.qa, r.mr_a, r.mr_b, 1);
	CHECK_EQ(ex_drain(small, 1, NULL, &rc), 1);
	rig_close(&r);
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(small)));

	sv_step("SINGLE_THREADED polls; ibv_resize_cq keeps the timestamps, in order");
	struct ibv_cq_ex *st = create_ex(8, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
					 IBV_CQ_INIT_ATTR_MASK_FLAGS,
					 IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
	CHECK(st != NULL);
	rig_open(&r, ibv_cq_ex_to_cq(st), 32);
	CHECK_OK(ibv_query_rt_values_ex(dev.ctx, &v1));
	post_writes(r.qa, r.mr_a, r.mr_b, 4);
	CHECK_OK(ibv_resize_cq(ibv_cq_ex_to_cq(st), 30));
	uint64_t ts[4];
	CHECK_EQ(ex_drain(st, 4, ts, &rc), 4);
	CHECK_OK(ibv_query_rt_values_ex(dev.ctx, &v2));
	c1 = (uint64_t)v1.raw_clock.tv_nsec;
	c2 = (uint64_t)v2.raw_clock.tv_nsec;
	for (int i = 0; i < 4; i++) {
		CHECKF(c1 <= ts[i] && ts[i] <= c2, "timestamp %d: %llu outside [%llu, %llu]", i,
		       (unsigned long long)ts[i], (unsigned long long)c1, (unsigned long long)c2);
		CHECK(i == 0 || ts[i] >= ts[i - 1]);
	}
	rig_close(&r);
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(st)));

	sv_step("ibv_create_srq_ex: a basic SRQ through the extended call");
	struct ibv_cq *srq_cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_srq_init_attr_ex sx = {
		.attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_BASIC,
		.pd = dev.pd,
		.cq = srq_cq,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(dev.ctx, &sx);
	CHECK(srq != NULL);
	CHECK(sx.attr.max_wr >= 8);
	struct ibv_srq_init_attr_ex bad = sx;
	bad.srq_type = IBV_SRQT_XRC; /* XRC SRQs exist (docs/xrc.md): not without an XRC domain */
	errno = 0;
	CHECK(ibv_create_srq_ex(dev.ctx, &bad) == NULL && errno == EINVAL);
	bad = sx;
	bad.srq_type = IBV_SRQT_TM; /* without IBV_SRQ_INIT_ATTR_TM (twoproc_tag_matching) */
	errno = 0;
	CHECK(ibv_create_srq_ex(dev.ctx, &bad) == NULL && errno == EINVAL);
	bad = sx;
	bad.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ; /* no PD */
	errno = 0;
	CHECK(ibv_create_srq_ex(dev.ctx, &bad) == NULL && errno == EINVAL);

	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_qp *qa = sv_create_qp(&dev, &cfg, srq_cq, srq_cq, NULL, NULL);
	struct ibv_qp *qb = sv_create_qp(&dev, &cfg, srq_cq, srq_cq, srq, NULL);
	sv_connect(&dev, qa, qb, &cfg);
	struct ibv_mr *m = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	CHECK_OK(sv_post_srq_recv(srq, 77, m, 2048, 64));
	CHECK_OK(sv_post_send(qa, 78, m, 0, 32, IBV_SEND_SIGNALED));
	struct ibv_wc got[2];
	CHECK_EQ(sv_poll(srq_cq, 2, got, SV_WAIT_MS), 2);
	for (int i = 0; i < 2; i++) {
		CHECK_STATUS(got[i], IBV_WC_SUCCESS);
		if (got[i].opcode == IBV_WC_RECV) {
			CHECK_EQ(got[i].wr_id, 77);
			CHECK_EQ(got[i].byte_len, 32);
			CHECK_EQ(got[i].qp_num, qb->qp_num);
		}
	}
	CHECK_OK(ibv_destroy_qp(qa));
	CHECK_OK(ibv_destroy_qp(qb));
	CHECK_OK(ibv_destroy_srq(srq));
	sv_free_mr(m);
	CHECK_OK(ibv_destroy_cq(srq_cq));

	sv_step("teardown");
	sv_close(&dev);
	sv_pass();
	return 0;
}
