/*
 * err_post: errors that ibv_post_send / ibv_post_recv report immediately.
 *
 * ibv_post_send(3): posting "stops processing WRs from this list at the first failure (that
 * can be detected immediately while requests are being posted), and returns this failing WR
 * through bad_wr"; the return value is an errno value.
 * - ibv_post_send on a QP in RESET, INIT or RTR: EINVAL, bad_wr = the first WR.
 * - ibv_post_recv on a QP in RESET: EINVAL, bad_wr = the first WR (INIT is fine).
 * - num_sge > cap.max_send_sge: EINVAL, bad_wr = that WR; the WR before it in the list was
 *   posted and completes, the one after it was not posted.
 * - num_sge > cap.max_recv_sge on a receive: EINVAL, bad_wr = that WR.
 * - more WRs than cap.max_send_wr outstanding: ENOMEM, bad_wr = the first WR that did not fit
 *   (the SENDs stay outstanding because B has no receive and rnr_retry = 7); the ones that
 *   fit all complete once B posts receives.
 * - more receives than cap.max_recv_wr: ENOMEM, bad_wr = the first one that did not fit.
 */
#include "common.h"

static struct sv_dev dev;
static struct sv_pair p;
static struct ibv_mr *mr;

/* A list of n SENDs of 8 bytes each, wr_ids first..first+n-1. */
static struct ibv_send_wr *send_list(int n, uint64_t first, struct ibv_sge **sges)
{
	struct ibv_send_wr *wr = calloc((size_t)n, sizeof(*wr));
	*sges = calloc((size_t)n, sizeof(**sges));
	CHECK(wr && *sges);
	for (int i = 0; i < n; i++) {
		sv_wr_init(&wr[i], &(*sges)[i], first + (uint64_t)i, IBV_WR_SEND, mr, 0, 8,
			   IBV_SEND_SIGNALED);
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	return wr;
}

/* A list of n receives of 64 bytes each, wr_ids first..first+n-1. */
static struct ibv_recv_wr *recv_list(int n, uint64_t first, struct ibv_sge **sges)
{
	struct ibv_recv_wr *wr = calloc((size_t)n, sizeof(*wr));
	*sges = calloc((size_t)n, sizeof(**sges));
	CHECK(wr && *sges);
	for (int i = 0; i < n; i++) {
		(*sges)[i] = (struct ibv_sge){ sv_addr(mr, 64 * ((size_t)i % 64)), 64, mr->lkey };
		wr[i].wr_id = first + (uint64_t)i;
		wr[i].sg_list = &(*sges)[i];
		wr[i].num_sge = 1;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	return wr;
}

static void expect_send_refused(struct ibv_qp *qp, const char *state)
{
	struct ibv_sge *sges;
	struct ibv_send_wr *wr = send_list(2, 1, &sges), *bad = NULL;
	int r = ibv_post_send(qp, wr, &bad);
	CHECKF(r == EINVAL, "ibv_post_send in %s returned %d, expected EINVAL", state, r);
	CHECKF(bad == &wr[0], "ibv_post_send in %s: bad_wr %p, expected the first WR %p", state,
	       (void *)bad, (void *)&wr[0]);
	free(wr);
	free(sges);
}

static void test_states(void)
{
	sv_step("RESET: post_send and post_recv are refused");
	expect_send_refused(p.qp[0], "RESET");
	struct ibv_sge *rsges;
	struct ibv_recv_wr *rwr = recv_list(2, 1, &rsges), *rbad = NULL;
	CHECK_ERR(ibv_post_recv(p.qp[1], rwr, &rbad), EINVAL);
	CHECK(rbad == &rwr[0]);

	sv_step("INIT: post_send is refused, post_recv is accepted");
	CHECK_OK(sv_modify_init(p.qp[0], &p.cfg));
	CHECK_OK(sv_modify_init(p.qp[1], &p.cfg));
	expect_send_refused(p.qp[0], "INIT");
	rwr[0].next = NULL;
	CHECK_OK(ibv_post_recv(p.qp[1], rwr, &rbad)); /* wr_id 1, consumed below */
	free(rwr);
	free(rsges);

	sv_step("RTR: post_send is refused");
	CHECK_OK(sv_modify_rtr(p.qp[0], &dev, p.qp[1]->qp_num, &p.cfg));
	CHECK_OK(sv_modify_rtr(p.qp[1], &dev, p.qp[0]->qp_num, &p.cfg));
	expect_send_refused(p.qp[0], "RTR");
	CHECK_OK(sv_modify_rts(p.qp[0], &p.cfg));
	CHECK_OK(sv_modify_rts(p.qp[1], &p.cfg));
	sv_expect_empty(p.scq[0], "refused WRs make no completion");
}

/* n valid 8-byte SGEs. */
static struct ibv_sge *sge_array(uint32_t n)
{
	struct ibv_sge *sges = calloc(n, sizeof(*sges));
	CHECK(sges);
	for (uint32_t i = 0; i < n; i++)
		sges[i] = (struct ibv_sge){ sv_addr(mr, 8 * i), 8, mr->lkey };
	return sges;
}

static void test_too_many_sges(void)
{
	sv_step("num_sge > max_send_sge: EINVAL at that WR, the WR before it is posted");
	uint32_t n = p.cap[0].max_send_sge + 1;
	struct ibv_sge *many = sge_array(n);
	struct ibv_sge *sges;
	struct ibv_send_wr *wr = send_list(3, 10, &sges), *bad = NULL;
	wr[1].sg_list = many;
	wr[1].num_sge = (int)n;
	CHECK_ERR(ibv_post_send(p.qp[0], wr, &bad), EINVAL);
	CHECKF(bad == &wr[1], "bad_wr %p, expected the second WR %p", (void *)bad, (void *)&wr[1]);
	sv_expect_wc(p.scq[0], 10, IBV_WC_SUCCESS, p.qp[0], NULL);
	sv_expect_wc(p.rcq[1], 1, IBV_WC_SUCCESS, p.qp[1], NULL);
	sv_sleep_ms(SV_QUIET_MS);
	sv_expect_empty(p.scq[0], "only the first WR of the list was posted");
	free(wr);
	free(sges);

	sv_step("num_sge > max_recv_sge on a receive: EINVAL, bad_wr = that WR");
	uint32_t rn = p.cap[1].max_recv_sge + 1;
	struct ibv_sge *rmany = sge_array(rn);
	struct ibv_recv_wr rwr = { .wr_id = 20, .sg_list = rmany, .num_sge = (int)rn };
	struct ibv_recv_wr *rbad = NULL;
	CHECK_ERR(ibv_post_recv(p.qp[1], &rwr, &rbad), EINVAL);
	CHECK(rbad == &rwr);
	free(many);
	free(rmany);
}

static void test_send_queue_full(void)
{
	int cap = (int)p.cap[0].max_send_wr;
	sv_step("%d SENDs on a send queue of %d: ENOMEM at the one that does not fit", cap + 1,
		cap);
	CHECKF(cap <= 200, "max_send_wr %d too large for this test's CQ", cap);
	struct ibv_sge *sges;
	struct ibv_send_wr *wr = send_list(cap + 1, 1000, &sges), *bad = NULL;
	CHECK_ERR(ibv_post_send(p.qp[0], wr, &bad), ENOMEM);
	CHECKF(bad == &wr[cap], "bad_wr is WR #%td, expected #%d", bad ? bad - wr : -1, cap);

	sv_step("the %d that fit all complete once B posts receives", cap);
	int rcap = (int)p.cap[1].max_recv_wr;
	int recv_posted = 0, recv_done = 0, send_done = 0;
	long long deadline = sv_now_ms() + SV_WAIT_MS;
	while (send_done < cap) {
		CHECKF(sv_now_ms() < deadline, "%d of %d SENDs completed", send_done, cap);
		while (recv_posted < cap && recv_posted - recv_done < rcap) {
			CHECK_OK(sv_post_recv(p.qp[1], 2000 + (uint64_t)recv_posted, mr, 0, 64));
			recv_posted++;
		}
		struct ibv_wc wc;
		while (ibv_poll_cq(p.rcq[1], 1, &wc) == 1) {
			CHECK_WC(wc, 2000 + (uint64_t)recv_done, IBV_WC_SUCCESS, p.qp[1]);
			recv_done++;
		}
		while (ibv_poll_cq(p.scq[0], 1, &wc) == 1) {
			CHECK_WC(wc, 1000 + (uint64_t)send_done, IBV_WC_SUCCESS, p.qp[0]);
			send_done++;
		}
		usleep(100);
	}
	for (; recv_done < cap; recv_done++)
		sv_expect_wc(p.rcq[1], 2000 + (uint64_t)recv_done, IBV_WC_SUCCESS, p.qp[1], NULL);
	sv_expect_empty(p.rcq[1], "one receive completion per SEND");
	sv_expect_empty(p.scq[0], "the WR that did not fit was not posted");
	free(wr);
	free(sges);
}

static void test_recv_queue_full(void)
{
	int rcap = (int)p.cap[1].max_recv_wr;
	sv_step("%d receives on a receive queue of %d: ENOMEM at the one that does not fit",
		rcap + 1, rcap);
	CHECKF(rcap <= 200, "max_recv_wr %d too large for this test's CQ", rcap);
	struct ibv_sge *sges;
	struct ibv_recv_wr *wr = recv_list(rcap + 1, 3000, &sges), *bad = NULL;
	CHECK_ERR(ibv_post_recv(p.qp[1], wr, &bad), ENOMEM);
	CHECKF(bad == &wr[rcap], "bad_wr is WR #%td, expected #%d", bad ? bad - wr : -1, rcap);

	sv_step("exactly %d receives were posted: moving B to ERR flushes %d", rcap, rcap);
	CHECK_OK(sv_modify_state(p.qp[1], IBV_QPS_ERR));
	for (int i = 0; i < rcap; i++)
		sv_expect_wc(p.rcq[1], 3000 + (uint64_t)i, IBV_WC_WR_FLUSH_ERR, p.qp[1], NULL);
	sv_expect_empty(p.rcq[1], "nothing beyond the receives that fit");
	free(wr);
	free(sges);
}

int main(void)
{
	sv_init("err_post");
	sv_open(&dev);
	mr = sv_alloc_mr(dev.pd, 8192, SV_ACCESS_ALL);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_send_wr = 16;
	cfg.max_recv_wr = 16;
	cfg.send_cqe = 256;
	cfg.recv_cqe = 256;
	cfg.rnr_retry = 7;
	sv_pair_create(&dev, &cfg, &p);

	test_states();
	test_too_many_sges();
	test_send_queue_full();
	test_recv_queue_full();

	sv_step("teardown");
	sv_pair_destroy(&p);
	sv_free_mr(mr);
	sv_close(&dev);
	sv_pass();
	return 0;
}
