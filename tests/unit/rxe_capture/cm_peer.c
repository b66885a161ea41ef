/* The rdma_cm side of cm_capture.sh that Debian's tools do not cover: a listener that rejects
 * (REJ reason 28 with private data) and a client that connects with private data in its REQ.
 *   cm_peer reject BIND_ADDR PORT             wait for one request, reject it, exit
 *   cm_peer connect BIND_ADDR DST_ADDR PORT   connect once, print the event and its data, exit
 * Built on the host against Debian's librdmacm (cc cm_peer.c -lrdmacm -libverbs); runs in the
 * rxe-vm guest, which has the same rdma-core. */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch) {
  struct rdma_cm_event *ev;
  if (rdma_get_cm_event(ch, &ev)) { perror("rdma_get_cm_event"); exit(1); }
  printf("cm_peer: %s status %d private data %u bytes \"%.*s\"\n", rdma_event_str(ev->event),
         ev->status, ev->param.conn.private_data_len,
         ev->param.conn.private_data ? (int)strnlen(ev->param.conn.private_data,
                                                    ev->param.conn.private_data_len) : 0,
         ev->param.conn.private_data ? (const char *)ev->param.conn.private_data : "");
  return ev;
}

static void addr(struct sockaddr_in *sin, const char *ip, int port) {
  memset(sin, 0, sizeof *sin);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(port);
  if (inet_pton(AF_INET, ip, &sin->sin_addr) != 1) { fprintf(stderr, "bad address %s\n", ip); exit(2); }
}

int main(int argc, char **argv) {
  struct rdma_event_channel *ch = rdma_create_event_channel();
  struct rdma_cm_id *id;
  struct sockaddr_in src, dst;
  if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) { perror("rdma_create_id"); return 1; }
  if (argc == 4 && !strcmp(argv[1], "reject")) {
    static const char why[] = "softverbs: rejected by cm_peer";
    addr(&src, argv[2], atoi(argv[3]));
    if (rdma_bind_addr(id, (struct sockaddr *)&src) || rdma_listen(id, 1)) { perror("listen"); return 1; }
    struct rdma_cm_event *ev = wait_event(ch);
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return 1;
    if (rdma_reject(ev->id, why, sizeof why)) { perror("rdma_reject"); return 1; }
    rdma_ack_cm_event(ev);
    sleep(1); /* let the REJ leave before the id goes */
    return 0;
  }
  if (argc == 5 && !strcmp(argv[1], "accept")) {
    static const char hello[] = "softverbs: REP private data from cm_peer";
    addr(&src, argv[2], atoi(argv[3]));
    if (rdma_bind_addr(id, (struct sockaddr *)&src) || rdma_listen(id, 1)) { perror("listen"); return 1; }
    struct rdma_cm_event *ev = wait_event(ch);
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return 1;
    struct rdma_cm_id *conn = ev->id;
    rdma_ack_cm_event(ev);
    sleep(atoi(argv[4])); /* longer than the REQ's timeout: the requester sends it again */
    struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                          .max_recv_sge = 1}, .qp_type = IBV_QPT_RC};
    if (rdma_create_qp(conn, NULL, &qa)) { perror("rdma_create_qp"); return 1; }
    struct rdma_conn_param cp = {.private_data = hello, .private_data_len = sizeof hello,
                                 .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7};
    if (rdma_accept(conn, &cp)) { perror("rdma_accept"); return 1; }
    ev = wait_event(ch);
    if (ev->event != RDMA_CM_EVENT_ESTABLISHED) return 1;
    rdma_ack_cm_event(ev);
    sleep(1);
    if (rdma_disconnect(conn)) { perror("rdma_disconnect"); return 1; }
    ev = wait_event(ch);
    int ok = ev->event == RDMA_CM_EVENT_DISCONNECTED;
    rdma_ack_cm_event(ev);
    return ok ? 0 : 1;
  }
  if ((argc == 5 || argc == 6) && !strcmp(argv[1], "connect")) {
    const char *expect = argc == 6 ? argv[5] : "REJECTED";
    static const char hello[] = "softverbs: REQ private data from cm_peer";
    addr(&src, argv[2], 0);
    addr(&dst, argv[3], atoi(argv[4]));
    if (rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 5000)) { perror("resolve_addr"); return 1; }
    struct rdma_cm_event *ev = wait_event(ch);
    rdma_ack_cm_event(ev);
    if (rdma_resolve_route(id, 5000)) { perror("resolve_route"); return 1; }
    ev = wait_event(ch);
    rdma_ack_cm_event(ev);
    struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                          .max_recv_sge = 1}, .qp_type = IBV_QPT_RC};
    if (rdma_create_qp(id, NULL, &qa)) { perror("rdma_create_qp"); return 1; }
    struct rdma_conn_param cp = {.private_data = hello, .private_data_len = sizeof hello,
                                 .responder_resources = 2, .initiator_depth = 2, .retry_count = 5,
                                 .rnr_retry_count = 6};
    if (rdma_connect(id, &cp)) { perror("rdma_connect"); return 1; }
    ev = wait_event(ch);
    if (!strcmp(expect, "REJECTED")) {
      int ok = ev->event == RDMA_CM_EVENT_REJECTED;
      rdma_ack_cm_event(ev);
      return ok ? 0 : 1;
    }
    if (ev->event != RDMA_CM_EVENT_ESTABLISHED) return 1;
    rdma_ack_cm_event(ev);
    ev = wait_event(ch); /* the acceptor disconnects first */
    int ok = ev->event == RDMA_CM_EVENT_DISCONNECTED;
    rdma_ack_cm_event(ev);
    rdma_disconnect(id);
    return ok ? 0 : 1;
  }
  fprintf(stderr, "usage: cm_peer reject ADDR PORT | cm_peer accept ADDR PORT SECONDS |"
                  " cm_peer connect BIND DST PORT [REJECTED|ESTABLISHED]\n");
  return 2;
}
