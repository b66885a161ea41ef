/*
 * Importing a context and its objects (ibv_import_device(3), ibv_import_pd(3),
 * ibv_import_mr(3)), in this process and in another one.
 * A (parent) opens the device, allocates a PD and registers MRs, then imports its own
 * context from dup(cmd_fd). Checked:
 *  - the imported context names the same device and answers ibv_query_device the same;
 *  - ibv_import_pd gives the same handle, ibv_import_mr the same handle, lkey, rkey and
 *    length, with addr NULL; unknown handles are EINVAL;
 *  - the imported PD is the same protection domain: QPs created on the imported context and
 *    PD SEND from the imported MR's lkey into an MR registered on the original PD, and RDMA
 *    WRITE through the imported MR's rkey lands in the original buffer;
 *  - ibv_dealloc_pd of an import is EBUSY while the PD is in use, ibv_dereg_mr of an import
 *    destroys the MR for everyone (importing it again is EINVAL; the original's own
 *    ibv_dereg_mr then only frees it); a PD unimported while a QP made on it lives goes
 *    with the QP;
 * B (child) receives the cmd_fd over a unix socket (SCM_RIGHTS) and imports it: same device,
 * same device attributes, and A's PD and MRs (keys are host-wide, the pages are A's MR
 * memfd mapped in B):
 *  - a QP of B on the imported PD SENDs from the imported lkey (A's bytes) into an MR B
 *    registered on the imported PD, and RDMA WRITEs through the imported rkey (B's responder
 *    resolves it) into A's memory, which A then checks;
 *  - A's QP, connected to a QP of B on the imported PD, WRITEs and READs A's memory through
 *    the rkey B imported (B's responder resolves it; a key B did not import: REM_ACCESS_ERR);
 *  - an MR A deregisters stops resolving in B (LOC_PROT_ERR); B's ibv_dereg_mr of an import
 *    destroys A's MR (A's own dereg then only frees it);
 *  - an exporter that dies: E (B's child) exports an MR; after E exits, B's imported key
 *    stops resolving, and importing from E's context answers EOPNOTSUPP.
 */
#include "common.h"

#include <sys/socket.h>
#include <sys/wait.h>

#define MSG 256

static int sock;

static void send_fd(int s, int fd)
{
	char byte = 'f';
	struct iovec iov = {&byte, 1};
	union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } ctl;
	memset(&ctl, 0, sizeof(ctl));
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			     .msg_controllen = sizeof(ctl.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	CHECK(sendmsg(s, &msg, 0) == 1);
}

static int recv_fd(int s)
{
	char byte;
	struct iovec iov = {&byte, 1};
	union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } ctl;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			     .msg_controllen = sizeof(ctl.buf)};
	CHECK(recvmsg(s, &msg, 0) == 1);
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	CHECK(c && c->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

struct handles {
	uint32_t pd, mr, mr2, mr3;
	uint64_t addr;
	struct ibv_device_attr attr;
};

/* B's QP pair on the imported PD, and an MR of B's own on it. */
static void b_traffic(struct ibv_context *ctx, struct ibv_pd *ipd, struct ibv_mr *imr,
		      uint64_t addr)
{
	struct sv_dev d;
	memset(&d, 0, sizeof(d));
	d.ctx = ctx;
	d.pd = ipd;
	CHECK_OK(ibv_query_device(ctx, &d.dev_attr));
	CHECK_OK(ibv_query_port(ctx, 1, &d.port_attr));
	d.gid_index = sv_gid_index();
	CHECK_OK(ibv_query_gid(ctx, 1, d.gid_index, &d.gid));
	struct sv_pair p;
	sv_pair_open(&d, NULL, &p);
	struct ibv_mr *own = sv_alloc_mr(ipd, 4096, SV_ACCESS_ALL);
	sv_step("B: SEND from the imported lkey (A's bytes) into B's MR");
	CHECK_OK(sv_post_recv(p.qp[1], 1, own, 0, MSG));
	struct ibv_sge sge = {addr, MSG, imr->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(p.qp[0], &wr, &bad));
	struct ibv_wc wc;
	sv_expect_wc(p.scq[0], 2, IBV_WC_SUCCESS, p.qp[0], &wc);
	sv_expect_wc(p.rcq[1], 1, IBV_WC_SUCCESS, p.qp[1], &wc);
	for (int i = 0; i < MSG; i++)
		CHECK_EQ(sv_ptr(own, 0)[i], 0x5a);
	sv_step("B: RDMA WRITE through the imported rkey into A's memory");
	memset(sv_ptr(own, MSG), 0xc3, MSG);
	CHECK_OK(sv_post_rdma(p.qp[1], 3, IBV_WR_RDMA_WRITE, own, MSG, MSG, IBV_SEND_SIGNALED,
			      addr + MSG, imr->rkey));
	sv_expect_wc(p.scq[1], 3, IBV_WC_SUCCESS, p.qp[1], &wc);
	sv_pair_destroy(&p);
	sv_free_mr(own);
}

/* An RC QP on d's PD connected to the other process's (both sides call it). */
static struct ibv_qp *remote_qp(struct sv_dev *d, struct ibv_cq **cq)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	*cq = sv_create_cq(d, 8, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(d, &cfg, *cq, *cq, NULL, NULL);
	uint32_t peer = sv_trade_qpn(sock, qp);
	sv_connect_remote(qp, d, &cfg, peer, NULL, 0, 0, 0);
	return qp;
}

/* Posts one SEND from (addr, lkey) on a fresh pair of the imported PD: its status. */
static enum ibv_wc_status b_send_status(struct ibv_context *ctx, struct ibv_pd *ipd,
					 uint32_t lkey, uint64_t addr)
{
	struct sv_dev d;
	memset(&d, 0, sizeof(d));
	d.ctx = ctx;
	d.pd = ipd;
	CHECK_OK(ibv_query_device(ctx, &d.dev_attr));
	CHECK_OK(ibv_query_port(ctx, 1, &d.port_attr));
	d.gid_index = sv_gid_index();
	CHECK_OK(ibv_query_gid(ctx, 1, d.gid_index, &d.gid));
	struct sv_pair p;
	sv_pair_open(&d, NULL, &p);
	struct ibv_mr *own = sv_alloc_mr(ipd, 4096, SV_ACCESS_ALL);
	CHECK_OK(sv_post_recv(p.qp[1], 1, own, 0, MSG));
	struct ibv_sge sge = {addr, MSG, lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(p.qp[0], &wr, &bad));
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(p.scq[0], 1, &wc)) == 0)
		;
	CHECK_EQ(n, 1);
	sv_pair_destroy(&p);
	sv_free_mr(own);
	return wc.status;
}

/* E: an exporter that dies. Opens the device, registers an MR, sends its cmd_fd and
 * handles to B, and exits when B says so. */
static void exporter(int s)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	struct handles h = {d.pd->handle, mr->handle, 0, 0, sv_addr(mr, 0), d.dev_attr};
	CHECK(write(s, &h, sizeof(h)) == (ssize_t)sizeof(h));
	send_fd(s, d.ctx->cmd_fd);
	char byte;
	CHECK(read(s, &byte, 1) == 1);
	_exit(0); /* no cleanup: as a crash would */
}

static void b_exporter_dies(void)
{
	int sv[2];
	CHECK_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	pid_t e = fork();
	CHECK(e >= 0);
	if (e == 0) {
		close(sv[0]);
		exporter(sv[1]);
	}
	close(sv[1]);
	struct handles h;
	CHECK(read(sv[0], &h, sizeof(h)) == (ssize_t)sizeof(h));
	int fd = recv_fd(sv[0]);
	sv_step("B: import E's PD and MR; E exits; the key stops resolving");
	struct ibv_context *ctx = ibv_import_device(fd);
	CHECK(ctx);
	struct ibv_pd *ipd = ibv_import_pd(ctx, h.pd);
	CHECK(ipd);
	struct ibv_mr *imr = ibv_import_mr(ipd, h.mr);
	CHECK(imr);
	CHECK_EQ(b_send_status(ctx, ipd, imr->lkey, h.addr), IBV_WC_SUCCESS);
	CHECK(write(sv[0], "x", 1) == 1);
	int status;
	CHECK(waitpid(e, &status, 0) == e);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK_EQ(b_send_status(ctx, ipd, imr->lkey, h.addr), IBV_WC_LOC_PROT_ERR);
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd);
	errno = 0;
	CHECK(!ibv_import_pd(ctx, h.pd + 1));
	CHECK(errno == EOPNOTSUPP || errno == EINVAL);
	CHECK_OK(ibv_close_device(ctx));
	close(sv[0]);
}

static void peer(int s)
{
	sock = s;
	struct handles h;
	CHECK(read(sock, &h, sizeof(h)) == (ssize_t)sizeof(h));
	int fd = recv_fd(sock);
	sv_step("B: import A's context from the fd it sent");
	struct ibv_context *ctx = ibv_import_device(fd);
	CHECK(ctx);
	CHECK_EQ(strcmp(ibv_get_device_name(ctx->device), "softverbs0"), 0);
	struct ibv_device_attr attr;
	CHECK_OK(ibv_query_device(ctx, &attr));
	CHECK_EQ(memcmp(&attr, &h.attr, sizeof(attr)), 0);
	sv_step("B: import A's PD and MRs");
	struct ibv_pd *ipd = ibv_import_pd(ctx, h.pd);
	CHECK(ipd);
	CHECK_EQ(ipd->handle, h.pd);
	errno = 0;
	CHECK(!ibv_import_pd(ctx, h.pd + 1000));
	CHECK_EQ(errno, EINVAL);
	struct ibv_mr *imr = ibv_import_mr(ipd, h.mr);
	CHECK(imr);
	CHECK_EQ(imr->handle, h.mr);
	CHECK_EQ(imr->lkey, h.mr);
	CHECK_EQ(imr->rkey, h.mr);
	CHECK_EQ(imr->length, 4096);
	CHECK(imr->addr == NULL);
	errno = 0;
	CHECK(!ibv_import_mr(ipd, h.mr + 0x100)); /* not (yet) a key of A's */
	CHECK_EQ(errno, EINVAL);
	b_traffic(ctx, ipd, imr, h.addr);
	sv_say(sock, 1); /* A checks the write */
	CHECK_EQ(sv_hear(sock), 2);
	sv_step("B: a QP on the imported PD that A's QP WRITEs and READs through");
	struct sv_dev bd;
	memset(&bd, 0, sizeof(bd));
	bd.ctx = ctx;
	bd.pd = ipd;
	CHECK_OK(ibv_query_device(ctx, &bd.dev_attr));
	CHECK_OK(ibv_query_port(ctx, 1, &bd.port_attr));
	bd.gid_index = sv_gid_index();
	CHECK_OK(ibv_query_gid(ctx, 1, bd.gid_index, &bd.gid));
	struct ibv_cq *bcq;
	struct ibv_qp *bqp = remote_qp(&bd, &bcq);
	CHECK_EQ(sv_hear(sock), 6);
	CHECK_OK(ibv_destroy_qp(bqp));
	CHECK_OK(ibv_destroy_cq(bcq));
	sv_step("B: A deregistered mr2: its import stops resolving");
	struct ibv_mr *imr2 = ibv_import_mr(ipd, h.mr2);
	CHECK(imr2);
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 4);
	CHECK_EQ(b_send_status(ctx, ipd, imr2->lkey, h.addr), IBV_WC_LOC_PROT_ERR);
	ibv_unimport_mr(imr2);
	sv_step("B: ibv_dereg_mr of an import destroys A's mr3");
	struct ibv_mr *imr3 = ibv_import_mr(ipd, h.mr3);
	CHECK(imr3);
	CHECK_OK(ibv_dereg_mr(imr3));
	errno = 0;
	CHECK(!ibv_import_mr(ipd, h.mr3));
	CHECK_EQ(errno, EINVAL);
	CHECK_ERR(ibv_dealloc_pd(ipd), EBUSY); /* A's MRs are on it */
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd);
	CHECK_OK(ibv_close_device(ctx)); /* closes fd too */
	b_exporter_dies();
	sv_say(sock, 5);
	exit(0);
}

int main(void)
{
	sv_init("twoproc_import");
	pid_t child;
	sock = sv_fork_peer(peer, &child);

	struct sv_dev d;
	sv_open(&d);
	struct ibv_mr *send_mr = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *recv_mr = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);

	sv_step("A: import the context from dup(cmd_fd)");
	int fd = dup(d.ctx->cmd_fd);
	CHECK(fd >= 0);
	struct ibv_context *ictx = ibv_import_device(fd);
	CHECK(ictx);
	CHECK(ictx != d.ctx);
	CHECK(ictx->device == d.ctx->device);
	struct ibv_device_attr attr;
	CHECK_OK(ibv_query_device(ictx, &attr));
	CHECK_EQ(memcmp(&attr, &d.dev_attr, sizeof(attr)), 0);
	errno = 0;
	CHECK(!ibv_import_device(-1));

	sv_step("A: import the PD and the MR");
	struct ibv_pd *ipd = ibv_import_pd(ictx, d.pd->handle);
	CHECK(ipd);
	CHECK_EQ(ipd->handle, d.pd->handle);
	CHECK(ipd->context == ictx);
	errno = 0;
	CHECK(!ibv_import_pd(ictx, d.pd->handle + 1000));
	CHECK_EQ(errno, EINVAL);
	struct ibv_mr *imr = ibv_import_mr(ipd, send_mr->handle);
	CHECK(imr);
	CHECK_EQ(imr->handle, send_mr->handle);
	CHECK_EQ(imr->lkey, send_mr->lkey);
	CHECK_EQ(imr->rkey, send_mr->rkey);
	CHECK_EQ(imr->length, send_mr->length);
	CHECK(imr->addr == NULL);
	CHECK(imr->pd == ipd);
	errno = 0;
	CHECK(!ibv_import_mr(ipd, 0x7fffff00));
	CHECK_EQ(errno, EINVAL);
	CHECK_ERR(ibv_dealloc_pd(d.pd), EBUSY);

	sv_step("A: traffic on QPs of the imported context and PD");
	struct sv_dev id = d;
	id.ctx = ictx;
	id.pd = ipd;
	struct sv_pair p;
	sv_pair_open(&id, NULL, &p);
	memset(sv_ptr(send_mr, 0), 0x5a, MSG);
	CHECK_OK(sv_post_recv(p.qp[1], 1, recv_mr, 0, MSG));
	struct ibv_sge sge = {sv_addr(send_mr, 0), MSG, imr->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(p.qp[0], &wr, &bad));
	struct ibv_wc wc;
	sv_expect_wc(p.scq[0], 2, IBV_WC_SUCCESS, p.qp[0], &wc);
	sv_expect_wc(p.rcq[1], 1, IBV_WC_SUCCESS, p.qp[1], &wc);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(memcmp(sv_ptr(recv_mr, 0), sv_ptr(send_mr, 0), MSG), 0);
	/* RDMA WRITE from recv_mr into the imported MR's memory, named by its rkey. */
	memset(sv_ptr(recv_mr, MSG), 0xc3, MSG);
	CHECK_OK(sv_post_rdma(p.qp[1], 3, IBV_WR_RDMA_WRITE, recv_mr, MSG, MSG,
			      IBV_SEND_SIGNALED, sv_addr(send_mr, MSG), imr->rkey));
	sv_expect_wc(p.scq[1], 3, IBV_WC_SUCCESS, p.qp[1], &wc);
	CHECK_EQ(memcmp(sv_ptr(send_mr, MSG), sv_ptr(recv_mr, MSG), MSG), 0);
	sv_pair_destroy(&p);

	sv_step("A: dealloc of an imported PD in use is EBUSY; dereg of an import destroys");
	CHECK_ERR(ibv_dealloc_pd(ipd), EBUSY); /* send_mr and recv_mr are on it */
	struct ibv_mr *doomed = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *idoomed = ibv_import_mr(ipd, doomed->handle);
	CHECK(idoomed);
	CHECK_OK(ibv_dereg_mr(idoomed));
	errno = 0;
	CHECK(!ibv_import_mr(ipd, doomed->handle)); /* gone for everyone */
	CHECK_EQ(errno, EINVAL);
	sv_free_mr(doomed); /* frees the struct */
	CHECK_OK(ibv_dereg_mr(imr)); /* destroys send_mr */
	errno = 0;
	CHECK(!ibv_import_mr(ipd, send_mr->handle));
	CHECK_EQ(errno, EINVAL);
	sv_free_mr(send_mr);
	send_mr = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	ibv_unimport_pd(ipd);
	/* A PD with nothing on it: dealloc of its import destroys it. */
	struct ibv_pd *empty = ibv_alloc_pd(d.ctx);
	CHECK(empty);
	struct ibv_pd *iempty = ibv_import_pd(ictx, empty->handle);
	CHECK(iempty);
	CHECK_OK(ibv_dealloc_pd(iempty));
	errno = 0;
	CHECK(!ibv_import_pd(ictx, empty->handle));
	CHECK_EQ(errno, EINVAL);
	CHECK_OK(ibv_dealloc_pd(empty)); /* frees the struct */

	sv_step("A: unimport a PD a QP was created on, then destroy the QP");
	ipd = ibv_import_pd(ictx, d.pd->handle);
	CHECK(ipd);
	struct sv_dev id2 = d;
	id2.ctx = ictx;
	id2.pd = ipd;
	struct ibv_cq *cq2 = sv_create_cq(&id2, 8, NULL, NULL);
	struct ibv_qp *qp2 = sv_create_qp(&id2, &p.cfg, cq2, cq2, NULL, NULL);
	ibv_unimport_pd(ipd); /* the QP still names it: freed with the QP (ASan watches) */
	CHECK_ERR(ibv_dealloc_pd(d.pd), EBUSY);
	CHECK_OK(ibv_destroy_qp(qp2));
	CHECK_OK(ibv_destroy_cq(cq2));

	sv_step("A: hand the cmd_fd to B");
	struct ibv_mr *mr2 = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *mr3 = sv_alloc_mr(d.pd, 4096, SV_ACCESS_ALL);
	memset(sv_ptr(send_mr, 0), 0x5a, MSG);
	struct handles h = {d.pd->handle, send_mr->handle, mr2->handle, mr3->handle,
			    sv_addr(send_mr, 0), d.dev_attr};
	CHECK(write(sock, &h, sizeof(h)) == (ssize_t)sizeof(h));
	send_fd(sock, d.ctx->cmd_fd);
	CHECK_EQ(sv_hear(sock), 1);
	for (int i = 0; i < MSG; i++)
		CHECK_EQ(sv_ptr(send_mr, MSG)[i], 0xc3); /* B's write through the import */
	sv_say(sock, 2);
	sv_step("A: WRITE and READ through send_mr's rkey at B's QP (B resolves its import)");
	struct ibv_cq *acq;
	struct ibv_qp *aqp = remote_qp(&d, &acq);
	memset(sv_ptr(recv_mr, 0), 0x77, MSG);
	CHECK_OK(sv_post_rdma(aqp, 7, IBV_WR_RDMA_WRITE, recv_mr, 0, MSG, IBV_SEND_SIGNALED,
			      sv_addr(send_mr, 2 * MSG), send_mr->rkey));
	sv_expect_wc(acq, 7, IBV_WC_SUCCESS, aqp, &wc);
	for (int i = 0; i < MSG; i++)
		CHECK_EQ(sv_ptr(send_mr, 2 * MSG)[i], 0x77);
	CHECK_OK(sv_post_rdma(aqp, 8, IBV_WR_RDMA_READ, recv_mr, 2 * MSG, MSG, IBV_SEND_SIGNALED,
			      sv_addr(send_mr, 0), send_mr->rkey));
	sv_expect_wc(acq, 8, IBV_WC_SUCCESS, aqp, &wc);
	for (int i = 0; i < MSG; i++)
		CHECK_EQ(sv_ptr(recv_mr, 2 * MSG)[i], 0x5a);
	/* A key B did not import: B's responder refuses it. */
	CHECK_OK(sv_post_rdma(aqp, 9, IBV_WR_RDMA_WRITE, recv_mr, 0, MSG, IBV_SEND_SIGNALED,
			      sv_addr(recv_mr, 0), recv_mr->rkey));
	sv_expect_wc(acq, 9, IBV_WC_REM_ACCESS_ERR, aqp, &wc);
	sv_say(sock, 6);
	CHECK_OK(ibv_destroy_qp(aqp));
	CHECK_OK(ibv_destroy_cq(acq));
	CHECK_EQ(sv_hear(sock), 3);
	sv_free_mr(mr2);
	sv_say(sock, 4);
	CHECK_EQ(sv_hear(sock), 5);
	sv_wait_peer(child, "B");
	sv_free_mr(mr3); /* destroyed by B's dereg: frees the struct */

	CHECK_OK(ibv_close_device(ictx));
	sv_free_mr(send_mr);
	sv_free_mr(recv_mr);
	sv_close(&d);
	sv_pass();
	return 0;
}
