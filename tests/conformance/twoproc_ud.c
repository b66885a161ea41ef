/*
 * UD between processes of one host (issue 14, item 2): datagrams ride the target's UD
 * windows in shared memory, with UD's semantics intact. The parent R is the target; child S
 * sends (two UD QPs: A with R's Q_Key as its own, B with another), four children send at
 * once, and child V is a target that dies.
 *  - a datagram lands with its 40-byte GRH slot (the AH's GIDs), IBV_WC_GRH, src_qp, IMM,
 *    pkey_index 0; one of a whole MTU fits; R's arena holds a UD window for S's QP;
 *  - a wrong Q_Key is dropped; a WR Q_Key with the high bit set means the sender QP's own;
 *  - a receive too small completes with LOC_LEN_ERR, the sender sees success, the QP runs;
 *  - with no receive posted the datagram is lost (not held for the next receive);
 *  - solicited-only arming wakes for the solicited datagram, not before;
 *  - a UD QP on an SRQ;
 *  - (one host) to a multicast group R's QP joined: the datagrams ride R's UD window for the
 *    sender's QP, as unicast ones do, with the group in the GRH slot; none after a detach;
 *  - many senders at once: every datagram arrives, each sender's in order;
 *  - garbage over the window's header: nothing is lost; garbage over the whole window: R
 *    survives, its memory outside what it shares is intact, and datagrams flow again;
 *  - a target that died does not block its sender.
 */
#include "common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define QKEY 0x1234567u
#define QKEY_B 0x7654321u
#define GRH 40
#define MSG 64
#define MTU 4096
#define NSEND 4    /* senders at once */
#define PER_QP 150 /* datagrams from each of their two QPs */
#define NRECV (2 * NSEND * PER_QP)
#define SLOT (GRH + MTU)
/* ::ffff:239.1.2.65, an IPv4 group as RoCE v2 names it */
static const union ibv_gid group = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 65}};

static int sock_s, sock_v, sock_m[NSEND];

/* ---- helpers ------------------------------------------------------------------------- */

static struct ibv_qp *ud_qp(struct sv_dev *d, struct ibv_cq *scq, struct ibv_cq *rcq,
			    struct ibv_srq *srq, uint32_t qkey, uint32_t nrecv)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_UD;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.cap.max_send_wr = 64;
	a.cap.max_recv_wr = srq ? 0 : nrecv;
	a.cap.max_send_sge = a.cap.max_recv_sge = 2;
	a.cap.max_inline_data = 64;
	struct ibv_qp *qp = ibv_create_qp(d->pd, &a);
	CHECK(qp != NULL);
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.port_num = 1;
	m.qkey = qkey;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	CHECK_OK(sv_modify_state(qp, IBV_QPS_RTR));
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 1;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN));
	return qp;
}

/* What a peer needs to reach a UD QP: its number and its port's GID. */
struct ud_addr {
	uint32_t qpn;
	union ibv_gid gid;
};

static struct ud_addr trade(int sock, const struct sv_dev *d, const struct ibv_qp *qp)
{
	struct ud_addr ours = {qp->qp_num, d->gid}, theirs;
	sv_exchange(sock, &ours, &theirs, sizeof(ours));
	return theirs;
}

static struct ibv_ah *ud_ah(struct sv_dev *d, const union ibv_gid *dgid)
{
	struct ibv_ah_attr a;
	memset(&a, 0, sizeof(a));
	a.is_global = 1;
	a.grh.dgid = *dgid;
	a.grh.sgid_index = (uint8_t)d->gid_index;
	a.grh.hop_limit = 64;
	a.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(d->pd, &a);
	CHECK(ah != NULL);
	return ah;
}

/* One datagram of mr[off, off + len) (inline from there with IBV_SEND_INLINE). */
static void ud_post(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey,
		    uint64_t id, struct ibv_mr *mr, size_t off, uint32_t len, enum ibv_wr_opcode op,
		    unsigned flags)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, id, op, (flags & IBV_SEND_INLINE) ? NULL : mr, off, len, flags);
	if (flags & IBV_SEND_INLINE)
		sge.addr = sv_addr(mr, off);
	wr.imm_data = htonl(0xabc00000u | (uint32_t)id);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	CHECK_OK(ibv_post_send(qp, &wr, &bad));
}

/* ud_post, signaled, and its completion: a UD sender always sees success here. */
static void ud_send(struct ibv_qp *qp, struct ibv_cq *scq, struct ibv_ah *ah, uint32_t qpn,
		    uint32_t qkey, uint64_t id, struct ibv_mr *mr, size_t off, uint32_t len,
		    enum ibv_wr_opcode op, unsigned flags)
{
	struct ibv_wc wc;
	ud_post(qp, ah, qpn, qkey, id, mr, off, len, op, flags | IBV_SEND_SIGNALED);
	sv_expect_wc(scq, id, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_SEND);
}

static void mark(struct ibv_mr *mr, size_t off, uint64_t v, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		sv_ptr(mr, off)[i] = (uint8_t)(v * 131 + i);
	memcpy(sv_ptr(mr, off), &v, sizeof(v));
}

static uint64_t marker_of(struct ibv_mr *mr, const struct ibv_wc *wc)
{
	uint64_t v;
	memcpy(&v, sv_ptr(mr, (size_t)(wc->wr_id % NRECV) * SLOT + GRH), sizeof(v));
	return v;
}

/* ---- the UD windows in a process's arena ------------------------------------------------ */

/* The UD window header as ud_window.hpp lays it out (its first words). */
struct ud_window_header {
	uint32_t magic, live, qpn, peer_qpn;
	uint64_t cq_offset;
	int32_t owner_pid;
	uint32_t slots_offset;
};
#define UD_WINDOW_MAGIC 0x53565544u
#define UD_WINDOW_BYTES (64 + 32 * 4160) /* header line, 32 slots */

struct find_window {
	uint32_t qpn, peer_qpn;
	int found;
	uint64_t seed; /* 0: only look; else overwrite: `whole` ? the window : its header's rest */
	int whole;
};

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len; i++) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		p[i] = (uint8_t)seed;
	}
}

static int window_fd(const char *path, const char *target, void *arg)
{
	struct find_window *f = arg;
	if (!strstr(target, "memfd:softverbs-arena"))
		return 0;
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	struct stat st;
	CHECK_OK(fstat(fd, &st));
	size_t len = (size_t)st.st_size < (64u << 20) ? (size_t)st.st_size : (64u << 20);
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED);
	/* Windows are whole pages; pages never written read as zeros (no memory is used). */
	for (size_t at = 0; at + UD_WINDOW_BYTES <= len; at += 4096) {
		struct ud_window_header *h = (void *)(p + at);
		if (h->magic != UD_WINDOW_MAGIC || h->qpn != f->qpn || h->peer_qpn != f->peer_qpn ||
		    !h->live)
			continue;
		f->found++;
		if (f->seed && f->whole) {
			fill(p + at, UD_WINDOW_BYTES, f->seed);
		} else if (f->seed) {
			/* All but the words that name it (kept for the look after): where the CQ
			 * is, the owner, where the slots are, the count consumed. */
			fill(p + at + 16, 128 - 16, f->seed);
		}
	}
	munmap(p, len);
	CHECK_OK(close(fd));
	return 0;
}

static int windows(pid_t pid, uint32_t qpn, uint32_t peer_qpn, uint64_t seed, int whole)
{
	struct find_window f = {qpn, peer_qpn, 0, seed, whole};
	sv_each_fd(pid, window_fd, &f);
	return f.found;
}

/* ---- the target (parent) ----------------------------------------------------------------- */

struct target {
	struct sv_dev dev;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq, *srq_cq;
	struct ibv_srq *srq;
	struct ibv_qp *qp, *srq_qp;
	struct ibv_mr *mr;
};

static void post_recvs(struct target *t, uint64_t first, int n, uint32_t len)
{
	for (int i = 0; i < n; i++) {
		uint64_t id = first + (uint64_t)i;
		CHECK_OK(sv_post_recv(t->qp, id, t->mr, (size_t)(id % NRECV) * SLOT, len));
	}
}

/* One datagram received into receive `id`: its completion's fields and its GRH slot. */
static void expect_datagram(struct target *t, uint64_t id, const struct ud_addr *from,
			    uint32_t len, int imm, struct ibv_wc *out)
{
	struct ibv_wc wc;
	sv_expect_wc(t->rcq, id, IBV_WC_SUCCESS, t->qp, &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.src_qp, from->qpn);
	CHECK_EQ(wc.byte_len, GRH + len);
	CHECK(wc.wc_flags & IBV_WC_GRH);
	CHECK_EQ(wc.pkey_index, 0);
	CHECK_EQ(!!(wc.wc_flags & IBV_WC_WITH_IMM), !!imm);
	const uint8_t *grh = sv_ptr(t->mr, (size_t)(id % NRECV) * SLOT);
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (memcmp(from->gid.raw, v4, 12) == 0) {
		/* RoCE v2 over IPv4: an IPv4 header in the slot's last 20 bytes. */
		CHECK_EQ(grh[20], 0x45);
		CHECK(memcmp(grh + 32, &from->gid.raw[12], 4) == 0);
		CHECK(memcmp(grh + 36, &t->dev.gid.raw[12], 4) == 0);
	} else {
		CHECK_EQ(grh[0] >> 4, 6);
		CHECK(memcmp(grh + 8, from->gid.raw, 16) == 0);
		CHECK(memcmp(grh + 24, t->dev.gid.raw, 16) == 0);
	}
	if (out)
		*out = wc;
}

/* Receives n datagrams (any order between senders), checks each sender's come in order. */
static void expect_many(struct target *t, const struct ud_addr *senders, int nsenders,
			int per_sender)
{
	int next[2 * NSEND] = {0};
	for (int got = 0; got < nsenders * per_sender; got++) {
		struct ibv_wc wc;
		sv_poll_one(t->rcq, &wc);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, GRH + MSG);
		int who = -1;
		for (int i = 0; i < nsenders; i++)
			if (senders[i].qpn == wc.src_qp)
				who = i;
		CHECK(who >= 0);
		uint64_t v = marker_of(t->mr, &wc);
		CHECK_EQ(v, ((uint64_t)who << 32) | (uint64_t)next[who]);
		next[who]++;
	}
}

/* ---- the senders ----------------------------------------------------------------------------- */

/* S: two UD QPs, A (R's Q_Key) and B (another Q_Key), on one send CQ. */
static void sender(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *scq = sv_create_cq(&d, 128, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&d, 8, NULL, NULL);
	struct ibv_qp *a = ud_qp(&d, scq, rcq, NULL, QKEY, 1), *b = ud_qp(&d, scq, rcq, NULL, QKEY_B, 1);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, 2 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ud_addr r = trade(sock, &d, a), r_srq;
	(void)trade(sock, &d, b);
	sv_exchange(sock, &r, &r_srq, sizeof(r)); /* R's QP on the SRQ */
	struct ibv_ah *ah = ud_ah(&d, &r.gid);

	/* 1: plain, with IMM, inline, a whole MTU. */
	CHECK_EQ(sv_hear(sock), 1);
	mark(mr, 0, 1, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 1, mr, 0, MSG, IBV_WR_SEND, 0);
	mark(mr, 0, 2, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 2, mr, 0, MSG, IBV_WR_SEND_WITH_IMM, 0);
	mark(mr, 0, 3, 8);
	ud_send(a, scq, ah, r.qpn, QKEY, 3, mr, 0, 8, IBV_WR_SEND, IBV_SEND_INLINE);
	mark(mr, 0, 4, MTU);
	ud_send(a, scq, ah, r.qpn, QKEY, 4, mr, 0, MTU, IBV_WR_SEND, 0);
	sv_say(sock, 1);

	/* 2: Q_Keys. Dropped: a wrong one from A, B's own (high bit) from B. Delivered: A's own
	 * (high bit) from A, R's from B (after B's dropped one), R's from A. */
	CHECK_EQ(sv_hear(sock), 2);
	mark(mr, 0, 20, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY + 1, 20, mr, 0, MSG, IBV_WR_SEND, 0);
	mark(mr, 0, 21, MSG);
	ud_send(b, scq, ah, r.qpn, 0x80000000u, 21, mr, 0, MSG, IBV_WR_SEND, 0);
	mark(mr, 0, 22, MSG);
	ud_send(a, scq, ah, r.qpn, 0x80000000u, 22, mr, 0, MSG, IBV_WR_SEND, 0);
	mark(mr, 0, 23, MSG);
	ud_send(b, scq, ah, r.qpn, QKEY, 23, mr, 0, MSG, IBV_WR_SEND, 0);
	mark(mr, 0, 24, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 24, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 2);

	/* 3: into a receive too small, then one that fits. */
	CHECK_EQ(sv_hear(sock), 3);
	mark(mr, 0, 30, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 30, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 3);
	CHECK_EQ(sv_hear(sock), 31);
	mark(mr, 0, 31, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 31, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 31);

	/* 4: with no receive posted; then one for a receive posted afterwards. */
	CHECK_EQ(sv_hear(sock), 4);
	for (uint64_t i = 40; i < 43; i++) {
		mark(mr, 0, i, MSG);
		ud_send(a, scq, ah, r.qpn, QKEY, i, mr, 0, MSG, IBV_WR_SEND, 0);
	}
	sv_say(sock, 4);
	CHECK_EQ(sv_hear(sock), 41);
	mark(mr, 0, 43, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 43, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 41);

	/* 5: solicited events: an unsolicited datagram, then (when told) a solicited one. */
	CHECK_EQ(sv_hear(sock), 5);
	mark(mr, 0, 50, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 50, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 5);
	CHECK_EQ(sv_hear(sock), 51);
	mark(mr, 0, 51, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 51, mr, 0, MSG, IBV_WR_SEND_WITH_IMM, IBV_SEND_SOLICITED);
	sv_say(sock, 51);

	/* 6: to R's QP on an SRQ. */
	CHECK_EQ(sv_hear(sock), 6);
	for (uint64_t i = 60; i < 64; i++) {
		mark(mr, 0, i, MSG);
		ud_send(a, scq, ah, r_srq.qpn, QKEY, i, mr, 0, MSG, IBV_WR_SEND, 0);
	}
	sv_say(sock, 6);

	/* 65 (one host): from a fresh QP to the group R joined, three datagrams; then (66)
	 * one more, after R left it. */
	int next = sv_hear(sock);
	if (next == 65) {
		struct ibv_qp *m = ud_qp(&d, scq, rcq, NULL, QKEY, 1);
		(void)trade(sock, &d, m);
		struct ibv_ah *gah = ud_ah(&d, &group);
		for (uint64_t i = 650; i < 653; i++) {
			mark(mr, 0, i, MSG);
			ud_send(m, scq, gah, 0xffffff, QKEY, i, mr, 0, MSG, IBV_WR_SEND, 0);
		}
		sv_say(sock, 65);
		CHECK_EQ(sv_hear(sock), 66);
		mark(mr, 0, 660, MSG);
		ud_send(m, scq, gah, 0xffffff, QKEY, 660, mr, 0, MSG, IBV_WR_SEND, 0);
		mark(mr, 0, 661, MSG); /* then one to R's QP itself */
		ud_send(m, scq, ah, r.qpn, QKEY, 661, mr, 0, MSG, IBV_WR_SEND, 0);
		sv_say(sock, 66);
		CHECK_OK(ibv_destroy_ah(gah));
		CHECK_OK(ibv_destroy_qp(m));
		next = sv_hear(sock);
	}

	/* 8: R overwrote the window's header: more datagrams, all must arrive. Then R
	 * overwrote all of it: more datagrams, any fate; then, when told, one that must. */
	CHECK_EQ(next, 8);
	for (uint64_t i = 0; i < 48; i++) {
		mark(mr, 0, ((uint64_t)0 << 32) | i, MSG);
		ud_send(a, scq, ah, r.qpn, QKEY, 80, mr, 0, MSG, IBV_WR_SEND, 0);
	}
	sv_say(sock, 8);
	CHECK_EQ(sv_hear(sock), 81);
	for (uint64_t i = 0; i < 48; i++)
		ud_send(a, scq, ah, r.qpn, QKEY, 81, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 81);
	CHECK_EQ(sv_hear(sock), 82);
	mark(mr, 0, 82, MSG);
	ud_send(a, scq, ah, r.qpn, QKEY, 82, mr, 0, MSG, IBV_WR_SEND, 0);
	sv_say(sock, 82);

	CHECK_EQ(sv_hear(sock), 99);
	CHECK_OK(ibv_destroy_ah(ah));
	CHECK_OK(ibv_destroy_qp(a));
	CHECK_OK(ibv_destroy_qp(b));
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_free_mr(mr);
	sv_close(&d);
	_exit(0);
}

/* One of the many: two QPs, PER_QP datagrams from each, interleaved, unsignaled but every
 * 16th (so the send queue never fills). Sender index `who` comes over the socket. */
static void many(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *scq = sv_create_cq(&d, 256, NULL, NULL);
	struct ibv_cq *rcq = sv_create_cq(&d, 8, NULL, NULL);
	struct ibv_qp *qp[2] = {ud_qp(&d, scq, rcq, NULL, QKEY, 1), ud_qp(&d, scq, rcq, NULL, QKEY, 1)};
	struct ibv_mr *mr = sv_alloc_mr(d.pd, 2 * 4096, IBV_ACCESS_LOCAL_WRITE);
	int who = sv_hear(sock);
	struct ud_addr r = trade(sock, &d, qp[0]);
	(void)trade(sock, &d, qp[1]);
	struct ibv_ah *ah = ud_ah(&d, &r.gid);
	CHECK_EQ(sv_hear(sock), 7);
	for (int i = 0; i < PER_QP; i++) {
		for (int q = 0; q < 2; q++) {
			size_t off = (size_t)q * 4096;
			mark(mr, off, ((uint64_t)(2 * who + q) << 32) | (uint64_t)i, MSG);
			int last = i % 16 == 15 || i == PER_QP - 1;
			ud_post(qp[q], ah, r.qpn, QKEY, (uint64_t)i, mr, off, MSG, IBV_WR_SEND,
				last ? IBV_SEND_SIGNALED : 0);
			if (last) {
				struct ibv_wc wc;
				sv_expect_wc(scq, (uint64_t)i, IBV_WC_SUCCESS, qp[q], &wc);
			}
		}
	}
	sv_say(sock, 7);
	CHECK_EQ(sv_hear(sock), 99);
	CHECK_OK(ibv_destroy_ah(ah));
	for (int q = 0; q < 2; q++)
		CHECK_OK(ibv_destroy_qp(qp[q]));
	CHECK_OK(ibv_destroy_cq(scq));
	CHECK_OK(ibv_destroy_cq(rcq));
	sv_free_mr(mr);
	sv_close(&d);
	_exit(0);
}

/* V: a target that takes one datagram, then is killed. */
static void victim(int sock)
{
	struct sv_dev d;
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 8, NULL, NULL);
	struct ibv_qp *qp = ud_qp(&d, cq, cq, NULL, QKEY, 4);
	struct ibv_mr *mr = sv_alloc_mr(d.pd, SLOT, IBV_ACCESS_LOCAL_WRITE);
	CHECK_OK(sv_post_recv(qp, 1, mr, 0, SLOT));
	(void)trade(sock, &d, qp);
	struct ibv_wc wc;
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
	sv_say(sock, 9);
	for (;;)
		pause(); /* until killed */
}

/* ---- the steps ---------------------------------------------------------------------------- */

int main(void)
{
	sv_init("twoproc_ud");
	pid_t s_pid, v_pid, m_pid[NSEND];
	sock_s = sv_fork_peer(sender, &s_pid);
	sock_v = sv_fork_peer(victim, &v_pid);
	for (int i = 0; i < NSEND; i++)
		sock_m[i] = sv_fork_peer(many, &m_pid[i]);
	int same_host = !sv_peer_on_other_host();

	struct target t;
	sv_open(&t.dev);
	t.ch = ibv_create_comp_channel(t.dev.ctx);
	CHECK(t.ch != NULL);
	t.scq = sv_create_cq(&t.dev, 64, NULL, NULL);
	t.rcq = sv_create_cq(&t.dev, NRECV + 64, NULL, t.ch);
	t.srq_cq = sv_create_cq(&t.dev, 64, NULL, NULL);
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	t.srq = ibv_create_srq(t.dev.pd, &sa);
	CHECK(t.srq != NULL);
	t.qp = ud_qp(&t.dev, t.scq, t.rcq, NULL, QKEY, NRECV);
	t.srq_qp = ud_qp(&t.dev, t.scq, t.srq_cq, t.srq, QKEY, 0);
	t.mr = sv_alloc_mr(t.dev.pd, (size_t)NRECV * SLOT, IBV_ACCESS_LOCAL_WRITE);
	static uint8_t canary[8192];
	memset(canary, 0x5a, sizeof(canary));
	struct ud_addr a = trade(sock_s, &t.dev, t.qp), b = trade(sock_s, &t.dev, t.qp);
	struct ud_addr ours_srq = {t.srq_qp->qp_num, t.dev.gid}, ignored;
	sv_exchange(sock_s, &ours_srq, &ignored, sizeof(ours_srq));
	struct ibv_wc wc;

	sv_step("datagrams land with their GRH slot, src_qp, IMM; a whole MTU fits");
	post_recvs(&t, 0, 4, SLOT);
	sv_say(sock_s, 1);
	CHECK_EQ(sv_hear(sock_s), 1);
	expect_datagram(&t, 0, &a, MSG, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 1);
	expect_datagram(&t, 1, &a, MSG, 1, &wc);
	CHECK_EQ(wc.imm_data, htonl(0xabc00002u));
	CHECK_EQ(marker_of(t.mr, &wc), 2);
	expect_datagram(&t, 2, &a, 8, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 3);
	expect_datagram(&t, 3, &a, MTU, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 4);
	CHECK_EQ(sv_ptr(t.mr, 3 * SLOT + GRH)[MTU - 1], (uint8_t)(4 * 131 + MTU - 1));
	if (same_host)
		CHECK_EQ(windows(getpid(), t.qp->qp_num, a.qpn, 0, 0), 1);

	sv_step("a wrong Q_Key is dropped; a WR Q_Key with the high bit set is the QP's own");
	post_recvs(&t, 10, 3, SLOT);
	sv_say(sock_s, 2);
	CHECK_EQ(sv_hear(sock_s), 2);
	{
		/* The two QPs' windows are drained in no set order: the three in any. */
		int seen = 0;
		for (uint64_t id = 10; id < 13; id++) {
			sv_expect_wc(t.rcq, id, IBV_WC_SUCCESS, t.qp, &wc);
			uint64_t v = marker_of(t.mr, &wc);
			CHECK(v == 22 || v == 23 || v == 24);
			CHECK_EQ(wc.src_qp, v == 23 ? b.qpn : a.qpn);
			seen |= 1 << (v - 22);
		}
		CHECK_EQ(seen, 7);
	}
	sv_expect_empty(t.rcq, "the datagrams with the wrong Q_Key");

	sv_step("a receive too small completes with LOC_LEN_ERR; the QP goes on");
	CHECK_OK(sv_post_recv(t.qp, 13, t.mr, 13 * SLOT, GRH + MSG / 2));
	sv_say(sock_s, 3);
	CHECK_EQ(sv_hear(sock_s), 3);
	sv_expect_wc(t.rcq, 13, IBV_WC_LOC_LEN_ERR, t.qp, &wc);
	CHECK_EQ(sv_query_state(t.qp), IBV_QPS_RTS);
	post_recvs(&t, 14, 1, SLOT);
	sv_say(sock_s, 31);
	CHECK_EQ(sv_hear(sock_s), 31);
	expect_datagram(&t, 14, &a, MSG, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 31);

	sv_step("with no receive posted a datagram is lost");
	sv_say(sock_s, 4);
	CHECK_EQ(sv_hear(sock_s), 4);
	sv_expect_empty(t.rcq, "datagrams with no receive posted");
	post_recvs(&t, 15, 1, SLOT);
	sv_say(sock_s, 41);
	CHECK_EQ(sv_hear(sock_s), 41);
	expect_datagram(&t, 15, &a, MSG, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 43);
	sv_expect_empty(t.rcq, "one datagram for one receive");

	sv_step("solicited-only arming wakes for the solicited datagram only");
	post_recvs(&t, 16, 2, SLOT);
	CHECK_OK(ibv_req_notify_cq(t.rcq, 1));
	sv_say(sock_s, 5);
	CHECK_EQ(sv_hear(sock_s), 5);
	sv_expect_no_cq_event(t.ch, "an unsolicited datagram");
	sv_say(sock_s, 51);
	CHECK_EQ(sv_hear(sock_s), 51);
	sv_expect_cq_event(t.ch, t.rcq);
	expect_datagram(&t, 16, &a, MSG, 0, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 50);
	expect_datagram(&t, 17, &a, MSG, 1, &wc);
	CHECK_EQ(marker_of(t.mr, &wc), 51);

	sv_step("a UD QP on an SRQ");
	for (int i = 0; i < 4; i++)
		CHECK_OK(sv_post_srq_recv(t.srq, 200 + (uint64_t)i, t.mr, (size_t)(20 + i) * SLOT, SLOT));
	sv_say(sock_s, 6);
	CHECK_EQ(sv_hear(sock_s), 6);
	for (int i = 0; i < 4; i++) {
		sv_expect_wc(t.srq_cq, 200 + (uint64_t)i, IBV_WC_SUCCESS, t.srq_qp, &wc);
		CHECK_EQ(wc.src_qp, a.qpn);
		CHECK_EQ(wc.byte_len, GRH + MSG);
		CHECK(wc.wc_flags & IBV_WC_GRH);
		uint64_t v;
		memcpy(&v, sv_ptr(t.mr, (size_t)(20 + i) * SLOT + GRH), sizeof(v));
		CHECK_EQ(v, 60 + (uint64_t)i);
	}

	if (same_host) {
		sv_step("to a multicast group: through R's UD window for the sender, the group in "
			"the GRH slot; nothing after a detach");
		CHECK_OK(ibv_attach_mcast(t.qp, &group, 0));
		post_recvs(&t, 300, 4, SLOT);
		sv_say(sock_s, 65);
		struct ud_addr m = trade(sock_s, &t.dev, t.qp);
		CHECK_EQ(sv_hear(sock_s), 65);
		for (uint64_t i = 0; i < 3; i++) {
			sv_expect_wc(t.rcq, 300 + i, IBV_WC_SUCCESS, t.qp, &wc);
			CHECK_EQ(wc.src_qp, m.qpn);
			CHECK_EQ(wc.byte_len, GRH + MSG);
			CHECK(wc.wc_flags & IBV_WC_GRH);
			CHECK_EQ(marker_of(t.mr, &wc), 650 + i);
			const uint8_t *grh = sv_ptr(t.mr, (size_t)(300 + i) * SLOT);
			CHECK(memcmp(grh + 36, &group.raw[12], 4) == 0); /* the IPv4 destination */
		}
		/* The window is the sender's QP's own: multicast went the unicast fast path. */
		CHECK_EQ(windows(getpid(), t.qp->qp_num, m.qpn, 0, 0), 1);
		CHECK_OK(ibv_detach_mcast(t.qp, &group, 0));
		sv_say(sock_s, 66);
		CHECK_EQ(sv_hear(sock_s), 66);
		/* The group's datagram (660) came first, the QP's own (661) second: 661 in the
		 * receive left means 660 did not land. */
		sv_expect_wc(t.rcq, 303, IBV_WC_SUCCESS, t.qp, &wc);
		CHECK_EQ(marker_of(t.mr, &wc), 661);
		sv_expect_empty(t.rcq, "a datagram to the group after the detach");
	}

	sv_step("%d senders of two QPs each at once: every datagram arrives, in order per sender", NSEND);
	struct ud_addr senders[2 * NSEND];
	post_recvs(&t, NRECV, NRECV, GRH + MSG);
	for (int i = 0; i < NSEND; i++) {
		sv_say(sock_m[i], i);
		senders[2 * i] = trade(sock_m[i], &t.dev, t.qp);
		senders[2 * i + 1] = trade(sock_m[i], &t.dev, t.qp);
	}
	for (int i = 0; i < NSEND; i++)
		sv_say(sock_m[i], 7);
	expect_many(&t, senders, 2 * NSEND, PER_QP);
	for (int i = 0; i < NSEND; i++)
		CHECK_EQ(sv_hear(sock_m[i]), 7);
	sv_expect_empty(t.rcq, "more than was sent");

	if (same_host) {
		sv_step("garbage over the window's header: nothing is lost");
		CHECK_EQ(windows(getpid(), t.qp->qp_num, a.qpn, 0x9e3779b97f4a7c15ull, 0), 1);
		post_recvs(&t, 2 * NRECV, 48, SLOT);
		sv_say(sock_s, 8);
		for (uint64_t i = 0; i < 48; i++) {
			expect_datagram(&t, 2 * NRECV + i, &a, MSG, 0, &wc);
			CHECK_EQ(marker_of(t.mr, &wc), i);
		}
		CHECK_EQ(sv_hear(sock_s), 8);

		sv_step("garbage over the whole window: we survive and datagrams flow again");
		CHECK_EQ(windows(getpid(), t.qp->qp_num, a.qpn, 0xc0ffee1234567ull, 1), 1);
		post_recvs(&t, 3 * NRECV, 48, SLOT);
		sv_say(sock_s, 81);
		CHECK_EQ(sv_hear(sock_s), 81);
		long long end = sv_now_ms() + 300;
		int got = 0;
		while (sv_now_ms() < end) {
			struct ibv_wc many_wc[16];
			int n = ibv_poll_cq(t.rcq, 16, many_wc);
			CHECK(n >= 0);
			got += n;
		}
		printf("after garbage: %d of 48 datagrams\n", got);
		for (size_t i = 0; i < sizeof(canary); i++)
			CHECK_EQ(canary[i], 0x5a);
		CHECK_EQ(sv_query_state(t.qp), IBV_QPS_RTS);
		/* Whatever the garbage did, the next datagram lands (a fresh window if need be). */
		while (ibv_poll_cq(t.rcq, 1, &wc) > 0)
			;
		CHECK_OK(sv_post_recv(t.qp, 4 * NRECV, t.mr, 0, SLOT));
		sv_say(sock_s, 82);
		CHECK_EQ(sv_hear(sock_s), 82);
		for (;;) { /* receives the garbage left unused may complete first */
			sv_poll_one(t.rcq, &wc);
			if (wc.status == IBV_WC_SUCCESS && marker_of(t.mr, &wc) == 82)
				break;
		}
	} else {
		sv_say(sock_s, 8);
		CHECK_EQ(sv_hear(sock_s), 8);
		sv_say(sock_s, 81);
		CHECK_EQ(sv_hear(sock_s), 81);
		sv_say(sock_s, 82);
		CHECK_EQ(sv_hear(sock_s), 82);
	}

	sv_step("a target that died does not block its sender");
	{
		struct ud_addr v = trade(sock_v, &t.dev, t.qp);
		struct ibv_ah *ah = ud_ah(&t.dev, &v.gid);
		mark(t.mr, 0, 90, MSG);
		ud_send(t.qp, t.scq, ah, v.qpn, QKEY, 90, t.mr, 0, MSG, IBV_WR_SEND, 0);
		CHECK_EQ(sv_hear(sock_v), 9);
		CHECK_OK(kill(v_pid, SIGKILL));
		int status;
		CHECK(waitpid(v_pid, &status, 0) == v_pid);
		for (uint64_t i = 0; i < 200; i++)
			ud_send(t.qp, t.scq, ah, v.qpn, QKEY, 91, t.mr, 0, MSG, IBV_WR_SEND, 0);
		CHECK_OK(ibv_destroy_ah(ah));
	}

	sv_step("teardown");
	sv_say(sock_s, 99);
	for (int i = 0; i < NSEND; i++)
		sv_say(sock_m[i], 99);
	sv_wait_peer(s_pid, "the sender");
	for (int i = 0; i < NSEND; i++)
		sv_wait_peer(m_pid[i], "one of the many");
	CHECK_OK(ibv_destroy_qp(t.qp));
	CHECK_OK(ibv_destroy_qp(t.srq_qp));
	CHECK_OK(ibv_destroy_srq(t.srq));
	CHECK_OK(ibv_destroy_cq(t.scq));
	CHECK_OK(ibv_destroy_cq(t.rcq));
	CHECK_OK(ibv_destroy_cq(t.srq_cq));
	CHECK_OK(ibv_destroy_comp_channel(t.ch));
	sv_free_mr(t.mr);
	sv_close(&t.dev);
	sv_pass();
	return 0;
}
