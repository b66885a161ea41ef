/*
 * An XRC TGT QP whose creator process dies while another process holds a handle on it.
 * In the kernel the QP would live on (its holders keep it). In softverbs it runs in its
 * creator's process and goes with it (docs/xrc.md): the surviving handle must then show
 * what a QP that met a fatal error shows, never hang or fail with a bare ENXIO:
 *  - the holder's context gets IBV_EVENT_QP_FATAL for the handle, once;
 *  - ibv_query_qp answers IBV_QPS_ERR; ibv_modify_qp fails (ENXIO: nothing left to modify);
 *  - ibv_destroy_qp of the handle and ibv_close_xrcd work.
 * A (child) creates the domain on a file and the TGT QP, connects it to B's INI QP, then
 * exits without destroying anything. B (parent) opens the domain, owns the XRC SRQ, holds a
 * handle on the TGT QP and sends one SEND through it before A dies.
 */
#include "common.h"
#include "xrc_helpers.h"

#include <fcntl.h>
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
	struct ibv_qp *tgt = tgt_qp(&d, x);
	uint32_t ini_qpn, ours = tgt->qp_num;
	sv_exchange(sock, &ours, &ini_qpn, sizeof(ours));
	connect_xrc(tgt, &d, ini_qpn, 0);
	sv_say(sock, 2);
	CHECK_EQ(sv_hear(sock), 3);
	_exit(0); /* everything still open: the process just ends */
}

/* ---- B: the holder ----------------------------------------------------------------------- */

int main(void)
{
	sv_init("twoproc_xrc_creator_dies");
	if (!xrc_same_host_file(path))
		return 0;
	pid_t pid;
	int sock = sv_fork_peer(creator_main, &pid);

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
	CHECK_EQ(sv_hear(sock), 2); /* A connected its TGT QP */

	sv_step("B: a SEND through A's TGT QP");
	struct ibv_wc wc;
	CHECK_OK(sv_post_srq_recv(srq, 101, mr, 0, MSG));
	CHECK_OK(post_xrc(ini, 1, IBV_WR_SEND, srqn, mr, 4096, MSG, 0, 0));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, ini, &wc);
	sv_poll_one(rcq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 101);
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);

	sv_step("B: A dies; B's handle sees the QP fail");
	sv_say(sock, 3);
	sv_wait_peer(pid, "A");
	sv_expect_async(d.ctx, IBV_EVENT_QP_FATAL, h);
	/* Once: what else comes (the INI QP's own failure) is not about the handle again. */
	struct ibv_async_event ev;
	while (sv_wait_async(d.ctx, SV_QUIET_MS, &ev)) {
		CHECKF(!(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == h),
		       "B: a second QP_FATAL for the handle");
		ibv_ack_async_event(&ev);
	}
	CHECK_EQ(sv_query_state(h), IBV_QPS_ERR);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	CHECK_ERR(ibv_modify_qp(h, &a, IBV_QP_STATE), ENXIO);

	sv_step("B: the handle and the domain go");
	CHECK_OK(ibv_destroy_qp(h));
	CHECK_OK(ibv_destroy_qp(ini));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_close_xrcd(x));
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_close(&d);
	unlink(path);
	sv_pass();
	return 0;
}
