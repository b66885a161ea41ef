/*
 * Memory windows (ibv_alloc_mw(3), ibv_bind_mw(3), ibv_post_send(3), IBA 10.6.7) between two
 * processes: A (parent) owns an MR and windows on it, B (child) reaches them with RDMA and
 * SEND_WITH_INV. First A checks the local rules alone (binds and invalidations that must
 * fail, on QPs no peer talks to), then each round connects a fresh pair of QPs (an access
 * error ends a connection) and B tries one rule. Run between hosts (tests/hosts/twoproc.sh)
 * it is the same over RoCE v2.
 */
#include "common.h"

#include <endian.h>
#include <sys/socket.h>

#define MR_LEN 65536
#define WIN 4096
#define W1_OFF 4096  /* the type 1 window: [W1_OFF, W1_OFF + WIN) of the MR */
#define W2_OFF 16384 /* the type 2 window */

static int sock;

/* What A tells B each round. */
struct round_info {
	uint32_t qpn;
	uint32_t w1_rkey, w2_rkey, mr_rkey;
	uint64_t w1_addr, w2_addr;
};

enum { R_ACCESS = 1, R_BEYOND, R_OTHER_QP, R_INV_TYPE1, R_DEALLOC, R_END };

/* ---- A alone: the local rules ---------------------------------------------------------- */

/* An RC QP in RTS that nobody talks to (binds and invalidations are local). */
static struct ibv_qp *lone_qp(struct sv_dev *d, struct sv_pair_cfg *cfg, struct ibv_cq *cq)
{
	struct ibv_qp *qp = sv_create_qp(d, cfg, cq, cq, NULL, NULL);
	sv_connect_remote(qp, d, cfg, 0xabcd, NULL, 0, 0, 0);
	return qp;
}

static int post_bind2(struct ibv_qp *qp, uint64_t id, struct ibv_mw *mw, uint32_t rkey,
		      struct ibv_mr *mr, uint64_t addr, uint64_t len, unsigned access)
{
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(qp, &wr, &bad);
}

static int post_inv(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, uint32_t rkey,
		    struct ibv_mr *mr, uint32_t len)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge = {mr ? sv_addr(mr, 0) : 0, len, mr ? mr->lkey : 0};
	wr.wr_id = id;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = rkey;
	wr.sg_list = &sge;
	wr.num_sge = mr ? 1 : 0;
	return ibv_post_send(qp, &wr, &bad);
}

static int bind1(struct ibv_qp *qp, uint64_t id, struct ibv_mw *mw, struct ibv_mr *mr,
		 uint64_t addr, uint64_t len, unsigned access)
{
	struct ibv_mw_bind b = {.wr_id = id, .send_flags = IBV_SEND_SIGNALED};
	b.bind_info.mr = mr;
	b.bind_info.addr = addr;
	b.bind_info.length = len;
	b.bind_info.mw_access_flags = access;
	return ibv_bind_mw(qp, mw, &b);
}

/* One failing local WQE on a fresh QP: the completion says `status`; the QP is dropped. */
static void expect_local_failure(struct sv_dev *d, struct sv_pair_cfg *cfg, struct ibv_cq *cq,
				 int (*post)(struct ibv_qp *qp, void *arg), void *arg,
				 enum ibv_wc_status status, const char *what)
{
	sv_step("local rule: %s", what);
	struct ibv_qp *qp = lone_qp(d, cfg, cq);
	CHECK_OK(post(qp, arg));
	sv_expect_wc(cq, 77, status, qp, NULL);
	CHECK_OK(ibv_destroy_qp(qp));
	sv_drain_async(d->ctx, 0);
}

struct fail_arg {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint64_t addr, len;
	unsigned access;
	uint32_t rkey;
};

static int fail_bind1(struct ibv_qp *qp, void *p)
{
	struct fail_arg *a = p;
	return bind1(qp, 77, a->mw, a->mr, a->addr, a->len, a->access);
}

static int fail_bind2(struct ibv_qp *qp, void *p)
{
	struct fail_arg *a = p;
	return post_bind2(qp, 77, a->mw, a->rkey, a->mr, a->addr, a->len, a->access);
}

static int fail_local_inv(struct ibv_qp *qp, void *p)
{
	return post_inv(qp, 77, IBV_WR_LOCAL_INV, ((struct fail_arg *)p)->rkey, NULL, 0);
}

static void local_rules(struct sv_dev *d, struct ibv_cq *cq, struct ibv_mr *mr)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	sv_step("device attributes");
	CHECK(d->dev_attr.max_mw > 0);
	CHECK(d->dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	CHECK(d->dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	struct ibv_device_attr_ex ex;
	CHECK_OK(ibv_query_device_ex(d->ctx, NULL, &ex));
	CHECK(ex.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW_TYPE_2B);

	errno = 0;
	CHECK(ibv_alloc_mw(d->pd, (enum ibv_mw_type)3) == NULL);
	CHECK_EQ(errno, EINVAL);
	struct ibv_mw *mw1 = ibv_alloc_mw(d->pd, IBV_MW_TYPE_1);
	struct ibv_mw *mw2 = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2);
	CHECK_EQ(mw1->type, IBV_MW_TYPE_1);
	CHECK(mw1->rkey != mw2->rkey);
	struct ibv_mr *nobind = sv_alloc_mr(d->pd, MR_LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *ro = sv_alloc_mr(d->pd, MR_LEN, IBV_ACCESS_MW_BIND);

	/* ibv_bind_mw(3) writes the next key at post time; after a failed bind the
	 * application puts the old one back. */
	const uint32_t mw1_key = mw1->rkey;
	struct fail_arg a = {mw1, nobind, sv_addr(nobind, 0), WIN, IBV_ACCESS_REMOTE_READ, 0};
	expect_local_failure(d, &cfg, cq, fail_bind1, &a, IBV_WC_MW_BIND_ERR,
			     "C10-73: type 1 bind to an MR without IBV_ACCESS_MW_BIND");
	CHECK_EQ(mw1->rkey, ibv_inc_rkey(mw1_key));
	mw1->rkey = mw1_key;
	a = (struct fail_arg){mw1, mr, sv_addr(mr, MR_LEN - WIN), 2 * WIN, IBV_ACCESS_REMOTE_READ, 0};
	expect_local_failure(d, &cfg, cq, fail_bind1, &a, IBV_WC_MW_BIND_ERR,
			     "C10-75: a window beyond the MR's end");
	mw1->rkey = mw1_key;
	a = (struct fail_arg){mw1, ro, sv_addr(ro, 0), WIN, IBV_ACCESS_REMOTE_WRITE, 0};
	expect_local_failure(d, &cfg, cq, fail_bind1, &a, IBV_WC_MW_BIND_ERR,
			     "C10-74: remote write through an MR without local write");
	mw1->rkey = mw1_key;
	a = (struct fail_arg){mw1, mr, sv_addr(mr, 0), WIN,
			      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED, 0};
	expect_local_failure(d, &cfg, cq, fail_bind1, &a, IBV_WC_MW_BIND_ERR,
			     "o10-36.2.2: a zero-based type 1 window");
	mw1->rkey = mw1_key;
	a = (struct fail_arg){mw2, mr, sv_addr(mr, 0), 0, IBV_ACCESS_REMOTE_READ,
			      ibv_inc_rkey(mw2->rkey)};
	expect_local_failure(d, &cfg, cq, fail_bind2, &a, IBV_WC_MW_BIND_ERR,
			     "o10-37.2.40: a type 2 bind of length 0");
	a.len = WIN;
	a.rkey = ibv_inc_rkey(mw2->rkey) + 0x100;
	expect_local_failure(d, &cfg, cq, fail_bind2, &a, IBV_WC_MW_BIND_ERR,
			     "a type 2 key with another window's index");
	a = (struct fail_arg){.rkey = mr->rkey};
	expect_local_failure(d, &cfg, cq, fail_local_inv, &a, IBV_WC_LOC_QP_OP_ERR,
			     "LOCAL_INV of an MR's key (no fast-registration MRs)");
	a = (struct fail_arg){.rkey = mw1->rkey};
	expect_local_failure(d, &cfg, cq, fail_local_inv, &a, IBV_WC_LOC_QP_OP_ERR,
			     "o10-37.2.26: LOCAL_INV of a type 1 window");

	sv_step("post-time errors");
	struct ibv_qp *qp = lone_qp(d, &cfg, cq);
	struct ibv_mw_bind b1 = {.wr_id = 1};
	CHECK_ERR(ibv_bind_mw(qp, mw2, &b1), EINVAL); /* type 2 is bound by a WR */
	CHECK_ERR(post_bind2(qp, 1, mw1, ibv_inc_rkey(mw1->rkey), mr, sv_addr(mr, 0), WIN, 0),
		  EINVAL); /* type 1 is bound by ibv_bind_mw */

	sv_step("type 1 bind and unbind; type 2 bind, rebind refused, local invalidate");
	uint32_t old = mw1->rkey;
	CHECK_OK(bind1(qp, 2, mw1, mr, sv_addr(mr, 0), WIN, IBV_ACCESS_REMOTE_READ));
	CHECK_EQ(mw1->rkey, ibv_inc_rkey(old)); /* written at post time, ibv_bind_mw(3) */
	struct ibv_wc wc;
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_BIND_MW);
	CHECK_ERR(ibv_dereg_mr(mr), EBUSY); /* IBA 10.6.7.2.6: a window is bound to it */
	CHECK_OK(bind1(qp, 3, mw1, mr, 0, 0, 0)); /* length 0: unbound */
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp, &wc);
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	CHECK_OK(post_bind2(qp, 4, mw2, k2, mr, sv_addr(mr, 0), WIN, IBV_ACCESS_REMOTE_READ));
	sv_expect_wc(cq, 4, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_BIND_MW);
	CHECK_OK(post_inv(qp, 5, IBV_WR_LOCAL_INV, k2, NULL, 0));
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_LOCAL_INV);
	CHECK_OK(ibv_destroy_qp(qp));

	/* o10-37.2.30: bound twice without an invalidation in between */
	qp = lone_qp(d, &cfg, cq);
	uint32_t k3 = ibv_inc_rkey(k2);
	CHECK_OK(post_bind2(qp, 6, mw2, k3, mr, sv_addr(mr, 0), WIN, IBV_ACCESS_REMOTE_READ));
	sv_expect_wc(cq, 6, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OK(post_bind2(qp, 7, mw2, ibv_inc_rkey(k3), mr, sv_addr(mr, 0), WIN, 0));
	sv_expect_wc(cq, 7, IBV_WC_MW_BIND_ERR, qp, &wc);
	CHECK_OK(ibv_destroy_qp(qp)); /* the QP goes: so does its binding */
	sv_drain_async(d->ctx, 0);

	CHECK_OK(ibv_dealloc_mw(mw1));
	CHECK_OK(ibv_dealloc_mw(mw2));
	sv_free_mr(nobind);
	sv_free_mr(ro);
}

/* ---- A: the owner of the windows -------------------------------------------------------- */

static struct ibv_qp *owner_connect(struct sv_dev *d, struct sv_pair_cfg *cfg, struct ibv_cq *cq,
				    struct ibv_mr *mr, struct round_info *ours, int nrecv)
{
	struct ibv_qp *qp = sv_create_qp(d, cfg, cq, cq, NULL, NULL);
	struct round_info theirs;
	ours->qpn = qp->qp_num;
	sv_exchange(sock, ours, &theirs, sizeof(theirs));
	sv_trade_gid(sock, qp);
	sv_connect_remote(qp, d, cfg, theirs.qpn, mr, 100, nrecv, 64);
	sv_say(sock, 0); /* in RTS: B's first request is not lost to a QP still in INIT */
	return qp;
}

/* The peer's access failed: our QP is in ERR with IBV_EVENT_QP_ACCESS_ERR. */
static void expect_access_error(struct sv_dev *d, struct ibv_qp *qp)
{
	sv_expect_async(d->ctx, IBV_EVENT_QP_ACCESS_ERR, qp);
	CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);
	CHECK_OK(ibv_destroy_qp(qp));
}

static void owner(struct sv_dev *d, struct ibv_cq *cq)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	/* No remote access of its own: only the windows open it. */
	struct ibv_mr *mr = sv_alloc_mr(d->pd, MR_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	local_rules(d, cq, mr);

	struct ibv_mw *mw1 = ibv_alloc_mw(d->pd, IBV_MW_TYPE_1);
	struct ibv_mw *mw2 = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2);
	struct ibv_wc wc;
	struct round_info info = {0};
	info.mr_rkey = mr->rkey;
	info.w1_addr = sv_addr(mr, W1_OFF);
	info.w2_addr = sv_addr(mr, W2_OFF);

	sv_step("round %d: access through both windows, SEND_WITH_INV, then the dead key",
		R_ACCESS);
	struct ibv_qp *qp = owner_connect(d, &cfg, cq, mr, &info, 0);
	CHECK_OK(bind1(qp, 1, mw1, mr, info.w1_addr, WIN,
		       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	CHECK_OK(post_bind2(qp, 2, mw2, k2, mr, info.w2_addr, WIN, IBV_ACCESS_REMOTE_WRITE));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OK(sv_post_recv(qp, 3, mr, 0, 64));
	memset(sv_ptr(mr, W1_OFF + 100), 0x3c, 100);
	info.w1_rkey = mw1->rkey;
	info.w2_rkey = k2;
	CHECK_EQ(write(sock, &info, sizeof(info)), (ssize_t)sizeof(info));
	CHECK_EQ(sv_hear(sock), R_ACCESS); /* B wrote, read and sent */
	CHECK_EQ(sv_ptr(mr, W1_OFF)[0], 0xa1);
	CHECK_EQ(sv_ptr(mr, W1_OFF + 63)[0], 0xa1);
	CHECK_EQ(sv_ptr(mr, W2_OFF + WIN - 1)[0], 0xa2);
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK(wc.wc_flags & IBV_WC_WITH_INV);
	CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM));
	CHECK_EQ(wc.invalidated_rkey, k2); /* host order, ibv_poll_cq(3) */
	sv_say(sock, R_ACCESS);
	expect_access_error(d, qp); /* B wrote through the invalidated window */

	sv_step("round %d: past the type 1 window's end, inside the MR", R_BEYOND);
	qp = owner_connect(d, &cfg, cq, mr, &info, 0);
	expect_access_error(d, qp);

	sv_step("round %d: a type 2 window bound to another QP", R_OTHER_QP);
	struct ibv_qp *other = lone_qp(d, &cfg, cq);
	k2 = ibv_inc_rkey(k2);
	CHECK_OK(post_bind2(other, 4, mw2, k2, mr, info.w2_addr, WIN, IBV_ACCESS_REMOTE_WRITE));
	sv_expect_wc(cq, 4, IBV_WC_SUCCESS, other, &wc);
	info.w2_rkey = k2;
	qp = owner_connect(d, &cfg, cq, mr, &info, 0);
	expect_access_error(d, qp);
	CHECK_OK(post_inv(other, 5, IBV_WR_LOCAL_INV, k2, NULL, 0));
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, other, &wc);
	CHECK_OK(ibv_destroy_qp(other));

	sv_step("round %d: SEND_WITH_INV naming a type 1 window", R_INV_TYPE1);
	qp = owner_connect(d, &cfg, cq, mr, &info, 1);
	sv_expect_wc(cq, 100, IBV_WC_REM_INV_REQ_ERR, qp, &wc);
	CHECK_EQ(sv_hear(sock), R_INV_TYPE1);
	CHECK_EQ(sv_query_state(qp), IBV_QPS_ERR);
	CHECK_OK(ibv_destroy_qp(qp));

	sv_step("round %d: the type 1 window deallocated while bound", R_DEALLOC);
	CHECK_OK(ibv_dealloc_mw(mw1));
	qp = owner_connect(d, &cfg, cq, mr, &info, 0);
	expect_access_error(d, qp);

	CHECK_OK(ibv_dealloc_mw(mw2));
	sv_free_mr(mr); /* nothing bound any more */
	sv_say(sock, R_END);
}

/* ---- B: the requester -------------------------------------------------------------------- */

static struct ibv_qp *peer_connect(struct sv_dev *d, struct sv_pair_cfg *cfg, struct ibv_cq *cq,
				   struct round_info *theirs)
{
	struct ibv_qp *qp = sv_create_qp(d, cfg, cq, cq, NULL, NULL);
	struct round_info ours = {.qpn = qp->qp_num};
	sv_exchange(sock, &ours, theirs, sizeof(*theirs));
	sv_trade_gid(sock, qp);
	sv_connect_remote(qp, d, cfg, theirs->qpn, NULL, 0, 0, 0);
	CHECK_EQ(sv_hear(sock), 0);
	return qp;
}

static void expect_failure(struct ibv_cq *cq, struct ibv_qp *qp, uint64_t id,
			   enum ibv_wc_status status)
{
	sv_expect_wc(cq, id, status, qp, NULL);
	CHECK_OK(ibv_destroy_qp(qp));
}

static void peer_main(int s)
{
	sock = s;
	struct sv_dev d;
	sv_open(&d);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, MR_LEN, SV_ACCESS_ALL);
	struct round_info r;

	/* R_ACCESS */
	struct ibv_qp *qp = peer_connect(&d, &cfg, cq, &r);
	CHECK_EQ(read(sock, &r, sizeof(r)), (ssize_t)sizeof(r)); /* the keys, once bound */
	memset(sv_ptr(mr, 0), 0xa1, 64);
	memset(sv_ptr(mr, 64), 0xa2, 1);
	CHECK_OK(sv_post_rdma(qp, 1, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED, r.w1_addr,
			      r.w1_rkey));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, NULL);
	CHECK_OK(sv_post_rdma(qp, 2, IBV_WR_RDMA_READ, mr, 1024, 100, IBV_SEND_SIGNALED,
			      r.w1_addr + 100, r.w1_rkey));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp, NULL);
	CHECK_EQ(sv_ptr(mr, 1024)[0], 0x3c);
	CHECK_EQ(sv_ptr(mr, 1123)[0], 0x3c);
	CHECK_OK(sv_post_rdma(qp, 3, IBV_WR_RDMA_WRITE, mr, 64, 1, IBV_SEND_SIGNALED,
			      r.w2_addr + WIN - 1, r.w2_rkey));
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp, NULL);
	CHECK_OK(post_inv(qp, 4, IBV_WR_SEND_WITH_INV, r.w2_rkey, mr, 16));
	struct ibv_wc wc;
	sv_expect_wc(cq, 4, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
	sv_say(sock, R_ACCESS);
	CHECK_EQ(sv_hear(sock), R_ACCESS);
	CHECK_OK(sv_post_rdma(qp, 5, IBV_WR_RDMA_WRITE, mr, 0, 8, IBV_SEND_SIGNALED, r.w2_addr,
			      r.w2_rkey));
	expect_failure(cq, qp, 5, IBV_WC_REM_ACCESS_ERR);

	/* R_BEYOND: the MR goes on, the window does not */
	qp = peer_connect(&d, &cfg, cq, &r);
	CHECK_OK(sv_post_rdma(qp, 6, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED,
			      r.w1_addr + WIN - 32, r.w1_rkey));
	expect_failure(cq, qp, 6, IBV_WC_REM_ACCESS_ERR);

	/* R_OTHER_QP */
	qp = peer_connect(&d, &cfg, cq, &r);
	CHECK_OK(sv_post_rdma(qp, 7, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED, r.w2_addr,
			      r.w2_rkey));
	expect_failure(cq, qp, 7, IBV_WC_REM_ACCESS_ERR);

	/* R_INV_TYPE1: a type 1 window cannot be invalidated (o10-37.2.26) */
	qp = peer_connect(&d, &cfg, cq, &r);
	CHECK_OK(post_inv(qp, 8, IBV_WR_SEND_WITH_INV, r.w1_rkey, mr, 16));
	expect_failure(cq, qp, 8, IBV_WC_REM_INV_REQ_ERR);
	sv_say(sock, R_INV_TYPE1);

	/* R_DEALLOC */
	qp = peer_connect(&d, &cfg, cq, &r);
	CHECK_OK(sv_post_rdma(qp, 9, IBV_WR_RDMA_READ, mr, 0, 64, IBV_SEND_SIGNALED, r.w1_addr,
			      r.w1_rkey));
	expect_failure(cq, qp, 9, IBV_WC_REM_ACCESS_ERR);

	CHECK_EQ(sv_hear(sock), R_END);
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&d);
	exit(0);
}

int main(void)
{
	sv_init("twoproc_mw");
	pid_t pid;
	sock = sv_fork_peer(peer_main, &pid);
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 64, NULL, NULL);
	owner(&d, cq);
	sv_wait_peer(pid, "requester");
	sv_drain_async(d.ctx, 0);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&d);
	sv_pass();
	return 0;
}
