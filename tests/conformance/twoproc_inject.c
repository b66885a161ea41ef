/*
 * `softverbs inject` on a running process: each fault kind must produce what a NIC would
 * report for it, at both ends of an RC connection to a forked peer. Faults of the send
 * side are armed by us on our QP; faults a responder detects are armed by the peer on its
 * own QP (the command names the QP where the fault happens, as on hardware):
 *   fail FATAL_ERR (ours)   that status and IBV_EVENT_QP_FATAL, the QP in ERR
 *   qp-error (ours)         IBV_EVENT_QP_FATAL, the QP in ERR, a WR posted then flushed
 *   cq-overrun (ours)       IBV_EVENT_CQ_ERR on the CQ and IBV_EVENT_QP_FATAL on its QP
 *   fail REM_ACCESS_ERR / REM_INV_REQ_ERR / REM_OP_ERR (the peer's)
 *                           our SEND completes with it, the next is flushed, our QP in ERR
 *                           and no async event here; the peer's QP in ERR with
 *                           IBV_EVENT_QP_ACCESS_ERR / QP_REQ_ERR / QP_FATAL and every
 *                           receive it had posted flushed
 *   fail --recv LOC_LEN_ERR / LOC_PROT_ERR (the peer's)
 *                           the peer's first receive completes with it, the rest flushed,
 *                           its QP in ERR with no event; our SEND gets REM_INV_REQ_ERR /
 *                           REM_OP_ERR
 *   rnr -n 2 / -n 3 (the peer's)  with our rnr_retry 2: the SEND lands after two RNR NAKs,
 *                           then fails with IBV_WC_RNR_RETRY_EXC_ERR; the peer's QP stays RTS
 *   drop -n 2 / -n 3 (ours) with retry_cnt 2: retransmitted twice and delivered once, then
 *                           IBV_WC_RETRY_EXC_ERR; the peer got exactly the SENDs delivered
 *   dup (ours)              RC drops the duplicate: the peer gets one message
 *   delay --ms 100 (ours)   the SEND completes no sooner than 100 ms after it was posted
 *   link-down --ms 100      IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE
 * The command is $SV_SOFTVERBS (the build's tools/softverbs), run by each process with its
 * own pid and QPN. With the peer on another host (hosts.twoproc.inject) the QPs speak RoCE
 * v2 and every round runs the same: drop and dup act on datagrams, fail and delay on our
 * WQEs before they become packets, the peer's faults in its packet responder (real NAKs
 * and RNR NAKs on the wire).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"

#define LEN 64
#define RECVS 8

enum round {
	R_FATAL, R_QP_ERROR, R_CQ_OVERRUN, R_NAK_ACCESS, R_NAK_INV, R_NAK_OP, R_RECV_LEN,
	R_RECV_PROT, R_RNR, R_DROP, R_DUP, R_DELAY, R_LINK, ROUNDS
};

/* The faults the peer arms on its own QP (`fail` ARGS), the event its QP must get (0:
 * none), the status of its first receive (SUCCESS: every receive flushed) and our SEND's. */
static const struct {
	const char *args;
	enum ibv_event_type event;
	enum ibv_wc_status first_recv;
	enum ibv_wc_status ours;
} peer_fault[ROUNDS] = {
	[R_NAK_ACCESS] = {"-s REM_ACCESS_ERR", IBV_EVENT_QP_ACCESS_ERR, IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR},
	[R_NAK_INV] = {"-s REM_INV_REQ_ERR", IBV_EVENT_QP_REQ_ERR, IBV_WC_SUCCESS, IBV_WC_REM_INV_REQ_ERR},
	[R_NAK_OP] = {"-s REM_OP_ERR", IBV_EVENT_QP_FATAL, IBV_WC_SUCCESS, IBV_WC_REM_OP_ERR},
	[R_RECV_LEN] = {"--recv -s LOC_LEN_ERR", 0, IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR},
	[R_RECV_PROT] = {"--recv -s LOC_PROT_ERR", 0, IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR},
};

static void inject(const char *kind, const struct ibv_qp *qp, const char *args);
static void expect_state(struct ibv_qp *qp, enum ibv_qp_state want);

/* The peer's receives after a fault of its responder: the first completes with `first`
 * (SUCCESS: it is flushed too), every other one is flushed, its QP is in ERR. */
static void expect_receives_failed(struct ibv_cq *cq, struct ibv_qp *qp, enum ibv_wc_status first)
{
	struct ibv_wc wc[RECVS];
	int got = sv_poll(cq, RECVS, wc, SV_WAIT_MS);
	CHECKF(got == RECVS, "the peer: %d receive completions, not %d", got, RECVS);
	for (int i = 0; i < RECVS; i++) {
		enum ibv_wc_status want = i == 0 && first != IBV_WC_SUCCESS ? first : IBV_WC_WR_FLUSH_ERR;
		CHECKF(wc[i].wr_id == (uint64_t)i && wc[i].status == want,
		       "the peer: receive %d: wr_id %llu status %s, not %s", i,
		       (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status),
		       ibv_wc_status_str(want));
	}
	expect_state(qp, IBV_QPS_ERR);
}

/* The peer: per round a fresh QP with RECVS receives, its own faults armed before it says
 * it is ready; after the round it checks its side and tells how many SENDs arrived. */
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
		if (peer_fault[round].args)
			inject("fail", qp, peer_fault[round].args);
		if (round == R_RNR)
			inject("rnr", qp, "-n 2");  /* the requester's rnr_retry 2: the third try lands */
		sv_say(sock, 2);  /* in RTS: the requester's 1 ms timeout must not run out first */
		if (round == R_RNR) {
			CHECK_EQ(sv_hear(sock), 3);
			inject("rnr", qp, "-n 3");  /* one more than rnr_retry */
			sv_say(sock, 4);
		}
		CHECK_EQ(sv_hear(sock), 1);  /* the round is over */
		int ok = 0;
		if (peer_fault[round].args) {
			if (peer_fault[round].event) {
				sv_expect_async(dev.ctx, peer_fault[round].event, qp);
			} else {
				struct ibv_async_event ev;
				CHECKF(!sv_wait_async(dev.ctx, SV_QUIET_MS, &ev),
				       "the peer: async event %s after a receive error",
				       ibv_event_type_str(ev.event_type));
			}
			expect_receives_failed(cq, qp, peer_fault[round].first_recv);
		} else {
			struct ibv_wc wc[RECVS];
			int got = sv_poll(cq, RECVS, wc, SV_QUIET_MS);
			for (int i = 0; i < got; i++)
				ok += wc[i].status == IBV_WC_SUCCESS;
			if (round == R_RNR)  /* RNR is no error of the responder's */
				expect_state(qp, IBV_QPS_RTS);
		}
		sv_say(sock, ok);
		CHECK_OK(ibv_destroy_qp(qp));
		sv_drain_async(dev.ctx, 0);
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
		switch (round) {
		case R_NAK_ACCESS:
		case R_NAK_INV:
		case R_NAK_OP:
		case R_RECV_LEN:
		case R_RECV_PROT: {
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			CHECK_OK(sv_post_send(qp, 2, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, peer_fault[round].ours, qp, &wc);
			sv_expect_wc(cq, 2, IBV_WC_WR_FLUSH_ERR, qp, &wc);
			expect_state(qp, IBV_QPS_ERR);
			/* A NAK is reported by the completion alone: no async event here. */
			struct ibv_async_event ev;
			if (round == R_NAK_ACCESS)
				CHECKF(!sv_wait_async(dev.ctx, SV_QUIET_MS, &ev),
				       "async event %s at the requester", ibv_event_type_str(ev.event_type));
			break;
		}
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
			CHECK_OK(sv_post_send(qp, 1, mr, 0, LEN, IBV_SEND_SIGNALED));
			sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
			sv_say(sock, 3);
			CHECK_EQ(sv_hear(sock), 4);
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
