/*
 * Importing a context and its objects (ibv_import_device(3), ibv_import_pd(3),
 * ibv_import_mr(3)), in this process and in another one.
 * A (parent) opens the device, allocates a PD and registers two MRs, then imports its own
 * context from dup(cmd_fd). Checked:
 *  - the imported context names the same device and answers ibv_query_device the same;
 *  - ibv_import_pd gives the same handle, ibv_import_mr the same handle, lkey, rkey and
 *    length, with addr NULL; unknown handles are EINVAL;
 *  - the imported PD is the same protection domain: QPs created on the imported context and
 *    PD SEND from the imported MR's lkey into an MR registered on the original PD, and RDMA
 *    WRITE through the imported MR's rkey lands in the original buffer;
 *  - while an import is in use the original PD cannot go (EBUSY); ibv_dereg_mr of an
 *    imported MR and ibv_dealloc_pd of an imported PD only unimport them; a PD unimported
 *    while a QP made on it lives goes with the QP;
 * B (child) receives the cmd_fd over a unix socket (SCM_RIGHTS) and imports it: same device,
 * same device attributes, a PD of its own works, and A's PD and MR handles answer
 * EOPNOTSUPP (our objects live in A's memory; see src/verbs/import.cpp).
 */
#include "common.h"

#include <sys/socket.h>

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
	uint32_t pd, mr;
	struct ibv_device_attr attr;
};

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
	errno = 0;
	CHECK(!ibv_import_pd(ctx, h.pd));
	CHECK_EQ(errno, EOPNOTSUPP);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	errno = 0;
	CHECK(!ibv_import_mr(pd, h.mr));
	CHECK_EQ(errno, EOPNOTSUPP);
	struct ibv_mr *mr = sv_alloc_mr(pd, 4096, SV_ACCESS_ALL);
	sv_free_mr(mr);
	CHECK_OK(ibv_dealloc_pd(pd));
	CHECK_OK(ibv_close_device(ctx)); /* closes fd too */
	sv_say(sock, 1);
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

	sv_step("A: dereg of an imported MR and dealloc of an imported PD only unimport");
	CHECK_OK(ibv_dereg_mr(imr));
	imr = ibv_import_mr(ipd, send_mr->handle); /* the MR is still there */
	CHECK(imr);
	ibv_unimport_mr(imr);
	CHECK_OK(ibv_dealloc_pd(ipd));
	ipd = ibv_import_pd(ictx, d.pd->handle);
	CHECK(ipd);
	ibv_unimport_pd(ipd);

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
	struct handles h = {d.pd->handle, send_mr->handle, d.dev_attr};
	CHECK(write(sock, &h, sizeof(h)) == (ssize_t)sizeof(h));
	send_fd(sock, d.ctx->cmd_fd);
	CHECK_EQ(sv_hear(sock), 1);
	sv_wait_peer(child, "B");

	CHECK_OK(ibv_close_device(ictx));
	sv_free_mr(send_mr);
	sv_free_mr(recv_mr);
	sv_close(&d);
	sv_pass();
	return 0;
}
