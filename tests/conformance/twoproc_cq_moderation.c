/*
 * twoproc_cq_moderation: CQ moderation (ibv_modify_cq, IBV_CQ_ATTR_MODERATE) on a CQ that
 * another process feeds (same host: its messages in our receive windows; between hosts:
 * RoCE v2 packets our port receives), with the semantics mlx5 gives it:
 * - an armed moderated CQ raises one event for a burst of cq_count completions, and not
 *   before the cq_count-th unless the period passed (checked without timing: when the
 *   event comes, either cq_count completions are there or the period has gone by);
 * - fewer completions than cq_count still fire, once the period is over (never earlier);
 * - idle and armed, a moderated CQ costs no CPU (the period is a timer, not a spin) and
 *   raises nothing;
 * - a solicited-only arm counts the solicited completions;
 * - the QP's flushed receives (error completions) fire it;
 * - one event per arm throughout: the channel is empty after each.
 * A = this process (target, receive CQ on a channel), B = the forked peer (requester).
 */
#include "common.h"

#include <time.h>

#define MSG 64
#define NRECV 16
#define COUNT 4

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static long long now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* B: each step, A says how many SENDs it wants back to back (v >> 1) and whether with the
 * SE bit (v & 1); B posts them, waits for their completions and says v back. 0 ends. */
static void requester(int s)
{
	sock = s;
	struct sv_one_qp r;
	sv_requester_open(&r, sock);
	struct ibv_wc wc;
	uint64_t id = 100;
	for (int v; (v = hear()) != 0;) {
		int n = v >> 1;
		unsigned flags = IBV_SEND_SIGNALED | ((v & 1) ? IBV_SEND_SOLICITED : 0);
		for (int i = 0; i < n; i++)
			CHECK_OK(sv_post_send(r.qp, id + i, r.mr, 0, MSG, flags));
		for (int i = 0; i < n; i++)
			sv_expect_wc(r.cq, id + i, IBV_WC_SUCCESS, r.qp, &wc);
		id += n;
		say(v);
	}
	sv_one_qp_close(&r);
	_exit(0);
}

/* Asks B for n SENDs (with SE if solicited) and waits until they are out. */
static void peer_sends(int n, int solicited)
{
	int v = n << 1 | (solicited ? 1 : 0);
	say(v);
	CHECK_EQ(hear(), v);
}

static void set_moderation(struct ibv_cq *cq, uint16_t count, uint16_t period_us)
{
	struct ibv_modify_cq_attr attr = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					   .moderate = { .cq_count = count,
							 .cq_period = period_us } };
	CHECK_OK(ibv_modify_cq(cq, &attr));
}

/* Takes every completion there is now, checking they are the next receives in order;
 * returns how many. */
static int take_all(struct ibv_cq *cq, struct ibv_qp *qp, uint64_t *next_id)
{
	int got = 0;
	struct ibv_wc wc;
	while (ibv_poll_cq(cq, 1, &wc) == 1) {
		CHECKF(wc.status == IBV_WC_SUCCESS && wc.wr_id == *next_id && wc.qp_num == qp->qp_num,
		       "completion %llu: status %d wr_id %llu", (unsigned long long)*next_id,
		       wc.status, (unsigned long long)wc.wr_id);
		++*next_id;
		got++;
	}
	return got;
}

int main(void)
{
	sv_init("twoproc_cq_moderation");
	pid_t child;
	sock = sv_fork_peer(requester, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_device_attr_ex ax;
	CHECK_OK(ibv_query_device_ex(dev.ctx, NULL, &ax));
	const uint16_t max_period = ax.cq_mod_caps.max_cq_period;
	CHECKF(ax.cq_mod_caps.max_cq_count >= COUNT && max_period >= 1000,
	       "cq_mod_caps %u/%u", ax.cq_mod_caps.max_cq_count, max_period);

	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(dev.ctx);
	CHECK(ch != NULL);
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, 32, NULL, ch);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), mr, 0, NRECV, MSG);
	uint64_t next_id = 0;
	int events = 0;

	sv_step("cq_count completions in a burst: one event, not before the count or the period");
	set_moderation(rcq, COUNT, max_period);
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	long long t0 = now_us();
	peer_sends(COUNT, 0);
	sv_expect_cq_event(ch, rcq);
	events++;
	long long waited = now_us() - t0;
	int got = take_all(rcq, qp, &next_id);
	CHECKF(got >= COUNT || waited >= max_period,
	       "the event came with %d of %d completions after %lld us (period %u us)", got,
	       COUNT, waited, max_period);
	while (got < COUNT) {
		struct ibv_wc wc;
		sv_expect_wc(rcq, next_id++, IBV_WC_SUCCESS, qp, &wc);
		got++;
	}
	sv_expect_no_cq_event(ch, "a second event for the same arm");

	sv_step("fewer than cq_count: the event still comes, once the period is over");
	set_moderation(rcq, 100, 1000);
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	t0 = now_us();
	peer_sends(1, 0);
	sv_expect_cq_event(ch, rcq);
	events++;
	waited = now_us() - t0;
	CHECKF(waited >= 1000, "the event came %lld us after the send was asked, period 1000 us",
	       waited);
	CHECK_EQ(take_all(rcq, qp, &next_id), 1);
	CHECKF(!sv_fd_readable(ch->fd, 0), "the fd is readable with no event pending");

	sv_step("armed, moderated and idle: no event and no CPU used");
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	double cpu = sv_cpu_seconds(getpid()) + sv_cpu_seconds(child);
	sv_expect_no_cq_event(ch, "an armed moderated CQ nothing came for");
	sv_fd_readable(ch->fd, 300);
	cpu = sv_cpu_seconds(getpid()) + sv_cpu_seconds(child) - cpu;
	CHECKF(cpu < 0.1, "the two processes used %.2f s of CPU in 0.5 s of idling", cpu);
	peer_sends(1, 0);
	sv_expect_cq_event(ch, rcq);
	events++;
	CHECK_EQ(take_all(rcq, qp, &next_id), 1);

	sv_step("solicited-only and moderated: counts the solicited completions");
	set_moderation(rcq, 2, max_period);
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	peer_sends(1, 0);
	sv_expect_no_cq_event(ch, "a solicited-only CQ and a SEND without SE");
	t0 = now_us();
	peer_sends(2, 1);
	sv_expect_cq_event(ch, rcq);
	events++;
	waited = now_us() - t0;
	got = take_all(rcq, qp, &next_id);
	CHECKF(got >= 3 || waited >= max_period,
	       "the event came with %d completions after %lld us (period %u us)", got, waited,
	       max_period);
	while (got < 3) {
		struct ibv_wc wc;
		sv_expect_wc(rcq, next_id++, IBV_WC_SUCCESS, qp, &wc);
		got++;
	}
	sv_expect_no_cq_event(ch, "a second event for the same arm");

	sv_step("the QP in error: its flushed receives fire the moderated CQ");
	set_moderation(rcq, 100, max_period);
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	CHECK_OK(sv_modify_state(qp, IBV_QPS_ERR));
	sv_expect_cq_event(ch, rcq);
	events++;
	for (; next_id < NRECV; next_id++) {
		struct ibv_wc wc;
		sv_expect_wc(rcq, next_id, IBV_WC_WR_FLUSH_ERR, qp, &wc);
	}
	sv_expect_no_cq_event(ch, "a second event for the same arm");
	printf("%d events for %d completions\n", events, NRECV);

	sv_step("teardown");
	say(0);
	sv_wait_peer(child, "the peer");
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	sv_pass();
	return 0;
}
