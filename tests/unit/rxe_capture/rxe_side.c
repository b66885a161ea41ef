/* The kernel rxe side of the capture (see capture.sh): on DEVICE, with the GID of LOCAL_IP,
 *  - RC QP A, connected to a made-up QP 0xabc at PEER_IP, posts one request of every kind
 *    (SEND, SEND with immediate and with invalidate, a 3-packet SEND, WRITE, WRITE with
 *    immediate, READ, compare-swap, fetch-add); nobody answers, rxe's packets are captured;
 *  - UD QP, sends SEND_ONLY and SEND_ONLY with immediate to QP 0xdef at PEER_IP;
 *  - RC QP B, the responder for the prober (our code) at PEER_IP QP 0x777, its QPN, MR
 *    address and rkey written to INFO_FILE, then reports for SECONDS what arrives.
 * Usage: rxe_side DEVICE LOCAL_IP PEER_IP INFO_FILE SECONDS */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "rxe_side: %s failed (line %d)\n", #x, __LINE__); exit(1); } } while (0)

static struct ibv_ah_attr av(int gid_index, const char *peer) {
  struct ibv_ah_attr a = {.is_global = 1, .port_num = 1};
  a.grh.sgid_index = gid_index;
  a.grh.hop_limit = 64;
  uint8_t *g = a.grh.dgid.raw;
  g[10] = g[11] = 0xff;
  CHECK(inet_pton(AF_INET, peer, g + 12) == 1);
  return a;
}

static void rc_connect(struct ibv_qp *qp, int gid_index, const char *peer, uint32_t dest_qp,
                       uint32_t rq_psn, uint32_t sq_psn) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
      .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC};
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qp;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  a.ah_attr = av(gid_index, peer);
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 18; /* 1 s: few retransmissions during the capture */
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = sq_psn;
  a.max_rd_atomic = 4;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

int main(int argc, char **argv) {
  if (argc != 6) { fprintf(stderr, "usage: rxe_side DEVICE LOCAL_IP PEER_IP INFO_FILE SECONDS\n"); return 2; }
  struct ibv_device **list = ibv_get_device_list(NULL);
  struct ibv_context *ctx = NULL;
  for (int i = 0; list && list[i]; ++i)
    if (!strcmp(ibv_get_device_name(list[i]), argv[1])) ctx = ibv_open_device(list[i]);
  CHECK(ctx);
  union ibv_gid want = {.raw = {[10] = 0xff, [11] = 0xff}}, gid;
  CHECK(inet_pton(AF_INET, argv[2], want.raw + 12) == 1);
  int gid_index = -1;
  for (int i = 0; i < 16 && gid_index < 0; ++i)
    if (ibv_query_gid(ctx, 1, i, &gid) == 0 && !memcmp(&gid, &want, 16)) gid_index = i;
  CHECK(gid_index >= 0);
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  static uint64_t mem[1024];
  for (int i = 0; i < 1024; ++i) mem[i] = 0x0101010101010101ull * (i & 0xff);
  struct ibv_mr *mr = ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE |
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  CHECK(pd && mr);
  struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  CHECK(cq);
  struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp *qa = ibv_create_qp(pd, &ia), *qb = ibv_create_qp(pd, &ia);
  ia.qp_type = IBV_QPT_UD;
  struct ibv_qp *qu = ibv_create_qp(pd, &ia);
  CHECK(qa && qb && qu);

  /* B first, so the prober can start while A's requests go out. */
  rc_connect(qb, gid_index, argv[3], 0x777, 0x200, 0x300);
  for (int i = 0; i < 4; ++i) {
    struct ibv_sge sge = {(uintptr_t)(mem + 512 + 32 * i), 256, mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 100 + i, .sg_list = &sge, .num_sge = 1}, *bad;
    CHECK(ibv_post_recv(qb, &wr, &bad) == 0);
  }
  FILE *info = fopen(argv[4], "w");
  CHECK(info);
  fprintf(info, "%u %llu %u\n", qb->qp_num, (unsigned long long)(uintptr_t)mem, mr->rkey);
  fclose(info);
  printf("rxe_side: gid index %d, A qpn 0x%x, B qpn 0x%x, UD qpn 0x%x, mr va %p rkey 0x%x\n",
         gid_index, qa->qp_num, qb->qp_num, qu->qp_num, (void *)mem, mr->rkey);
  fflush(stdout);

  rc_connect(qa, gid_index, argv[3], 0xabc, 0x100, 0x1000);
  struct { enum ibv_wr_opcode op; uint32_t len; } reqs[] = {
      {IBV_WR_SEND, 16}, {IBV_WR_SEND_WITH_IMM, 5}, {IBV_WR_SEND, 2049}, {IBV_WR_RDMA_WRITE, 8},
      {IBV_WR_RDMA_WRITE_WITH_IMM, 3}, {IBV_WR_RDMA_WRITE, 2050}, {IBV_WR_RDMA_READ, 64},
      {IBV_WR_ATOMIC_CMP_AND_SWP, 8}, {IBV_WR_ATOMIC_FETCH_AND_ADD, 8}, {IBV_WR_SEND_WITH_INV, 7},
  };
  for (unsigned i = 0; i < sizeof reqs / sizeof reqs[0]; ++i) {
    struct ibv_sge sge = {(uintptr_t)mem, reqs[i].len, mr->lkey};
    struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = reqs[i].op,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.imm_data = htonl(0x11223344);
    if (reqs[i].op == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = 0x5566;
    wr.wr.rdma.remote_addr = 0x7000000000ull + 64 * i;
    wr.wr.rdma.rkey = 0x99;
    if (reqs[i].op == IBV_WR_ATOMIC_CMP_AND_SWP || reqs[i].op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = 0x7000001000ull;
      wr.wr.atomic.rkey = 0x99;
      wr.wr.atomic.compare_add = 0xaaaa;
      wr.wr.atomic.swap = 0xbbbb;
    }
    if (ibv_post_send(qa, &wr, &bad)) fprintf(stderr, "rxe_side: post %u failed\n", i);
  }

  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111};
  CHECK(ibv_modify_qp(qu, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  a.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(qu, &a, IBV_QP_STATE) == 0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x55;
  CHECK(ibv_modify_qp(qu, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
  struct ibv_ah_attr ud_av = av(gid_index, argv[3]);
  struct ibv_ah *ah = ibv_create_ah(pd, &ud_av);
  CHECK(ah);
  for (int i = 0; i < 2; ++i) {
    struct ibv_sge sge = {(uintptr_t)mem, 10 + i, mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 50 + i, .sg_list = &sge, .num_sge = 1,
        .opcode = i ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.imm_data = htonl(0xabcdef01);
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = 0xdef;
    wr.wr.ud.remote_qkey = 0x11111111;
    CHECK(ibv_post_send(qu, &wr, &bad) == 0);
  }

  time_t end = time(NULL) + atoi(argv[5]);
  while (time(NULL) < end) {
    struct ibv_wc wc[8];
    int n = ibv_poll_cq(cq, 8, wc);
    for (int i = 0; i < n; ++i)
      printf("rxe_side: wc qp 0x%x wr_id %llu status %s opcode %d byte_len %u\n", wc[i].qp_num,
             (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status), wc[i].opcode, wc[i].byte_len);
    fflush(stdout);
    usleep(10000);
  }
  printf("rxe_side: B's memory at 512: %016llx, at 0: %016llx\n", (unsigned long long)mem[512],
         (unsigned long long)mem[0]);
  return 0;
}
