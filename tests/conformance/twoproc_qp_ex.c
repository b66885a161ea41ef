/*
 * The extended QP's post-send API (ibv_wr_post(3)) between two processes (and, run by
 * tests/hosts/twoproc.sh, between two hosts over RoCE v2): every ibv_wr_* operation against
 * the same operation through ibv_post_send on the same QP (same completions, same bytes at
 * the target), a batch of several, wr_abort, batches that fail (nothing of them is posted),
 * ATOMIC WRITE and FLUSH (IBA 1.5), and the wrong-access cases, which give REM_ACCESS_ERR.
 * A = requester (parent), B = responder (child).
 */
#include "common.h"

#include <infiniband/verbs.h>

/* rdma-core 45's names, for the 44 headers we build against (values from its verbs.h). */
#define QX_WITH_FLUSH (1 << 11)
#define QX_ACCESS_FLUSH_GLOBAL (1 << 8)
#define QX_ACCESS_FLUSH_PERSISTENT (1 << 9)
#define QX_FLUSH_GLOBAL 1
#define QX_FLUSH_PERSISTENT 2
#define QX_FLUSH_RANGE 0
#define QX_FLUSH_MR 1
#define QX_WC_FLUSH 8
/* rdma-core 45 appended wr_flush to struct ibv_qp_ex. */
typedef void (*qx_wr_flush_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);
static void qx_wr_flush(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, size_t len,
			uint8_t type, uint8_t level)
{
	qx_wr_flush_fn fn;
	memcpy(&fn, (char *)qx + sizeof(*qx), sizeof(fn));
	fn(qx, rkey, addr, len, type, level);
}

#define MEM (64 * 1024)
#define RECV_LEN 512
#define NRECV 16
#define WRITE_AT (16 * 1024)
#define READ_AT (32 * 1024)
#define ATOMIC_AT (48 * 1024)
#define MR_ACCESS (SV_ACCESS_ALL | QX_ACCESS_FLUSH_GLOBAL | QX_ACCESS_FLUSH_PERSISTENT)
#define ALL_OPS                                                                             \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |   \
	 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |                    \
	 IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |          \
	 IBV_QP_EX_WITH_ATOMIC_WRITE | QX_WITH_FLUSH)

static int sock;
static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static void cfg_init(struct sv_pair_cfg *cfg)
{
	sv_pair_cfg_init(cfg);
	cfg->access = MR_ACCESS;
	cfg->max_send_wr = 16;
}

/* ---- B: the responder ---------------------------------------------------------------- */

/* One connected QP (plain ibv_create_qp: not extended) and an MR with `access`. */
struct target {
	struct sv_one_qp q;
	struct ibv_mr *mr;
};

static void target_open(struct target *t, unsigned access, int nrecv)
{
	struct sv_pair_cfg cfg;
	cfg_init(&cfg);
	sv_one_qp_open(&t->q, &cfg, 64, 0);
	CHECK(ibv_qp_to_qp_ex(t->q.qp) == NULL); /* ibv_create_qp's QPs are not extended */
	t->mr = sv_alloc_mr(t->q.dev.pd, MEM, access);
	for (int i = 0; i < MEM; i++)
		sv_ptr(t->mr, 0)[i] = (uint8_t)(i * 7 + 3);
	memset(sv_ptr(t->mr, 0), 0, READ_AT);
	memset(sv_ptr(t->mr, ATOMIC_AT), 0, 128);
	struct sv_remote peer;
	sv_trade_remote(sock, t->q.qp, t->mr, &peer);
	sv_connect_remote(t->q.qp, &t->q.dev, &t->q.cfg, peer.qpn, t->mr, 100, nrecv, RECV_LEN);
}

static void target_close(struct target *t)
{
	sv_drain_async(t->q.dev.ctx, 0);
	sv_free_mr(t->mr);
	sv_one_qp_close(&t->q);
}

/* Two receives must hold the same message: same completion, same bytes. */
static void expect_same_recv(struct target *t, uint64_t id, enum ibv_wc_opcode op, uint32_t len,
			     uint8_t mark)
{
	struct ibv_wc a, b;
	sv_expect_wc(t->q.cq, id, IBV_WC_SUCCESS, t->q.qp, &a);
	sv_expect_wc(t->q.cq, id + 1, IBV_WC_SUCCESS, t->q.qp, &b);
	CHECK_OPCODE(a, op);
	CHECK_OPCODE(b, op);
	CHECK_EQ(a.byte_len, len);
	CHECK_EQ(b.byte_len, len);
	CHECK_EQ(a.wc_flags & IBV_WC_WITH_IMM, b.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(a.imm_data, b.imm_data);
	if (op == IBV_WC_RECV) {
		uint8_t *pa = sv_ptr(t->mr, (id - 100) * RECV_LEN), *pb = pa + RECV_LEN;
		CHECK_EQ(pa[0], mark);
		CHECK(memcmp(pa, pb, len) == 0);
	}
}

static void responder(int s)
{
	sock = s;
	struct target t;
	target_open(&t, MR_ACCESS, NRECV);
	say(1);

	CHECK_EQ(hear(), 2);
	expect_same_recv(&t, 100, IBV_WC_RECV, 64, 0x11);
	expect_same_recv(&t, 102, IBV_WC_RECV, 32, 0x22);
	expect_same_recv(&t, 104, IBV_WC_RECV, 40, 0x33);
	expect_same_recv(&t, 106, IBV_WC_RECV, 40, 0x44);
	expect_same_recv(&t, 108, IBV_WC_RECV, 40, 0x55);
	expect_same_recv(&t, 110, IBV_WC_RECV_RDMA_WITH_IMM, 100, 0);
	/* the WRITEs, old and new, landed alike */
	CHECK_EQ(sv_ptr(t.mr, WRITE_AT)[0], 0x66);
	CHECK(memcmp(sv_ptr(t.mr, WRITE_AT), sv_ptr(t.mr, WRITE_AT + 4096), 4096) == 0);
	CHECK(memcmp(sv_ptr(t.mr, WRITE_AT + 8192), sv_ptr(t.mr, WRITE_AT + 8192 + 128), 100) == 0);
	uint64_t w[3];
	memcpy(w, sv_ptr(t.mr, ATOMIC_AT), sizeof(w));
	CHECK_EQ(w[0], 9);				 /* CAS 0 -> 5, then 5 -> 9 */
	CHECK_EQ(w[1], 7);				 /* FETCH_ADD 3, then 4 */
	CHECK_EQ(w[2], 0x0102030405060708ull); /* ATOMIC WRITE */
	/* the batch: a SEND, a WRITE and a READ */
	struct ibv_wc wc;
	sv_expect_wc(t.q.cq, 112, IBV_WC_SUCCESS, t.q.qp, &wc);
	CHECK_EQ(wc.byte_len, 64);
	CHECK_EQ(sv_ptr(t.mr, 12 * RECV_LEN)[0], 0x77);
	CHECK_EQ(sv_ptr(t.mr, WRITE_AT + 12288)[63], 0x78);
	/* aborted and failed batches left nothing: the next receive holds the next good SEND */
	sv_expect_wc(t.q.cq, 113, IBV_WC_SUCCESS, t.q.qp, &wc);
	CHECK_EQ(wc.byte_len, 8);
	CHECK_EQ(sv_ptr(t.mr, 13 * RECV_LEN)[0], 0xaa);
	sv_expect_empty(t.q.cq, "after the last good SEND");
	say(2);
	CHECK_EQ(hear(), 3);
	target_close(&t);

	/* wrong access: ATOMIC WRITE without REMOTE_WRITE, FLUSH without the flush access */
	for (int round = 0; round < 2; round++) {
		unsigned access = round == 0 ? (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
						QX_ACCESS_FLUSH_GLOBAL)
					     : SV_ACCESS_ALL;
		target_open(&t, access, 0);
		say(4 + round);
		CHECK_EQ(hear(), 4 + round);
		target_close(&t);
	}
	exit(0);
}

/* ---- A: the requester ---------------------------------------------------------------- */

struct requester {
	struct sv_one_qp q;
	struct ibv_qp_ex *qx;
	struct ibv_mr *mr;
	struct sv_remote peer;
};

static struct ibv_qp *create_qp_ex(struct sv_one_qp *q, enum ibv_qp_type type, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = q->cq;
	a.cap.max_send_wr = q->cfg.max_send_wr;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = q->cfg.max_send_sge;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.qp_type = type;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = q->dev.pd;
	a.send_ops_flags = ops;
	return ibv_create_qp_ex(q->dev.ctx, &a);
}

static void requester_open(struct requester *r)
{
	memset(r, 0, sizeof(*r));
	struct sv_pair_cfg cfg;
	cfg_init(&cfg);
	sv_open(&r->q.dev);
	r->q.cfg = cfg;
	r->q.cq = sv_create_cq(&r->q.dev, 64, NULL, NULL);
	r->q.qp = create_qp_ex(&r->q, IBV_QPT_RC, ALL_OPS);
	CHECK(r->q.qp != NULL);
	r->qx = ibv_qp_to_qp_ex(r->q.qp);
	CHECK(r->qx != NULL && (void *)r->qx == (void *)r->q.qp);
	r->mr = sv_alloc_mr(r->q.dev.pd, MEM, SV_ACCESS_ALL);
	sv_trade_remote(sock, r->q.qp, r->mr, &r->peer);
	sv_connect_remote(r->q.qp, &r->q.dev, &r->q.cfg, r->peer.qpn, NULL, 0, 0, 0);
}

static void requester_close(struct requester *r)
{
	sv_drain_async(r->q.dev.ctx, 0);
	sv_free_mr(r->mr);
	sv_one_qp_close(&r->q);
}

static uint64_t raddr(struct requester *r, size_t off) { return r->peer.addr + off; }

/* Sets wr_id and flags (signaled) for the next WR of the batch. */
static void next(struct requester *r, uint64_t id)
{
	r->qx->wr_id = id;
	r->qx->wr_flags = IBV_SEND_SIGNALED;
}

/* The completions of an old (ibv_post_send) and a new (ibv_wr_*) WR must match. */
static void expect_same_send(struct requester *r, uint64_t id, enum ibv_wc_opcode op, uint32_t len)
{
	struct ibv_wc a, b;
	sv_expect_wc(r->q.cq, id, IBV_WC_SUCCESS, r->q.qp, &a);
	sv_expect_wc(r->q.cq, id + 1, IBV_WC_SUCCESS, r->q.qp, &b);
	CHECK_OPCODE(a, op);
	CHECK_OPCODE(b, op);
	CHECK_EQ(a.byte_len, b.byte_len);
	if (len)
		CHECK_EQ(b.byte_len, len);
}

static int post1(struct requester *r, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	return ibv_post_send(r->q.qp, wr, &bad);
}

/* ibv_post_send of one WR with sges[0..n) and flags; returns what it returned. */
static int post_old(struct requester *r, uint64_t id, enum ibv_wr_opcode op, struct ibv_sge *sg,
		    int n, unsigned flags, uint64_t remote, uint32_t imm)
{
	struct ibv_send_wr wr;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.opcode = op;
	wr.sg_list = sg;
	wr.num_sge = n;
	wr.send_flags = IBV_SEND_SIGNALED | flags;
	wr.imm_data = htobe32(imm);
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = r->peer.rkey;
	return post1(r, &wr);
}

static struct ibv_sge sge(struct requester *r, size_t off, uint32_t len)
{
	struct ibv_sge s = {sv_addr(r->mr, off), len, r->mr->lkey};
	return s;
}

static void sends(struct requester *r)
{
	struct ibv_qp_ex *qx = r->qx;
	memset(sv_ptr(r->mr, 0), 0x11, 64);
	memset(sv_ptr(r->mr, 64), 0x22, 64);
	memset(sv_ptr(r->mr, 128), 0x33, 64);
	memset(sv_ptr(r->mr, 192), 0x44, 16);
	memset(sv_ptr(r->mr, 208), 0x45, 24);
	memset(sv_ptr(r->mr, 256), 0x55, 16);
	memset(sv_ptr(r->mr, 272), 0x56, 24);

	sv_step("SEND: ibv_post_send, then wr_send + wr_set_sge");
	struct ibv_sge s = sge(r, 0, 64);
	CHECK_OK(post_old(r, 1, IBV_WR_SEND, &s, 1, 0, 0, 0));
	qx->wr_start(qx);
	next(r, 2);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 0), 64);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 1, IBV_WC_SEND, 64);

	sv_step("SEND_WITH_IMM");
	s = sge(r, 64, 32);
	CHECK_OK(post_old(r, 3, IBV_WR_SEND_WITH_IMM, &s, 1, 0, 0, 0xfeed));
	ibv_wr_start(qx);
	next(r, 4);
	ibv_wr_send_imm(qx, htobe32(0xfeed));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 64), 32);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 3, IBV_WC_SEND, 32);

	sv_step("inline SEND: IBV_SEND_INLINE, then wr_set_inline_data");
	s = sge(r, 128, 40);
	CHECK_OK(post_old(r, 5, IBV_WR_SEND, &s, 1, IBV_SEND_INLINE, 0, 0));
	uint8_t buf[40];
	memset(buf, 0x33, sizeof(buf));
	ibv_wr_start(qx);
	next(r, 6);
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, buf, sizeof(buf));
	memset(buf, 0xee, sizeof(buf)); /* copied at the call: reusing it changes nothing */
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 5, IBV_WC_SEND, 40);

	sv_step("two SGEs: a gather list, then wr_set_sge_list");
	struct ibv_sge two[2] = {sge(r, 192, 16), sge(r, 208, 24)};
	CHECK_OK(post_old(r, 7, IBV_WR_SEND, two, 2, 0, 0, 0));
	ibv_wr_start(qx);
	next(r, 8);
	ibv_wr_send(qx);
	ibv_wr_set_sge_list(qx, 2, two);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 7, IBV_WC_SEND, 40);

	sv_step("two inline buffers: inline gather list, then wr_set_inline_data_list");
	struct ibv_sge in2[2] = {sge(r, 256, 16), sge(r, 272, 24)};
	CHECK_OK(post_old(r, 9, IBV_WR_SEND, in2, 2, IBV_SEND_INLINE, 0, 0));
	struct ibv_data_buf bufs[2] = {{sv_ptr(r->mr, 256), 16}, {sv_ptr(r->mr, 272), 24}};
	ibv_wr_start(qx);
	next(r, 10);
	ibv_wr_send(qx);
	ibv_wr_set_inline_data_list(qx, 2, bufs);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 9, IBV_WC_SEND, 40);
}

static void one_sided(struct requester *r)
{
	struct ibv_qp_ex *qx = r->qx;
	memset(sv_ptr(r->mr, 4096), 0x66, 4096);
	memset(sv_ptr(r->mr, 8192), 0x67, 100);

	sv_step("RDMA WRITE of 4 KiB (several packets at MTU 1024)");
	struct ibv_sge s = sge(r, 4096, 4096);
	CHECK_OK(post_old(r, 11, IBV_WR_RDMA_WRITE, &s, 1, 0, raddr(r, WRITE_AT), 0));
	ibv_wr_start(qx);
	next(r, 12);
	ibv_wr_rdma_write(qx, r->peer.rkey, raddr(r, WRITE_AT + 4096));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 4096), 4096);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 11, IBV_WC_RDMA_WRITE, 4096);

	sv_step("RDMA WRITE_WITH_IMM");
	s = sge(r, 8192, 100);
	CHECK_OK(post_old(r, 13, IBV_WR_RDMA_WRITE_WITH_IMM, &s, 1, 0, raddr(r, WRITE_AT + 8192), 7));
	ibv_wr_start(qx);
	next(r, 14);
	ibv_wr_rdma_write_imm(qx, r->peer.rkey, raddr(r, WRITE_AT + 8192 + 128), htobe32(7));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 8192), 100);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 13, IBV_WC_RDMA_WRITE, 100);

	sv_step("RDMA READ of 4 KiB into two buffers");
	s = sge(r, 16384, 4096);
	CHECK_OK(post_old(r, 15, IBV_WR_RDMA_READ, &s, 1, 0, raddr(r, READ_AT), 0));
	ibv_wr_start(qx);
	next(r, 16);
	ibv_wr_rdma_read(qx, r->peer.rkey, raddr(r, READ_AT));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 20480), 4096);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 15, IBV_WC_RDMA_READ, 4096);
	CHECK_EQ(sv_ptr(r->mr, 16384)[5], (uint8_t)((READ_AT + 5) * 7 + 3));
	CHECK(memcmp(sv_ptr(r->mr, 16384), sv_ptr(r->mr, 20480), 4096) == 0);

	sv_step("atomics: CMP_AND_SWP and FETCH_AND_ADD, old and new");
	struct ibv_send_wr wr;
	memset(&wr, 0, sizeof(wr));
	s = sge(r, 24576, 8);
	wr.wr_id = 17;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.atomic.remote_addr = raddr(r, ATOMIC_AT);
	wr.wr.atomic.rkey = r->peer.rkey;
	wr.wr.atomic.compare_add = 0;
	wr.wr.atomic.swap = 5;
	CHECK_OK(post1(r, &wr));
	ibv_wr_start(qx);
	next(r, 18);
	ibv_wr_atomic_cmp_swp(qx, r->peer.rkey, raddr(r, ATOMIC_AT), 5, 9);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 24584), 8);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 17, IBV_WC_COMP_SWAP, 8);
	uint64_t old[2];
	memcpy(old, sv_ptr(r->mr, 24576), sizeof(old));
	CHECK_EQ(old[0], 0);
	CHECK_EQ(old[1], 5);
	wr.wr_id = 19;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = raddr(r, ATOMIC_AT + 8);
	wr.wr.atomic.compare_add = 3;
	CHECK_OK(post1(r, &wr));
	ibv_wr_start(qx);
	next(r, 20);
	ibv_wr_atomic_fetch_add(qx, r->peer.rkey, raddr(r, ATOMIC_AT + 8), 4);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 24584), 8);
	CHECK_OK(ibv_wr_complete(qx));
	expect_same_send(r, 19, IBV_WC_FETCH_ADD, 8);
	memcpy(old, sv_ptr(r->mr, 24576), sizeof(old));
	CHECK_EQ(old[0], 0);
	CHECK_EQ(old[1], 3);

	sv_step("ATOMIC WRITE: only the new API has it");
	uint64_t value = 0x0102030405060708ull;
	wr.wr_id = 21;
	wr.opcode = IBV_WR_ATOMIC_WRITE;
	CHECK_ERR(post1(r, &wr), EINVAL);
	ibv_wr_start(qx);
	next(r, 22);
	ibv_wr_atomic_write(qx, r->peer.rkey, raddr(r, ATOMIC_AT + 16), &value);
	value = 0; /* taken at the call */
	CHECK_OK(ibv_wr_complete(qx));
	struct ibv_wc wc;
	sv_expect_wc(r->q.cq, 22, IBV_WC_SUCCESS, r->q.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_ATOMIC_WRITE);
	CHECK_EQ(wc.byte_len, 8);

	sv_step("FLUSH: global over a range, persistent over the whole MR");
	ibv_wr_start(qx);
	next(r, 23);
	qx_wr_flush(qx, r->peer.rkey, raddr(r, WRITE_AT), 8192, QX_FLUSH_GLOBAL, QX_FLUSH_RANGE);
	next(r, 24);
	qx_wr_flush(qx, r->peer.rkey, raddr(r, 0), 0, QX_FLUSH_PERSISTENT | QX_FLUSH_GLOBAL,
		    QX_FLUSH_MR);
	CHECK_OK(ibv_wr_complete(qx));
	sv_expect_wc(r->q.cq, 23, IBV_WC_SUCCESS, r->q.qp, &wc);
	CHECK_OPCODE(wc, QX_WC_FLUSH);
	sv_expect_wc(r->q.cq, 24, IBV_WC_SUCCESS, r->q.qp, &wc);
	CHECK_OPCODE(wc, QX_WC_FLUSH);
}

static void batches(struct requester *r)
{
	struct ibv_qp_ex *qx = r->qx;
	memset(sv_ptr(r->mr, 28672), 0x77, 64);
	memset(sv_ptr(r->mr, 28736), 0x78, 64);

	sv_step("one batch: SEND, WRITE, READ; unsignaled WRs complete silently");
	ibv_wr_start(qx);
	next(r, 31);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28672), 64);
	qx->wr_id = 32;
	qx->wr_flags = 0;
	ibv_wr_rdma_write(qx, r->peer.rkey, raddr(r, WRITE_AT + 12288));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28736), 64);
	next(r, 33);
	ibv_wr_rdma_read(qx, r->peer.rkey, raddr(r, WRITE_AT + 12288));
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28800), 64);
	CHECK_OK(ibv_wr_complete(qx));
	struct ibv_wc wc;
	sv_expect_wc(r->q.cq, 31, IBV_WC_SUCCESS, r->q.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
	sv_expect_wc(r->q.cq, 33, IBV_WC_SUCCESS, r->q.qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RDMA_READ);
	CHECK_EQ(sv_ptr(r->mr, 28800)[63], 0x78); /* the READ saw the WRITE before it */

	memset(sv_ptr(r->mr, 28864), 0x88, 8);
	sv_step("wr_abort: nothing of the batch is posted");
	ibv_wr_start(qx);
	next(r, 40);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28864), 8);
	ibv_wr_abort(qx);

	sv_step("a failing batch (too many SGEs): EINVAL, and none of it posted");
	struct ibv_sge many[5];
	for (int i = 0; i < 5; i++)
		many[i] = sge(r, 28864, 1);
	ibv_wr_start(qx);
	next(r, 41);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28864), 8);
	next(r, 42);
	ibv_wr_rdma_write(qx, r->peer.rkey, raddr(r, WRITE_AT));
	ibv_wr_set_sge_list(qx, 5, many); /* max_send_sge is 4 */
	CHECK_ERR(ibv_wr_complete(qx), EINVAL);

	sv_step("a failing batch (XRC SRQ number on an RC QP): EOPNOTSUPP");
	ibv_wr_start(qx);
	next(r, 43);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28864), 8);
	ibv_wr_set_xrc_srqn(qx, 5);
	CHECK_ERR(ibv_wr_complete(qx), EOPNOTSUPP);

	sv_step("a failing batch (more WRs than the send queue holds): ENOMEM");
	ibv_wr_start(qx);
	for (uint32_t i = 0; i <= r->q.cfg.max_send_wr; i++) {
		next(r, 44);
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28864), 8);
	}
	CHECK_ERR(ibv_wr_complete(qx), ENOMEM);

	sv_step("an op the QP was not created for: the batch fails");
	ibv_wr_start(qx);
	next(r, 45);
	ibv_wr_local_inv(qx, 1234); /* not in this QP's send_ops_flags */
	CHECK_ERR(ibv_wr_complete(qx), EOPNOTSUPP);

	sv_step("the next good SEND is the one that arrives");
	memset(sv_ptr(r->mr, 28864), 0xaa, 8);
	ibv_wr_start(qx);
	next(r, 46);
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, r->mr->lkey, sv_addr(r->mr, 28864), 8);
	CHECK_OK(ibv_wr_complete(qx));
	sv_expect_wc(r->q.cq, 46, IBV_WC_SUCCESS, r->q.qp, &wc);
	sv_expect_empty(r->q.cq, "after the failed batches");
}

static void create_time(struct requester *r)
{
	sv_step("send_ops_flags the device or QP type lacks: EOPNOTSUPP at create");
	struct ibv_device_attr da;
	CHECK_OK(ibv_query_device(r->q.dev.ctx, &da));
	struct {
		enum ibv_qp_type type;
		uint64_t ops;
		int ok;
	} cases[] = {
		{IBV_QPT_UD, IBV_QP_EX_WITH_SEND, 1},
		{IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE, 0},
		{IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ, 0},
		{IBV_QPT_UC, QX_WITH_FLUSH, 0},
		{IBV_QPT_RC, IBV_QP_EX_WITH_TSO, 0},
		{IBV_QPT_RC, IBV_QP_EX_WITH_BIND_MW, !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW)},
		{IBV_QPT_RC, IBV_QP_EX_WITH_LOCAL_INV,
		 !!(da.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS)},
		{IBV_QPT_RC, IBV_QP_EX_WITH_SEND_WITH_INV,
		 !!(da.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS)},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		errno = 0;
		struct ibv_qp *qp = create_qp_ex(&r->q, cases[i].type, cases[i].ops);
		if (cases[i].ok) {
			CHECKF(qp != NULL, "case %zu: %s", i, strerror(errno));
			CHECK_OK(ibv_destroy_qp(qp));
		} else {
			CHECKF(qp == NULL && errno == EOPNOTSUPP, "case %zu: qp %p errno %d", i,
			       (void *)qp, errno);
		}
	}
	struct ibv_device_attr_ex ax;
	CHECK_OK(ibv_query_device_ex(r->q.dev.ctx, NULL, &ax));
	CHECK(ax.device_cap_flags_ex & (1ull << 40)); /* IB_UVERBS_DEVICE_ATOMIC_WRITE */
	CHECK(ax.device_cap_flags_ex & (1ull << 38)); /* IB_UVERBS_DEVICE_FLUSH_GLOBAL */
}

/* One WR on a fresh pair that the responder must refuse with REM_ACCESS_ERR. */
static void access_error(int step, int flush)
{
	struct requester r;
	requester_open(&r);
	CHECK_EQ(hear(), step);
	uint64_t value = 1;
	ibv_wr_start(r.qx);
	next(&r, 50);
	if (flush)
		qx_wr_flush(r.qx, r.peer.rkey, raddr(&r, 0), 64, QX_FLUSH_GLOBAL, QX_FLUSH_RANGE);
	else
		ibv_wr_atomic_write(r.qx, r.peer.rkey, raddr(&r, ATOMIC_AT), &value);
	CHECK_OK(ibv_wr_complete(r.qx));
	struct ibv_wc wc;
	sv_expect_wc(r.q.cq, 50, IBV_WC_REM_ACCESS_ERR, r.q.qp, &wc);
	say(step);
	requester_close(&r);
}

int main(void)
{
	sv_init("twoproc_qp_ex");
	pid_t pid;
	sock = sv_fork_peer(responder, &pid);
	struct requester r;
	requester_open(&r);
	CHECK_EQ(hear(), 1);
	create_time(&r);
	sends(&r);
	one_sided(&r);
	batches(&r);
	say(2);
	CHECK_EQ(hear(), 2);
	requester_close(&r);
	say(3);

	sv_step("ATOMIC WRITE to an MR without REMOTE_WRITE: REM_ACCESS_ERR");
	access_error(4, 0);
	sv_step("FLUSH to an MR without FLUSH_GLOBAL: REM_ACCESS_ERR");
	access_error(5, 1);
	sv_wait_peer(pid, "responder");
	sv_pass();
	return 0;
}
