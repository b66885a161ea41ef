/*
 * Verbs mistakes made on purpose, one per case, for `softverbs check` (docs/check.md):
 * `mistakes CASE` runs one; run_case.sh runs it with SOFTVERBS_CHECK=1 and compares the
 * reports with expected/CASE.txt. Each case makes its mistake in a function of its own
 * (linked with -rdynamic, so that the report names it) and then recovers, so that the
 * program ends normally and the summary at exit is part of what is compared.
 */
#include "common.h"

/* One SEND/WRITE/READ WR of mr[off, off+len), posted in the calling function (a macro, so
 * that the report names the mistake's function, not a helper). */
#define POST(p_qp, p_id, p_op, p_mr, p_off, p_len, p_flags, p_raddr, p_rkey, p_rc)           \
	do {                                                                              \
		struct ibv_sge sge_ = {sv_addr(p_mr, p_off), (p_len), (p_mr)->lkey};      \
		struct ibv_send_wr wr_ = {0}, *bad_;                                      \
		wr_.wr_id = (p_id);                                                       \
		wr_.sg_list = &sge_;                                                      \
		wr_.num_sge = 1;                                                          \
		wr_.opcode = (p_op);                                                      \
		wr_.send_flags = (p_flags);                                               \
		wr_.wr.rdma.remote_addr = (p_raddr);                                      \
		wr_.wr.rdma.rkey = (p_rkey);                                              \
		(p_rc) = ibv_post_send((p_qp), &wr_, &bad_);                              \
	} while (0)

static struct sv_fixture f;
#define A (f.pair.qp[0])
#define B (f.pair.qp[1])

static void open_fixture(int with_channel, void (*tune)(struct sv_pair_cfg *))
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.shared_cq = 1;
	if (tune)
		tune(&cfg);
	sv_fixture_open(&f, &cfg, with_channel);
}

/* A thread that does `fn(arg)` after `ms`: what unblocks a wait the checker reported. */
struct later {
	int ms;
	void (*fn)(void *);
	void *arg;
	pthread_t thread;
};
static void *later_main(void *p)
{
	struct later *l = p;
	sv_sleep_ms(l->ms);
	l->fn(l->arg);
	return NULL;
}
static void later_start(struct later *l) { CHECK_OK(pthread_create(&l->thread, NULL, later_main, l)); }
static void later_join(struct later *l) { pthread_join(l->thread, NULL); }

/* A signaled SEND from A to B (B has a receive), its completion left in A's CQ. */
static void send_a_to_b(uint64_t id)
{
	int rc;
	CHECK_OK(sv_post_recv(B, 100 + id, f.mr[1], 0, 64));
	POST(A, id, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
	CHECK_OK(rc);
	sv_sleep_ms(50); /* loop delivery is immediate; give a slow machine time anyway */
}

static void drain(struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	while (sv_poll(cq, 16, wc, 100) > 0)
		;
}

/* ---- completion events ---------------------------------------------------------------- */

static void ack_one(void *cq) { ibv_ack_cq_events(cq, 1); }

__attribute__((noinline)) void mistake_unacked_events(void)
{
	open_fixture(1, NULL);
	struct ibv_cq *cq = f.pair.scq[0], *ev_cq;
	void *ctx;
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_a_to_b(1);
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0); /* got, never acked here */
	drain(cq);
	/* The destroy below waits for the ack; the thread gives it after the report. */
	struct later l = {1500, ack_one, cq, 0};
	later_start(&l);
	ibv_destroy_qp(A);
	ibv_destroy_qp(B);
	f.pair.qp[0] = f.pair.qp[1] = NULL;
	CHECK_OK(ibv_destroy_cq(cq));
	f.pair.scq[0] = f.pair.rcq[0] = NULL;
	later_join(&l);
}

static void send_again(void *unused)
{
	(void)unused;
	send_a_to_b(2);
}

__attribute__((noinline)) void mistake_lost_wakeup(void)
{
	open_fixture(1, NULL);
	struct ibv_cq *cq = f.pair.scq[0], *ev_cq;
	void *ctx;
	send_a_to_b(1);                     /* its completion is waiting ... */
	CHECK_OK(ibv_req_notify_cq(cq, 0)); /* ... when the CQ is armed: by the man page no event */
	struct later l = {2000, send_again, NULL, 0};
	later_start(&l);
	/* softverbs (as mlx4/mlx5) wakes it with an early event; rxe only at the second send */
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
	ibv_ack_cq_events(ev_cq, 1);
	later_join(&l);
	drain(cq);
}

static void arm_and_send(void *cq)
{
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_a_to_b(3);
}

__attribute__((noinline)) void mistake_wait_unarmed(void)
{
	open_fixture(1, NULL);
	struct ibv_cq *cq = f.pair.scq[0], *ev_cq;
	void *ctx;
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_a_to_b(1);
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
	ibv_ack_cq_events(ev_cq, 1);
	drain(cq);
	send_a_to_b(2); /* the CQ was not re-armed: this makes no event */
	struct later l = {2000, arm_and_send, cq, 0};
	later_start(&l);
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
	ibv_ack_cq_events(ev_cq, 1);
	later_join(&l);
	drain(cq);
}

/* ---- destroy while in use -------------------------------------------------------------- */

__attribute__((noinline)) void mistake_destroy_busy(void)
{
	open_fixture(1, NULL);
	CHECK_ERR(ibv_destroy_cq(f.pair.scq[0]), EBUSY);
	CHECK_ERR(ibv_destroy_comp_channel(f.ch), EBUSY);
	CHECK_ERR(ibv_dealloc_pd(f.dev.pd), EBUSY);
}

/* ---- work requests ---------------------------------------------------------------------- */

__attribute__((noinline)) void mistake_post_state(void)
{
	open_fixture(0, NULL);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_qp *qp = sv_create_qp(&f.dev, &cfg, f.pair.scq[0], f.pair.rcq[0], NULL, NULL);
	struct ibv_sge sge = {sv_addr(f.mr[0], 0), 64, f.mr[0]->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1}, *rbad;
	CHECK_ERR(ibv_post_recv(qp, &rwr, &rbad), EINVAL); /* RESET */
	CHECK_OK(sv_modify_init(qp, &cfg));
	int rc;
	POST(qp, 8, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
	CHECK_EQ(rc, EINVAL); /* INIT */
	CHECK_OK(ibv_destroy_qp(qp));
}

static void small_caps(struct sv_pair_cfg *cfg)
{
	cfg->max_send_sge = 1;
	cfg->max_inline_data = 16;
}

__attribute__((noinline)) void mistake_wr_limits(void)
{
	open_fixture(0, small_caps);
	struct ibv_sge sge[2] = {{sv_addr(f.mr[0], 0), 8, f.mr[0]->lkey},
				 {sv_addr(f.mr[0], 8), 8, f.mr[0]->lkey}};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = sge, .num_sge = 2,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	uint32_t max_sge = f.pair.cap[0].max_send_sge;
	wr.num_sge = (int)max_sge + 1;
	struct ibv_sge many[16];
	for (int i = 0; i < 16; i++)
		many[i] = sge[0];
	wr.sg_list = many;
	CHECK_ERR(ibv_post_send(A, &wr, &bad), EINVAL);
	int rc;
	uint32_t big = f.pair.cap[0].max_inline_data + 1;
	POST(A, 2, IBV_WR_SEND, f.mr[0], 0, big, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0, 0, rc);
	CHECK_EQ(rc, EINVAL);
}

static void unsignaled_small(struct sv_pair_cfg *cfg)
{
	cfg->sq_sig_all = 0;
	cfg->max_send_wr = 4;
}

__attribute__((noinline)) void mistake_never_signaled(void)
{
	open_fixture(0, unsignaled_small);
	uint32_t n = f.pair.cap[0].max_send_wr + 1;
	for (uint32_t i = 0; i < n; i++) {
		int rc;
		CHECK_OK(sv_post_recv(B, 100 + i, f.mr[1], 0, 64));
		POST(A, i, IBV_WR_SEND, f.mr[0], 0, 64, 0, 0, 0, rc); /* never signaled */
		CHECK_OK(rc);
	}
	drain(f.pair.rcq[1]);
}

static void queue_of_two(struct sv_pair_cfg *cfg) { cfg->max_send_wr = 2; }

__attribute__((noinline)) void mistake_send_queue_full(void)
{
	open_fixture(0, queue_of_two);
	/* B has no receive: the first SEND waits (RNR, retried for ever), the rest queue. */
	uint32_t n = f.pair.cap[0].max_send_wr;
	int rc;
	for (uint32_t i = 0; i < n; i++) {
		POST(A, i, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
		CHECK_OK(rc);
	}
	POST(A, n, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
	CHECK_EQ(rc, ENOMEM);
	for (uint32_t i = 0; i < n; i++)
		CHECK_OK(sv_post_recv(B, 100 + i, f.mr[1], 0, 64));
	struct ibv_wc wc[8];
	int got = 0;
	while (got < (int)n)
		got += sv_poll(f.pair.scq[0], 8, wc, 2000);
	drain(f.pair.rcq[1]);
}

/* ---- memory ---------------------------------------------------------------------------- */

__attribute__((noinline)) void mistake_lkey_deregistered(void)
{
	open_fixture(0, NULL);
	struct ibv_mr *mr = sv_alloc_mr(f.dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr gone = *mr;
	void *buf = mr->addr;
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(sv_post_recv(B, 100, f.mr[1], 0, 64));
	int rc;
	POST(A, 1, IBV_WR_SEND, &gone, 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
	CHECK_STATUS(wc, IBV_WC_LOC_PROT_ERR);
	free(buf);
}

__attribute__((noinline)) void mistake_buffer_outside_mr(void)
{
	open_fixture(0, NULL);
	struct ibv_mr *mr = sv_alloc_mr(f.dev.pd, 4096, 0); /* no LOCAL_WRITE */
	CHECK_OK(sv_post_recv(B, 100, f.mr[1], 0, 64));
	int rc;
	POST(A, 1, IBV_WR_SEND, mr, 4000, 200, IBV_SEND_SIGNALED, 0, 0, rc); /* past its end */
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
	CHECK_STATUS(wc, IBV_WC_LOC_PROT_ERR);
	drain(f.pair.rcq[1]);
	sv_free_mr(mr);
}

__attribute__((noinline)) void mistake_local_access(void)
{
	open_fixture(0, NULL);
	struct ibv_mr *mr = sv_alloc_mr(f.dev.pd, 4096, 0); /* no LOCAL_WRITE */
	int rc;
	/* A READ writes its result into the local buffer. */
	POST(A, 1, IBV_WR_RDMA_READ, mr, 0, 64, IBV_SEND_SIGNALED, sv_addr(f.mr[1], 0),
	     f.mr[1]->rkey, rc);
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
	sv_free_mr(mr);
}

__attribute__((noinline)) void mistake_remote_access(void)
{
	open_fixture(0, NULL);
	struct ibv_mr *target = sv_alloc_mr(f.dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE); /* no REMOTE_WRITE */
	int rc;
	POST(A, 1, IBV_WR_RDMA_WRITE, f.mr[0], 0, 64, IBV_SEND_SIGNALED, sv_addr(target, 0),
	     target->rkey, rc);
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
	CHECK_STATUS(wc, IBV_WC_REM_ACCESS_ERR);
	sv_free_mr(target);
}

static void no_rd_atomic(struct sv_pair_cfg *cfg) { cfg->max_rd_atomic = 0; }

__attribute__((noinline)) void mistake_atomic(void)
{
	open_fixture(0, no_rd_atomic);
	struct ibv_sge sge = {sv_addr(f.mr[0], 0), 8, f.mr[0]->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	wr.wr.atomic.remote_addr = sv_addr(f.mr[1], 4); /* not 8-byte aligned */
	wr.wr.atomic.rkey = f.mr[1]->rkey;
	wr.wr.atomic.compare_add = 1;
	CHECK_OK(ibv_post_send(A, &wr, &bad));
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
}

/* ---- queues ---------------------------------------------------------------------------- */

static void tiny_cq(struct sv_pair_cfg *cfg)
{
	cfg->send_cqe = cfg->recv_cqe = 2;
	cfg->max_send_wr = 16;
}

__attribute__((noinline)) void mistake_cq_overrun(void)
{
	open_fixture(0, tiny_cq);
	int n = f.pair.scq[0]->cqe + 2;
	for (int i = 0; i < n; i++) {
		int rc;
		CHECK_OK(sv_post_recv(B, 100 + i, f.mr[1], 0, 64));
		POST(A, i, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
		if (rc)
			break; /* the QP went to the error state */
	}
	sv_sleep_ms(100);
	sv_drain_async(f.dev.ctx, 200);
}

static void rnr_once(struct sv_pair_cfg *cfg)
{
	cfg->rnr_retry = 1;
	cfg->min_rnr_timer = 1;
}

__attribute__((noinline)) void mistake_rnr_retry(void)
{
	open_fixture(0, rnr_once);
	int rc;
	POST(A, 1, IBV_WR_SEND, f.mr[0], 0, 64, IBV_SEND_SIGNALED, 0, 0, rc); /* B has no receive */
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(f.pair.scq[0], &wc);
	CHECK_STATUS(wc, IBV_WC_RNR_RETRY_EXC_ERR);
}

/* ---- the extended API: ibv_wr_* posts on an ibv_qp_ex, ibv_start_poll on an ibv_cq_ex ---- */

/* X: an extended RC QP completing into an extended CQ (on the fixture's channel, if any),
 * connected to Y, an ordinary QP on B's CQ. */
static struct ibv_cq_ex *xcq;
static struct ibv_qp *X, *Y;
static struct ibv_qp_cap xcap;

static void open_ex(int with_channel, void (*tune)(struct sv_pair_cfg *), int connect)
{
	open_fixture(with_channel, NULL);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	if (tune)
		tune(&cfg);
	struct ibv_cq_init_attr_ex ca = {.cqe = 64, .channel = f.ch,
					 .wc_flags = IBV_WC_STANDARD_FLAGS};
	xcq = ibv_create_cq_ex(f.dev.ctx, &ca);
	CHECK(xcq != NULL);
	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(xcq);
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = cfg.sq_sig_all;
	qa.cap.max_send_wr = cfg.max_send_wr;
	qa.cap.max_recv_wr = cfg.max_recv_wr;
	qa.cap.max_send_sge = cfg.max_send_sge;
	qa.cap.max_recv_sge = cfg.max_recv_sge;
	qa.cap.max_inline_data = cfg.max_inline_data;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = f.dev.pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	X = ibv_create_qp_ex(f.dev.ctx, &qa);
	CHECK(X != NULL);
	xcap = qa.cap;
	struct sv_pair_cfg ycfg;
	sv_pair_cfg_init(&ycfg);
	Y = sv_create_qp(&f.dev, &ycfg, f.pair.scq[1], f.pair.rcq[1], NULL, NULL);
	if (connect)
		sv_connect(&f.dev, X, Y, &cfg);
}

static void close_ex(void)
{
	CHECK_OK(ibv_destroy_qp(X));
	CHECK_OK(ibv_destroy_qp(Y));
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(xcq)));
}

/* One SEND of mr[0][0, len) from X through the post-send API; what ibv_wr_complete said. */
#define WR_SEND(p_id, p_lkey, p_len, p_rc)                                                \
	do {                                                                              \
		struct ibv_qp_ex *qx_ = ibv_qp_to_qp_ex(X);                               \
		ibv_wr_start(qx_);                                                        \
		qx_->wr_id = (p_id);                                                      \
		qx_->wr_flags = IBV_SEND_SIGNALED;                                        \
		ibv_wr_send(qx_);                                                         \
		ibv_wr_set_sge(qx_, (p_lkey), sv_addr(f.mr[0], 0), (p_len));              \
		(p_rc) = ibv_wr_complete(qx_);                                            \
	} while (0)

/* Polls xcq through the poll API until `want` completions came (or 5 s); returns them. */
__attribute__((noinline)) int poll_ex(int want, enum ibv_wc_status *last)
{
	int got = 0;
	long long end = sv_now_ms() + 5000;
	while (got < want && sv_now_ms() < end) {
		if (ibv_start_poll(xcq, NULL) != 0) {
			sv_sleep_ms(1);
			continue;
		}
		do {
			*last = xcq->status;
			got++;
		} while (ibv_next_poll(xcq) == 0);
		ibv_end_poll(xcq);
	}
	return got;
}

static void ex_small_caps(struct sv_pair_cfg *cfg)
{
	cfg->max_send_sge = 1;
	cfg->max_inline_data = 16;
	cfg->max_send_wr = 2;
}

__attribute__((noinline)) void mistake_wr_api(void)
{
	open_ex(0, ex_small_caps, 0);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	ex_small_caps(&cfg);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(X);
	int rc;
	/* A batch on a QP in INIT. */
	CHECK_OK(sv_modify_init(X, &cfg));
	WR_SEND(1, f.mr[0]->lkey, 64, rc);
	CHECK_EQ(rc, EINVAL);
	CHECK_OK(sv_modify_init(Y, &cfg));
	CHECK_OK(sv_modify_rtr(X, &f.dev, Y->qp_num, &cfg));
	CHECK_OK(sv_modify_rtr(Y, &f.dev, X->qp_num, &cfg));
	CHECK_OK(sv_modify_rts(X, &cfg));
	CHECK_OK(sv_modify_rts(Y, &cfg));
	/* More SGEs than max_send_sge. */
	struct ibv_sge two[2] = {{sv_addr(f.mr[0], 0), 8, f.mr[0]->lkey},
				 {sv_addr(f.mr[0], 8), 8, f.mr[0]->lkey}};
	ibv_wr_start(qx);
	qx->wr_id = 2;
	ibv_wr_send(qx);
	ibv_wr_set_sge_list(qx, xcap.max_send_sge + 1, two);
	CHECK_EQ(ibv_wr_complete(qx), EINVAL);
	/* More inline bytes than max_inline_data. */
	char bytes[256] = {0};
	ibv_wr_start(qx);
	qx->wr_id = 3;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, bytes, xcap.max_inline_data + 1);
	CHECK_EQ(ibv_wr_complete(qx), EINVAL);
	/* A batch longer than the send queue. */
	ibv_wr_start(qx);
	for (uint32_t i = 0; i <= xcap.max_send_wr; i++) {
		qx->wr_id = 10 + i;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, f.mr[0]->lkey, sv_addr(f.mr[0], 0), 64);
	}
	CHECK_EQ(ibv_wr_complete(qx), ENOMEM);
	/* The lkey of a deregistered MR: the WR completes with IBV_WC_LOC_PROT_ERR. */
	struct ibv_mr *mr = sv_alloc_mr(f.dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint32_t dead = mr->lkey;
	sv_free_mr(mr);
	CHECK_OK(sv_post_recv(Y, 100, f.mr[1], 0, 64));
	WR_SEND(4, dead, 64, rc);
	CHECK_OK(rc);
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	CHECK_EQ(poll_ex(1, &st), 1);
	CHECK_EQ(st, IBV_WC_LOC_PROT_ERR);
	drain(f.pair.rcq[1]);
	close_ex();
}

static void ex_rnr_once(struct sv_pair_cfg *cfg)
{
	cfg->rnr_retry = 1;
	cfg->min_rnr_timer = 1;
}

/* An error completion taken through ibv_start_poll is explained as ibv_poll_cq's are. */
__attribute__((noinline)) void mistake_poll_api(void)
{
	open_ex(0, ex_rnr_once, 1);
	int rc;
	WR_SEND(1, f.mr[0]->lkey, 64, rc); /* Y has no receive */
	CHECK_OK(rc);
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	CHECK_EQ(poll_ex(1, &st), 1);
	CHECK_EQ(st, IBV_WC_RNR_RETRY_EXC_ERR);
	close_ex();
}

static void send_x_to_y(void *id)
{
	int rc;
	CHECK_OK(sv_post_recv(Y, 100, f.mr[1], 0, 64));
	WR_SEND((uint64_t)(uintptr_t)id, f.mr[0]->lkey, 64, rc);
	CHECK_OK(rc);
	sv_sleep_ms(50);
}

/* Armed with two completions waiting, the poll API takes only one (ibv_end_poll without
 * ibv_next_poll): the other makes no event. */
__attribute__((noinline)) void mistake_lost_wakeup_ex(void)
{
	open_ex(1, NULL, 1);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(xcq), *ev_cq;
	void *ctx;
	send_x_to_y((void *)1);
	send_x_to_y((void *)2);
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	CHECK_OK(ibv_start_poll(xcq, NULL));
	ibv_end_poll(xcq); /* one taken, one left */
	struct later l = {2000, send_x_to_y, (void *)3, 0};
	later_start(&l);
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
	ibv_ack_cq_events(ev_cq, 1);
	later_join(&l);
	enum ibv_wc_status st;
	CHECK_EQ(poll_ex(2, &st), 2);
	drain(f.pair.rcq[1]);
	close_ex();
}

static void ex_unsignaled(struct sv_pair_cfg *cfg)
{
	cfg->sq_sig_all = 0;
	cfg->max_send_wr = 4;
}

/* A correct program on the extended API: batches of two WRs (one signaled) through
 * ibv_wr_*, the CQ armed before each wait, events acked, the CQ drained with the poll API.
 * Nothing to report. */
__attribute__((noinline)) void correct_ex(void)
{
	open_ex(1, ex_unsignaled, 1);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(xcq), *ev_cq;
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(X);
	void *ctx;
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	for (int i = 0; i < 20; i++) {
		CHECK_OK(sv_post_recv(Y, 100, f.mr[1], 0, 64));
		CHECK_OK(sv_post_recv(Y, 101, f.mr[1], 0, 64));
		ibv_wr_start(qx);
		qx->wr_id = 2 * i;
		qx->wr_flags = 0;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, f.mr[0]->lkey, sv_addr(f.mr[0], 0), 64);
		qx->wr_id = 2 * i + 1;
		qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_send(qx);
		ibv_wr_set_inline_data(qx, sv_ptr(f.mr[0], 0), 16);
		CHECK_OK(ibv_wr_complete(qx));
		CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
		ibv_ack_cq_events(ev_cq, 1);
		CHECK_OK(ibv_req_notify_cq(ev_cq, 0));
		enum ibv_wc_status st;
		CHECK_EQ(poll_ex(1, &st), 1);
		CHECK_EQ(st, IBV_WC_SUCCESS);
		drain(f.pair.rcq[1]);
	}
	close_ex();
}

/* ---- the extended API outside its batch, and a UD address handle that is gone ---------- */

static struct ibv_qp *ud_ex_qp(void)
{
	struct ibv_qp_init_attr_ex qa = {0};
	qa.send_cq = qa.recv_cq = f.pair.scq[0];
	qa.qp_type = IBV_QPT_UD;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = f.dev.pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *qp = ibv_create_qp_ex(f.dev.ctx, &qa);
	CHECK(qp != NULL);
	return qp;
}

static struct ibv_ah *make_ah(void)
{
	struct ibv_ah_attr aa = {0};
	aa.port_num = 1;
	aa.is_global = 1;
	aa.grh.sgid_index = (uint8_t)sv_gid_index();
	aa.grh.hop_limit = 1;
	CHECK_OK(ibv_query_gid(f.dev.ctx, 1, sv_gid_index(), &aa.grh.dgid));
	struct ibv_ah *ah = ibv_create_ah(f.dev.pd, &aa);
	CHECK(ah != NULL);
	return ah;
}

__attribute__((noinline)) void mistake_wr_outside(void)
{
	open_ex(0, NULL, 1);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(X);
	/* A builder with no batch open: the WR is dropped. */
	qx->wr_id = 1;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, f.mr[0]->lkey, sv_addr(f.mr[0], 0), 64);
	/* A setter in a batch before any builder: ibv_wr_complete fails. */
	struct ibv_qp *U = ud_ex_qp();
	struct ibv_qp_ex *ux = ibv_qp_to_qp_ex(U);
	struct ibv_ah *ah = make_ah();
	ibv_wr_start(ux);
	ux->wr_id = 2;
	ibv_wr_set_ud_addr(ux, ah, X->qp_num, 0x11111111);
	ibv_wr_abort(ux);
	/* An AH destroyed before the WR that names it. */
	CHECK_OK(ibv_destroy_ah(ah));
	ibv_wr_start(ux);
	ux->wr_id = 3;
	ibv_wr_send(ux);
	ibv_wr_set_ud_addr(ux, ah, X->qp_num, 0x11111111);
	ibv_wr_set_sge(ux, f.mr[0]->lkey, sv_addr(f.mr[0], 0), 64);
	ibv_wr_abort(ux);
	CHECK_OK(ibv_destroy_qp(U));
	close_ex();
}

/* ---- a peer in another process (forked before any verbs call; on another host with
 * $SV_PEER_NETNS, tests/hosts/check_peer.sh) ---------------------------------------------- */

enum { PEER_DEAD_MR, PEER_OUTSIDE, PEER_NO_WRITE_MR, PEER_QP_NO_WRITE, PEER_ROUNDS };

/* The peer of mistake_peer_rkey: a QP per round and, as the round says, the MR the
 * requester is to write into: deregistered, too short, without REMOTE_WRITE, or on a QP
 * that does not allow remote writes. */
static void peer_rkey_main(int sock)
{
	for (int round = 0; round < PEER_ROUNDS; round++) {
		struct sv_pair_cfg cfg;
		sv_pair_cfg_init(&cfg);
		if (round == PEER_QP_NO_WRITE)
			cfg.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
		struct sv_one_qp p;
		sv_one_qp_open(&p, &cfg, 64, 4096);
		struct ibv_mr *target = p.mr, *extra = NULL;
		if (round == PEER_DEAD_MR || round == PEER_NO_WRITE_MR) {
			extra = sv_alloc_mr(p.dev.pd, 4096,
					    round == PEER_DEAD_MR ? SV_ACCESS_ALL
								  : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
			target = extra;
		}
		struct sv_remote them;
		sv_trade_remote(sock, p.qp, target, &them);
		sv_one_qp_connect(&p, them.qpn, 0, 0, 0);
		sv_say(sock, 1);
		CHECK_EQ(sv_hear(sock), 1);
		if (round == PEER_DEAD_MR) { /* after the requester's first WRITE into it */
			CHECK_EQ(sv_hear(sock), 3);
			sv_free_mr(extra);
			extra = NULL;
			sv_say(sock, 4);
		}
		CHECK_EQ(sv_hear(sock), 2); /* the requester's WR failed */
		if (extra)
			sv_free_mr(extra);
		sv_one_qp_close(&p);
	}
}

__attribute__((noinline)) void mistake_peer_rkey(void)
{
	pid_t pid;
	int sock = sv_fork_peer(peer_rkey_main, &pid);
	/* All kept to the end: reports are once per QP, and a new QP may reuse a freed address. */
	struct sv_one_qp rs[PEER_ROUNDS];
	for (int round = 0; round < PEER_ROUNDS; round++) {
		struct sv_one_qp r;
		sv_one_qp_open(&r, NULL, 64, 4096);
		struct sv_remote peer;
		sv_trade_remote(sock, r.qp, r.mr, &peer);
		sv_one_qp_connect(&r, peer.qpn, 0, 0, 0);
		sv_say(sock, 1);
		CHECK_EQ(sv_hear(sock), 1);
		uint64_t at = peer.addr + (round == PEER_OUTSIDE ? 4096 - 32 : 0);
		int rc;
		struct ibv_wc wc;
		if (round == PEER_DEAD_MR) { /* a WRITE while the MR is there, then it goes */
			POST(r.qp, 100, IBV_WR_RDMA_WRITE, r.mr, 0, 64, IBV_SEND_SIGNALED, at, peer.rkey, rc);
			CHECK_OK(rc);
			sv_poll_one(r.cq, &wc);
			CHECK_STATUS(wc, IBV_WC_SUCCESS);
			sv_say(sock, 3);
			CHECK_EQ(sv_hear(sock), 4);
		}
		POST(r.qp, 1 + round, IBV_WR_RDMA_WRITE, r.mr, 0, 64, IBV_SEND_SIGNALED, at, peer.rkey, rc);
		CHECK_OK(rc);
		sv_poll_one(r.cq, &wc);
		CHECK_STATUS(wc, IBV_WC_REM_ACCESS_ERR);
		sv_say(sock, 2);
		rs[round] = r;
	}
	for (int round = 0; round < PEER_ROUNDS; round++)
		sv_one_qp_close(&rs[round]);
	sv_wait_peer(pid, "peer");
	close(sock);
}

/* The peer of mistake_peer_rnr: a QP that never posts a receive. */
static void peer_rnr_main(int sock)
{
	struct sv_one_qp p;
	sv_one_qp_open(&p, NULL, 64, 4096);
	struct sv_remote them;
	sv_trade_remote(sock, p.qp, p.mr, &them);
	sv_one_qp_connect(&p, them.qpn, 0, 0, 0);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 1);
	CHECK_EQ(sv_hear(sock), 2);
	sv_one_qp_close(&p);
}

/* Forks peer_rnr_main's peer and connects a QP opened with `cfg` to it: what the peer
 * cases after it share. Ends with peer_done. */
static int peer_connect(const struct sv_pair_cfg *cfg, struct sv_one_qp *r,
			   struct sv_remote *peer, pid_t *pid)
{
	int sock = sv_fork_peer(peer_rnr_main, pid);
	sv_one_qp_open(r, cfg, 64, 4096);
	sv_trade_remote(sock, r->qp, r->mr, peer);
	sv_one_qp_connect(r, peer->qpn, 0, 0, 0);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 1);
	return sock;
}

static void peer_done(int sock, struct sv_one_qp *r, pid_t pid)
{
	sv_say(sock, 2);
	sv_one_qp_close(r);
	sv_wait_peer(pid, "peer");
	close(sock);
}

/* A SEND to a peer in another process (same host: shared memory; another host: RoCE v2)
 * that has no receive: the RNR waits are counted on the QP and the error explained. */
__attribute__((noinline)) void mistake_peer_rnr(void)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	rnr_once(&cfg);
	struct sv_one_qp r;
	struct sv_remote peer;
	pid_t pid;
	int sock = peer_connect(&cfg, &r, &peer, &pid);
	int rc;
	POST(r.qp, 1, IBV_WR_SEND, r.mr, 0, 64, IBV_SEND_SIGNALED, 0, 0, rc);
	CHECK_OK(rc);
	struct ibv_wc wc;
	sv_poll_one(r.cq, &wc);
	CHECK_STATUS(wc, IBV_WC_RNR_RETRY_EXC_ERR);
	peer_done(sock, &r, pid);
}

/* A READ to a peer in another process whose QP has fewer responder resources
 * (max_dest_rd_atomic 1) than this QP may have READs/atomics outstanding (max_rd_atomic 4):
 * it works here, and overruns a NIC's responder once four are in flight. The peer is
 * peer_rnr_main's QP (it needs no receive). */
__attribute__((noinline)) void mistake_peer_rd_atomic(void)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_rd_atomic = 4;
	struct sv_one_qp r;
	struct sv_remote peer;
	pid_t pid;
	int sock = peer_connect(&cfg, &r, &peer, &pid);
	struct ibv_wc wc;
	int rc;
	for (uint64_t id = 1; id <= 2; id++) { /* reported once per QP */
		POST(r.qp, id, IBV_WR_RDMA_READ, r.mr, 0, 64, IBV_SEND_SIGNALED, peer.addr, peer.rkey, rc);
		CHECK_OK(rc);
		sv_poll_one(r.cq, &wc);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
	}
	peer_done(sock, &r, pid);
}

/* ---- exit ---------------------------------------------------------------------------- */

__attribute__((noinline)) void mistake_leak(void)
{
	open_fixture(0, NULL);
	send_a_to_b(1);
	drain(f.pair.scq[0]);
	drain(f.pair.rcq[1]);
	printf("PASS leak\n");
	exit(0); /* nothing destroyed */
}

/* A correct program: events the way ibv_get_cq_event(3) shows them; nothing to report. */
__attribute__((noinline)) void correct_events(void)
{
	open_fixture(1, NULL);
	struct ibv_cq *cq = f.pair.scq[0], *ev_cq;
	void *ctx;
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	for (int i = 0; i < 20; i++) {
		send_a_to_b((uint64_t)i);
		CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0);
		ibv_ack_cq_events(ev_cq, 1);
		CHECK_OK(ibv_req_notify_cq(ev_cq, 0));
		drain(ev_cq);
	}
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		void (*run)(void);
	} cases[] = {
		{"unacked_events", mistake_unacked_events},
		{"lost_wakeup", mistake_lost_wakeup},
		{"wait_unarmed", mistake_wait_unarmed},
		{"destroy_busy", mistake_destroy_busy},
		{"post_state", mistake_post_state},
		{"wr_limits", mistake_wr_limits},
		{"never_signaled", mistake_never_signaled},
		{"send_queue_full", mistake_send_queue_full},
		{"lkey_deregistered", mistake_lkey_deregistered},
		{"buffer_outside_mr", mistake_buffer_outside_mr},
		{"local_access", mistake_local_access},
		{"remote_access", mistake_remote_access},
		{"atomic", mistake_atomic},
		{"cq_overrun", mistake_cq_overrun},
		{"rnr_retry", mistake_rnr_retry},
		{"leak", mistake_leak},
		{"correct", correct_events},
		{"wr_api", mistake_wr_api},
		{"poll_api", mistake_poll_api},
		{"lost_wakeup_ex", mistake_lost_wakeup_ex},
		{"correct_ex", correct_ex},
		{"wr_outside", mistake_wr_outside},
		/* A peer process (no fixture: the device is opened after the fork). */
		{"peer_rkey", mistake_peer_rkey},
		{"peer_rnr", mistake_peer_rnr},
		{"peer_rd_atomic", mistake_peer_rd_atomic},
	};
	if (argc != 2) {
		fprintf(stderr, "usage: mistakes CASE\n");
		return 2;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (strcmp(argv[1], cases[i].name) != 0)
			continue;
		sv_init(cases[i].name);
		cases[i].run();
		if (!f.dev.ctx) { /* a case with a peer process closed all it opened */
			printf("PASS %s\n", cases[i].name);
			return 0;
		}
		/* What the case left (a CQ in error, QPs in ERR) is closed as it can be. */
		sv_pair_destroy(&f.pair);
		if (f.ch)
			ibv_destroy_comp_channel(f.ch);
		for (int m = 0; m < 2; m++)
			if (f.mr[m])
				sv_free_mr(f.mr[m]);
		ibv_dealloc_pd(f.dev.pd);
		ibv_close_device(f.dev.ctx);
		printf("PASS %s\n", cases[i].name);
		return 0;
	}
	fprintf(stderr, "mistakes: no case %s\n", argv[1]);
	return 2;
}
