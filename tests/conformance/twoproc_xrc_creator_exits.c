/*
 * An XRC TGT QP outlives the process that created it when that process ends with exit()
 * while another process holds a handle on it (the kernel keeps a TGT QP while any process
 * holds a handle: ibv_open_qp(3)). Three processes, A and B on one host, C on that host
 * too or, with $SV_PEER_NETNS (hosts.twoproc.xrc_creator_exits), on the other host over
 * RoCE v2:
 *  - A (child) creates the domain on a file and the TGT QP, connects it to C's INI QP, and
 *    ends with exit(0), everything still open;
 *  - B (the test) opens the domain, owns the XRC SRQ and holds a handle on the TGT QP;
 *  - C (child) has the INI QP and sends through the TGT QP into B's SRQ;
 *  - D (child, A's host) holds two handles on the TGT QP, so A hands the QP to D (the
 *    holder with the most handles), and D, ending with exit(0) in turn, to B: a QP handed
 *    over twice.
 * After A's exit, nothing of the move shows:
 *  1. B's handle gets no event and queries RTR (after A's exit, and after D's); C's INI QP
 *     gets no event either, past the
 *     time in which it would fail had its peer died (timeout x (retry_cnt + 1));
 *  2. C's SEND, WRITE and READ into B complete, the receive naming the same TGT QP number;
 *  3. the QP's events reach B's handle: a SEND naming no SRQ of the domain fails the QP
 *     (C: REM_INV_REQ_ERR, B: IBV_EVENT_QP_REQ_ERR, query ERR); B resets and reconnects
 *     it through its handle, and a SEND completes again;
 *  4. a new handle can be opened on it (and destroyed);
 *  5. B destroys its handle, the last: the QP goes (opening it: ENOENT), and with the
 *     domain closed, the domain too (opening without O_CREAT: EAGAIN).
 * With SV_TEST_ADOPTER_KILLED=1 (.adopter_killed) D is killed instead of exiting: B's
 * handle then gets IBV_EVENT_QP_FATAL (which shows D, not B, ran the QP), B takes the QP
 * over, and reset and reconnected it takes C's SENDs again.
 * Before the hand-over, B's handle got IBV_EVENT_QP_FATAL at A's exit (as it still does
 * when A is killed: conformance.twoproc_xrc_creator_dies).
 * Over RoCE v2, the TGT QP's responder goes on in B where A's stopped (the expected PSN
 * and MSN are handed over) and the host's port steers the QP's datagrams to B.
 */
#include "common.h"
#include "xrc_helpers.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MR_LEN 16384
#define MSG 64

static char path[] = "/tmp/softverbs-xrc-exits-XXXXXX";

/* What B tells C to do, and C's answer (the work completion's status and any event). */
enum { DO_SEND = 1, DO_WRITE_READ, DO_BAD_SEND, DO_RECONNECT, DO_QUIET, DO_END };
struct order {
	int what;
	uint32_t srqn;
	uint64_t addr;
	uint32_t rkey;
	char fill;
};
struct answer {
	int status;
	int events; /* async events C's context got */
	char data[8];
};

/* ---- A: the creator, which ends -------------------------------------------------------- */

static void creator_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, O_CREAT);
	CHECK(x != NULL);
	struct ibv_qp *tgt = tgt_qp(&d, x);
	uint32_t ini_qpn, ours = tgt->qp_num;
	union ibv_gid peer; /* C's, when C is on the other host (else zero) */
	static const union ibv_gid none;
	sv_exchange(sock, &ours, &ini_qpn, sizeof(ours));
	CHECK_EQ(read(sock, &peer, sizeof(peer)), (ssize_t)sizeof(peer));
	connect_xrc_gid(tgt, &d, ini_qpn, 0, memcmp(&peer, &none, sizeof(peer)) ? &peer : NULL);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 2);
	exit(0); /* everything still open; the atexit handlers run */
}

/* ---- D: two handles, the first adopter ------------------------------------------------ */

static void holder_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_xrcd *x;
	struct ibv_qp *h[2];
	open_tgt_handles(&d, sock, path, &x, h, 2);
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 2); /* A has exited: D runs the QP now */
	CHECK_EQ(sv_query_state(h[0]), IBV_QPS_RTR);
	exit(0); /* and hands it on to B */
}

/* ---- C: the INI QP --------------------------------------------------------------------- */

static int count_events(struct ibv_context *ctx, int wait_ms)
{
	struct ibv_async_event ev;
	int n = 0;
	while (sv_wait_async(ctx, wait_ms, &ev)) {
		ibv_ack_async_event(&ev);
		n++;
	}
	return n;
}

static void sender_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	struct ibv_qp *ini = ini_qp(&d, cq);
	uint32_t tgt_qpn, ours = ini->qp_num;
	sv_exchange(sock, &ours, &tgt_qpn, sizeof(ours));
	sv_trade_gid(sock, ini);
	connect_xrc(ini, &d, tgt_qpn, 1);
	uint64_t id = 1;
	for (;;) {
		struct order o;
		struct answer a = {0};
		CHECK_EQ(read(sock, &o, sizeof(o)), (ssize_t)sizeof(o));
		struct ibv_wc wc;
		switch (o.what) {
		case DO_SEND:
		case DO_BAD_SEND:
			memset(sv_ptr(mr, 0), o.fill, MSG);
			CHECK_OK(post_xrc(ini, id, IBV_WR_SEND, o.srqn, mr, 0, MSG, 0, 0));
			sv_poll_one(cq, &wc);
			CHECK_EQ(wc.wr_id, id++);
			a.status = wc.status;
			break;
		case DO_WRITE_READ:
			memset(sv_ptr(mr, 1024), o.fill, 8);
			CHECK_OK(post_xrc(ini, id, IBV_WR_RDMA_WRITE, o.srqn, mr, 1024, 8, o.addr, o.rkey));
			sv_poll_one(cq, &wc);
			CHECK_EQ(wc.wr_id, id++);
			a.status = wc.status;
			if (a.status == IBV_WC_SUCCESS) {
				CHECK_OK(post_xrc(ini, id, IBV_WR_RDMA_READ, o.srqn, mr, 2048, 8, o.addr,
						  o.rkey));
				sv_poll_one(cq, &wc);
				CHECK_EQ(wc.wr_id, id++);
				a.status = wc.status;
				memcpy(a.data, sv_ptr(mr, 2048), 8);
			}
			break;
		case DO_RECONNECT: {
			struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
			CHECK_OK(ibv_modify_qp(ini, &r, IBV_QP_STATE));
			connect_xrc(ini, &d, tgt_qpn, 1);
			break;
		}
		case DO_QUIET:
			break;
		case DO_END:
			CHECK_OK(ibv_destroy_qp(ini));
			CHECK_OK(ibv_dereg_mr(mr));
			CHECK_OK(ibv_destroy_cq(cq));
			sv_close(&d);
			CHECK_EQ(write(sock, &a, sizeof(a)), (ssize_t)sizeof(a));
			_exit(0);
		}
		a.events = count_events(d.ctx, o.what == DO_QUIET ? SV_QUIET_MS : 0);
		CHECK_EQ(write(sock, &a, sizeof(a)), (ssize_t)sizeof(a));
	}
}

static struct answer ask(int sock, int what, uint32_t srqn, char fill, struct ibv_mr *mr)
{
	struct order o = {what, srqn, mr ? sv_addr(mr, 8192) : 0, mr ? mr->rkey : 0, fill};
	struct answer a;
	CHECK_EQ(write(sock, &o, sizeof(o)), (ssize_t)sizeof(o));
	CHECK_EQ(read(sock, &a, sizeof(a)), (ssize_t)sizeof(a));
	return a;
}

/* ---- B: the holder --------------------------------------------------------------------- */

/* C's SEND of `fill` lands in B's SRQ, named as coming through tgt_qpn from ini_qpn. */
static void expect_send(int csock, struct ibv_srq *srq, uint32_t srqn, struct ibv_cq *rcq,
			struct ibv_mr *mr, uint64_t id, char fill, uint32_t tgt_qpn, uint32_t ini_qpn)
{
	CHECK_OK(sv_post_srq_recv(srq, id, mr, 4096, MSG));
	struct answer a = ask(csock, DO_SEND, srqn, fill, NULL);
	CHECKF(a.status == IBV_WC_SUCCESS, "C: SEND %d: %s", (int)id, ibv_wc_status_str(a.status));
	CHECK_EQ(a.events, 0);
	struct ibv_wc wc;
	sv_poll_one(rcq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, id);
	CHECK_EQ(wc.qp_num, tgt_qpn);
	CHECK_EQ(wc.src_qp, ini_qpn);
	CHECKF(sv_ptr(mr, 4096)[0] == fill && sv_ptr(mr, 4096)[MSG - 1] == fill, "B: SEND payload");
}

/* A, on this host whichever host C is on (sv_fork_peer would put it with C). */
static int fork_on_this_host(void (*peer_main)(int sock), pid_t *pid)
{
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	*pid = fork();
	CHECK(*pid >= 0);
	if (*pid == 0) {
		close(sv[0]);
		peer_main(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	return sv[0];
}

int main(void)
{
	sv_init("twoproc_xrc_creator_exits");
	int tmp = mkstemp(path);
	CHECK(tmp >= 0);
	close(tmp);
	pid_t apid, cpid, dpid;
	int asock = fork_on_this_host(creator_main, &apid);
	int dsock = fork_on_this_host(holder_main, &dpid);
	int csock = sv_fork_peer(sender_main, &cpid);

	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *rcq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	uint32_t tgt_qpn, ini_qpn;
	CHECK_EQ(read(asock, &tgt_qpn, sizeof(tgt_qpn)), (ssize_t)sizeof(tgt_qpn));
	/* A made the domain and its TGT QP */
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, 0);
	CHECKF(x != NULL, "B: open_xrcd: %s", strerror(errno));
	struct ibv_srq *srq = xrc_srq(&d, x, rcq);
	uint32_t srqn = srq_num(srq);
	struct ibv_qp *h = open_tgt(d.ctx, x, tgt_qpn);
	CHECKF(h != NULL, "B: ibv_open_qp: %s", strerror(errno));
	sv_exchange(csock, &tgt_qpn, &ini_qpn, sizeof(ini_qpn));
	sv_trade_gid(csock, h); /* C's GID, for A's TGT QP (between hosts) */
	union ibv_gid cgid = {0};
	if (sv_peer_gid(h))
		cgid = *sv_peer_gid(h);
	CHECK_EQ(write(asock, &ini_qpn, sizeof(ini_qpn)), (ssize_t)sizeof(ini_qpn));
	CHECK_EQ(write(asock, &cgid, sizeof(cgid)), (ssize_t)sizeof(cgid));
	CHECK_EQ(sv_hear(asock), 1); /* A connected its TGT QP */
	CHECK_EQ(write(dsock, &tgt_qpn, sizeof(tgt_qpn)), (ssize_t)sizeof(tgt_qpn));
	CHECK_EQ(sv_hear(dsock), 1); /* D holds its two handles */

	sv_step("B: a SEND from C through A's TGT QP");
	expect_send(csock, srq, srqn, rcq, mr, 1, 'a', tgt_qpn, ini_qpn);
	sv_expect_async(d.ctx, IBV_EVENT_COMM_EST, h); /* once: not again after the move */

	sv_step("A exits; B's handle and C's INI QP see nothing of it");
	sv_say(asock, 2);
	sv_wait_peer(apid, "A");
	struct ibv_async_event ev;
	CHECKF(!sv_wait_async(d.ctx, SV_QUIET_MS, &ev), "B: an event (%s) after A's exit",
	       ibv_event_type_str(ev.event_type));
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
	expect_send(csock, srq, srqn, rcq, mr, 2, 'b', tgt_qpn, ini_qpn);

	if (getenv("SV_TEST_ADOPTER_KILLED")) {
		/* D runs the QP (it had the most handles): killed, no code of it runs, and
		 * the QP's state goes with it as after any kill: B takes the slot, the QP is
		 * built again in ERR, and connected anew it works (twoproc_xrc_creator_dies). */
		sv_step("D, which took the QP over, is killed: B's handle sees the QP fail");
		CHECK_OK(kill(dpid, SIGKILL));
		CHECK_EQ(waitpid(dpid, NULL, 0), dpid);
		sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, h);
		CHECK_EQ(sv_query_state(h), IBV_QPS_ERR);
		modify_state(h, IBV_QPS_RESET);
		connect_xrc(h, &d, ini_qpn, 0);
		CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
		ask(csock, DO_RECONNECT, 0, 0, NULL); /* (its own failure, on one host, may come) */
		expect_send(csock, srq, srqn, rcq, mr, 7, 'g', tgt_qpn, ini_qpn);
		CHECK_OK(ibv_destroy_qp(h));
	} else {
		sv_step("D, which took the QP over, exits too");
		sv_say(dsock, 2);
		sv_wait_peer(dpid, "D");
		CHECKF(!sv_wait_async(d.ctx, SV_QUIET_MS, &ev), "B: an event (%s) after D's exit",
		       ibv_event_type_str(ev.event_type));
		CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
		expect_send(csock, srq, srqn, rcq, mr, 6, 'f', tgt_qpn, ini_qpn);
		sv_sleep_ms(1000); /* past 8 x 67 ms: C's INI QP would have failed by now had A died */
		struct answer a = ask(csock, DO_QUIET, 0, 0, NULL);
		CHECK_EQ(a.events, 0);
		expect_send(csock, srq, srqn, rcq, mr, 3, 'c', tgt_qpn, ini_qpn);

		sv_step("B: WRITE and READ from C through the QP");
		a = ask(csock, DO_WRITE_READ, srqn, 'w', mr);
		CHECKF(a.status == IBV_WC_SUCCESS, "C: WRITE/READ: %s", ibv_wc_status_str(a.status));
		CHECKF(memcmp(sv_ptr(mr, 8192), "wwwwwwww", 8) == 0, "B: WRITE did not land");
		CHECKF(memcmp(a.data, "wwwwwwww", 8) == 0, "C: READ");

		sv_step("B: the QP's events reach B's handle; B reconnects it through the handle");
		a = ask(csock, DO_BAD_SEND, srqn + 1, 'x', NULL); /* no such SRQ in the domain */
		CHECK_EQ(a.status, IBV_WC_REM_INV_REQ_ERR);
		sv_expect_async(d.ctx, IBV_EVENT_QP_REQ_ERR, h);
		CHECK_EQ(sv_query_state(h), IBV_QPS_ERR);
		modify_state(h, IBV_QPS_RESET);
		connect_xrc(h, &d, ini_qpn, 0);
		CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
		ask(csock, DO_RECONNECT, 0, 0, NULL);
		expect_send(csock, srq, srqn, rcq, mr, 4, 'd', tgt_qpn, ini_qpn);

		sv_step("B: a new handle on the QP");
		struct ibv_qp *h2 = open_tgt(d.ctx, x, tgt_qpn);
		CHECKF(h2 != NULL, "B: a second ibv_open_qp: %s", strerror(errno));
		CHECK_EQ(sv_query_state(h2), IBV_QPS_RTR);
		CHECK_OK(ibv_destroy_qp(h2));
		expect_send(csock, srq, srqn, rcq, mr, 5, 'e', tgt_qpn, ini_qpn);

		sv_step("B: its handle, the last, destroyed: the QP and the domain go");
		CHECK_OK(ibv_destroy_qp(h));
		CHECK(open_tgt(d.ctx, x, tgt_qpn) == NULL);
		CHECK_EQ(errno, ENOENT);
	}
	/* Either way, the domain goes with B's last handle on it (A, D dead; C never opened it). */
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_close_xrcd(x));
	CHECK(open_xrcd_file(d.ctx, path, 0) == NULL);
	CHECK_EQ(errno, EAGAIN);
	ask(csock, DO_END, 0, 0, NULL);
	sv_wait_peer(cpid, "C");
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_close(&d);
	unlink(path);
	sv_pass();
	return 0;
}
