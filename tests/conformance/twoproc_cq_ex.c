/*
 * Extended CQs between two processes (or two hosts, tests/hosts/twoproc.sh): every
 * ibv_wc_read_* against what ibv_poll_cq returns for the same completions. Both sides use one
 * CQ made by ibv_create_cq_ex (standard flags and both timestamps); every operation runs
 * twice, identically: round 0 is polled with ibv_poll_cq(ibv_cq_ex_to_cq(cq)), round 1 with
 * ibv_start_poll/ibv_next_poll/ibv_end_poll, and the two are compared field by field (on an
 * error status only wr_id, status, qp_num and vendor_err are defined). Round 1's timestamps
 * must lie between ibv_query_rt_values_ex's raw clock (and CLOCK_REALTIME) read before the
 * operation and after the poll, in order. A = requester (parent), B = responder (child), whose
 * CQ also has a completion channel: one round-1 receive arrives through an event.
 */
#include "common.h"

#include <time.h>

#define MSG 64
#define LARGE (16 * 1024)
#define WC_FLAGS                                                                    \
	(IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |              \
	 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static int sock;
static struct sv_dev dev;
static struct sv_pair_cfg cfg;
static struct ibv_cq_ex *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static struct sv_remote peer;

static uint64_t raw_clock(void)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK_OK(ibv_query_rt_values_ex(dev.ctx, &v));
	CHECK_EQ(v.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
	return (uint64_t)v.raw_clock.tv_sec * 1000000000u + (uint64_t)v.raw_clock.tv_nsec;
}

static uint64_t wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The current completion of a poll pass, as an ibv_wc, with its timestamps. */
static void read_current(struct ibv_wc *wc, uint64_t *ts, uint64_t *wall)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = cq->wr_id;
	wc->status = cq->status;
	wc->opcode = ibv_wc_read_opcode(cq);
	wc->vendor_err = ibv_wc_read_vendor_err(cq);
	wc->byte_len = ibv_wc_read_byte_len(cq);
	wc->imm_data = ibv_wc_read_imm_data(cq);
	CHECK_EQ(ibv_wc_read_invalidated_rkey(cq), (uint32_t)wc->imm_data);
	wc->qp_num = ibv_wc_read_qp_num(cq);
	wc->src_qp = ibv_wc_read_src_qp(cq);
	wc->wc_flags = ibv_wc_read_wc_flags(cq);
	wc->slid = (uint16_t)ibv_wc_read_slid(cq);
	wc->sl = ibv_wc_read_sl(cq);
	wc->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
	*ts = ibv_wc_read_completion_ts(cq);
	*wall = ibv_wc_read_completion_wallclock_ns(cq);
	/* Not asked for, and not meaningful on this device: zero, never a crash. */
	CHECK_EQ(ibv_wc_read_cvlan(cq), 0);
	CHECK_EQ(ibv_wc_read_flow_tag(cq), 0);
}

/* Collects n completions with the poll API: start_poll (ENOENT while empty), then next_poll
 * for the rest of the pass, end_poll after every pass that started. */
static void ex_collect(int n, struct ibv_wc *wc, uint64_t *ts, uint64_t *wall)
{
	long long deadline = sv_now_ms() + SV_WAIT_MS;
	int got = 0;
	while (got < n) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(cq, &attr);
		if (rc == ENOENT) {
			CHECKF(sv_now_ms() < deadline, "%d of %d completions after %d ms", got, n,
			       SV_WAIT_MS);
			continue;
		}
		CHECK_EQ(rc, 0);
		read_current(&wc[got], &ts[got], &wall[got]);
		got++;
		while (got < n && (rc = ibv_next_poll(cq)) == 0) {
			read_current(&wc[got], &ts[got], &wall[got]);
			got++;
		}
		CHECKF(got == n || rc == ENOENT, "ibv_next_poll returned %d", rc);
		ibv_end_poll(cq);
	}
}

/* Round 0's completion (ibv_poll_cq) against round 1's (ibv_wc_read_*). */
static void compare(const struct ibv_wc *p, const struct ibv_wc *x, const char *what)
{
	CHECKF(p->wr_id == x->wr_id && p->status == x->status && p->qp_num == x->qp_num &&
		       p->vendor_err == x->vendor_err,
	       "%s: poll_cq says wr_id %llu %s qp %u vendor_err %u, the readers %llu %s qp %u %u",
	       what, (unsigned long long)p->wr_id, sv_wc_status_name(p->status), p->qp_num,
	       p->vendor_err, (unsigned long long)x->wr_id, sv_wc_status_name(x->status),
	       x->qp_num, x->vendor_err);
	if (p->status != IBV_WC_SUCCESS)
		return;
	CHECK_EQ(x->opcode, p->opcode);
	CHECK_EQ(x->byte_len, p->byte_len);
	CHECK_EQ(x->wc_flags, p->wc_flags);
	if (p->wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV))
		CHECK_EQ(x->imm_data, p->imm_data);
	CHECK_EQ(x->src_qp, p->src_qp);
	CHECK_EQ(x->slid, p->slid);
	CHECK_EQ(x->sl, p->sl);
	CHECK_EQ(x->dlid_path_bits, p->dlid_path_bits);
}

/* Polls n completions twice: round 0 (ibv_poll_cq) was generated before `after0` was said;
 * round 1 is polled with the readers, within [clock before, clock after], then compared. */
struct round1 {
	uint64_t raw0, wall0;
};
static void start_round1(struct round1 *r)
{
	r->raw0 = raw_clock();
	r->wall0 = wall_ns();
}
static void finish_round1(const struct round1 *r, int n, const struct ibv_wc *p, const char *what)
{
	struct ibv_wc x[8];
	uint64_t ts[8], wall[8];
	CHECK(n <= 8);
	ex_collect(n, x, ts, wall);
	uint64_t raw1 = raw_clock(), wall1 = wall_ns();
	for (int i = 0; i < n; i++) {
		compare(&p[i], &x[i], what);
		CHECKF(r->raw0 <= ts[i] && ts[i] <= raw1,
		       "%s #%d: completion_ts %llu outside [%llu, %llu]", what, i,
		       (unsigned long long)ts[i], (unsigned long long)r->raw0,
		       (unsigned long long)raw1);
		CHECKF(r->wall0 <= wall[i] && wall[i] <= wall1,
		       "%s #%d: wallclock %llu outside [%llu, %llu]", what, i,
		       (unsigned long long)wall[i], (unsigned long long)r->wall0,
		       (unsigned long long)wall1);
		if (i > 0)
			CHECKF(ts[i] >= ts[i - 1], "%s: timestamps out of order", what);
	}
}

/* The device, a channel (B only), one extended CQ for both queues, an RC QP connected to
 * the peer's and a 1 MiB MR with all access rights. */
static void open_side(int with_channel)
{
	sv_open(&dev);
	sv_pair_cfg_init(&cfg);
	if (with_channel) {
		ch = ibv_create_comp_channel(dev.ctx);
		CHECK(ch != NULL);
	}
	struct ibv_cq_init_attr_ex attr = {
		.cqe = 64,
		.cq_context = &cq,
		.channel = ch,
		.wc_flags = WC_FLAGS,
	};
	cq = ibv_create_cq_ex(dev.ctx, &attr);
	CHECK(cq != NULL);
	CHECK(ibv_cq_ex_to_cq(cq)->cqe >= 64);
	qp = sv_create_qp(&dev, &cfg, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), NULL, NULL);
	mr = sv_alloc_mr(dev.pd, 1 << 20, SV_ACCESS_ALL);
	sv_trade_remote(sock, qp, mr, &peer);
	sv_connect_remote(qp, &dev, &cfg, peer.qpn, NULL, 0, 0, 0);
}

static void close_side(void)
{
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)));
	if (ch)
		CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
}

/* What each step is: the requester's WR, how many, and whether B receives something. */
struct step {
	const char *name;
	enum ibv_wr_opcode op;
	uint32_t len;
	int n;
	int b_receives; /* B gets a receive completion per WR */
};
static const struct step steps[] = {
	{ "SEND", IBV_WR_SEND, MSG, 3, 1 },
	{ "SEND larger than a window slot", IBV_WR_SEND, LARGE, 2, 1 },
	{ "SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM, MSG, 2, 1 },
	{ "RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM, MSG, 2, 1 },
	{ "RDMA_WRITE", IBV_WR_RDMA_WRITE, 4096, 2, 0 },
	{ "RDMA_READ", IBV_WR_RDMA_READ, 4096, 2, 0 },
	{ "ATOMIC_CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP, 8, 2, 0 },
	{ "ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 2, 0 },
};
#define NSTEPS ((int)(sizeof(steps) / sizeof(steps[0])))
#define STEP_ERROR NSTEPS /* then two rounds of a bad rkey */

static void post_step(const struct step *s, int i, uint64_t wr_id)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, wr_id, s->op, mr, (size_t)i * 8192, s->len, IBV_SEND_SIGNALED);
	wr.imm_data = htobe32(0xc0de0000u + (uint32_t)i);
	if (s->op == IBV_WR_ATOMIC_CMP_AND_SWP || s->op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = peer.addr + 65536;
		wr.wr.atomic.rkey = peer.rkey;
		wr.wr.atomic.compare_add = 1;
		wr.wr.atomic.swap = 2;
	} else if (s->op != IBV_WR_SEND && s->op != IBV_WR_SEND_WITH_IMM) {
		wr.wr.rdma.remote_addr = peer.addr + 131072 + (uint64_t)i * 8192;
		wr.wr.rdma.rkey = peer.rkey;
	}
	CHECK_OK(ibv_post_send(qp, &wr, &bad));
}

static void responder(int s)
{
	sock = s;
	open_side(1);

	for (int k = 0; k < NSTEPS; k++) {
		const struct step *st = &steps[k];
		CHECK_EQ(sv_hear(sock), k);
		struct ibv_wc p[8];
		if (st->b_receives)
			for (int i = 0; i < 2 * st->n; i++)
				CHECK_OK(sv_post_recv(qp, 1000 + k * 10 + i % st->n, mr,
						      (size_t)i * LARGE, LARGE));
		sv_say(sock, k);
		if (st->b_receives)
			CHECK_EQ(sv_poll(ibv_cq_ex_to_cq(cq), st->n, p, SV_WAIT_MS), st->n);
		struct round1 r;
		start_round1(&r);
		/* The first SEND of round 1 wakes us through the channel. */
		if (k == 0)
			CHECK_OK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0));
		sv_say(sock, 100 + k);
		if (k == 0)
			sv_expect_cq_event(ch, ibv_cq_ex_to_cq(cq));
		if (st->b_receives)
			finish_round1(&r, st->n, p, st->name);
		CHECK_EQ(sv_hear(sock), 200 + k);
	}
	for (int round = 0; round < 2; round++) {
		CHECK_EQ(sv_hear(sock), STEP_ERROR + round);
		CHECK_OK(sv_post_recv(qp, 7000, mr, 0, MSG));
		struct round1 r;
		start_round1(&r);
		sv_say(sock, STEP_ERROR + round);
		sv_expect_async(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, qp);
		static struct ibv_wc flushed;
		if (round == 0) {
			sv_expect_wc(ibv_cq_ex_to_cq(cq), 7000, IBV_WC_WR_FLUSH_ERR, qp, &flushed);
		} else {
			finish_round1(&r, 1, &flushed, "a flushed receive");
		}
		sv_drain_async(dev.ctx, 0);
		CHECK_OK(sv_modify_state(qp, IBV_QPS_RESET));
		sv_connect_remote(qp, &dev, &cfg, peer.qpn, NULL, 0, 0, 0);
		sv_say(sock, 300 + round);
		CHECK_EQ(sv_hear(sock), 300 + round);
	}
	CHECK_EQ(sv_hear(sock), 999);
	close_side();
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_cq_ex");
	pid_t child;
	sock = sv_fork_peer(responder, &child);
	open_side(0);

	for (int k = 0; k < NSTEPS; k++) {
		const struct step *st = &steps[k];
		sv_step("%s, %d of them, both rounds", st->name, st->n);
		sv_say(sock, k);
		CHECK_EQ(sv_hear(sock), k);
		struct ibv_wc p[8];
		for (int i = 0; i < st->n; i++)
			post_step(st, i, 100 + k * 10 + i);
		CHECK_EQ(sv_poll(ibv_cq_ex_to_cq(cq), st->n, p, SV_WAIT_MS), st->n);
		CHECK_EQ(sv_hear(sock), 100 + k);
		struct round1 r;
		start_round1(&r);
		for (int i = 0; i < st->n; i++)
			post_step(st, i, 100 + k * 10 + i);
		finish_round1(&r, st->n, p, st->name);
		sv_say(sock, 200 + k);
	}

	static struct ibv_wc first[2];
	for (int round = 0; round < 2; round++) {
		sv_step("RDMA WRITE with a bad rkey and a SEND behind it, round %d", round);
		sv_say(sock, STEP_ERROR + round);
		CHECK_EQ(sv_hear(sock), STEP_ERROR + round);
		struct round1 r;
		start_round1(&r);
		struct ibv_send_wr wr, next, *bad = NULL;
		struct ibv_sge sge, nsge;
		sv_wr_init(&wr, &sge, 5000, IBV_WR_RDMA_WRITE, mr, 0, MSG, IBV_SEND_SIGNALED);
		wr.wr.rdma.remote_addr = peer.addr;
		wr.wr.rdma.rkey = peer.rkey ^ 0x00a5a500;
		sv_wr_init(&next, &nsge, 5001, IBV_WR_SEND, mr, 0, 8,
			   IBV_SEND_SIGNALED | IBV_SEND_FENCE);
		wr.next = &next;
		CHECK_OK(ibv_post_send(qp, &wr, &bad));
		if (round == 0) {
			sv_expect_wc(ibv_cq_ex_to_cq(cq), 5000, IBV_WC_REM_ACCESS_ERR, qp, &first[0]);
			sv_expect_wc(ibv_cq_ex_to_cq(cq), 5001, IBV_WC_WR_FLUSH_ERR, qp, &first[1]);
		} else {
			finish_round1(&r, 2, first, "a remote access error and a flush");
		}
		CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);
		sv_drain_async(dev.ctx, 0);
		CHECK_OK(sv_modify_state(qp, IBV_QPS_RESET));
		sv_connect_remote(qp, &dev, &cfg, peer.qpn, NULL, 0, 0, 0);
		CHECK_EQ(sv_hear(sock), 300 + round);
		sv_say(sock, 300 + round);
	}

	sv_step("ENOENT on an empty CQ; end_poll after it is harmless");
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	CHECK_EQ(ibv_start_poll(cq, &attr), ENOENT);
	ibv_end_poll(cq);
	struct ibv_wc wc;
	CHECK_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc), 0);

	sv_say(sock, 999);
	sv_wait_peer(child, "responder");
	close_side();
	sv_pass();
	return 0;
}
