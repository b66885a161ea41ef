/*
 * Raw packet QPs (IBV_QPT_RAW_PACKET) and their steering rules (ibv_create_flow(3)), on the
 * port's interface (SOFTVERBS_RAW_NETDEV=lo here, set by ctest):
 *  - creating one needs CAP_NET_RAW (EPERM without it, as the kernel); its states take
 *    IBV_QP_PORT into INIT and nothing else; it posts SEND only;
 *  - a frame reaches a raw QP only through a rule that matches it (ETH, IPv4, IPv6, TCP,
 *    UDP specs, value under mask), whole and byte for byte, byte_len the frame's length;
 *  - priorities, DONT_TRAP, DROP, SNIFFER and MC_DEFAULT rules steer as ibv_create_flow(3)
 *    says; a QP with a rule cannot be destroyed (EBUSY);
 *  - frames go between processes of the host (a forked sender);
 *  - a rule's IBV_FLOW_SPEC_ACTION_TAG reads back with ibv_wc_read_flow_tag;
 *  - RSS: an RSS QP (indirection table of WQs) puts each frame in the WQ its Toeplitz hash
 *    picks, completing on that WQ's CQ with the WQ's number; a WQ in ERR flushes its
 *    receives; WQs in a table, tables of an RSS QP and QPs with rules are EBUSY;
 *  - (SV_RAW_ONE_PROCESS=1: the parts that fork are left out, for TSan's stage);
 *  - bad arguments: a rule on an RC QP (EINVAL), on a UD QP (EOPNOTSUPP), for port 2
 *    (EINVAL), with an unknown spec (EINVAL) or a tunnel spec (EOPNOTSUPP); a frame shorter
 *    than an Ethernet header or larger than the interface takes: IBV_WC_LOC_LEN_ERR;
 *  - an 802.1Q-tagged frame arrives with its tag (the kernel strips it; it is put back).
 */
#include "common.h"
#include "raw_helpers.h"

#include <arpa/inet.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define NAME "raw_packet"
#define FRAME 128
#define SLOTS 16

/* The test's own MACs, made from its pid in main: other programs (ctest runs the raw tests
 * and pyverbs' side by side, all on lo) send other frames there, which the rules here do
 * not match, and which the catch-all rules' checks skip (next_own). */
static uint8_t kGroupMac[6] = {0x01, 0x00, 0x5e, 0, 0, 0};
static uint8_t kSrcMac[6] = {0x02, 0x00, 0, 0, 0, 0};
static uint32_t g_src_ip = 0x01010101; /* the frames' IPv4 source (RSS varies it) */

struct rawq {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_mr *mr; /* SLOTS frames of FRAME bytes */
	int posted;
};

static void rawq_open(struct sv_dev *d, struct rawq *q)
{
	q->cq = sv_create_cq(d, 2 * SLOTS, NULL, NULL);
	q->qp = create_raw(d, q->cq, SLOTS);
	CHECK(q->qp != NULL);
	CHECK_OK(modify_raw(q->qp));
	q->mr = sv_alloc_mr(d->pd, (size_t)SLOTS * FRAME, IBV_ACCESS_LOCAL_WRITE);
	for (q->posted = 0; q->posted < SLOTS / 2; ++q->posted)
		CHECK_OK(sv_post_recv(q->qp, 100 + q->posted, q->mr, (size_t)q->posted * FRAME, FRAME));
}

static void rawq_close(struct rawq *q)
{
	CHECK_OK(ibv_destroy_qp(q->qp));
	CHECK_OK(ibv_destroy_cq(q->cq));
	sv_free_mr(q->mr);
}

/* An Ethernet + IPv4 + UDP frame of FRAME bytes to the group MAC, UDP port `dport`. */
static void build_frame(uint8_t *f, uint16_t dport, uint8_t tag)
{
	memset(f, 0, FRAME);
	memcpy(f, kGroupMac, 6);
	memcpy(f + 6, kSrcMac, 6);
	f[12] = 0x08;
	f[13] = 0x00;
	uint8_t *ip = f + 14;
	ip[0] = 0x45;
	uint16_t tot = htons(FRAME - 14);
	memcpy(ip + 2, &tot, 2);
	ip[6] = 0x40; /* DF */
	ip[8] = 64;
	ip[9] = 17;
	uint32_t src = htonl(g_src_ip), dst = htonl(0x02020202);
	memcpy(ip + 12, &src, 4);
	memcpy(ip + 16, &dst, 4);
	uint8_t *udp = ip + 20;
	uint16_t sp = htons(1234), dp = htons(dport), ul = htons(FRAME - 34);
	memcpy(udp, &sp, 2);
	memcpy(udp + 2, &dp, 2);
	memcpy(udp + 4, &ul, 2);
	for (int i = 42; i < FRAME; ++i)
		f[i] = (uint8_t)(tag + i);
}

/* One frame from `from` (its slot SLOTS-1), checked to complete. */
static void send_frame(struct rawq *from, uint16_t dport, uint8_t tag, uint32_t len)
{
	uint8_t *f = sv_ptr(from->mr, (size_t)(SLOTS - 1) * FRAME);
	struct ibv_wc wc;
	build_frame(f, dport, tag);
	CHECK_OK(sv_post_send(from->qp, 7, from->mr, (size_t)(SLOTS - 1) * FRAME, len, 0));
	sv_expect_wc(from->cq, 7, IBV_WC_SUCCESS, from->qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
}

/* The next receive of q that holds a frame of this test (from kSrcMac), within timeout_ms:
 * 1, or 0. Other programs' frames (a catch-all rule takes them) are skipped, their slots
 * posted again; one too large for a slot completes with an error and is skipped too. */
static int next_own(struct rawq *q, struct ibv_wc *wc, int timeout_ms)
{
	for (;;) {
		if (sv_poll(q->cq, 1, wc, timeout_ms) == 0)
			return 0;
		CHECK(wc->wr_id >= 100 && wc->wr_id < 100 + SLOTS);
		const uint8_t *f = sv_ptr(q->mr, (size_t)(wc->wr_id - 100) * FRAME);
		if (wc->status == IBV_WC_SUCCESS && wc->byte_len >= 12 && memcmp(f + 6, kSrcMac, 6) == 0)
			return 1;
		CHECK_OK(sv_post_recv(q->qp, wc->wr_id, q->mr, (size_t)(wc->wr_id - 100) * FRAME, FRAME));
	}
}

/* Expects the frame with `dport` and `tag` in q's next receive, whole. */
static void expect_frame(struct rawq *q, uint16_t dport, uint8_t tag)
{
	uint8_t want[FRAME];
	struct ibv_wc wc;
	CHECKF(next_own(q, &wc, SV_WAIT_MS), "no frame within %d ms", SV_WAIT_MS);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.qp_num, q->qp->qp_num);
	CHECK_EQ(wc.byte_len, FRAME);
	CHECK(wc.wr_id >= 100 && wc.wr_id < 100 + SLOTS);
	build_frame(want, dport, tag);
	CHECKF(memcmp(sv_ptr(q->mr, (size_t)(wc.wr_id - 100) * FRAME), want, FRAME) == 0,
	       "frame received differs from the one sent");
	/* Give the slot back for the next frame. */
	CHECK_OK(sv_post_recv(q->qp, wc.wr_id, q->mr, (size_t)(wc.wr_id - 100) * FRAME, FRAME));
}

static void expect_nothing_cq(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	CHECKF(sv_poll(cq, 1, &wc, 0) == 0, "a completion on the other CQ (wr_id %llu)",
	       (unsigned long long)wc.wr_id);
}

static void expect_nothing(struct rawq *q, const char *what)
{
	struct ibv_wc wc;
	CHECKF(!next_own(q, &wc, SV_QUIET_MS), "%s: a frame arrived (wr_id %llu)", what,
	       (unsigned long long)wc.wr_id);
}

/* A rule of up to three specs: ETH (to the group MAC), IPv4 (src/dst), UDP (dst port). */
struct rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
	struct ibv_flow_spec_ipv4 ipv4;
	struct ibv_flow_spec_tcp_udp udp;
};

static struct ibv_flow *add_rule(struct ibv_qp *qp, enum ibv_flow_attr_type type, uint16_t prio,
				 uint32_t flags, int udp_port, int with_drop)
{
	uint8_t buf[sizeof(struct rule) + sizeof(struct ibv_flow_spec_action_drop)];
	struct rule *r = (struct rule *)buf;
	memset(buf, 0, sizeof(buf));
	r->attr.type = type;
	r->attr.priority = prio;
	r->attr.flags = flags;
	r->attr.port = 1;
	r->attr.size = sizeof(r->attr);
	if (type == IBV_FLOW_ATTR_NORMAL) {
		r->eth.type = IBV_FLOW_SPEC_ETH;
		r->eth.size = sizeof(r->eth);
		memcpy(r->eth.val.dst_mac, kGroupMac, 6);
		memset(r->eth.mask.dst_mac, 0xff, 6);
		r->eth.val.ether_type = htons(0x0800);
		r->eth.mask.ether_type = 0xffff;
		r->ipv4.type = IBV_FLOW_SPEC_IPV4;
		r->ipv4.size = sizeof(r->ipv4);
		r->ipv4.val.dst_ip = htonl(0x02020202);
		r->ipv4.mask.dst_ip = 0xffffffff;
		r->udp.type = IBV_FLOW_SPEC_UDP;
		r->udp.size = sizeof(r->udp);
		r->udp.val.dst_port = htons((uint16_t)udp_port);
		r->udp.mask.dst_port = 0xffff;
		r->attr.num_of_specs = 3;
		r->attr.size = sizeof(struct rule);
		if (with_drop) {
			struct ibv_flow_spec_action_drop *d =
				(struct ibv_flow_spec_action_drop *)(buf + sizeof(struct rule));
			d->type = IBV_FLOW_SPEC_ACTION_DROP;
			d->size = sizeof(*d);
			r->attr.num_of_specs = 4;
			r->attr.size = sizeof(buf);
		}
	}
	return ibv_create_flow(qp, &r->attr);
}

/* The Toeplitz hash of RSS, written here from its definition (checked below against the
 * first vector of Microsoft's RSS verification suite). */
static uint32_t toeplitz(const uint8_t *key, size_t klen, const uint8_t *in, size_t n)
{
	uint32_t window = 0, result = 0;
	for (int i = 0; i < 4; ++i)
		window = (window << 8) | key[i];
	for (size_t i = 0; i < n * 8; ++i) {
		if (in[i / 8] & (0x80 >> (i % 8)))
			result ^= window;
		size_t next = i + 32; /* the key bit that slides in */
		window = (window << 1) | (next / 8 < klen ? (key[next / 8] >> (7 - next % 8)) & 1 : 0);
	}
	return result;
}

static const uint8_t kRssKey[40] = {0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67,
				    0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb,
				    0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
				    0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};

#define NWQ 4

/* Frames from `a` with 16 source addresses, spread over NWQ WQs (two CQs) by an RSS QP
 * hashing the IPv4 source and destination. */
static void check_rss(struct sv_dev *d, struct rawq *a)
{
	const uint8_t v_in[8] = {66, 9, 149, 187, 161, 142, 100, 80};
	CHECK_EQ(toeplitz(kRssKey, sizeof(kRssKey), v_in, 8), 0x323e8fc2);

	struct ibv_cq *cqs[2] = {sv_create_cq(d, 64, NULL, NULL), sv_create_cq(d, 64, NULL, NULL)};
	struct ibv_wq *wqs[NWQ];
	struct ibv_mr *mr = sv_alloc_mr(d->pd, (size_t)NWQ * SLOTS * FRAME, IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < NWQ; ++i) {
		struct ibv_wq_init_attr wa;
		memset(&wa, 0, sizeof(wa));
		wa.wq_type = IBV_WQT_RQ;
		wa.max_wr = SLOTS;
		wa.max_sge = 1;
		wa.pd = d->pd;
		wa.cq = cqs[i % 2];
		wqs[i] = ibv_create_wq(d->ctx, &wa);
		CHECK(wqs[i] != NULL);
		CHECK(wa.max_wr >= SLOTS);
		CHECK_EQ(wqs[i]->state, IBV_WQS_RESET);
		struct ibv_wq_attr m;
		memset(&m, 0, sizeof(m));
		m.attr_mask = IBV_WQ_ATTR_STATE;
		m.wq_state = IBV_WQS_RDY;
		CHECK_OK(ibv_modify_wq(wqs[i], &m));
		for (int k = 0; k < SLOTS; ++k) {
			struct ibv_sge sge = {sv_addr(mr, (size_t)(i * SLOTS + k) * FRAME), FRAME, mr->lkey};
			struct ibv_recv_wr wr = {.wr_id = (uint64_t)(i * SLOTS + k), .sg_list = &sge, .num_sge = 1};
			struct ibv_recv_wr *bad;
			CHECK_OK(ibv_post_wq_recv(wqs[i], &wr, &bad));
		}
	}
	struct ibv_rwq_ind_table_init_attr ta = {.log_ind_tbl_size = 2, .ind_tbl = wqs};
	struct ibv_rwq_ind_table *table = ibv_create_rwq_ind_table(d->ctx, &ta);
	CHECK(table != NULL);
	CHECK_ERR(ibv_destroy_wq(wqs[0]), EBUSY);

	struct ibv_qp_init_attr_ex qa;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RAW_PACKET;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE;
	qa.pd = d->pd;
	qa.rwq_ind_tbl = table;
	qa.rx_hash_conf.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
	qa.rx_hash_conf.rx_hash_key_len = sizeof(kRssKey);
	qa.rx_hash_conf.rx_hash_key = (uint8_t *)kRssKey;
	qa.rx_hash_conf.rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4;
	struct ibv_qp *rss = ibv_create_qp_ex(d->ctx, &qa);
	CHECK(rss != NULL);
	CHECK_ERR(ibv_destroy_rwq_ind_table(table), EBUSY);
	{
		struct ibv_qp_attr m;
		memset(&m, 0, sizeof(m));
		m.qp_state = IBV_QPS_INIT;
		m.port_num = 1;
		/* mlx5's answer for an RSS QP, which has no states (its WQs have). */
		CHECK_ERR(ibv_modify_qp(rss, &m, IBV_QP_STATE | IBV_QP_PORT), ENOSYS);
	}
	struct ibv_flow *f = add_rule(rss, IBV_FLOW_ATTR_NORMAL, 0, 0, 5678, 0);
	CHECK(f != NULL);

	int consumed[NWQ] = {0};
	for (int n = 0; n < 16; ++n) {
		g_src_ip = 0x0a000001u + (uint32_t)n * 0x01010101u;
		uint8_t in[8];
		uint32_t src = htonl(g_src_ip), dst = htonl(0x02020202);
		memcpy(in, &src, 4);
		memcpy(in + 4, &dst, 4);
		int want = (int)(toeplitz(kRssKey, sizeof(kRssKey), in, 8) & (NWQ - 1));
		send_frame(a, 5678, (uint8_t)n, FRAME);
		struct ibv_wc wc;
		sv_poll_one(cqs[want % 2], &wc);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECKF(wc.qp_num == wqs[want]->wq_num, "frame %d: on WQ %u, the hash picks WQ %u", n,
		       wc.qp_num, wqs[want]->wq_num);
		CHECK((int)(wc.wr_id / SLOTS) == want);
		++consumed[want];
		CHECK_EQ(wc.byte_len, FRAME);
		uint8_t expect[FRAME];
		build_frame(expect, 5678, (uint8_t)n);
		CHECK(memcmp(sv_ptr(mr, (size_t)wc.wr_id * FRAME), expect, FRAME) == 0);
		expect_nothing_cq(cqs[(want + 1) % 2]);
	}
	g_src_ip = 0x01010101;

	sv_step("RSS: a WQ in ERR flushes its receives");
	{
		struct ibv_wq_attr m;
		memset(&m, 0, sizeof(m));
		m.attr_mask = IBV_WQ_ATTR_STATE;
		m.wq_state = IBV_WQS_ERR;
		CHECK_OK(ibv_modify_wq(wqs[1], &m));
		struct ibv_wc wc[SLOTS];
		const int left = SLOTS - consumed[1];
		int got = sv_poll(cqs[1], left, wc, SV_WAIT_MS);
		CHECK_EQ(got, left); /* every receive still posted, once */
		for (int k = 0; k < got; ++k) {
			CHECK_STATUS(wc[k], IBV_WC_WR_FLUSH_ERR);
			CHECK_EQ(wc[k].qp_num, wqs[1]->wq_num);
			CHECK_EQ(wc[k].wr_id / SLOTS, 1);
		}
		expect_nothing_cq(cqs[1]);
		/* A receive posted in ERR completes at once, flushed. */
		struct ibv_sge sge = {sv_addr(mr, SLOTS * FRAME), FRAME, mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 4242, .sg_list = &sge, .num_sge = 1}, *bad;
		CHECK_OK(ibv_post_wq_recv(wqs[1], &wr, &bad));
		CHECK_EQ(sv_poll(cqs[1], 1, wc, SV_WAIT_MS), 1);
		CHECK_STATUS(wc[0], IBV_WC_WR_FLUSH_ERR);
		CHECK_EQ(wc[0].wr_id, 4242);
		/* To RESET: what was not polled goes with the receives. */
		CHECK_OK(ibv_post_wq_recv(wqs[1], &wr, &bad));
		m.wq_state = IBV_WQS_RESET;
		CHECK_OK(ibv_modify_wq(wqs[1], &m));
		expect_nothing_cq(cqs[1]);
		m.attr_mask = 0;
		CHECK_ERR(ibv_modify_wq(wqs[1], &m), EINVAL);
	}

	CHECK_ERR(ibv_destroy_qp(rss), EBUSY);
	CHECK_OK(ibv_destroy_flow(f));
	CHECK_OK(ibv_destroy_qp(rss));
	CHECK_OK(ibv_destroy_rwq_ind_table(table));
	for (int i = 0; i < NWQ; ++i)
		CHECK_OK(ibv_destroy_wq(wqs[i]));
	CHECK_OK(ibv_destroy_cq(cqs[0]));
	CHECK_OK(ibv_destroy_cq(cqs[1]));
	sv_free_mr(mr);
}

/* Flow tags: a receive steered by a tagged rule reads its tag on an extended CQ
 * (ibv_wc_read_flow_tag), one steered by an untagged rule 0; a tag past 24 bits: EINVAL. */
static void check_flow_tags(struct sv_dev *d, struct rawq *a)
{
	struct ibv_cq_init_attr_ex ca;
	memset(&ca, 0, sizeof(ca));
	ca.cqe = 2 * SLOTS;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_FLOW_TAG;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(d->ctx, &ca);
	CHECK(cqx != NULL);
	struct rawq t;
	t.cq = ibv_cq_ex_to_cq(cqx);
	t.qp = create_raw(d, t.cq, SLOTS);
	CHECK(t.qp != NULL);
	CHECK_OK(modify_raw(t.qp));
	t.mr = sv_alloc_mr(d->pd, (size_t)SLOTS * FRAME, IBV_ACCESS_LOCAL_WRITE);
	for (t.posted = 0; t.posted < SLOTS / 2; ++t.posted)
		CHECK_OK(sv_post_recv(t.qp, 100 + t.posted, t.mr, (size_t)t.posted * FRAME, FRAME));
	errno = 0;
	CHECK(mac_port_rule(t.qp, kGroupMac, 6000, 0x1000000) == NULL && errno == EINVAL);
	struct ibv_flow *tagged = mac_port_rule(t.qp, kGroupMac, 6000, 0xabcdef);
	struct ibv_flow *plain = mac_port_rule(t.qp, kGroupMac, 6001, 0);
	CHECK(tagged != NULL && plain != NULL);
	const uint16_t ports[2] = {6000, 6001};
	const uint32_t tags[2] = {0xabcdef, 0};
	for (int i = 0; i < 2; ++i) {
		send_frame(a, ports[i], (uint8_t)(0x60 + i), FRAME);
		struct ibv_poll_cq_attr pa = {0};
		int got = 0;
		for (int tries = 0; tries < 5000 && !got; ++tries) {
			int rc = ibv_start_poll(cqx, &pa);
			if (rc == ENOENT) {
				usleep(1000);
				continue;
			}
			CHECK_OK(rc);
			got = 1;
			CHECK_STATUS(*cqx, IBV_WC_SUCCESS);
			CHECK_EQ(ibv_wc_read_byte_len(cqx), FRAME);
			CHECKF(ibv_wc_read_flow_tag(cqx) == tags[i], "flow tag 0x%x, 0x%x expected",
			       ibv_wc_read_flow_tag(cqx), tags[i]);
			ibv_end_poll(cqx);
		}
		CHECKF(got, "no frame on port %u", ports[i]);
	}
	CHECK_OK(ibv_destroy_flow(tagged));
	CHECK_OK(ibv_destroy_flow(plain));
	CHECK_OK(ibv_destroy_qp(t.qp));
	CHECK_OK(ibv_destroy_cq(t.cq));
	sv_free_mr(t.mr);
}

/* Without CAP_NET_RAW (dropped in a child), creating a raw packet QP is EPERM. */
static void check_needs_cap_net_raw(void)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
		struct __user_cap_data_struct c[2];
		struct sv_dev d;
		if (syscall(SYS_capget, &h, c) != 0)
			_exit(10);
		c[CAP_NET_RAW / 32].effective &= ~(1u << (CAP_NET_RAW % 32));
		if (syscall(SYS_capset, &h, c) != 0)
			_exit(11);
		sv_open(&d);
		struct ibv_cq *cq = sv_create_cq(&d, 4, NULL, NULL);
		errno = 0;
		struct ibv_qp *qp = create_raw(&d, cq, SLOTS);
		_exit(qp == NULL && errno == EPERM ? 0 : 12);
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	       "without CAP_NET_RAW: child exit %d (12: not EPERM)", WEXITSTATUS(status));
}

/* A forked process of this host sends three frames to port 5678; we wait for them. */
static void check_between_processes(struct sv_dev *d, struct rawq *b)
{
	int go[2];
	CHECK(pipe(go) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct sv_dev cd;
		struct rawq s;
		char c;
		close(go[1]);
		if (read(go[0], &c, 1) != 1)
			_exit(20);
		sv_open(&cd);
		rawq_open(&cd, &s);
		for (int i = 0; i < 3; ++i)
			send_frame(&s, 5678, (uint8_t)(0x40 + i), FRAME);
		rawq_close(&s);
		sv_close(&cd);
		_exit(0);
	}
	close(go[0]);
	CHECK(write(go[1], "g", 1) == 1);
	close(go[1]);
	for (int i = 0; i < 3; ++i)
		expect_frame(b, 5678, (uint8_t)(0x40 + i));
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "sender process exit %d",
	       WEXITSTATUS(status));
	(void)d;
}

int main(void)
{
	struct sv_dev d;
	struct rawq a, b, c;
	sv_init(NAME);
	const uint32_t me = (uint32_t)getpid();
	kGroupMac[3] = (uint8_t)((me >> 16) & 0x7f);
	kGroupMac[4] = (uint8_t)(me >> 8);
	kGroupMac[5] = (uint8_t)me;
	memcpy(kSrcMac + 2, &me, 4);
	sv_step("frames from %02x:%02x:%02x:%02x:%02x:%02x", kSrcMac[0], kSrcMac[1], kSrcMac[2],
		kSrcMac[3], kSrcMac[4], kSrcMac[5]);
	sv_open(&d);

	sv_step("a raw packet QP needs CAP_NET_RAW");
	struct ibv_cq *probe_cq = sv_create_cq(&d, 4, NULL, NULL);
	errno = 0;
	struct ibv_qp *probe = create_raw(&d, probe_cq, SLOTS);
	if (!probe && errno == EPERM) {
		/* Not root here: nothing more can be checked than that refusal. */
		CHECK_OK(ibv_destroy_cq(probe_cq));
		sv_close(&d);
		printf("SKIP %s: no CAP_NET_RAW (creation refused with EPERM, as it must be)\n", NAME);
		return 0;
	}
	CHECK(probe != NULL);
	const int one_process = getenv("SV_RAW_ONE_PROCESS") != NULL;
	if (!one_process)
		check_needs_cap_net_raw();

	sv_step("states: PORT into INIT, nothing else");
	{
		struct ibv_qp_attr m;
		memset(&m, 0, sizeof(m));
		m.qp_state = IBV_QPS_INIT;
		m.port_num = 1;
		CHECK_ERR(ibv_modify_qp(probe, &m, IBV_QP_STATE), EINVAL);
		CHECK_ERR(ibv_modify_qp(probe, &m, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_QKEY), EINVAL);
		CHECK_OK(modify_raw(probe));
		CHECK_EQ(sv_query_state(probe), IBV_QPS_RTS);
	}
	sv_step("SEND only");
	{
		struct ibv_mr *mr = sv_alloc_mr(d.pd, FRAME, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_send_wr wr, *bad;
		struct ibv_sge sge;
		sv_wr_init(&wr, &sge, 1, IBV_WR_SEND_WITH_IMM, mr, 0, FRAME, 0);
		CHECK_ERR(ibv_post_send(probe, &wr, &bad), EINVAL);
		sv_wr_init(&wr, &sge, 1, IBV_WR_RDMA_WRITE, mr, 0, FRAME, 0);
		CHECK_ERR(ibv_post_send(probe, &wr, &bad), EINVAL);
		/* No checksum offload: the device does not offer IBV_DEVICE_RAW_IP_CSUM. */
		sv_wr_init(&wr, &sge, 1, IBV_WR_SEND, mr, 0, FRAME, IBV_SEND_IP_CSUM);
		CHECK_ERR(ibv_post_send(probe, &wr, &bad), EINVAL);
		sv_free_mr(mr);
	}
	CHECK_OK(ibv_destroy_qp(probe));
	CHECK_OK(ibv_destroy_cq(probe_cq));

	rawq_open(&d, &a);
	rawq_open(&d, &b);
	rawq_open(&d, &c);

	sv_step("no rule: nothing arrives");
	send_frame(&a, 5678, 1, FRAME);
	expect_nothing(&b, "no rule");
	expect_nothing(&c, "no rule");

	sv_step("ETH + IPv4 + UDP rule on b");
	struct ibv_flow *fb = add_rule(b.qp, IBV_FLOW_ATTR_NORMAL, 1, 0, 5678, 0);
	CHECK(fb != NULL);
	send_frame(&a, 5678, 2, FRAME);
	expect_frame(&b, 5678, 2);
	expect_nothing(&c, "c has no rule");
	send_frame(&a, 9999, 3, FRAME);
	expect_nothing(&b, "another UDP port");

	sv_step("a QP with a rule cannot be destroyed");
	CHECK_ERR(ibv_destroy_qp(b.qp), EBUSY);

	sv_step("a better priority traps it");
	struct ibv_flow *fc = add_rule(c.qp, IBV_FLOW_ATTR_NORMAL, 0, 0, 5678, 0);
	CHECK(fc != NULL);
	send_frame(&a, 5678, 4, FRAME);
	expect_frame(&c, 5678, 4);
	expect_nothing(&b, "trapped by c's rule");
	CHECK_OK(ibv_destroy_flow(fc));

	sv_step("DONT_TRAP takes a copy");
	fc = add_rule(c.qp, IBV_FLOW_ATTR_NORMAL, 0, IBV_FLOW_ATTR_FLAGS_DONT_TRAP, 5678, 0);
	CHECK(fc != NULL);
	send_frame(&a, 5678, 5, FRAME);
	expect_frame(&c, 5678, 5);
	expect_frame(&b, 5678, 5);
	CHECK_OK(ibv_destroy_flow(fc));

	sv_step("DROP traps it for nobody");
	fc = add_rule(c.qp, IBV_FLOW_ATTR_NORMAL, 0, 0, 5678, 1);
	CHECK(fc != NULL);
	send_frame(&a, 5678, 6, FRAME);
	expect_nothing(&b, "dropped");
	expect_nothing(&c, "dropped");
	CHECK_OK(ibv_destroy_flow(fc));

	sv_step("MC_DEFAULT gets the group frames no rule took");
	fc = add_rule(c.qp, IBV_FLOW_ATTR_MC_DEFAULT, 0, 0, 0, 0);
	CHECK(fc != NULL);
	send_frame(&a, 4444, 7, FRAME);
	expect_frame(&c, 4444, 7);
	expect_nothing(&b, "not b's port");
	send_frame(&a, 5678, 8, FRAME);
	expect_frame(&b, 5678, 8);
	expect_nothing(&c, "taken by b's rule");
	CHECK_OK(ibv_destroy_flow(fc));

	sv_step("SNIFFER sees every frame");
	fc = add_rule(c.qp, IBV_FLOW_ATTR_SNIFFER, 0, 0, 0, 0);
	CHECK(fc != NULL);
	send_frame(&a, 5678, 9, FRAME);
	expect_frame(&b, 5678, 9);
	expect_frame(&c, 5678, 9);
	CHECK_OK(ibv_destroy_flow(fc));

	if (!one_process) {
		sv_step("between processes");
		check_between_processes(&d, &b);
	}

	sv_step("flow tags on an extended CQ");
	check_flow_tags(&d, &a);

	sv_step("RSS over WQs");
	check_rss(&d, &a);

	sv_step("bad rules");
	{
		struct sv_pair_cfg cfg;
		sv_pair_cfg_init(&cfg);
		struct ibv_cq *rc_cq = sv_create_cq(&d, 4, NULL, NULL);
		struct ibv_qp *rc = sv_create_qp(&d, &cfg, rc_cq, rc_cq, NULL, NULL);
		errno = 0;
		CHECK(add_rule(rc, IBV_FLOW_ATTR_NORMAL, 0, 0, 1, 0) == NULL && errno == EINVAL);
		CHECK_OK(ibv_destroy_qp(rc));
		struct ibv_qp_init_attr ua;
		memset(&ua, 0, sizeof(ua));
		ua.qp_type = IBV_QPT_UD;
		ua.send_cq = ua.recv_cq = rc_cq;
		ua.cap.max_send_wr = ua.cap.max_recv_wr = ua.cap.max_send_sge = ua.cap.max_recv_sge = 1;
		struct ibv_qp *ud = ibv_create_qp(d.pd, &ua);
		CHECK(ud != NULL);
		errno = 0;
		CHECK(add_rule(ud, IBV_FLOW_ATTR_NORMAL, 0, 0, 1, 0) == NULL && errno == EOPNOTSUPP);
		CHECK_OK(ibv_destroy_qp(ud));
		CHECK_OK(ibv_destroy_cq(rc_cq));

		struct {
			struct ibv_flow_attr attr;
			struct ibv_flow_spec_tunnel t;
		} r;
		memset(&r, 0, sizeof(r));
		r.attr.port = 2;
		r.attr.size = sizeof(r.attr);
		errno = 0;
		CHECK(ibv_create_flow(c.qp, &r.attr) == NULL && errno == EINVAL);
		r.attr.port = 1;
		r.attr.num_of_specs = 1;
		r.attr.size = sizeof(r);
		r.t.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
		r.t.size = sizeof(r.t);
		errno = 0;
		CHECK(ibv_create_flow(c.qp, &r.attr) == NULL && errno == EOPNOTSUPP);
		r.t.type = (enum ibv_flow_spec_type)0x77;
		errno = 0;
		CHECK(ibv_create_flow(c.qp, &r.attr) == NULL && errno == EINVAL);
	}

	sv_step("a VLAN-tagged frame arrives whole, its tag matched");
	{
		struct {
			struct ibv_flow_attr attr;
			struct ibv_flow_spec_eth eth;
		} r;
		memset(&r, 0, sizeof(r));
		r.attr.type = IBV_FLOW_ATTR_NORMAL;
		r.attr.size = sizeof(r);
		r.attr.num_of_specs = 1;
		r.attr.port = 1;
		r.eth.type = IBV_FLOW_SPEC_ETH;
		r.eth.size = sizeof(r.eth);
		memcpy(r.eth.val.dst_mac, kGroupMac, 6);
		memset(r.eth.mask.dst_mac, 0xff, 6);
		r.eth.val.vlan_tag = htons(0x0123);
		r.eth.mask.vlan_tag = htons(0x0fff);
		r.eth.val.ether_type = htons(0x0800);
		r.eth.mask.ether_type = 0xffff;
		struct ibv_flow *fv = ibv_create_flow(c.qp, &r.attr);
		CHECK(fv != NULL);
		uint8_t *f = sv_ptr(a.mr, (size_t)(SLOTS - 1) * FRAME);
		uint8_t sent[FRAME];
		build_frame(sent, 7777, 0x33);
		memmove(sent + 16, sent + 12, FRAME - 16); /* 802.1Q tag after the MACs */
		uint16_t ip_len = htons(FRAME - 18), udp_len = htons(FRAME - 38);
		memcpy(sent + 18 + 2, &ip_len, 2); /* the IP and UDP lengths of the shorter packet */
		memcpy(sent + 18 + 20 + 4, &udp_len, 2);
		sent[12] = 0x81;
		sent[13] = 0x00;
		sent[14] = 0xa1; /* priority 5, VLAN 0x123 */
		sent[15] = 0x23;
		memcpy(f, sent, FRAME);
		struct ibv_wc wc;
		CHECK_OK(sv_post_send(a.qp, 11, a.mr, (size_t)(SLOTS - 1) * FRAME, FRAME, 0));
		sv_expect_wc(a.cq, 11, IBV_WC_SUCCESS, a.qp, &wc);
		CHECKF(next_own(&c, &wc, SV_WAIT_MS), "no tagged frame within %d ms", SV_WAIT_MS);
		CHECK_EQ(wc.byte_len, FRAME);
		CHECKF(memcmp(sv_ptr(c.mr, (size_t)(wc.wr_id - 100) * FRAME), sent, FRAME) == 0,
		       "the tagged frame did not arrive as sent");
		CHECK_OK(sv_post_recv(c.qp, wc.wr_id, c.mr, (size_t)(wc.wr_id - 100) * FRAME, FRAME));
		expect_nothing(&b, "b's rule is for untagged UDP port 5678");
		CHECK_OK(ibv_destroy_flow(fv));
	}

	sv_step("a frame shorter than an Ethernet header: LOC_LEN_ERR, the QP in SQE");
	{
		struct ibv_wc wc;
		CHECK_OK(sv_post_send(a.qp, 9, a.mr, 0, 10, 0));
		sv_expect_wc(a.cq, 9, IBV_WC_LOC_LEN_ERR, a.qp, &wc);
		CHECK_EQ(sv_query_state(a.qp), IBV_QPS_SQE);
		CHECK_OK(sv_modify_state(a.qp, IBV_QPS_RTS));
	}
	sv_step("a frame larger than the interface takes: LOC_LEN_ERR");
	{
		/* lo's MTU (65536) + the Ethernet header, one byte more, untagged. */
		const uint32_t big = 65536 + 14 + 1;
		struct ibv_mr *bmr = sv_alloc_mr(d.pd, big, IBV_ACCESS_LOCAL_WRITE);
		build_frame(sv_ptr(bmr, 0), 5678, 1);
		struct ibv_wc wc;
		CHECK_OK(sv_post_send(a.qp, 10, bmr, 0, big, 0));
		sv_expect_wc(a.cq, 10, IBV_WC_LOC_LEN_ERR, a.qp, &wc);
		sv_free_mr(bmr);
	}

	CHECK_OK(ibv_destroy_flow(fb));
	rawq_close(&a);
	rawq_close(&b);
	rawq_close(&c);
	sv_close(&d);
	sv_pass();
	return 0;
}
