/*
 * integrity: data integrity between two hosts (tests/hosts/README.md), a plain verbs program
 * like the conformance tests, run through `softverbs run`: the server on one host, the client
 * on the other, trading QPN, PSN, GID, rkeys and addresses over TCP, as a user's program does.
 *
 *   integrity [OPTIONS] server PORT            integrity [OPTIONS] client SERVER_IP PORT
 *   -t rc|uc|ud   transport (rc)            -g INDEX    our GID index (the veth's address)
 *   -n SENDS      SENDs, 0..16 KiB (2000)   -s SEED     every size, offset and byte (1)
 *   -w SECONDS    watchdog (50)             -i FILE     server: writes its QP and keys there
 *   -v            client: "vanish" mode: WRITEs until the QP fails; expects RETRY_EXC_ERR
 *   -T TIMEOUT -R RETRY_CNT   the QP's ack timeout exponent (14) and retry count (7)
 *
 * RC (client to server): SENDs of random sizes (multi-MTU at MTU 1024), every 3rd with
 * immediate data, each byte checked against the seeded pattern, in order; passes of RDMA
 * WRITEs covering a region, each followed by a SEND the server waits for before it checks the
 * region (a WRITE's data is visible once a later SEND has arrived); READs of random pieces
 * of a region the server filled; FETCH_ADD 1 many times (the results must be 0..n-1, each
 * exactly once, and the word n) and a chain of CMP_SWAP i -> i+1 (each must find i: a
 * duplicate executed twice would not). Every send completion must come in posting order.
 * UC and UD: SENDs with immediate data (their number), paced in batches over TCP; each one
 * that arrives must be intact; without faults all must arrive (-l allows losses). UC also
 * WRITEs a region and checks it, without faults only.
 * The server keeps a "canary" MR that no legitimate request touches (-i tells a garbage
 * sender its rkey and address, tests/hosts/garbage.py) and checks at the end that it is
 * unchanged. Prints counters and "PASS integrity" as the last line.
 */
#include "common.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#define MAX_SEND 16384
#define RECV_DEPTH 64
#define WINDOW 32
#define REGION (256 * 1024)
#define CANARY 65536
#define UD_GRH 40
#define BATCH 32

static struct {
	enum ibv_qp_type type;
	int gid_index, sends, lossy, vanish, timeout, retry;
	unsigned long long seed;
	const char *info_file;
	const char *hold_file; /* the client ends only once it exists (the garbage is all sent) */
} opt = {IBV_QPT_RC, 1, 2000, 0, 0, 14, 7, 1, NULL, NULL};

/* What each side tells the other over TCP. */
struct peer_info {
	uint32_t qpn, psn, qkey;
	uint8_t gid[16];
	uint64_t region_addr, read_addr, atom_addr, canary_addr;
	uint32_t region_rkey, read_rkey, atom_rkey, canary_rkey;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *scq, *rcq;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static struct ibv_mr *send_mr, *recv_mr, *region_mr, *read_mr, *atom_mr, *canary_mr,
	*result_mr;
static struct peer_info me, peer;
static int sock = -1;
static uint64_t next_send_id, next_send_done; /* posting order of signaled sends */

/* ---- seeded numbers and bytes --------------------------------------------------------- */

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}
/* The i-th number of stream `stream` under the seed. */
static uint64_t rnd(uint64_t stream, uint64_t i)
{
	return mix(opt.seed * 0x9e3779b97f4a7c15ull ^ mix(stream << 40 ^ i));
}
static uint8_t pattern(uint64_t stream, uint64_t offset)
{
	return (uint8_t)(rnd(stream, offset >> 3) >> (8 * (offset & 7)));
}
static void fill(uint8_t *p, uint64_t stream, uint64_t offset, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(stream, offset + i);
}
/* The first byte of p[0, len) that is not the pattern, or -1. */
static long mismatch(const uint8_t *p, uint64_t stream, uint64_t offset, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != pattern(stream, offset + i))
			return (long)i;
	return -1;
}
#define STREAM_SEND 1
#define STREAM_WRITE(pass) (100 + (pass))
#define STREAM_READ 2
#define STREAM_CANARY 3
static uint32_t send_size(int i) { return (uint32_t)(rnd(STREAM_SEND + 50, (uint64_t)i) % (MAX_SEND + 1)); }

/* ---- TCP --------------------------------------------------------------------------- */

static void tcp_all(int write_it, void *buf, size_t n)
{
	uint8_t *p = buf;
	while (n > 0) {
		ssize_t r = write_it ? write(sock, p, n) : read(sock, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		CHECKF(r > 0, "TCP %s: %s", write_it ? "write" : "read",
		       r == 0 ? "peer closed" : strerror(errno));
		p += r;
		n -= (size_t)r;
	}
}
static void say(uint32_t v) { tcp_all(1, &v, sizeof v); }
static uint32_t hear(void)
{
	uint32_t v;
	tcp_all(0, &v, sizeof v);
	return v;
}

static void tcp_open(const char *host, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int one = 1;
	if (!host) {
		int l = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(l >= 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0);
		CHECK(listen(l, 1) == 0);
		sock = accept(l, NULL, NULL);
		CHECK(sock >= 0);
		close(l);
	} else {
		CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1);
		sock = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(sock >= 0);
		CHECK(connect(sock, (struct sockaddr *)&a, sizeof a) == 0);
	}
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- verbs setup ------------------------------------------------------------------- */

static struct ibv_mr *mr_of(size_t len) { return sv_alloc_mr(pd, len, SV_ACCESS_ALL); }

static void setup(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECKF(list && list[0], "no RDMA device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	ibv_free_device_list(list);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	scq = ibv_create_cq(ctx, 4 * WINDOW, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 2 * RECV_DEPTH, NULL, NULL, 0);
	CHECK(scq && rcq);
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = opt.type, .sq_sig_all = 1,
		.cap = {.max_send_wr = 2 * WINDOW, .max_recv_wr = RECV_DEPTH,
			.max_send_sge = 1, .max_recv_sge = 1}};
	qp = ibv_create_qp(pd, &ia);
	CHECKF(qp != NULL, "ibv_create_qp: %s", strerror(errno));
	send_mr = mr_of((size_t)WINDOW * MAX_SEND);
	recv_mr = mr_of((size_t)RECV_DEPTH * (MAX_SEND + UD_GRH));
	region_mr = mr_of(REGION);
	read_mr = mr_of(REGION);
	atom_mr = mr_of(4096);
	canary_mr = mr_of(CANARY);
	result_mr = mr_of(8 * 4096);
	fill(read_mr->addr, STREAM_READ, 0, REGION);
	fill(canary_mr->addr, STREAM_CANARY, 0, CANARY);

	union ibv_gid gid;
	CHECK_OK(ibv_query_gid(ctx, 1, opt.gid_index, &gid));
	me.qpn = qp->qp_num;
	me.psn = (uint32_t)(rnd(7, getpid()) & 0xffffff);
	me.qkey = 0x11111111;
	memcpy(me.gid, gid.raw, 16);
	me.region_addr = (uintptr_t)region_mr->addr, me.region_rkey = region_mr->rkey;
	me.read_addr = (uintptr_t)read_mr->addr, me.read_rkey = read_mr->rkey;
	me.atom_addr = (uintptr_t)atom_mr->addr, me.atom_rkey = atom_mr->rkey;
	me.canary_addr = (uintptr_t)canary_mr->addr, me.canary_rkey = canary_mr->rkey;
}

static void post_recv(int slot)
{
	struct ibv_sge sge = {(uintptr_t)recv_mr->addr + (size_t)slot * (MAX_SEND + UD_GRH),
			      MAX_SEND + UD_GRH, recv_mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK_OK(ibv_post_recv(qp, &wr, &bad));
}

static void connect_qp(void)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = SV_ACCESS_ALL, .qkey = me.qkey};
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	mask |= opt.type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	CHECK_OK(ibv_modify_qp(qp, &a, mask));
	for (int i = 0; i < RECV_DEPTH; i++)
		post_recv(i);
	struct ibv_ah_attr ah_attr = {
		.is_global = 1, .port_num = 1,
		.grh = {.sgid_index = (uint8_t)opt.gid_index, .hop_limit = 64}};
	memcpy(ah_attr.grh.dgid.raw, peer.gid, 16);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	mask = IBV_QP_STATE;
	if (opt.type != IBV_QPT_UD) {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = peer.qpn;
		a.rq_psn = peer.psn;
		a.ah_attr = ah_attr;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (opt.type == IBV_QPT_RC) {
			a.max_dest_rd_atomic = 16;
			a.min_rnr_timer = 1;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	CHECK_OK(ibv_modify_qp(qp, &a, mask));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me.psn;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (opt.type == IBV_QPT_RC) {
		a.timeout = (uint8_t)opt.timeout;
		a.retry_cnt = (uint8_t)opt.retry;
		a.rnr_retry = 7;
		a.max_rd_atomic = 16;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	CHECK_OK(ibv_modify_qp(qp, &a, mask));
	if (opt.type == IBV_QPT_UD) {
		ah = ibv_create_ah(pd, &ah_attr);
		CHECK(ah != NULL);
	}
}

/* ---- send queue -------------------------------------------------------------------- */

/* Takes one send completion: it must be the oldest outstanding one, and succeed. */
static void reap_one(int timeout_ms)
{
	struct ibv_wc wc;
	long long until = sv_now_ms() + timeout_ms;
	int n;
	while ((n = ibv_poll_cq(scq, 1, &wc)) == 0)
		CHECKF(sv_now_ms() < until, "no send completion in %d ms (%llu outstanding)",
		       timeout_ms, (unsigned long long)(next_send_id - next_send_done));
	CHECK_EQ(n, 1);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECKF(wc.wr_id == next_send_done, "send completion out of order: wr_id %llu, expected %llu",
	       (unsigned long long)wc.wr_id, (unsigned long long)next_send_done);
	next_send_done++;
}
static void drain_sends(void)
{
	while (next_send_done < next_send_id)
		reap_one(20000);
}

/* Room in the window: the next WR's send slot is free once the WR WINDOW before it is done. */
static void make_room(void)
{
	while (next_send_id - next_send_done >= WINDOW)
		reap_one(20000);
}

/* Posts one WR (wr_id assigned here), first making room in the window. */
static void post(struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	make_room();
	wr->wr_id = next_send_id++;
	if (ah) {
		wr->wr.ud.ah = ah;
		wr->wr.ud.remote_qpn = peer.qpn;
		wr->wr.ud.remote_qkey = peer.qkey;
	}
	CHECK_OK(ibv_post_send(qp, wr, &bad));
}

/* Send slot for the message in flight; WINDOW slots never reused before their completion. */
static uint8_t *send_slot(uint64_t id) { return (uint8_t *)send_mr->addr + (id % WINDOW) * MAX_SEND; }

static void post_send_msg(int i, uint32_t len, int with_imm)
{
	make_room(); /* a retransmission reads the buffer again: never refill one in flight */
	uint8_t *buf = send_slot(next_send_id);
	fill(buf, STREAM_SEND, (uint64_t)i << 16, len);
	struct ibv_sge sge = {(uintptr_t)buf, len, send_mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
				 .opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
				 .imm_data = htonl((uint32_t)i)};
	post(&wr);
}

static void post_rdma(enum ibv_wr_opcode op, void *local, struct ibv_mr *lmr, uint32_t len,
		      uint64_t raddr, uint32_t rkey, uint32_t imm)
{
	struct ibv_sge sge = {(uintptr_t)local, len, lmr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = op,
				 .imm_data = htonl(imm)};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	post(&wr);
}

static void post_atomic(enum ibv_wr_opcode op, uint64_t *result, uint64_t raddr, uint64_t cmp_add,
			uint64_t swap)
{
	struct ibv_sge sge = {(uintptr_t)result, 8, result_mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = op};
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = peer.atom_rkey;
	wr.wr.atomic.compare_add = cmp_add;
	wr.wr.atomic.swap = swap;
	post(&wr);
}

/* ---- receive queue ------------------------------------------------------------------- */

/* Waits up to timeout_ms for one receive completion; 0 if none came. */
static int recv_one(struct ibv_wc *wc, int timeout_ms)
{
	long long until = sv_now_ms() + timeout_ms;
	int n;
	while ((n = ibv_poll_cq(rcq, 1, wc)) == 0)
		if (sv_now_ms() >= until)
			return 0;
	CHECK_EQ(n, 1);
	CHECK_STATUS(*wc, IBV_WC_SUCCESS);
	return 1;
}

/* Checks a received SEND of message i (its receive buffer slot in wc) and reposts. */
static uint32_t msg_size(int i);
static void check_message(const struct ibv_wc *wc, int i)
{
	uint32_t len = msg_size(i);
	const uint8_t *buf = (const uint8_t *)recv_mr->addr + wc->wr_id * (MAX_SEND + UD_GRH);
	if (opt.type == IBV_QPT_UD) {
		buf += UD_GRH;
		CHECKF(wc->byte_len == len + UD_GRH, "message %d: byte_len %u, expected %u + 40",
		       i, wc->byte_len, len);
	} else {
		CHECKF(wc->byte_len == len, "message %d: byte_len %u, expected %u", i,
		       wc->byte_len, len);
	}
	long bad = mismatch(buf, STREAM_SEND, (uint64_t)i << 16, len);
	CHECKF(bad < 0, "message %d (%u bytes): byte %ld differs", i, len, bad);
	post_recv((int)wc->wr_id);
}

/* ---- the phases -------------------------------------------------------------------- */

/* UD datagrams stay within one MTU (1024 here: the smallest the veth allows for softverbs). */
static uint32_t msg_size(int i) { return opt.type == IBV_QPT_UD ? send_size(i) % 1025 : send_size(i); }

static void client_sends(void)
{
	sv_step("%d SENDs of 0..%d bytes", opt.sends, opt.type == IBV_QPT_UD ? 1024 : MAX_SEND);
	for (int i = 0; i < opt.sends; i++) {
		post_send_msg(i, msg_size(i), opt.type != IBV_QPT_RC || i % 3 == 0);
		/* UC and UD have no flow control: a batch, then wait for the server to repost. */
		if (opt.type != IBV_QPT_RC && (i % BATCH == BATCH - 1 || i == opt.sends - 1)) {
			drain_sends();
			say((uint32_t)i);
			CHECK_EQ(hear(), (uint32_t)i);
		}
	}
	drain_sends();
}

static void server_sends(void)
{
	sv_step("receiving %d SENDs", opt.sends);
	struct ibv_wc wc;
	int got = 0, lost = 0;
	if (opt.type == IBV_QPT_RC) {
		for (int i = 0; i < opt.sends; i++) {
			CHECKF(recv_one(&wc, 20000), "message %d never came", i);
			CHECKF(!(i % 3 == 0) == !(wc.wc_flags & IBV_WC_WITH_IMM),
			       "message %d: immediate flag %d", i, !!(wc.wc_flags & IBV_WC_WITH_IMM));
			if (i % 3 == 0)
				CHECK_EQ(ntohl(wc.imm_data), (uint32_t)i);
			check_message(&wc, i);
			got++;
		}
	} else {
		/* In order and all of them; with -l (faults) any order, losses and duplicates
		 * allowed (UD has no duplicate detection), but each message intact. */
		unsigned char *seen = calloc((size_t)opt.sends, 1);
		CHECK(seen != NULL);
		int next = 0, dups = 0;
		while (next < opt.sends) {
			uint32_t last = hear(); /* the client's batch [next, last] is sent */
			CHECK(last < (uint32_t)opt.sends);
			int want = (int)last + 1 - next, have = 0;
			while (have < want && recv_one(&wc, opt.lossy ? 300 : 20000)) {
				CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
				int i = (int)ntohl(wc.imm_data);
				CHECKF(i >= 0 && i < opt.sends, "message number %d", i);
				CHECKF(opt.lossy || i == next + have, "message %d, expected %d", i, next + have);
				check_message(&wc, i);
				if (seen[i]++) {
					dups++;
					continue;
				}
				got++;
				have += i >= next && i <= (int)last;
			}
			CHECKF(opt.lossy || have == want, "batch up to %u: %d of %d messages came", last,
			       have, want);
			next = (int)last + 1;
			say(last);
		}
		lost = opt.sends - got;
		free(seen);
		printf("%d duplicates delivered\n", dups);
	}
	printf("received %d messages, %d lost\n", got, lost);
}

/* WRITE passes over the server's region in chunks of 1..32 KiB; then a SEND tells the
 * server to check (for UC too: its completions say only that the packets left). */
#define WRITE_PASSES 4
static void client_writes(void)
{
	uint8_t *src = read_mr->addr; /* our read region is free until the READ phase */
	for (int pass = 0; pass < WRITE_PASSES; pass++) {
		sv_step("WRITE pass %d", pass);
		drain_sends(); /* the last pass's WRITEs may still be retransmitted from here */
		fill(src, STREAM_WRITE(pass), 0, REGION);
		int chunk = 0;
		for (uint32_t off = 0; off < REGION; chunk++) {
			uint32_t len = 1 + (uint32_t)(rnd(STREAM_WRITE(pass) + 50, (uint64_t)chunk) % 32768);
			if (len > REGION - off)
				len = REGION - off;
			post_rdma(IBV_WR_RDMA_WRITE, src + off, read_mr, len, peer.region_addr + off,
				  peer.region_rkey, 0);
			off += len;
		}
		/* After the WRITEs, in order. UC too: its send completions say only that the
		 * packets left, and a TCP word could overtake them. */
		post_send_msg(pass, 0, 1);
		CHECK_EQ(hear(), (uint32_t)pass); /* checked */
	}
	drain_sends();
	memset(read_mr->addr, 0, REGION);
}

static void server_writes(void)
{
	for (int pass = 0; pass < WRITE_PASSES; pass++) {
		sv_step("checking WRITE pass %d", pass);
		struct ibv_wc wc;
		CHECKF(recv_one(&wc, 20000), "the SEND after WRITE pass %d never came", pass);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		CHECK_EQ(ntohl(wc.imm_data), (uint32_t)pass);
		CHECK_EQ(wc.byte_len, 0);
		post_recv((int)wc.wr_id);
		long bad = mismatch(region_mr->addr, STREAM_WRITE(pass), 0, REGION);
		CHECKF(bad < 0, "WRITE pass %d: region byte %ld differs", pass, bad);
		say((uint32_t)pass);
	}
}

/* READs of random pieces of the server's filled region into the same offsets of ours. Each
 * is checked (and cleared) once complete; two READs in flight never share bytes. */
static uint32_t read_off[WINDOW], read_len[WINDOW];
static uint64_t reads_checked;
static void check_reads(void)
{
	uint8_t *dst = read_mr->addr;
	for (; reads_checked < next_send_done; reads_checked++) {
		uint32_t off = read_off[reads_checked % WINDOW], len = read_len[reads_checked % WINDOW];
		long bad = mismatch(dst + off, STREAM_READ, off, len);
		CHECKF(bad < 0, "READ of %u bytes at %u: byte %ld differs", len, off, bad);
		memset(dst + off, 0, len);
	}
}

static void client_reads(int count)
{
	sv_step("%d READs of 1..32768 bytes", count);
	drain_sends();
	reads_checked = next_send_id;
	for (int i = 0; i < count; i++) {
		uint32_t len = 1 + (uint32_t)(rnd(STREAM_READ + 50, (uint64_t)i) % 32768);
		uint32_t off = (uint32_t)(rnd(STREAM_READ + 60, (uint64_t)i) % (REGION - len + 1));
		for (uint64_t j = next_send_done; j < next_send_id; j++)
			if (off < read_off[j % WINDOW] + read_len[j % WINDOW] && read_off[j % WINDOW] < off + len) {
				drain_sends();
				break;
			}
		make_room();
		check_reads(); /* frees the slot the next READ takes */
		read_off[next_send_id % WINDOW] = off;
		read_len[next_send_id % WINDOW] = len;
		post_rdma(IBV_WR_RDMA_READ, read_mr->addr + off, read_mr, len, peer.read_addr + off,
			  peer.read_rkey, 0);
	}
	drain_sends();
	check_reads();
}

static void client_atomics(int adds, int swaps)
{
	uint64_t *res = result_mr->addr;
	sv_step("%d FETCH_ADDs and %d CMP_SWAPs", adds, swaps);
	memset(res, 0xee, (size_t)8 * 4096);
	for (int i = 0; i < adds; i++)
		post_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, &res[i], peer.atom_addr, 1, 0);
	drain_sends();
	/* Each of 0..adds-1 exactly once; RC executes them in order, so res[i] == i too. */
	static unsigned char seen[4096];
	memset(seen, 0, sizeof seen);
	for (int i = 0; i < adds; i++) {
		CHECKF(res[i] < (uint64_t)adds, "FETCH_ADD %d returned %llu", i,
		       (unsigned long long)res[i]);
		CHECKF(!seen[res[i]]++, "FETCH_ADD value %llu returned twice",
		       (unsigned long long)res[i]);
		CHECKF(res[i] == (uint64_t)i, "FETCH_ADD %d returned %llu: executed out of order", i,
		       (unsigned long long)res[i]);
	}
	if (adds + swaps > 3990)
		swaps = 3990 - adds;
	for (int i = 0; i < swaps; i++)
		post_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, &res[adds + i], peer.atom_addr + 8,
			    (uint64_t)i, (uint64_t)i + 1);
	drain_sends();
	for (int i = 0; i < swaps; i++)
		CHECKF(res[adds + i] == (uint64_t)i, "CMP_SWAP %d -> %d found %llu", i, i + 1,
		       (unsigned long long)res[adds + i]);
	/* And the words themselves, read back. */
	post_rdma(IBV_WR_RDMA_READ, &res[4000], result_mr, 16, peer.atom_addr, peer.atom_rkey, 0);
	drain_sends();
	CHECK_EQ(res[4000], adds);
	CHECK_EQ(res[4001], swaps);
}

/* Vanish mode: 4 KiB WRITEs until the QP fails. The first failure must be RETRY_EXC_ERR,
 * not much sooner than (retry_cnt + 1) ack timeouts after the last success, and it must come. */
static void client_vanish(void)
{
	double budget_ms = (opt.retry + 1) * 4.096e-3 * (double)(1ull << opt.timeout);
	sv_step("WRITEs until the peer vanishes (retry budget %.0f ms)", budget_ms);
	long long last_ok = sv_now_ms(), deadline = 0;
	long ok = 0;
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(scq, 1, &wc);
		CHECK(n >= 0);
		if (n == 0) {
			if (next_send_id - next_send_done < 8) {
				struct ibv_sge sge = {(uintptr_t)send_mr->addr, 4096, send_mr->lkey};
				struct ibv_send_wr wr = {.wr_id = next_send_id++, .sg_list = &sge,
							 .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE},
						   *bad;
				wr.wr.rdma.remote_addr = peer.region_addr;
				wr.wr.rdma.rkey = peer.region_rkey;
				CHECK_OK(ibv_post_send(qp, &wr, &bad));
			}
			CHECKF(!deadline || sv_now_ms() < deadline, "no error %.0f ms after the last success",
			       budget_ms * 4 + 5000);
			continue;
		}
		next_send_done++;
		if (wc.status == IBV_WC_SUCCESS) {
			last_ok = sv_now_ms();
			if (++ok == 200)
				printf("traffic flowing\n");
			continue;
		}
		long long waited = sv_now_ms() - last_ok;
		printf("first error %s after %ld successful WRITEs, %lld ms after the last success "
		       "(budget (retry_cnt %d + 1) x 4.096 us x 2^%d = %.0f ms)\n",
		       sv_wc_status_name(wc.status), ok, waited, opt.retry, opt.timeout, budget_ms);
		CHECK_STATUS(wc, IBV_WC_RETRY_EXC_ERR);
		CHECKF(ok >= 200, "failed before traffic was flowing");
		CHECKF(waited >= 0.75 * budget_ms, "RETRY_EXC_ERR after %lld ms: sooner than the budget",
		       waited);
		CHECKF(waited <= budget_ms * 4 + 5000, "RETRY_EXC_ERR only after %lld ms", waited);
		/* The rest flush. */
		while (next_send_done < next_send_id) {
			long long until = sv_now_ms() + 5000;
			while ((n = ibv_poll_cq(scq, 1, &wc)) == 0)
				CHECKF(sv_now_ms() < until, "outstanding WRITEs never flushed");
			CHECK_STATUS(wc, IBV_WC_WR_FLUSH_ERR);
			next_send_done++;
		}
		return;
	}
}

/* ---- main -------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: integrity [-t rc|uc|ud] [-g GID_INDEX] [-n SENDS] [-s SEED] [-w SECONDS]\n"
			"       [-i INFO_FILE] [-H HOLD_FILE] [-l] [-v] [-T TIMEOUT] [-R RETRY_CNT]\n"
			"       server PORT | client IP PORT\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int c, watchdog = 50;
	while ((c = getopt(argc, argv, "t:g:n:s:w:i:H:lvT:R:")) != -1) {
		switch (c) {
		case 't':
			opt.type = !strcmp(optarg, "ud")   ? IBV_QPT_UD
				   : !strcmp(optarg, "uc") ? IBV_QPT_UC
							   : IBV_QPT_RC;
			break;
		case 'g': opt.gid_index = atoi(optarg); break;
		case 'n': opt.sends = atoi(optarg); break;
		case 's': opt.seed = strtoull(optarg, NULL, 0); break;
		case 'w': watchdog = atoi(optarg); break;
		case 'i': opt.info_file = optarg; break;
		case 'H': opt.hold_file = optarg; break;
		case 'l': opt.lossy = 1; break;
		case 'v': opt.vanish = 1; break;
		case 'T': opt.timeout = atoi(optarg); break;
		case 'R': opt.retry = atoi(optarg); break;
		default: usage();
		}
	}
	argc -= optind, argv += optind;
	int server = argc == 2 && !strcmp(argv[0], "server");
	if (!server && !(argc == 3 && !strcmp(argv[0], "client")))
		usage();
	sv_init("integrity");
	sv_watchdog((unsigned)watchdog);
	sv_step("%s, %s, seed %llu", server ? "server" : "client",
		opt.type == IBV_QPT_UD ? "UD" : opt.type == IBV_QPT_UC ? "UC" : "RC", opt.seed);
	setup();
	tcp_open(server ? NULL : argv[1], atoi(argv[server ? 1 : 2]));
	if (server) {
		tcp_all(1, &me, sizeof me);
		tcp_all(0, &peer, sizeof peer);
	} else {
		tcp_all(0, &peer, sizeof peer);
		tcp_all(1, &me, sizeof me);
	}
	connect_qp();
	printf("local QPN 0x%06x PSN 0x%06x, remote QPN 0x%06x PSN 0x%06x\n", me.qpn, me.psn,
	       peer.qpn, peer.psn);
	if (server && opt.info_file) {
		/* For a garbage sender (garbage.py): the QP, the PSN it expects first, keys. */
		FILE *f = fopen(opt.info_file, "w");
		CHECK(f != NULL);
		fprintf(f, "qpn=%u psn=%u canary_rkey=%u canary_addr=%llu region_rkey=%u region_addr=%llu "
			   "client_qpn=%u client_psn=%u\n",
			me.qpn, peer.psn, me.canary_rkey, (unsigned long long)me.canary_addr,
			me.region_rkey, (unsigned long long)me.region_addr, peer.qpn, me.psn);
		CHECK(fclose(f) == 0);
	}
	/* Both sides are at RTS before the first packet goes. */
	say(0);
	CHECK_EQ(hear(), 0);

	if (opt.vanish) {
		if (server) {
			sv_step("waiting for the client (or to be killed)");
			uint32_t v;
			(void)!read(sock, &v, sizeof v);
		} else {
			client_vanish();
		}
		printf("PASS integrity\n");
		return 0;
	}
	if (server) {
		server_sends();
		if (opt.type != IBV_QPT_UD && !opt.lossy)
			server_writes();
		sv_step("waiting for the client's end");
		CHECK_EQ(hear(), 0xd0e);
		if (opt.type == IBV_QPT_RC) {
			uint64_t *w = atom_mr->addr;
			printf("atomic words: %llu %llu\n", (unsigned long long)w[0],
			       (unsigned long long)w[1]);
		}
		long bad = mismatch(canary_mr->addr, STREAM_CANARY, 0, CANARY);
		CHECKF(bad < 0, "the canary MR changed at byte %ld: a request that must not execute did",
		       bad);
	} else {
		long long t0 = sv_now_ms();
		client_sends();
		if (opt.type != IBV_QPT_UD && !opt.lossy)
			client_writes();
		if (opt.type == IBV_QPT_RC) {
			client_reads(opt.sends / 4);
			client_atomics(opt.sends / 2 < 4000 ? opt.sends / 2 : 4000, opt.sends / 4);
		}
		printf("%llu work requests completed in order in %lld ms\n",
		       (unsigned long long)next_send_done, sv_now_ms() - t0);
		if (opt.hold_file) {
			/* A loaded machine may run the traffic faster than the garbage: the QP stays
			 * up (the watchdog bounds the wait) until all of it has come. */
			sv_step("waiting for %s", opt.hold_file);
			while (access(opt.hold_file, F_OK) != 0)
				usleep(10000);
		}
		say(0xd0e);
	}
	printf("PASS integrity\n");
	return 0;
}
