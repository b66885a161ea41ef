/*
 * The process an RDMA WRITE lands in is the one whose agent answered, as the kernel names it,
 * never what shared memory says. B (child) registers a small buffer (not moved to shared
 * pages: the requester writes it with cross-memory attach); A (parent) writes it once, then
 * rewrites the pid in B's receive window header (in B's arena, which every peer may write)
 * to its own and makes its requester ask for the window again. A's next RDMA WRITE must
 * still land in B, and A's own copy of the buffer (the same address: B is a fork of A)
 * must stay untouched.
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define LEN 256
#define AT 64 /* B's MR starts here in `target`: no whole page, so it stays private */

static int sock;
static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* At the same address in A and in B. */
static uint8_t target[8192] __attribute__((aligned(4096)));

/* The start of a receive window's header (src/wire/window.hpp, WindowHeader). */
struct window_header {
	uint32_t magic;
	uint32_t live;
	uint32_t qpn;
	uint32_t peer_qpn;
	uint64_t cq_offset;
	uint64_t reserved;
	uint32_t rq_cap;
	uint32_t slots_offset;
	uint32_t qp_access;
	uint32_t max_dest_rd_atomic;
	uint64_t pd_token;
	uint64_t mr_table_offset;
	uint32_t mr_table_cap;
	int32_t owner_pid;
};
#define WINDOW_MAGIC 0x5356574eu

static int filled_with(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

struct forgery {
	uint32_t qpn, peer_qpn;
	pid_t pid;
};

/* For sv_each_fd: if the fd is an arena that holds the window f->qpn -> f->peer_qpn, names
 * f->pid as the window's owner, drops its `live` flag and returns 1. */
static int forge_in(const char *path, const char *target, void *arg)
{
	const struct forgery *f = arg;
	if (!strstr(target, "memfd:softverbs-arena"))
		return 0;
	int forged = 0;
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	struct stat st;
	CHECK_OK(fstat(fd, &st));
	char *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(base != MAP_FAILED);
	/* Windows start on 4 KiB blocks; only the blocks that hold data are looked at. */
	off_t at = lseek(fd, 0, SEEK_DATA);
	while (!forged && at >= 0 && at < st.st_size) {
		off_t end = lseek(fd, at, SEEK_HOLE);
		CHECK(end > at);
		for (off_t off = at & ~(off_t)4095; off < end; off += 4096) {
			struct window_header *h = (struct window_header *)(base + off);
			if (h->magic != WINDOW_MAGIC || h->qpn != f->qpn ||
			    h->peer_qpn != f->peer_qpn)
				continue;
			h->owner_pid = f->pid;
			__atomic_store_n(&h->live, 0, __ATOMIC_RELEASE);
			forged = 1;
			break;
		}
		at = lseek(fd, end, SEEK_DATA);
	}
	munmap(base, (size_t)st.st_size);
	CHECK_OK(close(fd));
	return forged;
}

/* Finds the window of B's QP `qpn` for A's QP `peer_qpn` in B's arena, names `pid` as its
 * owner there and drops its `live` flag, so that A's requester asks B for it again. */
static void forge_window(pid_t b, uint32_t qpn, uint32_t peer_qpn, pid_t pid)
{
	struct forgery f = {qpn, peer_qpn, pid};
	CHECKF(sv_each_fd(b, forge_in, &f), "no receive window of QP %u for QP %u in process %d",
	       qpn, peer_qpn, (int)b);
}

static void target_side(int s)
{
	sock = s;
	struct sv_one_qp b;
	/* No MR from sv_one_qp_open: ours is in `target`, at the same address as in A. */
	sv_one_qp_open(&b, NULL, 16, 0);
	memset(target, 0, sizeof(target));
	struct ibv_mr *mr = ibv_reg_mr(b.dev.pd, target + AT, LEN,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL);
	struct sv_remote peer;
	sv_trade_remote(sock, b.qp, mr, &peer);
	sv_one_qp_connect(&b, peer.qpn, 0, 0, 0);
	say(1);
	CHECK_EQ(hear(), 2);
	CHECKF(filled_with(target + AT, LEN, 0xa1), "the first RDMA WRITE did not land");
	say(2);
	CHECK_EQ(hear(), 3);
	CHECKF(filled_with(target + AT, LEN, 0xb2),
	       "the RDMA WRITE after the forged window did not land here");
	say(3);
	CHECK_OK(ibv_destroy_qp(b.qp));
	b.qp = NULL;
	CHECK_OK(ibv_dereg_mr(mr));
	sv_one_qp_close(&b);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_forged_pid");
	pid_t child;
	sock = sv_fork_peer(target_side, &child);
	memset(target, 0x3c, sizeof(target)); /* A's own copy: must stay as it is */
	struct sv_one_qp a;
	sv_one_qp_open(&a, NULL, 16, 4096);
	struct sv_remote b;
	sv_trade_remote(sock, a.qp, a.mr, &b);
	sv_one_qp_connect(&a, b.qpn, 0, 0, 0);
	CHECK_EQ(hear(), 1);
	CHECK_EQ(b.addr, (uint64_t)(uintptr_t)(target + AT));

	sv_step("an RDMA WRITE into B (opens B's receive window)");
	struct ibv_wc wc;
	memset(sv_ptr(a.mr, 0), 0xa1, LEN);
	CHECK_OK(sv_post_rdma(a.qp, 1, IBV_WR_RDMA_WRITE, a.mr, 0, LEN, IBV_SEND_SIGNALED, b.addr,
			      b.rkey));
	sv_expect_wc(a.cq, 1, IBV_WC_SUCCESS, a.qp, &wc);
	say(2);
	CHECK_EQ(hear(), 2);

	sv_step("B's window names us as its owner; the next RDMA WRITE still lands in B");
	forge_window(child, b.qpn, a.qp->qp_num, getpid());
	memset(sv_ptr(a.mr, 0), 0xb2, LEN);
	CHECK_OK(sv_post_rdma(a.qp, 2, IBV_WR_RDMA_WRITE, a.mr, 0, LEN, IBV_SEND_SIGNALED, b.addr,
			      b.rkey));
	sv_expect_wc(a.cq, 2, IBV_WC_SUCCESS, a.qp, &wc);
	CHECKF(filled_with(target, sizeof(target), 0x3c),
	       "the RDMA WRITE landed in this process instead of B");
	say(3);
	CHECK_EQ(hear(), 3);

	sv_step("teardown");
	sv_wait_peer(child, "B");
	sv_one_qp_close(&a);
	sv_pass();
	return 0;
}
