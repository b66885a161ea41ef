/*
 * Device memory between two processes (ibv_alloc_dm(3), ibv_reg_dm_mr), on the same host or
 * (hosts.twoproc.dm) between hosts. B (child) allocates device memory and registers two
 * zero-based MRs on it: one at DM offset 0 (page aligned) and one at offset 4100. A (parent)
 * RDMA WRITEs into the first, READs from the second, SENDs into a receive posted on the
 * first, and WRITEs from device memory of its own; B checks with ibv_memcpy_from_dm. A WRITE
 * past the MR's end gives IBV_WC_REM_ACCESS_ERR. The API: sizes above max_dm_size and
 * unknown comp_mask bits are EINVAL, copies must be 4-byte aligned (EINVAL) and inside the
 * allocation (EFAULT), DM MRs must be zero based and inside the allocation, ibv_free_dm is
 * EBUSY while an MR uses it, and ibv_import_dm from an imported context sees the same bytes.
 */
#include "common.h"

#define DM_LEN 8192
#define MR1_OFF 4100
#define MR1_LEN 2048

static int sock;

struct target_info {
	uint32_t qpn[2];
	uint32_t rkey0, rkey1;
};

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

static void check_fill(const uint8_t *p, size_t n, uint8_t seed, const char *what)
{
	for (size_t i = 0; i < n; i++)
		CHECKF(p[i] == (uint8_t)(seed + i * 7), "%s: byte %zu is 0x%x", what, i, p[i]);
}

static struct ibv_dm *alloc_dm(struct ibv_context *ctx, size_t len)
{
	struct ibv_alloc_dm_attr attr = {.length = len};
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &attr);
	CHECKF(dm != NULL, "ibv_alloc_dm(%zu) failed: %s", len, strerror(errno));
	return dm;
}

static struct ibv_mr *reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t off, size_t len,
				unsigned access)
{
	struct ibv_mr *mr = ibv_reg_dm_mr(pd, dm, off, len, access | IBV_ACCESS_ZERO_BASED);
	CHECKF(mr != NULL, "ibv_reg_dm_mr(%llu, %zu) failed: %s", (unsigned long long)off, len,
	       strerror(errno));
	CHECK(mr->addr == NULL); /* zero based, as rdma-core reports it */
	CHECK_EQ(mr->length, len);
	return mr;
}

static void target(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_qp *qp[2];
	struct target_info me, peer;
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		me.qpn[i] = qp[i]->qp_num;
	}
	struct ibv_dm *dm = alloc_dm(dev.ctx, DM_LEN);
	unsigned access = SV_ACCESS_ALL & ~IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *mr0 = reg_dm_mr(dev.pd, dm, 0, 4096, access);
	struct ibv_mr *mr1 = reg_dm_mr(dev.pd, dm, MR1_OFF, MR1_LEN, access);
	uint8_t pattern[MR1_LEN];
	fill(pattern, MR1_LEN, 0x31);
	CHECK_OK(ibv_memcpy_to_dm(dm, MR1_OFF, pattern, MR1_LEN));
	me.rkey0 = mr0->rkey;
	me.rkey1 = mr1->rkey;
	sv_exchange(sock, &me, &peer, sizeof(me));
	for (int i = 0; i < 2; i++) {
		sv_trade_gid(sock, qp[i]);
		CHECK_OK(sv_modify_init(qp[i], &cfg));
		CHECK_OK(sv_modify_rtr(qp[i], &dev, peer.qpn[i], &cfg));
		CHECK_OK(sv_modify_rts(qp[i], &cfg));
	}
	/* a receive in device memory: zero-based address 2048 of mr0 */
	struct ibv_sge sge = {.addr = 2048, .length = 256, .lkey = mr0->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK_OK(ibv_post_recv(qp[0], &rwr, &bad));
	say(1);

	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;
	sv_expect_wc(cq, 9, IBV_WC_SUCCESS, qp[0], &wc);
	CHECK_EQ(wc.byte_len, 256);
	uint8_t got[1024];
	CHECK_OK(ibv_memcpy_from_dm(got, dm, 512, 1024));
	check_fill(got, 1024, 0x11, "WRITE into device memory");
	CHECK_OK(ibv_memcpy_from_dm(got, dm, 2048, 256));
	check_fill(got, 256, 0x22, "SEND into device memory");
	CHECK_OK(ibv_memcpy_from_dm(got, dm, 3072, 512));
	check_fill(got, 512, 0x44, "WRITE from A's device memory");
	CHECK_EQ(sv_query_state(qp[1]), IBV_QPS_ERR); /* the WRITE past mr0's end */
	say(2);

	CHECK_EQ(hear(), 3);
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_OK(ibv_dereg_mr(mr0));
	CHECK_OK(ibv_dereg_mr(mr1));
	CHECK_OK(ibv_free_dm(dm));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

static void check_api(struct sv_dev *dev)
{
	struct ibv_device_attr_ex attr;
	CHECK_OK(ibv_query_device_ex(dev->ctx, NULL, &attr));
	CHECK(attr.max_dm_size >= DM_LEN);
	struct ibv_alloc_dm_attr big = {.length = attr.max_dm_size + 1};
	CHECK(ibv_alloc_dm(dev->ctx, &big) == NULL);
	CHECK_EQ(errno, EINVAL);
	struct ibv_alloc_dm_attr mask = {.length = 64, .comp_mask = 1};
	CHECK(ibv_alloc_dm(dev->ctx, &mask) == NULL);
	CHECK_EQ(errno, EINVAL);

	struct ibv_dm *dm = alloc_dm(dev->ctx, 100);
	uint8_t buf[128] = {0};
	CHECK_ERR(ibv_memcpy_to_dm(dm, 2, buf, 8), EINVAL);
	CHECK_ERR(ibv_memcpy_to_dm(dm, 0, buf, 3), EINVAL);
	CHECK_ERR(ibv_memcpy_to_dm(dm, 96, buf, 8), EFAULT);
	CHECK_ERR(ibv_memcpy_from_dm(buf, dm, 0, 104), EFAULT);
	CHECK(ibv_reg_dm_mr(dev->pd, dm, 0, 100, IBV_ACCESS_LOCAL_WRITE) == NULL);
	CHECK_EQ(errno, EINVAL); /* not zero based */
	CHECK(ibv_reg_dm_mr(dev->pd, dm, 4, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED) ==
	      NULL);
	CHECK_EQ(errno, EINVAL); /* past the allocation */
	CHECK(ibv_reg_dm_mr(dev->pd, dm, 0, 100,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND) ==
	      NULL);
	CHECK_EQ(errno, EINVAL);
	struct ibv_mr *mr = reg_dm_mr(dev->pd, dm, 0, 100, IBV_ACCESS_LOCAL_WRITE);
	CHECK_ERR(ibv_free_dm(dm), EBUSY);

	/* import through a second context on the same device (ibv_import_device) */
	fill(buf, 100, 0x66);
	CHECK_OK(ibv_memcpy_to_dm(dm, 0, buf, 100));
	struct ibv_context *ctx2 = ibv_import_device(dup(dev->ctx->cmd_fd));
	CHECK(ctx2 != NULL);
	struct ibv_dm *imported = ibv_import_dm(ctx2, dm->handle);
	CHECKF(imported != NULL, "ibv_import_dm failed: %s", strerror(errno));
	uint8_t got[100];
	CHECK_OK(ibv_memcpy_from_dm(got, imported, 0, 100));
	check_fill(got, 100, 0x66, "imported device memory");
	ibv_unimport_dm(imported);
	CHECK_OK(ibv_close_device(ctx2));

	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_free_dm(dm));
}

int main(void)
{
	sv_init("twoproc_dm");
	pid_t child;
	sock = sv_fork_peer(target, &child);

	struct sv_dev dev;
	sv_open(&dev);
	check_api(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 64, NULL, NULL);
	struct ibv_qp *qp[2];
	struct target_info me = {0}, b;
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
		me.qpn[i] = qp[i]->qp_num;
	}
	sv_exchange(sock, &me, &b, sizeof(me));
	for (int i = 0; i < 2; i++) {
		sv_trade_gid(sock, qp[i]);
		sv_connect_remote(qp[i], &dev, &cfg, b.qpn[i], NULL, 0, 0, 0);
	}
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	struct ibv_dm *mine = alloc_dm(dev.ctx, 4096);
	struct ibv_mr *mine_mr = reg_dm_mr(dev.pd, mine, 0, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint8_t pattern[512];
	fill(pattern, 512, 0x44);
	CHECK_OK(ibv_memcpy_to_dm(mine, 0, pattern, 512));
	CHECK_EQ(hear(), 1);

	sv_step("WRITE, READ and SEND into and out of B's device memory");
	struct ibv_wc wc;
	fill(sv_ptr(mr, 0), 1024, 0x11);
	CHECK_OK(sv_post_rdma(qp[0], 1, IBV_WR_RDMA_WRITE, mr, 0, 1024, IBV_SEND_SIGNALED, 512,
			      b.rkey0));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp[0], &wc);
	CHECK_OK(sv_post_rdma(qp[0], 2, IBV_WR_RDMA_READ, mr, 1024, MR1_LEN, IBV_SEND_SIGNALED, 0,
			      b.rkey1));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp[0], &wc);
	check_fill(sv_ptr(mr, 1024), MR1_LEN, 0x31, "READ of device memory");
	/* from A's own device memory: zero-based address 0 of its DM MR */
	struct ibv_sge sge = {.addr = 0, .length = 512, .lkey = mine_mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 3, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = 3072;
	wr.wr.rdma.rkey = b.rkey0;
	struct ibv_send_wr *bad;
	CHECK_OK(ibv_post_send(qp[0], &wr, &bad));
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp[0], &wc);
	fill(sv_ptr(mr, 0), 256, 0x22);
	CHECK_OK(sv_post_send(qp[0], 4, mr, 0, 256, IBV_SEND_SIGNALED));
	sv_expect_wc(cq, 4, IBV_WC_SUCCESS, qp[0], &wc);

	sv_step("a WRITE past the end of a DM MR");
	CHECK_OK(sv_post_rdma(qp[1], 5, IBV_WR_RDMA_WRITE, mr, 0, 200, IBV_SEND_SIGNALED,
			      4096 - 100, b.rkey0));
	sv_expect_wc(cq, 5, IBV_WC_REM_ACCESS_ERR, qp[1], &wc);
	say(1);
	CHECK_EQ(hear(), 2);

	say(3);
	sv_wait_peer(child, "target");
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	sv_free_mr(mr);
	CHECK_OK(ibv_dereg_mr(mine_mr));
	CHECK_OK(ibv_free_dm(mine));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
