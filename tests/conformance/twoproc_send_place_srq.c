/*
 * SENDs from two processes into one SRQ of a third (docs/send-placement.md, "SRQ"): the
 * receiver (parent) has two RC QPs on one SRQ, each connected to a sender process; both
 * senders stream SENDs of sizes from 1 B to 256 KiB at once (up to 4 KiB through the QP's
 * receive window, larger placed by the sender straight into the SRQ receive it claimed)
 * while the receiver keeps the SRQ topped up. Every receive is used exactly once (no
 * two messages in one buffer: each completion's bytes are checked whole against the pattern
 * of the message its QP says it carried), each QP's messages complete in the order sent,
 * and all of them arrive.
 * Then the window path itself: sender 0 stops the receiver (SIGSTOP, all its threads, its
 * agent included) and sends SENDs of 1 B to 256 KiB (the large ones placed by the sender
 * straight into the SRQ receive it claimed); they complete while it cannot run, so nothing of
 * the receiver's took part; it checks them once it runs again, and the SRQ limit armed
 * before fires once. Not between hosts.
 */
#include <signal.h>
#include <stdio.h>

#include "common.h"

#define MSGS 48
#define SLOT (256u << 10)
#define NSLOT 16
#define STOPPED_MSGS 6 /* phase 2: sent while the receiver is stopped (< NSLOT) */

static uint8_t pattern(unsigned who, unsigned msg, size_t off)
{
	return (uint8_t)(who * 77u + msg * 131u + off * 7u + (off >> 9));
}

static uint32_t msg_len(unsigned who, unsigned msg)
{
	static const uint32_t sizes[] = {5000, 64, 65536, 262144, 4096, 4097, 1, 100000, 131072};
	return sizes[(msg + who) % 9];
}

/* Whether process pid is stopped (its state in /proc is 'T'). */
static int stopped(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *end = strrchr(buf, ')'); /* after the command name, which may hold anything */
	return end && end[1] == ' ' && end[2] == 'T';
}

static uint32_t stopped_len(unsigned m)
{
	/* Small ones through the ring, large ones placed by the sender into the receive. */
	static const uint32_t sizes[] = {1, 4096, 100000, 2048, 262144, 4097};
	return sizes[m % 6];
}

static void sender(int sock)
{
	struct sv_one_qp r;
	sv_one_qp_open(&r, NULL, 128, 4u << 20);
	uint32_t peer = sv_trade_qpn(sock, r.qp);
	unsigned who = (unsigned)sv_hear(sock);
	sv_one_qp_connect(&r, peer, 0, 0, 0);
	CHECK_EQ(sv_hear(sock), 1); /* the receiver is ready */
	for (unsigned m = 0; m < MSGS; m++) {
		uint32_t len = msg_len(who, m);
		size_t off = (size_t)(m % 8) * (512u << 10);
		uint8_t *p = sv_ptr(r.mr, off);
		for (size_t i = 0; i < len; i++)
			p[i] = pattern(who, m, i);
		CHECK_OK(sv_post_send(r.qp, m, r.mr, off, len, IBV_SEND_SIGNALED));
		struct ibv_wc wc;
		/* Up to 8 in flight: wait for the oldest before reusing its buffer. */
		if (m >= 7) {
			sv_expect_wc(r.cq, m - 7, IBV_WC_SUCCESS, r.qp, &wc);
		}
	}
	for (unsigned m = MSGS - 7; m < MSGS; m++) {
		struct ibv_wc wc;
		sv_expect_wc(r.cq, m, IBV_WC_SUCCESS, r.qp, &wc);
	}
	sv_say(sock, 2);
	int phase = sv_hear(sock);
	if (phase == 4) { /* sender 0: small SENDs while the receiver cannot run */
		pid_t receiver = getppid();
		CHECK(kill(receiver, SIGSTOP) == 0);
		for (int i = 0; i < 10000 && !stopped(receiver); i++)
			usleep(1000);
		CHECK(stopped(receiver));
		for (unsigned m = 0; m < STOPPED_MSGS; m++) {
			uint32_t len = stopped_len(m);
			size_t off = (size_t)m * SLOT;
			uint8_t *p = sv_ptr(r.mr, off);
			for (size_t i = 0; i < len; i++)
				p[i] = pattern(who, MSGS + m, i);
			CHECK_OK(sv_post_send(r.qp, MSGS + m, r.mr, off, len, IBV_SEND_SIGNALED));
		}
		/* Through the receiver's agent they would wait for it: resume it before failing. */
		struct ibv_wc wc[STOPPED_MSGS];
		int got = sv_poll(r.cq, STOPPED_MSGS, wc, 5000);
		int still = stopped(receiver); /* nobody woke it meanwhile */
		CHECK(kill(receiver, SIGCONT) == 0);
		CHECKF(got == STOPPED_MSGS, "%d of %d SENDs completed while the receiver was stopped",
		       got, STOPPED_MSGS);
		CHECK(still);
		for (unsigned m = 0; m < STOPPED_MSGS; m++) {
			CHECK_STATUS(wc[m], IBV_WC_SUCCESS);
			CHECK_EQ(wc[m].wr_id, MSGS + m);
		}
		sv_say(sock, 5);
		phase = sv_hear(sock);
	}
	CHECK_EQ(phase, 3);
	sv_one_qp_close(&r);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_send_place_srq");
	pid_t child[2];
	int sock[2];
	for (int i = 0; i < 2; i++)
		sock[i] = sv_fork_peer(sender, &child[i]);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = NSLOT, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(dev.pd, &sa);
	CHECK(srq);
	struct ibv_cq *cq = sv_create_cq(&dev, 256, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, (size_t)NSLOT * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *qp[2];
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, srq, NULL);
		uint32_t peer = sv_trade_qpn(sock[i], qp[i]);
		sv_say(sock[i], i);
		sv_connect_remote(qp[i], &dev, &cfg, peer, NULL, 0, 0, 0);
	}
	sv_step("receives posted, both senders go");
	for (unsigned s = 0; s < NSLOT; s++)
		CHECK_OK(sv_post_srq_recv(srq, s, mr, (size_t)s * SLOT, SLOT));
	for (int i = 0; i < 2; i++)
		sv_say(sock[i], 1);

	unsigned next[2] = {0, 0};
	for (unsigned got = 0; got < 2 * MSGS; got++) {
		struct ibv_wc wc;
		sv_poll_one(cq, &wc);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_OPCODE(wc, IBV_WC_RECV);
		CHECKF(wc.qp_num == qp[0]->qp_num || wc.qp_num == qp[1]->qp_num, "qp_num %u", wc.qp_num);
		unsigned who = wc.qp_num == qp[1]->qp_num;
		unsigned m = next[who]++;
		CHECKF(wc.wr_id < NSLOT, "wr_id %llu", (unsigned long long)wc.wr_id);
		CHECK_EQ(wc.byte_len, msg_len(who, m));
		const uint8_t *p = sv_ptr(mr, (size_t)wc.wr_id * SLOT);
		for (size_t i = 0; i < wc.byte_len; i++)
			CHECKF(p[i] == pattern(who, m, i),
			       "sender %u message %u (receive %llu) byte %zu: 0x%02x, expected 0x%02x", who,
			       m, (unsigned long long)wc.wr_id, i, p[i], pattern(who, m, i));
		memset(sv_ptr(mr, (size_t)wc.wr_id * SLOT), 0, wc.byte_len);
		CHECK_OK(sv_post_srq_recv(srq, wc.wr_id, mr, (size_t)wc.wr_id * SLOT, SLOT));
	}
	CHECK_EQ(next[0], MSGS);
	CHECK_EQ(next[1], MSGS);
	for (int i = 0; i < 2; i++)
		CHECK_EQ(sv_hear(sock[i]), 2);
	if (!sv_peer_on_other_host()) {
		sv_step("SENDs while the receiver is stopped");
		/* NSLOT receives posted; the six taken leave NSLOT - 6 < 12: the limit fires, when
		 * the receiver takes them (drains the window), once. */
		struct ibv_srq_attr limit = {.srq_limit = 12};
		CHECK_OK(ibv_modify_srq(srq, &limit, IBV_SRQ_LIMIT));
		sv_say(sock[0], 4);
		CHECK_EQ(sv_hear(sock[0]), 5);
		for (unsigned m = 0; m < STOPPED_MSGS; m++) {
			struct ibv_wc wc;
			sv_poll_one(cq, &wc);
			CHECK_STATUS(wc, IBV_WC_SUCCESS);
			CHECK_OPCODE(wc, IBV_WC_RECV);
			CHECK_EQ(wc.qp_num, qp[0]->qp_num);
			CHECK_EQ(wc.byte_len, stopped_len(m));
			const uint8_t *p = sv_ptr(mr, (size_t)wc.wr_id * SLOT);
			for (size_t i = 0; i < wc.byte_len; i++)
				CHECKF(p[i] == pattern(0, MSGS + m, i), "stopped message %u byte %zu", m, i);
		}
		int limits = 0;
		struct ibv_async_event ev;
		while (sv_wait_async(dev.ctx, limits ? 200 : 5000, &ev)) {
			if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
				CHECK(ev.element.srq == srq);
				limits++;
			}
			ibv_ack_async_event(&ev);
		}
		CHECK_EQ(limits, 1);
	}
	sv_step("teardown");
	for (int i = 0; i < 2; i++) {
		sv_say(sock[i], 3);
		sv_wait_peer(child[i], "a sender");
	}
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_OK(ibv_destroy_srq(srq));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
