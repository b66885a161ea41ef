/*
 * Raw Ethernet frame ping-pong between two processes on one interface, through raw packet
 * QPs (docs/raw-packet.md) or, as the floor, through plain AF_PACKET sockets (what the
 * kernel alone costs). Run by bench/raw; root (CAP_NET_RAW).
 *   raw_pingpong verbs|socket server|client IFACE ITERS SIZE
 * Frames go to a group MAC (so the interface's loopback hands them over on any link), UDP
 * port 5001 for pings and 5002 for pongs; each side takes only its port. The client prints
 * "rtt_median_us X rtt_mean_us Y" over ITERS round trips (after 1,000 not counted). Both
 * sides busy-poll: ibv_poll_cq, or recv(MSG_DONTWAIT). RAW_PINGPONG_EVENTS=1: the verbs
 * sides wait for receives through a completion channel instead (arm, poll, sleep).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "raw_helpers.h" /* tests/conformance: the raw QP's states, its steering rule */

#define WARMUP 1000
#define SLOTS 64

static const uint8_t kGroup[6] = {0x01, 0x00, 0x5e, 0x00, 0x00, 0x51};

static void die(const char *what)
{
	fprintf(stderr, "raw_pingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void build(uint8_t *f, size_t size, uint16_t dport)
{
	memset(f, 0, size);
	memcpy(f, kGroup, 6);
	const uint8_t src[6] = {0x02, 0, 0, 0, 0, 0x51};
	memcpy(f + 6, src, 6);
	f[12] = 0x08;
	f[14] = 0x45;
	uint16_t tot = htons((uint16_t)(size - 14)), dp = htons(dport), ul = htons((uint16_t)(size - 34));
	memcpy(f + 16, &tot, 2);
	f[22] = 64;
	f[23] = 17;
	memcpy(f + 36, &dp, 2);
	memcpy(f + 38, &ul, 2);
}

static uint16_t dport_of(const uint8_t *f, size_t len)
{
	if (len < 38 || f[12] != 0x08 || f[13] != 0x00 || f[23] != 17)
		return 0;
	uint16_t dp;
	memcpy(&dp, f + 36, 2);
	return ntohs(dp);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(double *rtt, int n)
{
	double sum = 0;
	for (int i = 0; i < n; ++i)
		sum += rtt[i];
	qsort(rtt, (size_t)n, sizeof(double), cmp_double);
	printf("rtt_median_us %.2f rtt_mean_us %.2f\n", rtt[n / 2], sum / n);
}

/* ---- the floor: AF_PACKET sockets -------------------------------------------------------- */

static int run_socket(int client, const char *iface, int iters, size_t size)
{
	int ifindex = (int)if_nametoindex(iface);
	if (!ifindex)
		die("if_nametoindex");
	int rx = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
	int tx = socket(AF_PACKET, SOCK_RAW, 0);
	if (rx < 0 || tx < 0)
		die("socket(AF_PACKET)");
	struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex};
	if (bind(rx, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("bind rx");
	a.sll_protocol = 0;
	if (bind(tx, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("bind tx");
	uint8_t out[9000], in[70000];
	const uint16_t mine = client ? 5002 : 5001, theirs = client ? 5001 : 5002;
	build(out, size, theirs);
	int total = iters + WARMUP;
	double *rtt = calloc((size_t)total, sizeof(double));
	for (int i = 0; i < total; ++i) {
		double t0 = now_us();
		if (client && send(tx, out, size, 0) < 0)
			die("send");
		for (;;) {
			struct sockaddr_ll from;
			socklen_t fl = sizeof(from);
			ssize_t n = recvfrom(rx, in, sizeof(in), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
			if (n < 0)
				continue;
			if (from.sll_pkttype == PACKET_OUTGOING && !strcmp(iface, "lo"))
				continue;
			if (dport_of(in, (size_t)n) == mine)
				break;
		}
		if (!client && send(tx, out, size, 0) < 0)
			die("send");
		rtt[i] = now_us() - t0;
	}
	if (client)
		report(rtt + WARMUP, iters);
	return 0;
}

/* ---- softverbs: raw packet QPs ----------------------------------------------------------- */

static int run_verbs(int client, int iters, size_t size)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 2 * SLOTS, NULL, NULL, 0);
	const int events = getenv("RAW_PINGPONG_EVENTS") != NULL;
	struct ibv_comp_channel *ch = events ? ibv_create_comp_channel(ctx) : NULL;
	struct ibv_cq *rcq = ibv_create_cq(ctx, 2 * SLOTS, NULL, ch, 0);
	uint8_t *buf = aligned_alloc(4096, (SLOTS + 1) * 16384);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, (SLOTS + 1) * 16384, IBV_ACCESS_LOCAL_WRITE);
	if (!ctx || !pd || !scq || !rcq || !mr)
		die("setup");
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RAW_PACKET,
				      .cap = {.max_send_wr = SLOTS, .max_recv_wr = SLOTS, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		die("ibv_create_qp (raw packet: root?)");
	if (modify_raw(qp))
		die("ibv_modify_qp to RTS");
	const uint16_t mine = client ? 5002 : 5001, theirs = client ? 5001 : 5002;
	for (int i = 0; i < SLOTS; ++i) {
		struct ibv_sge sge = {(uintptr_t)(buf + (size_t)i * 16384), 16384, mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			die("post_recv");
	}
	struct ibv_flow *flow = mac_port_rule(qp, kGroup, mine, 0);
	if (!flow)
		die("ibv_create_flow");
	uint8_t *out = buf + (size_t)SLOTS * 16384;
	build(out, size, theirs);
	struct ibv_sge ssge = {(uintptr_t)out, (uint32_t)size, mr->lkey};
	struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED}, *sbad;
	int total = iters + WARMUP;
	double *rtt = calloc((size_t)total, sizeof(double));
	for (int i = 0; i < total; ++i) {
		double t0 = now_us();
		struct ibv_wc wc;
		if (client && ibv_post_send(qp, &swr, &sbad))
			die("post_send");
		while ((n = ibv_poll_cq(rcq, 1, &wc)) == 0) {
			if (!events)
				continue;
			/* The usual event loop: arm, poll once more, then sleep. */
			if (ibv_req_notify_cq(rcq, 0))
				die("req_notify");
			if ((n = ibv_poll_cq(rcq, 1, &wc)) != 0)
				break;
			struct ibv_cq *ev_cq;
			void *ev_ctx;
			if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx))
				die("get_cq_event");
			ibv_ack_cq_events(ev_cq, 1);
		}
		if (n < 0 || wc.status != IBV_WC_SUCCESS)
			die("receive completion");
		struct ibv_sge sge = {(uintptr_t)(buf + wc.wr_id * 16384), 16384, mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			die("post_recv");
		if (!client && ibv_post_send(qp, &swr, &sbad))
			die("post_send");
		while ((n = ibv_poll_cq(scq, 1, &wc)) == 0) {
		}
		if (n < 0 || wc.status != IBV_WC_SUCCESS)
			die("send completion");
		rtt[i] = now_us() - t0;
	}
	if (client)
		report(rtt + WARMUP, iters);
	ibv_destroy_flow(flow);
	ibv_destroy_qp(qp);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: raw_pingpong verbs|socket server|client IFACE ITERS SIZE\n");
		return 2;
	}
	int client = !strcmp(argv[2], "client");
	int iters = atoi(argv[4]);
	size_t size = (size_t)atoi(argv[5]);
	if (iters <= 0 || size < 64 || size > 8192) {
		fprintf(stderr, "raw_pingpong: ITERS > 0, 64 <= SIZE <= 8192\n");
		return 2;
	}
	if (!strcmp(argv[1], "socket"))
		return run_socket(client, argv[3], iters, size);
	setenv("SOFTVERBS_RAW_NETDEV", argv[3], 1);
	return run_verbs(client, iters, size);
}
