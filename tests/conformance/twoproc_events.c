/*
 * Completion events when the completions come from another process (receive windows):
 * - an armed CQ's channel fd becomes readable for a peer's SEND, and once the event is
 *   taken and the CQ polled, the fd is not readable and a non-blocking ibv_get_cq_event
 *   says EAGAIN (ibv_get_cq_event(3): the fd is readable exactly while an event waits);
 * - an unarmed CQ stays silent; a solicited-only one ignores a SEND without the SE bit and
 *   fires for one with it (ibv_req_notify_cq(3));
 * - while nothing happens, neither process uses the CPU (no thread spins by default);
 * - a peer that zeroes every shared page of ours and dies cannot take our events with it:
 *   the QP's flushed receive still fires the armed CQ.
 * A = this process (target), B = the forked peer (requester).
 */
#include "common.h"

#include <fcntl.h>

#define MSG 64

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* For sv_each_fd: zeroes the fd if it is an arena, counting it in *(int *)arg. */
static int zero_if_arena(const char *path, const char *target, void *arg)
{
	int *found = arg;
	if (!strstr(target, "memfd:softverbs-arena"))
		return 0;
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	off_t size = lseek(fd, 0, SEEK_END);
	CHECK_OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size));
	close(fd);
	(*found)++;
	return 0;
}

/* Zeroes the shared arena of process `pid` (what a peer may write), as a peer gone wrong
 * would; returns how many arenas it found. */
static int zero_arena_of(pid_t pid)
{
	int found = 0;
	sv_each_fd(pid, zero_if_arena, &found);
	return found;
}

static void requester(int s)
{
	sock = s;
	struct sv_one_qp r;
	sv_requester_open(&r, sock);
	struct ibv_wc wc;
	/* Each step: A says which SEND it wants (flags), we send it and say when it is out. */
	for (int step; (step = hear()) != 0;) {
		if (step < 0) {
			CHECK(zero_arena_of(getppid()) >= 1);
			_exit(0); /* gone without a word */
		}
		unsigned flags = IBV_SEND_SIGNALED | (step == 2 ? IBV_SEND_SOLICITED : 0);
		CHECK_OK(sv_post_send(r.qp, 100, r.mr, 0, MSG, flags));
		sv_expect_wc(r.cq, 100, IBV_WC_SUCCESS, r.qp, &wc);
		say(step);
	}
	_exit(0);
}

/* Asks the peer for a SEND (with the SE bit if `solicited`) and waits until it is out. */
static void peer_sends(int solicited)
{
	int step = solicited ? 2 : 1;
	say(step);
	CHECK_EQ(hear(), step);
}

int main(void)
{
	sv_init("twoproc_events");
	pid_t child;
	sock = sv_fork_peer(requester, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(dev.ctx);
	CHECK(ch != NULL);
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, 16, NULL, ch);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), mr, 0, 8, MSG);
	struct ibv_wc wc;
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	sv_step("an armed CQ: a peer's SEND makes the fd readable, and only until it is taken");
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	peer_sends(0);
	sv_expect_cq_event(ch, rcq);
	sv_expect_wc(rcq, 0, IBV_WC_SUCCESS, qp, &wc);
	CHECKF(!sv_fd_readable(ch->fd, 0), "the fd is readable with no event pending");
	sv_set_nonblock(ch->fd, 1);
	CHECK_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), -1);
	CHECK_EQ(errno, EAGAIN);
	sv_set_nonblock(ch->fd, 0);

	sv_step("connected and idle: no thread of either process spins");
	double cpu = sv_cpu_seconds(getpid()) + sv_cpu_seconds(child);
	sv_fd_readable(ch->fd, 500);
	cpu = sv_cpu_seconds(getpid()) + sv_cpu_seconds(child) - cpu;
	CHECKF(cpu < 0.1, "the two processes used %.2f s of CPU in 0.5 s of idling", cpu);

	sv_step("an unarmed CQ stays silent");
	peer_sends(0);
	sv_expect_no_cq_event(ch, "an unarmed CQ");
	sv_expect_wc(rcq, 1, IBV_WC_SUCCESS, qp, &wc);

	sv_step("solicited-only: no event for a SEND without SE, one for a SEND with it");
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	peer_sends(0);
	sv_expect_no_cq_event(ch, "a solicited-only CQ and a SEND without SE");
	peer_sends(1);
	sv_expect_cq_event(ch, rcq);
	sv_expect_wc(rcq, 2, IBV_WC_SUCCESS, qp, &wc);
	sv_expect_wc(rcq, 3, IBV_WC_SUCCESS, qp, &wc);
	CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
	CHECKF(!sv_fd_readable(ch->fd, 0), "the fd is readable with no event pending");

	if (sv_peer_on_other_host()) {
		/* Between hosts the peer shares no page with us, and a requester that dies
		 * without a word leaves a responder nothing to notice on the wire (no packet
		 * comes; our QP waits, as on a NIC): the step below is about same-host peers. */
		sv_step("the peer on the other host ends (the same-host step is skipped)");
		say(0);
		sv_wait_peer(child, "the peer");
		goto teardown;
	}
	sv_step("a peer zeroes our shared pages and dies: the flushed receive still fires");
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	say(-1);
	sv_wait_peer(child, "the peer");
	CHECKF(sv_fd_readable(ch->fd, 4 * SV_WAIT_MS), "no event after the peer died");
	CHECK_OK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx));
	ibv_ack_cq_events(ev_cq, 1);
	sv_expect_wc(rcq, 4, IBV_WC_WR_FLUSH_ERR, qp, &wc);
	CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);
	sv_expect_async(dev.ctx, IBV_EVENT_QP_FATAL, qp);

teardown:
	sv_step("teardown");
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	sv_pass();
	return 0;
}
