/*
 * rpma_pair: a librpma (Debian's librpma0) client and server, written only against
 * <librpma.h>, to check that librpma works over softverbs. Run the two sides as two processes:
 *
 *   rpma_pair server ADDR PORT [both|plain|shared]
 *   rpma_pair client ADDR PORT [both|plain|shared]
 *
 * Both sides pick their device with rpma_utils_get_ibv_context (LOCAL on the server, REMOTE
 * on the client), create a peer, register one memory region and swap MR descriptors through
 * the connection's private data.
 *
 * "plain" connection (own completion channel per CQ, no receive CQ):
 *   client: rpma_read of the server's pattern, rpma_write of its own pattern, rpma_read back,
 *           rpma_send of a message, rpma_recv of the server's reply; then it disconnects.
 *   server: rpma_recv of the client's message, checks that the client's write landed,
 *           rpma_read of the client's pattern, rpma_send of the reply; then waits for
 *           RPMA_CONN_CLOSED and disconnects its side.
 *   Every completion is waited for with rpma_cq_wait and collected with rpma_cq_get_wc.
 * "shared" connection (rpma_conn_cfg_set_compl_channel(cfg, true) and a receive CQ):
 *   rpma_cq_wait on either CQ must fail with RPMA_E_SHARED_CHANNEL; completions are waited
 *   for with rpma_conn_wait, which must name the right CQ (the RCQ for receives). This time
 *   the server disconnects first.
 * "both" (the default) runs the plain connection, then the shared one.
 *
 * Each checked step prints a "PASS <side>: ..." line; any failure prints "FAIL <side>: ..." and
 * exits 1. Every wait is bounded: each blocking librpma call is made only once poll(2) says
 * its fd is readable (STEP_TIMEOUT_MS), and a watchdog ends the process after
 * RPMA_PAIR_TIMEOUT seconds (default 25) with exit code 3.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <librpma.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEP_TIMEOUT_MS 10000
#define MR_SIZE 4096
#define MSG_MAX 64

/* The server's region. */
#define S_PATTERN_OFF 0   /* the server's own pattern; the client reads it */
#define S_WRITE1_OFF 256  /* the client writes here on the plain connection */
#define S_READ_OFF 512    /* the server reads the client's pattern into here */
#define S_WRITE2_OFF 768  /* the client writes here on the shared connection */
/* The client's region. */
#define C_PATTERN_OFF 0   /* the client's own pattern; the server reads it */
#define C_WRITE_SRC_OFF 256
#define C_READ1_OFF 512   /* the server's pattern, read */
#define C_READ2_OFF 768   /* the client's write, read back */
/* Both. */
#define RECV_OFF 1024
#define SEND_OFF 2048
#define CHUNK 256

/* op_context values: they come back as wc.wr_id. */
enum { OP_READ1 = 1, OP_WRITE1, OP_READ2, OP_SEND, OP_RECV, OP_WRITE2 };

static const char *side = "?";

static void fail(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fprintf(stderr, "FAIL %s: ", side);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void pass(const char *fmt, ...)
{
	va_list ap;
	printf("PASS %s: ", side);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* CHK(call): a librpma call that must return 0. */
#define CHK(call)                                                                        \
	do {                                                                             \
		int chk_ret_ = (call);                                                   \
		if (chk_ret_ != 0)                                                       \
			fail("%s returned %d (%s)", #call, chk_ret_,                     \
			     rpma_err_2str(chk_ret_));                                   \
	} while (0)

/* EXPECT_RET(call, want): a librpma call that must return exactly want. */
#define EXPECT_RET(call, want)                                                           \
	do {                                                                             \
		int chk_ret_ = (call);                                                   \
		if (chk_ret_ != (want))                                                  \
			fail("%s returned %d (%s), expected %s", #call, chk_ret_,        \
			     rpma_err_2str(chk_ret_), #want);                            \
	} while (0)

static void on_watchdog(int sig)
{
	(void)sig;
	static const char msg[] = "FAIL watchdog: rpma_pair ran out of time\n";
	ssize_t unused = write(STDERR_FILENO, msg, sizeof(msg) - 1);
	(void)unused;
	_exit(3);
}

/* wait_readable: poll the fds until at least one is readable; fail after the step timeout.
 * ready[i] tells whether fds[i] is. */
static void wait_readable(const int *fds, int n, bool *ready, const char *what)
{
	struct pollfd pfd[4];
	for (int i = 0; i < n; i++)
		pfd[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
	for (;;) {
		int r = poll(pfd, (nfds_t)n, STEP_TIMEOUT_MS);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail("poll (%s): %s", what, strerror(errno));
		if (r == 0)
			fail("nothing on the fd within %d ms while waiting for %s",
			     STEP_TIMEOUT_MS, what);
		break;
	}
	for (int i = 0; i < n; i++) {
		if (pfd[i].revents & (POLLERR | POLLNVAL))
			fail("poll (%s): fd %d revents 0x%x", what, fds[i], pfd[i].revents);
		ready[i] = (pfd[i].revents & (POLLIN | POLLHUP)) != 0;
	}
}

static void wait_fd(int fd, const char *what)
{
	bool ready;
	wait_readable(&fd, 1, &ready, what);
}

static uint8_t pattern(int which, size_t i)
{
	return (uint8_t)(i * (size_t)(2 * which + 5) + (size_t)which * 31 + 1);
}

static void fill(char *buf, int which)
{
	for (size_t i = 0; i < CHUNK; i++)
		buf[i] = (char)pattern(which, i);
}

static bool same(const char *buf, int which)
{
	for (size_t i = 0; i < CHUNK; i++)
		if ((uint8_t)buf[i] != pattern(which, i))
			return false;
	return true;
}

/* The patterns: the server's own, the client's own, what the client writes on the plain and
 * on the shared connection. */
enum { PAT_SERVER = 1, PAT_CLIENT, PAT_WRITE1, PAT_WRITE2 };

static const char *conn_event_name(enum rpma_conn_event ev)
{
	return rpma_utils_conn_event_2str(ev);
}

/* next_conn_event: the next connection event, once the event fd is readable. */
static enum rpma_conn_event next_conn_event(struct rpma_conn *conn, const char *what)
{
	int fd;
	enum rpma_conn_event ev = RPMA_CONN_UNDEFINED;
	CHK(rpma_conn_get_event_fd(conn, &fd));
	wait_fd(fd, what);
	CHK(rpma_conn_next_event(conn, &ev));
	return ev;
}

static void expect_conn_event(struct rpma_conn *conn, enum rpma_conn_event want,
			      const char *what)
{
	enum rpma_conn_event ev = next_conn_event(conn, what);
	if (ev != want)
		fail("rpma_conn_next_event gave %s while waiting for %s (expected %s)",
		     conn_event_name(ev), what, conn_event_name(want));
}

/*
 * A connection's completions. await_wc() waits for the completion of one op_context: it blocks
 * on the CQ's fd (or the shared channel's), calls rpma_cq_wait (or rpma_conn_wait), then drains
 * that CQ (the one rpma_conn_wait named) with rpma_cq_get_wc into a small list of completions
 * not yet asked for, as the send and receive completions of one CQ may come in either order.
 * A CQ is drained only after a wait has re-armed it, so no completion goes unnoticed: one that
 * came before the re-arm is drained now, one that comes after it raises a new event.
 */
struct pending {
	struct ibv_wc wc;
	bool from_rcq;
};

struct link {
	struct rpma_conn *conn;
	struct rpma_cq *cq, *rcq; /* rcq: NULL without a receive CQ */
	bool shared;
	int waits;     /* rpma_cq_wait or rpma_conn_wait returned 0 */
	int rcq_waits; /* ... for the receive CQ (rpma_conn_wait's is_rcq) */
	struct pending pend[16];
	int npend;
};

static bool drain(struct link *l, struct rpma_cq *cq, bool is_rcq)
{
	bool got = false;
	for (;;) {
		struct ibv_wc wc[4];
		int n = 0;
		int ret = rpma_cq_get_wc(cq, 4, wc, &n);
		if (ret == RPMA_E_NO_COMPLETION)
			return got;
		if (ret)
			fail("rpma_cq_get_wc returned %d (%s)", ret, rpma_err_2str(ret));
		if (n < 1 || n > 4)
			fail("rpma_cq_get_wc returned 0 but num_entries_got = %d", n);
		for (int i = 0; i < n; i++) {
			if (l->npend == (int)(sizeof(l->pend) / sizeof(l->pend[0])))
				fail("too many unexpected completions");
			l->pend[l->npend++] = (struct pending){ .wc = wc[i], .from_rcq = is_rcq };
		}
		got = true;
	}
}

static struct ibv_wc await_wc(struct link *l, uint64_t op, const char *what, bool *from_rcq)
{
	for (;;) {
		for (int i = 0; i < l->npend; i++) {
			if (l->pend[i].wc.wr_id != op)
				continue;
			struct pending p = l->pend[i];
			l->pend[i] = l->pend[--l->npend];
			if (from_rcq)
				*from_rcq = p.from_rcq;
			return p.wc;
		}
		if (!l->shared) {
			int fds[2], n = 0;
			struct rpma_cq *cqs[2] = { l->cq, l->rcq };
			CHK(rpma_cq_get_fd(l->cq, &fds[n++]));
			if (l->rcq)
				CHK(rpma_cq_get_fd(l->rcq, &fds[n++]));
			bool ready[2] = { false, false };
			wait_readable(fds, n, ready, what);
			for (int i = 0; i < n; i++) {
				if (!ready[i])
					continue;
				int ret = rpma_cq_wait(cqs[i]);
				if (ret)
					fail("rpma_cq_wait (%s) returned %d (%s)", what, ret,
					     rpma_err_2str(ret));
				l->waits++;
				drain(l, cqs[i], cqs[i] == l->rcq);
			}
		} else {
			int fd;
			struct rpma_cq *which = NULL;
			bool is_rcq = false;
			CHK(rpma_conn_get_compl_fd(l->conn, &fd));
			wait_fd(fd, what);
			int ret = rpma_conn_wait(l->conn, 0, &which, &is_rcq);
			if (ret)
				fail("rpma_conn_wait (%s) returned %d (%s)", what, ret,
				     rpma_err_2str(ret));
			if (which != (is_rcq ? l->rcq : l->cq))
				fail("rpma_conn_wait gave cq %p with is_rcq %d; cq %p, rcq %p",
				     (void *)which, is_rcq, (void *)l->cq, (void *)l->rcq);
			l->waits++;
			if (is_rcq)
				l->rcq_waits++;
			drain(l, which, is_rcq);
		}
	}
}

/* check_wc: the completion of op is a success of the given opcode; byte_len is checked when
 * want_len >= 0 (receives and RDMA reads). */
static void check_wc(struct link *l, uint64_t op, enum ibv_wc_opcode opcode, long want_len,
		     const char *what, bool want_rcq)
{
	bool from_rcq = false;
	struct ibv_wc wc = await_wc(l, op, what, &from_rcq);
	if (wc.status != IBV_WC_SUCCESS)
		fail("%s: wc.status %d (expected IBV_WC_SUCCESS), vendor_err %u", what,
		     (int)wc.status, wc.vendor_err);
	if (wc.opcode != opcode)
		fail("%s: wc.opcode %d, expected %d", what, (int)wc.opcode, (int)opcode);
	if (want_len >= 0 && wc.byte_len != (uint32_t)want_len)
		fail("%s: wc.byte_len %u, expected %ld", what, wc.byte_len, want_len);
	if (from_rcq != want_rcq)
		fail("%s: completion came from the %s, expected the %s", what,
		     from_rcq ? "receive CQ" : "main CQ", want_rcq ? "receive CQ" : "main CQ");
	uint32_t qpn = 0;
	CHK(rpma_conn_get_qp_num(l->conn, &qpn));
	if (wc.qp_num != qpn)
		fail("%s: wc.qp_num %u, the connection's QP is %u", what, wc.qp_num, qpn);
	if (want_len >= 0)
		pass("%s: wc opcode %d, status SUCCESS, byte_len %u%s", what, (int)wc.opcode,
		     wc.byte_len, want_rcq ? ", on the receive CQ" : "");
	else
		pass("%s: wc opcode %d, status SUCCESS%s", what, (int)wc.opcode,
		     want_rcq ? ", on the receive CQ" : "");
}

static void link_init(struct link *l, struct rpma_conn *conn, bool shared)
{
	memset(l, 0, sizeof(*l));
	l->conn = conn;
	l->shared = shared;
	CHK(rpma_conn_get_cq(conn, &l->cq));
	CHK(rpma_conn_get_rcq(conn, &l->rcq));
	if (!l->cq)
		fail("rpma_conn_get_cq gave NULL");
	if (shared && !l->rcq)
		fail("rpma_conn_get_rcq gave NULL although an RCQ size was configured");
	if (!shared && l->rcq)
		fail("rpma_conn_get_rcq gave an RCQ although none was configured");
}

/* The checks on a connection's completion channel(s) that need no traffic. */
static void check_channels(struct link *l)
{
	int fd = -1, cq_fd = -1, rcq_fd = -1;
	struct rpma_cq *which = NULL;
	if (!l->shared) {
		EXPECT_RET(rpma_conn_get_compl_fd(l->conn, &fd), RPMA_E_NOT_SHARED_CHNL);
		EXPECT_RET(rpma_conn_wait(l->conn, 0, &which, NULL), RPMA_E_NOT_SHARED_CHNL);
		CHK(rpma_cq_get_fd(l->cq, &cq_fd));
		if (cq_fd < 0)
			fail("rpma_cq_get_fd gave fd %d", cq_fd);
		pass("own completion channel: rpma_conn_get_compl_fd and rpma_conn_wait return "
		     "RPMA_E_NOT_SHARED_CHNL, the CQ has fd %d", cq_fd);
		return;
	}
	CHK(rpma_conn_get_compl_fd(l->conn, &fd));
	CHK(rpma_cq_get_fd(l->cq, &cq_fd));
	CHK(rpma_cq_get_fd(l->rcq, &rcq_fd));
	if (fd < 0 || cq_fd != fd || rcq_fd != fd)
		fail("shared channel fd %d, but the CQ's fd is %d and the RCQ's %d", fd, cq_fd,
		     rcq_fd);
	EXPECT_RET(rpma_cq_wait(l->cq), RPMA_E_SHARED_CHANNEL);
	EXPECT_RET(rpma_cq_wait(l->rcq), RPMA_E_SHARED_CHANNEL);
	pass("shared completion channel (fd %d, the CQ's and the RCQ's): rpma_cq_wait on the CQ "
	     "and on the RCQ returns RPMA_E_SHARED_CHANNEL", fd);
}

static struct rpma_conn_cfg *make_cfg(bool shared)
{
	struct rpma_conn_cfg *cfg = NULL;
	bool got = !shared;
	CHK(rpma_conn_cfg_new(&cfg));
	CHK(rpma_conn_cfg_set_timeout(cfg, 5000));
	if (shared) {
		CHK(rpma_conn_cfg_set_compl_channel(cfg, true));
		CHK(rpma_conn_cfg_set_rcq_size(cfg, 8));
	}
	CHK(rpma_conn_cfg_get_compl_channel(cfg, &got));
	if (got != shared)
		fail("rpma_conn_cfg_get_compl_channel gave %d, expected %d", got, shared);
	return cfg;
}

/* A peer's MR descriptor from the connection's (or request's) private data. */
static struct rpma_mr_remote *remote_mr(const struct rpma_conn_private_data *pd, size_t desc_size,
					const char *from)
{
	struct rpma_mr_remote *rmr = NULL;
	size_t size = 0;
	if (pd->ptr == NULL || pd->len < desc_size)
		fail("private data from %s: %u bytes at %p, expected at least %zu", from,
		     (unsigned)pd->len, pd->ptr, desc_size);
	CHK(rpma_mr_remote_from_descriptor(pd->ptr, pd->len, &rmr));
	CHK(rpma_mr_remote_get_size(rmr, &size));
	if (size != MR_SIZE)
		fail("the remote MR from %s's descriptor has size %zu, expected %d", from, size,
		     MR_SIZE);
	pass("MR descriptor from %s's private data (%u bytes): remote MR of %zu bytes", from,
	     (unsigned)pd->len, size);
	return rmr;
}

struct local {
	struct rpma_peer *peer;
	struct rpma_mr_local *mr;
	char *buf;
	char desc[64];
	size_t desc_size;
};

/* [plain] rpma_read of the peer's CHUNK-byte pattern `pat` (at remote_off) to local_off,
 * with its completion and the bytes checked. */
static void read_peer_pattern(struct link *l, struct local *lo, struct rpma_mr_remote *rmr,
			      size_t local_off, size_t remote_off, int pat, const char *peer)
{
	char what[128];
	memset(lo->buf + local_off, 0, CHUNK);
	CHK(rpma_read(l->conn, lo->mr, local_off, rmr, remote_off, CHUNK,
		      RPMA_F_COMPLETION_ALWAYS, (void *)(uintptr_t)OP_READ1));
	snprintf(what, sizeof(what), "[plain] rpma_read of the %s's memory", peer);
	check_wc(l, OP_READ1, IBV_WC_RDMA_READ, CHUNK, what, false);
	if (!same(lo->buf + local_off, pat))
		fail("[plain] rpma_read brought the wrong bytes from the %s", peer);
	pass("[plain] rpma_read brought the %s's %d-byte pattern", peer, CHUNK);
}

/* rpma_send of `text` (with its NUL) from SEND_OFF, and its send completion (`what`). */
static void send_text(struct link *l, struct local *lo, const char *text, const char *what)
{
	strcpy(lo->buf + SEND_OFF, text);
	CHK(rpma_send(l->conn, lo->mr, SEND_OFF, strlen(text) + 1, RPMA_F_COMPLETION_ALWAYS,
		      (void *)(uintptr_t)OP_SEND));
	check_wc(l, OP_SEND, IBV_WC_SEND, -1, what, false);
}

static void local_setup(struct local *lo, const char *addr, bool server)
{
	struct ibv_context *ctx = NULL;
	CHK(rpma_utils_get_ibv_context(addr,
				       server ? RPMA_UTIL_IBV_CONTEXT_LOCAL
					      : RPMA_UTIL_IBV_CONTEXT_REMOTE,
				       &ctx));
	if (!ctx || !ctx->device)
		fail("rpma_utils_get_ibv_context gave no device");
	pass("rpma_utils_get_ibv_context(%s, %s): device %s", addr,
	     server ? "LOCAL" : "REMOTE", ctx->device->name);
	CHK(rpma_peer_new(ctx, &lo->peer));
	pass("rpma_peer_new");

	if (posix_memalign((void **)&lo->buf, 4096, MR_SIZE))
		fail("posix_memalign failed");
	memset(lo->buf, 0, MR_SIZE);
	fill(lo->buf + (server ? S_PATTERN_OFF : C_PATTERN_OFF), server ? PAT_SERVER : PAT_CLIENT);
	if (!server)
		fill(lo->buf + C_WRITE_SRC_OFF, PAT_WRITE1);
	int usage = RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC |
		    RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV;
	CHK(rpma_mr_reg(lo->peer, lo->buf, MR_SIZE, usage, &lo->mr));
	CHK(rpma_mr_get_descriptor_size(lo->mr, &lo->desc_size));
	if (lo->desc_size == 0 || lo->desc_size > sizeof(lo->desc))
		fail("rpma_mr_get_descriptor_size gave %zu", lo->desc_size);
	CHK(rpma_mr_get_descriptor(lo->mr, lo->desc));
	void *ptr = NULL;
	size_t size = 0;
	CHK(rpma_mr_get_ptr(lo->mr, &ptr));
	CHK(rpma_mr_get_size(lo->mr, &size));
	if (ptr != lo->buf || size != MR_SIZE)
		fail("rpma_mr_get_ptr/size gave %p/%zu, expected %p/%d", ptr, size,
		     (void *)lo->buf, MR_SIZE);
	pass("rpma_mr_reg of %d bytes, descriptor of %zu bytes", MR_SIZE, lo->desc_size);
}

static void local_teardown(struct local *lo)
{
	CHK(rpma_mr_dereg(&lo->mr));
	if (lo->mr)
		fail("rpma_mr_dereg left the pointer set");
	pass("rpma_mr_dereg");
	CHK(rpma_peer_delete(&lo->peer));
	if (lo->peer)
		fail("rpma_peer_delete left the pointer set");
	pass("rpma_peer_delete");
	free(lo->buf);
}

static void check_msg(const char *buf, const char *want, const char *what)
{
	if (strncmp(buf, want, MSG_MAX) != 0)
		fail("%s: received \"%.*s\", expected \"%s\"", what, MSG_MAX, buf, want);
	pass("%s: \"%s\"", what, want);
}

/* How often the connection's waits ran, and that no completion was left unclaimed. */
static void report_waits(struct link *l, const char *name, bool shared)
{
	if (l->waits < 1)
		fail("[%s] no wait was needed: rpma_%s_wait was never called", name,
		     shared ? "conn" : "cq");
	if (shared && l->rcq_waits < 1)
		fail("[shared] rpma_conn_wait never named the receive CQ");
	if (shared)
		pass("[shared] rpma_conn_wait returned 0 %d time(s), %d for the receive CQ",
		     l->waits, l->rcq_waits);
	else
		pass("[plain] rpma_cq_wait returned 0 %d time(s)", l->waits);
	if (l->npend)
		fail("[%s] %d unexpected completion(s) left over, the first with wr_id %" PRIu64,
		     name, l->npend, (uint64_t)l->pend[0].wc.wr_id);
}

/* A clean close: we disconnect and then see RPMA_CONN_CLOSED, or, when the peer goes
 * first, the other way round. */
static void close_conn(struct rpma_conn *conn, const char *name, bool peer_first,
		       const char *peer)
{
	if (peer_first) {
		expect_conn_event(conn, RPMA_CONN_CLOSED, "RPMA_CONN_CLOSED");
		pass("[%s] RPMA_CONN_CLOSED after %s disconnected", name, peer);
		CHK(rpma_conn_disconnect(conn));
		pass("[%s] rpma_conn_disconnect", name);
	} else {
		CHK(rpma_conn_disconnect(conn));
		pass("[%s] rpma_conn_disconnect", name);
		expect_conn_event(conn, RPMA_CONN_CLOSED, "RPMA_CONN_CLOSED");
		pass("[%s] RPMA_CONN_CLOSED", name);
	}
}

static void conn_delete(struct rpma_conn **conn)
{
	CHK(rpma_conn_delete(conn));
	if (*conn)
		fail("rpma_conn_delete left the pointer set");
	pass("rpma_conn_delete");
}

/* Posts the one receive on the request, connects it with our MR descriptor as private data
 * and waits for RPMA_CONN_ESTABLISHED (both sides do the same). */
static struct rpma_conn *post_recv_and_connect(struct local *lo, struct rpma_conn_req **req,
					       const char *name)
{
	struct rpma_conn *conn = NULL;
	struct rpma_conn_private_data mine = { .ptr = lo->desc, .len = (uint8_t)lo->desc_size };
	memset(lo->buf + RECV_OFF, 0, MSG_MAX);
	CHK(rpma_conn_req_recv(*req, lo->mr, RECV_OFF, MSG_MAX, (void *)(uintptr_t)OP_RECV));
	CHK(rpma_conn_req_connect(req, &mine, &conn));
	if (*req)
		fail("rpma_conn_req_connect left the request pointer set");
	expect_conn_event(conn, RPMA_CONN_ESTABLISHED, "RPMA_CONN_ESTABLISHED");
	pass("[%s] connection established", name);
	return conn;
}

/* ---- server ---- */

static void server_conn(struct local *lo, struct rpma_ep *ep, bool shared)
{
	const char *name = shared ? "shared" : "plain";
	char what[128];
	struct rpma_conn_cfg *cfg = make_cfg(shared);
	struct rpma_conn_req *req = NULL;
	struct rpma_conn *conn = NULL;
	struct rpma_conn_private_data pd = { 0 };
	int ep_fd;

	CHK(rpma_ep_get_fd(ep, &ep_fd));
	wait_fd(ep_fd, "a connection request");
	CHK(rpma_ep_next_conn_req(ep, cfg, &req));
	pass("[%s] rpma_ep_next_conn_req", name);
	CHK(rpma_conn_req_get_private_data(req, &pd));
	struct rpma_mr_remote *rmr = remote_mr(&pd, lo->desc_size, "the client");

	/* The receive is posted before accepting: the client's message may come at once. */
	conn = post_recv_and_connect(lo, &req, name);

	struct link l;
	link_init(&l, conn, shared);
	check_channels(&l);

	const char *want = shared ? "client to server, shared channel"
				  : "client to server, plain";
	snprintf(what, sizeof(what), "[%s] rpma_recv of the client's message", name);
	check_wc(&l, OP_RECV, IBV_WC_RECV, (long)strlen(want) + 1, what, shared);
	snprintf(what, sizeof(what), "[%s] received message", name);
	check_msg(lo->buf + RECV_OFF, want, what);

	/* The client wrote before sending its message. */
	int woff = shared ? S_WRITE2_OFF : S_WRITE1_OFF;
	if (!same(lo->buf + woff, shared ? PAT_WRITE2 : PAT_WRITE1))
		fail("[%s] the client's rpma_write did not land at offset %d", name, woff);
	if (!same(lo->buf + S_PATTERN_OFF, PAT_SERVER))
		fail("[%s] the server's own pattern was changed", name);
	pass("[%s] the client's rpma_write of %d bytes is in the server's memory", name, CHUNK);

	if (!shared) {
		/* The server reads the client's memory too. */
		read_peer_pattern(&l, lo, rmr, S_READ_OFF, C_PATTERN_OFF, PAT_CLIENT, "client");
	}

	const char *reply = shared ? "server to client, shared channel"
				   : "server to client, plain";
	snprintf(what, sizeof(what), "[%s] rpma_send of the reply", name);
	send_text(&l, lo, reply, what);

	report_waits(&l, name, shared);

	/* On the plain connection the client disconnects first, on the shared one the server. */
	close_conn(conn, name, shared, "the client");
	conn_delete(&conn);
	CHK(rpma_mr_remote_delete(&rmr));
	CHK(rpma_conn_cfg_delete(&cfg));
}

static int run_server(const char *addr, const char *port, bool plain, bool shared)
{
	struct local lo;
	struct rpma_ep *ep = NULL;
	memset(&lo, 0, sizeof(lo));
	local_setup(&lo, addr, true);
	CHK(rpma_ep_listen(lo.peer, addr, port, &ep));
	pass("rpma_ep_listen on %s:%s", addr, port);
	if (plain)
		server_conn(&lo, ep, false);
	if (shared)
		server_conn(&lo, ep, true);
	CHK(rpma_ep_shutdown(&ep));
	if (ep)
		fail("rpma_ep_shutdown left the pointer set");
	pass("rpma_ep_shutdown");
	local_teardown(&lo);
	pass("server done");
	return 0;
}

/* ---- client ---- */

/* rpma_write of our source chunk to the server's `remote_off`, then rpma_read of it back:
 * the server's memory must hold pattern `pat`. */
static void write_and_read_back(struct link *l, struct local *lo, struct rpma_mr_remote *rmr,
				size_t remote_off, uint64_t write_op, int pat, const char *name)
{
	char what[128];
	struct rpma_conn *conn = l->conn;
	CHK(rpma_write(conn, rmr, remote_off, lo->mr, C_WRITE_SRC_OFF, CHUNK,
		       RPMA_F_COMPLETION_ALWAYS, (void *)(uintptr_t)write_op));
	snprintf(what, sizeof(what), "[%s] rpma_write", name);
	check_wc(l, write_op, IBV_WC_RDMA_WRITE, -1, what, false);
	CHK(rpma_read(conn, lo->mr, C_READ2_OFF, rmr, remote_off, CHUNK,
		      RPMA_F_COMPLETION_ALWAYS, (void *)(uintptr_t)OP_READ2));
	snprintf(what, sizeof(what), "[%s] rpma_read of what was written", name);
	check_wc(l, OP_READ2, IBV_WC_RDMA_READ, CHUNK, what, false);
	if (!same(lo->buf + C_READ2_OFF, pat))
		fail("[%s] reading back the rpma_write gave the wrong bytes", name);
	pass("[%s] rpma_write then rpma_read: the server's memory holds our %d bytes", name,
	     CHUNK);
}

static void client_conn(struct local *lo, const char *addr, const char *port, bool shared)
{
	const char *name = shared ? "shared" : "plain";
	char what[128];
	struct rpma_conn_cfg *cfg = make_cfg(shared);
	struct rpma_conn_req *req = NULL;
	struct rpma_conn *conn = NULL;
	struct rpma_conn_private_data pd = { 0 };

	CHK(rpma_conn_req_new(lo->peer, addr, port, cfg, &req));
	pass("[%s] rpma_conn_req_new to %s:%s", name, addr, port);
	conn = post_recv_and_connect(lo, &req, name);
	CHK(rpma_conn_get_private_data(conn, &pd));
	struct rpma_mr_remote *rmr = remote_mr(&pd, lo->desc_size, "the server");

	struct link l;
	link_init(&l, conn, shared);
	check_channels(&l);

	if (!shared) {
		/* Read the server's pattern. */
		read_peer_pattern(&l, lo, rmr, C_READ1_OFF, S_PATTERN_OFF, PAT_SERVER, "server");

		/* Write ours, then read it back. */
		write_and_read_back(&l, lo, rmr, S_WRITE1_OFF, OP_WRITE1, PAT_WRITE1, name);
	} else {
		fill(lo->buf + C_WRITE_SRC_OFF, PAT_WRITE2);
		memset(lo->buf + C_READ2_OFF, 0, CHUNK);
		write_and_read_back(&l, lo, rmr, S_WRITE2_OFF, OP_WRITE2, PAT_WRITE2, name);
	}

	const char *msg = shared ? "client to server, shared channel" : "client to server, plain";
	snprintf(what, sizeof(what), "[%s] rpma_send of the message", name);
	send_text(&l, lo, msg, what);

	const char *reply = shared ? "server to client, shared channel"
				   : "server to client, plain";
	snprintf(what, sizeof(what), "[%s] rpma_recv of the server's reply", name);
	check_wc(&l, OP_RECV, IBV_WC_RECV, (long)strlen(reply) + 1, what, shared);
	snprintf(what, sizeof(what), "[%s] received reply", name);
	check_msg(lo->buf + RECV_OFF, reply, what);

	report_waits(&l, name, shared);

	close_conn(conn, name, !shared, "the server");
	conn_delete(&conn);
	CHK(rpma_mr_remote_delete(&rmr));
	CHK(rpma_conn_cfg_delete(&cfg));
}

static int run_client(const char *addr, const char *port, bool plain, bool shared)
{
	struct local lo;
	memset(&lo, 0, sizeof(lo));
	local_setup(&lo, addr, false);
	if (plain)
		client_conn(&lo, addr, port, false);
	if (shared)
		client_conn(&lo, addr, port, true);
	local_teardown(&lo);
	pass("client done");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc > 5 ||
	    (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0)) {
		fprintf(stderr, "usage: %s server|client ADDR PORT [both|plain|shared]\n", argv[0]);
		return 2;
	}
	const char *mode = argc == 5 ? argv[4] : "both";
	bool plain = strcmp(mode, "both") == 0 || strcmp(mode, "plain") == 0;
	bool shared = strcmp(mode, "both") == 0 || strcmp(mode, "shared") == 0;
	if (!plain && !shared) {
		fprintf(stderr, "unknown mode %s (both, plain or shared)\n", mode);
		return 2;
	}
	side = argv[1];
	setvbuf(stdout, NULL, _IOLBF, 0);

	unsigned limit = 25;
	const char *env = getenv("RPMA_PAIR_TIMEOUT");
	if (env && atoi(env) > 0)
		limit = (unsigned)atoi(env);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_watchdog;
	sigaction(SIGALRM, &sa, NULL);
	alarm(limit);

	if (strcmp(side, "server") == 0)
		return run_server(argv[2], argv[3], plain, shared);
	return run_client(argv[2], argv[3], plain, shared);
}
