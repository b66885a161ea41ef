/*
 * On-demand paging between two processes (ibv_reg_mr(3) IBV_ACCESS_ON_DEMAND, implicit ODP,
 * ibv_advise_mr(3)), on the same host or (hosts.twoproc.odp) between hosts. B (child) owns
 * target memory: an ODP MR over four pages, registered while page 3 has no access at all
 * (PROT_NONE) and with page 2 read only, and an implicit ODP MR (NULL, SIZE_MAX) over its
 * whole address space. A (parent) posts from ODP memory of its own.
 *  - WRITE, READ and SEND into B's ODP pages and through its implicit MR land, their pages
 *    faulted in at the access; page 3, made accessible by B only after registration (and
 *    after a READ of it failed), takes a WRITE.
 *  - An access the page fault cannot serve is the access error, never a crash: a READ of the
 *    inaccessible page, a WRITE into the read-only page and a WRITE through the implicit MR
 *    to an unmapped address give IBV_WC_REM_ACCESS_ERR; a SEND from an unmapped address
 *    through A's implicit MR, and one from the page without access of its ODP MR, give
 *    IBV_WC_LOC_PROT_ERR. Each on a QP of its own (the error ends it). The unmapped address
 *    is below mmap_min_addr: a page we unmapped could be mapped again meanwhile.
 *  - ibv_advise_mr: prefetch (with and without IBV_ADVISE_MR_FLAG_FLUSH) succeeds, EFAULT
 *    for a synchronous prefetch of an unmapped page, ENOENT for an MR without ON_DEMAND,
 *    EINVAL for unknown flags; query_device_ex's odp_caps say all of it.
 */
#include <sys/mman.h>

#include "common.h"

#define NQP 6
enum { QP_GOOD, QP_RO_WRITE, QP_IMPLICIT_GONE, QP_UNMAPPED_READ, QP_LOCAL, QP_LOCAL_GONE };
#define MSG 512

static int sock;
static size_t page;

struct target_info {
	uint32_t qpn[NQP];
	uint64_t odp_addr;  /* B's four ODP pages */
	uint32_t odp_rkey;
	uint32_t implicit_rkey;
	uint64_t heap_addr; /* a page of B reached only through the implicit MR */
	uint64_t gone_addr; /* an unmapped address of B */
};

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* A page-aligned mapping of n pages, read-write. */
static uint8_t *map_pages(size_t n)
{
	void *p = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	return p;
}

static void check_odp_caps(struct ibv_context *ctx)
{
	struct ibv_device_attr_ex attr;
	CHECK_OK(ibv_query_device_ex(ctx, NULL, &attr));
	CHECK(attr.odp_caps.general_caps & IBV_ODP_SUPPORT);
	CHECK(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	CHECK_EQ(attr.odp_caps.per_transport_caps.rc_odp_caps & rc, rc);
	CHECK(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
}

static void target(int s)
{
	sock = s;
	page = (size_t)sysconf(_SC_PAGESIZE);
	struct sv_dev dev;
	sv_open(&dev);
	check_odp_caps(dev.ctx);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_qp *qp[NQP];
	struct target_info me = {0}, peer;
	for (int i = 0; i < NQP; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		me.qpn[i] = qp[i]->qp_num;
	}

	uint8_t *odp = map_pages(4);
	CHECK_OK(mprotect(odp + 3 * page, page, PROT_NONE)); /* no access when registered */
	CHECK_OK(mprotect(odp + 2 * page, page, PROT_READ));
	struct ibv_mr *mr = ibv_reg_mr(dev.pd, odp, 4 * page, SV_ACCESS_ALL | IBV_ACCESS_ON_DEMAND);
	CHECKF(mr != NULL, "ODP registration over an unmapped page failed: %s", strerror(errno));
	struct ibv_mr *implicit =
		ibv_reg_mr(dev.pd, NULL, SIZE_MAX, SV_ACCESS_ALL | IBV_ACCESS_ON_DEMAND);
	CHECKF(implicit != NULL, "implicit ODP registration failed: %s", strerror(errno));
	CHECK(implicit->addr == NULL);
	CHECK_EQ(implicit->length, SIZE_MAX);
	uint8_t *heap = map_pages(1);
	/* below mmap_min_addr: never mapped (a page we unmapped could be mapped again by the
	 * time A writes there, e.g. by our agent thread) */
	uint8_t *gone = (uint8_t *)page;
	memset(odp + page, 0x5a, page); /* what A reads */
	me.odp_addr = (uintptr_t)odp;
	me.odp_rkey = mr->rkey;
	me.implicit_rkey = implicit->rkey;
	me.heap_addr = (uintptr_t)heap;
	me.gone_addr = (uintptr_t)gone;
	sv_exchange(sock, &me, &peer, sizeof(me));
	for (int i = 0; i < NQP; i++) {
		sv_trade_gid(sock, qp[i]); /* between hosts only */
		/* the SEND lands in ODP page 0 at 2 KiB, through the explicit MR */
		sv_connect_remote(qp[i], &dev, &cfg, peer.qpn[i], i == QP_GOOD ? mr : NULL, 7,
				  i == QP_GOOD, MSG);
	}
	say(1);

	/* 1: A's WRITEs, READ and SEND on the good QP */
	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;
	sv_expect_wc(cq, 7, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	CHECK_EQ(wc.opcode, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, MSG);
	for (int i = 0; i < MSG; i++)
		CHECKF(odp[i] == (uint8_t)(0xc0 ^ i), "SEND byte %d is 0x%x", i, odp[i]);
	for (size_t i = 1024; i < 1024 + MSG; i++)
		CHECKF(odp[i] == 0xa1, "WRITE byte %zu is 0x%x", i, odp[i]);
	for (int i = 0; i < MSG; i++)
		CHECKF(heap[i] == 0xb2, "implicit WRITE byte %d is 0x%x", i, heap[i]);
	CHECK_EQ(sv_query_state(qp[QP_UNMAPPED_READ]), IBV_QPS_ERR);
	/* page 3 becomes accessible now, after registration: the next WRITE faults it in */
	CHECK_OK(mprotect(odp + 3 * page, page, PROT_READ | PROT_WRITE));
	say(2);

	/* 2: the WRITE into page 3, and the errors */
	CHECK_EQ(hear(), 2);
	for (int i = 0; i < MSG; i++)
		CHECKF(odp[3 * page + i] == 0xd3, "late WRITE byte %d is 0x%x", i, odp[3 * page + i]);
	for (size_t i = 0; i < page; i++)
		CHECKF(odp[2 * page + i] == 0, "the read-only page changed at %zu", i);
	/* the responder QPs of the access errors are in the error state (IBA 9.9.3) */
	CHECK_EQ(sv_query_state(qp[QP_RO_WRITE]), IBV_QPS_ERR);
	CHECK_EQ(sv_query_state(qp[QP_IMPLICIT_GONE]), IBV_QPS_ERR);
	CHECK_EQ(sv_query_state(qp[QP_GOOD]), IBV_QPS_RTS);
	say(3);

	CHECK_EQ(hear(), 4);
	for (int i = 0; i < NQP; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_dereg_mr(implicit));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

static void post_rdma(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, uint64_t laddr,
		      uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(qp, &wr, &bad));
}

static void check_advise(struct sv_dev *dev, struct ibv_mr *odp, uint8_t *buf)
{
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = (uint32_t)page, .lkey = odp->lkey};
	CHECK_OK(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			       IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1));
	CHECK_OK(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1));
	CHECK_OK(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
			       IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1));
	CHECK_ERR(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &sge, 1), EINVAL);
	/* page 3 of A's ODP buffer has no access: a synchronous prefetch fails, an
	 * asynchronous one is best effort */
	sge.addr = (uintptr_t)(buf + 3 * page);
	CHECK_ERR(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
				&sge, 1), EFAULT);
	CHECK_OK(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1));
	/* an MR registered without ON_DEMAND */
	struct ibv_mr *pinned = sv_alloc_mr(dev->pd, page, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge p = {.addr = (uintptr_t)pinned->addr, .length = 64, .lkey = pinned->lkey};
	CHECK_ERR(ibv_advise_mr(dev->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
				&p, 1), ENOENT);
	sv_free_mr(pinned);
}

int main(void)
{
	sv_init("twoproc_odp");
	page = (size_t)sysconf(_SC_PAGESIZE);
	pid_t child;
	sock = sv_fork_peer(target, &child);

	struct sv_dev dev;
	sv_open(&dev);
	check_odp_caps(dev.ctx);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_qp *qp[NQP];
	struct target_info me = {0}, b;
	for (int i = 0; i < NQP; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		me.qpn[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, &me, &b, sizeof(me));
	for (int i = 0; i < NQP; i++) {
		sv_trade_gid(sock, qp[i]);
		sv_connect_remote(qp[i], &dev, &cfg, b.qpn[i], NULL, 0, 0, 0);
	}
	/* A's own memory: four ODP pages (page 3 without access) and the implicit MR */
	uint8_t *buf = map_pages(4);
	CHECK_OK(mprotect(buf + 3 * page, page, PROT_NONE));
	struct ibv_mr *odp = ibv_reg_mr(dev.pd, buf, 4 * page,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp != NULL);
	struct ibv_mr *implicit =
		ibv_reg_mr(dev.pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(implicit != NULL);
	/* an implicit MR's iova is the virtual address: a non-zero one is refused */
	CHECK(ibv_reg_mr_iova(dev.pd, NULL, SIZE_MAX, 4096,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) == NULL);
	CHECK_EQ(errno, EINVAL);
	check_advise(&dev, odp, buf);
	CHECK_EQ(hear(), 1);

	sv_step("WRITE, READ, SEND into B's ODP pages and through its implicit MR");
	struct ibv_wc wc;
	memset(buf, 0xa1, MSG);
	post_rdma(qp[QP_GOOD], 1, IBV_WR_RDMA_WRITE, (uintptr_t)buf, odp->lkey, b.odp_addr + 1024,
		  b.odp_rkey, MSG);
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	post_rdma(qp[QP_GOOD], 2, IBV_WR_RDMA_READ, (uintptr_t)(buf + page), odp->lkey,
		  b.odp_addr + page, b.odp_rkey, MSG);
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	for (int i = 0; i < MSG; i++)
		CHECKF(buf[page + i] == 0x5a, "READ byte %d is 0x%x", i, buf[page + i]);
	uint8_t *heap_src = map_pages(1); /* registered only by A's implicit MR */
	memset(heap_src, 0xb2, MSG);
	post_rdma(qp[QP_GOOD], 3, IBV_WR_RDMA_WRITE, (uintptr_t)heap_src, implicit->lkey,
		  b.heap_addr, b.implicit_rkey, MSG);
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	memset(heap_src, 0, MSG);
	post_rdma(qp[QP_GOOD], 4, IBV_WR_RDMA_READ, (uintptr_t)heap_src, implicit->lkey,
		  b.heap_addr, b.implicit_rkey, MSG);
	sv_expect_wc(cq, 4, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	for (int i = 0; i < MSG; i++)
		CHECKF(heap_src[i] == 0xb2, "implicit READ byte %d is 0x%x", i, heap_src[i]);
	for (int i = 0; i < MSG; i++)
		buf[2 * page + i] = (uint8_t)(0xc0 ^ i);
	/* the SEND goes last: B checks everything when its receive completes */
	CHECK_OK(sv_post_send(qp[QP_GOOD], 5, odp, 2 * page, MSG, IBV_SEND_SIGNALED));
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);
	sv_step("a READ of B's ODP page without access");
	memset(buf, 0xee, MSG);
	post_rdma(qp[QP_UNMAPPED_READ], 12, IBV_WR_RDMA_READ, (uintptr_t)buf, odp->lkey,
		  b.odp_addr + 3 * page, b.odp_rkey, MSG);
	sv_expect_wc(cq, 12, IBV_WC_REM_ACCESS_ERR, qp[QP_UNMAPPED_READ], &wc);
	for (int i = 0; i < MSG; i++)
		CHECKF(buf[i] == 0xee, "a failed READ changed byte %d", i);
	say(1);

	CHECK_EQ(hear(), 2);
	sv_step("WRITE into the page B made accessible after registering it");
	memset(buf, 0xd3, MSG);
	post_rdma(qp[QP_GOOD], 6, IBV_WR_RDMA_WRITE, (uintptr_t)buf, odp->lkey,
		  b.odp_addr + 3 * page, b.odp_rkey, MSG);
	sv_expect_wc(cq, 6, IBV_WC_SUCCESS, qp[QP_GOOD], &wc);

	sv_step("accesses the page fault cannot serve: the access errors");
	memset(buf, 0xee, MSG);
	post_rdma(qp[QP_RO_WRITE], 10, IBV_WR_RDMA_WRITE, (uintptr_t)buf, odp->lkey,
		  b.odp_addr + 2 * page, b.odp_rkey, MSG);
	sv_expect_wc(cq, 10, IBV_WC_REM_ACCESS_ERR, qp[QP_RO_WRITE], &wc);
	post_rdma(qp[QP_IMPLICIT_GONE], 11, IBV_WR_RDMA_WRITE, (uintptr_t)buf, odp->lkey,
		  b.gone_addr, b.implicit_rkey, MSG);
	sv_expect_wc(cq, 11, IBV_WC_REM_ACCESS_ERR, qp[QP_IMPLICIT_GONE], &wc);
	CHECK_OK(sv_post_send(qp[QP_LOCAL], 13, odp, 3 * page, MSG, IBV_SEND_SIGNALED));
	sv_expect_wc(cq, 13, IBV_WC_LOC_PROT_ERR, qp[QP_LOCAL], &wc);
	struct ibv_sge gone = {.addr = page, .length = MSG, .lkey = implicit->lkey};
	struct ibv_send_wr send = {.wr_id = 14, .sg_list = &gone, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(qp[QP_LOCAL_GONE], &send, &bad));
	sv_expect_wc(cq, 14, IBV_WC_LOC_PROT_ERR, qp[QP_LOCAL_GONE], &wc);
	say(2);
	CHECK_EQ(hear(), 3);

	say(4);
	sv_wait_peer(child, "target");
	for (int i = 0; i < NQP; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_OK(ibv_dereg_mr(odp));
	CHECK_OK(ibv_dereg_mr(implicit));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
