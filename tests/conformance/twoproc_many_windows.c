/*
 * Many receive windows on one CQ (issue 14, item 5): NQ QPs to each of two requester
 * processes share our receive CQ, more windows than the CQ's own line has rung bits for,
 * so both kinds of rung bits are used (wire/shm/window.hpp, "Which of a CQ's receive
 * windows may hold messages"). Both requesters send ROUNDS SENDs at once, each to a QP of
 * theirs picked at random. Every message arrives, in order per QP, with its payload,
 * within the time limit. ctest runs it with SOFTVERBS_TEST_NO_QUIET_LOOKS=1: the CQ then
 * never looks at every window on its own, so a message whose bit the protocol lost hangs
 * the test instead of arriving a little late.
 *
 * Run as twoproc_many_windows_garbage (SOFTVERBS_TEST_RUNG_GARBAGE set for the second
 * requester only): for every message that one writes a random word or zero over one of
 * the CQ's rung words or its doorbell instead of ringing: bits of other windows set and
 * cleared. Nothing crashes, nothing is lost or corrupted; a message whose bit was cleared
 * waits for the CQ's occasional look at every window.
 */
#include "common.h"

#include <time.h>

#define NQ 140   /* 280 windows: more than the 256 direct bits */
#define ROUNDS 1500
#define RECVS 96 /* per QP: ~11 messages each on average */
#define MSG 16

static int sock;

static void requester(int s)
{
	sock = s;
	if (sv_hear(sock) == 2 && getenv("SV_TEST_GARBAGE_SEED"))
		CHECK_OK(setenv("SOFTVERBS_TEST_RUNG_GARBAGE", getenv("SV_TEST_GARBAGE_SEED"), 1));
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_qp *qp[NQ];
	uint32_t ours[NQ], theirs[NQ];
	for (int k = 0; k < NQ; k++) {
		qp[k] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		ours[k] = qp[k]->qp_num;
	}
	sv_exchange(sock, ours, theirs, sizeof(ours));
	for (int k = 0; k < NQ; k++)
		sv_connect_remote(qp[k], &dev, &cfg, theirs[k], NULL, 0, 0, 0);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 3);
	uint32_t x = 12345u + (uint32_t)getpid();
	int sent[NQ] = {0};
	struct ibv_wc wc;
	for (int i = 0; i < ROUNDS; i++) {
		x = x * 1103515245u + 12345u;
		int k = (int)((x >> 16) % NQ);
		uint8_t *p = sv_ptr(mr, 0);
		memcpy(p, &sent[k], sizeof(int));
		memcpy(p + sizeof(int), &k, sizeof(int));
		CHECK_OK(sv_post_send(qp[k], (uint64_t)i, mr, 0, MSG, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, (uint64_t)i, IBV_WC_SUCCESS, qp[k], &wc);
		sent[k]++;
	}
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 0);
	for (int k = 0; k < NQ; k++)
		CHECK_OK(ibv_destroy_qp(qp[k]));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void)
{
	sv_init("twoproc_many_windows");
	pid_t child[2];
	int peer_sock[2];
	for (int c = 0; c < 2; c++) {
		peer_sock[c] = sv_fork_peer(requester, &child[c]);
		sv_say(peer_sock[c], c + 1); /* 2: the one that may write garbage */
	}

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = RECVS;
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&dev, 2 * ROUNDS + 16, NULL, NULL);
	struct ibv_qp *qp[2][NQ];
	struct ibv_mr *mr[2][NQ];
	for (int c = 0; c < 2; c++) {
		uint32_t ours[NQ], theirs[NQ];
		for (int k = 0; k < NQ; k++) {
			qp[c][k] = sv_create_qp(&dev, &cfg, scq, rcq, NULL, NULL);
			ours[k] = qp[c][k]->qp_num;
		}
		sv_exchange(peer_sock[c], ours, theirs, sizeof(ours));
		for (int k = 0; k < NQ; k++) {
			mr[c][k] = sv_alloc_mr(dev.pd, (size_t)RECVS * MSG, SV_ACCESS_ALL);
			sv_connect_remote(qp[c][k], &dev, &cfg, theirs[k], mr[c][k], 0, RECVS, MSG);
		}
		CHECK_EQ(sv_hear(peer_sock[c]), 1);
	}

	sv_step("two requesters, %d QPs each on our one CQ, send %d SENDs each at once", NQ, ROUNDS);
	for (int c = 0; c < 2; c++)
		sv_say(peer_sock[c], 3);
	int next[2][NQ] = {{0}};
	double deadline = now_s() + 60;
	for (int got = 0; got < 2 * ROUNDS;) {
		CHECKF(now_s() < deadline, "%d of %d messages arrived in 60 s", got, 2 * ROUNDS);
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(rcq, 16, wc);
		CHECK(n >= 0);
		for (int j = 0; j < n; j++, got++) {
			int c = -1, k = -1;
			for (int cc = 0; cc < 2 && c < 0; cc++)
				for (int kk = 0; kk < NQ; kk++)
					if (wc[j].qp_num == qp[cc][kk]->qp_num) {
						c = cc;
						k = kk;
						break;
					}
			CHECKF(c >= 0, "a completion for QP %u, not one of ours", wc[j].qp_num);
			CHECK_WC(wc[j], (uint64_t)next[c][k], IBV_WC_SUCCESS, qp[c][k]);
			CHECK_EQ(wc[j].byte_len, MSG);
			int seq, from;
			size_t at = (size_t)(next[c][k] % RECVS) * MSG;
			memcpy(&seq, sv_ptr(mr[c][k], at), sizeof(int));
			memcpy(&from, sv_ptr(mr[c][k], at + sizeof(int)), sizeof(int));
			CHECK_EQ(seq, next[c][k]);
			CHECK_EQ(from, k);
			/* The buffer again, for the QP's message RECVS later. */
			CHECK_OK(sv_post_recv(qp[c][k], (uint64_t)(next[c][k] + RECVS), mr[c][k], at, MSG));
			next[c][k]++;
		}
	}
	for (int c = 0; c < 2; c++)
		CHECK_EQ(sv_hear(peer_sock[c]), 3);
	sv_expect_empty(rcq, "after both requesters' SENDs");


	sv_step("teardown");
	for (int c = 0; c < 2; c++) {
		sv_say(peer_sock[c], 0);
		sv_wait_peer(child[c], "requester");
		for (int k = 0; k < NQ; k++) {
			CHECK_OK(ibv_destroy_qp(qp[c][k]));
			sv_free_mr(mr[c][k]);
		}
	}
	CHECK_OK(ibv_destroy_cq(rcq));
	CHECK_OK(ibv_destroy_cq(scq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
