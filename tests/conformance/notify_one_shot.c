/*
 * notify_one_shot: ibv_req_notify_cq is "one shot".
 *
 * - Completions already in the CQ when it is armed, that no event told of, queue the event
 *   at once (the fd is readable), as a NIC whose arm carries the consumer index (mlx4,
 *   mlx5) fires at once: a program that arms and sleeps is woken for them (UCX does).
 * - Polled empty before the event is taken, the CQ takes that early event back and stays
 *   armed: a program that arms and then polls (ibv_rc_pingpong -e) gets no event with
 *   nothing behind it.
 * - Completions an event told of do not fire again when the CQ is re-armed unpolled.
 * - One arm followed by two completions gives exactly one event.
 * - Without re-arming, further completions give no event.
 * - Re-arming, then a new completion, gives an event again.
 *
 * Everything is watched on B's receive CQ; the other CQs are never armed.
 */
#include "common.h"

static struct sv_fixture f;
static struct ibv_mr *mr_a, *mr_b;
static uint64_t sent, drained; /* wr_ids of the last message sent / received */

/* Posts n SENDs from A to B and waits for A's send completions. When they are all in, the
 * responder has accepted every message, so B's receive completions are in its CQ too. */
static void send_n(int n)
{
	uint64_t first = sent + 1;
	for (int i = 0; i < n; i++) {
		uint64_t id = ++sent;
		CHECK_OK(sv_post_recv(f.pair.qp[1], id, mr_b, 64 * (id % 32), 64));
		CHECK_OK(sv_post_send(f.pair.qp[0], id, mr_a, 0, 64, IBV_SEND_SIGNALED));
	}
	for (uint64_t id = first; id <= sent; id++)
		sv_expect_wc(f.pair.scq[0], id, IBV_WC_SUCCESS, f.pair.qp[0], NULL);
}

/* Polls every outstanding receive completion from B's CQ, in order, and checks that nothing
 * else is there. */
static void drain_recv(void)
{
	while (drained < sent)
		sv_expect_wc(f.pair.rcq[1], ++drained, IBV_WC_SUCCESS, f.pair.qp[1], NULL);
	sv_expect_empty(f.pair.rcq[1], "after draining B's receive CQ");
}

int main(void)
{
	sv_init("notify_one_shot");
	sv_fixture_open(&f, NULL, 1);
	struct ibv_comp_channel *ch = f.ch;
	mr_a = f.mr[0];
	mr_b = f.mr[1];
	struct ibv_cq *cq = f.pair.rcq[1];

	sv_step("completions no event told of, unpolled at the arm: the event is queued at once");
	send_n(2);
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	CHECK(sv_fd_readable(ch->fd, 0));
	sv_expect_cq_event(ch, cq);
	drain_recv();
	sv_expect_no_cq_event(ch, "the early event was the arm's one event");

	sv_step("polled empty before it is taken, the early event is taken back");
	send_n(1); /* the CQ is not armed: no event tells of it */
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	CHECK(sv_fd_readable(ch->fd, 0));
	drain_recv();
	CHECK(!sv_fd_readable(ch->fd, 0));
	sv_expect_no_cq_event(ch, "the CQ was polled empty before the event was taken");

	sv_step("the arm is still pending: the next new completion fires it");
	send_n(1);
	sv_expect_cq_event(ch, cq);
	drain_recv();
	sv_expect_no_cq_event(ch, "only one completion after the arm");

	sv_step("completions an event told of do not fire again at the next arm");
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_n(1);
	sv_expect_cq_event(ch, cq);
	CHECK_OK(ibv_req_notify_cq(cq, 0)); /* the completion is still unpolled */
	sv_expect_no_cq_event(ch, "re-armed over a completion its last event told of");
	drain_recv();
	send_n(1); /* the arm is pending */
	sv_expect_cq_event(ch, cq);
	drain_recv();

	sv_step("a completion polled partly: the early event stays");
	send_n(2); /* not armed */
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	sv_expect_wc(f.pair.rcq[1], ++drained, IBV_WC_SUCCESS, f.pair.qp[1], NULL);
	sv_expect_cq_event(ch, cq);
	drain_recv();
	sv_expect_no_cq_event(ch, "one arm, one event");

	sv_step("one arm, two completions: exactly one event");
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_n(1);
	send_n(1);
	drain_recv();
	sv_expect_cq_event(ch, cq);
	sv_expect_no_cq_event(ch, "the second completion after a single arm");

	sv_step("no re-arm: a further completion gives no event");
	send_n(1);
	drain_recv();
	sv_expect_no_cq_event(ch, "the CQ was not re-armed");

	sv_step("re-arm: the next completion gives an event");
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	sv_expect_no_cq_event(ch, "re-armed but no new completion yet");
	send_n(1);
	sv_expect_cq_event(ch, cq);
	drain_recv();

	sv_step("arming twice before a completion still gives one event");
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	send_n(1);
	sv_expect_cq_event(ch, cq);
	drain_recv();
	sv_expect_no_cq_event(ch, "two arms are still one shot");

	sv_step("teardown");
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
