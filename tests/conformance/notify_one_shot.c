/*
 * notify_one_shot: ibv_req_notify_cq is "one shot".
 *
 * - Completions already in the CQ when it is armed do not produce an event; the arm stays
 *   pending and fires on the next new completion.
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

	sv_step("completions present before the arm do not produce an event");
	send_n(2);
	CHECK_OK(ibv_req_notify_cq(cq, 0));
	sv_expect_no_cq_event(ch, "the CQ held two old completions when it was armed");
	drain_recv();

	sv_step("the arm is still pending: the next new completion fires it");
	send_n(1);
	sv_expect_cq_event(ch, cq);
	drain_recv();
	sv_expect_no_cq_event(ch, "only one completion after the arm");

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
