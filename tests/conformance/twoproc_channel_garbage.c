/*
 * A requester that scribbles over our completion channel's ready bits (which CQ a peer's
 * wake-up is for: wire::ReadyBits) must cost us extra looks, never an event. A (this
 * process, the target) has NCQ receive CQs on one completion channel, one RC QP each; B
 * (the forked requester) runs with SOFTVERBS_TEST_READY_GARBAGE, which makes it overwrite
 * the whole block with random words or zeros at every wake-up, after setting its own bit:
 * - one SEND at a time, round robin: each event names the CQ just sent to, exactly once;
 * - two SENDs to two CQs before A waits: one event for each;
 * - a solicited-only arm: a SEND without SE stays silent, one with SE fires;
 * - at the end nothing is left: the channel fd is quiet, every CQ had its events.
 * The channel also has NPAD CQs without traffic, created first: the CQs with traffic come
 * after them, some sharing their bit with one of those (a bit is a slot modulo 1,024).
 */
#include "common.h"

#define NCQ 40
#define NPAD 1000
#define ROUNDS 400
#define PAIRS 100
#define MSG 64
#define NRECV 8

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

struct side {
	struct sv_dev dev;
	struct sv_pair_cfg cfg;
	struct ibv_comp_channel *ch; /* A only */
	struct ibv_cq *scq;
	struct ibv_cq *rcq[NCQ]; /* A only */
	struct ibv_cq *pad[NPAD]; /* A only */
	struct ibv_qp *qp[NCQ];
	struct ibv_mr *mr;
};

static void open_side(struct side *s, int target)
{
	memset(s, 0, sizeof(*s));
	sv_open(&s->dev);
	sv_pair_cfg_init(&s->cfg);
	s->scq = sv_create_cq(&s->dev, 4 * NCQ, NULL, NULL);
	s->mr = sv_alloc_mr(s->dev.pd, (size_t)NRECV * MSG, SV_ACCESS_ALL);
	if (target) {
		s->ch = ibv_create_comp_channel(s->dev.ctx);
		CHECK(s->ch != NULL);
		for (int i = 0; i < NPAD; i++)
			s->pad[i] = sv_create_cq(&s->dev, 1, NULL, s->ch);
	}
	uint32_t ours[NCQ], theirs[NCQ];
	for (int i = 0; i < NCQ; i++) {
		if (target)
			s->rcq[i] = sv_create_cq(&s->dev, 2 * NRECV, (void *)(intptr_t)i, s->ch);
		s->qp[i] = sv_create_qp(&s->dev, &s->cfg, s->scq, target ? s->rcq[i] : s->scq,
					NULL, NULL);
		ours[i] = s->qp[i]->qp_num;
	}
	sv_exchange(sock, ours, theirs, sizeof(ours));
	for (int i = 0; i < NCQ; i++)
		sv_connect_remote(s->qp[i], &s->dev, &s->cfg, theirs[i], s->mr, 0,
				  target ? NRECV : 0, MSG);
}

static void close_side(struct side *s)
{
	for (int i = 0; i < NCQ; i++) {
		CHECK_OK(ibv_destroy_qp(s->qp[i]));
		if (s->rcq[i])
			CHECK_OK(ibv_destroy_cq(s->rcq[i]));
	}
	for (int i = 0; i < NPAD; i++)
		if (s->pad[i])
			CHECK_OK(ibv_destroy_cq(s->pad[i]));
	if (s->ch)
		CHECK_OK(ibv_destroy_comp_channel(s->ch));
	CHECK_OK(ibv_destroy_cq(s->scq));
	sv_free_mr(s->mr);
	sv_close(&s->dev);
}

/* B: for each number A says, a SEND on that QP (a negative one: with SE), until A says
 * NCQ. */
static void requester(int s)
{
	sock = s;
	CHECK_OK(setenv("SOFTVERBS_TEST_READY_GARBAGE", "0x9e3779b97f4a7c15", 1));
	struct side b;
	open_side(&b, 0);
	uint64_t id = 0;
	for (int v; (v = hear()) != NCQ;) {
		int i = v < 0 ? -v - 1 : v;
		CHECK_OK(sv_post_send(b.qp[i], id++, b.mr, 0, MSG,
				      IBV_SEND_SIGNALED | (v < 0 ? IBV_SEND_SOLICITED : 0)));
		struct ibv_wc wc;
		CHECK(sv_poll(b.scq, 1, &wc, SV_WAIT_MS) == 1);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		say(0);
	}
	close_side(&b);
	_exit(0);
}

static struct side a;
static long got[NCQ], sent[NCQ];

/* B sends one SEND to CQ i (with SE if `solicited`) and has it completed. */
static void send_to(int i, int solicited)
{
	say(solicited ? -i - 1 : i);
	CHECK_EQ(hear(), 0);
	sent[i]++;
}

/* The next event: its CQ's number, acked, the CQ re-armed (`solicited_only`). */
static int next_event(int solicited_only)
{
	struct ibv_cq *cq;
	void *ctx;
	CHECKF(sv_wait_cq_event(a.ch, SV_WAIT_MS, &cq, &ctx), "no event within %d ms",
	       SV_WAIT_MS);
	int i = (int)(intptr_t)ctx;
	CHECK(i >= 0 && i < NCQ && cq == a.rcq[i]);
	ibv_ack_cq_events(cq, 1);
	CHECK_OK(ibv_req_notify_cq(cq, solicited_only));
	got[i]++;
	return i;
}

/* Polls the n completions CQ i must hold, posting a receive for each. */
static void take(int i, int n)
{
	for (int k = 0; k < n; k++) {
		struct ibv_wc wc;
		CHECK(sv_poll(a.rcq[i], 1, &wc, SV_WAIT_MS) == 1);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_OK(sv_post_recv(a.qp[i], wc.wr_id, a.mr, wc.wr_id * MSG, MSG));
	}
	sv_expect_empty(a.rcq[i], "a receive CQ after its completions");
}

int main(void)
{
	sv_init("twoproc_channel_garbage");
	sv_watchdog(30); /* a lost event hangs in ibv_get_cq_event: say so before ctest does */
	pid_t child;
	sock = sv_fork_peer(requester, &child);
	open_side(&a, 1);
	for (int i = 0; i < NCQ; i++)
		CHECK_OK(ibv_req_notify_cq(a.rcq[i], 0));

	sv_step("one SEND at a time, round robin over %d CQs: one event each", NCQ);
	for (int k = 0; k < ROUNDS; k++) {
		int want = k % NCQ;
		send_to(want, 0);
		int i = next_event(0);
		CHECKF(i == want, "round %d: an event for CQ %d, expected %d", k, i, want);
		take(i, 1);
	}

	sv_step("two SENDs to two CQs, then two events, one for each");
	for (int k = 0; k < PAIRS; k++) {
		int x = k % NCQ, y = (k + NCQ / 2 + 1) % NCQ;
		send_to(x, 0);
		send_to(y, 0);
		int i = next_event(0), j = next_event(0);
		CHECKF((i == x && j == y) || (i == y && j == x),
		       "pair %d: events for CQs %d and %d, expected %d and %d", k, i, j, x, y);
		take(x, 1);
		take(y, 1);
	}

	sv_step("solicited-only: silent without SE, one event with it");
	send_to(3, 0);
	CHECK_EQ(next_event(1), 3); /* re-armed solicited-only */
	take(3, 1);
	send_to(3, 0);
	sv_expect_no_cq_event(a.ch, "a solicited-only CQ and a SEND without SE");
	send_to(3, 1);
	CHECK_EQ(next_event(0), 3);
	take(3, 2);

	sv_step("nothing left: the channel is quiet, every CQ had its events");
	say(NCQ);
	sv_wait_peer(child, "the requester");
	CHECKF(!sv_fd_readable(a.ch->fd, SV_QUIET_MS), "the channel has an event left");
	for (int i = 0; i < NCQ; i++) {
		long want = sent[i] - (i == 3); /* one SEND without SE to a solicited-only arm */
		CHECKF(got[i] == want, "CQ %d had %ld events, expected %ld", i, got[i], want);
	}
	close_side(&a);
	sv_pass();
	return 0;
}
