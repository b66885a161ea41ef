/*
 * bench/scaling/events.c: completion events with many CQs (bench/scale runs it).
 * Process A has N RC QPs, each with its own receive CQ; process B has N QPs connected to
 * them and sends one SEND at a time, round robin over the N connections, each after A has
 * handled the event of the one before (a token on a socket). In `channel` mode A's N CQs
 * share one completion channel and A sleeps in ibv_get_cq_event; in `epoll` mode every CQ
 * has its own channel and A sleeps in epoll_wait on all N channel fds. A checks that every
 * event names the CQ of the message just sent, exactly once (no event goes missing, none
 * comes twice: the channel fds are quiet at the end), and prints its CPU time per event.
 *
 *   scale_events [-n CQS] [-e EVENTS] [-w WARMUP] channel|epoll   (through `softverbs run`)
 *
 * The first WARMUP events (default 32 per CQ, as many as a receive window has slots) are
 * not measured: a message into a slot never used before costs a page fault, once.
 *
 * Output: "metric value unit" lines.
 */
#include "common.h"

#include <getopt.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>

static int ncqs = 100;
static long nevents = 20000;
static long warmup = -1;
static int epoll_mode;

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct side {
	struct sv_dev dev;
	struct sv_pair_cfg cfg;
	struct ibv_cq *scq;
	struct ibv_cq **rcq;
	struct ibv_comp_channel **ch; /* one (channel mode) or ncqs (epoll mode) */
	struct ibv_qp **qp;
	struct ibv_mr *mr;
};

/* QPs and CQs, connected to the peer's QPs (numbers traded over sock). */
static void open_side(struct side *s, int sock, int target)
{
	sv_open(&s->dev);
	sv_pair_cfg_init(&s->cfg);
	s->cfg.max_send_wr = s->cfg.max_recv_wr = 4;
	s->scq = ibv_create_cq(s->dev.ctx, 4096, NULL, NULL, 0);
	CHECK(s->scq != NULL);
	s->mr = sv_alloc_mr(s->dev.pd, 4096, SV_ACCESS_ALL);
	s->rcq = calloc(ncqs, sizeof(*s->rcq));
	s->qp = calloc(ncqs, sizeof(*s->qp));
	s->ch = calloc(ncqs, sizeof(*s->ch));
	uint32_t *ours = calloc(ncqs, 4), *theirs = calloc(ncqs, 4);
	CHECK(s->rcq && s->qp && s->ch && ours && theirs);
	for (int i = 0; i < ncqs; i++) {
		struct ibv_comp_channel *ch = NULL;
		if (target) {
			if (epoll_mode || i == 0) {
				s->ch[i] = ibv_create_comp_channel(s->dev.ctx);
				CHECKF(s->ch[i] != NULL, "channel #%d: %s", i, strerror(errno));
			}
			ch = s->ch[epoll_mode ? i : 0];
		}
		s->rcq[i] = ibv_create_cq(s->dev.ctx, 8, (void *)(intptr_t)i, ch, 0);
		CHECKF(s->rcq[i] != NULL, "CQ #%d: %s", i, strerror(errno));
		s->qp[i] = sv_create_qp(&s->dev, &s->cfg, s->scq, s->rcq[i], NULL, NULL);
		ours[i] = s->qp[i]->qp_num;
	}
	sv_exchange(sock, ours, theirs, (size_t)ncqs * 4);
	for (int i = 0; i < ncqs; i++)
		sv_connect_remote(s->qp[i], &s->dev, &s->cfg, theirs[i], s->mr, 0, target ? 2 : 0, 64);
	free(ours), free(theirs);
}

static void close_side(struct side *s, int target)
{
	for (int i = 0; i < ncqs; i++) {
		CHECK_OK(ibv_destroy_qp(s->qp[i]));
		CHECK_OK(ibv_destroy_cq(s->rcq[i]));
	}
	if (target)
		for (int i = 0; i < (epoll_mode ? ncqs : 1); i++)
			CHECK_OK(ibv_destroy_comp_channel(s->ch[i]));
	CHECK_OK(ibv_destroy_cq(s->scq));
	sv_free_mr(s->mr);
	sv_close(&s->dev);
	free(s->rcq), free(s->qp), free(s->ch);
}

static void sender(int sock)
{
	struct side s;
	open_side(&s, sock, 0);
	for (long k = 0; k < warmup + nevents; k++) {
		char token;
		CHECK(read(sock, &token, 1) == 1);
		int i = (int)(k % ncqs);
		CHECK_OK(sv_post_send(s.qp[i], k, s.mr, 0, 8, IBV_SEND_SIGNALED));
		struct ibv_wc wc;
		CHECK(sv_poll(s.scq, 1, &wc, SV_WAIT_MS) == 1);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
	}
	sv_say(sock, 9);
	CHECK_EQ(sv_hear(sock), 9);
	close_side(&s, 0);
	exit(0);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "n:e:w:")) != -1) {
		if (c == 'n')
			ncqs = atoi(optarg);
		else if (c == 'e')
			nevents = atol(optarg);
		else if (c == 'w')
			warmup = atol(optarg);
		else
			goto usage;
	}
	if (optind != argc - 1 || ncqs < 1 || nevents < 1)
		goto usage;
	if (warmup < 0)
		warmup = 32L * ncqs;
	if (strcmp(argv[optind], "epoll") == 0)
		epoll_mode = 1;
	else if (strcmp(argv[optind], "channel") != 0)
		goto usage;
	sv_init("scale_events");
	sv_watchdog(600);
	pid_t pid;
	int sock = sv_fork_peer(sender, &pid);
	struct side s;
	open_side(&s, sock, 1);
	int ep = -1;
	if (epoll_mode) {
		ep = epoll_create1(EPOLL_CLOEXEC);
		CHECK(ep >= 0);
		for (int i = 0; i < ncqs; i++) {
			struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
			CHECK_OK(epoll_ctl(ep, EPOLL_CTL_ADD, s.ch[i]->fd, &ev));
		}
	}
	for (int i = 0; i < ncqs; i++)
		CHECK_OK(ibv_req_notify_cq(s.rcq[i], 0));
	long *got = calloc(ncqs, sizeof(long));
	CHECK(got != NULL);

	double cpu0 = cpu_s(), t0 = now_s();
	for (long k = 0; k < warmup + nevents; k++) {
		if (k == warmup)
			cpu0 = cpu_s(), t0 = now_s();
		int want = (int)(k % ncqs);
		CHECK(write(sock, "t", 1) == 1);
		struct ibv_comp_channel *ch = s.ch[0];
		if (epoll_mode) {
			struct epoll_event ev;
			int n;
			while ((n = epoll_wait(ep, &ev, 1, SV_WAIT_MS)) < 0 && errno == EINTR)
				;
			CHECKF(n == 1, "event %ld: epoll_wait returned %d", k, n);
			CHECKF((int)ev.data.u32 == want, "event %ld: channel %u is ready, expected %d",
			       k, ev.data.u32, want);
			ch = s.ch[want];
		}
		struct ibv_cq *cq;
		void *ctx;
		CHECK_OK(ibv_get_cq_event(ch, &cq, &ctx));
		CHECKF(cq == s.rcq[want], "event %ld: CQ %ld, expected %d", k, (long)(intptr_t)ctx,
		       want);
		got[want]++;
		ibv_ack_cq_events(cq, 1);
		CHECK_OK(ibv_req_notify_cq(cq, 0));
		struct ibv_wc wc;
		CHECK_EQ(ibv_poll_cq(cq, 1, &wc), 1);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_OK(sv_post_recv(s.qp[want], wc.wr_id, s.mr, 0, 64));
	}
	double cpu1 = cpu_s(), t1 = now_s();
	CHECK_EQ(sv_hear(sock), 9);
	/* Every event came once: nothing is left on any channel. */
	for (int i = 0; i < (epoll_mode ? ncqs : 1); i++)
		CHECKF(!sv_fd_readable(s.ch[i]->fd, i == 0 ? SV_QUIET_MS : 0),
		       "channel %d has an event left", i);
	long total = warmup + nevents;
	for (int i = 0; i < ncqs; i++)
		CHECKF(got[i] == total / ncqs + (i < total % ncqs),
		       "CQ %d had %ld events", i, got[i]);
	sv_say(sock, 9);
	sv_wait_peer(pid, "sender");
	printf("cqs %d\nmode %s\nevents %ld\nwarmup %ld\n", ncqs, argv[optind], nevents, warmup);
	printf("cpu_per_event %.3f us\nwall_per_event %.3f us\n", (cpu1 - cpu0) * 1e6 / nevents,
	       (t1 - t0) * 1e6 / nevents);
	if (ep >= 0)
		close(ep);
	close_side(&s, 1);
	free(got);
	return 0;
usage:
	fprintf(stderr, "usage: scale_events [-n CQS] [-e EVENTS] [-w WARMUP] channel|epoll\n");
	return 2;
}
