/*
 * `softverbs inject` on a running process: each fault kind, given to our own RC QP while it
 * talks to a QP of a forked peer, must produce what a NIC would report for it:
 *   fail REM_ACCESS_ERR   that status, the QP in ERR, the next WR flushed (no async event)
 *   fail FATAL_ERR        that status and IBV_EVENT_QP_FATAL
 *   qp-error              IBV_EVENT_QP_FATAL, the QP in ERR, a WR posted then flushed
 *   cq-overrun            IBV_EVENT_CQ_ERR on the CQ and IBV_EVENT_QP_FATAL on its QP
 *   rnr -n 2 / -n 3       with rnr_retry 2: the SEND succeeds after two RNR NAKs, then fails
 *                         with IBV_WC_RNR_RETRY_EXC_ERR
 *   drop -n 2 / -n 3      with retry_cnt 2: retransmitted twice and delivered once, then
 *                         IBV_WC_RETRY_EXC_ERR; the peer got exactly the SENDs delivered
 *   dup                   RC drops the duplicate: the peer gets one message
 *   delay --ms 100        the SEND completes no sooner than 100 ms after it was posted
 *   link-down --ms 100    IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE
 * The command is $SV_SOFTVERBS (the build's tools/softverbs), run with our pid and QPN.
 * With the peer on another host (hosts.twoproc.inject) the QP speaks RoCE v2: drop and dup
 * then act on its datagrams and its own transport answers (retransmission after the
 * timeout, the duplicate dropped by PSN); fail, rnr and delay are same-host only (the
 * command refuses them for such a QP, which is checked too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"

#define LEN 64
#define RECVS 8

enum round {
	R_FAIL, R_FATAL, R_QP_ERROR, R_CQ_OVERRUN, R_RNR, R_DROP, R_DUP, R_DELAY, R_LINK, ROUNDS
};

/* The peer: per round a fresh QP with RECVS receives; after the round it tells how many
 * SENDs arrived. */
static void peer(int sock)
{
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, LEN * RECVS, SV_ACCESS_ALL);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	for (int round = 0; round < ROUNDS; round++) {
		struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
		struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), mr, 0, RECVS, LEN);
		sv_say(sock, 2);  /* in RTS: the requester's 1 ms timeout must not run out first */
		CHECK_EQ(sv_hear(sock), 1);  /* the round is over */
		struct ibv_wc wc[RECVS];
		int got = sv_poll(cq, RECVS, wc, SV_QUIET_MS), ok = 0;
		for (int i = 0; i < got; i++)
			ok += wc[i].status == IBV_WC_SUCCESS;
		sv_say(sock, ok);
		CHECK_OK(ibv_destroy_qp(qp));
		CHECK_OK(ibv_destroy_cq(cq));
	}
	sv_free_mr(mr);
	sv_close(&dev);
	_exit(0);
}

/* Runs `softverbs inject KIND <our pid> <qpn> ARGS`; it must say ok. */
static void inject(const char *kind, const struct ibv_qp *qp, const char *args)
{
	const char *tool = getenv("SV_SOFTVERBS");
	CHECKF(tool && *tool, "SV_SOFTVERBS names the softverbs command");
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "%s inject %s %d %u %s", tool, kind, (int)getpid(),
		 qp ? qp->qp_num : 0u, args);
	sv_step("%s", cmd);
	fflush(stdout);
	CHECKF(system(cmd) == 0, "%s", cmd);
}

/* Runs the command expecting it to refuse (exit status 1). */
static void inject_refused(const char *kind, const struct ibv_qp *qp, const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "%s inject %s %d %u %s", getenv("SV_SOFTVERBS"), kind,
		 (int)getpid(), qp->qp_num, args);
	sv_step("%s (refused on the wire)", cmd);
	fflush(stdout);
	int rc = system(cmd);
	CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "%s: status %d", cmd, rc);
}

static void expect_state(struct ibv_qp *qp, enum ibv_qp_state want)
{
	CHECKF(sv_query_state(qp) == want, "QP in %s, not %s", sv_qp_state_name(sv_query_state(qp)),
	       sv_qp_state_name(want));
}

int main(void)
{
	sv_init("twoproc_inject");
	pid_t child;
	int sock = sv_fork_peer(peer, &child);
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_wc wc;
	const int on_wire = sv_peer_on_other_host();

	for (int round = 0; round < ROUNDS; round++) {
		struct sv_pair_cfg cfg;
		sv_pair_cfg_init(&cfg);
		cfg.rnr_retry = 2;
		/* 1 ms; 16 ms on the wire, where a first packet may wait for neighbour resolution */
		cfg.timeout = on_wire ? 12 : 8;
		cfg.retry_cnt = 2;
		struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
		struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		sv_connect_remote(qp, &dev, &cfg, sv_trade_qpn(sock, qp), NULL, 0, 0, 0);
		CHECK_EQ(sv_hear(sock), 2);
		int delivered = 0, want_delivered = 0;
		if (on_wire && (round == R_FAIL || round == R_FATAL || round == R_RNR || round == R_DELAY)) {
			inject_refused(round == R_RNR ? "rnr" : round == R_DELAY ? "delay" : "fail", qp,
				       round == R_DELAY ? "--ms 1" : round == R_RNR ? "" : "-s FATAL_ERR");
		} else switch (round) {
		case R_FAIL:
			inject("fail", qp, "-s REM_ACCESS_ERR");
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_REM_ACCESS_ERR, qp, &wc);
			sv_expect_wc(cq, 2, IBV_WC_WR_FLUSH_ERR, qp, &wc);
			expect_state(qp, IBV_QPS_ERR);
			break;
		case R_FATAL:
			inject("fail", qp, "-s FATAL_ERR");
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_FATAL_ERR, qp, &wc);
			sv_expect_async(dev.ctx, IBV_EVENT_QP_FATAL, qp);
			expect_state(qp, IBV_QPS_ERR);
			break;
		case R_QP_ERROR:
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			want_delivered = 1;
			inject("qp-error", qp, "");
			sv_expect_async(dev.ctx, IBV_EVENT_QP_FATAL, qp);
			expect_state(qp, IBV_QPS_ERR);
			CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 2, IBV_WC_WR_FLUSH_ERR, qp, &wc);
			break;
		case R_CQ_OVERRUN:
			inject("cq-overrun", qp, "");
			sv_expect_async(dev.ctx, IBV_EVENT_CQ_ERR, cq);
			sv_expect_async(dev.ctx, IBV_EVENT_QP_FATAL, qp);
			expect_state(qp, IBV_QPS_ERR);
			break;
		case R_RNR:
			inject("rnr", qp, "-n 2");  /* rnr_retry 2: two NAKs, the third try lands */
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			inject("rnr", qp, "-n 3");
			CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 2, IBV_WC_RNR_RETRY_EXC_ERR, qp, &wc);
			expect_state(qp, IBV_QPS_ERR);
			want_delivered = 1;
			break;
		case R_DROP:
			inject("drop", qp, "-n 2");  /* retry_cnt 2: lost twice, the third copy lands */
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			inject("drop", qp, "-n 3");
			CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 2, IBV_WC_RETRY_EXC_ERR, qp, &wc);
			expect_state(qp, IBV_QPS_ERR);
			want_delivered = 1;
			break;
		case R_DUP:
			inject("dup", qp, "");
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			want_delivered = 1;
			break;
		case R_DELAY: {
			inject("delay", qp, "--ms 100");
			long long t0 = sv_now_ms();
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			long long took = sv_now_ms() - t0;
			CHECKF(took >= 100, "delayed by %lld ms", took);  /* a lower bound only */
			want_delivered = 1;
			break;
		}
		case R_LINK:
			inject("link-down", NULL, "--ms 100");
			sv_expect_async(dev.ctx, IBV_EVENT_PORT_ERR, NULL);
			sv_expect_async(dev.ctx, IBV_EVENT_PORT_ACTIVE, NULL);
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			want_delivered = 1;
			break;
		}
		sv_say(sock, 1);
		delivered = sv_hear(sock);
		CHECKF(delivered == want_delivered, "round %d: the peer got %d SENDs, not %d", round,
		       delivered, want_delivered);
		CHECK_OK(ibv_destroy_qp(qp));
		sv_drain_async(dev.ctx, 0);
		CHECK_OK(ibv_destroy_cq(cq));
	}
	sv_free_mr(mr);
	sv_close(&dev);
	sv_wait_peer(child, "the peer");
	sv_pass();
	return 0;
}
