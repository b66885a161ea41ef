/*
 * notify_race_stress: arming races against completions without losing a wake-up.
 *
 * A sender thread posts N SENDs (default 20000) from A to B as fast as receive credits allow,
 * reaping its own send CQ by polling. A receiver thread waits on B's receive CQ with the
 * canonical loop of ibv_get_cq_event(3):
 *
 *     ibv_get_cq_event -> ibv_ack_cq_events -> ibv_req_notify_cq -> poll until empty
 *
 * and re-posts each receive buffer as it consumes it. Every message carries its sequence
 * number; the receiver checks all N arrive, in order. A lost wake-up (a completion that lands
 * between the poll and the re-arm without producing an event) leaves the receiver blocked in
 * ibv_get_cq_event forever; the watchdog turns that into a failure.
 *
 * Flow control keeps the test free of RNR: the sender never has more messages in flight than
 * the receiver has posted buffers.
 *
 * Usage: notify_race_stress [messages]
 */
#include "common.h"

#include <sched.h>

#define RECV_DEPTH 256
#define SEND_DEPTH 128
#define MSG_SIZE 64

static struct sv_dev dev;
static struct sv_pair pair;
static struct ibv_comp_channel *ch;
static struct ibv_mr *mr_send, *mr_recv;
static long total;

/* Progress counters, also reported by the watchdog if the test hangs. */
static atomic_long posted;        /* SENDs posted by the sender */
static atomic_long completed;     /* send completions the sender polled */
static atomic_long received;      /* messages the receiver consumed (and re-posted for) */
static atomic_long events;        /* completion events the receiver got */
static atomic_long empty_wakeups; /* events after which the CQ turned out to be empty */
static atomic_long waiting;       /* 1 while the receiver is inside ibv_get_cq_event */

static void *sender_main(void *arg)
{
	(void)arg;
	long sent = 0, done = 0;
	while (done < total) {
		/* Post while both the send queue and the receiver's credits allow. */
		while (sent < total && sent - done < SEND_DEPTH &&
		       sent - atomic_load(&received) < RECV_DEPTH) {
			size_t slot = (size_t)(sent % SEND_DEPTH) * MSG_SIZE;
			uint32_t seq = (uint32_t)sent;
			memcpy(sv_ptr(mr_send, slot), &seq, sizeof(seq));
			CHECK_OK(sv_post_send(pair.qp[0], (uint64_t)sent, mr_send, slot, MSG_SIZE,
					      IBV_SEND_SIGNALED));
			atomic_store(&posted, ++sent);
		}
		struct ibv_wc wc[32];
		int ne = ibv_poll_cq(pair.scq[0], 32, wc);
		CHECK(ne >= 0);
		for (int i = 0; i < ne; i++) {
			CHECK_WC(wc[i], (uint64_t)done, IBV_WC_SUCCESS, pair.qp[0]);
			atomic_store(&completed, ++done);
		}
		if (ne == 0)
			sched_yield();
	}
	return NULL;
}

static void post_recv_slot(uint64_t slot)
{
	CHECK_OK(sv_post_recv(pair.qp[1], slot, mr_recv, slot * MSG_SIZE, MSG_SIZE));
}

static void *receiver_main(void *arg)
{
	(void)arg;
	struct ibv_cq *cq = pair.rcq[1];
	long got = 0;
	while (got < total) {
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;
		atomic_store(&waiting, 1);
		CHECKF(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "ibv_get_cq_event: %s",
		       strerror(errno));
		atomic_store(&waiting, 0);
		CHECK(ev_cq == cq);
		CHECK(ev_ctx == &pair.rcq[1]);
		ibv_ack_cq_events(ev_cq, 1);
		atomic_fetch_add(&events, 1);
		CHECK_OK(ibv_req_notify_cq(cq, 0));
		int drained = 0;
		for (;;) {
			struct ibv_wc wc[16];
			int ne = ibv_poll_cq(cq, 16, wc);
			CHECK(ne >= 0);
			if (ne == 0)
				break;
			for (int i = 0; i < ne; i++) {
				CHECK_STATUS(wc[i], IBV_WC_SUCCESS);
				CHECK_OPCODE(wc[i], IBV_WC_RECV);
				CHECK_EQ(wc[i].qp_num, pair.qp[1]->qp_num);
				CHECK_EQ(wc[i].byte_len, MSG_SIZE);
				CHECK(wc[i].wr_id < RECV_DEPTH);
				uint32_t seq;
				memcpy(&seq, sv_ptr(mr_recv, wc[i].wr_id * MSG_SIZE), sizeof(seq));
				CHECKF(seq == (uint32_t)got, "message %ld arrived with sequence %u", got,
				       seq);
				/* Receives complete in posting order: slot = sequence mod depth. */
				CHECK_EQ(wc[i].wr_id, (uint64_t)(got % RECV_DEPTH));
				post_recv_slot(wc[i].wr_id);
				got++;
				atomic_store(&received, got);
			}
			drained += ne;
		}
		if (drained == 0)
			atomic_fetch_add(&empty_wakeups, 1); /* allowed: see ibv_get_cq_event(3) */
	}
	return NULL;
}

int main(int argc, char **argv)
{
	sv_init("notify_race_stress");
	total = argc > 1 ? atol(argv[1]) : 20000;
	CHECK(total > 0);
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.send_cqe = SEND_DEPTH + 16;
	cfg.recv_cqe = RECV_DEPTH + 16;
	cfg.max_send_wr = SEND_DEPTH;
	cfg.max_recv_wr = RECV_DEPTH;
	ch = sv_pair_open_with_channel(&dev, &cfg, &pair);
	mr_send = sv_alloc_mr(dev.pd, SEND_DEPTH * MSG_SIZE, SV_ACCESS_ALL);
	mr_recv = sv_alloc_mr(dev.pd, RECV_DEPTH * MSG_SIZE, SV_ACCESS_ALL);
	for (uint64_t slot = 0; slot < RECV_DEPTH; slot++)
		post_recv_slot(slot);
	sv_watch_counter("posted", &posted);
	sv_watch_counter("send completions", &completed);
	sv_watch_counter("received", &received);
	sv_watch_counter("events", &events);
	sv_watch_counter("receiver blocked in ibv_get_cq_event", &waiting);

	sv_step("racing %ld messages against the arm/ack/poll loop", total);
	/* Arm before any completion can exist: a CQ armed after completions arrived does not
	 * fire for them, so arming in the receiver thread would race with the first sends. */
	CHECK_OK(ibv_req_notify_cq(pair.rcq[1], 0));
	pthread_t rx, tx;
	CHECK_OK(pthread_create(&rx, NULL, receiver_main, NULL));
	CHECK_OK(pthread_create(&tx, NULL, sender_main, NULL));
	CHECK_OK(pthread_join(tx, NULL));
	CHECK_OK(pthread_join(rx, NULL));
	CHECK_EQ(atomic_load(&received), total);
	printf("%ld messages, %ld events (%ld found the CQ empty)\n", total,
	       atomic_load(&events), atomic_load(&empty_wakeups));
	CHECK(atomic_load(&events) >= 1);

	sv_step("teardown");
	/* Every event was acked in the loop; one more may be pending for completions that the
	 * last poll already consumed. Take it too, so that nothing is left unacked. */
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	while (sv_wait_cq_event(ch, 0, &ev_cq, &ev_ctx))
		ibv_ack_cq_events(ev_cq, 1);
	CHECK_OK(sv_modify_state(pair.qp[1], IBV_QPS_ERR)); /* flushes the posted receives */
	struct ibv_wc wc[RECV_DEPTH];
	CHECK_EQ(sv_poll(pair.rcq[1], RECV_DEPTH, wc, SV_WAIT_MS), RECV_DEPTH);
	for (int i = 0; i < RECV_DEPTH; i++)
		CHECK_STATUS(wc[i], IBV_WC_WR_FLUSH_ERR);
	while (sv_wait_cq_event(ch, 0, &ev_cq, &ev_ctx))
		ibv_ack_cq_events(ev_cq, 1);
	sv_free_mr(mr_send);
	sv_free_mr(mr_recv);
	sv_pair_destroy(&pair);
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	sv_pass();
	return 0;
}
