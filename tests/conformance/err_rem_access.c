/*
 * err_rem_access: remote access violations.
 *
 * An RDMA or atomic operation that the responder's MR table refuses:
 * - an rkey that names no MR;
 * - an address range reaching past the end of the remote MR;
 * - an RDMA WRITE to an MR without IBV_ACCESS_REMOTE_WRITE;
 * - an RDMA READ from an MR without IBV_ACCESS_REMOTE_READ;
 * - an atomic on an MR without IBV_ACCESS_REMOTE_ATOMIC.
 * Expected each time, on a fresh pair:
 * - requester A: IBV_WC_REM_ACCESS_ERR, then its next WR flushed; A in the error state;
 * - responder B: in the error state, with IBV_EVENT_QP_ACCESS_ERR for B on the context's async
 *   fd; its posted receive is flushed; the target memory is untouched. (What a failed READ
 *   left in its local buffer is undefined, so that is not checked.)
 */
#include "common.h"

static struct sv_dev dev;
static struct ibv_mr *mr_a;

static void run_case(const char *name, enum ibv_wr_opcode op, struct ibv_mr *target,
		     uint64_t raddr, uint32_t rkey, uint32_t len)
{
	sv_step("%s", name);
	struct sv_pair p;
	sv_pair_open(&dev, NULL, &p);
	memset(target->addr, 0x5c, target->length);
	memset(sv_ptr(mr_a, 0), 0x11, 4096);
	CHECK_OK(sv_post_recv(p.qp[1], 50, target, 0, 16));

	struct ibv_send_wr wr, next, *bad = NULL;
	struct ibv_sge sge, nsge;
	sv_wr_init(&wr, &sge, 1, op, mr_a, 0, len, IBV_SEND_SIGNALED);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	/* A SEND behind it (fenced, so it cannot overtake a READ or atomic): never delivered. */
	sv_wr_init(&next, &nsge, 2, IBV_WR_SEND, mr_a, 0, 8, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
	wr.next = &next;
	CHECK_OK(ibv_post_send(p.qp[0], &wr, &bad));

	sv_expect_wc(p.scq[0], 1, IBV_WC_REM_ACCESS_ERR, p.qp[0], NULL);
	sv_expect_wc(p.scq[0], 2, IBV_WC_WR_FLUSH_ERR, p.qp[0], NULL);
	CHECK_EQ(sv_query_state(p.qp[0]), IBV_QPS_ERR);

	sv_expect_async(dev.ctx, IBV_EVENT_QP_ACCESS_ERR, p.qp[1]);
	CHECK_EQ(sv_query_state(p.qp[1]), IBV_QPS_ERR);
	sv_expect_wc(p.rcq[1], 50, IBV_WC_WR_FLUSH_ERR, p.qp[1], NULL);

	const uint8_t *t = target->addr;
	for (size_t i = 0; i < target->length; i++)
		CHECKF(t[i] == 0x5c, "target byte %zu changed to 0x%02x", i, t[i]);

	/* Anything else the errors raised is acked before the QPs go. */
	sv_drain_async(dev.ctx, 0);
	sv_pair_destroy(&p);
}

int main(void)
{
	sv_init("err_rem_access");
	sv_open(&dev);
	mr_a = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *all = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_mr *no_write = sv_alloc_mr(
		dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_mr *no_read = sv_alloc_mr(
		dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_mr *no_atomic = sv_alloc_mr(
		dev.pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

	uint32_t bad_rkey = all->rkey ^ 0x00a5a500;
	struct ibv_mr *mrs[] = { mr_a, all, no_write, no_read, no_atomic };
	for (int again = 1; again;) {
		again = 0;
		for (size_t i = 0; i < sizeof(mrs) / sizeof(mrs[0]); i++)
			if (bad_rkey == mrs[i]->rkey) {
				bad_rkey += 0x100;
				again = 1;
			}
	}

	run_case("RDMA WRITE with an rkey that names no MR", IBV_WR_RDMA_WRITE, all,
		 sv_addr(all, 0), bad_rkey, 64);
	run_case("RDMA WRITE reaching past the end of the remote MR", IBV_WR_RDMA_WRITE, all,
		 sv_addr(all, 4096 - 8), all->rkey, 64);
	run_case("RDMA READ starting before the remote MR", IBV_WR_RDMA_READ, all,
		 sv_addr(all, 0) - 64, all->rkey, 64);
	run_case("RDMA WRITE to an MR without REMOTE_WRITE", IBV_WR_RDMA_WRITE, no_write,
		 sv_addr(no_write, 0), no_write->rkey, 64);
	run_case("RDMA READ from an MR without REMOTE_READ", IBV_WR_RDMA_READ, no_read,
		 sv_addr(no_read, 0), no_read->rkey, 64);
	run_case("FETCH_AND_ADD on an MR without REMOTE_ATOMIC", IBV_WR_ATOMIC_FETCH_AND_ADD,
		 no_atomic, sv_addr(no_atomic, 0), no_atomic->rkey, 8);

	sv_step("teardown");
	for (size_t i = 0; i < sizeof(mrs) / sizeof(mrs[0]); i++)
		sv_free_mr(mrs[i]);
	sv_close(&dev);
	sv_pass();
	return 0;
}
