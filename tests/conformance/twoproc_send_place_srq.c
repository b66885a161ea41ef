/*
 * Large SENDs from two processes into one SRQ of a third (docs/send-placement.md): the
 * receiver (parent) has two RC QPs on one SRQ, each connected to a sender process; both
 * senders stream SENDs of sizes from 5000 B to 256 KiB at once while the receiver keeps the
 * SRQ topped up. Every receive is used exactly once (no two messages in one buffer: each
 * completion's bytes are checked whole against the pattern of the message its QP says it
 * carried), each QP's messages complete in the order sent, and all of them arrive.
 */
#include "common.h"

#define MSGS 48
#define SLOT (256u << 10)
#define NSLOT 16

static uint8_t pattern(unsigned who, unsigned msg, size_t off)
{
	return (uint8_t)(who * 77u + msg * 131u + off * 7u + (off >> 9));
}

static uint32_t msg_len(unsigned who, unsigned msg)
{
	static const uint32_t sizes[] = {5000, 65536, 262144, 4097, 100000, 131072};
	return sizes[(msg + who) % 6];
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
	CHECK_EQ(sv_hear(sock), 3);
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
	sv_step("teardown");
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(sv_hear(sock[i]), 2);
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
