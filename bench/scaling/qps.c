/*
 * bench/scaling/qps.c: many RC QPs between two processes of one host (bench/scale runs it).
 * Each process creates N RC QPs on one CQ, the two trade their QP numbers over a socket,
 * move every QP to RTS pointed at its partner, send one SEND from A to B on every k-th
 * connection (default: every one), and destroy them all. Prints, per process, the time per
 * QP of each phase and what the QPs cost in memory, connected and after the SENDs: resident
 * set (RSS) and shared memory (softverbs' memfds, which live in the kernel's shmem like
 * /dev/shm, plus the state directory).
 *
 * With -p ROUNDS, QP 0 then plays ROUNDS polled SEND ping-pongs (64 B) while every other
 * QP's receive window stays open and idle on the same CQ: the time a round trip takes as
 * the number of windows feeding one CQ grows (a poll must not look at every window).
 *
 *   scale_qps [-n QPS] [-k SAMPLES] [-p ROUNDS]     (through `softverbs run`)
 *
 * Output: one line per measurement, "side metric value unit", side A (parent) or B.
 */
#include "common.h"

#include <dirent.h>
#include <ftw.h>
#include <getopt.h>
#include <sys/stat.h>
#include <time.h>

static int nqps = 10000;
static int samples = -1;  /* -1: every QP */
static int rounds;        /* -p: ping-pongs on QP 0 */
static char side;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this process (all threads): on a shared machine wall time moves with the load. */
static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double rss_kib(void)
{
	long pages = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return resident * (sysconf(_SC_PAGESIZE) / 1024.0);
}

/* Bytes the softverbs memfds of this process hold (their pages are shared memory). */
static int add_memfd(const char *path, const char *target, void *arg)
{
	struct stat st;
	if (strncmp(target, "/memfd:softverbs", 16) == 0 && stat(path, &st) == 0)
		*(double *)arg += st.st_blocks * 512.0;
	return 0;
}

static double dir_bytes;
static int add_file(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)path, (void)flag, (void)ftw;
	dir_bytes += st->st_blocks * 512.0;
	return 0;
}

/* Shared memory in KiB: our memfds plus the state directory (every process's files). */
static double shm_kib(void)
{
	double memfd = 0;
	sv_each_fd(getpid(), add_memfd, &memfd);
	const char *dir = getenv("SOFTVERBS_STATE_DIR");
	char fallback[64];
	if (!dir || !*dir) {
		snprintf(fallback, sizeof(fallback), "/dev/shm/softverbs-%u", (unsigned)getuid());
		dir = fallback;
	}
	dir_bytes = 0;
	nftw(dir, add_file, 16, FTW_PHYS);
	return (memfd + dir_bytes) / 1024.0;
}

static void report(const char *metric, double value, const char *unit)
{
	printf("%c %s %.3f %s\n", side, metric, value, unit);
}

static void run(int sock)
{
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.max_send_wr = cfg.max_recv_wr = 16;
	cfg.max_send_sge = cfg.max_recv_sge = 1;
	struct ibv_cq *cq = ibv_create_cq(dev.ctx, nqps + 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_qp **qps = calloc(nqps, sizeof(*qps));
	uint32_t *ours = calloc(nqps, 4), *theirs = calloc(nqps, 4);
	CHECK(qps && ours && theirs);
	sv_say(sock, 0);
	CHECK_EQ(sv_hear(sock), 0);
	double rss0 = rss_kib(), shm0 = shm_kib();

	double c0 = cpu_s(), t0 = now_s();
	for (int i = 0; i < nqps; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = cfg.max_send_wr, .max_recv_wr = cfg.max_recv_wr,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		qps[i] = ibv_create_qp(dev.pd, &init);
		CHECKF(qps[i] != NULL, "ibv_create_qp #%d: %s", i, strerror(errno));
		ours[i] = qps[i]->qp_num;
	}
	double t1 = now_s(), c1 = cpu_s();
	sv_exchange(sock, ours, theirs, (size_t)nqps * 4);
	double c2 = cpu_s(), t2 = now_s();
	for (int i = 0; i < nqps; i++) {
		CHECK_OK(sv_modify_init(qps[i], &cfg));
		CHECK_OK(sv_modify_rtr(qps[i], &dev, theirs[i], &cfg));
		CHECK_OK(sv_modify_rts(qps[i], &cfg));
	}
	double t3 = now_s(), c3 = cpu_s();
	double rss1 = rss_kib(), shm1 = shm_kib();

	/* A sample of the connections (or every one) carries a SEND from A to B. */
	int step = samples > 0 && nqps / samples > 0 ? nqps / samples : 1;
	int sent = 0;
	if (side == 'B')
		for (int i = 0; i < nqps; i += step)
			CHECK_OK(sv_post_recv(qps[i], i, mr, 0, 64));
	sv_say(sock, 1);
	CHECK_EQ(sv_hear(sock), 1);
	/* From here until every SEND has completed on this side (B: every receive). */
	double ts0 = now_s(), cs0 = cpu_s();
	if (side == 'A')
		for (int i = 0; i < nqps; i += step, sent++)
			CHECK_OK(sv_post_send(qps[i], i, mr, 0, 64, IBV_SEND_SIGNALED));
	else
		for (int i = 0; i < nqps; i += step)
			sent++;
	for (int i = 0; i < sent; i++) {
		struct ibv_wc wc;
		CHECKF(sv_poll(cq, 1, &wc, SV_WAIT_MS) == 1, "%d of %d sample SENDs completed", i, sent);
		CHECK_STATUS(wc, IBV_WC_SUCCESS);
	}
	double ts1 = now_s(), cs1 = cpu_s();
	sv_say(sock, 2);
	CHECK_EQ(sv_hear(sock), 2);

	/* Ping-pong on QP 0, the other windows idle on the same CQ: A sends, B answers. */
	double tp0 = 0, tp1 = 0, cp0 = 0, cp1 = 0;
	if (rounds > 0) {
		CHECK_OK(sv_post_recv(qps[0], 0, mr, 0, 64));
		sv_say(sock, 3);
		CHECK_EQ(sv_hear(sock), 3);
		tp0 = now_s(), cp0 = cpu_s();
		for (int r = 0; r < rounds; r++) {
			struct ibv_wc wc;
			if (side == 'A')
				CHECK_OK(sv_post_send(qps[0], r, mr, 0, 64, IBV_SEND_SIGNALED));
			/* The receive, and (A, then B) the send's completion: two completions. */
			for (int got = 0; got < 2;) {
				int n = ibv_poll_cq(cq, 1, &wc);
				CHECK(n >= 0);
				if (n == 0)
					continue;
				CHECK_STATUS(wc, IBV_WC_SUCCESS);
				if (wc.opcode == IBV_WC_RECV) {
					CHECK_OK(sv_post_recv(qps[0], r + 1, mr, 0, 64));
					if (side == 'B')
						CHECK_OK(sv_post_send(qps[0], r, mr, 0, 64, IBV_SEND_SIGNALED));
				}
				got++;
			}
		}
		tp1 = now_s(), cp1 = cpu_s();
		sv_say(sock, 4);
		CHECK_EQ(sv_hear(sock), 4);
	}
	double rss_sent = rss_kib(), shm_sent = shm_kib();

	double c4 = cpu_s(), t4 = now_s();
	for (int i = 0; i < nqps; i++)
		CHECK_OK(ibv_destroy_qp(qps[i]));
	double t5 = now_s(), c5 = cpu_s();
	double rss2 = rss_kib(), shm2 = shm_kib();

	report("qps", nqps, "");
	report("create", (t1 - t0) * 1e6 / nqps, "us/qp");
	report("connect", (t3 - t2) * 1e6 / nqps, "us/qp");
	report("destroy", (t5 - t4) * 1e6 / nqps, "us/qp");
	report("create_cpu", (c1 - c0) * 1e6 / nqps, "us/qp");
	report("connect_cpu", (c3 - c2) * 1e6 / nqps, "us/qp");
	report("destroy_cpu", (c5 - c4) * 1e6 / nqps, "us/qp");
	report("rss", (rss1 - rss0) / nqps, "KiB/qp");
	report("shm", (shm1 - shm0) / nqps, "KiB/qp");
	report("rss_sent", (rss_sent - rss0) / nqps, "KiB/qp");
	report("shm_sent", (shm_sent - shm0) / nqps, "KiB/qp");
	report("rss_after_destroy", rss2 - rss0, "KiB");
	report("shm_after_destroy", shm2 - shm0, "KiB");
	report("sample_sends", sent, "");
	report("sends", sent ? (ts1 - ts0) * 1e6 / sent : 0, "us/send");
	report("sends_cpu", sent ? (cs1 - cs0) * 1e6 / sent : 0, "us/send");
	if (rounds > 0) {
		report("pingpong", (tp1 - tp0) * 1e6 / rounds, "us/round");
		report("pingpong_cpu", (cp1 - cp0) * 1e6 / rounds, "us/round");
	}
	fflush(stdout);
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	free(qps), free(ours), free(theirs);
}

static void peer_main(int sock)
{
	side = 'B';
	run(sock);
	exit(0);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "n:k:p:")) != -1) {
		if (c == 'n')
			nqps = atoi(optarg);
		else if (c == 'k')
			samples = atoi(optarg);
		else if (c == 'p')
			rounds = atoi(optarg);
		else {
			fprintf(stderr, "usage: scale_qps [-n QPS] [-k SAMPLES] [-p ROUNDS]\n");
			return 2;
		}
	}
	if (nqps < 1 || samples == 0 || samples < -1 || rounds < 0)
		return 2;
	sv_init("scale_qps");
	sv_watchdog(600);
	pid_t pid;
	int sock = sv_fork_peer(peer_main, &pid);
	side = 'A';
	run(sock);
	sv_wait_peer(pid, "B");
	return 0;
}
