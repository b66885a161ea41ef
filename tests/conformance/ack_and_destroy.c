/*
 * ack_and_destroy: destroying a CQ waits for the acks of the events it handed out, and only
 * for those.
 *
 * - ibv_destroy_cq on a CQ with one retrieved but unacked event blocks until another thread
 *   acks it (checked by ordering flags, never by timing).
 * - Events queued but never retrieved do not block ibv_destroy_cq; they vanish with the CQ
 *   (the channel fd stops being readable when they were the only ones), while the events of
 *   other CQs on the same channel stay.
 * - ibv_destroy_comp_channel returns EBUSY while a CQ uses the channel (which keeps working),
 *   and succeeds once the CQs are gone.
 * - Acks count per CQ: two events of one CQ acked with a single ibv_ack_cq_events(cq, 2)
 *   release its destroy, while another CQ's unacked event still holds that CQ's destroy.
 */
#include "common.h"

static struct sv_dev dev;
static struct ibv_comp_channel *ch;
static struct ibv_mr *mr[2];

/* One SEND from QP `from` to the other QP of the pair; both completions are polled. */
static void fire(struct sv_pair *p, int from)
{
	static uint64_t id = 100;
	sv_send_recv(p, from, ++id, mr[from], mr[1 - from], 64, 0, NULL);
}

/* Retrieves the next event, which must be for `cq`, without acking it. */
static void get_event(struct ibv_cq *cq)
{
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	CHECKF(sv_wait_cq_event(ch, SV_WAIT_MS, &ev_cq, &ev_ctx), "no event for CQ %p", (void *)cq);
	CHECKF(ev_cq == cq, "event for CQ %p, expected %p", (void *)ev_cq, (void *)cq);
}

static void destroy_qps(struct sv_pair *p)
{
	for (int i = 0; i < 2; i++) {
		CHECK_OK(ibv_destroy_qp(p->qp[i]));
		p->qp[i] = NULL;
	}
}

static struct ibv_cq *held_cq; /* the CQ whose retrieved event destroy must wait for */

static void ack_held(void *n)
{
	ibv_ack_cq_events(held_cq, *(unsigned *)n);
}

/* Destroys `cq` in a thread, checks the destroy waits, acks `n` events, checks it returned
 * only after the ack. */
static void destroy_blocks_until_ack(struct ibv_cq *cq, unsigned n)
{
	held_cq = cq;
	sv_expect_destroy_waits(sv_destroy_cq_fn, cq, ack_held, &n, "ibv_destroy_cq");
}

int main(void)
{
	sv_init("ack_and_destroy");
	sv_open(&dev);
	struct sv_pair p1, p2, p3;
	ch = sv_pair_open_with_channel(&dev, NULL, &p1);
	struct sv_pair_cfg cfg = p1.cfg; /* the defaults with this channel */
	mr[0] = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	mr[1] = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);

	sv_step("destroy blocks until the one retrieved event is acked");
	CHECK_OK(ibv_req_notify_cq(p1.rcq[1], 0));
	fire(&p1, 0);
	get_event(p1.rcq[1]);
	destroy_qps(&p1);
	destroy_blocks_until_ack(p1.rcq[1], 1);
	p1.rcq[1] = NULL;
	sv_expect_no_cq_event(ch, "nothing else was armed");

	sv_step("a CQ's only queued event vanishes with it: the fd is no longer readable");
	struct sv_pair p4;
	sv_pair_open(&dev, &cfg, &p4);
	CHECK_OK(ibv_req_notify_cq(p4.rcq[1], 0));
	fire(&p4, 0);
	CHECK(sv_fd_readable(ch->fd, SV_WAIT_MS));
	destroy_qps(&p4);
	CHECK_OK(ibv_destroy_cq(p4.rcq[1])); /* the watchdog fails the test if this blocks */
	p4.rcq[1] = NULL;
	CHECKF(!sv_fd_readable(ch->fd, 0), "channel fd still readable after its CQ was destroyed");
	sv_pair_destroy(&p4);

	sv_step("queued, never retrieved events do not block destroy; other CQs' events stay");
	sv_pair_open(&dev, &cfg, &p2);
	CHECK_OK(ibv_req_notify_cq(p2.rcq[1], 0));
	CHECK_OK(ibv_req_notify_cq(p2.scq[0], 0));
	fire(&p2, 0); /* two events queued: B's receive CQ and A's send CQ */
	CHECK(sv_fd_readable(ch->fd, SV_WAIT_MS));
	destroy_qps(&p2);
	CHECK_OK(ibv_destroy_cq(p2.rcq[1])); /* its queued event must not hold it */
	p2.rcq[1] = NULL;
	CHECKF(sv_fd_readable(ch->fd, 0), "A's send CQ event vanished with B's receive CQ");
	get_event(p2.scq[0]); /* the destroyed CQ's event is gone: this is the next one */
	ibv_ack_cq_events(p2.scq[0], 1);
	CHECKF(!sv_fd_readable(ch->fd, SV_QUIET_MS), "the destroyed CQ's event is still queued");
	sv_set_nonblock(ch->fd, 1);
	struct ibv_cq *cq;
	void *ctx;
	errno = 0;
	CHECK_EQ(ibv_get_cq_event(ch, &cq, &ctx), -1);
	CHECK_EQ(errno, EAGAIN);
	sv_set_nonblock(ch->fd, 0);

	sv_step("ibv_destroy_comp_channel is EBUSY while CQs use the channel");
	CHECK_ERR(ibv_destroy_comp_channel(ch), EBUSY);

	sv_step("acks count per CQ; one ack of n=2 covers two events");
	sv_pair_open(&dev, &cfg, &p3); /* the channel still works after the EBUSY */
	struct ibv_cq *x = p3.rcq[1], *y = p3.rcq[0];
	CHECK_OK(ibv_req_notify_cq(x, 0));
	fire(&p3, 0);
	get_event(x);
	CHECK_OK(ibv_req_notify_cq(x, 0));
	fire(&p3, 0);
	get_event(x);
	CHECK_OK(ibv_req_notify_cq(y, 0));
	fire(&p3, 1);
	get_event(y);
	ibv_ack_cq_events(x, 2); /* must not block, and must count both of x's events */
	destroy_qps(&p3);
	CHECK_OK(ibv_destroy_cq(x)); /* the watchdog fails the test if this blocks */
	p3.rcq[1] = NULL;
	destroy_blocks_until_ack(y, 1); /* y's event is not covered by x's acks */
	p3.rcq[0] = NULL;

	sv_step("teardown: the channel can be destroyed once its CQs are gone");
	sv_pair_destroy(&p1);
	sv_pair_destroy(&p2);
	CHECK_ERR(ibv_destroy_comp_channel(ch), EBUSY); /* p3's send CQs still use it */
	sv_pair_destroy(&p3);
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_free_mr(mr[0]);
	sv_free_mr(mr[1]);
	sv_close(&dev);
	sv_pass();
	return 0;
}
