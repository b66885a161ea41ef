/*
 * poll_cq_fields: what ibv_poll_cq returns, field by field, for every RC opcode.
 *
 * - ibv_poll_cq returns at most num_entries completions, in order, and removes them.
 * - SEND / RECV: opcode, wr_id, byte_len (receiver), qp_num (the QP owning the WQE), src_qp
 *   (the sender's QP number, on receives), wc_flags 0, slid/sl/pkey_index 0 on receives.
 * - SEND_WITH_IMM: IBV_WC_WITH_IMM, imm_data passed through untouched (network byte order).
 * - RDMA_WRITE: IBV_WC_RDMA_WRITE at the sender, no receive completion, data landed.
 * - RDMA_WRITE_WITH_IMM: consumes a receive WQE: IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_WITH_IMM,
 *   byte_len = written length; data landed at the remote address, not in the receive buffer.
 * - RDMA_READ: IBV_WC_RDMA_READ, byte_len, data landed.
 * - ATOMIC_CMP_AND_SWP / ATOMIC_FETCH_AND_ADD: IBV_WC_COMP_SWAP / IBV_WC_FETCH_ADD, byte_len 8,
 *   the old value returned into the local buffer, the remote value updated. Values are host
 *   64-bit integers, as with every software provider (rxe, siw).
 * - Several SGEs on both sides scatter and gather correctly.
 * - IBV_SEND_INLINE: the source buffer (not even registered) may be reused right after post.
 * - Unsignaled sends (sq_sig_all = 0) produce no completion.
 * - IBV_SEND_FENCE is accepted.
 *
 * A is qp[0] (requester), B is qp[1] (responder).
 */
#include "common.h"

static struct sv_fixture f;
static struct ibv_mr *mr_a, *mr_b;
static struct ibv_qp *qa, *qb;

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

static void check_filled(const uint8_t *p, size_t len, uint8_t seed, const char *what)
{
	for (size_t i = 0; i < len; i++)
		CHECKF(p[i] == (uint8_t)(seed + i * 7), "%s: byte %zu is 0x%02x, expected 0x%02x",
		       what, i, p[i], (uint8_t)(seed + i * 7));
}

static void check_bytes(const uint8_t *p, size_t len, uint8_t value, const char *what)
{
	for (size_t i = 0; i < len; i++)
		CHECKF(p[i] == value, "%s: byte %zu is 0x%02x, expected 0x%02x", what, i, p[i],
		       value);
}

/* The fields of a successful receive completion of a message from A. */
static void check_recv(const struct ibv_wc *wc, uint64_t id, int opcode, uint32_t len,
		       unsigned flags)
{
	CHECK_WC(*wc, id, IBV_WC_SUCCESS, qb);
	CHECK_OPCODE(*wc, opcode);
	CHECK_EQ(wc->byte_len, len);
	CHECK_EQ(wc->src_qp, qa->qp_num);
	CHECK_EQ(wc->wc_flags, flags);
	CHECK_EQ(wc->slid, 0);
	CHECK_EQ(wc->sl, 0);
	CHECK_EQ(wc->pkey_index, 0);
}

/* Waits for A's completion of wr `id` and checks its opcode and flags. */
static void expect_send_wc(uint64_t id, int opcode, struct ibv_wc *out)
{
	struct ibv_wc wc;
	sv_expect_wc(f.pair.scq[0], id, IBV_WC_SUCCESS, qa, &wc);
	CHECK_OPCODE(wc, opcode);
	CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
	if (out)
		*out = wc;
}

static void test_send_recv(void)
{
	sv_step("SEND / RECV fields");
	fill(sv_ptr(mr_a, 0), 1000, 1);
	CHECK_OK(sv_post_recv(qb, 0x100, mr_b, 0, 4096));
	CHECK_OK(sv_post_send(qa, 0x200, mr_a, 0, 1000, IBV_SEND_SIGNALED));
	expect_send_wc(0x200, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0x100, IBV_WC_RECV, 1000, 0);
	check_filled(sv_ptr(mr_b, 0), 1000, 1, "received SEND");
	sv_expect_empty(f.pair.scq[0], "after one SEND");
	sv_expect_empty(f.pair.rcq[1], "after one RECV");
}

static void test_poll_semantics(void)
{
	sv_step("ibv_poll_cq returns at most num_entries, in order, and removes them");
	for (int i = 0; i < 5; i++)
		CHECK_OK(sv_post_recv(qb, 0x300 + i, mr_b, 1024 * i, 1024));
	for (int i = 0; i < 5; i++)
		CHECK_OK(sv_post_send(qa, 0x400 + i, mr_a, 0, 10 + i, IBV_SEND_SIGNALED));
	for (int i = 0; i < 5; i++)
		expect_send_wc(0x400 + i, IBV_WC_SEND, NULL);
	int got = 0;
	while (got < 5) {
		struct ibv_wc wc[3];
		memset(wc, 0xff, sizeof(wc));
		int ne = sv_poll(f.pair.rcq[1], got < 4 ? 2 : 1, wc, SV_WAIT_MS);
		CHECKF(ne >= 1 && ne <= 2, "poll returned %d", ne);
		/* Entries past the ones returned are not written. */
		CHECK_EQ(wc[2].wr_id, UINT64_MAX);
		for (int i = 0; i < ne; i++, got++)
			check_recv(&wc[i], 0x300 + got, IBV_WC_RECV, 10 + got, 0);
	}
	sv_expect_empty(f.pair.rcq[1], "all five receive completions were polled");
	struct ibv_wc wc;
	CHECK_EQ(ibv_poll_cq(f.pair.rcq[1], 4, &wc), 0);
}

static void test_send_with_imm(void)
{
	sv_step("SEND_WITH_IMM: imm_data kept in network byte order");
	CHECK_OK(sv_post_recv(qb, 0x500, mr_b, 0, 4096));
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, 0x501, IBV_WR_SEND_WITH_IMM, mr_a, 0, 200, IBV_SEND_SIGNALED);
	wr.imm_data = htobe32(0x12345678);
	CHECK_OK(ibv_post_send(qa, &wr, &bad));
	expect_send_wc(0x501, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0x500, IBV_WC_RECV, 200, IBV_WC_WITH_IMM);
	CHECK_EQ(wc.imm_data, htobe32(0x12345678));
	CHECK_EQ(be32toh(wc.imm_data), 0x12345678);
}

static void test_rdma_write(void)
{
	sv_step("RDMA_WRITE: sender completion only, data landed");
	fill(sv_ptr(mr_a, 4096), 3000, 2);
	memset(sv_ptr(mr_b, 8192), 0xee, 3100);
	/* A receive is posted at B; the write must not consume it. */
	CHECK_OK(sv_post_recv(qb, 0x600, mr_b, 0, 4096));
	CHECK_OK(sv_post_rdma(qa, 0x601, IBV_WR_RDMA_WRITE, mr_a, 4096, 3000, IBV_SEND_SIGNALED,
			      sv_addr(mr_b, 8192), mr_b->rkey));
	expect_send_wc(0x601, IBV_WC_RDMA_WRITE, NULL);
	check_filled(sv_ptr(mr_b, 8192), 3000, 2, "RDMA WRITE target");
	check_bytes(sv_ptr(mr_b, 8192 + 3000), 100, 0xee, "bytes after the RDMA WRITE target");
	sv_expect_empty(f.pair.rcq[1], "an RDMA WRITE makes no receive completion");
	/* The receive is still there: the next SEND consumes it. */
	CHECK_OK(sv_post_send(qa, 0x602, mr_a, 0, 8, IBV_SEND_SIGNALED));
	expect_send_wc(0x602, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0x600, IBV_WC_RECV, 8, 0);
}

static void test_rdma_write_with_imm(void)
{
	sv_step("RDMA_WRITE_WITH_IMM: consumes a receive, IBV_WC_RECV_RDMA_WITH_IMM");
	fill(sv_ptr(mr_a, 4096), 2048, 3);
	memset(sv_ptr(mr_b, 0), 0xcc, 4096);
	memset(sv_ptr(mr_b, 16384), 0, 4096);
	CHECK_OK(sv_post_recv(qb, 0x700, mr_b, 0, 4096));
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, 0x701, IBV_WR_RDMA_WRITE_WITH_IMM, mr_a, 4096, 2048,
		   IBV_SEND_SIGNALED);
	wr.imm_data = htobe32(0xa1b2c3d4);
	wr.wr.rdma.remote_addr = sv_addr(mr_b, 16384);
	wr.wr.rdma.rkey = mr_b->rkey;
	CHECK_OK(ibv_post_send(qa, &wr, &bad));
	expect_send_wc(0x701, IBV_WC_RDMA_WRITE, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0x700, IBV_WC_RECV_RDMA_WITH_IMM, 2048, IBV_WC_WITH_IMM);
	CHECK_EQ(wc.imm_data, htobe32(0xa1b2c3d4));
	check_filled(sv_ptr(mr_b, 16384), 2048, 3, "RDMA WRITE WITH IMM target");
	check_bytes(sv_ptr(mr_b, 0), 4096, 0xcc, "receive buffer of an RDMA WRITE WITH IMM");
}

static void test_rdma_read(void)
{
	sv_step("RDMA_READ: IBV_WC_RDMA_READ, byte_len, data landed");
	fill(sv_ptr(mr_b, 20000), 1500, 4);
	memset(sv_ptr(mr_a, 30000), 0, 1600);
	CHECK_OK(sv_post_rdma(qa, 0x801, IBV_WR_RDMA_READ, mr_a, 30000, 1500, IBV_SEND_SIGNALED,
			      sv_addr(mr_b, 20000), mr_b->rkey));
	struct ibv_wc wc;
	expect_send_wc(0x801, IBV_WC_RDMA_READ, &wc);
	CHECK_EQ(wc.byte_len, 1500);
	check_filled(sv_ptr(mr_a, 30000), 1500, 4, "RDMA READ destination");
	check_bytes(sv_ptr(mr_a, 31500), 100, 0, "bytes after the RDMA READ destination");
	sv_expect_empty(f.pair.rcq[1], "an RDMA READ makes no receive completion");
}

static void post_atomic(uint64_t id, enum ibv_wr_opcode op, uint64_t compare_add,
			uint64_t swap)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, id, op, mr_a, 40000, 8, IBV_SEND_SIGNALED);
	wr.wr.atomic.remote_addr = sv_addr(mr_b, 40000);
	wr.wr.atomic.rkey = mr_b->rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	CHECK_OK(ibv_post_send(qa, &wr, &bad));
}

static uint64_t load64(struct ibv_mr *mr, size_t off)
{
	uint64_t v;
	memcpy(&v, sv_ptr(mr, off), sizeof(v));
	return v;
}

static void store64(struct ibv_mr *mr, size_t off, uint64_t v)
{
	memcpy(sv_ptr(mr, off), &v, sizeof(v));
}

static void test_atomics(void)
{
	struct ibv_wc wc;
	sv_step("ATOMIC_CMP_AND_SWP that matches");
	store64(mr_b, 40000, 0x1111111111111111ull);
	store64(mr_a, 40000, 0);
	post_atomic(0x901, IBV_WR_ATOMIC_CMP_AND_SWP, 0x1111111111111111ull, 0x2222222222222222ull);
	expect_send_wc(0x901, IBV_WC_COMP_SWAP, &wc);
	CHECK_EQ(wc.byte_len, 8);
	CHECK_EQ(load64(mr_a, 40000), 0x1111111111111111ull);
	CHECK_EQ(load64(mr_b, 40000), 0x2222222222222222ull);

	sv_step("ATOMIC_CMP_AND_SWP that does not match");
	post_atomic(0x902, IBV_WR_ATOMIC_CMP_AND_SWP, 0x9999, 0x3333);
	expect_send_wc(0x902, IBV_WC_COMP_SWAP, &wc);
	CHECK_EQ(wc.byte_len, 8);
	CHECK_EQ(load64(mr_a, 40000), 0x2222222222222222ull);
	CHECK_EQ(load64(mr_b, 40000), 0x2222222222222222ull);

	sv_step("ATOMIC_FETCH_AND_ADD");
	post_atomic(0x903, IBV_WR_ATOMIC_FETCH_AND_ADD, 5, 0);
	expect_send_wc(0x903, IBV_WC_FETCH_ADD, &wc);
	CHECK_EQ(wc.byte_len, 8);
	CHECK_EQ(load64(mr_a, 40000), 0x2222222222222222ull);
	CHECK_EQ(load64(mr_b, 40000), 0x2222222222222227ull);
	sv_expect_empty(f.pair.rcq[1], "atomics make no receive completion");
}

static void test_sge_lists(void)
{
	sv_step("several SGEs: gather at the sender, scatter at the receiver");
	fill(sv_ptr(mr_a, 0), 4096, 5);
	memset(sv_ptr(mr_b, 0), 0xdd, 8192);
	/* Gather 100 + 200 + 300 bytes from three places of A's buffer. */
	struct ibv_sge ssge[3] = {
		{ sv_addr(mr_a, 0), 100, mr_a->lkey },
		{ sv_addr(mr_a, 1000), 200, mr_a->lkey },
		{ sv_addr(mr_a, 2000), 300, mr_a->lkey },
	};
	/* Scatter into 250 + 50 + 1000 bytes at three places of B's buffer. */
	struct ibv_sge rsge[3] = {
		{ sv_addr(mr_b, 0), 250, mr_b->lkey },
		{ sv_addr(mr_b, 3000), 50, mr_b->lkey },
		{ sv_addr(mr_b, 5000), 1000, mr_b->lkey },
	};
	struct ibv_recv_wr rwr = { .wr_id = 0xa00, .sg_list = rsge, .num_sge = 3 }, *rbad = NULL;
	CHECK_OK(ibv_post_recv(qb, &rwr, &rbad));
	struct ibv_send_wr swr = { .wr_id = 0xa01, .sg_list = ssge, .num_sge = 3,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *sbad = NULL;
	CHECK_OK(ibv_post_send(qa, &swr, &sbad));
	expect_send_wc(0xa01, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0xa00, IBV_WC_RECV, 600, 0);

	/* The 600-byte message, as gathered. */
	uint8_t msg[600];
	memcpy(msg, sv_ptr(mr_a, 0), 100);
	memcpy(msg + 100, sv_ptr(mr_a, 1000), 200);
	memcpy(msg + 300, sv_ptr(mr_a, 2000), 300);
	CHECK(memcmp(sv_ptr(mr_b, 0), msg, 250) == 0);
	CHECK(memcmp(sv_ptr(mr_b, 3000), msg + 250, 50) == 0);
	CHECK(memcmp(sv_ptr(mr_b, 5000), msg + 300, 300) == 0);
	check_bytes(sv_ptr(mr_b, 250), 3000 - 250, 0xdd, "between scatter entries 0 and 1");
	check_bytes(sv_ptr(mr_b, 3050), 5000 - 3050, 0xdd, "between scatter entries 1 and 2");
	check_bytes(sv_ptr(mr_b, 5300), 8192 - 5300, 0xdd, "after the data in scatter entry 2");

	sv_step("several SGEs in an RDMA WRITE and an RDMA READ");
	memset(sv_ptr(mr_b, 0), 0, 8192);
	struct ibv_send_wr wwr = { .wr_id = 0xa02, .sg_list = ssge, .num_sge = 3,
				   .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	wwr.wr.rdma.remote_addr = sv_addr(mr_b, 100);
	wwr.wr.rdma.rkey = mr_b->rkey;
	CHECK_OK(ibv_post_send(qa, &wwr, &sbad));
	expect_send_wc(0xa02, IBV_WC_RDMA_WRITE, NULL);
	CHECK(memcmp(sv_ptr(mr_b, 100), msg, 600) == 0);
	memset(sv_ptr(mr_a, 10000), 0, 4096);
	struct ibv_sge dsge[2] = {
		{ sv_addr(mr_a, 10000), 400, mr_a->lkey },
		{ sv_addr(mr_a, 12000), 200, mr_a->lkey },
	};
	struct ibv_send_wr rdwr = { .wr_id = 0xa03, .sg_list = dsge, .num_sge = 2,
				    .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
	rdwr.wr.rdma.remote_addr = sv_addr(mr_b, 100);
	rdwr.wr.rdma.rkey = mr_b->rkey;
	CHECK_OK(ibv_post_send(qa, &rdwr, &sbad));
	expect_send_wc(0xa03, IBV_WC_RDMA_READ, &wc);
	CHECK_EQ(wc.byte_len, 600);
	CHECK(memcmp(sv_ptr(mr_a, 10000), msg, 400) == 0);
	CHECK(memcmp(sv_ptr(mr_a, 12000), msg + 400, 200) == 0);
}

static void test_inline(void)
{
	sv_step("IBV_SEND_INLINE from an unregistered buffer, reused right after post");
	CHECK(f.pair.cap[0].max_inline_data >= 32);
	uint8_t local[32];
	fill(local, sizeof(local), 6);
	CHECK_OK(sv_post_recv(qb, 0xb00, mr_b, 0, 4096));
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = sizeof(local), .lkey = 0 };
	struct ibv_send_wr wr = { .wr_id = 0xb01, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	struct ibv_send_wr *bad = NULL;
	CHECK_OK(ibv_post_send(qa, &wr, &bad));
	memset(local, 0, sizeof(local)); /* allowed: the data was copied by ibv_post_send */
	expect_send_wc(0xb01, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0xb00, IBV_WC_RECV, 32, 0);
	check_filled(sv_ptr(mr_b, 0), 32, 6, "inline SEND");
}

static void test_unsignaled(void)
{
	sv_step("unsignaled sends produce no completion");
	CHECK_OK(sv_post_recv(qb, 0xc00, mr_b, 0, 1024));
	CHECK_OK(sv_post_recv(qb, 0xc01, mr_b, 1024, 1024));
	CHECK_OK(sv_post_recv(qb, 0xc02, mr_b, 2048, 1024));
	CHECK_OK(sv_post_send(qa, 0xdead, mr_a, 0, 16, 0));
	CHECK_OK(sv_post_rdma(qa, 0xdeae, IBV_WR_RDMA_WRITE, mr_a, 0, 16, 0,
			      sv_addr(mr_b, 50000), mr_b->rkey));
	CHECK_OK(sv_post_send(qa, 0xdeaf, mr_a, 0, 17, 0));
	CHECK_OK(sv_post_send(qa, 0xbeef, mr_a, 0, 18, IBV_SEND_SIGNALED));
	/* Completions come in order: had the unsignaled ones made any, they would come first. */
	expect_send_wc(0xbeef, IBV_WC_SEND, NULL);
	sv_expect_empty(f.pair.scq[0], "only the signaled send completes");
	struct ibv_wc wc[3];
	CHECK_EQ(sv_poll(f.pair.rcq[1], 3, wc, SV_WAIT_MS), 3);
	check_recv(&wc[0], 0xc00, IBV_WC_RECV, 16, 0);
	check_recv(&wc[1], 0xc01, IBV_WC_RECV, 17, 0);
	check_recv(&wc[2], 0xc02, IBV_WC_RECV, 18, 0);
}

static void test_fence(void)
{
	sv_step("IBV_SEND_FENCE is accepted: READ then fenced SEND");
	fill(sv_ptr(mr_b, 60000), 64, 7);
	CHECK_OK(sv_post_recv(qb, 0xd00, mr_b, 0, 1024));
	struct ibv_send_wr rd, snd, *bad = NULL;
	struct ibv_sge rsge, ssge;
	sv_wr_init(&rd, &rsge, 0xd01, IBV_WR_RDMA_READ, mr_a, 60000, 64, IBV_SEND_SIGNALED);
	rd.wr.rdma.remote_addr = sv_addr(mr_b, 60000);
	rd.wr.rdma.rkey = mr_b->rkey;
	/* The fenced SEND carries what the READ brought in. */
	sv_wr_init(&snd, &ssge, 0xd02, IBV_WR_SEND, mr_a, 60000, 64,
		   IBV_SEND_SIGNALED | IBV_SEND_FENCE);
	rd.next = &snd;
	CHECK_OK(ibv_post_send(qa, &rd, &bad));
	expect_send_wc(0xd01, IBV_WC_RDMA_READ, NULL);
	expect_send_wc(0xd02, IBV_WC_SEND, NULL);
	struct ibv_wc wc;
	sv_poll_one(f.pair.rcq[1], &wc);
	check_recv(&wc, 0xd00, IBV_WC_RECV, 64, 0);
	check_filled(sv_ptr(mr_b, 0), 64, 7, "fenced SEND after READ");
}

int main(void)
{
	sv_init("poll_cq_fields");
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_inline_data = 64;
	cfg.max_send_sge = 4;
	cfg.max_recv_sge = 4;
	sv_fixture_open(&f, &cfg, 0);
	qa = f.pair.qp[0];
	qb = f.pair.qp[1];
	mr_a = f.mr[0];
	mr_b = f.mr[1];

	test_send_recv();
	test_poll_semantics();
	test_send_with_imm();
	test_rdma_write();
	test_rdma_write_with_imm();
	test_rdma_read();
	test_atomics();
	test_sge_lists();
	test_inline();
	test_unsignaled();
	test_fence();

	sv_step("teardown");
	sv_expect_empty(f.pair.scq[0], "end");
	sv_expect_empty(f.pair.rcq[1], "end");
	sv_expect_empty(f.pair.scq[1], "B never sent");
	sv_expect_empty(f.pair.rcq[0], "A never received");
	sv_fixture_close(&f);
	sv_pass();
	return 0;
}
