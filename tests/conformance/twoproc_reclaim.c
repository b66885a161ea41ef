/*
 * A long-lived process that talks to many short-lived peers gives back what each one cost
 * it: the peer's memory it mapped (arena, published region, MR memfd) once none of its QPs
 * uses it any more, and the receive window in its own arena once the peer that wrote into
 * it is gone. ROUNDS rounds: start a peer (sv_spawn_peer), connect, SEND both ways (receive
 * windows), RDMA WRITE into the peer's MR (its MR memfd, mapped here), then the peer exits
 * (every other round we SIGKILL it instead), we reap it and destroy our QP. Checked: every message
 * lands; after the last round we map no more softverbs memfds than after the first; and
 * the resident size of the arenas we map did not grow with the number of peers.
 * (softverbs-specific: reads /proc/self/maps and /proc/self/smaps.)
 */
#include "common.h"

#include <ctype.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define ROUNDS 24
#define SMALL 64

static int sock;
static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* Distinct softverbs memfds mapped here (by inode). */
static int mapped_memfds(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f != NULL);
	unsigned long inodes[256];
	int n = 0;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "memfd:softverbs-"))
			continue;
		unsigned long inode = 0;
		CHECK(sscanf(line, "%*s %*s %*s %*s %lu", &inode) == 1);
		int seen = 0;
		for (int i = 0; i < n; i++)
			seen |= inodes[i] == inode;
		if (!seen && n < 256)
			inodes[n++] = inode;
	}
	fclose(f);
	return n;
}

/* Is this smaps line the header of a mapping ("start-end perms ...")? */
static int vma_header(const char *l)
{
	const char *p = l;
	while (isxdigit((unsigned char)*p))
		p++;
	return p > l && *p == '-';
}

/* Resident kB of every arena mapped here (ours and peers'). */
static long arena_rss_kb(void)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	CHECK(f != NULL);
	long total = 0, kb;
	int in_arena = 0;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		if (vma_header(line))
			in_arena = strstr(line, "memfd:softverbs-arena") != NULL;
		else if (in_arena && sscanf(line, "Rss: %ld kB", &kb) == 1)
			total += kb;
	}
	fclose(f);
	return total;
}

static void peer_main(int s)
{
	sock = s;
	struct sv_one_qp b;
	sv_one_qp_open(&b, NULL, 16, 4 * SMALL);
	struct sv_remote peer;
	sv_trade_remote(sock, b.qp, b.mr, &peer);
	int round = hear();
	sv_one_qp_connect(&b, peer.qpn, 1, 1, SMALL);
	CHECK_EQ(hear(), 1); /* the survivor is at RTS with a receive posted */

	struct ibv_wc wc;
	memset(sv_ptr(b.mr, 2 * SMALL), 0x10 + round, SMALL);
	CHECK_OK(sv_post_send(b.qp, 2, b.mr, 2 * SMALL, SMALL, IBV_SEND_SIGNALED));
	sv_expect_wc(b.cq, 2, IBV_WC_SUCCESS, b.qp, &wc);
	say(1);

	CHECK_EQ(hear(), 2); /* its SEND and RDMA WRITE are done */
	sv_expect_wc(b.cq, 1, IBV_WC_SUCCESS, b.qp, &wc);
	CHECK_EQ(sv_ptr(b.mr, 0)[0], 0x40 + round);
	CHECK_EQ(sv_ptr(b.mr, 0)[SMALL - 1], 0x40 + round);
	CHECK_EQ(sv_ptr(b.mr, SMALL)[0], 0x70 + round);
	CHECK_EQ(sv_ptr(b.mr, SMALL)[SMALL - 1], 0x70 + round);
	say(3);
	char eof;
	CHECK(read(sock, &eof, 1) == 0); /* until the survivor closes the socket */
}

int main(int argc, char **argv)
{
	int peer_sock = sv_spawned_peer(argc, argv);
	sv_init("twoproc_reclaim");
	if (peer_sock >= 0) {
		peer_main(peer_sock);
		_exit(0); /* as a forked peer ends: its verbs objects go with the process */
	}
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4 * SMALL, SV_ACCESS_ALL);
	int memfds_after_first = 0;
	long rss_after_second = 0;

	sv_step("%d short-lived peers, one after the other", ROUNDS);
	for (int round = 0; round < ROUNDS; round++) {
		pid_t child;
		/* Spawned, not forked: this process's softverbs threads are running. */
		sock = sv_spawn_peer(&child);
		struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		struct sv_remote peer;
		sv_trade_remote(sock, qp, mr, &peer);
		say(round);
		sv_connect_remote(qp, &dev, &cfg, peer.qpn, mr, 100 + round, 1, SMALL);
		say(1);

		struct ibv_wc wc;
		CHECK_EQ(hear(), 1);
		sv_expect_wc(cq, 100 + round, IBV_WC_SUCCESS, qp, &wc);
		CHECK_EQ(wc.byte_len, SMALL);
		CHECK_EQ(sv_ptr(mr, 0)[0], 0x10 + round);
		CHECK_EQ(sv_ptr(mr, 0)[SMALL - 1], 0x10 + round);

		memset(sv_ptr(mr, SMALL), 0x40 + round, SMALL);
		memset(sv_ptr(mr, 2 * SMALL), 0x70 + round, SMALL);
		CHECK_OK(sv_post_send(qp, 200 + round, mr, SMALL, SMALL, IBV_SEND_SIGNALED));
		sv_expect_wc(cq, 200 + round, IBV_WC_SUCCESS, qp, &wc);
		CHECK_OK(sv_post_rdma(qp, 300 + round, IBV_WR_RDMA_WRITE, mr, 2 * SMALL, SMALL,
				      IBV_SEND_SIGNALED, peer.addr + SMALL, peer.rkey));
		sv_expect_wc(cq, 300 + round, IBV_WC_SUCCESS, qp, &wc);
		say(2);

		if (round % 2) {
			CHECK_OK(kill(child, SIGKILL));
		} else {
			CHECK_EQ(hear(), 3);
		}
		close(sock);
		int status;
		CHECK(waitpid(child, &status, 0) == child);
		if (!(round % 2))
			CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		/* Still mapped: our QP's window into the peer is open (the test exercises it). */
		int connected = mapped_memfds();
		CHECK_OK(ibv_destroy_qp(qp));
		CHECK(mapped_memfds() < connected);

		if (round == 0)
			memfds_after_first = mapped_memfds();
		if (round == 1)
			rss_after_second = arena_rss_kb();
	}

	sv_step("the peers' memory is unmapped and their windows are reused");
	int memfds = mapped_memfds();
	long rss = arena_rss_kb();
	printf("softverbs memfds mapped: %d after the first peer, %d after the last\n",
	       memfds_after_first, memfds);
	printf("arena resident size: %ld kB after the second peer, %ld kB after the last\n",
	       rss_after_second, rss);
	CHECK(memfds_after_first > 0);
	CHECK_EQ(memfds, memfds_after_first);
	/* A window is ~140 kB: ROUNDS of them, never reused, would add ~3 MB. */
	CHECK(rss <= rss_after_second + 64);

	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	sv_close(&dev);
	sv_pass();
	return 0;
}
