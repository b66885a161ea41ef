/*
 * A two-process verbs program that stops at a known point, for the `softverbs stat` tests
 * (stat.sh). The parent ("receiver") and a forked child ("sender") each open the device and
 * make a PD, an MR, a completion channel, a CQ on it and an RC QP, and connect the QPs
 * (RTS). Then, as the stat tests expect it:
 *   receiver: MR of 4096 bytes; 4 receives posted; gets 2 CQ events without acking them and
 *             without polling; then sends one message itself with the CQ armed and leaves
 *             its event queued on the channel (3 completions wait in the CQ, the channel
 *             is readable); armed solicited-only at the end; an SRQ (max_wr 16) holding 6
 *             receives with limit 4. Before all that (its completion polled): a type 1
 *             memory window bound to [buf2 + 256, +512) of a second MR; an address handle
 *             to its own GID; an XRC domain opened on a file; 4096 bytes of device memory.
 *   sender:   MR of 8192 bytes; sent 2 messages (completions polled); 3 receives posted; CQ
 *             not armed.
 * Then the receiver prints "EXTRA <mw rkey> <xrcd file>" and
 * "READY <receiver pid> <sender pid> <receiver qpn> <sender qpn>"
 * and both wait until killed (the child dies with its parent).
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIE(...)                                       \
	do {                                           \
		fprintf(stderr, "stat_target: " __VA_ARGS__); \
		fprintf(stderr, "\n");                 \
		exit(1);                               \
	} while (0)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *buf;
};

static void open_side(struct side *s, size_t mr_len)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no device");
	s->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!s->ctx)
		DIE("ibv_open_device");
	s->pd = ibv_alloc_pd(s->ctx);
	s->buf = calloc(1, mr_len);
	s->mr = ibv_reg_mr(s->pd, s->buf, mr_len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	s->ch = ibv_create_comp_channel(s->ctx);
	s->cq = s->ch ? ibv_create_cq(s->ctx, 16, NULL, s->ch, 0) : NULL;
	if (!s->pd || !s->mr || !s->cq)
		DIE("pd/mr/channel/cq");
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
	};
	s->qp = ibv_create_qp(s->pd, &init);
	if (!s->qp)
		DIE("ibv_create_qp");
}

static void connect_qp(struct side *s, uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	if (ibv_query_gid(s->ctx, 1, 0, &a.ah_attr.grh.dgid))
		DIE("ibv_query_gid");
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS");
}

static void post_recvs(struct side *s, int n)
{
	for (int i = 0; i < n; ++i) {
		struct ibv_sge sge = {(uintptr_t)s->buf, 64, s->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(s->qp, &wr, &bad))
			DIE("ibv_post_recv");
	}
}

static void xwrite(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		DIE("pipe write");
}

static void xread(int fd, void *p, size_t n)
{
	if (read(fd, p, n) != (ssize_t)n)
		DIE("pipe read");
}

/* The sender: connects, then sends one message per byte it reads from `go`. */
static void sender(int to_parent, int from_parent)
{
	struct side s;
	open_side(&s, 8192);
	uint32_t qpn = s.qp->qp_num, peer;
	xwrite(to_parent, &qpn, sizeof(qpn));
	xread(from_parent, &peer, sizeof(peer));
	connect_qp(&s, peer, 2000, 1000);
	post_recvs(&s, 3);
	xwrite(to_parent, &qpn, sizeof(qpn));  /* connected */
	char c;
	while (read(from_parent, &c, 1) == 1) {
		struct ibv_sge sge = {(uintptr_t)s.buf, 16, s.mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
				   *bad;
		if (ibv_post_send(s.qp, &wr, &bad))
			DIE("ibv_post_send");
		struct ibv_wc wc;
		int got;
		while ((got = ibv_poll_cq(s.cq, 1, &wc)) == 0)
			;
		if (got < 0 || wc.status != IBV_WC_SUCCESS)
			DIE("send completion");
		xwrite(to_parent, &c, 1);
	}
	for (;;)
		pause();
}

/* The objects that are not on the data path of the test: a bound window, an AH, an XRC
 * domain on a file, device memory. The window's bind completion is polled here, before the
 * CQ is armed, so the CQ's counts later are what the tests expect. */
static void make_extras(struct side *s)
{
	static char buf2[4096];
	struct ibv_mr *mr2 = ibv_reg_mr(s->pd, buf2, sizeof(buf2),
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = mr2 ? ibv_alloc_mw(s->pd, IBV_MW_TYPE_1) : NULL;
	if (!mw)
		DIE("ibv_reg_mr/ibv_alloc_mw");
	struct ibv_mw_bind bind = {.wr_id = 55, .send_flags = IBV_SEND_SIGNALED};
	bind.bind_info.mr = mr2;
	bind.bind_info.addr = (uintptr_t)buf2 + 256;
	bind.bind_info.length = 512;
	bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_bind_mw(s->qp, mw, &bind))
		DIE("ibv_bind_mw");
	struct ibv_wc wc;
	int got;
	while ((got = ibv_poll_cq(s->cq, 1, &wc)) == 0)
		;
	if (got < 0 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 55)
		DIE("bind completion");
	struct ibv_ah_attr ah_attr = {.is_global = 1, .port_num = 1, .sl = 3};
	ah_attr.grh.hop_limit = 9;
	if (ibv_query_gid(s->ctx, 1, 0, &ah_attr.grh.dgid))
		DIE("ibv_query_gid");
	if (!ibv_create_ah(s->pd, &ah_attr))
		DIE("ibv_create_ah");
	const char *dir = getenv("SOFTVERBS_STATE_DIR");
	char path[256];
	snprintf(path, sizeof(path), "%s/xrcd-file", dir && *dir ? dir : "/tmp");
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	struct ibv_xrcd_init_attr xattr = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd, .oflags = O_CREAT};
	if (fd < 0 || !ibv_open_xrcd(s->ctx, &xattr))
		DIE("ibv_open_xrcd");
	struct ibv_alloc_dm_attr dattr = {.length = 4096};
	if (!ibv_alloc_dm(s->ctx, &dattr))
		DIE("ibv_alloc_dm");
	printf("EXTRA %u %s\n", mw->rkey, path);
}

int main(void)
{
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		DIE("pipe");
	pid_t parent = getpid();
	pid_t child = fork();
	if (child < 0)
		DIE("fork");
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		sender(up[1], down[0]);
	}
	struct side s;
	open_side(&s, 4096);
	uint32_t qpn = s.qp->qp_num, peer;
	xread(up[0], &peer, sizeof(peer));
	xwrite(down[1], &qpn, sizeof(qpn));
	connect_qp(&s, peer, 1000, 2000);
	make_extras(&s);
	post_recvs(&s, 4);
	xread(up[0], &peer, sizeof(peer));  /* the sender is connected */

	for (int i = 0; i < 2; ++i) {
		if (ibv_req_notify_cq(s.cq, 0))
			DIE("ibv_req_notify_cq");
		char c = 'm', done;
		xwrite(down[1], &c, 1);
		xread(up[0], &done, 1);
		struct ibv_cq *cq;
		void *cq_ctx;
		if (ibv_get_cq_event(s.ch, &cq, &cq_ctx) || cq != s.cq)
			DIE("ibv_get_cq_event");
		/* Not acked, not polled: on purpose. */
	}
	/* One event left on the channel: our own send's completion, the CQ armed. */
	if (ibv_req_notify_cq(s.cq, 0))
		DIE("ibv_req_notify_cq");
	struct ibv_sge sge = {(uintptr_t)s.buf, 16, s.mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	if (ibv_post_send(s.qp, &wr, &bad))
		DIE("ibv_post_send");
	struct pollfd pfd = {.fd = s.ch->fd, .events = POLLIN};
	if (poll(&pfd, 1, 10000) != 1)
		DIE("the channel did not become readable");
	if (ibv_req_notify_cq(s.cq, 1))
		DIE("ibv_req_notify_cq solicited");

	struct ibv_srq_init_attr sattr = {.attr = {.max_wr = 16, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(s.pd, &sattr);
	if (!srq)
		DIE("ibv_create_srq");
	for (int i = 0; i < 6; ++i) {
		struct ibv_sge sge = {(uintptr_t)s.buf + 1024, 64, s.mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 100 + i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_srq_recv(srq, &wr, &bad))
			DIE("ibv_post_srq_recv");
	}
	struct ibv_srq_attr limit = {.srq_limit = 4};
	if (ibv_modify_srq(srq, &limit, IBV_SRQ_LIMIT))
		DIE("ibv_modify_srq");

	printf("READY %d %d %u %u\n", (int)getpid(), (int)child, qpn, peer);
	fflush(stdout);
	for (;;)
		pause();
}
