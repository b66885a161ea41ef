/*
 * An XRC TGT QP whose creator process dies (_exit: no code of it runs, as after a kill)
 * while other processes hold handles on it. In the kernel the QP would live on as it was
 * (its holders keep it). In softverbs its state went with the process that ran it
 * (docs/xrc.md): a holder takes the dead process's registry slot and builds the QP again
 * under its number, in ERR, and every handle shows what a QP that met a fatal error shows,
 * and stays a handle on a live QP:
 *  - each holder's context gets IBV_EVENT_QP_FATAL for its handle, once;
 *  - ibv_query_qp answers IBV_QPS_ERR;
 *  - reset and connected anew through a handle, the QP takes messages again under the same
 *    number (B's INI QP, reset and reconnected too, sends through it);
 *  - the other holder's handle sees that (query RTR) and is destroyed; B's, the last, takes
 *    the QP with it (opening it: ENOENT), and ibv_close_xrcd works.
 * A (child) creates the domain on a file and the TGT QP, connects it to B's INI QP, then
 * exits without destroying anything. B (parent) opens the domain, owns the XRC SRQ, holds a
 * handle on the TGT QP and sends one SEND through it before A dies; D (child) holds a
 * handle on it and the only one on a second TGT QP of A's. D is stopped until B has taken
 * A's slot over, so that D's handles count again at B (rejoin), the second QP being built
 * there for D.
 */
#include "common.h"
#include "xrc_helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MR_LEN 8192
#define MSG 64

static char path[] = "/tmp/softverbs-xrc-dies-XXXXXX";

/* ---- A: the creator, which dies ---------------------------------------------------------- */

static void creator_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, O_CREAT);
	CHECK(x != NULL);
	sv_say(sock, 1);
	struct ibv_qp *tgt = tgt_qp(&d, x), *other = tgt_qp(&d, x);
	uint32_t ini_qpn, ours = tgt->qp_num;
	sv_exchange(sock, &ours, &ini_qpn, sizeof(ours));
	connect_xrc(tgt, &d, ini_qpn, 0);
	CHECK_EQ(write(sock, &other->qp_num, sizeof(uint32_t)), (ssize_t)sizeof(uint32_t));
	sv_say(sock, 2);
	CHECK_EQ(sv_hear(sock), 3);
	_exit(0); /* everything still open: the process just ends */
}

/* ---- D: another holder -------------------------------------------------------------------- */

static void holder_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_xrcd *x;
	struct ibv_qp *h, *o;
	open_tgt_handles(&d, sock, path, &x, &h, 1);
	uint32_t other_qpn;
	CHECK_EQ(read(sock, &other_qpn, sizeof(other_qpn)), (ssize_t)sizeof(other_qpn));
	o = open_tgt(d.ctx, x, other_qpn);
	CHECKF(o != NULL, "D: ibv_open_qp of the other QP: %s", strerror(errno));
	sv_say(sock, 1);
	/* (Stopped by B until B took A's QPs over: D's handles count again at B, and the QP
	 * only D held is built there for them.) */
	sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, h); /* A died */
	sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, o);
	CHECK_EQ(sv_query_state(o), IBV_QPS_ERR);
	sv_say(sock, 2);
	CHECK_EQ(sv_hear(sock), 3); /* B reconnected the QP */
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
	CHECK_EQ(sv_query_state(o), IBV_QPS_ERR);
	modify_state(o, IBV_QPS_RESET); /* a live QP, at B */
	CHECK_EQ(sv_query_state(o), IBV_QPS_RESET);
	CHECK_OK(ibv_destroy_qp(o)); /* its last handle: it goes */
	CHECK(open_tgt(d.ctx, x, other_qpn) == NULL);
	CHECK_EQ(errno, ENOENT);
	CHECK_OK(ibv_destroy_qp(h));
	CHECK_OK(ibv_close_xrcd(x));
	sv_close(&d);
	sv_say(sock, 4);
	_exit(0);
}

/* ---- B: the holder ----------------------------------------------------------------------- */


int main(void)
{
	sv_init("twoproc_xrc_creator_dies");
	if (!xrc_same_host_file(path))
		return 0;
	pid_t pid, dpid;
	int sock = sv_fork_peer(creator_main, &pid);
	int dsock = sv_fork_peer(holder_main, &dpid);

	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	CHECK_EQ(sv_hear(sock), 1);
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, 0);
	CHECK(x != NULL);
	struct ibv_srq *srq = xrc_srq(&d, x, rcq);
	uint32_t srqn = srq_num(srq);
	struct ibv_qp *ini = ini_qp(&d, cq);
	uint32_t tgt_qpn, ours = ini->qp_num;
	sv_exchange(sock, &ours, &tgt_qpn, sizeof(ours));
	connect_xrc(ini, &d, tgt_qpn, 1);
	struct ibv_qp *h = open_tgt(d.ctx, x, tgt_qpn);
	CHECKF(h != NULL, "B: ibv_open_qp: %s", strerror(errno));
	uint32_t other_qpn; /* a second TGT QP of A's, which only D holds */
	CHECK_EQ(read(sock, &other_qpn, sizeof(other_qpn)), (ssize_t)sizeof(other_qpn));
	CHECK_EQ(sv_hear(sock), 2); /* A connected its TGT QP */
	CHECK_EQ(write(dsock, &tgt_qpn, sizeof(tgt_qpn)), (ssize_t)sizeof(tgt_qpn));
	CHECK_EQ(write(dsock, &other_qpn, sizeof(other_qpn)), (ssize_t)sizeof(other_qpn));
	CHECK_EQ(sv_hear(dsock), 1); /* D holds its handles */

	sv_step("B: a SEND through A's TGT QP");
	xrc_send_through(ini, cq, rcq, srq, srqn, mr, MSG, 1, 'a', tgt_qpn);
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);

	sv_step("B: A dies; the handles see the QP fail");
	CHECK_OK(kill(dpid, SIGSTOP)); /* B takes A's QPs over, D counts again there */
	sv_say(sock, 3);
	sv_wait_peer(pid, "A");
	sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, h);
	CHECK_OK(kill(dpid, SIGCONT));
	/* B's INI QP fails too, as with any dead peer (after its retries' time). */
	sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, ini);
	/* Once: what else comes is not about the handle again. */
	struct ibv_async_event ev;
	while (sv_wait_async(d.ctx, SV_QUIET_MS, &ev)) {
		CHECKF(!(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == h),
		       "B: a second QP_FATAL for the handle");
		ibv_ack_async_event(&ev);
	}
	CHECK_EQ(sv_query_state(h), IBV_QPS_ERR);
	CHECK_EQ(sv_hear(dsock), 2); /* D's handle saw it too */

	sv_step("B: the QP, reset and connected anew through B's handle, takes messages again");
	modify_state(h, IBV_QPS_RESET);
	connect_xrc(h, &d, ini->qp_num, 0);
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
	modify_state(ini, IBV_QPS_RESET);
	connect_xrc(ini, &d, tgt_qpn, 1);
	xrc_send_through(ini, cq, rcq, srq, srqn, mr, MSG, 2, 'b', tgt_qpn);

	sv_step("B: D's handle, then B's, the last: the QP and the domain go");
	sv_say(dsock, 3);
	CHECK_EQ(sv_hear(dsock), 4);
	sv_wait_peer(dpid, "D");
	CHECK_OK(ibv_destroy_qp(h));
	CHECK(open_tgt(d.ctx, x, tgt_qpn) == NULL);
	CHECK_EQ(errno, ENOENT);
	CHECK_OK(ibv_destroy_qp(ini));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_close_xrcd(x));
	CHECK(open_xrcd_file(d.ctx, path, 0) == NULL);
	CHECK_EQ(errno, EAGAIN);
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_close(&d);
	unlink(path);
	sv_pass();
	return 0;
}
