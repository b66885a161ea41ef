// Checks that look beyond this process or outside the classic post call:
//  - the rkey of a WRITE/READ/atomic to a connected QP of another process on this host,
//    against the MR table that process publishes (wire/shm/window.hpp's MrShared): a key
//    whose MR was deregistered, a range outside it, an access it lacks, and the peer QP's
//    own remote access, said at post time with the peer's MR as it is now;
//  - the extended API's builders and setters called outside ibv_wr_start .. ibv_wr_complete;
//  - the address handle given to ibv_wr_set_ud_addr (or a UD ibv_post_send): null or
//    destroyed.
// All of it runs only with checking on.
#include <cstdio>
#include <string>

#include "check/state.hpp"
#include "engine/shm_peer.hpp"

namespace softverbs::check {

namespace {

// What the peer publishes about one key, copied while we held the QP's send lock: the
// peer's word, only read (its memory is mapped read-only, and may change at any time).
struct PeerKey {
  bool window = false;       // the peer's receive window (and so its MR table) was there
  pid_t pid = 0;
  uint32_t qpn = 0;          // the peer QP
  unsigned qp_access = 0;    // its IBV_QP_ACCESS_FLAGS
  uint32_t max_dest_rd_atomic = 0;
  uint64_t pd_token = 0;     // its PD
  enum { kLive, kDead, kNever } slot = kNever;
  wire::MrShared entry{};    // kLive: the MR; kDead: what the slot held last
};

// Fills *out (fresh) with what the peer of `qp` publishes about `rkey`.
void look_at_peer(Qp* qp, uint32_t rkey, PeerKey* out) {
  PeerKey& k = *out;
  std::lock_guard<QueueMutex> lock(qp->sq_mu);
  if (qp->send_path.route != wire::Route::Shm) return;
  wire::PeerWindow* pw = engine::peer_window(qp, qp->send_path.dest_qpn);
  if (!pw || !pw->mr_table) return;
  k.window = true;
  k.pid = pw->pid;
  k.qpn = pw->dst_qpn;
  k.qp_access = pw->hdr->qp_access.load(std::memory_order_acquire);
  k.max_dest_rd_atomic = pw->hdr->max_dest_rd_atomic;
  k.pd_token = pw->pd_token;
  const uint32_t index = wire::key_index(rkey);
  if (index == 0 || index >= wire::kMrTableCap) return;
  if (wire::read_mr_entry(pw->mr_table, rkey, &k.entry)) {
    k.slot = PeerKey::kLive;
    return;
  }
  // Not there: a slot that held an MR (its fields stay when the key is cleared, or a newer
  // key is in it) had this key's MR deregistered; an empty one never held one we can name.
  const wire::MrShared& e = pw->mr_table[index];
  uint32_t now = e.key.load(std::memory_order_acquire);
  k.entry.iova = e.iova;
  k.entry.length = e.length;
  k.entry.access = e.access;
  if (now != 0 || k.entry.length != 0) k.slot = PeerKey::kDead;
  return;
}

const char* kRemoteAccessRule =
    "ibv_reg_mr(3): the access flags say what the MR allows: a remote WRITE needs "
    "IBV_ACCESS_REMOTE_WRITE, a READ IBV_ACCESS_REMOTE_READ, an atomic IBV_ACCESS_REMOTE_ATOMIC; "
    "the responder checks the R_Key, the range and the access of each request";

}  // namespace

void check_peer_rkey(Qp* qp, const std::string& call, const void* h, Site site, uint32_t rkey,
                     uint64_t addr, uint64_t length, unsigned need, bool read_atomic,
                     uint8_t max_rd_atomic) {
  PeerKey k;
  look_at_peer(qp, rkey, &k);
  if (!k.window) return;
  char peer[96], what[700];
  snprintf(peer, sizeof(peer), "the peer QP (qpn %u, pid %d)", k.qpn, static_cast<int>(k.pid));
  if ((k.qp_access & need) != need) {
    snprintf(what, sizeof(what),
             "  %s was not given %s in qp_access_flags (ibv_modify_qp, IBV_QP_ACCESS_FLAGS: it "
             "has %s): the WR completes with IBV_WC_REM_ACCESS_ERR",
             peer, access_names(need & ~k.qp_access).c_str(), access_names(k.qp_access).c_str());
    report("remote-qp-access", h, call, site, what,
           "ibv_modify_qp(3): qp_access_flags are the \"Mask of enabled remote access "
           "operations\" of the responder QP; a request it does not enable is refused");
    return;
  }
  if (read_atomic && k.max_dest_rd_atomic == 0) {
    snprintf(what, sizeof(what),
             "  %s has max_dest_rd_atomic 0 (IBV_QP_MAX_DEST_RD_ATOMIC not given when it moved "
             "to RTR): it takes no RDMA READ or atomic, so the WR fails", peer);
    report("remote-rd-atomic-zero", h, call, site, what,
           "ibv_modify_qp(3): max_dest_rd_atomic is the \"Number of responder resources for "
           "handling incoming RDMA reads & atomic operations\"");
    return;
  }
  // A NIC's responder holds max_dest_rd_atomic READs/atomics at once; a requester allowed
  // more outstanding than that (max_rd_atomic) overruns it once the pipe fills, which
  // softverbs' same-host path never shows.
  if (read_atomic && max_rd_atomic > k.max_dest_rd_atomic) {
    snprintf(what, sizeof(what),
             "  this QP's max_rd_atomic %u is above the max_dest_rd_atomic %u of %s: with more "
             "than %u READs/atomics outstanding its responder has no resources for the rest: a NIC "
             "may answer them as invalid requests (IBV_WC_REM_INV_REQ_ERR) or lose the replay "
             "state of the oldest (rxe); softverbs' same-host path does neither",
             max_rd_atomic, k.max_dest_rd_atomic, peer, k.max_dest_rd_atomic);
    report("rd-atomic-over-peer", h, call, site, what,
           "ibv_modify_qp(3): max_rd_atomic is the \"Number of outstanding RDMA reads & atomic "
           "operations on the destination QP\", max_dest_rd_atomic the destination's \"Number "
           "of responder resources\": the first must not exceed the second (rdma_cm negotiates "
           "initiator_depth against the peer's responder_resources for it)");
  }
  if (k.slot == PeerKey::kNever) return;  // a key we cannot name: the completion says more
  if (k.slot == PeerKey::kDead) {
    snprintf(what, sizeof(what),
             "  rkey 0x%x is no longer valid at %s: the MR it named, [0x%llx, +%llu) with "
             "access %s, was deregistered there: the WR completes with IBV_WC_REM_ACCESS_ERR",
             rkey, peer, static_cast<unsigned long long>(k.entry.iova),
             static_cast<unsigned long long>(k.entry.length), access_names(k.entry.access).c_str());
    report("rkey-deregistered", h, call, site, what,
           "ibv_dereg_mr(3) ends the MR and its keys; a work request that names a key no "
           "longer valid fails its protection check (at the responder, for an R_Key)");
    return;
  }
  const wire::MrShared& e = k.entry;
  if (e.pd_token != k.pd_token) {
    snprintf(what, sizeof(what),
             "  rkey 0x%x names an MR of another PD than that of %s: the WR completes with "
             "IBV_WC_REM_ACCESS_ERR", rkey, peer);
    report("rkey-other-pd", h, call, site, what,
           "ibv_alloc_pd(3): an R_Key is valid only on QPs of its MR's PD");
    return;
  }
  if (addr < e.iova || length > e.length || addr - e.iova > e.length - length) {
    snprintf(what, sizeof(what),
             "  [0x%llx, +%llu) is not inside the MR [0x%llx, +%llu) that rkey 0x%x names at "
             "%s: the WR completes with IBV_WC_REM_ACCESS_ERR",
             static_cast<unsigned long long>(addr), static_cast<unsigned long long>(length),
             static_cast<unsigned long long>(e.iova), static_cast<unsigned long long>(e.length),
             rkey, peer);
    report("remote-outside-mr", h, call, site, what,
           "ibv_reg_mr(3) registers [addr, addr + length): a key covers that range only");
    return;
  }
  if ((e.access & need) != need) {
    snprintf(what, sizeof(what),
             "  rkey 0x%x names an MR of %s registered with access %s, without %s, which this "
             "operation needs: the WR completes with IBV_WC_REM_ACCESS_ERR",
             rkey, peer, access_names(e.access).c_str(), access_names(need & ~e.access).c_str());
    report("remote-access-flags", h, call, site, what, kRemoteAccessRule);
  }
}

// ---- the extended API ------------------------------------------------------------------

void check_wr_in_batch(ibv_qp_ex* q, const char* verb, bool builder, Site site) {
  Qp* qp = Qp::from(&q->qp_base);
  if (!qp) return;
  const ExBatch& b = qp->ex;
  const char* what = nullptr;
  if (!b.open)
    what = builder ? "  no batch is open on the QP (no ibv_wr_start, or the batch was ended by "
                     "ibv_wr_complete/ibv_wr_abort): the WR is not built and never posted"
                   : "  no batch is open on the QP (no ibv_wr_start, or the batch was ended by "
                     "ibv_wr_complete/ibv_wr_abort): there is no WR to apply it to, so it does "
                     "nothing";
  else if (!builder && b.count == 0)
    what = "  no WR was started in this batch (ibv_wr_send, ibv_wr_rdma_write, ...) before it: "
           "there is no WR to apply it to, so ibv_wr_complete fails with EINVAL";
  if (!what) return;
  char call[160];
  snprintf(call, sizeof(call), "%s: QP %p wr_id %llu", verb, static_cast<void*>(qp->qp()),
           static_cast<unsigned long long>(q->wr_id));
  report("wr-outside-batch", qp->qp(), call, site, what,
         "ibv_wr_post(3): \"Posting work requests to the QP is done within the critical "
         "region formed by ibv_wr_start() and ibv_wr_complete()/ibv_wr_abort()\"; \"Each work "
         "request is created by calling a WR builder function ... followed by allowed/required "
         "setter functions\"");
}

void check_ud_ah(Qp* qp, const ibv_ah* ah, const std::string& call, Site site) {
  const void* h = qp->qp();
  if (!ah) {
    report("ah-invalid", h, call, site,
           "  the address handle is NULL: the WR has no destination and fails",
           "ibv_post_send(3)/ibv_wr_post(3): a UD work request names its destination with an "
           "address handle made by ibv_create_ah");
    return;
  }
  DeadAh d;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().objects.count(ah)) return;
    auto it = state().dead_ahs.find(ah);
    if (it == state().dead_ahs.end()) return;  // one we did not see made: say nothing
    d = it->second;
  }
  char what[400];
  snprintf(what, sizeof(what),
           "  the address handle %p, made at %s, was destroyed by ibv_destroy_ah at %s: its "
           "memory may hold anything now, so the WR goes nowhere or anywhere",
           static_cast<const void*>(ah), where(d.made_site).c_str(), where(d.destroy_site).c_str());
  report("ah-destroyed", h, call, site, what,
         "ibv_create_ah(3): ibv_destroy_ah ends the AH; a work request may name only an AH that "
         "is still there until its completion");
}

}  // namespace softverbs::check
