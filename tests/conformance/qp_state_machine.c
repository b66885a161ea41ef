/*
 * qp_state_machine: RC QP creation, transitions and queries.
 *
 * - ibv_create_qp writes the actual caps back (>= requested); ibv_query_qp reports the same.
 * - Each transition with a required attribute missing (the table in ibv_modify_qp(3)), with an
 *   attribute that transition does not allow, or to a state that cannot be reached from the
 *   current one, fails with EINVAL and changes nothing (ibv_modify_qp(3): "none of the
 *   attributes will be modified (including the QP state)").
 * - Valid: RESET -> INIT -> RTR -> RTS -> SQD -> RTS, RTS -> RTS with an optional attribute,
 *   any state -> ERR, ERR -> RESET, RTS -> RESET; a QP reset and connected again works.
 * - ibv_query_qp returns the state and every attribute that was set; qp->state follows.
 */
#include "common.h"

#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK                                                                         \
	(IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |  \
	 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK                                                                         \
	(IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |           \
	 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)

static struct sv_dev dev;
static struct sv_pair_cfg cfg;
static struct ibv_qp *qa, *qb;

/* One attribute set holding the values of every transition; the mask picks what is used. */
static void full_attr(struct ibv_qp_attr *a, enum ibv_qp_state state)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = state;
	a->pkey_index = 0;
	a->port_num = 1;
	a->qp_access_flags = cfg.access;
	a->path_mtu = cfg.mtu;
	a->dest_qp_num = qb->qp_num;
	a->rq_psn = cfg.psn;
	a->sq_psn = cfg.psn;
	a->max_dest_rd_atomic = cfg.max_rd_atomic;
	a->max_rd_atomic = cfg.max_rd_atomic;
	a->min_rnr_timer = cfg.min_rnr_timer;
	a->timeout = cfg.timeout;
	a->retry_cnt = cfg.retry_cnt;
	a->rnr_retry = cfg.rnr_retry;
	a->ah_attr.is_global = 1;
	a->ah_attr.grh.dgid = dev.gid;
	a->ah_attr.grh.sgid_index = 0;
	a->ah_attr.grh.hop_limit = 1;
	a->ah_attr.port_num = 1;
}

static void expect_state(struct ibv_qp *qp, enum ibv_qp_state s)
{
	enum ibv_qp_state q = sv_query_state(qp);
	CHECKF(q == s, "ibv_query_qp: state %s, expected %s", sv_qp_state_name(q),
	       sv_qp_state_name(s));
	CHECKF(qp->state == s, "qp->state %s, expected %s", sv_qp_state_name(qp->state),
	       sv_qp_state_name(s));
}

static void go(enum ibv_qp_state to, int mask)
{
	struct ibv_qp_attr a;
	full_attr(&a, to);
	int r = ibv_modify_qp(qa, &a, mask);
	CHECKF(r == 0, "-> %s with mask 0x%x failed: %d (%s)", sv_qp_state_name(to), mask, r,
	       strerror(r));
	expect_state(qa, to);
}

static void refused(enum ibv_qp_state to, int mask, const char *why)
{
	enum ibv_qp_state before = sv_query_state(qa);
	struct ibv_qp_attr a;
	full_attr(&a, to);
	int r = ibv_modify_qp(qa, &a, mask);
	CHECKF(r == EINVAL, "%s -> %s (%s): returned %d (%s), expected EINVAL",
	       sv_qp_state_name(before), sv_qp_state_name(to), why, r, r ? strerror(r) : "success");
	expect_state(qa, before);
}

/* Each required attribute of a transition, left out in turn. */
static void refused_without_each(enum ibv_qp_state to, int mask)
{
	for (int bit = 1; bit < (1 << 21); bit <<= 1) {
		if (!(mask & bit) || bit == IBV_QP_STATE)
			continue;
		char why[64];
		snprintf(why, sizeof(why), "required attribute 0x%x missing", bit);
		refused(to, mask & ~bit, why);
	}
}

static void check_query(void)
{
	sv_step("ibv_query_qp returns every attribute that was set");
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0xff, sizeof(a));
	memset(&ia, 0xff, sizeof(ia));
	CHECK_OK(ibv_query_qp(qa, &a, INIT_MASK | RTR_MASK | RTS_MASK | IBV_QP_CAP, &ia));
	CHECK_EQ(a.qp_state, IBV_QPS_RTS);
	CHECK_EQ(a.pkey_index, 0);
	CHECK_EQ(a.port_num, 1);
	CHECK_EQ(a.qp_access_flags, cfg.access);
	CHECK_EQ(a.path_mtu, cfg.mtu);
	CHECK_EQ(a.dest_qp_num, qb->qp_num);
	CHECK_EQ(a.rq_psn, cfg.psn);
	CHECK_EQ(a.sq_psn, cfg.psn);
	CHECK_EQ(a.max_dest_rd_atomic, cfg.max_rd_atomic);
	CHECK_EQ(a.max_rd_atomic, cfg.max_rd_atomic);
	CHECK_EQ(a.min_rnr_timer, cfg.min_rnr_timer);
	CHECK_EQ(a.timeout, cfg.timeout);
	CHECK_EQ(a.retry_cnt, cfg.retry_cnt);
	CHECK_EQ(a.rnr_retry, cfg.rnr_retry);
	CHECK_EQ(a.ah_attr.is_global, 1);
	CHECK(memcmp(&a.ah_attr.grh.dgid, &dev.gid, sizeof(dev.gid)) == 0);
	CHECK_EQ(a.ah_attr.grh.sgid_index, 0);
	CHECK_EQ(a.ah_attr.grh.hop_limit, 1);
	CHECK_EQ(a.ah_attr.port_num, 1);
	CHECK_EQ(ia.qp_type, IBV_QPT_RC);
	CHECK(ia.send_cq == qa->send_cq);
	CHECK(ia.recv_cq == qa->recv_cq);
	CHECK(ia.srq == NULL);
	CHECK_EQ(ia.sq_sig_all, 1);
}

static void check_caps(const struct ibv_qp_cap *created)
{
	sv_step("ibv_query_qp reports the caps ibv_create_qp wrote back");
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	memset(&ia, 0, sizeof(ia));
	CHECK_OK(ibv_query_qp(qa, &a, IBV_QP_CAP, &ia));
	const struct ibv_qp_cap *caps[2] = { &a.cap, &ia.cap };
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(caps[i]->max_send_wr, created->max_send_wr);
		CHECK_EQ(caps[i]->max_recv_wr, created->max_recv_wr);
		CHECK_EQ(caps[i]->max_send_sge, created->max_send_sge);
		CHECK_EQ(caps[i]->max_recv_sge, created->max_recv_sge);
		CHECK(caps[i]->max_inline_data >= cfg.max_inline_data);
	}
}

int main(void)
{
	sv_init("qp_state_machine");
	sv_open(&dev);
	sv_pair_cfg_init(&cfg);
	cfg.max_send_wr = 10;
	cfg.max_recv_wr = 7;
	cfg.max_send_sge = 3;
	cfg.max_recv_sge = 2;
	cfg.max_inline_data = 40;
	cfg.sq_sig_all = 1;
	cfg.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	cfg.mtu = IBV_MTU_2048;
	cfg.psn = 0x4242;
	cfg.timeout = 17;
	cfg.retry_cnt = 5;
	cfg.rnr_retry = 3;
	cfg.min_rnr_timer = 9;
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);

	sv_step("ibv_create_qp writes back caps >= the request");
	struct ibv_qp_cap created;
	qa = sv_create_qp(&dev, &cfg, cq, cq, NULL, &created); /* checks caps >= requested */
	qb = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
	CHECK(qa->qp_num != qb->qp_num);
	expect_state(qa, IBV_QPS_RESET);
	check_caps(&created);

	sv_step("RESET: bad transitions are refused");
	refused_without_each(IBV_QPS_INIT, INIT_MASK);
	refused(IBV_QPS_INIT, INIT_MASK | IBV_QP_SQ_PSN, "SQ_PSN not allowed");
	refused(IBV_QPS_INIT, INIT_MASK | IBV_QP_DEST_QPN, "DEST_QPN not allowed");
	refused(IBV_QPS_RTR, RTR_MASK, "RESET -> RTR");
	refused(IBV_QPS_RTS, RTS_MASK, "RESET -> RTS");
	refused(IBV_QPS_SQD, IBV_QP_STATE, "RESET -> SQD");
	struct ibv_qp_attr bad;
	full_attr(&bad, IBV_QPS_INIT);
	bad.port_num = 2;
	CHECK_ERR(ibv_modify_qp(qa, &bad, INIT_MASK), EINVAL);
	expect_state(qa, IBV_QPS_RESET);

	sv_step("RESET -> INIT; INIT: bad transitions are refused");
	go(IBV_QPS_INIT, INIT_MASK);
	refused_without_each(IBV_QPS_RTR, RTR_MASK);
	refused(IBV_QPS_RTR, RTR_MASK | IBV_QP_SQ_PSN, "SQ_PSN not allowed");
	refused(IBV_QPS_RTR, RTR_MASK | IBV_QP_TIMEOUT, "TIMEOUT not allowed");
	refused(IBV_QPS_RTS, RTS_MASK, "INIT -> RTS");
	refused(IBV_QPS_SQD, IBV_QP_STATE, "INIT -> SQD");

	sv_step("INIT -> RTR; RTR: bad transitions are refused");
	go(IBV_QPS_RTR, RTR_MASK);
	refused_without_each(IBV_QPS_RTS, RTS_MASK);
	refused(IBV_QPS_RTS, RTS_MASK | IBV_QP_DEST_QPN, "DEST_QPN not allowed");
	refused(IBV_QPS_RTS, RTS_MASK | IBV_QP_PATH_MTU, "PATH_MTU not allowed");
	refused(IBV_QPS_INIT, INIT_MASK, "RTR -> INIT");

	sv_step("RTR -> RTS; query");
	go(IBV_QPS_RTS, RTS_MASK);
	check_query();
	refused(IBV_QPS_RTR, RTR_MASK, "RTS -> RTR");
	refused(IBV_QPS_INIT, INIT_MASK, "RTS -> INIT");

	sv_step("RTS -> RTS with an optional attribute (MIN_RNR_TIMER)");
	cfg.min_rnr_timer = 12;
	go(IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER);
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK_OK(ibv_query_qp(qa, &q, IBV_QP_MIN_RNR_TIMER, &qi));
	CHECK_EQ(q.min_rnr_timer, 12);

	sv_step("RTS -> SQD -> RTS");
	go(IBV_QPS_SQD, IBV_QP_STATE);
	go(IBV_QPS_RTS, IBV_QP_STATE);

	sv_step("any state -> ERR, ERR -> RESET");
	go(IBV_QPS_ERR, IBV_QP_STATE);
	refused(IBV_QPS_RTS, RTS_MASK, "ERR -> RTS");
	refused(IBV_QPS_INIT, INIT_MASK, "ERR -> INIT");
	go(IBV_QPS_RESET, IBV_QP_STATE);
	go(IBV_QPS_ERR, IBV_QP_STATE); /* from RESET */
	go(IBV_QPS_RESET, IBV_QP_STATE);
	go(IBV_QPS_INIT, INIT_MASK);
	go(IBV_QPS_ERR, IBV_QP_STATE); /* from INIT */
	go(IBV_QPS_RESET, IBV_QP_STATE);
	go(IBV_QPS_INIT, INIT_MASK);
	go(IBV_QPS_RTR, RTR_MASK);
	go(IBV_QPS_ERR, IBV_QP_STATE); /* from RTR */
	go(IBV_QPS_RESET, IBV_QP_STATE);
	go(IBV_QPS_INIT, INIT_MASK);
	go(IBV_QPS_RTR, RTR_MASK);
	go(IBV_QPS_RTS, RTS_MASK);
	go(IBV_QPS_SQD, IBV_QP_STATE);
	go(IBV_QPS_ERR, IBV_QP_STATE); /* from SQD */
	go(IBV_QPS_RESET, IBV_QP_STATE);
	go(IBV_QPS_INIT, INIT_MASK);
	go(IBV_QPS_RTR, RTR_MASK);
	go(IBV_QPS_RTS, RTS_MASK);
	go(IBV_QPS_RESET, IBV_QP_STATE); /* RTS -> RESET directly */

	sv_step("a QP that went through all that connects and moves data");
	sv_connect(&dev, qa, qb, &cfg);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	CHECK_OK(sv_post_recv(qb, 1, mr, 2048, 1024));
	CHECK_OK(sv_post_send(qa, 2, mr, 0, 100, 0)); /* sq_sig_all: completes anyway */
	struct ibv_wc wc[2];
	CHECK_EQ(sv_poll(cq, 2, wc, SV_WAIT_MS), 2);
	for (int i = 0; i < 2; i++) {
		CHECK_STATUS(wc[i], IBV_WC_SUCCESS);
		CHECK(wc[i].wr_id == 1 || wc[i].wr_id == 2);
		CHECK_EQ(wc[i].qp_num, wc[i].wr_id == 1 ? qb->qp_num : qa->qp_num);
	}

	sv_step("teardown");
	CHECK_OK(ibv_destroy_qp(qa));
	CHECK_OK(ibv_destroy_qp(qb));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_free_mr(mr);
	sv_close(&dev);
	sv_pass();
	return 0;
}
