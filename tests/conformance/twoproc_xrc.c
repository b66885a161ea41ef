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
     C also binds a type 2 window on an INI QP of its own; B's SEND_WITH_INV invalidates it
 *     through A's TGT QP (wc.invalidated_rkey in C).
 *  6. Memory windows and invalidation (as mlx5 offers them on XRC INI QPs): A binds windows
 *     on an INI QP of its own (ibv_bind_mw, IBV_WR_BIND_MW, ibv_wr_bind_mw) and invalidates
 *     one (ibv_wr_local_inv); B WRITEs and READs through the type 1 window at A's XRC SRQ,
 *     invalidates two type 2 windows with SEND_WITH_INV (ibv_post_send and ibv_wr_send_inv),
 *     and meets the errors: an invalidated window's key again (REM_INV_REQ_ERR, A's receive
 *     fails too), a type 1 window's old key once A bound it anew and a type 2 window through
 *     a TGT QP (REM_ACCESS_ERR, QP_ACCESS_ERR on the TGT QP); ATOMIC WRITE and FLUSH are
 *     not XRC send ops (EOPNOTSUPP at create).
 * Run between hosts (tests/hosts/twoproc.sh) steps 1-3, 5 and 6 are the same over RoCE v2
 * (in step 5 A's process hands each message to C's whole, docs/xrc.md).
 */
#include "common.h"
#include "xrc_helpers.h"

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
	uint32_t c_inv_rkey; /* step 5: a type 2 window C bound, for B to invalidate */
	uint32_t k1, k2, k3, k5; /* step 6: A's windows (type 1; type 2 x3) */
	uint32_t k1_old;         /* step 6: the type 1 window's key before A bound it anew */
};

/* Step 6: where A's windows lie in its MR, and the send ops of the INI QPs there. */
#define W1 40960
#define W1B 45056
#define W2 49152
#define INI_OPS                                                                          \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |       \
	 IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV)

#define BIG 3000 /* three packets at MTU 1024 */

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

/* An INI QP in RTS with nothing to send to: connected to a TGT QP of this process. Binding
 * a window is a send-queue operation, so the QP that binds must be in RTS. */
static struct ibv_qp *bind_only_ini(struct sv_dev *d, struct ibv_cq *cq, struct ibv_xrcd *x,
				    struct ibv_qp **tgt)
{
	struct ibv_qp *ini = ini_qp_ops(d, cq, INI_OPS);
	CHECKF(ini != NULL, "an INI QP with windows and invalidation: %s", strerror(errno));
	*tgt = tgt_qp(d, x);
	connect_xrc(*tgt, d, ini->qp_num, 0);
	connect_xrc(ini, d, (*tgt)->qp_num, 1);
	return ini;
}

/* IBV_WR_BIND_MW of type 2 window `mw` over [off, off + len) of `mr`; returns its new key. */
static uint32_t bind_type2(struct ibv_qp *qp, struct ibv_cq *cq, uint64_t id, struct ibv_mw *mw,
			   struct ibv_mr *mr, size_t off, unsigned access)
{
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = sv_addr(mr, off);
	wr.bind_mw.bind_info.length = 4096;
	wr.bind_mw.bind_info.mw_access_flags = access;
	CHECK_OK(ibv_post_send(qp, &wr, &bad));
	struct ibv_wc wc;
	sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_BIND_MW);
	return wr.bind_mw.rkey;
}

/* A receive completion of MSG bytes of `fill` that invalidated `rkey`. */
static void expect_inv_recv(struct ibv_cq *cq, uint64_t id, struct ibv_mr *mr, size_t off,
			    char fill, uint32_t rkey)
{
	struct ibv_wc wc;
	sv_poll_one(cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.wr_id, id);
	CHECK_EQ(wc.byte_len, MSG);
	CHECKF(wc.wc_flags & IBV_WC_WITH_INV, "IBV_WC_WITH_INV missing");
	CHECK_EQ(wc.invalidated_rkey, rkey);
	for (int i = 0; i < MSG; i++)
		CHECKF(sv_ptr(mr, off)[i] == fill, "SEND_WITH_INV payload byte %d", i);
}

/* B: a new INI QP (with send ops `ops`, 0: a plain one) to A's second TGT QP: numbers
 * and GIDs traded, connected; then A's go-ahead `step`. */
static struct ibv_qp *b_connect_tgt2(struct sv_dev *d, struct ibv_cq *cq, uint64_t ops,
				     struct a_info *mine, struct a_info *a, int step)
{
	struct ibv_qp *ini = ops ? ini_qp_ops(d, cq, ops) : ini_qp(d, cq);
	CHECKF(ini != NULL, "INI QP: %s", strerror(errno));
	mine->tgt_qpn = ini->qp_num;
	sv_exchange(sock, mine, a, sizeof(*a));
	sv_trade_gid(sock, ini);
	connect_xrc(ini, d, a->tgt2_qpn, 1);
	CHECK_EQ(sv_hear(sock), step);
	return ini;
}

/* A: its second TGT QP reset and connected to B's newest INI QP; returns that QP's number. */
static uint32_t a_reconnect_tgt2(struct sv_dev *d, struct ibv_qp *tgt2, struct a_info *a)
{
	struct a_info b;
	sv_exchange(sock, a, &b, sizeof(b));
	sv_trade_gid(sock, tgt2);
	CHECK_OK(sv_modify_state(tgt2, IBV_QPS_RESET));
	connect_xrc(tgt2, d, b.tgt_qpn, 0);
	return b.tgt_qpn;
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
		bt = open_tgt(d.ctx, bx, a.tgt_qpn);
		CHECKF(bt != NULL, "ibv_open_qp of A's TGT QP failed: %s", strerror(errno));
		CHECK_EQ(bt->qp_num, a.tgt_qpn);
		CHECK_EQ(sv_query_state(bt), IBV_QPS_RTR);
		CHECK(open_tgt(d.ctx, bx, a.tgt_qpn + 1000) == NULL); /* no such QP */
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
	ini = b_connect_tgt2(&d, cq, 0, &mine, &a, 5);
	CHECK_OK(post_xrc(ini, 5, IBV_WR_SEND, a.srqn3, mr, 0, MSG, 0, 0));
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, ini, &wc);
	CHECK_OK(ibv_destroy_qp(ini));
	sv_say(sock, 6);

	/* 5: through A's TGT QP into C's XRC SRQ */
	{
		ini = b_connect_tgt2(&d, cq, 0, &mine, &a, 30);
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
		/* SEND_WITH_INV of C's type 2 window: A's TGT QP hands it to C, which drops it */
		memset(sv_ptr(mr, 0), 'n', MSG);
		CHECK_OK(post_xrc(ini, 59, IBV_WR_SEND_WITH_INV, a.c_srqn, mr, 0, MSG, 0,
				  a.c_inv_rkey));
		sv_expect_wc(cq, 59, IBV_WC_SUCCESS, ini, &wc);
		/* A number in C's range that names no SRQ */
		CHECK_OK(post_xrc(ini, 54, IBV_WR_SEND, a.c_srqn + 7, mr, 0, MSG, 0, 0));
		sv_expect_wc(cq, 54, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 32);
		/* C is gone now: its SRQ number names nothing */
		ini = b_connect_tgt2(&d, cq, 0, &mine, &a, 33);
		CHECK_OK(post_xrc(ini, 55, IBV_WR_SEND, a.c_srqn, mr, 0, MSG, 0, 0));
		sv_expect_wc(cq, 55, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 34);
	}

	/* 6: windows at A's XRC SRQ, and invalidation */
	{
		ini = b_connect_tgt2(&d, cq, INI_OPS, &mine, &a, 60);
		/* The type 1 window: WRITE, then READ, byte by byte */
		for (int i = 0; i < 16; i++)
			sv_ptr(mr, 1024)[i] = (uint8_t)(0xa0 + i);
		CHECK_OK(post_xrc(ini, 70, IBV_WR_RDMA_WRITE, a.srqn, mr, 1024, 16, a.addr + W1 + 8,
				  a.k1));
		sv_expect_wc(cq, 70, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 2048), 0, 64);
		CHECK_OK(post_xrc(ini, 71, IBV_WR_RDMA_READ, a.srqn, mr, 2048, 32,
				  a.addr + W1 + 1024, a.k1));
		sv_expect_wc(cq, 71, IBV_WC_SUCCESS, ini, &wc);
		for (int i = 0; i < 64; i++)
			CHECKF(sv_ptr(mr, 2048)[i] == (i < 32 ? (uint8_t)(0x30 + i) : 0),
			       "READ through the window: byte %d", i);
		/* SEND_WITH_INV through the new API, then ibv_post_send */
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini);
		CHECK(qx != NULL);
		memset(sv_ptr(mr, 0), 'j', MSG);
		ibv_wr_start(qx);
		qx->wr_id = 72;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_inv(qx, a.k2);
		ibv_wr_set_xrc_srqn(qx, a.srqn);
		ibv_wr_set_sge(qx, mr->lkey, sv_addr(mr, 0), MSG);
		CHECK_OK(ibv_wr_complete(qx));
		sv_expect_wc(cq, 72, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 4096), 'k', MSG);
		CHECK_OK(post_xrc(ini, 73, IBV_WR_SEND_WITH_INV, a.srqn, mr, 4096, MSG, 0, a.k5));
		sv_expect_wc(cq, 73, IBV_WC_SUCCESS, ini, &wc);
		/* k2 again: its window is bound no more */
		CHECK_OK(post_xrc(ini, 74, IBV_WR_SEND_WITH_INV, a.srqn, mr, 4096, MSG, 0, a.k2));
		sv_expect_wc(cq, 74, IBV_WC_REM_INV_REQ_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 61);

		/* The type 1 window bound anew: its new key works, its old one does not */
		ini = b_connect_tgt2(&d, cq, 0, &mine, &a, 62);
		for (int i = 0; i < 16; i++)
			sv_ptr(mr, 1024)[i] = (uint8_t)(0xb0 + i);
		CHECK_OK(post_xrc(ini, 75, IBV_WR_RDMA_WRITE, a.srqn, mr, 1024, 16, a.addr + W1B,
				  a.k1));
		sv_expect_wc(cq, 75, IBV_WC_SUCCESS, ini, &wc);
		memset(sv_ptr(mr, 1024), 0xee, 16);
		CHECK_OK(post_xrc(ini, 76, IBV_WR_RDMA_WRITE, a.srqn, mr, 1024, 16, a.addr + W1 + 8,
				  a.k1_old));
		sv_expect_wc(cq, 76, IBV_WC_REM_ACCESS_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 63);

		/* A bound type 2 window: bound to A's INI QP, never reached through a TGT QP */
		ini = b_connect_tgt2(&d, cq, 0, &mine, &a, 64);
		CHECK_OK(post_xrc(ini, 77, IBV_WR_RDMA_WRITE, a.srqn, mr, 1024, 16, a.addr + W2,
				  a.k3));
		sv_expect_wc(cq, 77, IBV_WC_REM_ACCESS_ERR, ini, &wc);
		CHECK_OK(ibv_destroy_qp(ini));
		sv_say(sock, 65);
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
	uint32_t inv_rkey; /* a type 2 window bound on C's own INI QP */
};

#define C_WINDOW 49152 /* in C's MR: the window B invalidates, and the receive for it */
#define C_INV_RECV 53248

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
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL | IBV_ACCESS_MW_BIND);
	memset(sv_ptr(mr, 8192), 'C', 8);
	memset(sv_ptr(mr, 24576), 0, 8);
	struct ibv_srq *srq = xrc_srq(&d, x, cq);
	CHECK_OK(sv_post_srq_recv(srq, 500, mr, 0, MSG));
	/* A type 2 window of the SRQ's PD, bound on an INI QP of C's (B invalidates it) */
	struct ibv_cq *bcq = sv_create_cq(&d, 16, NULL, NULL);
	struct ibv_qp *c_tgt;
	struct ibv_qp *c_ini = bind_only_ini(&d, bcq, x, &c_tgt);
	struct ibv_mw *mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	uint32_t inv = bind_type2(c_ini, bcq, 510, mw, mr, C_WINDOW, IBV_ACCESS_REMOTE_WRITE);
	struct c_info mine = {srq_num(srq), mr->rkey, sv_addr(mr, 0), 0, 0, inv}, a;
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
	CHECK_OK(sv_post_srq_recv(srq, 503, mr, C_INV_RECV, MSG));
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
	expect_inv_recv(cq, 503, mr, C_INV_RECV, 'n', inv); /* B's SEND_WITH_INV */
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
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL | IBV_ACCESS_MW_BIND);
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
	struct ibv_qp *opened = open_tgt(d.ctx, x, tgt->qp_num);
	CHECK(opened != NULL);
	CHECK_EQ(opened->qp_num, tgt->qp_num);
	CHECK_EQ(sv_query_state(opened), IBV_QPS_RTR);
	CHECK(open_tgt(d.ctx, own, tgt->qp_num) == NULL); /* not a QP of that domain */

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
		a.c_inv_rkey = c.inv_rkey;
		to_c.ini_qpn = a_reconnect_tgt2(&d, tgt2, &a);
		to_c.tgt_qpn = tgt2->qp_num;
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
		a_reconnect_tgt2(&d, tgt2, &a);
		sv_say(sock, 33);
		CHECK_EQ(sv_hear(sock), 34); /* C's SRQ number failed once C died */
		sv_expect_async(d.ctx, IBV_EVENT_QP_REQ_ERR, tgt2);
		CHECK_EQ(sv_query_state(tgt2), IBV_QPS_ERR);
	}

	sv_step("memory windows and SEND_WITH_INV on XRC INI QPs");
	{
		/* What mlx5 offers on XRC: not IBA 1.5's ATOMIC WRITE and FLUSH */
		CHECK(ini_qp_ops(&d, cq, IBV_QP_EX_WITH_ATOMIC_WRITE) == NULL);
		CHECK_EQ(errno, EOPNOTSUPP);
		CHECK(ini_qp_ops(&d, cq, 1ull << 11) == NULL); /* ..._WITH_FLUSH, rdma-core 45 */
		CHECK_EQ(errno, EOPNOTSUPP);
		struct ibv_cq *bcq = sv_create_cq(&d, 16, NULL, NULL);
		struct ibv_cq *cq6 = sv_create_cq(&d, 16, NULL, NULL);
		struct ibv_srq *srq6 = xrc_srq(&d, x, cq6);
		struct ibv_qp *tgt3;
		struct ibv_qp *a_ini = bind_only_ini(&d, bcq, x, &tgt3);
		struct ibv_mw *mw1 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_1);
		struct ibv_mw *mw2 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
		struct ibv_mw *mw3 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
		struct ibv_mw *mw4 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
		struct ibv_mw *mw5 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
		CHECK(mw1 && mw2 && mw3 && mw4 && mw5);
		struct ibv_mw_bind mb = {0};
		mb.wr_id = 80;
		mb.send_flags = IBV_SEND_SIGNALED;
		mb.bind_info.mr = mr;
		mb.bind_info.addr = sv_addr(mr, W1);
		mb.bind_info.length = 4096;
		mb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		CHECK_ERR(ibv_bind_mw(tgt3, mw1, &mb), EINVAL); /* a TGT QP has no send queue */
		CHECK_OK(ibv_bind_mw(a_ini, mw1, &mb));
		sv_expect_wc(bcq, 80, IBV_WC_SUCCESS, a_ini, &wc);
		CHECK_OPCODE(wc, IBV_WC_BIND_MW);
		a.k1 = mw1->rkey;
		a.k2 = bind_type2(a_ini, bcq, 81, mw2, mr, W2, IBV_ACCESS_REMOTE_WRITE);
		a.k5 = bind_type2(a_ini, bcq, 83, mw5, mr, W2, IBV_ACCESS_REMOTE_WRITE);
		/* The new API binds and invalidates too */
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a_ini);
		CHECK(qx != NULL);
		struct ibv_mw_bind_info bi = {mr, sv_addr(mr, W2), 4096, IBV_ACCESS_REMOTE_WRITE};
		a.k3 = ibv_inc_rkey(mw3->rkey);
		ibv_wr_start(qx);
		qx->wr_id = 82;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(qx, mw3, a.k3, &bi);
		CHECK_OK(ibv_wr_complete(qx));
		sv_expect_wc(bcq, 82, IBV_WC_SUCCESS, a_ini, &wc);
		CHECK_OPCODE(wc, IBV_WC_BIND_MW);
		uint32_t k4 = bind_type2(a_ini, bcq, 84, mw4, mr, W2, IBV_ACCESS_REMOTE_WRITE);
		ibv_wr_start(qx);
		qx->wr_id = 85;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(qx, k4);
		CHECK_OK(ibv_wr_complete(qx));
		sv_expect_wc(bcq, 85, IBV_WC_SUCCESS, a_ini, &wc);
		CHECK_OPCODE(wc, IBV_WC_LOCAL_INV);
		k4 = bind_type2(a_ini, bcq, 86, mw4, mr, W2, IBV_ACCESS_REMOTE_WRITE);
		struct ibv_send_wr li = {0}, *bad;
		li.wr_id = 87;
		li.opcode = IBV_WR_LOCAL_INV;
		li.send_flags = IBV_SEND_SIGNALED;
		li.invalidate_rkey = k4;
		CHECK_OK(ibv_post_send(a_ini, &li, &bad));
		sv_expect_wc(bcq, 87, IBV_WC_SUCCESS, a_ini, &wc);
		CHECK_OPCODE(wc, IBV_WC_LOCAL_INV);
		/* What B reads, and where its writes must (not) land */
		for (int i = 0; i < 32; i++)
			sv_ptr(mr, W1 + 1024)[i] = (uint8_t)(0x30 + i);
		memset(sv_ptr(mr, W1), 0, 1024);
		memset(sv_ptr(mr, W1B), 0, 64);
		memset(sv_ptr(mr, W2), 0, 64);

		a.srqn = srq_num(srq6);
		a_reconnect_tgt2(&d, tgt2, &a);
		CHECK_OK(sv_post_srq_recv(srq6, 90, mr, 16384, MSG));
		CHECK_OK(sv_post_srq_recv(srq6, 91, mr, 17408, MSG));
		CHECK_OK(sv_post_srq_recv(srq6, 92, mr, 18432, MSG));
		sv_say(sock, 60);
		expect_inv_recv(cq6, 90, mr, 16384, 'j', a.k2);
		expect_inv_recv(cq6, 91, mr, 17408, 'k', a.k5);
		sv_poll_one(cq6, &wc); /* k2 again: the data lands, the receive fails (class J) */
		CHECK_EQ(wc.wr_id, 92);
		CHECK_STATUS(wc, IBV_WC_REM_INV_REQ_ERR);
		CHECK_EQ(sv_hear(sock), 61);
		for (int i = 0; i < 1024; i++)
			CHECKF(sv_ptr(mr, W1)[i] ==
				       (i >= 8 && i < 24 ? (uint8_t)(0xa0 + i - 8) : 0),
			       "WRITE through the type 1 window: byte %d", i);
		CHECK_EQ(sv_query_state(tgt2), IBV_QPS_ERR);

		/* mw1 bound anew (ibv_bind_mw again): a new key, over W1B */
		a.k1_old = a.k1;
		mb.wr_id = 88;
		mb.bind_info.addr = sv_addr(mr, W1B);
		CHECK_OK(ibv_bind_mw(a_ini, mw1, &mb));
		sv_expect_wc(bcq, 88, IBV_WC_SUCCESS, a_ini, &wc);
		a.k1 = mw1->rkey;
		CHECK(a.k1 != a.k1_old);
		a_reconnect_tgt2(&d, tgt2, &a);
		sv_say(sock, 62);
		CHECK_EQ(sv_hear(sock), 63);
		sv_expect_async(d.ctx, IBV_EVENT_QP_ACCESS_ERR, tgt2);
		for (int i = 0; i < 64; i++)
			CHECKF(sv_ptr(mr, W1B)[i] == (i < 16 ? (uint8_t)(0xb0 + i) : 0),
			       "WRITE through the window bound anew: byte %d", i);
		for (int i = 0; i < 16; i++) /* the old key wrote nothing */
			CHECK_EQ(sv_ptr(mr, W1 + 8)[i], (uint8_t)(0xa0 + i));

		a_reconnect_tgt2(&d, tgt2, &a);
		sv_say(sock, 64);
		CHECK_EQ(sv_hear(sock), 65);
		sv_expect_async(d.ctx, IBV_EVENT_QP_ACCESS_ERR, tgt2);
		for (int i = 0; i < 64; i++)
			CHECK_EQ(sv_ptr(mr, W2)[i], 0); /* the type 2 window took nothing */

		CHECK_OK(ibv_destroy_qp(a_ini));
		CHECK_OK(ibv_destroy_qp(tgt3));
		CHECK_OK(ibv_dealloc_mw(mw1));
		CHECK_OK(ibv_dealloc_mw(mw2));
		CHECK_OK(ibv_dealloc_mw(mw3));
		CHECK_OK(ibv_dealloc_mw(mw4));
		CHECK_OK(ibv_dealloc_mw(mw5));
		CHECK_OK(ibv_destroy_srq(srq6));
		CHECK_OK(ibv_destroy_cq(cq6));
		CHECK_OK(ibv_destroy_cq(bcq));
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
