/*
 * A peer that talks to another process's agent directly, with requests no softverbs
 * requester would send, must not crash, bloat or stall that process. A (parent) connects to
 * the agent of B (child) with a socket of its own and
 *  - asks it to take a SEND whose payload comes through the socket, claiming 2 GiB of it,
 *    then sends 64 KiB and hangs up: B's memory must not grow by what was claimed;
 *  - sends it requests as fast as it takes them and never reads an answer: B's agent must
 *    give up on that socket, so that an ordinary SEND from A's QP to B's, which goes through
 *    B's agent (it is larger than a receive window slot), still completes.
 */
#include "common.h"

#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#define BIG 8192 /* more than a receive window slot takes: the agent path */

static int sock;
static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* A request to an agent (src/wire/shm/agent.cpp, WireRequest); keep the two in step: a
 * request of another size is garbage to the agent, which hangs up on it. */
struct wire_request {
	uint32_t magic, kind, src_qpn, dst_qpn, type, opcode, flags, imm, rkey, qkey, niov;
	uint32_t copy_mode;
	uint32_t xrc_srqn, xrc_access;
	uint64_t remote_addr, compare_add, swap, length;
	uint64_t xrc_dev, xrc_ino;
	uint8_t sgid[16], dgid[16];
	struct {
		uint64_t addr, len;
	} iov[33];
};
_Static_assert(sizeof(struct wire_request) == 664, "WireRequest changed");
#define WIRE_MAGIC 0x53565731u
#define WIRE_EXECUTE 1
#define WIRE_THROUGH_SOCKET 1

struct socket_inodes {
	unsigned long inode[256];
	int n;
};

/* For sv_each_fd: collects the inode of every socket, up to 256 of them. */
static int add_socket(const char *path, const char *target, void *arg)
{
	struct socket_inodes *s = arg;
	(void)path;
	if (sscanf(target, "socket:[%lu]", &s->inode[s->n]) == 1)
		s->n++;
	return s->n == 256;
}

/* Connects to the agent of process `pid`: its listening socket with an "-agent-" name. */
static int connect_agent(pid_t pid)
{
	struct socket_inodes sockets = {.n = 0};
	sv_each_fd(pid, add_socket, &sockets);
	FILE *f = fopen("/proc/net/unix", "r");
	CHECK(f != NULL);
	char line[512], name[256] = "";
	while (!name[0] && fgets(line, sizeof(line), f)) {
		unsigned flags, type, st;
		unsigned long inode;
		char path[256];
		if (sscanf(line, "%*s %*x %*x %x %x %x %lu %255s", &flags, &type, &st, &inode,
			   path) != 5 ||
		    !(flags & 0x10000) || path[0] != '@' || !strstr(path, "-agent-"))
			continue;
		for (int i = 0; i < sockets.n; i++)
			if (sockets.inode[i] == inode)
				snprintf(name, sizeof(name), "%s", path + 1);
	}
	fclose(f);
	CHECKF(name[0], "no agent socket in process %d", (int)pid);
	struct sockaddr_un a;
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	size_t n = strlen(name);
	CHECK(n + 1 <= sizeof(a.sun_path));
	memcpy(a.sun_path + 1, name, n); /* abstract: sun_path[0] stays 0 */
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	CHECK(fd >= 0);
	CHECK_OK(connect(fd, (struct sockaddr *)&a,
			 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)));
	return fd;
}

/* The peak resident set of process `pid`, in KiB. */
static long peak_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	long kib = -1;
	while (kib < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kib) != 1)
			kib = -1;
	fclose(f);
	CHECK(kib >= 0);
	return kib;
}

static void target_side(int s)
{
	sock = s;
	struct sv_one_qp b;
	sv_one_qp_open(&b, NULL, 16, BIG);
	sv_one_qp_connect(&b, sv_trade_qpn(sock, b.qp), 1, 1, BIG);
	say(1);
	CHECK_EQ(hear(), 2);
	struct ibv_wc wc;
	sv_expect_wc(b.cq, 1, IBV_WC_SUCCESS, b.qp, &wc);
	CHECK_EQ(wc.byte_len, BIG);
	for (int i = 0; i < BIG; i++)
		CHECK_EQ(sv_ptr(b.mr, 0)[i], 0x5a);
	say(2);
	sv_one_qp_close(&b);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_agent_garbage");
	pid_t child;
	sock = sv_fork_peer(target_side, &child);
	struct sv_one_qp a;
	sv_one_qp_open(&a, NULL, 16, BIG);
	uint32_t peer = sv_trade_qpn(sock, a.qp);
	sv_one_qp_connect(&a, peer, 0, 0, 0);
	CHECK_EQ(hear(), 1);

	sv_step("a SEND to B's agent that claims 2 GiB of payload and brings 64 KiB");
	struct wire_request m;
	memset(&m, 0, sizeof(m));
	m.magic = WIRE_MAGIC;
	m.kind = WIRE_EXECUTE;
	m.src_qpn = a.qp->qp_num;
	m.dst_qpn = peer;
	m.type = IBV_QPT_RC;
	m.opcode = IBV_WR_SEND;
	m.copy_mode = WIRE_THROUGH_SOCKET;
	m.length = 1ull << 31;
	m.niov = 1;
	long before = peak_kib(child);
	int fd = connect_agent(child);
	CHECK(send(fd, &m, sizeof(m), MSG_NOSIGNAL) == (ssize_t)sizeof(m));
	static char chunk[65536];
	CHECK(send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL) == (ssize_t)sizeof(chunk));
	CHECK_OK(shutdown(fd, SHUT_WR));
	/* The agent hangs up once it sees the payload end early. */
	struct pollfd p = {fd, POLLIN, 0};
	CHECK(poll(&p, 1, SV_WAIT_MS) == 1);
	char byte;
	CHECK(recv(fd, &byte, 1, 0) <= 0);
	CHECK_OK(close(fd));
	long grown = peak_kib(child) - before;
	printf("B's peak resident set grew by %ld KiB\n", grown);
	CHECKF(grown < 256 * 1024, "B's peak resident set grew by %ld KiB", grown);

	sv_step("a peer that never reads its answers");
	fd = connect_agent(child);
	m.type = 0; /* invalid: answered at once */
	m.copy_mode = 0;
	m.length = 0;
	/* Until the agent takes no more: its answers fill our socket, and then its requests. */
	int sent = 0;
	for (;;) {
		if (send(fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof(m)) {
			sent++;
			continue;
		}
		if (errno != EAGAIN)
			break; /* it gave up on us already */
		struct pollfd w = {fd, POLLOUT, 0};
		if (poll(&w, 1, SV_QUIET_MS) == 0)
			break;
	}
	printf("%d requests sent before the agent stopped taking them\n", sent);

	sv_step("a SEND through B's agent still completes");
	memset(sv_ptr(a.mr, 0), 0x5a, BIG);
	CHECK_OK(sv_post_send(a.qp, 1, a.mr, 0, BIG, IBV_SEND_SIGNALED));
	struct ibv_wc wc;
	CHECKF(sv_poll(a.cq, 1, &wc, 20000) == 1, "no completion for the SEND within 20 s");
	CHECK_WC(wc, 1, IBV_WC_SUCCESS, a.qp);
	say(2);
	CHECK_EQ(hear(), 2);
	CHECK_OK(close(fd));

	sv_step("teardown");
	sv_wait_peer(child, "B");
	sv_one_qp_close(&a);
	sv_pass();
	return 0;
}
