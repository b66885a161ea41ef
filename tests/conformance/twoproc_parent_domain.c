/*
 * Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)) with a peer
 * in another process, on the same host or (hosts.twoproc.parent_domain) between hosts.
 * B (child) creates a TD and a parent domain over its PD with custom alloc/free callbacks and
 * a pd_context, then a QP on the parent domain (ibv_create_qp) and a second one through
 * ibv_create_qp_ex that receives from an SRQ created on the parent domain. A (parent) SENDs
 * to both from a QP on a parent domain of its own, whose allocator answers
 * IBV_ALLOCATOR_USE_DEFAULT. Checked:
 *  - the callbacks are called with the parent domain, its pd_context, a power-of-two
 *    alignment and our resource types (QP 1, SRQ 4), and the receive rings live in the
 *    memory they returned (the posted wr_ids appear there); each buffer is freed once, with
 *    its type, when its QP or SRQ is destroyed; after IBV_ALLOCATOR_USE_DEFAULT free is never
 *    called;
 *  - the parent domain is interchangeable with its PD: MRs registered on either serve QPs of
 *    both; the SENDs land;
 *  - while in use, the PD, the TD and the parent domain cannot go (EBUSY); unknown comp_mask
 *    bits and a parent domain as the PD of another are EINVAL.
 */
#include "common.h"

#define N 20
#define MSG 64
#define QP_RESOURCE 1
#define SRQ_RESOURCE 4

static int sock;

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

struct allocator {
	struct ibv_pd *parent; /* set once the parent domain exists */
	int allocs, frees, bad_calls;
	int use_default;
	struct buffer { void *p; size_t size; uint64_t type; } buf[8];
	int nbuf;
};

static void *alloc_cb(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		      uint64_t resource_type)
{
	struct allocator *a = pd_context;
	a->allocs++;
	if ((a->parent && pd != a->parent) || !alignment || (alignment & (alignment - 1)) ||
	    (resource_type != QP_RESOURCE && resource_type != SRQ_RESOURCE))
		a->bad_calls++;
	if (a->use_default)
		return IBV_ALLOCATOR_USE_DEFAULT;
	void *p = NULL;
	if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size))
		return NULL;
	memset(p, 0, size);
	if (a->nbuf < 8)
		a->buf[a->nbuf++] = (struct buffer){p, size, resource_type};
	return p;
}

static void free_cb(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type)
{
	struct allocator *a = pd_context;
	a->frees++;
	int known = 0;
	for (int i = 0; i < a->nbuf; i++)
		if (a->buf[i].p == ptr && a->buf[i].type == resource_type) {
			known = 1;
			a->buf[i].p = NULL;
		}
	if (!known || pd != a->parent)
		a->bad_calls++;
	free(ptr);
}

static struct ibv_pd *parent_domain(struct sv_dev *dev, struct ibv_td *td, struct allocator *a)
{
	struct ibv_parent_domain_init_attr attr = {
		.pd = dev->pd, .td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = alloc_cb, .free = free_cb, .pd_context = a};
	struct ibv_pd *pd = ibv_alloc_parent_domain(dev->ctx, &attr);
	CHECKF(pd != NULL, "ibv_alloc_parent_domain failed: %s", strerror(errno));
	CHECK(pd->context == dev->ctx);
	a->parent = pd;
	return pd;
}

/* Whether the 8 bytes of `v` appear in one of the allocator's buffers of `type`. */
static int in_buffers(const struct allocator *a, uint64_t type, uint64_t v)
{
	for (int i = 0; i < a->nbuf; i++)
		if (a->buf[i].p && a->buf[i].type == type && memmem(a->buf[i].p, a->buf[i].size, &v, 8))
			return 1;
	return 0;
}

static void check_errors(struct sv_dev *dev, struct ibv_pd *parent)
{
	struct ibv_td_init_attr td_attr = {.comp_mask = 1};
	CHECK(ibv_alloc_td(dev->ctx, &td_attr) == NULL);
	CHECK_EQ(errno, EINVAL);
	struct ibv_parent_domain_init_attr attr = {.pd = dev->pd, .comp_mask = 0x100};
	CHECK(ibv_alloc_parent_domain(dev->ctx, &attr) == NULL);
	CHECK_EQ(errno, EINVAL);
	attr.comp_mask = 0;
	attr.pd = parent;
	CHECK(ibv_alloc_parent_domain(dev->ctx, &attr) == NULL);
	CHECK_EQ(errno, EINVAL);
}

static void target(int s)
{
	sock = s;
	struct sv_dev dev;
	sv_open(&dev);
	struct ibv_td_init_attr td_attr = {0};
	struct ibv_td *td = ibv_alloc_td(dev.ctx, &td_attr);
	CHECKF(td != NULL, "ibv_alloc_td failed: %s", strerror(errno));
	static struct allocator a;
	struct ibv_pd *parent = parent_domain(&dev, td, &a);
	check_errors(&dev, parent);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 4 * N, NULL, NULL);

	sv_step("a QP and an SRQ on the parent domain");
	struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 4, .max_recv_wr = N,
						.max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp0 = ibv_create_qp(parent, &init);
	CHECKF(qp0 != NULL, "ibv_create_qp on a parent domain failed: %s", strerror(errno));
	CHECK(qp0->pd == parent);
	CHECK_EQ(a.allocs, 1);
	struct ibv_srq_init_attr sattr = {.attr = {.max_wr = N, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(parent, &sattr);
	CHECKF(srq != NULL, "ibv_create_srq on a parent domain failed: %s", strerror(errno));
	CHECK_EQ(a.allocs, 2);
	struct ibv_qp_init_attr_ex ex = {.send_cq = cq, .recv_cq = cq, .srq = srq,
					 .qp_type = IBV_QPT_RC, .comp_mask = IBV_QP_INIT_ATTR_PD,
					 .pd = parent,
					 .cap = {.max_send_wr = 4, .max_send_sge = 1}};
	struct ibv_qp *qp1 = ibv_create_qp_ex(dev.ctx, &ex);
	CHECKF(qp1 != NULL, "ibv_create_qp_ex on a parent domain failed: %s", strerror(errno));
	CHECK_EQ(a.allocs, 2); /* it receives from the SRQ: no ring of its own */
	CHECK_EQ(a.bad_calls, 0);
	CHECK_ERR(ibv_dealloc_td(td), EBUSY);
	CHECK_ERR(ibv_dealloc_pd(dev.pd), EBUSY);
	CHECK_ERR(ibv_dealloc_pd(parent), EBUSY);

	/* one MR on the PD, one on the parent domain: both serve both QPs */
	struct ibv_mr *mr_pd = sv_alloc_mr(dev.pd, N * MSG, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr_parent = sv_alloc_mr(parent, N * MSG, IBV_ACCESS_LOCAL_WRITE);
	uint32_t mine[2] = {qp0->qp_num, qp1->qp_num}, peer[2];
	sv_exchange(sock, mine, peer, sizeof(mine));
	sv_trade_gid(sock, qp0);
	sv_trade_gid(sock, qp1);
	CHECK_OK(sv_modify_init(qp0, &cfg));
	CHECK_OK(sv_modify_init(qp1, &cfg));
	for (int i = 0; i < N; i++) {
		CHECK_OK(sv_post_recv(qp0, 0x5eed0000ull + i, i % 2 ? mr_pd : mr_parent,
				      (size_t)i * MSG, MSG));
		CHECK_OK(sv_post_srq_recv(srq, 0x5eed1000ull + i, i % 2 ? mr_parent : mr_pd,
					  (size_t)i * MSG, MSG));
	}
	/* the receive rings are the memory the callbacks returned */
	CHECKF(in_buffers(&a, QP_RESOURCE, 0x5eed0000ull + N - 1),
	       "the QP's receive WQEs are not in its parent domain's memory");
	CHECKF(in_buffers(&a, SRQ_RESOURCE, 0x5eed1000ull + N - 1),
	       "the SRQ's receive WQEs are not in its parent domain's memory");
	CHECK_OK(sv_modify_rtr(qp0, &dev, peer[0], &cfg));
	CHECK_OK(sv_modify_rts(qp0, &cfg));
	CHECK_OK(sv_modify_rtr(qp1, &dev, peer[1], &cfg));
	CHECK_OK(sv_modify_rts(qp1, &cfg));
	say(1);

	CHECK_EQ(hear(), 1);
	struct ibv_wc wc[2 * N];
	CHECK_EQ(sv_poll(cq, 2 * N, wc, SV_WAIT_MS), 2 * N);
	int seen0 = 0, seen1 = 0;
	for (int i = 0; i < 2 * N; i++) {
		CHECK_STATUS(wc[i], IBV_WC_SUCCESS);
		CHECK_EQ(wc[i].byte_len, MSG);
		if (wc[i].qp_num == qp0->qp_num)
			CHECK_EQ(wc[i].wr_id, 0x5eed0000ull + seen0++);
		else
			CHECK_EQ(wc[i].wr_id, 0x5eed1000ull + seen1++);
	}
	for (int i = 0; i < N; i++) {
		uint8_t *p0 = sv_ptr(i % 2 ? mr_pd : mr_parent, (size_t)i * MSG);
		uint8_t *p1 = sv_ptr(i % 2 ? mr_parent : mr_pd, (size_t)i * MSG);
		CHECKF(p0[0] == (uint8_t)i && p0[MSG - 1] == (uint8_t)i, "QP 0 message %d", i);
		CHECKF(p1[0] == (uint8_t)(0x80 + i), "QP 1 message %d", i);
	}
	say(2);

	CHECK_EQ(hear(), 3);
	sv_step("destroying gives each buffer back once");
	CHECK_OK(ibv_destroy_qp(qp0));
	CHECK_EQ(a.frees, 1);
	CHECK_OK(ibv_destroy_qp(qp1));
	CHECK_OK(ibv_destroy_srq(srq));
	CHECK_EQ(a.frees, 2);
	CHECK_EQ(a.bad_calls, 0);
	sv_free_mr(mr_pd);
	sv_free_mr(mr_parent);
	CHECK_OK(ibv_dealloc_pd(parent));
	CHECK_OK(ibv_dealloc_td(td));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_parent_domain");
	pid_t child;
	sock = sv_fork_peer(target, &child);

	struct sv_dev dev;
	sv_open(&dev);
	static struct allocator a = {.use_default = 1};
	struct ibv_pd *parent = parent_domain(&dev, NULL, &a);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 4 * N, NULL, NULL);
	struct ibv_qp *qp[2];
	for (int i = 0; i < 2; i++) {
		qp[i] = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL); /* on the PD ... */
	}
	/* ... and a third on the parent domain, which sends to both of B's QPs in turn */
	struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 2 * N, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *pqp = ibv_create_qp(parent, &init);
	CHECK(pqp != NULL);
	CHECK_EQ(a.allocs, 1); /* answered IBV_ALLOCATOR_USE_DEFAULT */
	CHECK_OK(ibv_destroy_qp(qp[0]));
	qp[0] = pqp; /* B's QP 0 talks to the QP on our parent domain */
	uint32_t mine[2] = {qp[0]->qp_num, qp[1]->qp_num}, peer[2];
	sv_exchange(sock, mine, peer, sizeof(mine));
	for (int i = 0; i < 2; i++) {
		sv_trade_gid(sock, qp[i]);
		sv_connect_remote(qp[i], &dev, &cfg, peer[i], NULL, 0, 0, 0);
	}
	struct ibv_mr *mr = sv_alloc_mr(parent, 2 * N * MSG, IBV_ACCESS_LOCAL_WRITE);
	CHECK_EQ(hear(), 1);

	sv_step("SENDs to B's QP on the parent domain and to the one on its SRQ");
	for (int i = 0; i < N; i++) {
		memset(sv_ptr(mr, (size_t)i * MSG), i, MSG);
		memset(sv_ptr(mr, (size_t)(N + i) * MSG), 0x80 + i, MSG);
		CHECK_OK(sv_post_send(qp[0], (uint64_t)i, mr, (size_t)i * MSG, MSG, IBV_SEND_SIGNALED));
		CHECK_OK(sv_post_send(qp[1], (uint64_t)(N + i), mr, (size_t)(N + i) * MSG, MSG,
				      IBV_SEND_SIGNALED));
	}
	struct ibv_wc wc[2 * N];
	CHECK_EQ(sv_poll(cq, 2 * N, wc, SV_WAIT_MS), 2 * N);
	for (int i = 0; i < 2 * N; i++)
		CHECK_STATUS(wc[i], IBV_WC_SUCCESS);
	say(1);
	CHECK_EQ(hear(), 2);
	say(3);
	sv_wait_peer(child, "target");
	for (int i = 0; i < 2; i++)
		CHECK_OK(ibv_destroy_qp(qp[i]));
	CHECK_EQ(a.frees, 0); /* nothing of the application's to give back */
	sv_free_mr(mr);
	CHECK_OK(ibv_dealloc_pd(parent));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
