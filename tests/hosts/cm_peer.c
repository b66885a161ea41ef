/* One side of an rdma_cm connection between hosts, for the failure cases of cm_failures.sh
 * that no Debian program shows: what event the client gets, with which status and private
 * data, and how long it took.
 *
 *   cm_peer server ADDR PORT reject   answers the first request with rdma_reject and the
 *                                     private data "softverbs-reject-data", then exits 0
 *   cm_peer server ADDR PORT accept   accepts, prints "established", then waits (up to 60 s)
 *                                     for DISCONNECTED, answering SENDs with nothing
 *   cm_peer server ADDR PORT notify   as accept, but the first receive completion (the
 *                                     client's first SEND) while not yet established makes
 *                                     it call rdma_notify(COMM_EST) ("notify returned R"), as
 *                                     a server whose RTU was lost must; then as accept
 *   cm_peer resolve ADDR TIMEOUT_MS   rdma_resolve_addr only; prints
 *                                       "resolve_addr failed errno E" (it failed itself),
 *                                       "addr_error status S after MS ms" or
 *                                       "addr_resolved after MS ms"
 *   cm_peer client ADDR PORT [send|wait] connects; prints the event it got:
 *                                       "rejected status S private_len N data TEXT"
 *                                       "unreachable status S after MS ms"
 *                                       "established"
 *                                     with `send`, once established: a SEND every 10 ms until
 *                                     one completes in error ("send error STATUS after N
 *                                     sends"), then rdma_disconnect and "disconnected after
 *                                     MS ms" when DISCONNECTED comes (exit 5 if it never does
 *                                     within 60 s).
 *                                     With `wait`: sends nothing, waits for DISCONNECTED
 *                                     ("disconnected while waiting"; exit 5 without it
 *                                     within 60 s).
 * Every line is flushed as it is printed (the scripts kill the peer on "established"). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char kRejectData[] = "softverbs-reject-data";

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void die(const char *what) {
  perror(what);
  exit(2);
}

/* The next event on ch within ms milliseconds (NULL on timeout); the caller acks it. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms) {
  struct pollfd p = {.fd = ch->fd, .events = POLLIN};
  if (poll(&p, 1, ms) <= 0) return NULL;
  struct rdma_cm_event *ev;
  if (rdma_get_cm_event(ch, &ev)) die("rdma_get_cm_event");
  return ev;
}

static void get_addr(const char *host, const char *port, struct sockaddr_storage *out) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_flags = AI_NUMERICHOST}, *res;
  if (getaddrinfo(host, port, &hints, &res)) die("getaddrinfo");
  memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
}

static void make_qp(struct rdma_cm_id *id) {
  struct ibv_qp_init_attr a = {.qp_type = IBV_QPT_RC, .sq_sig_all = 1};
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, NULL, &a)) die("rdma_create_qp");
}

static int server(struct sockaddr *addr, int reject, int notify) {
  struct rdma_event_channel *ch = rdma_create_event_channel();
  struct rdma_cm_id *listener, *id = NULL;
  if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_bind_addr(listener, addr) || rdma_listen(listener, 4)) die("listen");
  static char buf[64];
  struct ibv_mr *mr = NULL;
  int established = 0;
  for (long long end = now_ms() + 60000; now_ms() < end;) {
    struct rdma_cm_event *ev = next_event(ch, 5);
    struct ibv_wc wc;
    /* Every receive that completed is posted again: the client sends without end. */
    while (id && ibv_poll_cq(id->recv_cq, 1, &wc) > 0 && wc.status == IBV_WC_SUCCESS) {
      if (notify && !established) {  /* traffic before the RTU: the QP's COMM_EST */
        printf("notify returned %d\n", rdma_notify(id, IBV_EVENT_COMM_EST) ? -errno : 0);
        printf("notify again returned %d\n", rdma_notify(id, IBV_EVENT_COMM_EST) ? -errno : 0);
        notify = 0;
      }
      struct ibv_sge sge = {(uintptr_t)buf, sizeof buf, mr->lkey};
      struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad;
      if (ibv_post_recv(id->qp, &wr, &bad)) die("ibv_post_recv");
    }
    if (!ev) continue;
    enum rdma_cm_event_type type = ev->event;
    struct rdma_cm_id *evid = ev->id;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST && reject) {
      if (rdma_reject(evid, kRejectData, sizeof kRejectData)) die("rdma_reject");
      printf("rejected a request\n");
      fflush(stdout);
      rdma_destroy_id(evid);
      return 0;
    }
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST && !id) {
      id = evid;
      make_qp(id);
      mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
      if (!mr) die("ibv_reg_mr");
      for (int i = 0; i < 16; i++) {
        struct ibv_sge sge = {(uintptr_t)buf, sizeof buf, mr->lkey};
        struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad;
        if (ibv_post_recv(id->qp, &wr, &bad)) die("ibv_post_recv");
      }
      struct rdma_conn_param p = {.retry_count = 7, .rnr_retry_count = 7};
      if (rdma_accept(id, &p)) die("rdma_accept");
    } else if (type == RDMA_CM_EVENT_ESTABLISHED) {
      established = 1;
      printf("established\n");
      fflush(stdout);
    } else if (type == RDMA_CM_EVENT_DISCONNECTED) {
      printf("disconnected\n");
      return 0;
    }
  }
  printf("no DISCONNECTED within 60 s\n");
  return 5;
}

static int resolve(struct sockaddr *dst, int timeout_ms) {
  struct rdma_event_channel *ch = rdma_create_event_channel();
  struct rdma_cm_id *id;
  if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  long long start = now_ms();
  if (rdma_resolve_addr(id, NULL, dst, timeout_ms)) {
    printf("resolve_addr failed errno %d\n", errno);
    return 0;
  }
  struct rdma_cm_event *ev = next_event(ch, timeout_ms + 10000);
  if (!ev) {
    printf("no event\n");
    return 2;
  }
  long long ms = now_ms() - start;
  if (ev->event == RDMA_CM_EVENT_ADDR_ERROR)
    printf("addr_error status %d after %lld ms\n", ev->status, ms);
  else if (ev->event == RDMA_CM_EVENT_ADDR_RESOLVED)
    printf("addr_resolved after %lld ms\n", ms);
  else
    printf("event %s status %d\n", rdma_event_str(ev->event), ev->status);
  rdma_ack_cm_event(ev);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  return 0;
}

static int client(struct sockaddr *dst, int send_mode) {
  struct rdma_event_channel *ch = rdma_create_event_channel();
  struct rdma_cm_id *id;
  if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_resolve_addr(id, NULL, dst, 2000)) die("rdma_resolve_addr");
  struct rdma_cm_event *ev = next_event(ch, 5000);
  if (!ev || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    printf("address not resolved: %s %d\n", ev ? rdma_event_str(ev->event) : "timeout", ev ? ev->status : 0);
    return 2;
  }
  rdma_ack_cm_event(ev);
  if (rdma_resolve_route(id, 2000)) die("rdma_resolve_route");
  ev = next_event(ch, 5000);
  if (!ev || ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) die("route");
  rdma_ack_cm_event(ev);
  make_qp(id);
  struct rdma_conn_param p = {.retry_count = 7, .rnr_retry_count = 7};
  long long start = now_ms();
  if (rdma_connect(id, &p)) die("rdma_connect");
  ev = next_event(ch, 300000);
  if (!ev) {
    printf("no event\n");
    return 2;
  }
  long long ms = now_ms() - start;
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    const char *data = ev->param.conn.private_data;
    int len = ev->param.conn.private_data_len;
    printf("rejected status %d private_len %d data %.*s\n", ev->status, len,
           data ? (int)strnlen(data, (size_t)len) : 0, data ? data : "");
    return 3;
  }
  if (ev->event == RDMA_CM_EVENT_UNREACHABLE) {
    printf("unreachable status %d after %lld ms\n", ev->status, ms);
    return 4;
  }
  if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
    printf("event %s status %d\n", rdma_event_str(ev->event), ev->status);
    return 2;
  }
  rdma_ack_cm_event(ev);
  printf("established\n");
  fflush(stdout);
  if (send_mode == 2) {
    while ((ev = next_event(ch, 60000))) {
      enum rdma_cm_event_type type = ev->event;
      rdma_ack_cm_event(ev);
      if (type == RDMA_CM_EVENT_DISCONNECTED) {
        printf("disconnected while waiting\n");
        return 0;
      }
    }
    printf("no DISCONNECTED within 60 s\n");
    return 5;
  }
  if (!send_mode) return 0;
  static char buf[64] = "ping";
  struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof buf, 0);
  if (!mr) die("ibv_reg_mr");
  int sends = 0;
  for (;;) {
    struct ibv_sge sge = {(uintptr_t)buf, sizeof buf, mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (ibv_post_send(id->qp, &wr, &bad)) die("ibv_post_send");
    struct ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(id->send_cq, 1, &wc)) == 0) usleep(1000);
    if (n < 0) die("ibv_poll_cq");
    if (wc.status != IBV_WC_SUCCESS) {
      printf("send error %s after %d sends\n", ibv_wc_status_str(wc.status), sends);
      break;
    }
    ++sends;
    if (sends == 20) {
      printf("20 sends done\n");
      fflush(stdout);
    }
    usleep(10000);
  }
  start = now_ms();
  rdma_disconnect(id);
  while ((ev = next_event(ch, 60000))) {
    enum rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_DISCONNECTED) {
      printf("disconnected after %lld ms\n", now_ms() - start);
      return 0;
    }
  }
  printf("no DISCONNECTED within 60 s\n");
  return 5;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 4) {
    fprintf(stderr, "usage: cm_peer server ADDR PORT reject|accept|notify | client ADDR PORT [send|wait] |"
                    " resolve ADDR TIMEOUT_MS\n");
    return 2;
  }
  if (!strcmp(argv[1], "resolve")) {
    struct sockaddr_storage dst;
    get_addr(argv[2], "0", &dst);
    return resolve((struct sockaddr *)&dst, atoi(argv[3]));
  }
  struct sockaddr_storage addr;
  get_addr(argv[2], argv[3], &addr);
  const char *mode = argc > 4 ? argv[4] : "";
  if (!strcmp(argv[1], "server")) return server((struct sockaddr *)&addr, !strcmp(mode, "reject"), !strcmp(mode, "notify"));
  return client((struct sockaddr *)&addr, !strcmp(mode, "send") ? 1 : !strcmp(mode, "wait") ? 2 : 0);
}
