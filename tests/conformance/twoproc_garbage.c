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

#include <dirent.h>
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

/* Overwrites every memfd of process `pid` that peers may write (its arena and its MR memfd,
 * up to 16 MiB of each), after checking that they cannot be shrunk; checks that its
 * published region cannot be written at all. Returns how many memfds were overwritten. */
static int scribble(pid_t pid, uint64_t seed)
{
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	int found = 0, published = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char path[512], target[256];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (strstr(target, "memfd:softverbs-published")) {
			check_read_only(path);
			published++;
			continue;
		}
		if (!strstr(target, "memfd:softverbs-arena") && !strstr(target, "memfd:softverbs-mr"))
			continue;
		int fd = open(path, O_RDWR);
		if (fd < 0)
			continue;
		struct stat st;
		CHECK_OK(fstat(fd, &st));
		CHECK(ftruncate(fd, 0) != 0); /* everyone who maps it would fault past the end */
		size_t len = (size_t)st.st_size < (16u << 20) ? (size_t)st.st_size : (16u << 20);
		if (len == 0) {
			CHECK_OK(close(fd));
			continue;
		}
		uint64_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		CHECK(p != MAP_FAILED);
		fill(p, len, seed);
		munmap(p, len);
		CHECK_OK(close(fd));
		found++;
	}
	closedir(d);
	CHECK(published >= 1);
	return found;
}

static void victim(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_recv_wr = NRECV;
	struct ibv_cq *cq = sv_create_cq(&dev, 4 * NRECV, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, NRECV * MSG, SV_ACCESS_ALL);
	static uint8_t canary[4096];
	memset(canary, 0x3c, sizeof(canary));
	uint32_t peer, me = qp->qp_num;
	sv_exchange(sock, &me, &peer, sizeof(me));
	CHECK_OK(sv_modify_init(qp, &cfg));
	for (int i = 0; i < NRECV; i++)
		CHECK_OK(sv_post_recv(qp, (uint64_t)i, mr, (size_t)i * MSG, MSG));
	CHECK_OK(sv_modify_rtr(qp, &dev, peer, &cfg));
	CHECK_OK(sv_modify_rts(qp, &cfg));
	say(1);
	/* Poll for a while, whatever arrives and whatever state the QP ends up in. */
	long long end = sv_now_ms() + 1500;
	int got = 0;
	while (sv_now_ms() < end) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(cq, 16, wc);
		CHECK(n >= 0);
		got += n;
	}
	printf("victim: %d completions\n", got);
	for (size_t i = 0; i < sizeof(canary); i++)
		CHECK_EQ(canary[i], 0x3c);
	CHECK_OK(ibv_destroy_qp(qp));
	/* The CQ outlives the QP: polling it must not look at the destroyed QP's window. */
	for (int i = 0; i < 1000; i++) {
		struct ibv_wc wc[16];
		CHECK(ibv_poll_cq(cq, 16, wc) >= 0);
	}
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_garbage");
	pid_t child;
	sock = sv_fork_peer(victim, &child);
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.retry_cnt = 1;
	cfg.timeout = 10;
	struct ibv_cq *cq = sv_create_cq(&dev, 256, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, MSG, SV_ACCESS_ALL);
	uint32_t peer, me = qp->qp_num;
	sv_exchange(sock, &me, &peer, sizeof(me));
	CHECK_OK(sv_modify_init(qp, &cfg));
	CHECK_OK(sv_modify_rtr(qp, &dev, peer, &cfg));
	CHECK_OK(sv_modify_rts(qp, &cfg));
	CHECK_EQ(hear(), 1);

	sv_step("messages through the victim's receive window");
	struct ibv_wc wc;
	for (int i = 0; i < 8; i++) {
		CHECK_OK(sv_post_send(qp, (uint64_t)i, mr, 0, MSG, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, (uint64_t)i, IBV_WC_SUCCESS, qp, &wc);
	}

	sv_step("garbage over everything the victim shares, then more traffic");
	for (uint64_t round = 1; round <= 3; round++) {
		CHECK(scribble(child, 0x9e3779b97f4a7c15ull * round) >= 1);
		for (int i = 0; i < 8; i++) {
			if (sv_post_send(qp, 100 + (uint64_t)i, mr, 0, MSG, IBV_SEND_SIGNALED))
				break; /* the QP may be in error by now: fine */
			sv_poll(cq, 1, &wc, 2000); /* any status */
		}
	}

	sv_step("the victim tears down on its own");
	sv_wait_peer(child, "the victim");
	sv_modify_state(qp, IBV_QPS_ERR);
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
