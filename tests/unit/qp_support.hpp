// QP helpers for the unit tests: work-request builders, the RESET -> INIT -> RTR -> RTS
// path for RC, UC and UD, and a fixture with two QPs of one type connected to each other
// inside this process (address vector: GID index 0, an address of this host: any GID of
// this host takes the same-host path, whichever interface address it is).
#pragma once

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "unit_support.hpp"

namespace softverbs::unit {

inline constexpr unsigned kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
inline constexpr size_t kBufSize = 4096;
inline constexpr uint32_t kQkey = 0x11111111;
inline constexpr size_t kGrhBytes = 40;
// A key that names no MR in these small tests (slot 1000 of the key table is never used).
inline uint32_t unused_key(uint32_t key) { return key + (1000u << 8); }

// A QP number near `qpn` (so in the same process's block of numbers) that no QP of these
// small tests has.
inline uint32_t unused_qpn(uint32_t qpn) { return qpn + 1000; }

// One send work request with a single SGE; sg_list is set when posting, so copies are safe.
struct SendWr {
  ibv_sge sge{};
  ibv_send_wr wr{};

  SendWr(uint64_t wr_id, ibv_wr_opcode op, const void* addr, uint32_t len, uint32_t lkey,
         unsigned flags = IBV_SEND_SIGNALED) {
    sge.addr = reinterpret_cast<uintptr_t>(addr);
    sge.length = len;
    sge.lkey = lkey;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.num_sge = 1;
    wr.send_flags = flags;
  }
  SendWr& rdma(const void* remote, uint32_t rkey) {
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote);
    wr.wr.rdma.rkey = rkey;
    return *this;
  }
  SendWr& atomic(const void* remote, uint32_t rkey, uint64_t compare_add, uint64_t swap = 0) {
    wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(remote);
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    return *this;
  }
  SendWr& ud(ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey = kQkey) {
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = remote_qpn;
    wr.wr.ud.remote_qkey = remote_qkey;
    return *this;
  }
  SendWr& imm(uint32_t host_order) {
    wr.imm_data = htonl(host_order);
    return *this;
  }
  int post(Qp* qp, ibv_send_wr** bad = nullptr) {
    wr.sg_list = &sge;
    ibv_send_wr* dummy = nullptr;
    return post_send(qp, &wr, bad ? bad : &dummy);
  }
};

inline ibv_recv_wr* recv_wr(ibv_recv_wr* wr, ibv_sge* sge, uint64_t wr_id, void* addr,
                            uint32_t len, uint32_t lkey) {
  *sge = {reinterpret_cast<uintptr_t>(addr), len, lkey};
  *wr = {};
  wr->wr_id = wr_id;
  wr->sg_list = sge;
  wr->num_sge = 1;
  return wr;
}

inline int post_one_recv(Qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey,
                         ibv_recv_wr** bad = nullptr) {
  ibv_sge sge;
  ibv_recv_wr wr;
  ibv_recv_wr* dummy = nullptr;
  return post_recv(qp, recv_wr(&wr, &sge, wr_id, addr, len, lkey), bad ? bad : &dummy);
}

inline int post_one_srq_recv(Srq* srq, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey) {
  ibv_sge sge;
  ibv_recv_wr wr;
  ibv_recv_wr* bad = nullptr;
  return post_srq_recv(srq, recv_wr(&wr, &sge, wr_id, addr, len, lkey), &bad);
}

struct ConnOpts {
  unsigned access = kAllAccess;
  uint8_t rnr_retry = 7;      // 7 = retry for ever
  uint8_t min_rnr_timer = 1;  // 0.01 ms
  uint8_t retry_cnt = 7;
  uint8_t timeout = 14;
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
};

inline ibv_ah_attr loopback_av() {
  ibv_ah_attr av{};
  av.is_global = 1;
  av.port_num = 1;
  av.grh.sgid_index = 0;
  av.grh.hop_limit = 1;
  av.grh.dgid = Device::instance().gids()[0].gid;
  return av;
}

inline int to_init(Qp* qp, unsigned access = kAllAccess) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  a.qkey = kQkey;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  mask |= qp->type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
  return modify_qp(qp, &a, mask);
}

inline int to_rtr(Qp* qp, uint32_t dest_qpn, const ConnOpts& o = {}) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  int mask = IBV_QP_STATE;
  if (qp->type != IBV_QPT_UD) {
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 0x123;
    a.ah_attr = loopback_av();
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  }
  if (qp->type == IBV_QPT_RC) {
    a.max_dest_rd_atomic = o.max_dest_rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return modify_qp(qp, &a, mask);
}

inline int to_rts(Qp* qp, const ConnOpts& o = {}) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x456;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (qp->type == IBV_QPT_RC) {
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return modify_qp(qp, &a, mask);
}

inline int to_state(Qp* qp, ibv_qp_state s) {
  ibv_qp_attr a{};
  a.qp_state = s;
  return modify_qp(qp, &a, IBV_QP_STATE);
}

inline ibv_qp_state state_of(Qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(query_qp(qp, &a, IBV_QP_STATE, &init), 0);
  return a.qp_state;
}

// Two QPs of type `type` (set it in a derived constructor), a and b, each with its own CQ
// and a registered 4 KiB buffer; connect() takes both to RTS aimed at each other.
class PairTest : public ContextTest {
 protected:
  void SetUp() override {
    ContextTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_FALSE(Device::instance().gids().empty());
    pd = make_pd();
    ASSERT_NE(pd, nullptr);
    cq_a = make_cq(64);
    cq_b = make_cq(64);
    ASSERT_TRUE(cq_a && cq_b);
    a = make_qp(cq_a);
    b = make_qp(cq_b);
    ASSERT_TRUE(a && b);
    mr_a = reg(buf_a, kAllAccess);
    mr_b = reg(buf_b, kAllAccess);
    ASSERT_TRUE(mr_a && mr_b);
  }

  void TearDown() override {
    for (Qp* q : {a, b}) {
      if (q) {
        EXPECT_EQ(destroy_qp(q), 0);
      }
    }
    if (srq) {
      EXPECT_EQ(destroy_srq(srq), 0);
    }
    for (Mr* m : {mr_a, mr_b}) {
      if (m) {
        EXPECT_EQ(dereg_mr(m), 0);
      }
    }
    for (Cq* c : {cq_a, cq_b}) {
      if (c) {
        EXPECT_EQ(destroy_cq(c), 0);
      }
    }
    if (pd) {
      EXPECT_EQ(dealloc_pd(pd), 0);
    }
    ContextTest::TearDown();
  }

  Qp* make_qp(Cq* cq, uint32_t max_wr = 16, int sq_sig_all = 0, Srq* with_srq = nullptr) {
    ibv_qp_init_attr init{};
    init.send_cq = cq->cq();
    init.recv_cq = cq->cq();
    init.srq = with_srq ? &with_srq->ibv : nullptr;
    init.qp_type = type;
    init.sq_sig_all = sq_sig_all;
    init.cap.max_send_wr = max_wr;
    init.cap.max_recv_wr = with_srq ? 0 : max_wr;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = with_srq ? 0 : 4;
    ibv_qp* q = create_qp(pd, &init);
    EXPECT_NE(q, nullptr) << "create_qp: errno " << errno;
    return q ? Qp::from(q) : nullptr;
  }

  Mr* reg(std::vector<uint8_t>& buf, unsigned access) {
    ibv_mr* m =
        reg_mr(pd, buf.data(), buf.size(), reinterpret_cast<uintptr_t>(buf.data()), access);
    EXPECT_NE(m, nullptr) << "reg_mr: errno " << errno;
    return m ? Mr::from(m) : nullptr;
  }

  // Takes a <-> b through RESET -> INIT -> RTR -> RTS.
  void connect(const ConnOpts& oa = {}, const ConnOpts& ob = {}) {
    ASSERT_EQ(to_init(a, oa.access), 0);
    ASSERT_EQ(to_init(b, ob.access), 0);
    ASSERT_EQ(to_rtr(a, b->qpn(), oa), 0);
    ASSERT_EQ(to_rtr(b, a->qpn(), ob), 0);
    ASSERT_EQ(to_rts(a, oa), 0);
    ASSERT_EQ(to_rts(b, ob), 0);
  }

  // The single next completion of `cq` (bounded wait); fails the test if none comes.
  ibv_wc one(Cq* cq) {
    std::vector<ibv_wc> got = poll_until(cq, 1);
    EXPECT_EQ(got.size(), 1u) << "no completion within " << kWaitLimit.count() << " s";
    return got.empty() ? ibv_wc{} : got[0];
  }

  // The context's next async event (bounded wait); false if none came.
  bool next_async(ibv_async_event* ev) {
    if (!eventually([&] { return readable(ctx->ibv()->async_fd); })) return false;
    return get_async_event(ctx, ev) == 0;
  }

  // Takes the context's next async event (bounded wait) and acks it at once; an event of
  // type -1 if none came.
  ibv_async_event take_async() {
    ibv_async_event ev{};
    ev.event_type = static_cast<ibv_event_type>(-1);
    if (next_async(&ev)) ack_async_event(&ev);
    return ev;
  }

  void expect_cq_empty(Cq* cq) {
    ibv_wc wc;
    EXPECT_EQ(poll_cq(cq, 1, &wc), 0)
        << "unexpected completion wr_id " << wc.wr_id << " status " << status_name(wc.status);
  }

  ibv_qp_type type = IBV_QPT_RC;
  Pd* pd = nullptr;
  Cq* cq_a = nullptr;
  Cq* cq_b = nullptr;
  Qp* a = nullptr;
  Qp* b = nullptr;
  Srq* srq = nullptr;
  std::vector<uint8_t> buf_a = std::vector<uint8_t>(kBufSize);
  std::vector<uint8_t> buf_b = std::vector<uint8_t>(kBufSize);
  Mr* mr_a = nullptr;
  Mr* mr_b = nullptr;
};

}  // namespace softverbs::unit
