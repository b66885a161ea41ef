/*
 * Tag matching (ibv_create_srq_ex(3) IBV_SRQT_TM, ibv_post_srq_ops(3)) with the sender in
 * another process, on the same host or (hosts.twoproc.tag_matching) between hosts. A (the
 * test) receives on an RC QP attached to a TM-SRQ whose completions go to an extended CQ
 * with IBV_WC_EX_WITH_TM_INFO; B (peer) sends ordinary SENDs that start with a TMH, one
 * message per step, and receives the rendezvous' FIN on its own receive queue. Checked:
 *  - tm_caps; bad TM-SRQ attributes (no CQ, too many tags) are EINVAL; list operations on a
 *    basic SRQ are EINVAL;
 *  - ADD/DEL/SYNC completions (TM_ADD, TM_DEL, TM_SYNC; DEL of a consumed tag: TM_ERR);
 *  - ordering: of several entries that match, the earliest posted one is taken; masks (a
 *    partial mask, a wildcard); the payload lands without its TMH, with the tag and app_ctx
 *    in ibv_wc_read_tm_info and TM_MATCH | TM_DATA_VALID;
 *  - unexpected messages (no entry) go whole to a plain receive (TM_RECV, no flags); an
 *    entry added before the software synced (ADD completes with TM_SYNC_REQ) does not match
 *    until IBV_WR_TAG_SYNC reports the unexpected count, then it does;
 *  - NO_TAG messages: whole, IBV_WC_TM_NO_TAG;
 *  - rendezvous: TM_RECV with TM_MATCH, then A's QP reads B's buffer into the tagged buffer
 *    (TM_RECV, TM_DATA_VALID, the bytes), and B receives a FIN (TMH op FIN, the tag) after its
 *    SEND completed.
 */
#include "common.h"

#include <endian.h>
#include <infiniband/tm_types.h>

#define RNDV_LEN 8192
#define BUF 16384

enum { M_EAGER, M_NO_TAG, M_RNDV };
struct msg { int kind; uint64_t tag; uint32_t len; };
/* What B sends, step by step (A knows it too). */
static const struct msg msgs[] = {
	{M_EAGER, 0x100, 200}, {M_EAGER, 0x100, 200}, {M_EAGER, 0x2ab, 100},
	{M_EAGER, 0x100, 64},  {M_EAGER, 0x999, 80},  {M_EAGER, 0x555, 48},
	{M_EAGER, 0x555, 48},  {M_NO_TAG, 0, 40},     {M_RNDV, 0x888, 64},
};
#define NMSG (int)(sizeof(msgs) / sizeof(msgs[0]))

static int sock;

static void fill_tmh(uint8_t *p, uint8_t op, uint32_t app_ctx, uint64_t tag)
{
	struct ibv_tmh h = {.opcode = op, .app_ctx = htobe32(app_ctx), .tag = htobe64(tag)};
	memcpy(p, &h, sizeof(h));
}

static void peer(int s)
{
	sock = s;
	struct sv_one_qp b;
	sv_one_qp_open(&b, NULL, 64, BUF + RNDV_LEN);
	/* Receives for FINs at offset BUF.. (one each); the rendezvous data at 0. */
	sv_one_qp_connect(&b, sv_trade_qpn(sock, b.qp), 500, 2, 64);
	uint8_t *data = sv_ptr(b.mr, 0);
	for (int i = 0; i < RNDV_LEN; i++)
		data[i] = (uint8_t)(i * 7 + 3);
	uint8_t *out = sv_ptr(b.mr, RNDV_LEN + 128);
	for (int step = 0; step < NMSG; step++) {
		CHECK_EQ(sv_hear(sock), step);
		const struct msg *m = &msgs[step];
		memset(out, 0x40 + step, m->len);
		if (m->kind == M_RNDV) {
			fill_tmh(out, IBV_TMH_RNDV, 0xabc0 + step, m->tag);
			struct ibv_rvh rvh = {.va = htobe64(sv_addr(b.mr, 0)),
					      .rkey = htobe32(b.mr->rkey), .len = htobe32(RNDV_LEN)};
			memcpy(out + 16, &rvh, sizeof(rvh));
		} else {
			fill_tmh(out, m->kind == M_NO_TAG ? IBV_TMH_NO_TAG : IBV_TMH_EAGER,
				 0xabc0 + step, m->tag);
		}
		CHECK_OK(sv_post_send(b.qp, step, b.mr, RNDV_LEN + 128, m->len, IBV_SEND_SIGNALED));
		struct ibv_wc wc;
		sv_expect_wc(b.cq, step, IBV_WC_SUCCESS, b.qp, &wc);
		CHECK_OPCODE(wc, IBV_WC_SEND);
		if (m->kind == M_RNDV) {
			sv_step("B: the FIN after the rendezvous");
			sv_expect_wc(b.cq, 500, IBV_WC_SUCCESS, b.qp, &wc);
			CHECK_OPCODE(wc, IBV_WC_RECV);
			CHECK_EQ(wc.byte_len, sizeof(struct ibv_tmh));
			struct ibv_tmh fin; /* in receive 500's slot, offset 0, after the READ */
			memcpy(&fin, sv_ptr(b.mr, 0), sizeof(fin));
			CHECK_EQ(fin.opcode, IBV_TMH_FIN);
			CHECK_EQ(be64toh(fin.tag), m->tag);
			CHECK_EQ(be32toh(fin.app_ctx), 0xabc0 + step);
		}
		sv_say(sock, step);
	}
	sv_one_qp_close(&b);
	exit(0);
}

static struct ibv_cq_ex *cq;
static struct ibv_srq *srq;

/* One completion of the TM CQ through the poll API, with its tag info. */
static void expect(uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op,
		   unsigned flags, struct ibv_wc_tm_info *tm, uint32_t *byte_len)
{
	struct ibv_poll_cq_attr attr = {0};
	long long until = sv_now_ms() + SV_WAIT_MS;
	int ret;
	while ((ret = ibv_start_poll(cq, &attr)) == ENOENT && sv_now_ms() < until)
		;
	CHECKF(ret == 0, "no completion (expected wr_id %llu): %d", (unsigned long long)wr_id, ret);
	CHECKF(cq->status == st, "wr_id %llu: status %d, expected %d", (unsigned long long)cq->wr_id,
	       cq->status, st);
	CHECK_EQ(cq->wr_id, wr_id);
	if (st == IBV_WC_SUCCESS) {
		CHECK_EQ(ibv_wc_read_opcode(cq), op);
		CHECK_EQ(ibv_wc_read_wc_flags(cq), flags);
	}
	struct ibv_wc_tm_info info;
	ibv_wc_read_tm_info(cq, &info);
	if (tm)
		*tm = info;
	if (byte_len)
		*byte_len = ibv_wc_read_byte_len(cq);
	ibv_end_poll(cq);
}

static uint32_t add_tag(uint64_t wr_id, uint64_t tag, uint64_t mask, struct ibv_mr *mr,
			size_t off, uint32_t len, unsigned flags, uint32_t unexpected)
{
	struct ibv_sge sge = {sv_addr(mr, off), len, mr->lkey};
	struct ibv_ops_wr op = {.wr_id = wr_id, .opcode = IBV_WR_TAG_ADD,
				.flags = IBV_OPS_SIGNALED | flags};
	op.tm.unexpected_cnt = unexpected;
	op.tm.add.recv_wr_id = wr_id;
	op.tm.add.sg_list = &sge;
	op.tm.add.num_sge = 1;
	op.tm.add.tag = tag;
	op.tm.add.mask = mask;
	struct ibv_ops_wr *bad;
	CHECK_OK(ibv_post_srq_ops(srq, &op, &bad));
	return op.tm.handle;
}

static void srq_op(uint64_t wr_id, enum ibv_ops_wr_opcode code, uint32_t handle, uint32_t cnt)
{
	struct ibv_ops_wr op = {.wr_id = wr_id, .opcode = code,
				.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC};
	op.tm.handle = handle;
	op.tm.unexpected_cnt = cnt;
	struct ibv_ops_wr *bad;
	CHECK_OK(ibv_post_srq_ops(srq, &op, &bad));
}

static void step(int i)
{
	sv_say(sock, i);
	CHECK_EQ(sv_hear(sock), i);
}

int main(void)
{
	sv_init("twoproc_tag_matching");
	pid_t child;
	sock = sv_fork_peer(peer, &child);

	struct sv_dev d;
	sv_open(&d);
	sv_step("A: tm_caps and bad attributes");
	struct ibv_device_attr_ex ax;
	CHECK_OK(ibv_query_device_ex(d.ctx, NULL, &ax));
	CHECK(ax.tm_caps.flags & IBV_TM_CAP_RC);
	CHECK(ax.tm_caps.max_num_tags >= 8);
	CHECK(ax.tm_caps.max_rndv_hdr_size >= 32);
	struct ibv_cq_init_attr_ex ca = {.cqe = 64,
		.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_TM_INFO};
	cq = ibv_create_cq_ex(d.ctx, &ca);
	CHECK(cq);
	struct ibv_srq_init_attr_ex sa = {
		.attr = {.max_wr = 16, .max_sge = 1},
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
			     IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM, .pd = d.pd, .cq = ibv_cq_ex_to_cq(cq),
		.tm_cap = {.max_num_tags = ax.tm_caps.max_num_tags + 1, .max_ops = 8}};
	errno = 0;
	CHECK(!ibv_create_srq_ex(d.ctx, &sa));
	CHECK_EQ(errno, EINVAL);
	sa.tm_cap.max_num_tags = 8;
	sa.comp_mask &= ~IBV_SRQ_INIT_ATTR_CQ;
	errno = 0;
	CHECK(!ibv_create_srq_ex(d.ctx, &sa));
	CHECK_EQ(errno, EINVAL);
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	srq = ibv_create_srq_ex(d.ctx, &sa);
	CHECK(srq);
	struct ibv_srq_init_attr basic_attr = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *basic = ibv_create_srq(d.pd, &basic_attr);
	CHECK(basic);
	struct ibv_ops_wr sync = {.opcode = IBV_WR_TAG_SYNC}, *bad;
	CHECK_ERR(ibv_post_srq_ops(basic, &sync, &bad), EINVAL);
	CHECK_OK(ibv_destroy_srq(basic));

	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_qp *qp = sv_create_qp(&d, &cfg, ibv_cq_ex_to_cq(cq), ibv_cq_ex_to_cq(cq), srq,
					 NULL);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, 16 * 1024 * 4, SV_ACCESS_ALL);
	sv_connect_remote(qp, &d, &cfg, sv_trade_qpn(sock, qp), NULL, 0, 0, 0);
	/* Plain receives at slots 8.. (1 KiB each). */
	for (int i = 0; i < 4; i++)
		CHECK_OK(sv_post_srq_recv(srq, 900 + i, mr, (8 + i) * 1024, 1024));

	sv_step("A: ADD four entries; ordering and masks");
	uint32_t h[4];
	h[0] = add_tag(101, 0x100, ~0ull, mr, 0 * 1024, 1024, 0, 0);
	h[1] = add_tag(102, 0x200, 0xff00, mr, 1 * 1024, 1024, 0, 0);
	h[2] = add_tag(103, 0, 0, mr, 2 * 1024, 1024, 0, 0);
	h[3] = add_tag(104, 0x100, ~0ull, mr, 3 * 1024, 1024, 0, 0);
	for (int i = 0; i < 4; i++) {
		struct ibv_wc_tm_info tm;
		expect(101 + i, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, &tm, NULL);
		CHECK_EQ(tm.tag, 0);
		for (int j = 0; j < i; j++)
			CHECK(h[i] != h[j]);
	}
	const uint64_t want[4] = {101, 103, 102, 104}; /* for messages 0..3 */
	for (int i = 0; i < 4; i++) {
		step(i);
		struct ibv_wc_tm_info tm;
		uint32_t len;
		expect(want[i], IBV_WC_SUCCESS, IBV_WC_TM_RECV,
		       IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, &tm, &len);
		CHECK_EQ(tm.tag, msgs[i].tag);
		CHECK_EQ(tm.priv, 0xabc0 + i);
		CHECK_EQ(len, msgs[i].len - 16);
		uint8_t *buf = sv_ptr(mr, (want[i] - 101) * 1024);
		for (uint32_t k = 0; k < len; k++)
			CHECKF(buf[k] == 0x40 + i, "message %d byte %u: 0x%x", i, k, buf[k]);
	}

	sv_step("A: an unexpected message, then an entry posted before the sync");
	step(4);
	uint32_t len;
	struct ibv_wc_tm_info tm;
	expect(900, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, &tm, &len);
	CHECK_EQ(len, msgs[4].len);
	CHECK_EQ(sv_ptr(mr, 8 * 1024)[0], IBV_TMH_EAGER); /* the whole message, TMH first */
	add_tag(105, 0x555, ~0ull, mr, 4 * 1024, 1024, 0, 0);
	expect(105, IBV_WC_SUCCESS, IBV_WC_TM_ADD, IBV_WC_TM_SYNC_REQ, NULL, NULL);
	step(5); /* 0x555: the entry is not armed yet */
	expect(901, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, NULL, NULL);
	srq_op(27, IBV_WR_TAG_SYNC, 0, 2);
	expect(27, IBV_WC_SUCCESS, IBV_WC_TM_SYNC, 0, NULL, NULL);
	step(6); /* now it matches */
	expect(105, IBV_WC_SUCCESS, IBV_WC_TM_RECV, IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, &tm,
	       NULL);
	CHECK_EQ(tm.tag, 0x555);

	sv_step("A: NO_TAG, DEL");
	step(7);
	expect(902, IBV_WC_SUCCESS, IBV_WC_TM_NO_TAG, 0, NULL, &len);
	CHECK_EQ(len, msgs[7].len);
	uint32_t hd = add_tag(106, 0x777, ~0ull, mr, 5 * 1024, 1024, IBV_OPS_TM_SYNC, 2);
	expect(106, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, NULL, NULL);
	srq_op(28, IBV_WR_TAG_DEL, hd, 2);
	expect(28, IBV_WC_SUCCESS, IBV_WC_TM_DEL, 0, NULL, NULL);
	srq_op(29, IBV_WR_TAG_DEL, hd, 2);
	expect(29, IBV_WC_TM_ERR, IBV_WC_TM_DEL, 0, NULL, NULL);

	sv_step("A: rendezvous");
	add_tag(107, 0x888, ~0ull, mr, 6 * 4096, RNDV_LEN, IBV_OPS_TM_SYNC, 2);
	expect(107, IBV_WC_SUCCESS, IBV_WC_TM_ADD, 0, NULL, NULL);
	sv_say(sock, 8);
	expect(107, IBV_WC_SUCCESS, IBV_WC_TM_RECV, IBV_WC_TM_MATCH, &tm, NULL);
	CHECK_EQ(tm.tag, 0x888);
	expect(107, IBV_WC_SUCCESS, IBV_WC_TM_RECV, IBV_WC_TM_DATA_VALID, NULL, &len);
	CHECK_EQ(len, RNDV_LEN);
	uint8_t *got = sv_ptr(mr, 6 * 4096);
	for (int i = 0; i < RNDV_LEN; i++)
		CHECKF(got[i] == (uint8_t)(i * 7 + 3), "rendezvous byte %d: 0x%x", i, got[i]);
	CHECK_EQ(sv_hear(sock), 8);
	sv_wait_peer(child, "B");

	CHECK_OK(ibv_destroy_qp(qp));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_OK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)));
	sv_free_mr(mr);
	sv_close(&d);
	sv_pass();
	return 0;
}
