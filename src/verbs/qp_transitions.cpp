// ibv_modify_qp attribute-mask rules: IBA 1.4 table 91 / the kernel's qp_state_table.
// For each (current, next) state and QP type: the attributes that must be given and the
// ones that may be given. Anything else is EINVAL.
#include <cerrno>

#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

struct Rule {
  bool valid = false;
  // per type: RC, UC, UD, XRC INI (XRC_SEND), XRC TGT (XRC_RECV), raw packet
  int req[6] = {0, 0, 0, 0, 0, 0};
  int opt[6] = {0, 0, 0, 0, 0, 0};
};

int type_index(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC: return 0;
    case IBV_QPT_UC: return 1;
    case IBV_QPT_XRC_SEND: return 3;
    case IBV_QPT_XRC_RECV: return 4;
    case IBV_QPT_RAW_PACKET: return 5;
    default: return 2;
  }
}

constexpr int PKEY = IBV_QP_PKEY_INDEX, PORT = IBV_QP_PORT, ACCESS = IBV_QP_ACCESS_FLAGS,
              QKEY = IBV_QP_QKEY, AV = IBV_QP_AV, MTU = IBV_QP_PATH_MTU,
              DQPN = IBV_QP_DEST_QPN, RQPSN = IBV_QP_RQ_PSN, DRD = IBV_QP_MAX_DEST_RD_ATOMIC,
              RNRT = IBV_QP_MIN_RNR_TIMER, ALT = IBV_QP_ALT_PATH, TIMEOUT = IBV_QP_TIMEOUT,
              RETRY = IBV_QP_RETRY_CNT, RNRR = IBV_QP_RNR_RETRY, SQPSN = IBV_QP_SQ_PSN,
              RD = IBV_QP_MAX_QP_RD_ATOMIC, CUR = IBV_QP_CUR_STATE, MIG = IBV_QP_PATH_MIG_STATE,
              SQD_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY;

struct Table {
  Rule r[7][7];  // [current][next]
  Table() {
    for (int s = 0; s <= IBV_QPS_ERR; ++s) {
      r[s][IBV_QPS_RESET].valid = true;
      r[s][IBV_QPS_ERR].valid = true;
    }
    // XRC columns as the kernel's qp_state_table has them.
    // A raw packet QP names its port and nothing else (the kernel's table: IB_QP_PORT
    // into INIT, no attributes at all after that).
    set(IBV_QPS_RESET, IBV_QPS_INIT,
        {PKEY | PORT | ACCESS, PKEY | PORT | ACCESS, PKEY | PORT | QKEY, PKEY | PORT | ACCESS,
         PKEY | PORT | ACCESS, PORT},
        {0, 0, 0, 0, 0, 0});
    set(IBV_QPS_INIT, IBV_QPS_INIT, {0, 0, 0, 0, 0},
        {PKEY | PORT | ACCESS, PKEY | PORT | ACCESS, PKEY | PORT | QKEY, PKEY | PORT | ACCESS,
         PKEY | PORT | ACCESS});
    set(IBV_QPS_INIT, IBV_QPS_RTR,
        {AV | MTU | DQPN | RQPSN | DRD | RNRT, AV | MTU | DQPN | RQPSN, 0,
         AV | MTU | DQPN | RQPSN, AV | MTU | DQPN | RQPSN | DRD | RNRT},
        {ALT | ACCESS | PKEY, ALT | ACCESS | PKEY, PKEY | QKEY, ALT | ACCESS | PKEY,
         ALT | ACCESS | PKEY});
    set(IBV_QPS_RTR, IBV_QPS_RTS,
        {SQPSN | TIMEOUT | RETRY | RNRR | RD, SQPSN, SQPSN, SQPSN | TIMEOUT | RETRY | RNRR | RD,
         SQPSN | TIMEOUT},
        {CUR | ALT | ACCESS | RNRT | MIG, CUR | ALT | ACCESS | MIG, CUR | QKEY,
         CUR | ALT | ACCESS | MIG, CUR | ALT | ACCESS | RNRT | MIG});
    set(IBV_QPS_RTS, IBV_QPS_RTS, {0, 0, 0, 0, 0},
        {CUR | ACCESS | ALT | MIG | RNRT, CUR | ACCESS | ALT | MIG, CUR | QKEY,
         CUR | ACCESS | ALT | MIG, CUR | ACCESS | ALT | MIG | RNRT});
    set(IBV_QPS_RTS, IBV_QPS_SQD, {0, 0, 0, 0, 0},
        {SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY});
    set(IBV_QPS_SQD, IBV_QPS_RTS, {0, 0, 0, 0, 0},
        {CUR | ALT | ACCESS | MIG | RNRT, CUR | ALT | ACCESS | MIG, CUR | QKEY,
         CUR | ALT | ACCESS | MIG, CUR | ALT | ACCESS | MIG | RNRT});
    set(IBV_QPS_SQD, IBV_QPS_SQD, {0, 0, 0, 0, 0},
        {PORT | AV | TIMEOUT | RETRY | RNRR | RD | DRD | ALT | ACCESS | PKEY | RNRT | MIG,
         AV | ALT | ACCESS | PKEY | MIG, PKEY | QKEY,
         PORT | AV | TIMEOUT | RETRY | RNRR | RD | ALT | ACCESS | PKEY | MIG,
         PORT | AV | TIMEOUT | DRD | ALT | ACCESS | PKEY | RNRT | MIG});
    set(IBV_QPS_SQE, IBV_QPS_RTS, {0, 0, 0, 0, 0}, {0, CUR | ACCESS, CUR | QKEY, 0, 0});
  }
  void set(int cur, int next, std::initializer_list<int> req, std::initializer_list<int> opt) {
    Rule& rule = r[cur][next];
    rule.valid = true;
    int i = 0;
    for (int v : req) rule.req[i++] = v;
    i = 0;
    for (int v : opt) rule.opt[i++] = v;
  }
};

}  // namespace

int check_modify_mask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask) {
  static const Table table;
  if (cur < IBV_QPS_RESET || cur > IBV_QPS_ERR || next < IBV_QPS_RESET || next > IBV_QPS_ERR)
    return EINVAL;
  const Rule& rule = table.r[cur][next];
  if (!rule.valid) return EINVAL;
  // SQE is a UC/UD state: an RC or XRC QP neither enters nor leaves it.
  const bool reliable = type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV;
  if (reliable && (next == IBV_QPS_SQE || (cur == IBV_QPS_SQE && next == IBV_QPS_RTS)))
    return EINVAL;
  int t = type_index(type);
  int given = mask & ~IBV_QP_STATE;
  if ((given & rule.req[t]) != rule.req[t]) return EINVAL;
  if (given & ~(rule.req[t] | rule.opt[t])) return EINVAL;
  return 0;
}

}  // namespace softverbs
