/* Shared helpers for the softverbs conformance tests; see common.h. */
#include "common.h"

#include <sys/socket.h>
#include <sys/wait.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

/* ---- reporting ------------------------------------------------------------------------ */

static const char *test_name = "?";
static char last_step[160] = "start";

static void write_str(const char *s)
{
	size_t len = strlen(s);
	while (len > 0) {
		ssize_t n = write(STDERR_FILENO, s, len);
		if (n <= 0)
			return;
		s += n;
		len -= (size_t)n;
	}
}

static struct {
	const char *label;
	atomic_long *value;
} counters[8];
static int num_counters;

void sv_watch_counter(const char *label, atomic_long *value)
{
	CHECK(num_counters < (int)(sizeof(counters) / sizeof(counters[0])));
	counters[num_counters].label = label;
	counters[num_counters].value = value;
	num_counters++;
}

static void write_long(long v)
{
	char buf[24];
	int i = sizeof(buf);
	int neg = v < 0;
	unsigned long u = neg ? 0UL - (unsigned long)v : (unsigned long)v;
	buf[--i] = 0;
	do {
		buf[--i] = (char)('0' + u % 10);
		u /= 10;
	} while (u && i > 1);
	if (neg)
		buf[--i] = '-';
	write_str(buf + i);
}

static void on_alarm(int sig)
{
	(void)sig;
	/* Only async-signal-safe calls here. */
	write_str("FAIL ");
	write_str(test_name);
	write_str(": watchdog: the test did not finish in time; last step: ");
	write_str(last_step);
	for (int i = 0; i < num_counters; i++) {
		write_str(i ? ", " : "; ");
		write_str(counters[i].label);
		write_str(" ");
		write_long(atomic_load(counters[i].value));
	}
	write_str("\n");
	_exit(1);
}

void sv_init(const char *name)
{
	test_name = name;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	sv_watchdog(SV_WATCHDOG_S);
}

void sv_watchdog(unsigned seconds)
{
	alarm(seconds);
}

void sv_step(const char *fmt, ...)
{
	char buf[sizeof(last_step)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* The watchdog may read last_step at any time; a torn string is harmless there. */
	memcpy(last_step, buf, sizeof(buf));
	printf("-- %s\n", buf);
}

void sv_pass(void)
{
	alarm(0);
	printf("PASS %s\n", test_name);
	fflush(stdout);
}

void sv_fail(const char *file, int line, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "FAIL %s: %s:%d: %s [step: %s]\n", test_name, file, line, msg, last_step);
	fflush(stderr);
	exit(1);
}

const char *sv_wc_status_name(int status)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "SUCCESS",
		[IBV_WC_LOC_LEN_ERR] = "LOC_LEN_ERR",
		[IBV_WC_LOC_QP_OP_ERR] = "LOC_QP_OP_ERR",
		[IBV_WC_LOC_EEC_OP_ERR] = "LOC_EEC_OP_ERR",
		[IBV_WC_LOC_PROT_ERR] = "LOC_PROT_ERR",
		[IBV_WC_WR_FLUSH_ERR] = "WR_FLUSH_ERR",
		[IBV_WC_MW_BIND_ERR] = "MW_BIND_ERR",
		[IBV_WC_BAD_RESP_ERR] = "BAD_RESP_ERR",
		[IBV_WC_LOC_ACCESS_ERR] = "LOC_ACCESS_ERR",
		[IBV_WC_REM_INV_REQ_ERR] = "REM_INV_REQ_ERR",
		[IBV_WC_REM_ACCESS_ERR] = "REM_ACCESS_ERR",
		[IBV_WC_REM_OP_ERR] = "REM_OP_ERR",
		[IBV_WC_RETRY_EXC_ERR] = "RETRY_EXC_ERR",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR_RETRY_EXC_ERR",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "LOC_RDD_VIOL_ERR",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "REM_INV_RD_REQ_ERR",
		[IBV_WC_REM_ABORT_ERR] = "REM_ABORT_ERR",
		[IBV_WC_INV_EECN_ERR] = "INV_EECN_ERR",
		[IBV_WC_INV_EEC_STATE_ERR] = "INV_EEC_STATE_ERR",
		[IBV_WC_FATAL_ERR] = "FATAL_ERR",
		[IBV_WC_RESP_TIMEOUT_ERR] = "RESP_TIMEOUT_ERR",
		[IBV_WC_GENERAL_ERR] = "GENERAL_ERR",
		[IBV_WC_TM_ERR] = "TM_ERR",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM_RNDV_INCOMPLETE",
	};
	if (status >= 0 && (size_t)status < sizeof(names) / sizeof(names[0]) && names[status])
		return names[status];
	return "(unknown status)";
}

const char *sv_wc_opcode_name(int opcode)
{
	switch (opcode) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_COMP_SWAP: return "COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_BIND_MW: return "BIND_MW";
	case IBV_WC_LOCAL_INV: return "LOCAL_INV";
	case IBV_WC_TSO: return "TSO";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "(unknown opcode)";
	}
}

const char *sv_event_name(int event_type)
{
	switch (event_type) {
	case IBV_EVENT_CQ_ERR: return "CQ_ERR";
	case IBV_EVENT_QP_FATAL: return "QP_FATAL";
	case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
	case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
	case IBV_EVENT_COMM_EST: return "COMM_EST";
	case IBV_EVENT_SQ_DRAINED: return "SQ_DRAINED";
	case IBV_EVENT_PATH_MIG: return "PATH_MIG";
	case IBV_EVENT_PATH_MIG_ERR: return "PATH_MIG_ERR";
	case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
	case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
	case IBV_EVENT_PORT_ERR: return "PORT_ERR";
	case IBV_EVENT_LID_CHANGE: return "LID_CHANGE";
	case IBV_EVENT_PKEY_CHANGE: return "PKEY_CHANGE";
	case IBV_EVENT_SM_CHANGE: return "SM_CHANGE";
	case IBV_EVENT_SRQ_ERR: return "SRQ_ERR";
	case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ_LIMIT_REACHED";
	case IBV_EVENT_QP_LAST_WQE_REACHED: return "QP_LAST_WQE_REACHED";
	case IBV_EVENT_CLIENT_REREGISTER: return "CLIENT_REREGISTER";
	case IBV_EVENT_GID_CHANGE: return "GID_CHANGE";
	case IBV_EVENT_WQ_FATAL: return "WQ_FATAL";
	default: return "(unknown event)";
	}
}

const char *sv_qp_state_name(int state)
{
	switch (state) {
	case IBV_QPS_RESET: return "RESET";
	case IBV_QPS_INIT: return "INIT";
	case IBV_QPS_RTR: return "RTR";
	case IBV_QPS_RTS: return "RTS";
	case IBV_QPS_SQD: return "SQD";
	case IBV_QPS_SQE: return "SQE";
	case IBV_QPS_ERR: return "ERR";
	default: return "(unknown state)";
	}
}

/* ---- time ------------------------------------------------------------------------------ */

long long sv_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sv_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- device -------------------------------------------------------------------------- */

int sv_gid_index(void)
{
	const char *s = getenv("SV_GID_INDEX");
	if (!s || !*s)
		return 0;
	char *end;
	long index = strtol(s, &end, 10);
	CHECKF(*end == 0 && index >= 0 && index < 256, "SV_GID_INDEX='%s' is not 0..255", s);
	return (int)index;
}

void sv_open(struct sv_dev *d)
{
	memset(d, 0, sizeof(*d));
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECKF(list != NULL, "ibv_get_device_list failed: %s", strerror(errno));
	CHECKF(num > 0 && list[0] != NULL, "no RDMA device (ibv_get_device_list found %d)", num);
	d->ctx = ibv_open_device(list[0]);
	CHECKF(d->ctx != NULL, "ibv_open_device(%s) failed: %s", ibv_get_device_name(list[0]),
	       strerror(errno));
	ibv_free_device_list(list);

	CHECK_OK(ibv_query_device(d->ctx, &d->dev_attr));
	CHECK_OK(ibv_query_port(d->ctx, 1, &d->port_attr));
	d->gid_index = sv_gid_index();
	CHECK_EQ(ibv_query_gid(d->ctx, 1, d->gid_index, &d->gid), 0);
	d->pd = ibv_alloc_pd(d->ctx);
	CHECK(d->pd != NULL);
}

void sv_close(struct sv_dev *d)
{
	CHECK_OK(ibv_dealloc_pd(d->pd));
	CHECK_OK(ibv_close_device(d->ctx));
	memset(d, 0, sizeof(*d));
}

/* ---- QPs --------------------------------------------------------------------------- */

void sv_pair_cfg_init(struct sv_pair_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->send_cqe = 64;
	cfg->recv_cqe = 64;
	cfg->max_send_wr = 32;
	cfg->max_recv_wr = 32;
	cfg->max_send_sge = 4;
	cfg->max_recv_sge = 4;
	cfg->max_inline_data = 64;
	cfg->srq_max_wr = 64;
	cfg->access = SV_ACCESS_ALL;
	cfg->mtu = IBV_MTU_1024;
	cfg->psn = 0x1234;
	cfg->timeout = 14;
	cfg->retry_cnt = 7;
	cfg->rnr_retry = 7;
	cfg->min_rnr_timer = 1;
	cfg->max_rd_atomic = 1;
}

struct ibv_cq *sv_create_cq(struct sv_dev *d, int cqe, void *cq_context,
			    struct ibv_comp_channel *channel)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, cqe, cq_context, channel, 0);
	CHECKF(cq != NULL, "ibv_create_cq(cqe=%d) failed: %s", cqe, strerror(errno));
	CHECKF(cq->cqe >= cqe, "ibv_create_cq(cqe=%d) gave cq->cqe %d", cqe, cq->cqe);
	CHECK(cq->context == d->ctx);
	CHECK(cq->channel == channel);
	CHECK(cq->cq_context == cq_context);
	return cq;
}

struct ibv_qp *sv_create_qp(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct ibv_cq *scq,
			    struct ibv_cq *rcq, struct ibv_srq *srq, struct ibv_qp_cap *cap_out)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.srq = srq;
	ia.qp_type = IBV_QPT_RC;
	ia.sq_sig_all = cfg->sq_sig_all;
	ia.cap.max_send_wr = cfg->max_send_wr;
	ia.cap.max_recv_wr = srq ? 0 : cfg->max_recv_wr;
	ia.cap.max_send_sge = cfg->max_send_sge;
	ia.cap.max_recv_sge = srq ? 0 : cfg->max_recv_sge;
	ia.cap.max_inline_data = cfg->max_inline_data;
	struct ibv_qp *qp = ibv_create_qp(d->pd, &ia);
	CHECKF(qp != NULL, "ibv_create_qp failed: %s", strerror(errno));
	CHECKF(ia.cap.max_send_wr >= cfg->max_send_wr && ia.cap.max_send_sge >= cfg->max_send_sge &&
		       ia.cap.max_inline_data >= cfg->max_inline_data,
	       "ibv_create_qp wrote back send caps below the request: wr %u sge %u inline %u",
	       ia.cap.max_send_wr, ia.cap.max_send_sge, ia.cap.max_inline_data);
	if (!srq)
		CHECKF(ia.cap.max_recv_wr >= cfg->max_recv_wr &&
			       ia.cap.max_recv_sge >= cfg->max_recv_sge,
		       "ibv_create_qp wrote back recv caps below the request: wr %u sge %u",
		       ia.cap.max_recv_wr, ia.cap.max_recv_sge);
	CHECK(qp->context == d->ctx);
	CHECK(qp->pd == d->pd);
	CHECK(qp->send_cq == scq && qp->recv_cq == rcq && qp->srq == srq);
	CHECK_EQ(qp->qp_type, IBV_QPT_RC);
	CHECK_EQ(qp->state, IBV_QPS_RESET);
	if (cap_out)
		*cap_out = ia.cap;
	return qp;
}

int sv_modify_init(struct ibv_qp *qp, const struct sv_pair_cfg *cfg)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = cfg->access;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static const union ibv_gid *traded_gid_of(const struct ibv_qp *qp);

int sv_modify_rtr(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest_qpn,
		  const struct sv_pair_cfg *cfg)
{
	const union ibv_gid *peer_gid = traded_gid_of(qp);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = cfg->mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = cfg->psn;
	a.max_dest_rd_atomic = cfg->max_rd_atomic;
	a.min_rnr_timer = cfg->min_rnr_timer;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer_gid ? *peer_gid : d->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.dlid = 0;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
}

int sv_modify_rts(struct ibv_qp *qp, const struct sv_pair_cfg *cfg)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = cfg->timeout;
	a.retry_cnt = cfg->retry_cnt;
	a.rnr_retry = cfg->rnr_retry;
	a.sq_psn = cfg->psn;
	a.max_rd_atomic = cfg->max_rd_atomic;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

void sv_connect(struct sv_dev *d, struct ibv_qp *a, struct ibv_qp *b,
		const struct sv_pair_cfg *cfg)
{
	CHECK_OK(sv_modify_init(a, cfg));
	CHECK_OK(sv_modify_init(b, cfg));
	CHECK_OK(sv_modify_rtr(a, d, b->qp_num, cfg));
	CHECK_OK(sv_modify_rtr(b, d, a->qp_num, cfg));
	CHECK_OK(sv_modify_rts(a, cfg));
	CHECK_OK(sv_modify_rts(b, cfg));
}

int sv_modify_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

enum ibv_qp_state sv_query_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	CHECK_OK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia));
	return a.qp_state;
}

void sv_pair_create(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct sv_pair *p)
{
	memset(p, 0, sizeof(*p));
	p->dev = d;
	p->cfg = *cfg;
	for (int i = 0; i < 2; i++) {
		p->scq[i] = sv_create_cq(d, cfg->send_cqe, &p->scq[i], cfg->channel);
		if (cfg->shared_cq)
			p->rcq[i] = p->scq[i];
		else
			p->rcq[i] = sv_create_cq(d, cfg->recv_cqe, &p->rcq[i], cfg->channel);
	}
	if (cfg->use_srq) {
		struct ibv_srq_init_attr sa;
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = cfg->srq_max_wr;
		sa.attr.max_sge = cfg->max_recv_sge;
		p->srq = ibv_create_srq(d->pd, &sa);
		CHECKF(p->srq != NULL, "ibv_create_srq failed: %s", strerror(errno));
	}
	for (int i = 0; i < 2; i++)
		p->qp[i] = sv_create_qp(d, cfg, p->scq[i], p->rcq[i], p->srq, &p->cap[i]);
}

void sv_pair_open(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct sv_pair *p)
{
	struct sv_pair_cfg defaults;
	if (!cfg) {
		sv_pair_cfg_init(&defaults);
		cfg = &defaults;
	}
	sv_pair_create(d, cfg, p);
	sv_connect(d, p->qp[0], p->qp[1], cfg);
}

struct ibv_comp_channel *sv_pair_open_with_channel(struct sv_dev *d,
						   const struct sv_pair_cfg *cfg,
						   struct sv_pair *p)
{
	struct sv_pair_cfg c;
	if (cfg)
		c = *cfg;
	else
		sv_pair_cfg_init(&c);
	c.channel = ibv_create_comp_channel(d->ctx);
	CHECKF(c.channel != NULL, "ibv_create_comp_channel failed: %s", strerror(errno));
	CHECK(c.channel->context == d->ctx);
	CHECK(c.channel->fd >= 0);
	sv_pair_open(d, &c, p);
	return c.channel;
}

void sv_pair_destroy(struct sv_pair *p)
{
	for (int i = 0; i < 2; i++) {
		if (p->qp[i])
			CHECK_OK(ibv_destroy_qp(p->qp[i]));
		p->qp[i] = NULL;
	}
	if (p->srq)
		CHECK_OK(ibv_destroy_srq(p->srq));
	p->srq = NULL;
	for (int i = 0; i < 2; i++) {
		if (p->rcq[i] && p->rcq[i] != p->scq[i])
			CHECK_OK(ibv_destroy_cq(p->rcq[i]));
		if (p->scq[i])
			CHECK_OK(ibv_destroy_cq(p->scq[i]));
		p->rcq[i] = p->scq[i] = NULL;
	}
}

/* ---- the usual setup ----------------------------------------------------------------- */

void sv_fixture_open(struct sv_fixture *f, const struct sv_pair_cfg *cfg, int with_channel)
{
	memset(f, 0, sizeof(*f));
	sv_open(&f->dev);
	if (with_channel)
		f->ch = sv_pair_open_with_channel(&f->dev, cfg, &f->pair);
	else
		sv_pair_open(&f->dev, cfg, &f->pair);
	for (int i = 0; i < 2; i++)
		f->mr[i] = sv_alloc_mr(f->dev.pd, SV_FIXTURE_MR_LEN, SV_ACCESS_ALL);
}

void sv_fixture_close(struct sv_fixture *f)
{
	for (int i = 0; i < 2; i++)
		sv_free_mr(f->mr[i]);
	sv_pair_destroy(&f->pair);
	if (f->ch)
		CHECK_OK(ibv_destroy_comp_channel(f->ch));
	sv_close(&f->dev);
}

/* ---- memory and work requests -------------------------------------------------------- */

struct ibv_mr *sv_alloc_mr(struct ibv_pd *pd, size_t len, unsigned access)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t alloc = (len + page - 1) / page * page;
	void *buf = aligned_alloc(page, alloc ? alloc : page);
	CHECK(buf != NULL);
	memset(buf, 0, alloc ? alloc : page);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
	CHECKF(mr != NULL, "ibv_reg_mr(len %zu, access 0x%x) failed: %s", len, access,
	       strerror(errno));
	CHECK(mr->addr == buf);
	CHECK_EQ(mr->length, len);
	CHECK(mr->pd == pd);
	return mr;
}

void sv_free_mr(struct ibv_mr *mr)
{
	void *buf = mr->addr;
	CHECK_OK(ibv_dereg_mr(mr));
	free(buf);
}

uint8_t *sv_ptr(struct ibv_mr *mr, size_t off)
{
	return (uint8_t *)mr->addr + off;
}

uint64_t sv_addr(struct ibv_mr *mr, size_t off)
{
	return (uint64_t)(uintptr_t)sv_ptr(mr, off);
}

void sv_wr_init(struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t wr_id,
		enum ibv_wr_opcode op, struct ibv_mr *mr, size_t off, uint32_t len,
		unsigned send_flags)
{
	memset(wr, 0, sizeof(*wr));
	memset(sge, 0, sizeof(*sge));
	if (mr) {
		sge->addr = sv_addr(mr, off);
		sge->lkey = mr->lkey;
	}
	sge->length = len;
	wr->wr_id = wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = op;
	wr->send_flags = send_flags;
}

int sv_post_send(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		 uint32_t len, unsigned send_flags)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, wr_id, IBV_WR_SEND, mr, off, len, send_flags);
	return ibv_post_send(qp, &wr, &bad);
}

int sv_post_rdma(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_mr *mr,
		 size_t off, uint32_t len, unsigned send_flags, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_sge sge;
	sv_wr_init(&wr, &sge, wr_id, op, mr, off, len, send_flags);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static void recv_wr_init(struct ibv_recv_wr *wr, struct ibv_sge *sge, uint64_t wr_id,
			 struct ibv_mr *mr, size_t off, uint32_t len)
{
	memset(wr, 0, sizeof(*wr));
	sge->addr = sv_addr(mr, off);
	sge->length = len;
	sge->lkey = mr->lkey;
	wr->wr_id = wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
}

int sv_post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		 uint32_t len)
{
	struct ibv_recv_wr wr, *bad = NULL;
	struct ibv_sge sge;
	recv_wr_init(&wr, &sge, wr_id, mr, off, len);
	return ibv_post_recv(qp, &wr, &bad);
}

int sv_post_srq_recv(struct ibv_srq *srq, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		     uint32_t len)
{
	struct ibv_recv_wr wr, *bad = NULL;
	struct ibv_sge sge;
	recv_wr_init(&wr, &sge, wr_id, mr, off, len);
	return ibv_post_srq_recv(srq, &wr, &bad);
}

/* ---- completions ------------------------------------------------------------------- */

int sv_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc, int timeout_ms)
{
	long long deadline = sv_now_ms() + timeout_ms;
	int got = 0;
	for (;;) {
		int want = n - got;
		int ne = ibv_poll_cq(cq, want, wc + got);
		CHECKF(ne >= 0 && ne <= want, "ibv_poll_cq(num_entries=%d) returned %d", want, ne);
		got += ne;
		if (got == n || sv_now_ms() > deadline)
			return got;
		if (ne == 0)
			usleep(50);
	}
}

void sv_poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	CHECKF(sv_poll(cq, 1, wc, SV_WAIT_MS) == 1, "no completion within %d ms", SV_WAIT_MS);
}

void sv_expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
		  struct ibv_qp *qp, struct ibv_wc *out)
{
	struct ibv_wc wc;
	CHECKF(sv_poll(cq, 1, &wc, SV_WAIT_MS) == 1,
	       "no completion within %d ms (expected wr_id 0x%llx, %s)", SV_WAIT_MS,
	       (unsigned long long)wr_id, sv_wc_status_name(status));
	CHECK_WC(wc, wr_id, status, qp);
	if (out)
		*out = wc;
}

void sv_expect_empty(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	int ne = ibv_poll_cq(cq, 1, &wc);
	CHECKF(ne == 0, "%s: expected an empty CQ, ibv_poll_cq returned %d (wr_id 0x%llx, %s, %s)",
	       what, ne, (unsigned long long)wc.wr_id, sv_wc_status_name(wc.status),
	       sv_wc_opcode_name(wc.opcode));
}

void sv_send_recv(struct sv_pair *p, int from, uint64_t id, struct ibv_mr *smr,
		  struct ibv_mr *rmr, uint32_t len, unsigned send_flags, struct ibv_wc *rwc)
{
	int to = 1 - from;
	uint32_t rlen = rmr->length > UINT32_MAX ? UINT32_MAX : (uint32_t)rmr->length;
	CHECK_OK(sv_post_recv(p->qp[to], id, rmr, 0, rlen));
	CHECK_OK(sv_post_send(p->qp[from], id, smr, 0, len, send_flags | IBV_SEND_SIGNALED));
	sv_expect_wc(p->scq[from], id, IBV_WC_SUCCESS, p->qp[from], NULL);
	struct ibv_wc wc;
	sv_expect_wc(p->rcq[to], id, IBV_WC_SUCCESS, p->qp[to], &wc);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, len);
	if (rwc)
		*rwc = wc;
}

/* ---- file descriptors and events --------------------------------------------------- */

int sv_fd_readable(int fd, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	long long deadline = sv_now_ms() + timeout_ms;
	for (;;) {
		int left = (int)(deadline - sv_now_ms());
		int r = poll(&pfd, 1, left > 0 ? left : 0);
		if (r < 0 && errno == EINTR)
			continue;
		CHECKF(r >= 0, "poll(fd %d) failed: %s", fd, strerror(errno));
		CHECKF(!(pfd.revents & (POLLNVAL | POLLERR)), "poll(fd %d): revents 0x%x", fd,
		       pfd.revents);
		return r > 0 && (pfd.revents & POLLIN);
	}
}

void sv_set_nonblock(int fd, int on)
{
	int flags = fcntl(fd, F_GETFL);
	CHECK(flags >= 0);
	flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
	CHECK(fcntl(fd, F_SETFL, flags) == 0);
}

int sv_wait_cq_event(struct ibv_comp_channel *ch, int timeout_ms, struct ibv_cq **cq,
		     void **cq_ctx)
{
	if (!sv_fd_readable(ch->fd, timeout_ms))
		return 0;
	*cq = NULL;
	*cq_ctx = NULL;
	CHECKF(ibv_get_cq_event(ch, cq, cq_ctx) == 0,
	       "channel fd was readable but ibv_get_cq_event failed: %s", strerror(errno));
	CHECK(*cq != NULL);
	return 1;
}

void sv_expect_cq_event(struct ibv_comp_channel *ch, struct ibv_cq *cq)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECKF(sv_wait_cq_event(ch, SV_WAIT_MS, &ev_cq, &ev_ctx),
	       "no completion event for CQ %p within %d ms", (void *)cq, SV_WAIT_MS);
	CHECKF(ev_cq == cq, "completion event for CQ %p, expected CQ %p", (void *)ev_cq,
	       (void *)cq);
	CHECK(ev_ctx == cq->cq_context);
	ibv_ack_cq_events(ev_cq, 1);
}

void sv_expect_no_cq_event(struct ibv_comp_channel *ch, const char *why)
{
	if (sv_fd_readable(ch->fd, SV_QUIET_MS)) {
		struct ibv_cq *cq = NULL;
		void *ctx = NULL;
		int r = ibv_get_cq_event(ch, &cq, &ctx);
		sv_fail(__FILE__, __LINE__,
			"unexpected completion event (%s): ibv_get_cq_event returned %d, CQ %p",
			why, r, (void *)cq);
	}
}

int sv_wait_async(struct ibv_context *ctx, int timeout_ms, struct ibv_async_event *ev)
{
	if (!sv_fd_readable(ctx->async_fd, timeout_ms))
		return 0;
	memset(ev, 0, sizeof(*ev));
	CHECKF(ibv_get_async_event(ctx, ev) == 0,
	       "async fd was readable but ibv_get_async_event failed: %s", strerror(errno));
	return 1;
}

void sv_drain_async(struct ibv_context *ctx, int timeout_ms)
{
	struct ibv_async_event ev;
	while (sv_wait_async(ctx, timeout_ms, &ev)) {
		printf("   (async event %s for %p)\n", sv_event_name(ev.event_type),
		       sv_async_element(&ev));
		ibv_ack_async_event(&ev);
	}
}

void *sv_async_element(const struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		return ev->element.cq;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return ev->element.srq;
	case IBV_EVENT_WQ_FATAL:
		return ev->element.wq;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return ev->element.qp;
	default:
		return NULL;
	}
}

void sv_expect_async(struct ibv_context *ctx, enum ibv_event_type type, void *element)
{
	long long deadline = sv_now_ms() + SV_WAIT_MS;
	for (;;) {
		int left = (int)(deadline - sv_now_ms());
		struct ibv_async_event ev;
		CHECKF(left > 0 && sv_wait_async(ctx, left, &ev),
		       "no async event %s for %p within %d ms", sv_event_name(type), element,
		       SV_WAIT_MS);
		void *el = sv_async_element(&ev);
		int match = ev.event_type == type && el == element;
		if (!match)
			printf("   (async event %s for %p while waiting for %s for %p)\n",
			       sv_event_name(ev.event_type), el, sv_event_name(type), element);
		ibv_ack_async_event(&ev);
		if (match)
			return;
	}
}

/* ---- ordering checks with a thread -------------------------------------------------- */

struct destroy_call {
	int (*destroy)(void *obj);
	void *obj;
	atomic_int started;
	atomic_int returned;
	atomic_int released; /* set by the caller just before it releases the event */
	int ret;
	int released_at_return;
};

static void *destroy_main(void *arg)
{
	struct destroy_call *c = arg;
	atomic_store(&c->started, 1);
	c->ret = c->destroy(c->obj);
	c->released_at_return = atomic_load(&c->released);
	atomic_store(&c->returned, 1);
	return NULL;
}

void sv_expect_destroy_waits(int (*destroy)(void *obj), void *obj,
			     void (*release)(void *arg), void *release_arg, const char *what)
{
	struct destroy_call c = { .destroy = destroy, .obj = obj };
	atomic_init(&c.started, 0);
	atomic_init(&c.returned, 0);
	atomic_init(&c.released, 0);
	pthread_t thread;
	CHECK_OK(pthread_create(&thread, NULL, destroy_main, &c));
	while (!atomic_load(&c.started))
		usleep(100);
	sv_sleep_ms(SV_QUIET_MS); /* give a wrong implementation the chance to return early */
	CHECKF(!atomic_load(&c.returned), "%s returned (%d) while its event was still unacked",
	       what, c.ret);
	atomic_store(&c.released, 1);
	release(release_arg);
	CHECK_OK(pthread_join(thread, NULL)); /* the watchdog catches a destroy that never returns */
	CHECKF(c.ret == 0, "%s returned %d (%s)", what, c.ret, strerror(c.ret));
	CHECKF(c.released_at_return == 1, "%s returned before the event was acked", what);
}

int sv_destroy_cq_fn(void *cq)
{
	return ibv_destroy_cq(cq);
}

int sv_destroy_qp_fn(void *qp)
{
	return ibv_destroy_qp(qp);
}

/* ---- a peer process ---------------------------------------------------------------- */

int sv_peer_on_other_host(void)
{
	const char *ns = getenv("SV_PEER_NETNS");
	return ns && *ns;
}

/* In the forked peer, before anything else: become a process of the other host, its
 * network namespace (its addresses, its abstract sockets) and its state directory. */
static void enter_peer_host(void)
{
	const char *ns = getenv("SV_PEER_NETNS"), *dir = getenv("SV_PEER_STATE_DIR");
	CHECKF(dir && *dir, "SV_PEER_NETNS is set but SV_PEER_STATE_DIR is not");
	char path[256];
	CHECKF(snprintf(path, sizeof(path), "/run/netns/%s", ns) < (int)sizeof(path),
	       "SV_PEER_NETNS too long");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECKF(fd >= 0, "open(%s) failed: %s", path, strerror(errno));
	CHECKF(setns(fd, CLONE_NEWNET) == 0, "setns(%s) failed: %s", path, strerror(errno));
	close(fd);
	CHECK(setenv("SOFTVERBS_STATE_DIR", dir, 1) == 0);
}

/* The GIDs traded by sv_trade_gid, by our QP number. */
static struct {
	uint32_t qpn;
	union ibv_gid gid;
} traded_gids[16];
static int num_traded_gids;

static const union ibv_gid *traded_gid_of(const struct ibv_qp *qp)
{
	for (int i = 0; i < num_traded_gids; i++)
		if (traded_gids[i].qpn == qp->qp_num)
			return &traded_gids[i].gid;
	return NULL;
}

const union ibv_gid *sv_peer_gid(const struct ibv_qp *qp)
{
	return traded_gid_of(qp);
}

void sv_trade_gid(int sock, const struct ibv_qp *qp)
{
	if (!sv_peer_on_other_host())
		return;
	union ibv_gid mine, theirs;
	CHECK_EQ(ibv_query_gid(qp->context, 1, sv_gid_index(), &mine), 0);
	sv_exchange(sock, &mine, &theirs, sizeof(mine));
	CHECKF(memcmp(&mine, &theirs, sizeof(mine)) != 0,
	       "the peer on the other host has our GID: SV_GID_INDEX names no host address?");
	CHECK(num_traded_gids < (int)(sizeof(traded_gids) / sizeof(traded_gids[0])));
	traded_gids[num_traded_gids].qpn = qp->qp_num;
	traded_gids[num_traded_gids].gid = theirs;
	num_traded_gids++;
}

int sv_fork_peer(void (*peer_main)(int sock), pid_t *pid)
{
	int sv[2];
	pid_t child;
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	child = fork();
	CHECK(child >= 0);
	*pid = child;
	if (child == 0) {
		close(sv[0]);
		if (sv_peer_on_other_host())
			enter_peer_host();
		peer_main(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	return sv[0];
}

#define SPAWNED_PEER_FLAG "--sv-spawned-peer="

int sv_spawn_peer(pid_t *pid)
{
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	char exe[4096], flag[64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	CHECK(n > 0);
	exe[n] = '\0';
	snprintf(flag, sizeof(flag), SPAWNED_PEER_FLAG "%d", sv[1]);
	posix_spawn_file_actions_t fa;
	CHECK(posix_spawn_file_actions_init(&fa) == 0);
	/* dup2 onto itself keeps the fd open across exec (clears FD_CLOEXEC, glibc >= 2.29);
	 * our end and every other descriptor of ours stay behind. */
	CHECK(posix_spawn_file_actions_adddup2(&fa, sv[1], sv[1]) == 0);
	char *argv[] = {exe, flag, NULL};
	extern char **environ;
	int err = posix_spawn(pid, exe, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	CHECKF(err == 0, "posix_spawn(%s) failed: %s", exe, strerror(err));
	close(sv[1]);
	return sv[0];
}

int sv_spawned_peer(int argc, char **argv)
{
	if (argc != 2 || strncmp(argv[1], SPAWNED_PEER_FLAG, strlen(SPAWNED_PEER_FLAG)) != 0)
		return -1;
	int fd = atoi(argv[1] + strlen(SPAWNED_PEER_FLAG));
	CHECK(fd > 2 && fcntl(fd, F_GETFD) >= 0);
	if (sv_peer_on_other_host())
		enter_peer_host();
	return fd;
}

uint32_t sv_trade_qpn(int sock, const struct ibv_qp *qp)
{
	uint32_t me = qp->qp_num, peer;
	sv_exchange(sock, &me, &peer, sizeof(me));
	sv_trade_gid(sock, qp);
	return peer;
}

void sv_trade_remote(int sock, const struct ibv_qp *qp, const struct ibv_mr *mr,
		     struct sv_remote *peer)
{
	struct sv_remote me;
	memset(&me, 0, sizeof(me));
	me.qpn = qp->qp_num;
	me.addr = (uint64_t)(uintptr_t)mr->addr;
	me.rkey = mr->rkey;
	sv_exchange(sock, &me, peer, sizeof(me));
	sv_trade_gid(sock, qp);
}

void sv_connect_remote(struct ibv_qp *qp, const struct sv_dev *d, const struct sv_pair_cfg *cfg,
		       uint32_t peer_qpn, struct ibv_mr *mr, uint64_t first_id, int nrecv,
		       uint32_t recv_len)
{
	CHECK_OK(sv_modify_init(qp, cfg));
	for (int i = 0; i < nrecv; i++)
		CHECK_OK(sv_post_recv(qp, first_id + (uint64_t)i, mr, (size_t)i * recv_len,
				      recv_len));
	CHECK_OK(sv_modify_rtr(qp, d, peer_qpn, cfg));
	CHECK_OK(sv_modify_rts(qp, cfg));
}

void sv_one_qp_open(struct sv_one_qp *p, const struct sv_pair_cfg *cfg, int cqe, size_t mr_len)
{
	memset(p, 0, sizeof(*p));
	sv_open(&p->dev);
	if (cfg)
		p->cfg = *cfg;
	else
		sv_pair_cfg_init(&p->cfg);
	p->cq = sv_create_cq(&p->dev, cqe, NULL, NULL);
	p->qp = sv_create_qp(&p->dev, &p->cfg, p->cq, p->cq, NULL, NULL);
	if (mr_len)
		p->mr = sv_alloc_mr(p->dev.pd, mr_len, SV_ACCESS_ALL);
}

void sv_one_qp_connect(struct sv_one_qp *p, uint32_t peer_qpn, uint64_t first_id, int nrecv,
		       uint32_t recv_len)
{
	sv_connect_remote(p->qp, &p->dev, &p->cfg, peer_qpn, p->mr, first_id, nrecv, recv_len);
}

void sv_one_qp_close(struct sv_one_qp *p)
{
	if (p->qp)
		CHECK_OK(ibv_destroy_qp(p->qp));
	p->qp = NULL;
	if (p->mr)
		sv_free_mr(p->mr);
	p->mr = NULL;
	if (p->cq)
		CHECK_OK(ibv_destroy_cq(p->cq));
	p->cq = NULL;
	sv_close(&p->dev);
}

void sv_requester_open(struct sv_one_qp *r, int sock)
{
	sv_one_qp_open(r, NULL, 64, 4096);
	sv_one_qp_connect(r, sv_trade_qpn(sock, r->qp), 0, 0, 0);
}

int sv_each_fd(pid_t pid, int (*fn)(const char *path, const char *target, void *arg), void *arg)
{
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	CHECKF(d != NULL, "opendir(%s) failed: %s", dir, strerror(errno));
	int r = 0;
	struct dirent *e;
	while (!r && (e = readdir(d)) != NULL) {
		char path[512], target[256];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		r = fn(path, target, arg);
	}
	closedir(d);
	return r;
}

double sv_cpu_seconds(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields 14 and 15 (utime, stime, in clock ticks) follow the ")" that ends the name. */
	const char *p = strrchr(buf, ')');
	CHECK(p != NULL);
	unsigned long utime = 0, stime = 0;
	CHECK_EQ(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
			&stime),
		 2);
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

void sv_wait_peer(pid_t pid, const char *who)
{
	int status;
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s died or failed (status %d)", who,
	       status);
}

void sv_exchange(int sock, const void *ours, void *theirs, size_t n)
{
	CHECK(write(sock, ours, n) == (ssize_t)n);
	CHECK(read(sock, theirs, n) == (ssize_t)n);
}

void sv_say(int sock, int step)
{
	CHECK(write(sock, &step, sizeof(step)) == sizeof(step));
}

int sv_hear(int sock)
{
	int step = -1;
	CHECK(read(sock, &step, sizeof(step)) == sizeof(step));
	return step;
}
