/*
 * mcast: UD multicast between hosts at the verbs level (tests/hosts/mcast_hosts.sh), a plain
 * verbs program run through `softverbs run`, like integrity.c.
 *
 *   mcast member GROUP     a UD QP; reads commands on stdin, one a line, and answers each on
 *                          stdout with one line:
 *        attach            ibv_attach_mcast to GROUP           -> "attached"
 *        detach            ibv_detach_mcast from GROUP         -> "detached"
 *        count TAG         what arrived from sender TAG        -> "count TAG N dup D"
 *        quit              destroys everything, exits 0         -> "bye"
 *   mcast send GROUP SGID COUNT TAG [HOP_LIMIT]
 *                          sends COUNT datagrams "TAG:seq" to GROUP (QPN 0xFFFFFF) from the
 *                          GID SGID (an address of this host), each completion checked.
 *
 * GROUP is an IPv4 (as its RoCE v2 GID ::ffff:a.b.c.d) or IPv6 multicast address. A member
 * checks every datagram: its GRH names GROUP as the destination, its payload is "TAG:seq";
 * duplicates are counted (a member must get each datagram exactly once).
 */
#include "common.h"

#include <arpa/inet.h>
#include <poll.h>

#define QKEY 0x1abc0de5u
#define MSG 32
#define GRH 40
#define RECVS 256
#define TAGS 26
#define MAX_SEQ 4096

static struct sv_dev dev;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static union ibv_gid group;

static void parse_gid(const char *text, union ibv_gid *gid)
{
	struct in_addr v4;
	memset(gid, 0, sizeof(*gid));
	if (inet_pton(AF_INET, text, &v4) == 1) {
		gid->raw[10] = gid->raw[11] = 0xff;
		memcpy(gid->raw + 12, &v4, 4);
		return;
	}
	CHECKF(inet_pton(AF_INET6, text, gid->raw) == 1, "not an address: %s", text);
}

static void setup(void)
{
	sv_open(&dev);
	cq = ibv_create_cq(dev.ctx, 2 * RECVS, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_UD;
	a.send_cq = a.recv_cq = cq;
	a.cap.max_send_wr = a.cap.max_recv_wr = RECVS;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.sq_sig_all = 1;
	qp = ibv_create_qp(dev.pd, &a);
	CHECK(qp != NULL);
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.port_num = 1;
	m.qkey = QKEY;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	m.qp_state = IBV_QPS_RTR;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE));
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 0;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN));
	mr = sv_alloc_mr(dev.pd, (size_t)RECVS * (GRH + MSG), IBV_ACCESS_LOCAL_WRITE);
}

static void teardown(void)
{
	CHECK_OK(ibv_destroy_qp(qp));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_free_mr(mr);
	sv_close(&dev);
}

static void post_recv(int slot)
{
	CHECK_OK(sv_post_recv(qp, (uint64_t)slot, mr, (size_t)slot * (GRH + MSG), GRH + MSG));
}

/* ---- member ------------------------------------------------------------------------- */

static int seen[TAGS][MAX_SEQ];

/* Takes every receive completion there is, checks it and posts its buffer again. */
static void drain(void)
{
	struct ibv_wc wc[16];
	int n;
	while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			CHECK_STATUS(wc[i], IBV_WC_SUCCESS);
			CHECK_OPCODE(wc[i], IBV_WC_RECV);
			CHECKF(wc[i].wc_flags & IBV_WC_GRH, "no GRH on a UD receive");
			CHECK_EQ(wc[i].byte_len, GRH + MSG);
			int slot = (int)wc[i].wr_id;
			const uint8_t *buf = sv_ptr(mr, (size_t)slot * (GRH + MSG));
			/* The destination is the group: the GRH's DGID (bytes 24..39), or over
			 * IPv4 the IPv4 header's in the area's last 20 bytes (bytes 36..39). */
			int v4 = group.raw[10] == 0xff && group.raw[11] == 0xff && !group.raw[0];
			CHECKF(v4 ? !memcmp(buf + 36, group.raw + 12, 4)
				  : !memcmp(buf + 24, group.raw, 16),
			       "a datagram not for the group");
			char text[MSG + 1];
			memcpy(text, buf + GRH, MSG);
			text[MSG] = 0;
			char tag = 0;
			int seq = -1;
			CHECKF(sscanf(text, "%c:%d", &tag, &seq) == 2 && tag >= 'a' && tag <= 'z' &&
				       seq >= 0 && seq < MAX_SEQ,
			       "a bad payload: '%s'", text);
			seen[tag - 'a'][seq]++;
			post_recv(slot);
		}
	}
	CHECK(n == 0);
}

static void answer_count(char tag)
{
	int got = 0, dup = 0;
	if (tag >= 'a' && tag <= 'z') {
		for (int s = 0; s < MAX_SEQ; s++) {
			got += seen[tag - 'a'][s] > 0;
			dup += seen[tag - 'a'][s] > 1 ? seen[tag - 'a'][s] - 1 : 0;
		}
	}
	printf("count %c %d dup %d\n", tag, got, dup);
}

static int member(void)
{
	setup();
	for (int i = 0; i < RECVS; i++)
		post_recv(i);
	printf("ready qpn 0x%06x\n", qp->qp_num);
	char line[64];
	for (;;) {
		struct pollfd p = {0, POLLIN, 0};
		int r = poll(&p, 1, 2);
		drain();
		if (r <= 0)
			continue;
		if (!fgets(line, sizeof(line), stdin))
			break; /* stdin closed: as quit */
		if (!strncmp(line, "attach", 6)) {
			CHECK_OK(ibv_attach_mcast(qp, &group, 0));
			printf("attached\n");
		} else if (!strncmp(line, "detach", 6)) {
			CHECK_OK(ibv_detach_mcast(qp, &group, 0));
			printf("detached\n");
		} else if (!strncmp(line, "count ", 6)) {
			answer_count(line[6]);
		} else if (!strncmp(line, "quit", 4)) {
			break;
		} else {
			printf("unknown command\n");
		}
	}
	teardown();
	printf("bye\n");
	return 0;
}

/* ---- sender ------------------------------------------------------------------------- */

static int sender(const char *sgid_text, int count, char tag, int hop_limit)
{
	setup();
	union ibv_gid sgid;
	parse_gid(sgid_text, &sgid);
	int index = -1;
	for (int i = 0; i < dev.port_attr.gid_tbl_len && index < 0; i++) {
		union ibv_gid g;
		if (ibv_query_gid(dev.ctx, 1, i, &g) == 0 && !memcmp(g.raw, sgid.raw, 16))
			index = i;
	}
	CHECKF(index >= 0, "%s is not in the GID table", sgid_text);
	struct ibv_ah_attr ah_attr;
	memset(&ah_attr, 0, sizeof(ah_attr));
	ah_attr.is_global = 1;
	ah_attr.grh.dgid = group;
	ah_attr.grh.sgid_index = (uint8_t)index;
	ah_attr.grh.hop_limit = (uint8_t)hop_limit;
	ah_attr.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(dev.pd, &ah_attr);
	CHECK(ah != NULL);
	for (int seq = 0; seq < count; seq++) {
		uint8_t *buf = sv_ptr(mr, 0);
		memset(buf, 0, MSG);
		snprintf((char *)buf, MSG, "%c:%d", tag, seq);
		struct ibv_sge sge = {sv_addr(mr, 0), MSG, mr->lkey};
		struct ibv_send_wr wr, *bad = NULL;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = (uint64_t)seq;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = 0xffffff;
		wr.wr.ud.remote_qkey = QKEY;
		CHECK_OK(ibv_post_send(qp, &wr, &bad));
		struct ibv_wc wc;
		sv_poll_one(cq, &wc);
		CHECK_WC(wc, (uint64_t)seq, IBV_WC_SUCCESS, qp);
		usleep(1000); /* paced: UD has no flow control, a member's receives are finite */
	}
	CHECK_OK(ibv_destroy_ah(ah));
	teardown();
	printf("sent %d\n", count);
	return 0;
}

static _Noreturn void usage(void)
{
	fprintf(stderr, "usage: mcast member GROUP\n"
			"       mcast send GROUP SGID COUNT TAG [HOP_LIMIT]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		usage();
	sv_init("mcast");
	sv_watchdog(30);
	parse_gid(argv[2], &group);
	if (!strcmp(argv[1], "member") && argc == 3)
		return member();
	if (!strcmp(argv[1], "send") && (argc == 6 || argc == 7)) {
		int count = atoi(argv[4]);
		CHECKF(count > 0 && count < MAX_SEQ, "COUNT is 1..%d", MAX_SEQ - 1);
		CHECKF(argv[5][0] >= 'a' && argv[5][0] <= 'z', "TAG is a letter a..z");
		return sender(argv[3], count, argv[5][0], argc == 7 ? atoi(argv[6]) : 64);
	}
	usage();
}
