/*
 * Shared helpers for the softverbs conformance tests.
 *
 * Every test is a small C11 program written against the ordinary rdma-core headers and linked
 * against the system libibverbs; ctest runs it through `softverbs run --`, so the calls land in
 * our drop-in. A test passes by exiting 0 after printing "PASS <name>" as its very last line.
 * Any failed check prints "FAIL <name>: file:line: ..." and exits 1; a watchdog (SIGALRM) turns
 * a hang into a failure that names the last step reached.
 *
 * The tests never assert on timing. Where something must happen they wait for it with a bound
 * (SV_WAIT_MS); where something must not happen they watch for SV_QUIET_MS after everything that
 * could have caused it is known to be done.
 */
#ifndef SOFTVERBS_CONFORMANCE_COMMON_H
#define SOFTVERBS_CONFORMANCE_COMMON_H

#include <infiniband/verbs.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bounded wait for something that must happen (a completion, an event). */
#define SV_WAIT_MS 5000
/* How long we watch for something that must not happen (an event that should not fire). */
#define SV_QUIET_MS 200
/* Default watchdog, below ctest's 60 s TIMEOUT so that a hang reports its last step. */
#define SV_WATCHDOG_S 50

/* All of local write, remote write, remote read and remote atomic. */
#define SV_ACCESS_ALL                                                                  \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |   \
	 IBV_ACCESS_REMOTE_ATOMIC)

/* ---- reporting ------------------------------------------------------------------------ */

/* Names the test, installs the watchdog and makes stdout line-buffered. Call first. */
void sv_init(const char *name);
/* Re-arms the watchdog with another limit (seconds). */
void sv_watchdog(unsigned seconds);
/* Adds a counter that the watchdog message reports (up to 8), to show where a hang stopped. */
void sv_watch_counter(const char *label, atomic_long *value);
/* Prints "-- <step>" and remembers it for the watchdog message. */
void sv_step(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "PASS <name>". Call as the last thing, after every object is destroyed. */
void sv_pass(void);
_Noreturn void sv_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

const char *sv_wc_status_name(int status);
const char *sv_wc_opcode_name(int opcode);
const char *sv_event_name(int event_type);
const char *sv_qp_state_name(int state);

#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond))                                                           \
			sv_fail(__FILE__, __LINE__, "CHECK(%s) failed (errno %d: %s)", \
				#cond, errno, strerror(errno));                        \
	} while (0)

/* Like CHECK, with a printf-style explanation instead of errno. */
#define CHECKF(cond, ...)                                                              \
	do {                                                                           \
		if (!(cond))                                                           \
			sv_fail(__FILE__, __LINE__, __VA_ARGS__);                      \
	} while (0)

#define CHECK_EQ(a, b)                                                                 \
	do {                                                                           \
		long long sv_a_ = (long long)(a), sv_b_ = (long long)(b);              \
		if (sv_a_ != sv_b_)                                                    \
			sv_fail(__FILE__, __LINE__,                                    \
				"CHECK_EQ(%s, %s) failed: %lld (0x%llx) != %lld (0x%llx)", \
				#a, #b, sv_a_, (unsigned long long)sv_a_, sv_b_,       \
				(unsigned long long)sv_b_);                            \
	} while (0)

/* For verbs that return 0 or a positive errno (modify, query, post, destroy, ...). */
#define CHECK_OK(expr)                                                                 \
	do {                                                                           \
		int sv_r_ = (expr);                                                    \
		if (sv_r_ != 0)                                                        \
			sv_fail(__FILE__, __LINE__, "%s returned %d (%s), errno %d",   \
				#expr, sv_r_, strerror(sv_r_ > 0 ? sv_r_ : errno),     \
				errno);                                                \
	} while (0)

/* For the same verbs where a specific error (positive errno value) is required. */
#define CHECK_ERR(expr, err)                                                           \
	do {                                                                           \
		int sv_r_ = (expr);                                                    \
		if (sv_r_ != (err))                                                    \
			sv_fail(__FILE__, __LINE__,                                    \
				"%s returned %d (%s), expected %d (%s)", #expr, sv_r_, \
				sv_r_ > 0 ? strerror(sv_r_) : "-", (err),              \
				strerror(err));                                        \
	} while (0)

#define CHECK_STATUS(wc, st)                                                           \
	do {                                                                           \
		if ((int)(wc).status != (int)(st))                                     \
			sv_fail(__FILE__, __LINE__,                                    \
				"wr_id 0x%llx: status %s (%d), expected %s (%d)",      \
				(unsigned long long)(wc).wr_id,                        \
				sv_wc_status_name((wc).status), (int)(wc).status,      \
				sv_wc_status_name(st), (int)(st));                     \
	} while (0)

#define CHECK_OPCODE(wc, op)                                                           \
	do {                                                                           \
		if ((int)(wc).opcode != (int)(op))                                     \
			sv_fail(__FILE__, __LINE__,                                    \
				"wr_id 0x%llx: opcode %s (%d), expected %s (%d)",      \
				(unsigned long long)(wc).wr_id,                        \
				sv_wc_opcode_name((wc).opcode), (int)(wc).opcode,      \
				sv_wc_opcode_name(op), (int)(op));                     \
	} while (0)

/* Expected wr_id, status and qp_num: all a completion with an error status promises. */
#define CHECK_WC(wc, id, st, qp)                                                       \
	do {                                                                           \
		CHECK_STATUS(wc, st);                                                  \
		CHECK_EQ((wc).wr_id, (id));                                            \
		CHECK_EQ((wc).qp_num, (qp)->qp_num);                                   \
	} while (0)

/* ---- device -------------------------------------------------------------------------- */

struct sv_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr dev_attr;
	struct ibv_port_attr port_attr; /* port 1 */
	union ibv_gid gid;              /* port 1, GID index gid_index */
	int gid_index;                  /* sv_gid_index() */
};

/* The GID index the tests use: $SV_GID_INDEX (the veth address's GID between two hosts,
 * tests/hosts/twoproc.sh), else 0. */
int sv_gid_index(void);
/* Opens the first device, queries it, port 1 and GID sv_gid_index(), and allocates a PD. */
void sv_open(struct sv_dev *d);
/* Deallocates the PD and closes the device (both must succeed). */
void sv_close(struct sv_dev *d);

/* ---- QPs --------------------------------------------------------------------------- */

struct sv_pair_cfg {
	int send_cqe, recv_cqe;              /* requested CQ sizes */
	int shared_cq;                       /* one CQ per QP for both its queues */
	struct ibv_comp_channel *channel;    /* channel of every CQ, or NULL */
	uint32_t max_send_wr, max_recv_wr;
	uint32_t max_send_sge, max_recv_sge;
	uint32_t max_inline_data;
	int sq_sig_all;
	int use_srq;                         /* both QPs receive from one SRQ */
	uint32_t srq_max_wr;
	unsigned access;                     /* qp_access_flags at INIT */
	enum ibv_mtu mtu;
	uint32_t psn;                        /* every SQ and RQ PSN */
	uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic;
};

/* Defaults: 64-entry CQs, 32 WRs and 4 SGEs each way, 64 inline bytes, all remote access,
 * MTU 1024, timeout 14, retry_cnt 7, rnr_retry 7 (infinite), min_rnr_timer 1 (0.01 ms). */
void sv_pair_cfg_init(struct sv_pair_cfg *cfg);

/* Two RC QPs in one process, qp[0] ("A") and qp[1] ("B"). scq[i]/rcq[i] are QP i's send and
 * receive CQs (the same CQ when cfg.shared_cq); each CQ's cq_context is the address of its own
 * slot in this struct (e.g. &p->rcq[1]). cap[i] holds the caps ibv_create_qp wrote back. */
struct sv_pair {
	struct sv_dev *dev;
	struct sv_pair_cfg cfg;
	struct ibv_srq *srq;
	struct ibv_qp *qp[2];
	struct ibv_cq *scq[2], *rcq[2];
	struct ibv_qp_cap cap[2];
};

/* ibv_create_cq; checks that cq->cqe >= cqe. */
struct ibv_cq *sv_create_cq(struct sv_dev *d, int cqe, void *cq_context,
			    struct ibv_comp_channel *channel);
/* ibv_create_qp for an RC QP; checks the written-back caps are >= the requested ones and
 * that the QP starts in RESET. *cap_out (may be NULL) receives the caps. */
struct ibv_qp *sv_create_qp(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct ibv_cq *scq,
			    struct ibv_cq *rcq, struct ibv_srq *srq, struct ibv_qp_cap *cap_out);

/* The three standard transitions; each returns what ibv_modify_qp returned. RTR's
 * destination GID is the one traded for qp (sv_trade_gid) if any, else d->gid (a peer on
 * the same host); its source GID index is d->gid_index. */
int sv_modify_init(struct ibv_qp *qp, const struct sv_pair_cfg *cfg);
int sv_modify_rtr(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest_qpn,
		  const struct sv_pair_cfg *cfg);
int sv_modify_rts(struct ibv_qp *qp, const struct sv_pair_cfg *cfg);
/* RESET -> INIT -> RTR -> RTS for both QPs, each pointed at the other. */
void sv_connect(struct sv_dev *d, struct ibv_qp *a, struct ibv_qp *b,
		const struct sv_pair_cfg *cfg);
/* Moves qp to `state` with only IBV_QP_STATE in the mask. */
int sv_modify_state(struct ibv_qp *qp, enum ibv_qp_state state);
/* State reported by ibv_query_qp. */
enum ibv_qp_state sv_query_state(struct ibv_qp *qp);

/* CQs, SRQ and both QPs, in RESET. */
void sv_pair_create(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct sv_pair *p);
/* sv_pair_create + sv_connect. cfg may be NULL for the defaults. */
void sv_pair_open(struct sv_dev *d, const struct sv_pair_cfg *cfg, struct sv_pair *p);
/* Creates a completion channel and opens a pair (cfg may be NULL) whose CQs all use it. */
struct ibv_comp_channel *sv_pair_open_with_channel(struct sv_dev *d,
						   const struct sv_pair_cfg *cfg,
						   struct sv_pair *p);
/* Destroys whatever of the pair is not NULL (set a member to NULL after destroying it
 * yourself). Every destroy must succeed. */
void sv_pair_destroy(struct sv_pair *p);

/* ---- the usual setup ----------------------------------------------------------------- */

/* The device, a connected pair (on a new completion channel if with_channel), and one
 * registered SV_FIXTURE_MR_LEN-byte buffer per side with all access rights: mr[0] for A
 * (qp[0]), mr[1] for B (qp[1]). */
#define SV_FIXTURE_MR_LEN 65536
struct sv_fixture {
	struct sv_dev dev;
	struct sv_pair pair;
	struct ibv_comp_channel *ch; /* NULL without a channel */
	struct ibv_mr *mr[2];
};
void sv_fixture_open(struct sv_fixture *f, const struct sv_pair_cfg *cfg, int with_channel);
/* Frees the buffers, destroys the pair and the channel, closes the device (all must succeed). */
void sv_fixture_close(struct sv_fixture *f);

/* ---- memory and work requests -------------------------------------------------------- */

/* A zeroed, page-aligned buffer of len bytes registered with `access`. */
struct ibv_mr *sv_alloc_mr(struct ibv_pd *pd, size_t len, unsigned access);
/* ibv_dereg_mr (must succeed) and free the buffer. */
void sv_free_mr(struct ibv_mr *mr);
/* mr->addr + off, as a byte pointer / as a 64-bit address. */
uint8_t *sv_ptr(struct ibv_mr *mr, size_t off);
uint64_t sv_addr(struct ibv_mr *mr, size_t off);

/* Fills one send WR with one SGE (mr may be NULL for an inline send from `sge->addr`). */
void sv_wr_init(struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t wr_id,
		enum ibv_wr_opcode op, struct ibv_mr *mr, size_t off, uint32_t len,
		unsigned send_flags);
/* ibv_post_send of one SEND of mr[off, off+len); returns what ibv_post_send returned. */
int sv_post_send(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		 uint32_t len, unsigned send_flags);
/* ibv_post_send of one RDMA WRITE / RDMA READ between mr[off..] and (raddr, rkey). */
int sv_post_rdma(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_mr *mr,
		 size_t off, uint32_t len, unsigned send_flags, uint64_t raddr, uint32_t rkey);
/* ibv_post_recv / ibv_post_srq_recv of one receive of mr[off, off+len). */
int sv_post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		 uint32_t len);
int sv_post_srq_recv(struct ibv_srq *srq, uint64_t wr_id, struct ibv_mr *mr, size_t off,
		     uint32_t len);

/* ---- completions ------------------------------------------------------------------- */

/* Polls until n completions have been collected into wc[] or timeout_ms passed; returns how
 * many were collected. Checks every ibv_poll_cq call returns 0..requested. */
int sv_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc, int timeout_ms);
/* Waits (SV_WAIT_MS) for exactly one completion; fails if none arrives. */
void sv_poll_one(struct ibv_cq *cq, struct ibv_wc *wc);
/* Waits for one completion and checks its wr_id, status and qp_num. */
void sv_expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
		  struct ibv_qp *qp, struct ibv_wc *out);
/* Checks that ibv_poll_cq finds nothing right now. */
void sv_expect_empty(struct ibv_cq *cq, const char *what);
/* One signaled SEND of len bytes from smr to QP `from` of the pair to the other QP, which
 * receives it into the whole of rmr; both use wr_id `id`. Waits for both completions, checks
 * they succeeded and returns the receive completion in *rwc (may be NULL). */
void sv_send_recv(struct sv_pair *p, int from, uint64_t id, struct ibv_mr *smr,
		  struct ibv_mr *rmr, uint32_t len, unsigned send_flags, struct ibv_wc *rwc);

/* ---- file descriptors and events --------------------------------------------------- */

/* 1 if poll() reports fd readable within timeout_ms (0: right now), else 0. */
int sv_fd_readable(int fd, int timeout_ms);
void sv_set_nonblock(int fd, int on);

/* Waits up to timeout_ms for the channel fd to become readable, then ibv_get_cq_event (which
 * must succeed). Returns 1 with cq and cq_ctx filled, or 0 if nothing came. Does not ack. */
int sv_wait_cq_event(struct ibv_comp_channel *ch, int timeout_ms, struct ibv_cq **cq,
		     void **cq_ctx);
/* Waits (SV_WAIT_MS) for the next event, checks it names `cq` and its cq_context, acks it. */
void sv_expect_cq_event(struct ibv_comp_channel *ch, struct ibv_cq *cq);
/* Checks that the channel stays empty for SV_QUIET_MS. */
void sv_expect_no_cq_event(struct ibv_comp_channel *ch, const char *why);

/* Like sv_wait_cq_event for ctx->async_fd and ibv_get_async_event. Does not ack. */
int sv_wait_async(struct ibv_context *ctx, int timeout_ms, struct ibv_async_event *ev);
/* Reads, prints and acks every async event that arrives within timeout_ms of the last one. */
void sv_drain_async(struct ibv_context *ctx, int timeout_ms);
/* The element of an affiliated event as a pointer (CQ, QP, SRQ or WQ). */
void *sv_async_element(const struct ibv_async_event *ev);
/* Reads async events (acking each) until one of `type` for `element` arrives; other events are
 * reported on stdout and dropped. Fails after SV_WAIT_MS. */
void sv_expect_async(struct ibv_context *ctx, enum ibv_event_type type, void *element);

/* ---- ordering checks with a thread -------------------------------------------------- */

/* Checks that destroy(obj), run in another thread, waits for an event that the caller holds:
 * it must not return while the caller watches for SV_QUIET_MS, and must return 0 only after
 * release(release_arg) (the ack) has run. Ordering is checked with flags, never with time. */
void sv_expect_destroy_waits(int (*destroy)(void *obj), void *obj,
			     void (*release)(void *arg), void *release_arg, const char *what);

/* Adapters for sv_expect_destroy_waits. */
int sv_destroy_cq_fn(void *cq);
int sv_destroy_qp_fn(void *qp);

/* Sleeps for ms milliseconds. Only ever used to give something a chance to go wrong. */
void sv_sleep_ms(int ms);
/* Milliseconds on CLOCK_MONOTONIC. */
long long sv_now_ms(void);

/* ---- a peer process ---------------------------------------------------------------- */

/* Forks a peer that runs peer_main(sock), never returning; the parent gets its end of a
 * socketpair to the peer, and the peer's pid in *pid. Call before opening the device (and
 * before any other verbs call: the library learns its host's addresses at first use).
 * With $SV_PEER_NETNS set the peer runs on another host: it enters network namespace
 * /run/netns/$SV_PEER_NETNS and takes $SV_PEER_STATE_DIR as its SOFTVERBS_STATE_DIR first
 * (tests/hosts/twoproc.sh; needs root). Unset, nothing changes. */
int sv_fork_peer(void (*peer_main)(int sock), pid_t *pid);
/* For a peer started once the device is open (a long-lived process with new peers in turn):
 * runs this test's own binary again, by posix_spawn, as a peer with its end of a socketpair,
 * and returns ours; the peer's pid in *pid (a child of ours: sv_wait_peer, waitpid work).
 * Not a fork: a fork while softverbs' threads run copies locks they may hold at that
 * moment, and GCC 12's ASan allocator has no fork handlers, so the child's new threads
 * (its agent, its progress thread) then wait forever for an allocator lock. main() must
 * start with sv_spawned_peer. */
int sv_spawn_peer(pid_t *pid);
/* First thing in main() of a test that uses sv_spawn_peer: in a peer it started, the
 * socket to the parent (the peer has entered the other host, as sv_fork_peer's does);
 * -1 in the test process itself. */
int sv_spawned_peer(int argc, char **argv);
/* 1 if the peers of sv_fork_peer run on another host ($SV_PEER_NETNS): checks of same-host
 * mechanisms (shared pages, agents) are skipped then. */
int sv_peer_on_other_host(void);
/* Between hosts only (a no-op otherwise): trades our GID (index sv_gid_index()) with the
 * peer over sock and remembers the peer's as qp's destination GID for sv_modify_rtr. The
 * trade functions below do it themselves; call it after trading QPNs any other way. */
void sv_trade_gid(int sock, const struct ibv_qp *qp);
/* The GID traded for qp by sv_trade_gid, or NULL (a peer on this host). */
const union ibv_gid *sv_peer_gid(const struct ibv_qp *qp);
/* Trades QP numbers with the peer over sock (ours first); returns the peer's. */
uint32_t sv_trade_qpn(int sock, const struct ibv_qp *qp);
/* What a peer needs to reach our QP and our MR. */
struct sv_remote {
	uint32_t qpn;
	uint64_t addr; /* the MR's start */
	uint32_t rkey;
};
/* Trades {qp->qp_num, mr's start, mr->rkey} with the peer over sock (ours first). */
void sv_trade_remote(int sock, const struct ibv_qp *qp, const struct ibv_mr *mr,
		     struct sv_remote *peer);
/* Connects qp, in RESET, to QP peer_qpn of another process: INIT, then nrecv receives of
 * recv_len bytes at mr offsets i * recv_len with wr_id first_id + i (mr may be NULL if nrecv
 * is 0), then RTR and RTS. */
void sv_connect_remote(struct ibv_qp *qp, const struct sv_dev *d, const struct sv_pair_cfg *cfg,
		       uint32_t peer_qpn, struct ibv_mr *mr, uint64_t first_id, int nrecv,
		       uint32_t recv_len);

/* One side of a two-process test: the device, one CQ for both queues of one RC QP, and an
 * MR with all access rights. */
struct sv_one_qp {
	struct sv_dev dev;
	struct sv_pair_cfg cfg;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr; /* NULL if opened with mr_len 0 */
};
/* Opens the device, creates a CQ of cqe entries and an RC QP (in RESET) with cfg (NULL for
 * the defaults), and registers a zeroed mr_len-byte buffer (none if mr_len is 0). */
void sv_one_qp_open(struct sv_one_qp *p, const struct sv_pair_cfg *cfg, int cqe, size_t mr_len);
/* sv_connect_remote of p->qp with p's device, config and MR. */
void sv_one_qp_connect(struct sv_one_qp *p, uint32_t peer_qpn, uint64_t first_id, int nrecv,
		       uint32_t recv_len);
/* Destroys the QP, frees the MR, destroys the CQ and closes the device; every destroy must
 * succeed. A member set to NULL (destroyed by the test itself) is skipped. */
void sv_one_qp_close(struct sv_one_qp *p);
/* The requester side of a two-process test: sv_one_qp_open with the defaults, a 64-entry CQ
 * and a 4 KiB MR, connected (no receives) to the peer's QP whose number comes over sock. */
void sv_requester_open(struct sv_one_qp *r, int sock);
/* Calls fn(path, target, arg) for each open fd of process `pid`: its /proc/<pid>/fd path and
 * what that links to (e.g. "/memfd:softverbs-arena (deleted)", "socket:[1234]"). Stops at the
 * first fn that returns non-zero and returns that; 0 once every fd was visited. */
int sv_each_fd(pid_t pid, int (*fn)(const char *path, const char *target, void *arg), void *arg);
/* CPU time (user + system, all threads) process `pid` has used so far, in seconds. */
double sv_cpu_seconds(pid_t pid);
/* Waits for the peer forked by sv_fork_peer and fails unless it exited with status 0. */
void sv_wait_peer(pid_t pid, const char *who);
/* Writes ours, then reads theirs (n bytes each): how the two sides trade QPNs and keys. */
void sv_exchange(int sock, const void *ours, void *theirs, size_t n);
/* Lock-step between the two: say(N) tells the other side step N is done, hear() waits for
 * the other side's next step number. */
void sv_say(int sock, int step);
int sv_hear(int sock);

#endif
