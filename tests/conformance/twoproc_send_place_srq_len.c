/*
 * An SRQ receive posted smaller than a message already claimed (docs/send-placement.md,
 * "SRQ"): one sender process with two QPs a and b, the receiver (parent) with one SRQ and
 * QPs a' and b' on their own CQs. a sends 4 KiB while the SRQ holds one 4 KiB receive (R0);
 * then a 64-byte receive is posted (R1) and b sends 32 bytes. Each message lands in the
 * receive its sender claimed, whatever order the receiver drains the QPs in (b' first
 * here): b's in R1, a's in R0, both succeed on both sides. Before, the drain gave b's
 * message R0 and a's the 64-byte R1: the receiver's LOC_LEN_ERR while a's SEND had
 * succeeded. Then a receive too small for the next message (R2, 64 bytes, a sends 4 KiB):
 * as without an SRQ, the sender's IBV_WC_REM_INV_REQ_ERR and the receiver's
 * IBV_WC_LOC_LEN_ERR.
 */
#include <stdio.h>

#include "common.h"

#define BIG 4096u
#define SMALL 32u
#define RECV_SMALL 64u

static uint8_t pattern(unsigned msg, size_t off) { return (uint8_t)(msg * 29u + off * 5u + 7u); }

static void fill(struct ibv_mr *mr, size_t off, unsigned msg, uint32_t len)
{
	uint8_t *p = sv_ptr(mr, off);
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(msg, i);
}

static void sender(int sock)
{
	struct sv_one_qp a, b;
	sv_one_qp_open(&a, NULL, 16, 2 * BIG);
	sv_one_qp_open(&b, NULL, 16, BIG);
	uint32_t peer_a = sv_trade_qpn(sock, a.qp);
	uint32_t peer_b = sv_trade_qpn(sock, b.qp);
	sv_one_qp_connect(&a, peer_a, 0, 0, 0);
	sv_one_qp_connect(&b, peer_b, 0, 0, 0);
	struct ibv_wc wc;
	CHECK_EQ(sv_hear(sock), 1);
	fill(a.mr, 0, 0, BIG);
	CHECK_OK(sv_post_send(a.qp, 10, a.mr, 0, BIG, IBV_SEND_SIGNALED));
	sv_expect_wc(a.cq, 10, IBV_WC_SUCCESS, a.qp, &wc);
	sv_say(sock, 2);
	CHECK_EQ(sv_hear(sock), 3);
	fill(b.mr, 0, 1, SMALL);
	CHECK_OK(sv_post_send(b.qp, 11, b.mr, 0, SMALL, IBV_SEND_SIGNALED));
	sv_expect_wc(b.cq, 11, IBV_WC_SUCCESS, b.qp, &wc);
	sv_say(sock, 4);
	CHECK_EQ(sv_hear(sock), 5);
	fill(a.mr, BIG, 2, BIG);
	CHECK_OK(sv_post_send(a.qp, 12, a.mr, BIG, BIG, IBV_SEND_SIGNALED));
	sv_expect_wc(a.cq, 12, IBV_WC_REM_INV_REQ_ERR, a.qp, &wc);
	sv_say(sock, 6);
	CHECK_EQ(sv_hear(sock), 7);
	sv_one_qp_close(&a);
	sv_one_qp_close(&b);
	_exit(0);
}

static void expect_recv(struct ibv_cq *cq, struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr,
			size_t off, unsigned msg, uint32_t len)
{
	struct ibv_wc wc;
	sv_expect_wc(cq, wr_id, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, len);
	const uint8_t *p = sv_ptr(mr, off);
	for (size_t i = 0; i < len; i++)
		CHECKF(p[i] == pattern(msg, i), "message %u byte %zu", msg, i);
}

int main(void)
{
	sv_init("twoproc_send_place_srq_len");
	pid_t child;
	int sock = sv_fork_peer(sender, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(dev.pd, &sa);
	CHECK(srq);
	struct ibv_cq *cq_a = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *cq_b = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 3 * BIG, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *qa = sv_create_qp(&dev, &cfg, cq_a, cq_a, srq, NULL);
	struct ibv_qp *qb = sv_create_qp(&dev, &cfg, cq_b, cq_b, srq, NULL);
	uint32_t peer_a = sv_trade_qpn(sock, qa);
	uint32_t peer_b = sv_trade_qpn(sock, qb);
	sv_connect_remote(qa, &dev, &cfg, peer_a, NULL, 0, 0, 0);
	sv_connect_remote(qb, &dev, &cfg, peer_b, NULL, 0, 0, 0);

	sv_step("a sends 4 KiB into R0 (4 KiB); then R1 (64 B) is posted and b sends 32 B");
	CHECK_OK(sv_post_srq_recv(srq, 100, mr, 0, BIG));
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 2);
	CHECK_OK(sv_post_srq_recv(srq, 101, mr, BIG, RECV_SMALL));
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 4);

	sv_step("b' drained first: b's message in R1, then a's in R0");
	expect_recv(cq_b, qb, 101, mr, BIG, 1, SMALL);
	expect_recv(cq_a, qa, 100, mr, 0, 0, BIG);

	sv_step("R2 (64 B) too small for a's next 4 KiB: the errors of a QP without an SRQ");
	CHECK_OK(sv_post_srq_recv(srq, 102, mr, 2 * BIG, RECV_SMALL));
	sv_say(sock, 5);
	CHECK_EQ(sv_hear(sock), 6);
	struct ibv_wc wc;
	sv_expect_wc(cq_a, 102, IBV_WC_LOC_LEN_ERR, qa, &wc);
	sv_expect_empty(cq_b, "b' untouched");

	sv_step("teardown");
	sv_say(sock, 7);
	sv_wait_peer(child, "the sender");
	CHECK_OK(ibv_destroy_qp(qa));
	CHECK_OK(ibv_destroy_qp(qb));
	CHECK_OK(ibv_destroy_srq(srq));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq_a));
	CHECK_OK(ibv_destroy_cq(cq_b));
	sv_close(&dev);
	sv_pass();
	return 0;
}
