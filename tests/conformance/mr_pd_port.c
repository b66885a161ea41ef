/*
 * mr_pd_port: ports, memory registration and protection domains.
 *
 * - ibv_query_port on port 1 works; on port 0 and on phys_port_cnt + 1 it fails with EINVAL.
 * - MR access flags are validated: REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE gives
 *   NULL with errno EINVAL (through ibv_reg_mr and ibv_reg_mr_iova2 alike).
 * - ibv_reg_mr_iova2 accepts the optional access bits (IBV_ACCESS_RELAXED_ORDERING = 1 << 20,
 *   and the rest of IBV_ACCESS_OPTIONAL_RANGE), and the MR works.
 * - ibv_rereg_mr: CHANGE_ACCESS makes remote writes possible, CHANGE_TRANSLATION moves the MR
 *   (mr->addr/length follow), CHANGE_PD moves it to another PD (mr->pd follows); bad input
 *   gives IBV_REREG_MR_ERR_INPUT.
 * - ibv_dealloc_pd fails with EBUSY while an MR or a QP still uses the PD.
 */
#include "common.h"

#include <arpa/inet.h>

static struct sv_dev dev;
static struct sv_pair pair;
static struct ibv_mr *src;

/* RDMA WRITE of len bytes from src to (addr, rkey); returns the completion status. */
static enum ibv_wc_status write_to(uint64_t addr, uint32_t rkey, uint32_t len)
{
	static uint64_t id;
	id++;
	CHECK_OK(sv_post_rdma(pair.qp[0], id, IBV_WR_RDMA_WRITE, src, 0, len, IBV_SEND_SIGNALED,
			      addr, rkey));
	struct ibv_wc wc;
	sv_poll_one(pair.scq[0], &wc);
	CHECK_EQ(wc.wr_id, id);
	return wc.status;
}

static void test_ports(void)
{
	sv_step("ibv_query_port: port 1 works, port 0 and phys_port_cnt + 1 are EINVAL");
	struct ibv_port_attr pa;
	CHECK_OK(ibv_query_port(dev.ctx, 1, &pa));
	CHECK_EQ(pa.state, IBV_PORT_ACTIVE);
	CHECK_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK(pa.gid_tbl_len >= 1);
	char text[INET6_ADDRSTRLEN];
	CHECK(inet_ntop(AF_INET6, dev.gid.raw, text, sizeof(text)) != NULL);
	printf("%s port 1: GID[0] %s, active_mtu %d\n", ibv_get_device_name(dev.ctx->device), text,
	       128 << pa.active_mtu);
	union ibv_gid zero;
	memset(&zero, 0, sizeof(zero));
	CHECK(memcmp(&dev.gid, &zero, sizeof(zero)) != 0);
	int bad_port = dev.dev_attr.phys_port_cnt + 1;
	CHECK_ERR(ibv_query_port(dev.ctx, (uint8_t)bad_port, &pa), EINVAL);
	CHECK_ERR(ibv_query_port(dev.ctx, 0, &pa), EINVAL);
}

static void test_access_flags(void)
{
	sv_step("REMOTE_WRITE / REMOTE_ATOMIC without LOCAL_WRITE: NULL, EINVAL");
	static char buf[8192] __attribute__((aligned(4096)));
	unsigned bad[] = { IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		/* (ibv_reg_mr)(...) calls the exported function, not the header's macro. */
		struct ibv_mr *mr = (ibv_reg_mr)(dev.pd, buf, sizeof(buf), (int)bad[i]);
		CHECKF(mr == NULL && errno == EINVAL,
		       "ibv_reg_mr(access 0x%x): %p, errno %d; expected NULL, EINVAL", bad[i],
		       (void *)mr, errno);
		errno = 0;
		mr = ibv_reg_mr_iova2(dev.pd, buf, sizeof(buf), (uintptr_t)buf, bad[i]);
		CHECKF(mr == NULL && errno == EINVAL,
		       "ibv_reg_mr_iova2(access 0x%x): %p, errno %d; expected NULL, EINVAL",
		       bad[i], (void *)mr, errno);
	}

	sv_step("valid access flags, including none at all");
	unsigned good[] = { 0, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ, SV_ACCESS_ALL };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct ibv_mr *mr = (ibv_reg_mr)(dev.pd, buf, sizeof(buf), (int)good[i]);
		CHECKF(mr != NULL, "ibv_reg_mr(access 0x%x) failed: %s", good[i], strerror(errno));
		CHECK_OK(ibv_dereg_mr(mr));
	}

	sv_step("ibv_reg_mr_iova2 accepts IBV_ACCESS_RELAXED_ORDERING and the optional range");
	CHECK_EQ(IBV_ACCESS_RELAXED_ORDERING, 1 << 20);
	unsigned optional[] = { IBV_ACCESS_RELAXED_ORDERING, 1u << 21, 1u << 29,
				IBV_ACCESS_OPTIONAL_RANGE };
	for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++) {
		unsigned access = SV_ACCESS_ALL | optional[i];
		struct ibv_mr *mr =
			ibv_reg_mr_iova2(dev.pd, buf, sizeof(buf), (uintptr_t)buf, access);
		CHECKF(mr != NULL, "ibv_reg_mr_iova2(access 0x%x) failed: %s", access,
		       strerror(errno));
		memset(buf, 0, sizeof(buf));
		memset(src->addr, 0x40 + (int)i, 64);
		CHECK_EQ(write_to((uintptr_t)buf + 128, mr->rkey, 64), IBV_WC_SUCCESS);
		CHECK_EQ(buf[128], 0x40 + (int)i);
		CHECK_EQ(buf[128 + 63], 0x40 + (int)i);
		CHECK_OK(ibv_dereg_mr(mr));
	}
}

static void test_rereg(void)
{
	void *buf1 = aligned_alloc(4096, 4096), *buf2 = aligned_alloc(4096, 8192);
	CHECK(buf1 && buf2);
	memset(buf2, 0, 8192);
	struct ibv_mr *mr = ibv_reg_mr(dev.pd, buf1, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);

	sv_step("before rereg: no remote write access");
	CHECK_EQ(write_to((uintptr_t)buf1, mr->rkey, 64), IBV_WC_REM_ACCESS_ERR);
	sv_drain_async(dev.ctx, SV_QUIET_MS);
	/* The failed write took both QPs to ERR; start over with a fresh pair. */
	sv_pair_destroy(&pair);
	sv_pair_open(&dev, NULL, &pair);

	sv_step("rereg: bad input is refused and leaves the MR valid");
	CHECK_EQ(ibv_rereg_mr(mr, 1 << 10, NULL, NULL, 0, 0), IBV_REREG_MR_ERR_INPUT);
	CHECK_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 4096, 0),
		 IBV_REREG_MR_ERR_INPUT);
	CHECK_EQ(ibv_rereg_mr(mr, 0, NULL, NULL, 0, SV_ACCESS_ALL),
		 IBV_REREG_MR_ERR_INPUT); /* access given without CHANGE_ACCESS */

	sv_step("rereg CHANGE_ACCESS: remote writes now succeed");
	CHECK_OK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, SV_ACCESS_ALL));
	memset(src->addr, 0x77, 64);
	CHECK_EQ(write_to((uintptr_t)buf1 + 64, mr->rkey, 64), IBV_WC_SUCCESS);
	CHECK_EQ(((uint8_t *)buf1)[64], 0x77);

	sv_step("rereg CHANGE_TRANSLATION: the MR now covers the new buffer");
	CHECK_OK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, 8192, 0));
	CHECK(mr->addr == buf2);
	CHECK_EQ(mr->length, 8192);
	memset(src->addr, 0x78, 64);
	CHECK_EQ(write_to((uintptr_t)buf2 + 5000, mr->rkey, 64), IBV_WC_SUCCESS);
	CHECK_EQ(((uint8_t *)buf2)[5000], 0x78);
	CHECK_EQ(((uint8_t *)buf2)[5063], 0x78);

	sv_step("rereg CHANGE_PD; dealloc_pd is EBUSY while the MR is on it");
	struct ibv_pd *pd2 = ibv_alloc_pd(dev.ctx);
	CHECK(pd2 != NULL);
	CHECK_OK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0));
	CHECK(mr->pd == pd2);
	CHECK_ERR(ibv_dealloc_pd(pd2), EBUSY);
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_dealloc_pd(pd2));
	free(buf1);
	free(buf2);
}

static void test_dealloc_busy(void)
{
	sv_step("ibv_dealloc_pd is EBUSY while an MR uses the PD");
	struct ibv_pd *pd = ibv_alloc_pd(dev.ctx);
	CHECK(pd != NULL);
	struct ibv_mr *mr = sv_alloc_mr(pd, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK_ERR(ibv_dealloc_pd(pd), EBUSY);
	sv_free_mr(mr);

	sv_step("ibv_dealloc_pd is EBUSY while a QP uses the PD");
	struct ibv_cq *cq = sv_create_cq(&dev, 8, NULL, NULL);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL);
	CHECK_ERR(ibv_dealloc_pd(pd), EBUSY);
	CHECK_OK(ibv_destroy_qp(qp));
	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_dealloc_pd(pd));
}

int main(void)
{
	sv_init("mr_pd_port");
	sv_open(&dev);
	sv_pair_open(&dev, NULL, &pair);
	src = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);

	test_ports();
	test_access_flags();
	test_rereg();
	test_dealloc_busy();

	sv_step("teardown");
	sv_free_mr(src);
	sv_pair_destroy(&pair);
	sv_close(&dev);
	sv_pass();
	return 0;
}
