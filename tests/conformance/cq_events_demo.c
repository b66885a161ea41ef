/*
 * cq_events_demo: RC ping-pong between two QPs of one process, in event mode.
 *
 * Like `ibv_rc_pingpong -e`: one completion channel, one CQ per QP, armed with
 * ibv_req_notify_cq; each wake-up is ibv_get_cq_event -> ibv_req_notify_cq -> poll until empty,
 * and the events are acked in one call per CQ at the end, as ibv_get_cq_event(3) suggests.
 * A sends a ping to B, B answers with a pong, ITERS times; then the program prints the volume,
 * time and throughput in ibv_rc_pingpong's format and exits 0.
 *
 * Usage: cq_events_demo [-n iterations] [-s size]     (defaults: 10000 iterations of 4096 B)
 */
#include "common.h"

#include <getopt.h>
#include <time.h>

#define RX_DEPTH 16

static struct sv_dev dev;
static struct sv_pair pair;
static struct ibv_mr *mr[2]; /* per side: [0, size) send buffer, then RX_DEPTH receive slots */
static uint32_t size = 4096;
static long iters = 10000;

static void post_recv(int side, uint64_t slot)
{
	CHECK_OK(sv_post_recv(pair.qp[side], slot, mr[side], (size_t)size * (1 + slot), size));
}

static void post_send(int side, uint32_t seq)
{
	memcpy(sv_ptr(mr[side], 0), &seq, sizeof(seq));
	CHECK_OK(sv_post_send(pair.qp[side], seq, mr[side], 0, size, IBV_SEND_SIGNALED));
}

int main(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "n:s:h")) != -1) {
		switch (opt) {
		case 'n':
			iters = atol(optarg);
			break;
		case 's':
			size = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		default:
			fprintf(stderr, "usage: %s [-n iterations] [-s size]\n", argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (iters < 1 || size < sizeof(uint32_t)) {
		fprintf(stderr, "%s: need iterations >= 1 and size >= 4\n", argv[0]);
		return 2;
	}
	sv_init("cq_events_demo");
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	cfg.shared_cq = 1;
	cfg.send_cqe = 2 * RX_DEPTH + 8;
	cfg.max_recv_wr = RX_DEPTH;
	cfg.max_send_wr = 8;
	cfg.max_send_sge = cfg.max_recv_sge = 1;
	cfg.max_inline_data = 0;
	struct ibv_comp_channel *ch = sv_pair_open_with_channel(&dev, &cfg, &pair);
	for (int side = 0; side < 2; side++) {
		mr[side] = sv_alloc_mr(dev.pd, (size_t)size * (1 + RX_DEPTH), SV_ACCESS_ALL);
		for (uint64_t slot = 0; slot < RX_DEPTH; slot++)
			post_recv(side, slot);
		CHECK_OK(ibv_req_notify_cq(pair.scq[side], 0));
	}
	printf("  local address:  QPN 0x%06x, PSN 0x%06x, GID index 0\n", pair.qp[0]->qp_num,
	       cfg.psn);
	printf("  remote address: QPN 0x%06x, PSN 0x%06x, GID index 0\n", pair.qp[1]->qp_num,
	       cfg.psn);

	unsigned events[2] = { 0, 0 };
	long pongs = 0, sends_done = 0;
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	post_send(0, 0);
	while (pongs < iters || sends_done < 2 * iters) {
		struct ibv_cq *cq;
		void *ctx;
		CHECKF(ibv_get_cq_event(ch, &cq, &ctx) == 0, "ibv_get_cq_event: %s", strerror(errno));
		int side = cq == pair.scq[0] ? 0 : 1;
		CHECK(cq == pair.scq[side]);
		CHECK(ctx == &pair.scq[side]);
		events[side]++;
		CHECK_OK(ibv_req_notify_cq(cq, 0));
		struct ibv_wc wc[8];
		int ne;
		while ((ne = ibv_poll_cq(cq, 8, wc)) > 0) {
			for (int i = 0; i < ne; i++) {
				CHECKF(wc[i].status == IBV_WC_SUCCESS, "side %c: wr_id %llu: %s",
				       'A' + side, (unsigned long long)wc[i].wr_id,
				       sv_wc_status_name(wc[i].status));
				if (wc[i].opcode == IBV_WC_SEND) {
					sends_done++;
					continue;
				}
				CHECK_OPCODE(wc[i], IBV_WC_RECV);
				CHECK_EQ(wc[i].byte_len, size);
				uint32_t seq;
				memcpy(&seq, sv_ptr(mr[side], (size_t)size * (1 + wc[i].wr_id)),
				       sizeof(seq));
				CHECK_EQ(seq, (uint32_t)pongs);
				post_recv(side, wc[i].wr_id);
				if (side == 1) {
					post_send(1, seq); /* B: pong */
				} else if (++pongs < iters) {
					post_send(0, (uint32_t)pongs); /* A: next ping */
				}
			}
		}
		CHECK(ne == 0);
	}
	clock_gettime(CLOCK_MONOTONIC, &end);

	ibv_ack_cq_events(pair.scq[0], events[0]);
	ibv_ack_cq_events(pair.scq[1], events[1]);

	double usec = (double)(end.tv_sec - start.tv_sec) * 1e6 +
		      (double)(end.tv_nsec - start.tv_nsec) / 1e3;
	long long bytes = (long long)size * iters * 2;
	printf("%lld bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec / 1e6,
	       bytes * 8. / usec);
	printf("%ld iters in %.2f seconds = %.2f usec/iter\n", iters, usec / 1e6, usec / iters);
	printf("%u + %u completion events\n", events[0], events[1]);

	for (int side = 0; side < 2; side++)
		sv_free_mr(mr[side]);
	sv_pair_destroy(&pair);
	CHECK_OK(ibv_destroy_comp_channel(ch));
	sv_close(&dev);
	sv_pass();
	return 0;
}
