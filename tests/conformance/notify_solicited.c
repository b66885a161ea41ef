/*
 * notify_solicited: ibv_req_notify_cq(cq, solicited_only = 1).
 *
 * Per ibv_req_notify_cq(3), a CQE is solicited if it is a receive completion for a message with
 * the Solicited Event bit set, or if its status is not successful. So, on a CQ armed for
 * solicited completions only:
 * - the receive completion of an ordinary SEND does not fire (and leaves the CQ armed);
 * - the receive completion of a SEND with IBV_SEND_SOLICITED fires;
 * - so does that of an RDMA WRITE with immediate and IBV_SEND_SOLICITED;
 * - a successful send completion never fires;
 * - an error completion fires: a send with a bad lkey (IBV_WC_LOC_PROT_ERR) on the send CQ,
 *   and receives flushed by moving the QP to the error state (IBV_WC_WR_FLUSH_ERR).
 */
#include "common.h"

static struct sv_fixture f;
static struct ibv_mr *mr_a, *mr_b;
static struct ibv_comp_channel *ch;

/* SEND from A to B with the given flags; checks both completions. */
static void send_msg(uint64_t id, unsigned flags)
{
	sv_send_recv(&f.pair, 0, id, mr_a, mr_b, 100, flags, NULL);
}

int main(void)
{
	sv_init("notify_solicited");
	sv_fixture_open(&f, NULL, 1);
	ch = f.ch;
	mr_a = f.mr[0];
	mr_b = f.mr[1];
	struct ibv_cq *rcq = f.pair.rcq[1], *scq = f.pair.scq[0];

	sv_step("solicited-only: an unsolicited receive does not fire");
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	send_msg(1, 0);
	sv_expect_no_cq_event(ch, "receive completion of a SEND without IBV_SEND_SOLICITED");

	sv_step("the CQ is still armed: a solicited SEND fires");
	send_msg(2, IBV_SEND_SOLICITED);
	sv_expect_cq_event(ch, rcq);
	sv_expect_no_cq_event(ch, "one solicited completion");

	sv_step("SEND_WITH_IMM with IBV_SEND_SOLICITED fires");
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	CHECK_OK(sv_post_recv(f.pair.qp[1], 3, mr_b, 0, 256));
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, 3, IBV_WR_SEND_WITH_IMM, mr_a, 0, 16,
		   IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	wr.imm_data = htobe32(0xabcd);
	CHECK_OK(ibv_post_send(f.pair.qp[0], &wr, &bad));
	sv_expect_wc(f.pair.scq[0], 3, IBV_WC_SUCCESS, f.pair.qp[0], NULL);
	sv_expect_wc(rcq, 3, IBV_WC_SUCCESS, f.pair.qp[1], NULL);
	sv_expect_cq_event(ch, rcq);

	sv_step("RDMA_WRITE_WITH_IMM with IBV_SEND_SOLICITED fires");
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	CHECK_OK(sv_post_recv(f.pair.qp[1], 4, mr_b, 0, 256));
	sv_wr_init(&wr, &sge, 4, IBV_WR_RDMA_WRITE_WITH_IMM, mr_a, 0, 32,
		   IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	wr.imm_data = htobe32(0x1234);
	wr.wr.rdma.remote_addr = sv_addr(mr_b, 1024);
	wr.wr.rdma.rkey = mr_b->rkey;
	CHECK_OK(ibv_post_send(f.pair.qp[0], &wr, &bad));
	sv_expect_wc(f.pair.scq[0], 4, IBV_WC_SUCCESS, f.pair.qp[0], NULL);
	struct ibv_wc wc;
	sv_expect_wc(rcq, 4, IBV_WC_SUCCESS, f.pair.qp[1], &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV_RDMA_WITH_IMM);
	sv_expect_cq_event(ch, rcq);

	sv_step("a successful send completion never fires, even with IBV_SEND_SOLICITED");
	CHECK_OK(ibv_req_notify_cq(scq, 1));
	send_msg(5, 0);
	send_msg(6, IBV_SEND_SOLICITED);
	sv_expect_no_cq_event(ch, "successful send completions on a solicited-only CQ");

	sv_step("an error send completion fires (bad lkey: LOC_PROT_ERR)");
	struct ibv_sge bad_sge = { .addr = sv_addr(mr_a, 0), .length = 64,
				   .lkey = mr_a->lkey ^ 0x5a5a00 };
	sv_wr_init(&wr, &sge, 7, IBV_WR_SEND, mr_a, 0, 64, IBV_SEND_SIGNALED);
	wr.sg_list = &bad_sge;
	CHECK_OK(sv_post_recv(f.pair.qp[1], 7, mr_b, 0, 256));
	CHECK_OK(ibv_post_send(f.pair.qp[0], &wr, &bad));
	sv_expect_wc(scq, 7, IBV_WC_LOC_PROT_ERR, f.pair.qp[0], NULL);
	sv_expect_cq_event(ch, scq);

	sv_step("flushed receives fire (B moved to the error state)");
	/* B still holds receive 7, which the failed send never consumed; add two more. */
	CHECK_OK(sv_post_recv(f.pair.qp[1], 8, mr_b, 256, 256));
	CHECK_OK(sv_post_recv(f.pair.qp[1], 9, mr_b, 512, 256));
	sv_expect_empty(rcq, "before moving B to ERR");
	CHECK_OK(ibv_req_notify_cq(rcq, 1));
	CHECK_OK(sv_modify_state(f.pair.qp[1], IBV_QPS_ERR));
	for (uint64_t id = 7; id <= 9; id++)
		sv_expect_wc(rcq, id, IBV_WC_WR_FLUSH_ERR, f.pair.qp[1], NULL);
	sv_expect_cq_event(ch, rcq);
	sv_expect_no_cq_event(ch, "one arm, one event");

	sv_step("teardown");
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
