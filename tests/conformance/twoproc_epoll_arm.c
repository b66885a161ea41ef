/*
 * The event loop UCX runs in ucp_worker_wait, between two processes: a QP's send and
 * receive CQs on one completion channel whose fd is O_NONBLOCK and sits in the program's
 * own epoll set (edge-triggered); each wait drains the channel without blocking
 * (ibv_get_cq_event until EAGAIN, then ibv_ack_cq_events), arms both CQs and sleeps in
 * epoll_wait, *without polling the CQs after arming*. A message that arrived between the
 * last poll and the arm must still wake it: the arm turns it into a completion of the armed
 * CQ, whose event makes the fd readable. Before that fix, one of the two processes slept
 * with the message in its receive window and the pair hung (ucx_perftest -E sleep did).
 * Ping-pong of SENDs, once with the QPs' own receive queues and once with SRQs.
 * A = this process, B = the forked peer; the same loop on both sides.
 */
#include "common.h"

#include <fcntl.h>
#include <sys/epoll.h>

#define NAME "twoproc_epoll_arm"
#define MSG 8
#define ROUNDS 20000
#define RECVS 8

static int sock;

struct side {
	struct sv_dev dev;
	struct sv_pair_cfg cfg;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	int ep;
	long sleeps;
};

static void side_open(struct side *s, int use_srq)
{
	memset(s, 0, sizeof(*s));
	sv_open(&s->dev);
	sv_pair_cfg_init(&s->cfg);
	s->ch = ibv_create_comp_channel(s->dev.ctx);
	CHECK(s->ch != NULL);
	sv_set_nonblock(s->ch->fd, 1);
	s->scq = sv_create_cq(&s->dev, 64, NULL, s->ch);
	s->rcq = sv_create_cq(&s->dev, 64, NULL, s->ch);
	if (use_srq) {
		struct ibv_srq_init_attr a = {.attr = {.max_wr = 64, .max_sge = 1}};
		s->srq = ibv_create_srq(s->dev.pd, &a);
		CHECK(s->srq != NULL);
	}
	s->qp = sv_create_qp(&s->dev, &s->cfg, s->scq, s->rcq, s->srq, NULL);
	s->mr = sv_alloc_mr(s->dev.pd, 4096, SV_ACCESS_ALL);
	if (s->srq) {
		for (int i = 0; i < RECVS; ++i)
			CHECK_OK(sv_post_srq_recv(s->srq, i, s->mr, (size_t)i * MSG, MSG));
		sv_connect_remote(s->qp, &s->dev, &s->cfg, sv_trade_qpn(sock, s->qp), NULL, 0, 0, MSG);
	} else {
		sv_connect_remote(s->qp, &s->dev, &s->cfg, sv_trade_qpn(sock, s->qp), s->mr, 0, RECVS,
				  MSG);
	}
	s->ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(s->ep >= 0);
	struct epoll_event e = {.events = EPOLLIN | EPOLLET};
	CHECK_OK(epoll_ctl(s->ep, EPOLL_CTL_ADD, s->ch->fd, &e));
}

static void side_close(struct side *s)
{
	close(s->ep);
	CHECK_OK(ibv_destroy_qp(s->qp));
	if (s->srq)
		CHECK_OK(ibv_destroy_srq(s->srq));
	sv_free_mr(s->mr);
	CHECK_OK(ibv_destroy_cq(s->scq));
	CHECK_OK(ibv_destroy_cq(s->rcq));
	CHECK_OK(ibv_destroy_comp_channel(s->ch));
	sv_close(&s->dev);
}

/* Polls both CQs; reposts what was received. Returns the receives. */
static int progress(struct side *s)
{
	struct ibv_wc wc[16];
	int got = 0, n;
	while ((n = ibv_poll_cq(s->scq, 16, wc)) > 0)
		for (int i = 0; i < n; ++i)
			CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
	CHECK(n == 0);
	while ((n = ibv_poll_cq(s->rcq, 16, wc)) > 0)
		for (int i = 0; i < n; ++i) {
			CHECK_EQ(wc[i].status, IBV_WC_SUCCESS);
			size_t off = (size_t)(wc[i].wr_id % RECVS) * MSG;
			if (s->srq)
				CHECK_OK(sv_post_srq_recv(s->srq, wc[i].wr_id, s->mr, off, MSG));
			else
				CHECK_OK(sv_post_recv(s->qp, wc[i].wr_id, s->mr, off, MSG));
			got++;
		}
	CHECK(n == 0);
	return got;
}

/* UCX's wait: progress; drain the channel; arm; sleep (no poll after the arm). */
static void wait_for_receive(struct side *s, int round)
{
	for (;;) {
		if (progress(s))
			return;
		struct ibv_cq *cq;
		void *ctx;
		int events = 0;
		while (ibv_get_cq_event(s->ch, &cq, &ctx) == 0) {
			ibv_ack_cq_events(cq, 1);
			events++;
		}
		CHECK_EQ(errno, EAGAIN);
		if (events)
			continue;
		CHECK_OK(ibv_req_notify_cq(s->scq, 0));
		CHECK_OK(ibv_req_notify_cq(s->rcq, 0));
		struct epoll_event e;
		int r = epoll_wait(s->ep, &e, 1, 5000);
		CHECKF(r == 1, "asleep 5 s with the peer's message due (round %d, %ld sleeps before)",
		       round, s->sleeps);
		s->sleeps++;
	}
}

static void ping_pong(struct side *s, int first)
{
	for (int i = 0; i < ROUNDS; ++i) {
		/* Every other SEND signaled and inline: both CQs of the channel see traffic. */
		unsigned flags = i % 2 ? IBV_SEND_SIGNALED : IBV_SEND_INLINE;
		if (first)
			CHECK_OK(sv_post_send(s->qp, 1000 + i, s->mr, 1024, MSG, flags));
		wait_for_receive(s, i);
		if (!first)
			CHECK_OK(sv_post_send(s->qp, 1000 + i, s->mr, 1024, MSG, flags));
	}
}

static void peer(int s)
{
	sock = s;
	for (int use_srq = 0; use_srq < 2; ++use_srq) {
		struct side side;
		side_open(&side, use_srq);
		sv_say(sock, 1);
		ping_pong(&side, 0);
		CHECK_EQ(sv_hear(sock), 2);
		side_close(&side);
	}
	_exit(0);
}

int main(void)
{
	sv_init(NAME);
	pid_t child;
	sock = sv_fork_peer(peer, &child);
	for (int use_srq = 0; use_srq < 2; ++use_srq) {
		sv_step("%d round trips, each side asleep in its own epoll after arming (%s)", ROUNDS,
			use_srq ? "SRQs" : "receive queues");
		struct side side;
		side_open(&side, use_srq);
		CHECK_EQ(sv_hear(sock), 1);
		ping_pong(&side, 1);
		printf("%s: %d round trips, %ld sleeps here\n", use_srq ? "srq" : "rq", ROUNDS,
		       side.sleeps);
		sv_say(sock, 2);
		side_close(&side);
	}
	sv_pass();
	return 0;
}
