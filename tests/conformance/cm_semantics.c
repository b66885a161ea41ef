/*
 * rdma_cm semantics through librdmacm.so.1 (rdma_cm(7) and the per-call man pages), in one
 * process and against forked peers that die or misbehave:
 *  - channel fd: O_NONBLOCK gives EAGAIN, poll(2) sees events;
 *  - bind / port space: a taken port is EADDRINUSE; id->verbs is the one process context;
 *  - address and route resolution, rdma_create_qp's defaults (PD, CQs with channels, INIT);
 *  - connect / accept with private data (sizes as IB CM's fields, too long is EINVAL), the
 *    resources each side sees, data over the connection, reject (reason 28 + private data),
 *    a port nobody listens on (REJECTED, reason 8), synchronous ids;
 *  - disconnect: DISCONNECTED on both sides, then TIMEWAIT_EXIT; rdma_destroy_id waits for
 *    the id's events to be acked; the peer of a destroyed id sees DISCONNECTED;
 *  - QP states as rdma-core leaves them: REJECTED moves the QP to ERR when taken, the
 *    peer's DREQ leaves it in RTS until rdma_disconnect; a QP the application destroyed
 *    with plain ibv_destroy_qp is not touched when the peer disconnects (no service thread
 *    may reach into the application's QPs);
 *  - a peer killed after ESTABLISHED (DISCONNECTED; rdma_disconnect flushes receives) or in
 *    the middle of the handshake (REJECTED), and garbage sent to a listener's socket
 *    (ignored; the next real connect works).
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#define NAME "cm_semantics"

static struct rdma_event_channel *ch;

/* The next event on `c`, waited for with poll(2) on its (non-blocking) fd. */
static struct rdma_cm_event *next_event_on(struct rdma_event_channel *c)
{
	struct rdma_cm_event *ev = NULL;
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	int n = poll(&p, 1, SV_WAIT_MS);
	CHECKF(n == 1, "no rdma_cm event within %d ms", SV_WAIT_MS);
	CHECK(rdma_get_cm_event(c, &ev) == 0);
	return ev;
}

static struct rdma_cm_event *expect_event(struct rdma_event_channel *c,
					  enum rdma_cm_event_type type, int status)
{
	struct rdma_cm_event *ev = next_event_on(c);
	CHECKF(ev->event == type && ev->status == status, "event %s status %d, expected %s status %d",
	       rdma_event_str(ev->event), ev->status, rdma_event_str(type), status);
	return ev;
}

static void expect_and_ack(struct rdma_event_channel *c, enum rdma_cm_event_type type, int status)
{
	CHECK(rdma_ack_cm_event(expect_event(c, type, status)) == 0);
}

static struct sockaddr_in loopback(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static void qp_attr(struct ibv_qp_init_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->qp_type = IBV_QPT_RC;
	a->cap.max_send_wr = a->cap.max_recv_wr = 8;
	a->cap.max_send_sge = a->cap.max_recv_sge = 1;
	a->sq_sig_all = 1;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	CHECK_OK(ibv_query_qp(qp, &a, IBV_QP_STATE, &i));
	return a.qp_state;
}

/* An active id on `c` with its route resolved to 127.0.0.1:port and a QP of its own. */
static struct rdma_cm_id *active_id(struct rdma_event_channel *c, uint16_t port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in dst = loopback(port);
	struct ibv_qp_init_attr attr;
	CHECK(rdma_create_id(c, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	expect_and_ack(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	expect_and_ack(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	qp_attr(&attr);
	CHECK(rdma_create_qp(id, NULL, &attr) == 0);
	return id;
}

static void conn_param(struct rdma_conn_param *p, const void *data, uint8_t len)
{
	memset(p, 0, sizeof(*p));
	p->private_data = data;
	p->private_data_len = len;
	p->responder_resources = 1;
	p->initiator_depth = 1;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

/* The passive id of the next CONNECT_REQUEST (acked). */
static struct rdma_cm_id *take_request(void)
{
	struct rdma_cm_event *ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	struct rdma_cm_id *server = ev->id;
	CHECK(rdma_ack_cm_event(ev) == 0);
	return server;
}

/* A new active id (*client) connects to the listener on `port` without private data;
 * returns the passive id from CONNECT_REQUEST (acked). */
static struct rdma_cm_id *request_from(uint16_t port, struct rdma_cm_id **client)
{
	struct rdma_conn_param p;
	*client = active_id(ch, port);
	conn_param(&p, NULL, 0);
	CHECK(rdma_connect(*client, &p) == 0);
	return take_request();
}

/* ---- forked peers: each waits for the listener's port on a pipe, then plays its part ---- */

enum peer_role { DIE_ESTABLISHED, DIE_IN_HANDSHAKE, CONNECT_AFTER_GARBAGE };

struct peer {
	pid_t pid;
	int to_peer;   /* we write the port here */
	int from_peer; /* the peer writes one byte when it reached its point */
};

static void peer_main(enum peer_role role, int in, int out)
{
	uint16_t port;
	struct rdma_event_channel *c;
	struct rdma_cm_id *id;
	struct rdma_conn_param p;
	char one = 1;
	CHECK(read(in, &port, sizeof(port)) == sizeof(port));
	c = rdma_create_event_channel();
	CHECK(c != NULL);
	id = active_id(c, port);
	conn_param(&p, NULL, 0);
	CHECK(rdma_connect(id, &p) == 0);
	if (role == DIE_IN_HANDSHAKE) {
		CHECK(write(out, &one, 1) == 1);
		pause(); /* killed by the parent before it accepts */
	}
	expect_and_ack(c, RDMA_CM_EVENT_ESTABLISHED, 0);
	if (role == DIE_ESTABLISHED) {
		CHECK(write(out, &one, 1) == 1);
		pause(); /* killed by the parent */
	}
	CHECK(rdma_disconnect(id) == 0);
	expect_and_ack(c, RDMA_CM_EVENT_DISCONNECTED, 0);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(c);
	_exit(0);
}

static struct peer start_peer(enum peer_role role)
{
	int down[2], up[2];
	struct peer pr;
	CHECK(pipe(down) == 0 && pipe(up) == 0);
	pr.pid = fork();
	CHECK(pr.pid >= 0);
	if (pr.pid == 0) {
		close(down[1]);
		close(up[0]);
		peer_main(role, down[0], up[1]);
	}
	close(down[0]);
	close(up[1]);
	pr.to_peer = down[1];
	pr.from_peer = up[0];
	return pr;
}

static void release_peer(struct peer *pr, uint16_t port)
{
	CHECK(write(pr->to_peer, &port, sizeof(port)) == sizeof(port));
}

static void wait_peer_point(struct peer *pr)
{
	char b;
	struct pollfd p = { .fd = pr->from_peer, .events = POLLIN };
	CHECKF(poll(&p, 1, SV_WAIT_MS) == 1, "peer did not get to its point");
	CHECK(read(pr->from_peer, &b, 1) == 1);
}

static void kill_peer(struct peer *pr)
{
	int st;
	kill(pr->pid, SIGKILL);
	CHECK(waitpid(pr->pid, &st, 0) == pr->pid);
	close(pr->to_peer);
	close(pr->from_peer);
}

struct destroy_arg {
	struct rdma_cm_id *id;
	int rc;
	atomic_int done;
};

static void *destroy_in_thread(void *v)
{
	struct destroy_arg *a = v;
	a->rc = rdma_destroy_id(a->id);
	atomic_store(&a->done, 1);
	return NULL;
}

/* The abstract socket a softverbs listener holds (src/cm/service.cpp, name_for). */
static socklen_t listener_name(uint16_t port, struct sockaddr_un *un)
{
	const char *dir = getenv("SOFTVERBS_STATE_DIR");
	char def[64];
	uint64_t h = 1469598103934665603ull;
	int n;
	if (!dir || !*dir) {
		snprintf(def, sizeof(def), "/dev/shm/softverbs-%u", (unsigned)getuid());
		dir = def;
	}
	for (const unsigned char *s = (const unsigned char *)dir; *s; ++s)
		h = (h ^ *s) * 1099511628211ull;
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "softverbs-cm-%016llx-%x-%u",
		     (unsigned long long)h, RDMA_PS_TCP, port);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int main(void)
{
	struct peer dies_established, dies_in_handshake, after_garbage;
	struct rdma_cm_id *listener, *other, *client, *server;
	struct rdma_cm_event *ev;
	struct rdma_conn_param p;
	struct sockaddr_in any = loopback(0);
	struct ibv_qp_init_attr attr;
	uint8_t req_data[57], rep_data[196], rej_data[148];
	uint16_t port;
	int flags;

	sv_init(NAME);
	/* Peers first, before this process touches rdma_cm. */
	dies_established = start_peer(DIE_ESTABLISHED);
	dies_in_handshake = start_peer(DIE_IN_HANDSHAKE);
	after_garbage = start_peer(CONNECT_AFTER_GARBAGE);
	for (size_t i = 0; i < sizeof(req_data); ++i)
		req_data[i] = (uint8_t)(i + 1);
	for (size_t i = 0; i < sizeof(rep_data); ++i)
		rep_data[i] = (uint8_t)(0x80 + i);
	for (size_t i = 0; i < sizeof(rej_data); ++i)
		rej_data[i] = (uint8_t)(0x40 + i);

	sv_step("event channel: O_NONBLOCK and poll");
	ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	flags = fcntl(ch->fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);

	sv_step("bind and listen; the port space is host-wide");
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&any) == 0);
	port = ntohs(rdma_get_src_port(listener));
	CHECK(port != 0);
	CHECK(listener->verbs != NULL && listener->port_num == 1);
	CHECK(rdma_listen(listener, 8) == 0);
	CHECK(rdma_create_id(ch, &other, NULL, RDMA_PS_TCP) == 0);
	{
		struct sockaddr_in same = loopback(port);
		errno = 0;
		CHECK(rdma_bind_addr(other, (struct sockaddr *)&same) == -1 && errno == EADDRINUSE);
	}
	CHECK(rdma_destroy_id(other) == 0);

	sv_step("resolve, and rdma_create_qp's defaults");
	client = active_id(ch, port);
	CHECK(client->verbs == listener->verbs); /* one context per process */
	CHECK(client->pd != NULL && client->send_cq && client->recv_cq);
	CHECK(client->send_cq_channel && client->recv_cq_channel);
	CHECK(client->send_cq->cq_context == client);
	CHECK_EQ(qp_state(client->qp), IBV_QPS_INIT);
	CHECK_EQ(ntohs(rdma_get_dst_port(client)), port);

	sv_step("connect: private data up to 56 bytes");
	conn_param(&p, req_data, 57);
	errno = 0;
	CHECK(rdma_connect(client, &p) == -1 && errno == EINVAL);
	conn_param(&p, req_data, 56);
	CHECK(rdma_connect(client, &p) == 0);
	ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	CHECK(ev->listen_id == listener && ev->id != listener);
	CHECK(ev->id->verbs == listener->verbs && ev->id->context == listener->context);
	CHECK_EQ(ev->param.conn.private_data_len, 56);
	CHECK(memcmp(ev->param.conn.private_data, req_data, 56) == 0);
	CHECK_EQ(ev->param.conn.qp_num, client->qp->qp_num);
	server = ev->id;
	CHECK(rdma_ack_cm_event(ev) == 0);

	sv_step("accept with 196 bytes of private data; data flows");
	qp_attr(&attr);
	CHECK(rdma_create_qp(server, NULL, &attr) == 0);
	{
		static char rbuf[64], sbuf[64] = "hello over rdma_cm";
		struct ibv_mr *rmr = ibv_reg_mr(server->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *smr = ibv_reg_mr(client->pd, sbuf, sizeof(sbuf), 0);
		struct ibv_sge rs = { (uintptr_t)rbuf, sizeof(rbuf), rmr->lkey };
		struct ibv_sge ss = { (uintptr_t)sbuf, sizeof(sbuf), smr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_send_wr swr = { .wr_id = 8, .sg_list = &ss, .num_sge = 1,
					   .opcode = IBV_WR_SEND }, *sbad;
		struct ibv_wc wc;
		CHECK_OK(ibv_post_recv(server->qp, &rwr, &rbad));
		conn_param(&p, rep_data, 196);
		CHECK(rdma_accept(server, &p) == 0);
		ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
		if (ev->id == client) {
			CHECK_EQ(ev->param.conn.private_data_len, 196);
			CHECK(memcmp(ev->param.conn.private_data, rep_data, 196) == 0);
			CHECK_EQ(ev->param.conn.qp_num, server->qp->qp_num);
			CHECK(rdma_ack_cm_event(ev) == 0);
			expect_and_ack(ch, RDMA_CM_EVENT_ESTABLISHED, 0); /* the server's */
		} else {
			CHECK(ev->id == server);
			CHECK(rdma_ack_cm_event(ev) == 0);
			ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
			CHECK(ev->id == client && ev->param.conn.private_data_len == 196);
			CHECK(rdma_ack_cm_event(ev) == 0);
		}
		CHECK_EQ(qp_state(client->qp), IBV_QPS_RTS);
		CHECK_EQ(qp_state(server->qp), IBV_QPS_RTS);
		CHECK_OK(ibv_post_send(client->qp, &swr, &sbad));
		for (int i = 0; i < 1000000 && ibv_poll_cq(server->recv_cq, 1, &wc) == 0; ++i)
			usleep(5);
		CHECK_WC(wc, 7, IBV_WC_SUCCESS, server->qp);
		CHECK_EQ(wc.byte_len, sizeof(sbuf));
		CHECK(strcmp(rbuf, sbuf) == 0);
		for (int i = 0; i < 1000000 && ibv_poll_cq(client->send_cq, 1, &wc) == 0; ++i)
			usleep(5);
		CHECK_WC(wc, 8, IBV_WC_SUCCESS, client->qp);
		CHECK_OK(ibv_dereg_mr(rmr));
		CHECK_OK(ibv_dereg_mr(smr));
	}

	sv_step("disconnect: both sides see DISCONNECTED; a QP leaves RTS by rdma_disconnect");
	CHECK(rdma_disconnect(client) == 0);
	for (int i = 0; i < 2; ++i) {
		ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, 0);
		CHECK(ev->id == client || ev->id == server);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	CHECK_EQ(qp_state(client->qp), IBV_QPS_ERR);
	/* As with IB CM: the peer's DREQ leaves the QP alone; the application disconnects. */
	CHECK_EQ(qp_state(server->qp), IBV_QPS_RTS);
	CHECK(rdma_disconnect(server) == 0);
	CHECK_EQ(qp_state(server->qp), IBV_QPS_ERR);
	/* Then each leaves time-wait (about one ACK timeout later): TIMEWAIT_EXIT. */
	for (int i = 0; i < 2; ++i) {
		ev = expect_event(ch, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
		CHECK(ev->id == client || ev->id == server);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	rdma_destroy_qp(server);
	CHECK(rdma_destroy_id(server) == 0);
	rdma_destroy_qp(client);
	CHECK(rdma_destroy_id(client) == 0);

	sv_step("reject with 148 bytes of private data: REJECTED, reason 28");
	server = request_from(port, &client);
	errno = 0;
	CHECK(rdma_reject(server, rej_data, 149) == -1 && errno == EINVAL);
	CHECK(rdma_reject(server, rej_data, 148) == 0);
	ev = expect_event(ch, RDMA_CM_EVENT_REJECTED, 28);
	CHECK(ev->id == client && ev->param.conn.private_data_len == 148);
	CHECK(memcmp(ev->param.conn.private_data, rej_data, 148) == 0);
	CHECK_EQ(qp_state(client->qp), IBV_QPS_ERR); /* taking REJECTED moves the QP to ERR */
	CHECK(rdma_ack_cm_event(ev) == 0);
	CHECK(rdma_destroy_id(server) == 0);
	rdma_destroy_qp(client);
	CHECK(rdma_destroy_id(client) == 0);

	sv_step("nobody listens: REJECTED, reason 8; a synchronous id says ECONNREFUSED");
	{
		struct rdma_cm_id *spare, *sync_id;
		struct sockaddr_in none;
		uint16_t free_port;
		CHECK(rdma_create_id(ch, &spare, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_bind_addr(spare, (struct sockaddr *)&any) == 0);
		free_port = ntohs(rdma_get_src_port(spare));
		CHECK(rdma_destroy_id(spare) == 0); /* the port is free again */
		client = active_id(ch, free_port);
		conn_param(&p, NULL, 0);
		CHECK(rdma_connect(client, &p) == 0);
		expect_and_ack(ch, RDMA_CM_EVENT_REJECTED, 8);
		rdma_destroy_qp(client);
		CHECK(rdma_destroy_id(client) == 0);

		none = loopback(free_port);
		CHECK(rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(sync_id, NULL, (struct sockaddr *)&none, 2000) == 0);
		CHECK(sync_id->event && sync_id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
		CHECK(rdma_resolve_route(sync_id, 2000) == 0);
		qp_attr(&attr);
		CHECK(rdma_create_qp(sync_id, NULL, &attr) == 0);
		errno = 0;
		CHECK(rdma_connect(sync_id, &p) == -1 && errno == ECONNREFUSED);
		rdma_destroy_qp(sync_id);
		CHECK(rdma_destroy_id(sync_id) == 0);
	}

	sv_step("a forked peer killed after ESTABLISHED: DISCONNECTED; disconnect flushes");
	release_peer(&dies_established, port);
	server = take_request();
	qp_attr(&attr);
	CHECK(rdma_create_qp(server, NULL, &attr) == 0);
	{
		static char buf[16];
		struct ibv_mr *mr = ibv_reg_mr(server->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		struct ibv_sge s = { (uintptr_t)buf, sizeof(buf), mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 42, .sg_list = &s, .num_sge = 1 }, *bad;
		struct ibv_wc wc;
		CHECK_OK(ibv_post_recv(server->qp, &wr, &bad));
		conn_param(&p, NULL, 0);
		CHECK(rdma_accept(server, &p) == 0);
		expect_and_ack(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
		wait_peer_point(&dies_established);
		kill_peer(&dies_established);
		expect_and_ack(ch, RDMA_CM_EVENT_DISCONNECTED, 0);
		CHECK_EQ(qp_state(server->qp), IBV_QPS_RTS);
		CHECK(rdma_disconnect(server) == 0);
		CHECK_EQ(qp_state(server->qp), IBV_QPS_ERR);
		for (int i = 0; i < 1000000 && ibv_poll_cq(server->recv_cq, 1, &wc) == 0; ++i)
			usleep(5);
		CHECK_WC(wc, 42, IBV_WC_WR_FLUSH_ERR, server->qp);
		CHECK_OK(ibv_dereg_mr(mr));
	}
	rdma_destroy_qp(server);
	CHECK(rdma_destroy_id(server) == 0);

	sv_step("a forked peer killed in the handshake: REJECTED, accept refused");
	release_peer(&dies_in_handshake, port);
	server = take_request();
	wait_peer_point(&dies_in_handshake);
	kill_peer(&dies_in_handshake);
	ev = expect_event(ch, RDMA_CM_EVENT_REJECTED, 1);
	CHECK(ev->id == server);
	CHECK(rdma_ack_cm_event(ev) == 0);
	conn_param(&p, NULL, 0);
	p.qp_num = 1;
	CHECK(rdma_accept(server, &p) == -1);
	CHECK(rdma_destroy_id(server) == 0);

	sv_step("garbage on the listener's socket is dropped; the next connect works");
	{
		struct sockaddr_un un;
		socklen_t len = listener_name(port, &un);
		unsigned char junk[2048];
		for (int round = 0; round < 20; ++round) {
			int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
			size_t sizes[] = { 1, 64, 400, 600, 2048 };
			CHECK(s >= 0);
			CHECK(connect(s, (struct sockaddr *)&un, len) == 0);
			for (size_t i = 0; i < sizeof(junk); ++i)
				junk[i] = (unsigned char)rand();
			if (round % 2) /* the right magic and version, garbage after */
				memcpy(junk, "\x4d\x43\x56\x53\x01\x00", 6);
			(void)!send(s, junk, sizes[round % 5], MSG_NOSIGNAL);
			close(s);
		}
		release_peer(&after_garbage, port);
		server = take_request();
		qp_attr(&attr);
		CHECK(rdma_create_qp(server, NULL, &attr) == 0);
		conn_param(&p, NULL, 0);
		CHECK(rdma_accept(server, &p) == 0);
		expect_and_ack(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
		expect_and_ack(ch, RDMA_CM_EVENT_DISCONNECTED, 0); /* the peer disconnects */
		{
			int st;
			CHECK(waitpid(after_garbage.pid, &st, 0) == after_garbage.pid);
			CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "peer status 0x%x", st);
		}
		rdma_destroy_qp(server);
		CHECK(rdma_destroy_id(server) == 0);
	}

	sv_step("a QP destroyed with ibv_destroy_qp; then the peer disconnects");
	server = request_from(port, &client);
	qp_attr(&attr);
	CHECK(rdma_create_qp(server, NULL, &attr) == 0);
	conn_param(&p, NULL, 0);
	CHECK(rdma_accept(server, &p) == 0);
	expect_and_ack(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
	expect_and_ack(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
	/* As perftest does: the QP goes behind rdma_cm's back (server->qp now dangles). */
	CHECK_OK(ibv_destroy_qp(server->qp));
	CHECK(rdma_disconnect(client) == 0);
	expect_and_ack(ch, RDMA_CM_EVENT_DISCONNECTED, 0);
	expect_and_ack(ch, RDMA_CM_EVENT_DISCONNECTED, 0);
	expect_and_ack(ch, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
	expect_and_ack(ch, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
	server->qp = NULL;
	CHECK(rdma_destroy_id(server) == 0);
	rdma_destroy_qp(client);
	CHECK(rdma_destroy_id(client) == 0);

	sv_step("rdma_destroy_id waits until the id's events are acked");
	{
		struct destroy_arg arg = { 0 };
		struct sockaddr_in dst = loopback(port);
		pthread_t t;
		CHECK(rdma_create_id(ch, &arg.id, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(arg.id, NULL, (struct sockaddr *)&dst, 2000) == 0);
		ev = expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 0); /* held, not acked */
		CHECK(pthread_create(&t, NULL, destroy_in_thread, &arg) == 0);
		usleep(SV_QUIET_MS * 1000);
		CHECKF(!atomic_load(&arg.done), "rdma_destroy_id returned before the ack");
		CHECK(rdma_ack_cm_event(ev) == 0);
		for (int i = 0; i < SV_WAIT_MS && !atomic_load(&arg.done); ++i)
			usleep(1000);
		CHECKF(atomic_load(&arg.done), "rdma_destroy_id still blocked after the ack");
		CHECK(pthread_join(t, NULL) == 0);
		CHECK_EQ(arg.rc, 0);
	}

	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(ch);
	sv_pass();
	return 0;
}
