/*
 * A dead peer fails a QP only while the QP is still connected to it. When the process at the
 * other end of a connected QP dies, the QP goes to the error state once its retry budget
 * (timeout x (retry_cnt + 1)) has passed, unless it was reset meanwhile. The survivor's QP is
 * connected to peer 1, which is SIGKILLed; the QP is reset and connected to peer 2, a new
 * process that takes peer 1's registry slot, and so its QPN (a private registry makes sure).
 * Checked: SENDs both ways succeed; three budgets after peer 1 died the QP is still in RTS,
 * no async event came and another SEND succeeds. Then peer 2 is SIGKILLed while connected:
 * IBV_EVENT_QP_FATAL, the QP in ERR, its posted receive flushed.
 * (softverbs-specific: QPNs name the registry slot, slot << 14 | index.)
 */
#include "common.h"

#include <signal.h>
#include <sys/wait.h>

#define MSG 64
/* A retry budget of 4.096 us << 16 x (3 + 1): about 1.07 s. */
#define TIMEOUT 16
#define RETRY_CNT 3

static int sock;
static struct sv_pair_cfg cfg;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static int budget_ms(void)
{
	return (int)(((4096LL << TIMEOUT) * (RETRY_CNT + 1) + 999999) / 1000000);
}

/* Connects, takes a SEND and answers with one, takes another; then waits to be killed. */
static void peer_main(int s)
{
	sock = s;
	int round = hear();
	struct sv_one_qp b;
	/* Peer 2 gets peer 1's slot and, both forked from us, the same next index: peer 1's
	 * QPN. Our SENDs must then reach peer 2, not the dead peer 1's receive window. */
	sv_one_qp_open(&b, &cfg, 16, 3 * MSG);
	sv_one_qp_connect(&b, sv_trade_qpn(sock, b.qp), 1, 2, MSG);
	say(1);

	struct ibv_wc wc;
	CHECK_EQ(hear(), 2); /* the survivor's first SEND is done */
	sv_expect_wc(b.cq, 1, IBV_WC_SUCCESS, b.qp, &wc);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(sv_ptr(b.mr, 0)[MSG - 1], 0x10 + round);
	memset(sv_ptr(b.mr, 2 * MSG), 0x20 + round, MSG);
	CHECK_OK(sv_post_send(b.qp, 3, b.mr, 2 * MSG, MSG, IBV_SEND_SIGNALED));
	sv_expect_wc(b.cq, 3, IBV_WC_SUCCESS, b.qp, &wc);
	say(3);

	CHECK_EQ(hear(), 4); /* its second SEND is done */
	sv_expect_wc(b.cq, 2, IBV_WC_SUCCESS, b.qp, &wc);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(sv_ptr(b.mr, MSG)[MSG - 1], 0x30 + round);
	say(5);
	char eof;
	CHECK(read(sock, &eof, 1) == 0); /* killed before that */
}

/* Forks peer `round`, connects a->qp to it from RESET and trades a SEND each way. */
static pid_t connect_peer(struct sv_one_qp *a, int round, uint32_t *peer_qpn)
{
	pid_t child;
	sock = sv_fork_peer(peer_main, &child);
	say(round);
	*peer_qpn = sv_trade_qpn(sock, a->qp);
	sv_one_qp_connect(a, *peer_qpn, 100 + round, 1, MSG);
	CHECK_EQ(hear(), 1);

	struct ibv_wc wc;
	memset(sv_ptr(a->mr, MSG), 0x10 + round, MSG);
	CHECK_OK(sv_post_send(a->qp, 200 + round, a->mr, MSG, MSG, IBV_SEND_SIGNALED));
	sv_expect_wc(a->cq, 200 + round, IBV_WC_SUCCESS, a->qp, &wc);
	say(2);
	CHECK_EQ(hear(), 3);
	sv_expect_wc(a->cq, 100 + round, IBV_WC_SUCCESS, a->qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(sv_ptr(a->mr, 0)[MSG - 1], 0x20 + round);
	return child;
}

static void kill_peer(pid_t pid)
{
	CHECK_OK(kill(pid, SIGKILL));
	CHECK_EQ(waitpid(pid, NULL, 0), pid);
	close(sock);
}

int main(void)
{
	char dir[] = "/tmp/softverbs-peer-replaced-XXXXXX";
	sv_init("twoproc_peer_replaced");
	/* A registry of our own: the first free slot after peer 1 died is peer 1's. */
	CHECK(mkdtemp(dir) != NULL);
	CHECK(setenv("SOFTVERBS_STATE_DIR", dir, 1) == 0);
	sv_pair_cfg_init(&cfg);
	cfg.timeout = TIMEOUT;
	cfg.retry_cnt = RETRY_CNT;

	struct sv_one_qp a;
	sv_one_qp_open(&a, &cfg, 16, 2 * MSG);
	struct ibv_async_event ev;
	struct ibv_wc wc;
	uint32_t qpn1, qpn2;

	sv_step("connected to peer 1, a SEND each way");
	pid_t peer1 = connect_peer(&a, 1, &qpn1);

	sv_step("peer 1 killed; our QP reset and connected to peer 2, a SEND each way");
	kill_peer(peer1);
	long long died = sv_now_ms();
	sv_sleep_ms(100); /* time to notice the death (and arm the timer) while connected */
	CHECK_OK(sv_modify_state(a.qp, IBV_QPS_RESET));
	pid_t peer2 = connect_peer(&a, 2, &qpn2);
	printf("peer 1 QPN 0x%06x, peer 2 QPN 0x%06x\n", qpn1, qpn2);
	CHECKF(qpn2 >> 14 == qpn1 >> 14, "peer 2 is not in peer 1's registry slot");

	sv_step("three retry budgets (%d ms each) after peer 1 died: RTS, no event", budget_ms());
	int left = (int)(died + 3 * budget_ms() - sv_now_ms());
	if (sv_wait_async(a.dev.ctx, left > SV_QUIET_MS ? left : SV_QUIET_MS, &ev))
		CHECKF(0, "async event %s for %p while connected to a live peer",
		       sv_event_name(ev.event_type), sv_async_element(&ev));
	CHECK_EQ(sv_query_state(a.qp), IBV_QPS_RTS);
	sv_expect_empty(a.cq, "connected to a live peer");

	sv_step("another SEND to peer 2");
	memset(sv_ptr(a.mr, MSG), 0x32, MSG);
	CHECK_OK(sv_post_send(a.qp, 300, a.mr, MSG, MSG, IBV_SEND_SIGNALED));
	sv_expect_wc(a.cq, 300, IBV_WC_SUCCESS, a.qp, &wc);
	say(4);
	CHECK_EQ(hear(), 5);

	sv_step("peer 2 killed while connected: QP_FATAL, ERR, our receive flushed");
	CHECK_OK(sv_post_recv(a.qp, 400, a.mr, 0, MSG));
	kill_peer(peer2);
	sv_expect_async(a.dev.ctx, IBV_EVENT_QP_FATAL, a.qp);
	CHECK_EQ(sv_query_state(a.qp), IBV_QPS_ERR);
	sv_expect_wc(a.cq, 400, IBV_WC_WR_FLUSH_ERR, a.qp, &wc);

	sv_step("teardown");
	sv_one_qp_close(&a);
	{
		char path[512];
		snprintf(path, sizeof(path), "%s/registry", dir);
		unlink(path);
		rmdir(dir); /* best effort */
	}
	sv_pass();
	return 0;
}
