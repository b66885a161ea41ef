// check_modify_mask against the IBA 1.4 QP state transition table (table 91; the kernel's
// qp_state_table in drivers/infiniband/core/verbs.c), for RC, UC and UD. The expected table
// is written out here independently of the library's own.
#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "verbs/verbs.hpp"

namespace softverbs {
namespace {

// Attribute bits by their IBA names.
constexpr int kPkey = IBV_QP_PKEY_INDEX, kPort = IBV_QP_PORT, kAccess = IBV_QP_ACCESS_FLAGS,
              kQkey = IBV_QP_QKEY, kAv = IBV_QP_AV, kMtu = IBV_QP_PATH_MTU,
              kDestQpn = IBV_QP_DEST_QPN, kRqPsn = IBV_QP_RQ_PSN, kSqPsn = IBV_QP_SQ_PSN,
              kDestRdAtomic = IBV_QP_MAX_DEST_RD_ATOMIC, kRdAtomic = IBV_QP_MAX_QP_RD_ATOMIC,
              kMinRnrTimer = IBV_QP_MIN_RNR_TIMER, kAltPath = IBV_QP_ALT_PATH,
              kTimeout = IBV_QP_TIMEOUT, kRetryCnt = IBV_QP_RETRY_CNT, kRnrRetry = IBV_QP_RNR_RETRY,
              kCurState = IBV_QP_CUR_STATE, kMigState = IBV_QP_PATH_MIG_STATE,
              kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;

// Every attribute bit of ibv_modify_qp except IBV_QP_STATE (IBV_QP_CUR_STATE .. IBV_QP_DEST_QPN,
// IBV_QP_CAP included: it is never allowed).
constexpr int kFirstAttrBit = 1, kLastAttrBit = 20;

struct Expect {
  int req;
  int opt;
};
using Key = std::pair<ibv_qp_state, ibv_qp_state>;
using TypeTable = std::map<Key, Expect>;

// The valid transitions of one QP type, other than "any state -> RESET/ERR".
TypeTable table_for(ibv_qp_type t) {
  const bool rc = t == IBV_QPT_RC, uc = t == IBV_QPT_UC;
  TypeTable m;
  if (rc || uc) {
    const int rc_rtr = rc ? kDestRdAtomic | kMinRnrTimer : 0;
    const int rc_rts = rc ? kTimeout | kRetryCnt | kRnrRetry | kRdAtomic : 0;
    const int rc_rnr = rc ? kMinRnrTimer : 0;
    m[{IBV_QPS_RESET, IBV_QPS_INIT}] = {kPkey | kPort | kAccess, 0};
    m[{IBV_QPS_INIT, IBV_QPS_INIT}] = {0, kPkey | kPort | kAccess};
    m[{IBV_QPS_INIT, IBV_QPS_RTR}] = {kAv | kMtu | kDestQpn | kRqPsn | rc_rtr,
                                     kAltPath | kAccess | kPkey};
    m[{IBV_QPS_RTR, IBV_QPS_RTS}] = {kSqPsn | rc_rts,
                                    kCurState | kAltPath | kAccess | kMigState | rc_rnr};
    m[{IBV_QPS_RTS, IBV_QPS_RTS}] = {0, kCurState | kAccess | kAltPath | kMigState | rc_rnr};
    m[{IBV_QPS_RTS, IBV_QPS_SQD}] = {0, kSqdNotify};
    m[{IBV_QPS_SQD, IBV_QPS_RTS}] = {0, kCurState | kAltPath | kAccess | kMigState | rc_rnr};
    m[{IBV_QPS_SQD, IBV_QPS_SQD}] = {
        0, kAv | kAltPath | kAccess | kPkey | kMigState |
               (rc ? kPort | kTimeout | kRetryCnt | kRnrRetry | kRdAtomic | kDestRdAtomic |
                         kMinRnrTimer
                   : 0)};
    if (uc) m[{IBV_QPS_SQE, IBV_QPS_RTS}] = {0, kCurState | kAccess};
  } else {  // UD
    m[{IBV_QPS_RESET, IBV_QPS_INIT}] = {kPkey | kPort | kQkey, 0};
    m[{IBV_QPS_INIT, IBV_QPS_INIT}] = {0, kPkey | kPort | kQkey};
    m[{IBV_QPS_INIT, IBV_QPS_RTR}] = {0, kPkey | kQkey};
    m[{IBV_QPS_RTR, IBV_QPS_RTS}] = {kSqPsn, kCurState | kQkey};
    m[{IBV_QPS_RTS, IBV_QPS_RTS}] = {0, kCurState | kQkey};
    m[{IBV_QPS_RTS, IBV_QPS_SQD}] = {0, kSqdNotify};
    m[{IBV_QPS_SQD, IBV_QPS_RTS}] = {0, kCurState | kQkey};
    m[{IBV_QPS_SQD, IBV_QPS_SQD}] = {0, kPkey | kQkey};
    m[{IBV_QPS_SQE, IBV_QPS_RTS}] = {0, kCurState | kQkey};
  }
  for (int s = IBV_QPS_RESET; s <= IBV_QPS_ERR; ++s) {
    m[{static_cast<ibv_qp_state>(s), IBV_QPS_RESET}] = {0, 0};
    m[{static_cast<ibv_qp_state>(s), IBV_QPS_ERR}] = {0, 0};
  }
  return m;
}

const char* type_name(ibv_qp_type t) {
  return t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD";
}

std::string describe(ibv_qp_type t, int cur, int next, int mask) {
  std::ostringstream os;
  os << type_name(t) << " " << cur << "->" << next << " mask 0x" << std::hex << mask;
  return os.str();
}

class QpTransitions : public ::testing::TestWithParam<ibv_qp_type> {};

INSTANTIATE_TEST_SUITE_P(Types, QpTransitions,
                         ::testing::Values(IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD),
                         [](const auto& info) { return std::string(type_name(info.param)); });

TEST_P(QpTransitions, ValidTransitionWithExactlyTheRequiredMask) {
  const ibv_qp_type t = GetParam();
  for (const auto& [key, e] : table_for(t)) {
    int mask = IBV_QP_STATE | e.req;
    EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), 0)
        << describe(t, key.first, key.second, mask);
  }
}

TEST_P(QpTransitions, MissingARequiredAttributeIsEinval) {
  const ibv_qp_type t = GetParam();
  for (const auto& [key, e] : table_for(t)) {
    for (int bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
      int b = 1 << bit;
      if (!(e.req & b)) continue;
      // Without one required bit, even with every optional one given.
      int mask = IBV_QP_STATE | ((e.req | e.opt) & ~b);
      EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), EINVAL)
          << describe(t, key.first, key.second, mask);
    }
  }
}

TEST_P(QpTransitions, AnAttributeOutsideRequiredAndOptionalIsEinval) {
  const ibv_qp_type t = GetParam();
  for (const auto& [key, e] : table_for(t)) {
    for (int bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
      int b = 1 << bit;
      if ((e.req | e.opt) & b) continue;
      int mask = IBV_QP_STATE | e.req | b;
      EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), EINVAL)
          << describe(t, key.first, key.second, mask);
    }
  }
}

TEST_P(QpTransitions, OptionalAttributesAreAccepted) {
  const ibv_qp_type t = GetParam();
  for (const auto& [key, e] : table_for(t)) {
    for (int bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
      int b = 1 << bit;
      if (!(e.opt & b)) continue;
      int mask = IBV_QP_STATE | e.req | b;
      EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), 0)
          << describe(t, key.first, key.second, mask);
    }
    int all = IBV_QP_STATE | e.req | e.opt;
    EXPECT_EQ(check_modify_mask(t, key.first, key.second, all), 0)
        << describe(t, key.first, key.second, all);
  }
}

TEST_P(QpTransitions, TransitionsOutsideTheTableAreEinval) {
  const ibv_qp_type t = GetParam();
  const TypeTable table = table_for(t);
  for (int cur = IBV_QPS_RESET; cur <= IBV_QPS_ERR; ++cur) {
    for (int next = IBV_QPS_RESET; next <= IBV_QPS_ERR; ++next) {
      Key key{static_cast<ibv_qp_state>(cur), static_cast<ibv_qp_state>(next)};
      if (table.count(key)) continue;
      // RC SQE -> RTS has a test of its own (QpTransitionsRc.SqeToRtsIsNotAnRcTransition).
      if (t == IBV_QPT_RC && cur == IBV_QPS_SQE && next == IBV_QPS_RTS) continue;
      // Whatever attributes come along: none of these masks may pass.
      for (int mask : {int(IBV_QP_STATE), IBV_QP_STATE | ((1 << (kLastAttrBit + 1)) - 2)}) {
        EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), EINVAL)
            << describe(t, cur, next, mask);
      }
    }
  }
}

TEST_P(QpTransitions, NamedInvalidTransitions) {
  const ibv_qp_type t = GetParam();
  // Skipping a state is never allowed, whatever is given.
  const int rtr_attrs = kAv | kMtu | kDestQpn | kRqPsn | kDestRdAtomic | kMinRnrTimer;
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RESET, IBV_QPS_RTR, IBV_QP_STATE | rtr_attrs), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RESET, IBV_QPS_RTS, IBV_QP_STATE | kSqPsn), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_INIT, IBV_QPS_RTS,
                              IBV_QP_STATE | kSqPsn | kTimeout | kRetryCnt | kRnrRetry | kRdAtomic),
            EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RTR, IBV_QPS_SQD, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RTR, IBV_QPS_INIT, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RTS, IBV_QPS_RTR, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_ERR, IBV_QPS_INIT,
                              IBV_QP_STATE | kPkey | kPort | (t == IBV_QPT_UD ? kQkey : kAccess)),
            EINVAL);
  // SQE is entered by the QP itself, never by ibv_modify_qp.
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RTS, IBV_QPS_SQE, IBV_QP_STATE), EINVAL);
}

TEST(QpTransitionsRc, SqeDoesNotExistForRc) {
  // RC has no SQE state (a send error takes an RC QP to ERR): nothing leads into it ...
  EXPECT_EQ(check_modify_mask(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQE, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QP_STATE), EINVAL);
  // ... while UC and UD recover from SQE to RTS.
  EXPECT_EQ(check_modify_mask(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE), 0);
}

TEST(QpTransitionsRc, SqeToRtsIsNotAnRcTransition) {
  // IBA table 91 lists SQE -> RTS for UC and UD only.
  EXPECT_EQ(check_modify_mask(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE | kCurState),
            EINVAL);
}

// XRC (the kernel's qp_state_table): an INI QP takes RC's send attributes and no receive
// ones, a TGT QP RC's receive attributes and of the send ones only the PSN and timeout.
TEST(QpTransitionsXrc, IniAndTgtMasks) {
  const int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  const int recv = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  const int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT;
  const int send = IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  for (ibv_qp_type t : {IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV})
    EXPECT_EQ(check_modify_mask(t, IBV_QPS_RESET, IBV_QPS_INIT, init), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr | recv), EINVAL);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr), EINVAL);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr | recv), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, rts | send), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, rts), EINVAL);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, rts), 0);
  EXPECT_EQ(check_modify_mask(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, rts | send), EINVAL);
  // Reliable: no SQE.
  for (ibv_qp_type t : {IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV})
    EXPECT_EQ(check_modify_mask(t, IBV_QPS_RTS, IBV_QPS_SQE, IBV_QP_STATE), EINVAL);
}

TEST_P(QpTransitions, AnyStateToResetOrErrWithoutAttributes) {
  const ibv_qp_type t = GetParam();
  for (int cur = IBV_QPS_RESET; cur <= IBV_QPS_ERR; ++cur) {
    if (t == IBV_QPT_RC && cur == IBV_QPS_SQE) continue;  // RC never is in SQE
    auto s = static_cast<ibv_qp_state>(cur);
    EXPECT_EQ(check_modify_mask(t, s, IBV_QPS_RESET, IBV_QP_STATE), 0) << cur << "->RESET";
    EXPECT_EQ(check_modify_mask(t, s, IBV_QPS_ERR, IBV_QP_STATE), 0) << cur << "->ERR";
    // Attributes have no place in these transitions.
    EXPECT_EQ(check_modify_mask(t, s, IBV_QPS_ERR, IBV_QP_STATE | kPkey), EINVAL) << cur;
    EXPECT_EQ(check_modify_mask(t, s, IBV_QPS_RESET, IBV_QP_STATE | kCurState), EINVAL) << cur;
  }
}

TEST_P(QpTransitions, OutOfRangeStatesAreEinval) {
  const ibv_qp_type t = GetParam();
  auto bogus = static_cast<ibv_qp_state>(IBV_QPS_ERR + 1);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RESET, bogus, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(t, bogus, IBV_QPS_RESET, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(check_modify_mask(t, IBV_QPS_RESET, IBV_QPS_UNKNOWN, IBV_QP_STATE), EINVAL);
}

TEST_P(QpTransitions, CapIsNeverAModifyAttribute) {
  const ibv_qp_type t = GetParam();
  for (const auto& [key, e] : table_for(t)) {
    int mask = IBV_QP_STATE | e.req | IBV_QP_CAP;
    EXPECT_EQ(check_modify_mask(t, key.first, key.second, mask), EINVAL)
        << describe(t, key.first, key.second, mask);
  }
}

}  // namespace
}  // namespace softverbs
