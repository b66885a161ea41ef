/*
 * The same verbs semantics between two processes (fork): every data path that crosses a
 * process boundary, the fast ones (receive windows, direct RDMA WRITE/READ) and the agent
 * ones (large SENDs, atomics, errors), and a completion event that wakes a process blocked
 * in ibv_get_cq_event. A = requester (parent), B = responder (child). B waits in read(2)
 * on a socket between steps: RDMA must land while the target sits outside verbs.
 */
#include "common.h"

#include <sys/socket.h>

#define BIG (1 << 20)
#define SMALL 64
#define LARGE_SEND (64 * 1024)

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static void responder(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(dev.ctx);
	CHECK(ch != NULL);
	struct ibv_cq *scq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, 64, &rcq, ch);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, BIG, SV_ACCESS_ALL);
	struct sv_remote peer;
	sv_trade_remote(sock, qp, mr, &peer);
	sv_connect_remote(qp, &dev, &cfg, peer.qpn, mr, 1, 2, SMALL);
	say(1);

	struct ibv_wc wc;
	/* 1: small SEND and SEND_WITH_IMM (receive window) */
	CHECK_EQ(hear(), 1);
	sv_expect_wc(rcq, 1, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, SMALL);
	CHECK_EQ(wc.src_qp, peer.qpn);
	CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
	CHECK_EQ(sv_ptr(mr, 0)[0], 0xa1);
	CHECK_EQ(sv_ptr(mr, 0)[SMALL - 1], 0xa1);
	sv_expect_wc(rcq, 2, IBV_WC_SUCCESS, qp, &wc);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(wc.imm_data, htobe32(0xfeedbeef));
	CHECK_EQ(sv_ptr(mr, SMALL)[0], 0xa2);
	say(1);

	/* 1b: a SEND gathered from two buffers, an inline SEND, a small RDMA WRITE */
	CHECK_OK(sv_post_recv(qp, 4, mr, 0, SMALL));
	CHECK_OK(sv_post_recv(qp, 5, mr, SMALL, SMALL));
	say(11);
	CHECK_EQ(hear(), 11);
	sv_expect_wc(rcq, 4, IBV_WC_SUCCESS, qp, &wc);
	CHECK_EQ(wc.byte_len, 32);
	CHECK_EQ(sv_ptr(mr, 0)[0], 0xb1);
	CHECK_EQ(sv_ptr(mr, 15)[0], 0xb1);
	CHECK_EQ(sv_ptr(mr, 16)[0], 0xb2);
	CHECK_EQ(sv_ptr(mr, 31)[0], 0xb2);
	sv_expect_wc(rcq, 5, IBV_WC_SUCCESS, qp, &wc);
	CHECK_EQ(wc.byte_len, 16);
	CHECK_EQ(sv_ptr(mr, SMALL)[0], 0xb3);
	CHECK_EQ(sv_ptr(mr, SMALL + 15)[0], 0xb3);
	for (int i = 0; i < 8; i++)
		CHECK_EQ(sv_ptr(mr, 12288 + i)[0], 0xb4);
	CHECK_EQ(sv_ptr(mr, 12288 + 8)[0], 0);
	say(11);

	/* 2: a SEND larger than a window slot (agent path, cross-memory attach) */
	CHECK_OK(sv_post_recv(qp, 3, mr, 0, LARGE_SEND));
	say(2);
	CHECK_EQ(hear(), 2);
	sv_expect_wc(rcq, 3, IBV_WC_SUCCESS, qp, &wc);
	CHECK_EQ(wc.byte_len, LARGE_SEND);
	for (int i = 0; i < LARGE_SEND; i += 4093)
		CHECK_EQ(sv_ptr(mr, i)[0], (uint8_t)(i * 7));
	say(2);

	/* 3-5: RDMA WRITE, READ, atomics land while we sit in read(2) */
	CHECK_EQ(hear(), 3);
	for (int i = 0; i < BIG; i += 65521)
		CHECK_EQ(sv_ptr(mr, i)[0], (uint8_t)(i * 13));
	memset(sv_ptr(mr, 0), 0x5c, 4096);
	uint64_t word = 100;
	memcpy(sv_ptr(mr, 8192), &word, 8);
	say(3);
	CHECK_EQ(hear(), 5);
	memcpy(&word, sv_ptr(mr, 8192), 8);
	CHECK_EQ(word, 777u);
	say(5);

	/* 6: blocked in ibv_get_cq_event, woken by a small SEND */
	CHECK_OK(sv_post_recv(qp, 6, mr, 0, SMALL));
	CHECK_OK(ibv_req_notify_cq(rcq, 0));
	say(6);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK_OK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx));
	CHECK(ev_cq == rcq);
	CHECK(ev_ctx == &rcq);
	ibv_ack_cq_events(ev_cq, 1);
	sv_expect_wc(rcq, 6, IBV_WC_SUCCESS, qp, &wc);
	say(6);

	/* 7: a bad rkey: we go to ERR with IBV_EVENT_QP_ACCESS_ERR */
	CHECK_EQ(hear(), 7);
	sv_expect_async(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, qp);
	CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);
	say(7);

	CHECK_EQ(hear(), 8);
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_semantics");
	pid_t child;
	sock = sv_fork_peer(responder, &child);

	struct sv_one_qp a;
	sv_one_qp_open(&a, NULL, 64, BIG);
	struct sv_remote peer;
	sv_trade_remote(sock, a.qp, a.mr, &peer);
	/* QPNs are unique on one host's device; two hosts number their QPs independently. */
	if (!sv_peer_on_other_host())
		CHECK(peer.qpn != a.qp->qp_num);
	sv_one_qp_connect(&a, peer.qpn, 0, 0, 0);
	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;

	sv_step("small SEND and SEND_WITH_IMM to another process");
	memset(sv_ptr(a.mr, 0), 0xa1, SMALL);
	memset(sv_ptr(a.mr, SMALL), 0xa2, SMALL);
	CHECK_OK(sv_post_send(a.qp, 11, a.mr, 0, SMALL, IBV_SEND_SIGNALED));
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, 12, IBV_WR_SEND_WITH_IMM, a.mr, SMALL, SMALL, IBV_SEND_SIGNALED);
	wr.imm_data = htobe32(0xfeedbeef);
	CHECK_OK(ibv_post_send(a.qp, &wr, &bad));
	sv_expect_wc(a.cq, 11, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
	sv_expect_wc(a.cq, 12, IBV_WC_SUCCESS, a.qp, &wc);
	say(1);
	CHECK_EQ(hear(), 1);

	sv_step("a SEND from two buffers, an inline SEND, a small RDMA WRITE, to another process");
	CHECK_EQ(hear(), 11);
	memset(sv_ptr(a.mr, 0), 0xb1, 16);
	memset(sv_ptr(a.mr, 64), 0xb2, 16);
	struct ibv_sge two[2] = {{sv_addr(a.mr, 0), 16, a.mr->lkey},
				 {sv_addr(a.mr, 64), 16, a.mr->lkey}};
	sv_wr_init(&wr, &sge, 13, IBV_WR_SEND, a.mr, 0, 16, IBV_SEND_SIGNALED);
	wr.sg_list = two;
	wr.num_sge = 2;
	CHECK_OK(ibv_post_send(a.qp, &wr, &bad));
	sv_expect_wc(a.cq, 13, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
	uint8_t inl[16];
	memset(inl, 0xb3, sizeof(inl));
	struct ibv_sge inl_sge = {(uintptr_t)inl, sizeof(inl), 0}; /* inline: no key needed */
	sv_wr_init(&wr, &sge, 14, IBV_WR_SEND, a.mr, 0, 16, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	wr.sg_list = &inl_sge;
	CHECK_OK(ibv_post_send(a.qp, &wr, &bad));
	memset(inl, 0, sizeof(inl)); /* ours again as soon as ibv_post_send returned */
	sv_expect_wc(a.cq, 14, IBV_WC_SUCCESS, a.qp, &wc);
	memset(sv_ptr(a.mr, 128), 0xb4, 8);
	CHECK_OK(sv_post_rdma(a.qp, 15, IBV_WR_RDMA_WRITE, a.mr, 128, 8, IBV_SEND_SIGNALED,
			      peer.addr + 12288, peer.rkey));
	sv_expect_wc(a.cq, 15, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RDMA_WRITE);
	CHECK_EQ(wc.qp_num, a.qp->qp_num);
	say(11);
	CHECK_EQ(hear(), 11);

	sv_step("SEND of 64 KiB to another process");
	CHECK_EQ(hear(), 2);
	for (int i = 0; i < LARGE_SEND; i++)
		sv_ptr(a.mr, i)[0] = (uint8_t)(i * 7);
	CHECK_OK(sv_post_send(a.qp, 21, a.mr, 0, LARGE_SEND, IBV_SEND_SIGNALED));
	sv_expect_wc(a.cq, 21, IBV_WC_SUCCESS, a.qp, &wc);
	say(2);
	CHECK_EQ(hear(), 2);

	sv_step("RDMA WRITE of 1 MiB into a process blocked in read(2)");
	for (int i = 0; i < BIG; i++)
		sv_ptr(a.mr, i)[0] = (uint8_t)(i * 13);
	CHECK_OK(sv_post_rdma(a.qp, 31, IBV_WR_RDMA_WRITE, a.mr, 0, BIG, IBV_SEND_SIGNALED,
			      peer.addr, peer.rkey));
	sv_expect_wc(a.cq, 31, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RDMA_WRITE);
	say(3);
	CHECK_EQ(hear(), 3);

	sv_step("RDMA READ and atomics from a process blocked in read(2)");
	memset(sv_ptr(a.mr, 0), 0, 4096);
	CHECK_OK(sv_post_rdma(a.qp, 41, IBV_WR_RDMA_READ, a.mr, 0, 4096, IBV_SEND_SIGNALED,
			      peer.addr, peer.rkey));
	sv_expect_wc(a.cq, 41, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RDMA_READ);
	CHECK_EQ(wc.byte_len, 4096);
	CHECK_EQ(sv_ptr(a.mr, 0)[0], 0x5c);
	CHECK_EQ(sv_ptr(a.mr, 4095)[0], 0x5c);
	sv_wr_init(&wr, &sge, 42, IBV_WR_ATOMIC_FETCH_AND_ADD, a.mr, 16, 8, IBV_SEND_SIGNALED);
	wr.wr.atomic.remote_addr = peer.addr + 8192;
	wr.wr.atomic.rkey = peer.rkey;
	wr.wr.atomic.compare_add = 600;
	CHECK_OK(ibv_post_send(a.qp, &wr, &bad));
	sv_expect_wc(a.cq, 42, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_FETCH_ADD);
	uint64_t old;
	memcpy(&old, sv_ptr(a.mr, 16), 8);
	CHECK_EQ(old, 100u);
	sv_wr_init(&wr, &sge, 43, IBV_WR_ATOMIC_CMP_AND_SWP, a.mr, 16, 8, IBV_SEND_SIGNALED);
	wr.wr.atomic.remote_addr = peer.addr + 8192;
	wr.wr.atomic.rkey = peer.rkey;
	wr.wr.atomic.compare_add = 700;
	wr.wr.atomic.swap = 777;
	CHECK_OK(ibv_post_send(a.qp, &wr, &bad));
	sv_expect_wc(a.cq, 43, IBV_WC_SUCCESS, a.qp, &wc);
	memcpy(&old, sv_ptr(a.mr, 16), 8);
	CHECK_EQ(old, 700u);
	say(5);
	CHECK_EQ(hear(), 5);

	sv_step("a SEND wakes the other process from ibv_get_cq_event");
	CHECK_EQ(hear(), 6);
	sv_sleep_ms(50); /* let it block */
	CHECK_OK(sv_post_send(a.qp, 61, a.mr, 0, SMALL, IBV_SEND_SIGNALED));
	sv_expect_wc(a.cq, 61, IBV_WC_SUCCESS, a.qp, &wc);
	CHECK_EQ(hear(), 6);

	sv_step("a bad rkey: IBV_WC_REM_ACCESS_ERR here, the peer's QP to ERR");
	CHECK_OK(sv_post_rdma(a.qp, 71, IBV_WR_RDMA_WRITE, a.mr, 0, 64, IBV_SEND_SIGNALED,
			      peer.addr, peer.rkey ^ 0x100));
	sv_expect_wc(a.cq, 71, IBV_WC_REM_ACCESS_ERR, a.qp, &wc);
	say(7);
	CHECK_EQ(hear(), 7);

	sv_step("teardown");
	say(8);
	sv_wait_peer(child, "the responder");
	sv_one_qp_close(&a);
	sv_pass();
	return 0;
}
