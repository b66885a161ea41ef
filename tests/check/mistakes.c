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
	CHECK_OK(ibv_req_notify_cq(cq, 0)); /* ... when the CQ is armed: no event for it */
	struct later l = {2000, send_again, NULL, 0};
	later_start(&l);
	CHECK(ibv_get_cq_event(f.ch, &ev_cq, &ctx) == 0); /* only the second send wakes it */
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
