/*
 * A peer that writes garbage into shared state must not crash, hang or corrupt us. A (the
 * parent) connects to B (the child), sends through B's receive window, then overwrites
 * everything B shares writably with peers (its arena: windows, CQ arm words and doorbells;
 * and its MR memfd) with random bytes, and keeps sending. B keeps polling, then tears down
 * normally; it may see errors, but it must exit cleanly on its own, and its memory outside
 * what it shares must be intact. B's published region (its MR table) is for peers to read
 * only: A checks that no way of writing to it, or of shrinking any of B's memfds, works.
 */
#include "common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define MSG 64
#define NRECV 64

static int sock;
static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* Fills [p, p + len) with xorshift garbage. */
static void fill(uint64_t *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len / 8; i++) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		p[i] = seed;
	}
}

/* Every way a peer could write to a published region, given its path in /proc/<pid>/fd,
 * must fail: reopened for writing, it takes no write(2), no shared writable mapping, no
 * change of size and no hole; reopened for reading, its mapping cannot be made writable. */
static void check_read_only(const char *path)
{
	uint64_t garbage[8];
	fill(garbage, sizeof(garbage), 0x5eed);
	int fd = open(path, O_RDWR);
	if (fd >= 0) {
		CHECK(pwrite(fd, garbage, sizeof(garbage), 4096) < 0);
		CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
		CHECK(ftruncate(fd, 0) != 0);
		CHECK(ftruncate(fd, 1 << 30) != 0);
		CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1 << 20) != 0);
		CHECK_OK(close(fd));
	}
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED);
	CHECK(mprotect(p, 4096, PROT_READ | PROT_WRITE) != 0);
	munmap(p, 4096);
	CHECK_OK(close(fd));
}

struct scribble {
	uint64_t seed;
	int found, published;
};

/* For sv_each_fd: checks that a published region cannot be written; overwrites an arena or
 * an MR memfd (up to 16 MiB of it) after checking that it cannot be shrunk. */
static int scribble_fd(const char *path, const char *target, void *arg)
{
	struct scribble *s = arg;
	if (strstr(target, "memfd:softverbs-published")) {
		check_read_only(path);
		s->published++;
		return 0;
	}
	if (!strstr(target, "memfd:softverbs-arena") && !strstr(target, "memfd:softverbs-mr"))
		return 0;
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return 0;
	struct stat st;
	CHECK_OK(fstat(fd, &st));
	/* Everyone who maps it would fault past the end. (An empty one, a peer's MR memfd
	 * the victim holds since its RTS opened our window, takes a "shrink" to 0 bytes.) */
	if (st.st_size > 0)
		CHECK(ftruncate(fd, 0) != 0);
	size_t len = (size_t)st.st_size < (16u << 20) ? (size_t)st.st_size : (16u << 20);
	if (len == 0) {
		CHECK_OK(close(fd));
		return 0;
	}
	uint64_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED);
	fill(p, len, s->seed);
	munmap(p, len);
	CHECK_OK(close(fd));
	s->found++;
	return 0;
}

/* Overwrites every memfd of process `pid` that peers may write (its arena and its MR memfd,
 * up to 16 MiB of each), after checking that they cannot be shrunk; checks that its
 * published region cannot be written at all. Returns how many memfds were overwritten. */
static int scribble(pid_t pid, uint64_t seed)
{
	struct scribble s = {seed, 0, 0};
	sv_each_fd(pid, scribble_fd, &s);
	CHECK(s.published >= 1);
	return s.found;
}

static void victim(int s)
{
	sock = s;
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = NRECV;
	struct sv_one_qp v;
	sv_one_qp_open(&v, &cfg, 4 * NRECV, NRECV * MSG);
	static uint8_t canary[4096];
	memset(canary, 0x3c, sizeof(canary));
	sv_one_qp_connect(&v, sv_trade_qpn(sock, v.qp), 0, NRECV, MSG);
	say(1);
	/* Poll for a while, whatever arrives and whatever state the QP ends up in. */
	long long end = sv_now_ms() + 1500;
	int got = 0;
	while (sv_now_ms() < end) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(v.cq, 16, wc);
		CHECK(n >= 0);
		got += n;
	}
	printf("victim: %d completions\n", got);
	for (size_t i = 0; i < sizeof(canary); i++)
		CHECK_EQ(canary[i], 0x3c);
	CHECK_OK(ibv_destroy_qp(v.qp));
	v.qp = NULL;
	/* The CQ outlives the QP: polling it must not look at the destroyed QP's window. */
	for (int i = 0; i < 1000; i++) {
		struct ibv_wc wc[16];
		CHECK(ibv_poll_cq(v.cq, 16, wc) >= 0);
	}
	sv_one_qp_close(&v);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_garbage");
	pid_t child;
	sock = sv_fork_peer(victim, &child);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.retry_cnt = 1;
	cfg.timeout = 10;
	struct sv_one_qp a;
	sv_one_qp_open(&a, &cfg, 256, MSG);
	sv_one_qp_connect(&a, sv_trade_qpn(sock, a.qp), 0, 0, 0);
	CHECK_EQ(hear(), 1);

	sv_step("messages through the victim's receive window");
	struct ibv_wc wc;
	for (int i = 0; i < 8; i++) {
		CHECK_OK(sv_post_send(a.qp, (uint64_t)i, a.mr, 0, MSG, IBV_SEND_SIGNALED));
		sv_expect_wc(a.cq, (uint64_t)i, IBV_WC_SUCCESS, a.qp, &wc);
	}

	sv_step("garbage over everything the victim shares, then more traffic");
	for (uint64_t round = 1; round <= 3; round++) {
		CHECK(scribble(child, 0x9e3779b97f4a7c15ull * round) >= 1);
		for (int i = 0; i < 8; i++) {
			if (sv_post_send(a.qp, 100 + (uint64_t)i, a.mr, 0, MSG, IBV_SEND_SIGNALED))
				break; /* the QP may be in error by now: fine */
			sv_poll(a.cq, 1, &wc, 2000); /* any status */
		}
	}

	sv_step("the victim tears down on its own");
	sv_wait_peer(child, "the victim");
	sv_modify_state(a.qp, IBV_QPS_ERR);
	while (ibv_poll_cq(a.cq, 1, &wc) > 0)
		;
	sv_one_qp_close(&a);
	sv_pass();
	return 0;
}
