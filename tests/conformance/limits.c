/*
 * The limits ibv_query_device reports are the ones that hold (issue 14, item 4): for each
 * counted object (PD, CQ, MR, MW, SRQ, AH, QP) creating up to max_* works and one more
 * fails with ENOMEM (and works again once one is destroyed); for each queue size (max_cqe,
 * max_qp_wr, max_sge, max_srq_wr) the largest works and one more fails with EINVAL. The
 * objects cost no file descriptor each (RLIMIT_NOFILE is not what runs out first).
 *
 * ctest runs it with SOFTVERBS_LIMIT_SCALE (the limits divided, so that it takes a few
 * seconds); run by hand without it, it checks the full limits (bench/scale --limits).
 */
#include "common.h"

#include <dirent.h>
#include <time.h>

static struct ibv_context *ctx;
static struct ibv_device_attr attr;

static int open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	CHECK(d != NULL);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Creates objects with make() until `limit` exist (each must work), checks one more fails
 * with ENOMEM and that one works again after one is destroyed, then destroys them all. */
static void up_to_limit(const char *what, int limit, void *(*make)(void), int (*destroy)(void *))
{
	sv_step("%s: %d of them, then one more", what, limit);
	void **objs = calloc((size_t)limit, sizeof(void *));
	CHECK(objs != NULL);
	int fds = open_fds();
	double t0 = now_s();
	for (int i = 0; i < limit; i++) {
		objs[i] = make();
		CHECKF(objs[i] != NULL, "%s #%d of %d failed: %s", what, i + 1, limit, strerror(errno));
	}
	double t1 = now_s();
	CHECKF(open_fds() - fds <= 2, "%d %ss hold %d file descriptors", limit, what,
	       open_fds() - fds);
	errno = 0;
	void *extra = make();
	CHECKF(extra == NULL, "%s #%d (beyond max) was created", what, limit + 1);
	CHECKF(errno == ENOMEM, "%s beyond max: errno %d (%s), expected ENOMEM", what, errno,
	       strerror(errno));
	CHECK_OK(destroy(objs[limit - 1]));
	objs[limit - 1] = make();
	CHECKF(objs[limit - 1] != NULL, "%s after one was destroyed: %s", what, strerror(errno));
	double t2 = now_s();
	for (int i = limit - 1; i >= 0; i--)
		CHECK_OK(destroy(objs[i]));
	double t3 = now_s();
	printf("limit %s %d create %.2f us destroy %.2f us\n", what, limit, (t1 - t0) * 1e6 / limit,
	       (t3 - t2) * 1e6 / limit);
	free(objs);
}

static struct ibv_pd *pd;
static struct ibv_cq *cq;
static char *buf;
static union ibv_gid gid;

static void *make_pd(void) { return ibv_alloc_pd(ctx); }
static int free_pd(void *p) { return ibv_dealloc_pd(p); }
static void *make_cq(void) { return ibv_create_cq(ctx, 1, NULL, NULL, 0); }
static int free_cq(void *c) { return ibv_destroy_cq(c); }
static void *make_mr(void)
{
	return ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}
static int free_mr(void *m) { return ibv_dereg_mr(m); }
static void *make_mw(void) { return ibv_alloc_mw(pd, IBV_MW_TYPE_1); }
static int free_mw(void *m) { return ibv_dealloc_mw(m); }
static void *make_srq(void)
{
	struct ibv_srq_init_attr a = { .attr = { .max_wr = 1, .max_sge = 1 } };
	return ibv_create_srq(pd, &a);
}
static int free_srq(void *s) { return ibv_destroy_srq(s); }
static void *make_ah(void)
{
	struct ibv_ah_attr a = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } };
	return ibv_create_ah(pd, &a);
}
static int free_ah(void *a) { return ibv_destroy_ah(a); }
static struct ibv_qp *qp_with(uint32_t send_wr, uint32_t recv_wr, uint32_t send_sge, uint32_t recv_sge)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr,
			 .max_send_sge = send_sge, .max_recv_sge = recv_sge },
	};
	return ibv_create_qp(pd, &a);
}
static void *make_qp(void) { return qp_with(1, 1, 1, 1); }
static int free_qp(void *q) { return ibv_destroy_qp(q); }

/* make(size) must work and make(size + 1) fail with EINVAL. */
#define SIZE_LIMIT(what, limit, make, destroy)                                             \
	do {                                                                               \
		sv_step("%s: %d works, %d does not", what, (int)(limit), (int)(limit) + 1); \
		void *ok_ = (make(limit));                                                 \
		CHECKF(ok_ != NULL, "%s = %d failed: %s", what, (int)(limit),              \
		       strerror(errno));                                                   \
		CHECK_OK(destroy(ok_));                                                    \
		errno = 0;                                                                 \
		void *no_ = (make((limit) + 1));                                           \
		CHECKF(no_ == NULL, "%s = %d (beyond max) worked", what, (int)(limit) + 1); \
		CHECKF(errno == EINVAL, "%s beyond max: errno %d, expected EINVAL", what,  \
		       errno);                                                             \
	} while (0)

static void *cq_of(int cqe) { return ibv_create_cq(ctx, cqe, NULL, NULL, 0); }
static void *qp_send_wr(int n) { return qp_with(n, 1, 1, 1); }
static void *qp_recv_wr(int n) { return qp_with(1, n, 1, 1); }
static void *qp_send_sge(int n) { return qp_with(1, 1, n, 1); }
static void *qp_recv_sge(int n) { return qp_with(1, 1, 1, n); }
static void *srq_of(int n)
{
	struct ibv_srq_init_attr a = { .attr = { .max_wr = n, .max_sge = 1 } };
	return ibv_create_srq(pd, &a);
}

int main(void)
{
	sv_init("limits");
	const char *scale = getenv("SOFTVERBS_LIMIT_SCALE");
	sv_watchdog(scale && *scale ? SV_WATCHDOG_S : 1800);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	ibv_free_device_list(list);
	CHECK_OK(ibv_query_device(ctx, &attr));
	CHECK_OK(ibv_query_gid(ctx, 1, 0, &gid));
	printf("max_pd %d max_cq %d max_cqe %d max_mr %d max_mw %d max_srq %d max_srq_wr %d "
	       "max_ah %d max_qp %d max_qp_wr %d max_sge %d\n",
	       attr.max_pd, attr.max_cq, attr.max_cqe, attr.max_mr, attr.max_mw, attr.max_srq,
	       attr.max_srq_wr, attr.max_ah, attr.max_qp, attr.max_qp_wr, attr.max_sge);
	/* A limit set on its own is the one reported. */
	const char *qp_limit = getenv("SOFTVERBS_LIMIT_MAX_QP");
	if (qp_limit && *qp_limit)
		CHECK_EQ(attr.max_qp, atoi(qp_limit));

	up_to_limit("pd", attr.max_pd, make_pd, free_pd);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	up_to_limit("cq", attr.max_cq, make_cq, free_cq);
	buf = aligned_alloc(4096, 4096);
	CHECK(buf != NULL);
	up_to_limit("mr", attr.max_mr, make_mr, free_mr);
	up_to_limit("mw", attr.max_mw, make_mw, free_mw);
	up_to_limit("srq", attr.max_srq, make_srq, free_srq);
	up_to_limit("ah", attr.max_ah, make_ah, free_ah);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	up_to_limit("qp", attr.max_qp, make_qp, free_qp);

	SIZE_LIMIT("cqe", attr.max_cqe, cq_of, free_cq);
	SIZE_LIMIT("max_send_wr", attr.max_qp_wr, qp_send_wr, free_qp);
	SIZE_LIMIT("max_recv_wr", attr.max_qp_wr, qp_recv_wr, free_qp);
	SIZE_LIMIT("max_send_sge", attr.max_sge, qp_send_sge, free_qp);
	SIZE_LIMIT("max_recv_sge", attr.max_sge, qp_recv_sge, free_qp);
	SIZE_LIMIT("srq max_wr", attr.max_srq_wr, srq_of, free_srq);

	CHECK_OK(ibv_destroy_cq(cq));
	CHECK_OK(ibv_dealloc_pd(pd));
	free(buf);
	CHECK_OK(ibv_close_device(ctx));
	sv_pass();
	return 0;
}
