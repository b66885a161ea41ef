/*
 * An XRC TGT QP whose creator destroyed its handle and closed its device, while another
 * process still holds a handle (ibv_open_qp(3): "ibv_destroy_qp() closes the opened QP and
 * destroys the underlying QP if it has no other references"; in the kernel the creator's
 * handle is one holder among others). Same host. A (parent) creates the domain on a file and
 * the TGT QP, connects it to B's INI QP; B (child) opens the domain, owns the XRC SRQ and a
 * handle on the TGT QP.
 *  1. A destroys its TGT handle, closes its domain handle (no handle of its own left: 0),
 *     deallocates and closes its device, and stays alive.
 *  2. B sends through the TGT QP into its SRQ: SEND, WRITE, READ complete; its handle still
 *     queries and modifies the QP (to ERR: its INI QP's next SEND fails, RESET, and back to
 *     RTR through the handle, with the INI QP reconnected: a SEND completes again).
 *  3. B destroys its handle: the QP goes, and with it what A kept for it: A's closed
 *     context (its async_fd is closed) and A's hold on the domain (opening it without
 *     O_CREAT fails: EAGAIN). A's process, still alive, is unharmed (it opens the device
 *     again and makes a TGT QP of a new domain).
 * With SV_TEST_OPENER_DIES=1 (conformance.twoproc_xrc_creator_leaves.opener_dies) B exits
 * in step 3 without destroying anything: A's progress thread learns of its death (pidfd)
 * and the same things go, as the kernel closes a dead process's handles.
 * The library before this test refused A's ibv_close_xrcd (EBUSY: the QP still counted
 * on A's domain handle), and closing A's device freed the context the QP still ran in.
 */
#include "common.h"
#include "xrc_helpers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MR_LEN 16384
#define MSG 64

static char path[] = "/tmp/softverbs-xrc-leave-XXXXXX";

/* ---- B: the SRQ, a handle on A's TGT QP, the INI QP ---------------------------------- */

static void peer_main(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	CHECK_EQ(sv_hear(sock), 1); /* A made the domain */
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, 0);
	CHECKF(x != NULL, "B: open_xrcd: %s", strerror(errno));
	struct ibv_srq *srq = xrc_srq(&d, x, rcq);
	uint32_t srqn = srq_num(srq);
	struct ibv_qp *ini = ini_qp(&d, cq);
	uint32_t tgt_qpn, ours = ini->qp_num;
	sv_exchange(sock, &ours, &tgt_qpn, sizeof(ours));
	connect_xrc(ini, &d, tgt_qpn, 1);
	struct ibv_qp *h = open_tgt(d.ctx, x, tgt_qpn);
	CHECKF(h != NULL, "B: ibv_open_qp: %s", strerror(errno));
	sv_say(sock, 2);            /* A connects its TGT QP, then leaves */
	CHECK_EQ(sv_hear(sock), 3); /* A's device is closed */

	sv_step("B: SEND, WRITE and READ through the TGT QP of a creator that left");
	struct ibv_wc wc;
	xrc_send_through(ini, cq, rcq, srq, srqn, mr, MSG, 1, 's', tgt_qpn);
	memset(sv_ptr(mr, 5000), 'w', 8);
	CHECK_OK(post_xrc(ini, 2, IBV_WR_RDMA_WRITE, srqn, mr, 5000, 8, sv_addr(mr, 8192), mr->rkey));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, ini, &wc);
	CHECKF(memcmp(sv_ptr(mr, 8192), "wwwwwwww", 8) == 0, "B: WRITE did not land");
	CHECK_OK(post_xrc(ini, 3, IBV_WR_RDMA_READ, srqn, mr, 12288, 8, sv_addr(mr, 8192), mr->rkey));
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, ini, &wc);
	CHECKF(memcmp(sv_ptr(mr, 12288), "wwwwwwww", 8) == 0, "B: READ");

	sv_step("B: its handle queries and modifies the QP");
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
	modify_state(h, IBV_QPS_ERR);
	CHECK_EQ(sv_query_state(h), IBV_QPS_ERR);
	CHECK_OK(post_xrc(ini, 4, IBV_WR_SEND, srqn, mr, 4096, MSG, 0, 0));
	sv_poll_one(cq, &wc); /* the TGT QP in ERR answers nothing: retries run out */
	CHECK_EQ(wc.wr_id, 4);
	CHECKF(wc.status != IBV_WC_SUCCESS, "B: a SEND through a TGT QP in ERR succeeded");
	modify_state(h, IBV_QPS_RESET);
	modify_state(ini, IBV_QPS_RESET);
	connect_xrc(h, &d, ini->qp_num, 0);
	connect_xrc(ini, &d, tgt_qpn, 1);
	CHECK_EQ(sv_query_state(h), IBV_QPS_RTR);
	xrc_send_through(ini, cq, rcq, srq, srqn, mr, MSG, 5, 't', tgt_qpn);

	if (getenv("SV_TEST_OPENER_DIES")) {
		sv_step("B: dies holding its handle");
		sv_say(sock, 4);
		_exit(0);
	}
	sv_step("B: its handle, the last, destroyed");
	CHECK_OK(ibv_destroy_qp(h));
	CHECK_OK(ibv_destroy_qp(ini));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_close_xrcd(x));
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_close(&d);
	sv_say(sock, 4);
	_exit(0);
}

/* ---- A: the creator --------------------------------------------------------------------- */

int main(void)
{
	sv_init("twoproc_xrc_creator_leaves");
	if (!xrc_same_host_file(path))
		return 0;
	pid_t pid;
	int sock = sv_fork_peer(peer_main, &pid);

	struct sv_dev d;
	sv_open(&d);
	struct ibv_xrcd *x = open_xrcd_file(d.ctx, path, O_CREAT);
	CHECK(x != NULL);
	sv_say(sock, 1);
	struct ibv_qp *tgt = tgt_qp(&d, x);
	uint32_t ini_qpn, ours = tgt->qp_num;
	sv_exchange(sock, &ours, &ini_qpn, sizeof(ours));
	CHECK_EQ(sv_hear(sock), 2); /* B holds a handle */
	connect_xrc(tgt, &d, ini_qpn, 0);

	sv_step("A: the creator destroys its handle, closes its domain and device");
	CHECK_OK(ibv_destroy_qp(tgt));
	CHECK_OK(ibv_close_xrcd(x)); /* no handle of A's left on the domain */
	int async_fd = d.ctx->async_fd;
	sv_close(&d);
	CHECK(fcntl(async_fd, F_GETFD) >= 0); /* the context stays while the QP runs in it */
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 4); /* B is done: destroyed the last handle, or dies with it */
	sv_wait_peer(pid, "B");

	sv_step("A: the QP's last handle gone, the closed context and the domain go");
	/* No fd is opened before this check, so the number is not reused. A dead B is seen
	 * by A's progress thread through a pidfd: wait for it. */
	for (int i = 0; i < 500 && fcntl(async_fd, F_GETFD) >= 0; i++)
		usleep(10000);
	CHECKF(fcntl(async_fd, F_GETFD) == -1 && errno == EBADF, "A: its closed context outlived the QP (async_fd open)");
	struct sv_dev d3;
	sv_open(&d3);
	CHECK(open_xrcd_file(d3.ctx, path, 0) == NULL); /* nobody holds the domain: gone */
	CHECK_EQ(errno, EAGAIN);
	sv_close(&d3);

	sv_step("A: the process that hosted the QP is unharmed");
	struct sv_dev d2;
	sv_open(&d2);
	struct ibv_xrcd *own = open_xrcd(d2.ctx, -1, O_CREAT);
	CHECK(own != NULL);
	struct ibv_qp *t2 = tgt_qp(&d2, own);
	CHECK_EQ(sv_query_state(t2), IBV_QPS_RESET);
	CHECK_OK(ibv_destroy_qp(t2));
	CHECK_OK(ibv_close_xrcd(own));
	sv_close(&d2);
	unlink(path);
	sv_pass();
	return 0;
}
