/*
 * channel_fd_poll: a completion channel's fd is a real, pollable fd.
 *
 * - poll() and epoll report it readable exactly while an event is pending: not before the
 *   completion, yes after it, no longer once ibv_get_cq_event consumed the last event;
 *   with two events pending, each ibv_get_cq_event consumes exactly one.
 * - With O_NONBLOCK set by fcntl, ibv_get_cq_event on an empty channel returns -1/EAGAIN.
 * - A blocking ibv_get_cq_event in another thread wakes up when a completion arrives on an
 *   armed CQ.
 */
#include "common.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

static struct sv_fixture f;
static struct ibv_mr *mr_a, *mr_b;

/* One SEND from A to B; both completions are polled and checked. */
static void send_one(uint64_t id)
{
	sv_send_recv(&f.pair, 0, id, mr_a, mr_b, 64, 0, NULL);
}

static int epoll_ready(int ep)
{
	struct epoll_event ev;
	int n = epoll_wait(ep, &ev, 1, 0);
	CHECK(n >= 0);
	return n;
}

struct waiter {
	struct ibv_comp_channel *ch;
	atomic_int *posted; /* set by the main thread just before it posts */
	atomic_int ready;
	int ret;
	int posted_at_return;
	struct ibv_cq *cq;
	void *ctx;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	atomic_store(&w->ready, 1);
	w->ret = ibv_get_cq_event(w->ch, &w->cq, &w->ctx);
	w->posted_at_return = atomic_load(w->posted);
	return NULL;
}

int main(void)
{
	sv_init("channel_fd_poll");
	sv_fixture_open(&f, NULL, 1);
	struct ibv_comp_channel *ch = f.ch;
	CHECK(fcntl(ch->fd, F_GETFL) >= 0);
	mr_a = f.mr[0];
	mr_b = f.mr[1];

	int ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	struct epoll_event eev = { .events = EPOLLIN };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &eev) == 0);

	sv_step("a fresh channel is not readable");
	CHECK(!sv_fd_readable(ch->fd, 0));
	CHECK_EQ(epoll_ready(ep), 0);

	sv_step("arming alone does not make it readable");
	CHECK_OK(ibv_req_notify_cq(f.pair.rcq[1], 0));
	CHECK(!sv_fd_readable(ch->fd, SV_QUIET_MS));
	CHECK_EQ(epoll_ready(ep), 0);

	sv_step("a completion on the armed CQ makes it readable (poll and epoll)");
	send_one(1);
	CHECKF(sv_fd_readable(ch->fd, SV_WAIT_MS), "channel fd not readable after the completion");
	CHECK_EQ(epoll_ready(ep), 1);

	sv_step("ibv_get_cq_event consumes the event; the fd is no longer readable");
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0);
	CHECK(cq == f.pair.rcq[1]);
	CHECK(ctx == &f.pair.rcq[1]);
	ibv_ack_cq_events(cq, 1);
	CHECK(!sv_fd_readable(ch->fd, 0));
	CHECK_EQ(epoll_ready(ep), 0);

	sv_step("O_NONBLOCK: ibv_get_cq_event on an empty channel gives -1/EAGAIN");
	sv_set_nonblock(ch->fd, 1);
	errno = 0;
	CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), -1);
	CHECK_EQ(errno, EAGAIN);

	sv_step("two pending events: readable until both are consumed, one per call");
	CHECK_OK(ibv_req_notify_cq(f.pair.scq[0], 0));
	CHECK_OK(ibv_req_notify_cq(f.pair.rcq[1], 0));
	send_one(2);
	CHECK(sv_fd_readable(ch->fd, SV_WAIT_MS));
	int seen_send = 0, seen_recv = 0;
	for (int i = 0; i < 2; i++) {
		CHECKF(sv_fd_readable(ch->fd, SV_WAIT_MS), "event %d of 2 missing", i + 1);
		CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0);
		CHECK(cq == f.pair.scq[0] || cq == f.pair.rcq[1]);
		CHECK(ctx == cq->cq_context);
		seen_send += cq == f.pair.scq[0];
		seen_recv += cq == f.pair.rcq[1];
		ibv_ack_cq_events(cq, 1);
	}
	CHECK_EQ(seen_send, 1);
	CHECK_EQ(seen_recv, 1);
	CHECK(!sv_fd_readable(ch->fd, SV_QUIET_MS));
	CHECK_EQ(epoll_ready(ep), 0);
	errno = 0;
	CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), -1);
	CHECK_EQ(errno, EAGAIN);
	sv_set_nonblock(ch->fd, 0);

	sv_step("a blocking ibv_get_cq_event in a thread wakes up on a completion");
	atomic_int posted;
	atomic_init(&posted, 0);
	struct waiter w = { .ch = ch, .posted = &posted };
	atomic_init(&w.ready, 0);
	CHECK_OK(ibv_req_notify_cq(f.pair.rcq[1], 0));
	pthread_t th;
	CHECK_OK(pthread_create(&th, NULL, waiter_main, &w));
	while (!atomic_load(&w.ready))
		usleep(100);
	sv_sleep_ms(SV_QUIET_MS); /* let the waiter block in ibv_get_cq_event */
	atomic_store(&posted, 1);
	send_one(3);
	CHECK_OK(pthread_join(th, NULL)); /* the watchdog fails the test if it never wakes */
	CHECK_EQ(w.ret, 0);
	CHECKF(w.posted_at_return == 1, "ibv_get_cq_event returned before anything was posted");
	CHECK(w.cq == f.pair.rcq[1]);
	CHECK(w.ctx == &f.pair.rcq[1]);
	ibv_ack_cq_events(w.cq, 1);
	CHECK(!sv_fd_readable(ch->fd, 0));

	sv_step("teardown");
	close(ep);
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
