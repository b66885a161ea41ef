/*
 * The requester's window into a same-host peer's receive queue (issue 14, item 3), as
 * `softverbs stat --json` reports it (peer_window) for the requester's QP:
 *  - opened by ibv_modify_qp to RTS when the target is at RTR by then, so that the first
 *    SEND does not wait for the target's agent (which may share a pinned, spinning
 *    target's CPU);
 *  - when the target is not at RTR yet, asked for again at the first SEND, and the SENDs
 *    all take the window (a failed ask at RTS sets no backoff that would send the next
 *    ones through the agent);
 *  - a target that does not poll: the 33rd SEND finds the 32-slot ring full and goes
 *    through the target's agent, counted as such; every receive still completes in order.
 * Counts only, never time. Parent: the target (two QPs); child: the requester.
 */
#include "common.h"

#define FILL 40 /* more SENDs than the ring's 32 slots */
#define LATE 8
#define LEN 8

static int sock;

/* The requester QP's peer_window counts, read with `softverbs stat --json` on ourselves. */
struct counts {
	long rts, post, failed, no_window, ring_full, via_agent;
};

static struct counts window_counts(const struct ibv_qp *qp)
{
	const char *tool = getenv("SV_SOFTVERBS");
	CHECKF(tool && *tool, "SV_SOFTVERBS names the softverbs command");
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
		 "%s stat --json %d | python3 -c '"
		 "import json, sys\n"
		 "d = json.load(sys.stdin)\n"
		 "w = [q for p in d[\"processes\"] for q in p[\"qps\"] if q[\"qp_num\"] == %u][0][\"peer_window\"]\n"
		 "v = w[\"sends_via_agent\"]\n"
		 "print(w[\"opened_at_rts\"], w[\"opened_at_post\"], w[\"open_failed\"], v[\"no_window\"],"
		 " v[\"ring_full\"], sum(v.values()))'",
		 tool, (int)getpid(), qp->qp_num);
	fflush(stdout);
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL);
	struct counts c;
	int got = fscanf(f, "%ld %ld %ld %ld %ld %ld", &c.rts, &c.post, &c.failed, &c.no_window,
			 &c.ring_full, &c.via_agent);
	int rc = pclose(f);
	CHECKF(got == 6 && rc == 0, "%s: read %d counts, exit %d", cmd, got, rc);
	printf("   qp %u: opened at RTS %ld, at a post %ld, failed %ld; via the agent %ld "
	       "(no window %ld, ring full %ld)\n",
	       qp->qp_num, c.rts, c.post, c.failed, c.via_agent, c.no_window, c.ring_full);
	return c;
}

#define ANY (-1L)

/* Checks the counts of qp's window that are not ANY (on this host only); returns them. */
static struct counts expect(const struct ibv_qp *qp, long rts, long post, long failed,
			    long via_agent)
{
	struct counts c = {0, 0, 0, 0, 0, 0};
	if (sv_peer_on_other_host())
		return c;
	c = window_counts(qp);
	CHECKF((rts == ANY || c.rts == rts) && (post == ANY || c.post == post) &&
	       (failed == ANY || c.failed == failed) && (via_agent == ANY || c.via_agent == via_agent),
	       "qp %u: want opened at RTS %ld, at a post %ld, failed %ld, via the agent %ld (-1: any)",
	       qp->qp_num, rts, post, failed, via_agent);
	return c;
}

static void send_all(struct sv_one_qp *r, int n)
{
	struct ibv_wc wc;
	for (int i = 0; i < n; i++) {
		CHECK_OK(sv_post_send(r->qp, (uint64_t)i, r->mr, 0, LEN, IBV_SEND_SIGNALED));
		sv_expect_wc(r->cq, (uint64_t)i, IBV_WC_SUCCESS, r->qp, &wc);
	}
}

static void requester(int s)
{
	sock = s;
	struct sv_one_qp a, b;
	sv_one_qp_open(&a, NULL, 64, 4096);
	sv_one_qp_open(&b, NULL, 64, 4096);
	uint32_t peer_a = sv_trade_qpn(sock, a.qp), peer_b = sv_trade_qpn(sock, b.qp);

	/* The target's QP A is at RTS already: our RTS opens the window. */
	CHECK_EQ(sv_hear(sock), 1);
	sv_one_qp_connect(&a, peer_a, 0, 0, 0);
	expect(a.qp, 1, 0, 0, 0);
	send_all(&a, FILL);
	struct counts c = expect(a.qp, 1, 0, 0, ANY);
	CHECKF(sv_peer_on_other_host() || (c.ring_full >= 1 && c.via_agent == c.ring_full),
	       "the SENDs past the full ring, and only they, went through the agent");
	sv_say(sock, 2);

	/* The target's QP B is still in RESET: our RTS gets no window, the first SEND does. */
	sv_one_qp_connect(&b, peer_b, 0, 0, 0);
	expect(b.qp, 0, 0, 1, 0);
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 4);
	send_all(&b, LATE);
	expect(b.qp, 0, 1, 1, 0);
	sv_say(sock, 5);
	CHECK_EQ(sv_hear(sock), 6);
	sv_one_qp_close(&a);
	sv_one_qp_close(&b);
	_exit(0);
}

static void expect_receives(struct ibv_cq *cq, int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc;
		CHECKF(sv_poll(cq, 1, &wc, SV_WAIT_MS) == 1, "receive %d did not complete", i);
		CHECKF(wc.wr_id == (uint64_t)i, "receive %d completed as #%llu: out of order", i,
		       (unsigned long long)wc.wr_id);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, LEN);
	}
	sv_expect_empty(cq, "no more receives");
}

int main(void)
{
	sv_init("twoproc_window_at_rts");
	pid_t child;
	sock = sv_fork_peer(requester, &child);

	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = 64;
	struct sv_one_qp a, b;
	sv_one_qp_open(&a, &cfg, 128, 4096);
	sv_one_qp_open(&b, &cfg, 128, 4096);
	uint32_t peer_a = sv_trade_qpn(sock, a.qp), peer_b = sv_trade_qpn(sock, b.qp);

	sv_step("target at RTS before the requester's RTS; %d SENDs, not polled until all are in", FILL);
	sv_one_qp_connect(&a, peer_a, 0, 64, 64);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 2);
	expect_receives(a.cq, FILL);

	sv_step("requester at RTS before the target's RTR; %d SENDs after it", LATE);
	CHECK_EQ(sv_hear(sock), 3);
	sv_one_qp_connect(&b, peer_b, 0, 64, 64);
	sv_say(sock, 4);
	CHECK_EQ(sv_hear(sock), 5);
	expect_receives(b.cq, LATE);

	sv_step("teardown");
	sv_say(sock, 6);
	sv_wait_peer(child, "the requester");
	sv_one_qp_close(&a);
	sv_one_qp_close(&b);
	sv_pass();
	return 0;
}
