/*
 * XRC between two processes (ibv_open_xrcd(3), ibv_create_srq_ex(3), ibv_open_qp(3),
 * ibv_post_send(3)'s remote_srqn): A (parent) holds an XRC domain opened on a file, XRC
 * SRQs and a TGT QP; B (child) sends to them from an XRC INI QP.
 *  1. SEND, RDMA WRITE and READ named at A's XRC SRQ: the receive completes on the SRQ's
 *     CQ with the TGT QP's number (wc.qp_num) and the INI QP's (wc.src_qp); the SRQ limit
 *     event fires as for a basic SRQ; ibv_open_qp gives a second handle on the TGT QP, in A
 *     and (same host) in B, through A's agent.
 *  2. A message naming an XRC SRQ of another domain (an fd -1 one): B's WR fails with
 *     REM_INV_REQ_ERR, the TGT QP goes to ERR and every handle hears the event (B's too,
 *     which then moves the QP to RESET).
 *  3. The domain file closed and opened again names the same domain: an SRQ created
 *     through the new handle takes messages from a TGT QP of the first.
 *  4. (same host) B opens the domain on the same file: it exists for B (O_EXCL fails), it
 *     outlives A's handles while B holds it, and once B died without closing it, it is
 *     gone (no O_CREAT: EAGAIN).
 *  5. Three processes: C (a second child of A, always on A's host) opens the domain and
 *     owns an XRC SRQ; B's INI QP sends through A's TGT QP into C's SRQ: SEND (completion
 *     in C: wc.qp_num the TGT QP, wc.src_qp the INI QP), WRITE and READ at C's memory (the
 *     SRQ's PD), a SEND that meets C's SRQ empty and waits (RNR) until C posts, a
 *     three-packet SEND and WRITE and a FETCH_ADD; then a garbage SRQ number in C's range
 *     and, once C died, C's SRQ number: REM_INV_REQ_ERR, the TGT QP to ERR with
 *     IBV_EVENT_QP_REQ_ERR.
 * Run between hosts (tests/hosts/twoproc.sh) steps 1-3 and 5 are the same over RoCE v2 (in
 * step 5 A's process hands each message to C's whole, docs/xrc.md).
 */
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MR_LEN 65536
#define MSG 64

static int sock;
static char path[] = "/tmp/softverbs-xrc-XXXXXX";

struct a_info {
	uint32_t tgt_qpn, srqn, other_srqn, srqn3, tgt2_qpn;
	uint64_t addr;
	uint32_t rkey;
	uint32_t c_srqn, c_rkey; /* step 5: C's XRC SRQ and memory */
	uint64_t c_addr;
};

#define BIG 3000 /* three packets at MTU 1024 */

static struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags)
{
	struct ibv_xrcd_init_attr a = {0};
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = fd;
	a.oflags = oflags;
	return ibv_open_xrcd(ctx, &a);
}

static struct ibv_srq *xrc_srq(struct sv_dev *d, struct ibv_xrcd *x, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {0};
	a.attr.max_wr = 16;
	a.attr.max_sge = 1;
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
		      IBV_SRQ_INIT_ATTR_CQ;
	a.srq_type = IBV_SRQT_XRC;
	a.pd = d->pd;
	a.xrcd = x;
	a.cq = cq;
	struct ibv_srq *s = ibv_create_srq_ex(d->ctx, &a);
	CHECK(s != NULL);
	return s;
}

static uint32_t srq_num(struct ibv_srq *s)
{
	uint32_t n = 0;
	CHECK_OK(ibv_get_srq_num(s, &n));
	return n;
}

static struct ibv_qp *tgt_qp(struct sv_dev *d, struct ibv_xrcd *x)
{
	struct ibv_qp_init_attr_ex a = {0};
	a.qp_type = IBV_QPT_XRC_RECV;
	a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	a.xrcd = x;
	struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &a);
	CHECK(qp != NULL);
	return qp;
}

static struct ibv_qp *ini_qp(struct sv_dev *d, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex a = {0};
	a.qp_type = IBV_QPT_XRC_SEND;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = d->pd;
	a.send_cq = cq;
	a.cap.max_send_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_wr = 4; /* an INI QP has no receive queue: ignored, reported 0 */
	struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &a);
	CHECK(qp != NULL);
	CHECK_EQ(a.cap.max_recv_wr, 0);
	return qp;
}

/* INIT, then RTR to dest (and RTS for an INI QP), with the masks the kernel's table wants
 * for XRC: an INI QP takes no receive attributes (max_dest_rd_atomic: EINVAL). */
static void connect_xrc(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest, int ini)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	CHECK_OK(sv_modify_init(qp, &cfg));
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = cfg.mtu;
	a.dest_qp_num = dest;
	a.rq_psn = cfg.psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	const union ibv_gid *peer = sv_peer_gid(qp);
	a.ah_attr.grh.dgid = peer ? *peer : d->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (ini)
		CHECK_ERR(ibv_modify_qp(qp, &a, mask | IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
	else
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK_OK(ibv_modify_qp(qp, &a, mask));
	if (ini)
		CHECK_OK(sv_modify_rts(qp, &cfg));
}

static int post_xrc(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, uint32_t srqn,
		    struct ibv_mr *mr, size_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {sv_addr(mr, off), len, mr->lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.qp_type.xrc.remote_srqn = srqn;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static int post_xrc_fetch_add(struct ibv_qp *qp, uint64_t id, uint32_t srqn, struct ibv_mr *mr,
			      size_t off, uint64_t raddr, uint32_t rkey, uint64_t add)
{
	struct ibv_sge sge = {sv_addr(mr, off), 8, mr->lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.qp_type.xrc.remote_srqn = srqn;
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = add;
	return ibv_post_send(qp, &wr, &bad);
}

/* ---- B: the INI side ------------------------------------------------------------------ */

static void peer_main(int s)
{
	sock = s;
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	struct ibv_qp *ini = ini_qp(&d, cq);
	CHECK_ERR(ibv_post_recv(ini, &(struct ibv_recv_wr){0}, &(struct ibv_recv_wr *){0}), EINVAL);
	struct a_info a, mine = {.tgt_qpn = ini->qp_num};
	sv_exchange(sock, &mine, &a, sizeof(a));
	sv_trade_gid(sock, ini);
	connect_xrc(ini, &d, a.tgt_qpn, 1);
	CHECK_EQ(sv_hear(sock), 1);
	/* Same host: this process opens A's TGT QP too (its domain, through the file). */
	struct ibv_xrcd *bx = NULL;
	struct ibv_qp *bt = NULL;
	if (!sv_peer_on_other_host()) {
		int fd = open(path, O_RDONLY);
		CHECK(fd >= 0);
		bx = open_xrcd(d.ctx, fd, 0);
		CHECK(bx != NULL);
		close(fd);
		struct ibv_qp_open_attr oa = {0};
		oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
		oa.qp_num = a.tgt_qpn;
		oa.xrcd = bx;
		oa.qp_type = IBV_QPT_XRC_RECV;
		bt = ibv_open_qp(d.ctx, &oa);
		CHECKF(bt != NULL, "ibv_open_qp of A's TGT QP failed: %s", strerror(errno));
		CHECK_EQ(bt->qp_num, a.tgt_qpn);
		CHECK_EQ(sv_query_state(bt), IBV_QPS_RTR);
		oa.qp_num = a.tgt_qpn + 1000; /* no such QP */
		CHECK(ibv_open_qp(d.ctx, &oa) == NULL);
	}

	struct ibv_wc wc;
	memset(sv_ptr(mr, 0), 'x', MSG);
	CHECK_OK(post_xrc(ini, 1, IBV_WR_SEND, a.srqn, mr, 0, MSG, 0, 0));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, ini, &wc);
	memset(sv_ptr(mr, 1024), 'w', 8);
	CHECK_OK(post_xrc(ini, 2, IBV_WR_RDMA_WRITE, a.srqn, mr, 1024, 8, a.addr + 4096, a.rkey));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, ini, &wc);
	CHECK_OK(post_xrc(ini, 3, IBV_WR_RDMA_READ, a.srqn, mr, 2048, 8, a.addr + 8192, a.rkey));
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, ini, &wc);
	CHECKF(memcmp(sv_ptr(mr, 2048), "rrrrrrrr", 8) == 0, "READ brought the wrong bytes");
	sv_say(sock, 2);

	/* 2: an SRQ of another domain */
	CHECK_EQ(sv_hear(sock), 3);
	CHECK_OK(post_xrc(ini, 4, IBV_WR_SEND, a.other_srqn, mr, 0, MSG, 0, 0));
	sv_expect_wc(cq, 4, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
	if (bt) {
		/* The TGT QP's event reached this process's handle; modify goes to A's QP. */
		sv_expect_async(d.ctx, IBV_EVENT_QP_REQ_ERR, bt);
		CHECK_EQ(sv_query_state(bt), IBV_QPS_ERR);
		CHECK_OK(sv_modify_state(bt, IBV_QPS_RESET));
		CHECK_EQ(sv_query_state(bt), IBV_QPS_RESET);
		CHECK_OK(ibv_destroy_qp(bt));
	}
	CHECK_OK(ibv_destroy_qp(ini));
	sv_say(sock, 4);

	/* 3: a new INI QP to A's second TGT QP, at the SRQ made through the reopened file */
	ini = ini_qp(&d, cq);
	mine.tgt_qpn = ini->qp_num;
	sv_exchange(sock, &mine, &a, sizeof(a));
	sv_trade_gid(sock, ini);
	connect_xrc(ini, &d, a.tgt2_qpn, 1);
	CHECK_EQ(sv_hear(sock), 5);
	CHECK_OK(post_xrc(ini, 5, IBV_WR_SEND, a.srqn3, mr, 0, MSG, 0, 0));
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, ini, &wc);
	CHECK_OK(ibv_destroy_qp(ini));
	sv_say(sock, 6);

	/* 5: through A's TGT QP into C's XRC SRQ */
	{
		ini = ini_qp(&d, cq);
		mine.tgt_qpn = ini->qp_num;
		sv_exchange(sock, &mine, &a, sizeof(a));
		sv_trade_gid(sock, ini);
		connect_xrc(ini, &d, a.tgt2_qpn, 1);
		CHECK_EQ(sv_hear(sock), 30);
		memset(sv_ptr(mr, 0), 'c', MSG);
		CHECK_OK(post_xrc(ini, 50, IBV_WR_SEND, a.c_srqn, mr, 0, MSG, 0, 0));
		sv_expect_wc(cq, 50, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 1024), 'W', 8);
		CHECK_OK(post_xrc(ini, 51, IBV_WR_RDMA_WRITE, a.c_srqn, mr, 1024, 8, a.c_addr + 4096,
				  a.c_rkey));
		sv_expect_wc(cq, 51, IBV_WC_SUCCESS, ini, &wc);
		CHECK_OK(post_xrc(ini, 52, IBV_WR_RDMA_READ, a.c_srqn, mr, 2048, 8, a.c_addr + 8192,
				  a.c_rkey));
		sv_expect_wc(cq, 52, IBV_WC_SUCCESS, ini, &wc);
		CHECKF(memcmp(sv_ptr(mr, 2048), "CCCCCCCC", 8) == 0, "READ of C's memory");
		/* C's SRQ is empty now: this SEND waits (RNR) until C posts. */
		CHECK_OK(post_xrc(ini, 53, IBV_WR_SEND, a.c_srqn, mr, 0, MSG, 0, 0));
		sv_say(sock, 31);
		sv_expect_wc(cq, 53, IBV_WC_SUCCESS, ini, &wc);
		/* Several packets each: over RoCE v2 A stages them and hands each message over. */
		memset(sv_ptr(mr, 8192), 'L', BIG);
		CHECK_OK(post_xrc(ini, 56, IBV_WR_SEND, a.c_srqn, mr, 8192, BIG, 0, 0));
		sv_expect_wc(cq, 56, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 12288), 'M', BIG);
		CHECK_OK(post_xrc(ini, 57, IBV_WR_RDMA_WRITE, a.c_srqn, mr, 12288, BIG,
				  a.c_addr + 32768, a.c_rkey));
		sv_expect_wc(cq, 57, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 16384), 0xee, 8);
		CHECK_OK(post_xrc_fetch_add(ini, 58, a.c_srqn, mr, 16384, a.c_addr + 24576, a.c_rkey, 5));
		sv_expect_wc(cq, 58, IBV_WC_SUCCESS, ini, &wc);
		uint64_t orig;
		memcpy(&orig, sv_ptr(mr, 16384), 8);
		CHECK_EQ(orig, 0); /* C's word before the add */
		/* A number in C's range that names no SRQ */
		CHECK_OK(post_xrc(ini, 54, IBV_WR_SEND, a.c_srqn + 7, mr, 0, MSG, 0, 0));
		sv_expect_wc(cq, 54, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 32);
		/* C is gone now: its SRQ number names nothing */
		ini = ini_qp(&d, cq);
		mine.tgt_qpn = ini->qp_num;
		sv_exchange(sock, &mine, &a, sizeof(a));
		sv_trade_gid(sock, ini);
		connect_xrc(ini, &d, a.tgt2_qpn, 1);
		CHECK_EQ(sv_hear(sock), 33);
		CHECK_OK(post_xrc(ini, 55, IBV_WR_SEND, a.c_srqn, mr, 0, MSG, 0, 0));
		sv_expect_wc(cq, 55, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 34);
	}

	/* 4: the domain's file, from this process (same host only) */
	if (!sv_peer_on_other_host()) {
		int fd = open(path, O_RDONLY);
		CHECK(fd >= 0);
		CHECK(open_xrcd(d.ctx, fd, O_CREAT | O_EXCL) == NULL);
		CHECK_EQ(errno, EINVAL); /* it exists: A holds it */
		struct ibv_xrcd *x = open_xrcd(d.ctx, fd, 0);
		CHECK(x != NULL);
		sv_say(sock, 7);
		CHECK_EQ(sv_hear(sock), 8);
		/* Dies holding it: no ibv_close_xrcd, no cleanup. */
		_exit(0);
	}
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&d);
	_exit(0);
}

/* ---- C: an XRC SRQ of the domain in a third process (step 5) ------------------------- */

struct c_info {
	uint32_t srqn, rkey;
	uint64_t addr;
	uint32_t tgt_qpn, ini_qpn;
};

static void c_main(int s)
{
	struct sv_dev d;
	sv_open(&d);
	CHECK_EQ(sv_hear(s), 20); /* A made the domain */
	int fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	struct ibv_xrcd *x = open_xrcd(d.ctx, fd, 0);
	CHECKF(x != NULL, "C: open_xrcd: %s", strerror(errno));
	close(fd);
	struct ibv_cq *cq = sv_create_cq(&d, 16, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	memset(sv_ptr(mr, 8192), 'C', 8);
	memset(sv_ptr(mr, 24576), 0, 8);
	struct ibv_srq *srq = xrc_srq(&d, x, cq);
	CHECK_OK(sv_post_srq_recv(srq, 500, mr, 0, MSG));
	struct c_info mine = {srq_num(srq), mr->rkey, sv_addr(mr, 0), 0, 0}, a;
	sv_exchange(s, &mine, &a, sizeof(a)); /* A tells the TGT and INI QP numbers */
	struct ibv_wc wc;
	sv_poll_one(cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.wr_id, 500);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(wc.qp_num, a.tgt_qpn); /* the TGT QP of another process */
	CHECK_EQ(wc.src_qp, a.ini_qpn);
	CHECKF(sv_ptr(mr, 0)[0] == 'c' && sv_ptr(mr, 0)[MSG - 1] == 'c', "C: SEND payload");
	CHECK_EQ(sv_hear(s), 22); /* B's WRITE and READ are done, its next SEND waits */
	CHECKF(memcmp(sv_ptr(mr, 4096), "WWWWWWWW", 8) == 0, "C: WRITE did not land");
	sv_expect_empty(cq, "C's SRQ CQ before the receive is posted");
	CHECK_OK(sv_post_srq_recv(srq, 501, mr, 0, MSG));
	CHECK_OK(sv_post_srq_recv(srq, 502, mr, 16384, 4096));
	sv_poll_one(cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 501);
	CHECK_EQ(wc.qp_num, a.tgt_qpn);
	sv_poll_one(cq, &wc); /* B's three-packet SEND */
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 502);
	CHECK_EQ(wc.byte_len, BIG);
	CHECK_EQ(wc.src_qp, a.ini_qpn);
	CHECKF(sv_ptr(mr, 16384)[0] == 'L' && sv_ptr(mr, 16384)[BIG - 1] == 'L' &&
		       sv_ptr(mr, 16384)[BIG] == 0,
	       "C: the three-packet SEND");
	CHECK_EQ(sv_hear(s), 23);
	CHECKF(sv_ptr(mr, 32768)[0] == 'M' && sv_ptr(mr, 32768)[BIG - 1] == 'M',
	       "C: the three-packet WRITE did not land");
	uint64_t word;
	memcpy(&word, sv_ptr(mr, 24576), 8);
	CHECK_EQ(word, 5); /* B's FETCH_ADD */
	/* Dies with its SRQ: no cleanup. */
	_exit(0);
}

static pid_t fork_c(int *s)
{
	int sv[2];
	CHECK_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		c_main(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	*s = sv[0];
	return pid;
}

/* ---- A: the domain, its SRQs and TGT QPs ----------------------------------------------- */

int main(void)
{
	sv_init("twoproc_xrc");
	int tmp = mkstemp(path);
	CHECK(tmp >= 0);
	close(tmp);
	pid_t pid;
	sock = sv_fork_peer(peer_main, &pid);
	int csock = -1;
	pid_t cpid = fork_c(&csock);

	struct sv_dev d;
	sv_open(&d);
	CHECKF(d.dev_attr.device_cap_flags & IBV_DEVICE_XRC, "IBV_DEVICE_XRC not reported");
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_cq *cq2 = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	memset(sv_ptr(mr, 8192), 'r', 8);

	sv_step("open_xrcd: the flags' rules");
	int fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	CHECK(open_xrcd(d.ctx, fd, 0) == NULL); /* no domain on the file yet, no O_CREAT */
	CHECK_EQ(errno, EAGAIN);
	struct ibv_xrcd *x = open_xrcd(d.ctx, fd, O_CREAT | O_EXCL);
	CHECK(x != NULL);
	if (cpid > 0)
		sv_say(csock, 20);
	CHECK(open_xrcd(d.ctx, fd, O_CREAT | O_EXCL) == NULL);
	CHECK_EQ(errno, EINVAL);
	struct ibv_xrcd_init_attr bad = {.comp_mask = IBV_XRCD_INIT_ATTR_FD, .fd = fd};
	CHECK(ibv_open_xrcd(d.ctx, &bad) == NULL); /* OFLAGS missing */
	CHECK(open_xrcd(d.ctx, 12345, O_CREAT) == NULL);
	CHECK_EQ(errno, EBADF);
	struct ibv_xrcd *own = open_xrcd(d.ctx, -1, O_CREAT); /* a domain of its own */
	CHECK(own != NULL);

	struct ibv_srq *srq = xrc_srq(&d, x, cq);
	struct ibv_srq *other = xrc_srq(&d, own, cq2);
	CHECK(srq_num(srq) != srq_num(other));
	struct ibv_qp *tgt = tgt_qp(&d, x);
	CHECK_ERR(ibv_close_xrcd(x), EBUSY);

	struct a_info a = {.tgt_qpn = tgt->qp_num, .srqn = srq_num(srq),
			   .other_srqn = srq_num(other), .addr = sv_addr(mr, 0),
			   .rkey = mr->rkey}; /* step 5's c_* come later */
	struct a_info b;
	sv_exchange(sock, &a, &b, sizeof(a));
	uint32_t ini_qpn = b.tgt_qpn; /* B sends its INI QP's number there */
	sv_trade_gid(sock, tgt);
	connect_xrc(tgt, &d, ini_qpn, 0);

	sv_step("ibv_open_qp: a second handle on the TGT QP");
	struct ibv_qp_open_attr oa = {0};
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = tgt->qp_num;
	oa.xrcd = x;
	oa.qp_type = IBV_QPT_XRC_RECV;
	struct ibv_qp *opened = ibv_open_qp(d.ctx, &oa);
	CHECK(opened != NULL);
	CHECK_EQ(opened->qp_num, tgt->qp_num);
	CHECK_EQ(sv_query_state(opened), IBV_QPS_RTR);
	oa.xrcd = own;
	CHECK(ibv_open_qp(d.ctx, &oa) == NULL); /* not a QP of that domain */

	sv_step("SEND, WRITE and READ at the XRC SRQ");
	CHECK_OK(sv_post_srq_recv(srq, 100, mr, 0, MSG));
	CHECK_OK(sv_post_srq_recv(srq, 101, mr, MSG, MSG));
	struct ibv_srq_attr sa = {.srq_limit = 2};
	CHECK_OK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT));
	sv_say(sock, 1);
	struct ibv_wc wc;
	sv_poll_one(cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.wr_id, 100);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(wc.qp_num, tgt->qp_num); /* the TGT QP's number, as mlx5 reports it */
	CHECK_EQ(wc.src_qp, ini_qpn);
	CHECKF(sv_ptr(mr, 0)[0] == 'x' && sv_ptr(mr, 0)[MSG - 1] == 'x', "SEND payload");
	sv_expect_async(d.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq);
	CHECK_EQ(sv_hear(sock), 2);
	CHECKF(memcmp(sv_ptr(mr, 4096), "wwwwwwww", 8) == 0, "WRITE did not land");
	sv_expect_empty(cq2, "the other domain's SRQ CQ");

	sv_step("an XRC SRQ of another domain: invalid request");
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 4);
	struct ibv_async_event ev[2];
	for (int i = 0; i < 2; i++) {
		CHECKF(sv_wait_async(d.ctx, 5000, &ev[i]) == 1, "TGT QP error event %d missing", i);
		CHECK_EQ(ev[i].event_type, IBV_EVENT_QP_REQ_ERR);
		ibv_ack_async_event(&ev[i]);
	}
	CHECKF((ev[0].element.qp == tgt && ev[1].element.qp == opened) ||
		       (ev[0].element.qp == opened && ev[1].element.qp == tgt),
	       "the event must reach both handles of the TGT QP");
	/* On one host B's handle moved the QP to RESET (ibv_open_qp across processes). */
	enum ibv_qp_state now = sv_peer_on_other_host() ? IBV_QPS_ERR : IBV_QPS_RESET;
	CHECK_EQ(sv_query_state(opened), now);
	CHECK_EQ(sv_query_state(tgt), now);
	sv_expect_empty(cq2, "the other domain's SRQ CQ");
	CHECK_OK(ibv_destroy_qp(tgt)); /* the QP lives on: `opened` still names it */
	CHECK_EQ(sv_query_state(opened), now);
	CHECK_OK(ibv_destroy_qp(opened));

	sv_step("the domain file closed and opened again: the same domain");
	close(fd);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	struct ibv_xrcd *x2 = open_xrcd(d.ctx, fd, 0);
	CHECK(x2 != NULL);
	struct ibv_srq *srq3 = xrc_srq(&d, x2, cq);
	struct ibv_qp *tgt2 = tgt_qp(&d, x);
	a.srqn3 = srq_num(srq3);
	a.tgt2_qpn = tgt2->qp_num;
	sv_exchange(sock, &a, &b, sizeof(a));
	ini_qpn = b.tgt_qpn;
	sv_trade_gid(sock, tgt2);
	connect_xrc(tgt2, &d, ini_qpn, 0);
	CHECK_OK(sv_post_srq_recv(srq3, 300, mr, 0, MSG));
	sv_say(sock, 5);
	sv_poll_one(cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 300);
	CHECK_EQ(wc.qp_num, tgt2->qp_num);
	CHECK_EQ(sv_hear(sock), 6);

	if (cpid > 0) {
		sv_step("three processes: through our TGT QP into C's XRC SRQ");
		struct c_info c, to_c;
		CHECK(read(csock, &c, sizeof(c)) == (ssize_t)sizeof(c)); /* C's SRQ; to_c follows */
		a.c_srqn = c.srqn;
		a.c_addr = c.addr;
		a.c_rkey = c.rkey;
		sv_exchange(sock, &a, &b, sizeof(a));
		sv_trade_gid(sock, tgt2);
		CHECK_OK(sv_modify_state(tgt2, IBV_QPS_RESET));
		connect_xrc(tgt2, &d, b.tgt_qpn, 0);
		to_c.tgt_qpn = tgt2->qp_num;
		to_c.ini_qpn = b.tgt_qpn;
		CHECK(write(csock, &to_c, sizeof(to_c)) == (ssize_t)sizeof(to_c));
		sv_say(sock, 30);
		CHECK_EQ(sv_hear(sock), 31); /* B's SEND at C's empty SRQ is on its way */
		sv_say(csock, 22);
		CHECK_EQ(sv_hear(sock), 32); /* B's garbage SRQ number failed */
		sv_expect_async(d.ctx, IBV_EVENT_QP_REQ_ERR, tgt2);
		CHECK_EQ(sv_query_state(tgt2), IBV_QPS_ERR);
		sv_say(csock, 23);
		sv_wait_peer(cpid, "C");
		close(csock);
		sv_exchange(sock, &a, &b, sizeof(a));
		sv_trade_gid(sock, tgt2);
		CHECK_OK(sv_modify_state(tgt2, IBV_QPS_RESET));
		connect_xrc(tgt2, &d, b.tgt_qpn, 0);
		sv_say(sock, 33);
		CHECK_EQ(sv_hear(sock), 34); /* C's SRQ number failed once C died */
		sv_expect_async(d.ctx, IBV_EVENT_QP_REQ_ERR, tgt2);
		CHECK_EQ(sv_query_state(tgt2), IBV_QPS_ERR);
	}

	sv_step("teardown; the domain outlives our handles while B holds it");
	if (!sv_peer_on_other_host())
		CHECK_EQ(sv_hear(sock), 7); /* B opened it too */
	CHECK_OK(ibv_destroy_qp(tgt2));
	CHECK_OK(ibv_destroy_srq(srq3));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_destroy_srq(other));
	CHECK_OK(ibv_close_xrcd(x2));
	CHECK_OK(ibv_close_xrcd(x));
	CHECK_OK(ibv_close_xrcd(own));
	if (!sv_peer_on_other_host()) {
		struct ibv_xrcd *held = open_xrcd(d.ctx, fd, 0);
		CHECKF(held != NULL, "B holds the domain: it exists");
		CHECK_OK(ibv_close_xrcd(held));
		sv_say(sock, 8);
	}
	sv_wait_peer(pid, "B");
	if (!sv_peer_on_other_host()) {
		sv_step("B died holding the domain: it is gone");
		CHECK(open_xrcd(d.ctx, fd, 0) == NULL);
		CHECK_EQ(errno, EAGAIN);
		x = open_xrcd(d.ctx, fd, O_CREAT | O_EXCL);
		CHECK(x != NULL);

		sv_step("garbage in the domain's state file");
		/* Who holds the domain is the file xrcd-<dev>-<ino> in the state directory
		 * (docs/xrc.md); any process of the user can write anything there. */
		struct stat st;
		CHECK_OK(fstat(fd, &st));
		const char *dir = getenv("SOFTVERBS_STATE_DIR");
		char state[512], fallback[64];
		if (!dir || !*dir) {
			snprintf(fallback, sizeof(fallback), "/dev/shm/softverbs-%u", (unsigned)getuid());
			dir = fallback;
		}
		snprintf(state, sizeof(state), "%s/xrcd-%llu-%llu", dir,
			 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
		int sf = open(state, O_WRONLY);
		CHECKF(sf >= 0, "no state file %s", state);
		uint32_t junk[1100];
		for (unsigned i = 0; i < 1100; i++)
			junk[i] = 0x9e3779b9u * (i + 1);
		junk[0] = 0x58524344; /* our magic, then a huge count and random holders */
		junk[1] = 0xffffffffu;
		CHECK(write(sf, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
		close(sf);
		struct ibv_xrcd *again = open_xrcd(d.ctx, fd, 0);
		CHECKF(again != NULL, "this process holds the domain whatever the file says");
		CHECK_OK(ibv_close_xrcd(again));
		CHECK_OK(ibv_close_xrcd(x));
		CHECK(open_xrcd(d.ctx, fd, 0) == NULL); /* the garbage holders are not alive */
		CHECK_EQ(errno, EAGAIN);
	}
	close(fd);
	unlink(path);
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_destroy_cq(cq2));
	sv_close(&d);
	sv_pass();
	return 0;
}
