/*
 * A/B of the two post-send APIs on one QP: ibv_post_send against ibv_wr_start, ibv_wr_<op>,
 * ibv_wr_complete, for a signaled RDMA WRITE (8 bytes inline, 4 KiB) and an 8-byte RDMA READ
 * to a peer process, each posted and its completion polled before the next (what ib_*_lat
 * costs the requester). perftest cannot make this comparison on softverbs: it forces the old
 * API on every device but Mellanox's and EFA (docs/qp-ex.md). The two APIs alternate in
 * blocks, so that whatever else the machine does falls on both; per API it prints the
 * median and the minimum of the blocks' mean time per operation.
 *   wr_api_ab [BLOCKS [OPS_PER_BLOCK [local]]]   (run it through `softverbs run`)
 * `local`: the peer QP is in the same process (no fork), which valgrind can run (it lacks
 * pidfd_open, which a peer process needs): for counting instructions per operation, e.g.
 *   softverbs run -- valgrind --tool=callgrind wr_api_ab 2 1000 local
 * then callgrind_annotate --inclusive=yes (docs/qp-ex.md, "Cost per operation").
 */
#include "common.h"

#include <time.h>

static int sock;

static void peer(int s)
{
	sock = s;
	struct sv_one_qp p;
	sv_one_qp_open(&p, NULL, 64, 1 << 16);
	struct sv_remote r;
	sv_trade_remote(sock, p.qp, p.mr, &r);
	sv_one_qp_connect(&p, r.qpn, 0, 0, 0);
	sv_say(sock, 1);
	sv_hear(sock); /* until the requester is done */
	sv_one_qp_close(&p);
	exit(0);
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int blocks = argc > 1 ? atoi(argv[1]) : 200, per = argc > 2 ? atoi(argv[2]) : 500;
	int local = argc > 3 && strcmp(argv[3], "local") == 0;
	sv_init("wr_api_ab");
	pid_t pid = 0;
	if (!local)
		sock = sv_fork_peer(peer, &pid);
	struct sv_one_qp p;
	memset(&p, 0, sizeof(p));
	sv_open(&p.dev);
	sv_pair_cfg_init(&p.cfg);
	p.cq = sv_create_cq(&p.dev, 64, NULL, NULL);
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = p.cq;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.qp_type = IBV_QPT_RC;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = p.dev.pd;
	a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
	p.qp = ibv_create_qp_ex(p.dev.ctx, &a);
	CHECK(p.qp != NULL);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(p.qp);
	CHECK(qx != NULL);
	p.mr = sv_alloc_mr(p.dev.pd, 1 << 16, SV_ACCESS_ALL);
	struct sv_remote r;
	struct ibv_qp *local_peer = NULL;
	struct ibv_cq *local_cq = NULL;
	if (local) {
		local_cq = sv_create_cq(&p.dev, 64, NULL, NULL);
		local_peer = sv_create_qp(&p.dev, &p.cfg, local_cq, local_cq, NULL, NULL);
		sv_connect(&p.dev, p.qp, local_peer, &p.cfg);
		r.addr = sv_addr(p.mr, 0);
		r.rkey = p.mr->rkey;
	} else {
		sv_trade_remote(sock, p.qp, p.mr, &r);
		sv_one_qp_connect(&p, r.qpn, 0, 0, 0);
		CHECK_EQ(sv_hear(sock), 1);
	}

	const struct {
		const char *name;
		enum ibv_wr_opcode op;
		uint32_t len;
		unsigned flags;
	} ops[] = {
		{"RDMA WRITE 8 B inline", IBV_WR_RDMA_WRITE, 8, IBV_SEND_INLINE},
		{"RDMA WRITE 4 KiB", IBV_WR_RDMA_WRITE, 4096, 0},
		{"RDMA READ 8 B", IBV_WR_RDMA_READ, 8, 0},
	};
	double *t[2];
	t[0] = calloc(blocks, sizeof(double));
	t[1] = calloc(blocks, sizeof(double));
	for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
		struct ibv_sge sg = {sv_addr(p.mr, 8192), ops[k].len, p.mr->lkey};
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof(wr));
		wr.opcode = ops[k].op;
		wr.sg_list = &sg;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED | ops[k].flags;
		wr.wr.rdma.remote_addr = r.addr;
		wr.wr.rdma.rkey = r.rkey;
		for (int b = 0; b < blocks; b++) {
			for (int api = 0; api < 2; api++) {
				double t0 = now_ns();
				for (int i = 0; i < per; i++) {
					if (api == 0) {
						CHECK_OK(ibv_post_send(p.qp, &wr, &bad));
					} else {
						ibv_wr_start(qx);
						qx->wr_id = 0;
						qx->wr_flags = wr.send_flags;
						if (ops[k].op == IBV_WR_RDMA_WRITE)
							ibv_wr_rdma_write(qx, r.rkey, r.addr);
						else
							ibv_wr_rdma_read(qx, r.rkey, r.addr);
						ibv_wr_set_sge(qx, sg.lkey, sg.addr, sg.length);
						CHECK_OK(ibv_wr_complete(qx));
					}
					struct ibv_wc wc;
					int n;
					while ((n = ibv_poll_cq(p.cq, 1, &wc)) == 0)
						;
					CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
				}
				t[api][b] = (now_ns() - t0) / per;
			}
		}
		for (int api = 0; api < 2; api++)
			qsort(t[api], blocks, sizeof(double), cmp);
		printf("%-22s ibv_post_send median %7.1f ns min %7.1f | ibv_wr_* median %7.1f ns min %7.1f\n",
		       ops[k].name, t[0][blocks / 2], t[0][0], t[1][blocks / 2], t[1][0]);
	}
	if (local) {
		CHECK_OK(ibv_destroy_qp(local_peer));
		CHECK_OK(ibv_destroy_cq(local_cq));
	} else {
		sv_say(sock, 2);
	}
	sv_free_mr(p.mr);
	p.mr = NULL;
	sv_one_qp_close(&p);
	if (!local)
		sv_wait_peer(pid, "peer");
	sv_pass();
	return 0;
}
