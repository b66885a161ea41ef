// What the checker keeps between calls (the objects it saw made, their arm and event
// history) and how it reports, shared by the check/ files. Everything here runs only with
// checking on; one mutex guards it all (never held while calling into the verbs).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "check/check.hpp"

namespace softverbs::check {

struct ObjState {
  Kind kind = Kind::Pd;
  const void* parent = nullptr;
  Site site = nullptr;    // where it was made
  bool internal = false;  // made by librdmacm on its own behalf: not the application's leak
  uint64_t seq = 0;       // the order of making, for reports that list objects
  // CQ: its last ibv_req_notify_cq and what was waiting then; its events.
  Site arm_site = nullptr;
  uint64_t waiting_at_arm = 0;
  uint64_t head_at_arm = 0;
  bool event_since_arm = false;  // an event was taken and the CQ not armed since
  Site event_site = nullptr;     // where the last event was got
  // QP: sends posted unsignaled since the last signaled one (sq_sig_all = 0); RNR waits.
  uint64_t unsignaled_run = 0;
  uint64_t rnr_waits = 0;
  uint32_t qpn = 0;
  // MR: what it covered, for a report naming its keys after ibv_dereg_mr.
  uint32_t lkey = 0, rkey = 0;
  uint64_t addr = 0, length = 0;
};

// A deregistered MR's key, until a new MR or window gets the same key.
struct DeadKey {
  uint64_t addr = 0, length = 0;
  Site reg_site = nullptr, dereg_site = nullptr;
};

// A destroyed AH, until an AH is made at the same address again.
struct DeadAh {
  Site made_site = nullptr, destroy_site = nullptr;
};

struct State {
  std::mutex mu;
  std::unordered_map<const void*, ObjState> objects;
  std::map<uint32_t, DeadKey> dead_keys;
  std::unordered_map<const void*, DeadAh> dead_ahs;
  uint64_t made = 0;  // objects made so far
};
State& state();

const char* kind_name(Kind kind);
std::string access_names(unsigned access);  // "IBV_ACCESS_REMOTE_WRITE|…", "0" for none
std::string where(Site site);  // "main+0x2b (prog)" or "prog+0x11a9", via dladdr(3)

// Reports a misuse once per (`object`, `kind`): the call and where it came from, what is
// wrong (`what`, one or more lines) and the rule (`rule`, the man page's words). Returns
// false if it had been reported before. Takes no lock of the verbs; not under state().mu.
bool report(const char* kind, const void* object, const std::string& call, Site site,
            const std::string& what, const char* rule);

// Counts a verbs call the checker looked at (for the summary line).
void count_call();

void busy(Kind kind, const void* handle, Site site);  // explains an EBUSY

// The ops the checking ones wrap (the same for every context: check/ops.cpp).
struct RealOps {
  int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
  int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*post_srq_recv)(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*poll_cq)(ibv_cq*, int, ibv_wc*) = nullptr;
  int (*req_notify_cq)(ibv_cq*, int) = nullptr;
  ibv_qp* (*create_qp_ex)(ibv_context*, ibv_qp_init_attr_ex*) = nullptr;
  ibv_cq_ex* (*create_cq_ex)(ibv_context*, ibv_cq_init_attr_ex*) = nullptr;
  // Per object, but the same in every one: taken from the first extended QP / CQ.
  int (*wr_complete)(ibv_qp_ex*) = nullptr;
  void (*wr_set_sge_list)(ibv_qp_ex*, size_t, const ibv_sge*) = nullptr;
  void (*wr_set_inline_data)(ibv_qp_ex*, void*, size_t) = nullptr;
  void (*wr_set_inline_data_list)(ibv_qp_ex*, size_t, const ibv_data_buf*) = nullptr;
  void (*wr_set_ud_addr)(ibv_qp_ex*, ibv_ah*, uint32_t, uint32_t) = nullptr;
  int (*start_poll)(ibv_cq_ex*, ibv_poll_cq_attr*) = nullptr;
  int (*next_poll)(ibv_cq_ex*) = nullptr;
};
extern RealOps real;

// The checks the data-path ops make (check/post_checks.cpp, check/events.cpp).
int checked_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad, Site site);
int checked_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad, Site site);
int checked_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad, Site site);
int checked_wr_complete(ibv_qp_ex* q, Site site);
void check_wr_set_sges(ibv_qp_ex* q, size_t n, Site site);
void check_wr_set_inline(ibv_qp_ex* q, uint64_t bytes, Site site);
void before_req_notify(Cq* cq, Site site);
// check/peer_checks.cpp: the rkey of a WR to a connected QP of another process on this host
// (route Shm), against the MR table it publishes; `need`: the remote access the op needs.
void check_peer_rkey(Qp* qp, const std::string& call, const void* h, Site site, uint32_t rkey,
                     uint64_t addr, uint64_t length, unsigned need, bool read_atomic,
                     uint8_t max_rd_atomic);
// An ibv_wr_<op> (`builder`) or ibv_wr_set_* outside ibv_wr_start .. ibv_wr_complete.
void check_wr_in_batch(ibv_qp_ex* q, const char* verb, bool builder, Site site);
// A UD WR's address handle: null, or one destroyed before.
void check_ud_ah(Qp* qp, const ibv_ah* ah, const std::string& call, Site site);
// `verb`: how they were taken (ibv_poll_cq, or ibv_start_poll / ibv_next_poll).
void explain_completions(const ibv_wc* wc, int n, Site site, const char* verb);
void install_engine_hooks();  // the CQ overrun and RNR hooks (core/check_hooks.hpp)

}  // namespace softverbs::check
