/*
 * Large SENDs between two processes of one host, placed by the requester straight into the
 * receive (docs/send-placement.md), checked byte for byte. A (parent) sends, B (child)
 * receives; every payload is a pattern of (message, offset), and the bytes past each
 * message must stay untouched.
 *  1. With B stopped (SIGSTOP): SENDs of 1 MiB into a shared page-aligned buffer, 5000 B
 *     into a receive of three buffers in two MRs (one not page-aligned: cross-memory
 *     attach), 64 KiB into the unaligned MR, 6000 B into a larger receive. They complete at
 *     A while B cannot run: nothing of B's (its agent thread) took part. Then B checks them.
 * 1b. Slot-sized SENDs (issue 14, send-small), B stopped again: 1 KiB and a 4 KiB
 *     SEND_WITH_IMM into shared receives are placed (their bytes are there before B polls),
 *     512 B and 4 KiB into the private MR ride the slots (not there until B polls); all
 *     complete in order with their lengths and IMM.
 *  2. Order: small SEND, large SEND, RDMA WRITE, WRITE_WITH_IMM, a SEND into a receive of
 *     five buffers (too many to place: through B's agent), small SEND complete at B in order.
 *  3. IMM + SE: an unsolicited SEND_WITH_IMM fires no event on a CQ armed for solicited
 *     completions, a solicited one does; imm_data, wc_flags, src_qp as posted.
 *  4. RNR, then a late receive: the SEND completes once B posts it.
 *  5. A receive too small: B's LOC_LEN_ERR, A's REM_INV_REQ_ERR.
 *  6. A receive whose MR was deregistered: B's LOC_PROT_ERR, not one byte lands.
 * Between hosts (tests/hosts), and with SOFTVERBS_NO_CMA, step 1 does not stop B: there B's
 * thread (its agent) receives some of them. With SOFTVERBS_NO_SHARED_MR every placement is a
 * process_vm_writev (the .no_shared_mr variant).
 */
#include "common.h"

#include <arpa/inet.h>
#include <signal.h>
#include <sys/wait.h>

#define BIG_LEN (4u << 20)
#define CMA_LEN (256u << 10)
#define NQP 3

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static uint8_t pattern(unsigned msg, size_t off)
{
	return (uint8_t)(msg * 131u + off * 7u + (off >> 9));
}

static void fill(uint8_t *p, unsigned msg, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(msg, i);
}

/* Where a message's bytes must be: a list of buffers, filled in order. */
struct piece {
	uint8_t *at;
	size_t len;
};

static void check_pieces(unsigned msg, const struct piece *pc, int n, size_t len)
{
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		for (size_t k = 0; k < pc[i].len; k++, off++) {
			uint8_t want = off < len ? pattern(msg, off) : 0;
			CHECKF(pc[i].at[k] == want, "message %u, byte %zu (buffer %d + %zu): 0x%02x, expected 0x%02x",
			       msg, off, i, k, pc[i].at[k], want);
		}
	}
}

static void check_bytes(unsigned msg, uint8_t *at, size_t len, size_t room)
{
	struct piece pc = {at, room};
	check_pieces(msg, &pc, 1, len);
}

static void expect_recv(struct ibv_cq *cq, uint64_t id, struct ibv_qp *qp, uint32_t len,
			uint32_t src_qp, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, op);
	CHECK_EQ(wc.byte_len, len);
	CHECK_EQ(wc.src_qp, src_qp);
	if (op == IBV_WC_RECV)
		CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
}

static int post_recv_sges(struct ibv_qp *qp, uint64_t id, struct ibv_sge *sg, int n)
{
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = sg, .num_sge = n}, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static void receiver(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_sge = 5;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(dev.ctx);
	CHECK(ch);
	struct ibv_cq *scq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_cq *rcq[NQP];
	struct ibv_qp *qp[NQP];
	uint32_t mine[NQP], peer[NQP];
	for (int i = 0; i < NQP; i++) {
		rcq[i] = sv_create_cq(&dev, 64, NULL, i == 0 ? ch : NULL);
		qp[i] = sv_create_qp(&dev, &cfg, scq, rcq[i], NULL, NULL);
		mine[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, mine, peer, sizeof(mine));
	for (int i = 0; i < NQP; i++)
		sv_trade_gid(sock, qp[i]);
	/* Receive buffers registered with local write only, as perftest's SEND tests do. */
	struct ibv_mr *big = sv_alloc_mr(dev.pd, BIG_LEN, IBV_ACCESS_LOCAL_WRITE);
	uint8_t *cma_block = calloc(1, CMA_LEN + 64);
	CHECK(cma_block);
	uint8_t *cma_buf = cma_block + 16; /* not page-aligned: stays private */
	struct ibv_mr *cma = ibv_reg_mr(dev.pd, cma_buf, CMA_LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cma);
	struct ibv_mr *wmr = sv_alloc_mr(dev.pd, 65536, SV_ACCESS_ALL);
	struct ibv_mr *gone = sv_alloc_mr(dev.pd, 65536, IBV_ACCESS_LOCAL_WRITE);
	uint8_t *gone_buf = gone->addr;
	uint64_t wmr_at[2] = {sv_addr(wmr, 0), wmr->rkey};
	CHECK(write(sock, wmr_at, sizeof(wmr_at)) == sizeof(wmr_at));
	for (int i = 0; i < NQP; i++) {
		CHECK_OK(sv_modify_init(qp[i], &cfg));
		CHECK_OK(sv_post_recv(qp[i], 1, big, (size_t)3 << 20, 64)); /* warm-up */
		CHECK_OK(sv_modify_rtr(qp[i], &dev, peer[i], &cfg));
		CHECK_OK(sv_modify_rts(qp[i], &cfg));
	}
	say(1);
	CHECK_EQ(hear(), 1);
	for (int i = 0; i < NQP; i++)
		expect_recv(rcq[i], 1, qp[i], 64, peer[i], IBV_WC_RECV);

	/* 1: placed while we are stopped */
	memset(big->addr, 0, BIG_LEN);
	memset(cma_buf, 0, CMA_LEN);
	CHECK_OK(sv_post_recv(qp[0], 10, big, 0, 1u << 20));
	struct ibv_sge three[3] = {
		{sv_addr(big, (1u << 20) + 100), 1000, big->lkey},
		{(uintptr_t)cma_buf, 3000, cma->lkey},
		{sv_addr(big, (1u << 20) + 8192), 1000, big->lkey},
	};
	CHECK_OK(post_recv_sges(qp[0], 11, three, 3));
	CHECK_OK(sv_post_recv(qp[0], 12, cma, 4096, 65536));
	CHECK_OK(sv_post_recv(qp[0], 13, big, 2u << 20, 8192));
	say(2);
	CHECK_EQ(hear(), 2);
	expect_recv(rcq[0], 10, qp[0], 1u << 20, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 11, qp[0], 5000, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 12, qp[0], 65536, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 13, qp[0], 6000, peer[0], IBV_WC_RECV);
	check_bytes(10, big->addr, 1u << 20, (1u << 20) + 100);
	struct piece p11[3] = {{sv_ptr(big, (1u << 20) + 100), 1000},
			       {cma_buf, 3000},
			       {sv_ptr(big, (1u << 20) + 8192), 1000}};
	check_pieces(11, p11, 3, 5000);
	check_bytes(12, cma_buf + 4096, 65536, 65536 + 64);
	check_bytes(13, sv_ptr(big, 2u << 20), 6000, 8192 + 64);

	/* 1b: slot-sized SENDs, placed where the receive is shared (send-small) */
	memset(big->addr, 0, 65536);
	memset(cma_buf, 0, 8192);
	CHECK_OK(sv_post_recv(qp[0], 100, big, 0, 1024));
	CHECK_OK(sv_post_recv(qp[0], 101, big, 8192, 4096));
	CHECK_OK(sv_post_recv(qp[0], 102, big, 16384, 600));
	CHECK_OK(sv_post_recv(qp[0], 103, cma, 0, 4096));
	say(101);
	CHECK_EQ(hear(), 101);
	/* Placement needs the receive's pages shared with A (decision 0005) and A on this host. */
	if (!sv_peer_on_other_host() && !getenv("SOFTVERBS_NO_SHARED_MR") && !getenv("SOFTVERBS_NO_CMA")) {
		check_bytes(100, big->addr, 1024, 1024 + 64);
		check_bytes(101, sv_ptr(big, 8192), 4096, 4096 + 64);
		for (size_t i = 0; i < 512; i++)
			CHECKF(((uint8_t *)big->addr)[16384 + i] == 0 && cma_buf[i] == 0,
			       "byte %zu of a slot-carried SEND landed before its receiver polled", i);
	}
	expect_recv(rcq[0], 100, qp[0], 1024, peer[0], IBV_WC_RECV);
	struct ibv_wc wc;
	sv_expect_wc(rcq[0], 101, IBV_WC_SUCCESS, qp[0], &wc);
	CHECK_EQ(wc.byte_len, 4096);
	CHECK_EQ(wc.src_qp, peer[0]);
	CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
	CHECK_EQ(wc.imm_data, htonl(0x5151));
	expect_recv(rcq[0], 102, qp[0], 512, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 103, qp[0], 4096, peer[0], IBV_WC_RECV);
	check_bytes(100, big->addr, 1024, 1024 + 64);
	check_bytes(101, sv_ptr(big, 8192), 4096, 4096 + 64);
	check_bytes(102, sv_ptr(big, 16384), 512, 600 + 64);
	check_bytes(103, cma_buf, 4096, 4096 + 64);

	/* 2: order among the paths */
	memset(big->addr, 0, BIG_LEN);
	CHECK_OK(sv_post_recv(qp[0], 20, big, 0, 100));
	CHECK_OK(sv_post_recv(qp[0], 21, big, 4096, 8192));
	CHECK_OK(sv_post_recv(qp[0], 22, big, 16384, 64)); /* the WRITE_WITH_IMM's */
	struct ibv_sge five[5];
	for (int i = 0; i < 5; i++)
		five[i] = (struct ibv_sge){sv_addr(big, 65536 + (size_t)i * 4096), 2000, big->lkey};
	CHECK_OK(post_recv_sges(qp[0], 23, five, 5));
	CHECK_OK(sv_post_recv(qp[0], 24, big, 131072, 3000));
	say(3);
	CHECK_EQ(hear(), 3);
	expect_recv(rcq[0], 20, qp[0], 100, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 21, qp[0], 8192, peer[0], IBV_WC_RECV);
	sv_expect_wc(rcq[0], 22, IBV_WC_SUCCESS, qp[0], &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK_EQ(wc.imm_data, htonl(0x1234));
	expect_recv(rcq[0], 23, qp[0], 10000, peer[0], IBV_WC_RECV);
	expect_recv(rcq[0], 24, qp[0], 3000, peer[0], IBV_WC_RECV);
	check_bytes(20, big->addr, 100, 200);
	check_bytes(21, sv_ptr(big, 4096), 8192, 8192 + 64);
	check_bytes(22, sv_ptr(wmr, 0), 8192, 8192);
	check_bytes(23, sv_ptr(wmr, 8192), 4096, 4096 + 64);
	struct piece p23[5];
	for (int i = 0; i < 5; i++)
		p23[i] = (struct piece){sv_ptr(big, 65536 + (size_t)i * 4096), 2000};
	check_pieces(24, p23, 5, 10000);
	check_bytes(25, sv_ptr(big, 131072), 3000, 3064);

	/* 3: IMM and SE */
	CHECK_OK(sv_post_recv(qp[0], 30, big, 0, 65536));
	CHECK_OK(sv_post_recv(qp[0], 31, big, 65536, 65536));
	CHECK_OK(ibv_req_notify_cq(rcq[0], 1));
	say(4);
	CHECK_EQ(hear(), 4); /* the unsolicited one was sent and acknowledged */
	sv_expect_no_cq_event(ch, "an unsolicited SEND_WITH_IMM on a CQ armed for solicited ones");
	say(5);
	CHECK_EQ(hear(), 5);
	sv_expect_cq_event(ch, rcq[0]);
	for (unsigned i = 0; i < 2; i++) {
		sv_expect_wc(rcq[0], 30 + i, IBV_WC_SUCCESS, qp[0], &wc);
		CHECK_OPCODE(wc, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, 65536);
		CHECK_EQ(wc.src_qp, peer[0]);
		CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
		CHECK_EQ(wc.imm_data, htonl(0xabc0 + i));
		check_bytes(30 + i, sv_ptr(big, 65536 * (size_t)i), 65536, 65536);
	}

	/* 4: RNR, then a late receive */
	CHECK_EQ(hear(), 6); /* A posted its SEND: no receive is there */
	sv_sleep_ms(50);
	memset(big->addr, 0, 300000);
	CHECK_OK(sv_post_recv(qp[0], 40, big, 0, 262144));
	expect_recv(rcq[0], 40, qp[0], 262144, peer[0], IBV_WC_RECV);
	check_bytes(40, big->addr, 262144, 262144 + 64);

	/* 5: too small */
	CHECK_OK(sv_post_recv(qp[1], 50, big, 0, 8192));
	say(7);
	sv_expect_wc(rcq[1], 50, IBV_WC_LOC_LEN_ERR, qp[1], &wc);
	CHECK_EQ(sv_query_state(qp[1]), IBV_QPS_ERR);

	/* 6: the receive's MR deregistered before the SEND */
	CHECK_OK(sv_post_recv(qp[2], 60, gone, 0, 65536));
	CHECK_OK(ibv_dereg_mr(gone)); /* the buffer stays: we look at it below */
	say(8);
	sv_expect_wc(rcq[2], 60, IBV_WC_LOC_PROT_ERR, qp[2], &wc);
	CHECK_EQ(sv_query_state(qp[2]), IBV_QPS_ERR);
	for (size_t i = 0; i < 65536; i++)
		CHECKF(gone_buf[i] == 0, "byte %zu of a deregistered receive buffer was written", i);
	CHECK_EQ(hear(), 9);

	for (int i = 0; i < NQP; i++) {
		CHECK_OK(ibv_destroy_qp(qp[i]));
		CHECK_OK(ibv_destroy_cq(rcq[i]));
	}
	free(gone_buf);
	sv_free_mr(wmr);
	CHECK_OK(ibv_dereg_mr(cma));
	free(cma_block);
	sv_free_mr(big);
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	_exit(0);
}

static void post_send(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_mr *mr,
		      size_t off, uint32_t len, unsigned flags, uint32_t imm)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	sv_wr_init(&wr, &sge, id, op, mr, off, len, flags | IBV_SEND_SIGNALED);
	wr.imm_data = imm;
	CHECK_OK(ibv_post_send(qp, &wr, &bad));
}

/* Fills mr at `off` with message `msg`'s pattern and SENDs it. */
static void send_msg(struct ibv_qp *qp, uint64_t id, unsigned msg, struct ibv_mr *mr, size_t off,
		     uint32_t len)
{
	fill(sv_ptr(mr, off), msg, len);
	post_send(qp, id, IBV_WR_SEND, mr, off, len, 0, 0);
}

int main(void)
{
	sv_init("twoproc_send_place");
	pid_t child;
	sock = sv_fork_peer(receiver, &child);

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_send_wr = 64;
	struct ibv_cq *cq = sv_create_cq(&dev, 128, NULL, NULL);
	struct ibv_qp *qp[NQP];
	uint32_t mine[NQP], peer[NQP];
	for (int i = 0; i < NQP; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		mine[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, mine, peer, sizeof(mine));
	for (int i = 0; i < NQP; i++)
		sv_trade_gid(sock, qp[i]);
	uint64_t wmr_at[2];
	CHECK(read(sock, wmr_at, sizeof(wmr_at)) == sizeof(wmr_at));
	struct ibv_mr *src = sv_alloc_mr(dev.pd, 4u << 20, SV_ACCESS_ALL);
	for (int i = 0; i < NQP; i++)
		sv_connect_remote(qp[i], &dev, &cfg, peer[i], NULL, 0, 0, 0);
	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;

	sv_step("a small SEND on each QP: the receive windows open");
	for (int i = 0; i < NQP; i++) {
		CHECK_OK(sv_post_send(qp[i], 1, src, 0, 64, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp[i], &wc);
	}
	say(1);

	sv_step("large SENDs complete while the receiver is stopped");
	CHECK_EQ(hear(), 2);
	/* Without cross-memory attach the unaligned buffers can only be reached through B. */
	int stop = !sv_peer_on_other_host() && !getenv("SOFTVERBS_NO_CMA");
	if (stop) {
		CHECK(kill(child, SIGSTOP) == 0);
		int st;
		CHECK(waitpid(child, &st, WUNTRACED) == child && WIFSTOPPED(st)); /* all its threads */
	}
	send_msg(qp[0], 10, 10, src, 0, 1u << 20);
	send_msg(qp[0], 11, 11, src, 1u << 20, 5000);
	send_msg(qp[0], 12, 12, src, 2u << 20, 65536);
	send_msg(qp[0], 13, 13, src, 3u << 20, 6000);
	for (uint64_t id = 10; id <= 13; id++) {
		sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp[0], &wc);
		CHECK_OPCODE(wc, IBV_WC_SEND);
	}
	if (stop)
		CHECK(kill(child, SIGCONT) == 0);
	say(2);

	sv_step("slot-sized SENDs: placed into shared receives, the slots otherwise, in order");
	CHECK_EQ(hear(), 101);
	if (stop) {
		CHECK(kill(child, SIGSTOP) == 0);
		int st;
		CHECK(waitpid(child, &st, WUNTRACED) == child && WIFSTOPPED(st));
	}
	send_msg(qp[0], 100, 100, src, 0, 1024);
	fill(sv_ptr(src, 8192), 101, 4096);
	post_send(qp[0], 101, IBV_WR_SEND_WITH_IMM, src, 8192, 4096, 0, htonl(0x5151));
	send_msg(qp[0], 102, 102, src, 16384, 512);
	send_msg(qp[0], 103, 103, src, 32768, 4096);
	for (uint64_t id = 100; id <= 103; id++) {
		sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp[0], &wc);
		CHECK_OPCODE(wc, IBV_WC_SEND);
	}
	if (stop)
		CHECK(kill(child, SIGCONT) == 0);
	say(101);

	sv_step("order: small SEND, large SEND, WRITE, WRITE_WITH_IMM, five-buffer SEND, SEND");
	CHECK_EQ(hear(), 3);
	send_msg(qp[0], 20, 20, src, 0, 100);
	send_msg(qp[0], 21, 21, src, 4096, 8192);
	fill(sv_ptr(src, 65536), 22, 8192);
	CHECK_OK(sv_post_rdma(qp[0], 22, IBV_WR_RDMA_WRITE, src, 65536, 8192, IBV_SEND_SIGNALED,
			      wmr_at[0], (uint32_t)wmr_at[1]));
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	fill(sv_ptr(src, 131072), 23, 4096);
	sv_wr_init(&wr, &sge, 23, IBV_WR_RDMA_WRITE_WITH_IMM, src, 131072, 4096, IBV_SEND_SIGNALED);
	wr.imm_data = htonl(0x1234);
	wr.wr.rdma.remote_addr = wmr_at[0] + 8192;
	wr.wr.rdma.rkey = (uint32_t)wmr_at[1];
	CHECK_OK(ibv_post_send(qp[0], &wr, &bad));
	send_msg(qp[0], 24, 24, src, 1u << 20, 10000);
	send_msg(qp[0], 25, 25, src, 2u << 20, 3000);
	for (uint64_t id = 20; id <= 25; id++)
		sv_expect_wc(cq, id, IBV_WC_SUCCESS, qp[0], &wc);
	say(3);

	sv_step("SEND_WITH_IMM, unsolicited then solicited");
	CHECK_EQ(hear(), 4);
	fill(sv_ptr(src, 0), 30, 65536);
	post_send(qp[0], 30, IBV_WR_SEND_WITH_IMM, src, 0, 65536, 0, htonl(0xabc0));
	sv_expect_wc(cq, 30, IBV_WC_SUCCESS, qp[0], &wc);
	say(4);
	CHECK_EQ(hear(), 5);
	fill(sv_ptr(src, 65536), 31, 65536);
	post_send(qp[0], 31, IBV_WR_SEND_WITH_IMM, src, 65536, 65536, IBV_SEND_SOLICITED,
		  htonl(0xabc1));
	sv_expect_wc(cq, 31, IBV_WC_SUCCESS, qp[0], &wc);
	say(5);

	sv_step("RNR, then a late receive");
	send_msg(qp[0], 40, 40, src, 0, 262144);
	say(6);
	sv_expect_wc(cq, 40, IBV_WC_SUCCESS, qp[0], &wc);

	sv_step("a receive too small");
	CHECK_EQ(hear(), 7);
	send_msg(qp[1], 50, 50, src, 0, 16384);
	sv_expect_wc(cq, 50, IBV_WC_REM_INV_REQ_ERR, qp[1], &wc);

	sv_step("a receive whose MR was deregistered");
	CHECK_EQ(hear(), 8);
	send_msg(qp[2], 60, 60, src, 0, 65536);
	CHECKF(sv_poll(cq, 1, &wc, SV_WAIT_MS) == 1, "no completion for the SEND into a deregistered MR");
	CHECK_EQ(wc.wr_id, 60);
	CHECKF(wc.status != IBV_WC_SUCCESS, "a SEND into a deregistered receive buffer succeeded");

	sv_step("teardown");
	say(9);
	sv_wait_peer(child, "the receiver");
	for (int i = 0; i < NQP; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	sv_free_mr(src);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
