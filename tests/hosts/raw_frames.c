/*
 * Raw packet QP frames between two hosts (raw_hosts.sh), on the interface named by
 * SOFTVERBS_RAW_NETDEV:
 *   raw_frames recv COUNT DPORT DSTMAC   a raw QP with a rule for frames to DSTMAC ("self":
 *                                        the interface's own MAC, printed) and UDP port
 *                                        DPORT; prints "ready MAC", then waits (10 s at most)
 *                                        for COUNT frames and prints
 *                                        "received N dup D bad B"; exit 0 when all came
 *                                        once and whole
 *   raw_frames send COUNT DPORT DSTMAC   COUNT numbered frames to DSTMAC, UDP port DPORT
 *                                        (and, first, COUNT to port DPORT+1, which the
 *                                        receiver's rule must keep out); prints "sent COUNT"
 */
#include "common.h"
#include "raw_helpers.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#define NAME "raw_frames"
#define FRAME 256
#define SLOTS 64

static void parse_mac(const char *s, uint8_t *mac)
{
	unsigned v[6];
	CHECKF(sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6,
	       "bad MAC %s", s);
	for (int i = 0; i < 6; ++i)
		mac[i] = (uint8_t)v[i];
}

static void own_mac(uint8_t *mac)
{
	const char *ifname = getenv("SOFTVERBS_RAW_NETDEV");
	CHECKF(ifname && strlen(ifname) < IFNAMSIZ, "SOFTVERBS_RAW_NETDEV is not set");
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct ifreq req;
	memset(&req, 0, sizeof(req));
	strcpy(req.ifr_name, ifname);
	CHECK(ioctl(s, SIOCGIFHWADDR, &req) == 0);
	memcpy(mac, req.ifr_hwaddr.sa_data, 6);
	close(s);
}

static void build(uint8_t *f, const uint8_t *dst, uint16_t dport, uint32_t seq)
{
	memset(f, 0, FRAME);
	memcpy(f, dst, 6);
	const uint8_t src[6] = {0x02, 0, 0, 0x11, 0x22, 0x33};
	memcpy(f + 6, src, 6);
	f[12] = 0x08;
	f[14] = 0x45;
	uint16_t tot = htons(FRAME - 14);
	memcpy(f + 16, &tot, 2);
	f[22] = 64;
	f[23] = 17;
	uint16_t dp = htons(dport), sp = htons(4000);
	memcpy(f + 34, &sp, 2);
	memcpy(f + 36, &dp, 2);
	uint32_t s = htonl(seq);
	memcpy(f + 42, &s, 4);
	for (int i = 46; i < FRAME; ++i)
		f[i] = (uint8_t)(seq * 7 + (uint32_t)i);
}

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	struct sv_dev d;
	uint8_t mac[6];
	sv_init(NAME);
	CHECKF(argc == 5, "usage: raw_frames recv|send COUNT DPORT DSTMAC");
	const int recv = strcmp(argv[1], "recv") == 0;
	const int count = atoi(argv[2]);
	const uint16_t dport = (uint16_t)atoi(argv[3]);
	CHECK(count > 0 && count <= 4096);
	if (strcmp(argv[4], "self") == 0)
		own_mac(mac);
	else
		parse_mac(argv[4], mac);
	sv_open(&d);
	struct ibv_cq *cq = sv_create_cq(&d, 2 * SLOTS, NULL, NULL);
	struct ibv_qp *qp = create_raw(&d, cq, SLOTS);
	CHECK(qp != NULL);
	CHECK_OK(modify_raw(qp));
	struct ibv_mr *mr = sv_alloc_mr(d.pd, (size_t)SLOTS * FRAME, IBV_ACCESS_LOCAL_WRITE);

	if (recv) {
		for (int i = 0; i < SLOTS; ++i)
			CHECK_OK(sv_post_recv(qp, (uint64_t)i, mr, (size_t)i * FRAME, FRAME));
		struct ibv_flow *flow = mac_port_rule(qp, mac, dport, 0);
		CHECK(flow != NULL);
		printf("ready %02x:%02x:%02x:%02x:%02x:%02x\n", mac[0], mac[1], mac[2], mac[3], mac[4],
		       mac[5]);
		fflush(stdout);
		uint8_t *seen = calloc((size_t)count, 1);
		int received = 0, dup = 0, bad = 0;
		int64_t deadline = now_ms() + 10000;
		while (received < count && now_ms() < deadline) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			CHECK(n >= 0);
			if (n == 0) {
				usleep(1000);
				continue;
			}
			uint8_t *f = sv_ptr(mr, (size_t)wc.wr_id * FRAME);
			uint32_t seq;
			memcpy(&seq, f + 42, 4);
			seq = ntohl(seq);
			uint8_t want[FRAME];
			if (wc.status != IBV_WC_SUCCESS || wc.byte_len != FRAME || seq >= (uint32_t)count) {
				++bad;
			} else {
				build(want, mac, dport, seq);
				if (memcmp(f, want, FRAME) != 0)
					++bad;
				else if (seen[seq]++)
					++dup;
				else
					++received;
			}
			CHECK_OK(sv_post_recv(qp, wc.wr_id, mr, (size_t)wc.wr_id * FRAME, FRAME));
		}
		printf("received %d dup %d bad %d\n", received, dup, bad);
		free(seen);
		CHECK_OK(ibv_destroy_flow(flow));
		CHECKF(received == count && dup == 0 && bad == 0, "not every frame came once, whole");
	} else {
		/* The other port first: the receiver's rule keeps those out. */
		for (int port = dport + 1; port >= dport; --port) {
			for (int i = 0; i < count; ++i) {
				struct ibv_wc wc;
				build(sv_ptr(mr, 0), mac, (uint16_t)port, (uint32_t)i);
				CHECK_OK(sv_post_send(qp, (uint64_t)i, mr, 0, FRAME, 0));
				sv_expect_wc(cq, (uint64_t)i, IBV_WC_SUCCESS, qp, &wc);
				if (i % 16 == 15)
					usleep(1000); /* paced: the receiver's socket is not a NIC ring */
			}
		}
		printf("sent %d\n", count);
	}
	CHECK_OK(ibv_destroy_qp(qp));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_free_mr(mr);
	sv_close(&d);
	sv_pass();
	return 0;
}
