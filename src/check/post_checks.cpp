// The checks of ibv_post_send / ibv_post_recv / ibv_post_srq_recv: the QP's state, the
// limits it was created with, the send queue of a QP that never signals, and each buffer
// against its MR (a deregistered key, another PD, outside the MR, access missing); for a
// peer in this process, the rkey too. The WRs are looked at before the call; a full queue
// (ENOMEM) is explained after it.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "check/state.hpp"
#include "common/qp_state_name.hpp"
#include "core/core.hpp"

namespace softverbs::check {

namespace {

const char* state_name(int st) {
  const char* name = qp_state_name(st);
  return name ? name : "?";
}

std::string call_text(const char* verb, const void* object, const char* what, uint64_t wr_id) {
  char buf[160];
  snprintf(buf, sizeof(buf), "%s: %s %p wr_id %llu", verb, what, object,
           static_cast<unsigned long long>(wr_id));
  return buf;
}

// The errno a refused WR gives back: ibv_post_send's, or the batch's from ibv_wr_complete.
const char* fails_with(const char* verb) {
  return std::string(verb) == "ibv_post_send" ? "EINVAL" : "EINVAL (the whole batch is refused)";
}


// One key against the key table: `local` for an lkey of sg_list[index], else the rkey.
// `pd`: the QP's (lkeys only); `need`: the access the operation needs.
void check_key(const std::string& call, const void* object, Site site, bool local, int index,
               Pd* pd, uint32_t key, uint64_t addr, uint64_t length, unsigned need) {
  bool found = false, other_pd = false;
  uint64_t mr_addr = 0, mr_length = 0;
  unsigned access = 0;
  {
    std::shared_lock keys(MrTable::instance().lock());
    if (Mr* mr = MrTable::instance().find(key)) {
      found = true;
      other_pd = pd && mr->pd->prot != pd->prot;
      mr_addr = mr->iova;
      mr_length = mr->length;
      access = mr->access;
    }
  }
  char name[64];
  if (local)
    snprintf(name, sizeof(name), "sg_list[%d].lkey 0x%x", index, key);
  else
    snprintf(name, sizeof(name), "rkey 0x%x", key);
  char what[600];
  if (!found) {
    DeadKey d;
    {
      std::lock_guard<std::mutex> lock(state().mu);
      auto it = state().dead_keys.find(key);
      if (it == state().dead_keys.end()) return;  // a window's, or another process's key
      d = it->second;
    }
    snprintf(what, sizeof(what),
             "  %s is the key of the MR [0x%llx, +%llu) made at %s and deregistered by "
             "ibv_dereg_mr at %s: the WR completes with %s",
             name, static_cast<unsigned long long>(d.addr), static_cast<unsigned long long>(d.length),
             where(d.reg_site).c_str(), where(d.dereg_site).c_str(),
             local ? "IBV_WC_LOC_PROT_ERR" : "IBV_WC_REM_ACCESS_ERR at the requester");
    report(local ? "lkey-deregistered" : "rkey-deregistered", object, call, site, what,
           "ibv_dereg_mr(3) ends the MR and its keys; a work request that names a key no "
           "longer valid fails its protection check");
    return;
  }
  if (other_pd) {
    snprintf(what, sizeof(what), "  %s names an MR of another PD than the QP's: the WR completes "
             "with IBV_WC_LOC_PROT_ERR", name);
    report("lkey-other-pd", object, call, site, what,
           "ibv_alloc_pd(3): a PD groups the QPs and MRs that may be used together; an "
           "L_Key is valid only on QPs of its MR's PD");
    return;
  }
  if (addr < mr_addr || length > mr_length || addr - mr_addr > mr_length - length) {
    snprintf(what, sizeof(what),
             "  [0x%llx, +%llu) is not inside the MR [0x%llx, +%llu) that %s names: the WR "
             "completes with %s",
             static_cast<unsigned long long>(addr), static_cast<unsigned long long>(length),
             static_cast<unsigned long long>(mr_addr), static_cast<unsigned long long>(mr_length),
             name, local ? "IBV_WC_LOC_PROT_ERR" : "IBV_WC_REM_ACCESS_ERR");
    report(local ? "buffer-outside-mr" : "remote-outside-mr", object, call, site, what,
           "ibv_reg_mr(3) registers [addr, addr + length): a key covers that range only");
    return;
  }
  if ((access & need) != need) {
    snprintf(what, sizeof(what),
             "  %s names an MR registered with access %s, without %s, which this operation "
             "needs: the WR completes with %s",
             name, access_names(access).c_str(), access_names(need & ~access).c_str(),
             local ? "IBV_WC_LOC_PROT_ERR" : "IBV_WC_REM_ACCESS_ERR");
    report(local ? "local-access" : "remote-access-flags", object, call, site, what,
           "ibv_reg_mr(3): the access flags say what the MR allows: a local write "
           "(receive, READ or atomic result) needs IBV_ACCESS_LOCAL_WRITE, a remote WRITE "
           "IBV_ACCESS_REMOTE_WRITE, a READ IBV_ACCESS_REMOTE_READ, an atomic "
           "IBV_ACCESS_REMOTE_ATOMIC");
  }
}

void check_sges(const std::string& call, const void* object, Site site, Pd* pd,
                const ibv_sge* sg, int num, unsigned need) {
  if (!sg) return;
  for (int i = 0; i < num; ++i)
    if (sg[i].length)
      check_key(call, object, site, true, i, pd, sg[i].lkey, sg[i].addr, sg[i].length, need);
}

bool is_read_or_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
         op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

void check_send_wr(Qp* qp, const ibv_send_wr* wr, Site site, const char* verb) {
  const void* h = qp->qp();
  const std::string call = call_text(verb, h, "QP", wr->wr_id);
  char what[500];
  const int st = qp->state.load();
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) {
    snprintf(what, sizeof(what),
             "  the QP (qpn %u) is in %s: its send queue takes work requests from RTS on, so "
             "the call fails with %s\n  move it to RTS with ibv_modify_qp first",
             qp->qpn(), state_name(st), fails_with(verb));
    report("post-send-state", h, call, site, what,
           "the IBA's QP states: a QP in Reset, Init or RTR does not take send work requests; "
           "ibv_modify_qp(3) lists the attributes of Reset -> Init -> RTR -> RTS");
    return;
  }
  if (wr->opcode == IBV_WR_LOCAL_INV || wr->opcode == IBV_WR_BIND_MW) return;
  if (wr->num_sge > 0 && static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge) {
    snprintf(what, sizeof(what),
             "  num_sge %d is more than the QP's max_send_sge %u: the call fails with %s",
             wr->num_sge, qp->cap.max_send_sge, fails_with(verb));
    report("max-send-sge", h, call, site, what,
           "ibv_create_qp(3): max_send_sge is the \"Requested max number of scatter/gather "
           "(s/g) elements in a WR in the SQ\"");
    return;
  }
  uint64_t total = 0;
  for (int i = 0; wr->sg_list && i < wr->num_sge; ++i) total += wr->sg_list[i].length;
  const bool is_inline = (wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ;
  if (is_inline && total > qp->cap.max_inline_data) {
    snprintf(what, sizeof(what),
             "  IBV_SEND_INLINE with %llu bytes, more than the QP's max_inline_data %u: the "
             "call fails with %s",
             static_cast<unsigned long long>(total), qp->cap.max_inline_data, fails_with(verb));
    report("max-inline-data", h, call, site, what,
           "ibv_create_qp(3): max_inline_data is the \"Requested max number of data (bytes) "
           "that can be posted inline to the SQ\"");
    return;
  }
  // A QP that does not signal every WR frees a WR's slot on a NIC only when a later
  // signaled WR completes: one that never signals fills its send queue.
  if (!qp->sq_sig_all) {
    uint64_t run = 0;
    {
      std::lock_guard<std::mutex> lock(state().mu);
      auto it = state().objects.find(h);
      if (it != state().objects.end()) {
        ObjState& o = it->second;
        o.unsignaled_run = (wr->send_flags & IBV_SEND_SIGNALED) ? 0 : o.unsignaled_run + 1;
        run = o.unsignaled_run;
      }
    }
    if (run > qp->cap.max_send_wr) {
      snprintf(what, sizeof(what),
               "  %llu work requests in a row were posted without IBV_SEND_SIGNALED on a QP "
               "with sq_sig_all = 0 and max_send_wr %u: their send queue slots are freed only "
               "when a later signaled WR completes, so on a NIC the queue is full now "
               "(ENOMEM)\n  signal at least one WR in every max_send_wr",
               static_cast<unsigned long long>(run), qp->cap.max_send_wr);
      report("never-signaled", h, call, site, what,
             "ibv_post_send(3): IBV_SEND_SIGNALED \"Set the completion notification "
             "indicator. Relevant only if QP was created with sq_sig_all=0\"; an unsignaled "
             "WR's send queue slot is released only by a later signaled completion");
    }
  }
  const bool read_atomic = is_read_or_atomic(wr->opcode);
  if (!is_inline)
    check_sges(call, h, site, qp->pd, wr->sg_list, wr->num_sge,
               read_atomic ? IBV_ACCESS_LOCAL_WRITE : 0);
  const bool atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (atomic && (wr->wr.atomic.remote_addr & 7)) {
    snprintf(what, sizeof(what),
             "  remote_addr 0x%llx is not 8-byte aligned: an atomic works on an aligned 64-bit "
             "word; a NIC completes it with IBV_WC_REM_INV_REQ_ERR",
             static_cast<unsigned long long>(wr->wr.atomic.remote_addr));
    report("atomic-unaligned", h, call, site, what,
           "the IBA's atomic operations work on a naturally aligned 64-bit word: the "
           "virtual address must be a multiple of 8");
  }
  if (qp->type == IBV_QPT_UD && verb == std::string("ibv_post_send"))
    check_ud_ah(qp, wr->wr.ud.ah, call, site);
  if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC) return;
  uint8_t max_rd_atomic;
  {
    std::lock_guard<std::mutex> lock(qp->attr_mu);
    max_rd_atomic = qp->attr.max_rd_atomic;
  }
  wire::Route route;
  {
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    route = qp->send_path.route;
  }
  if (read_atomic && qp->type == IBV_QPT_RC && max_rd_atomic == 0) {
    snprintf(what, sizeof(what),
             "  an RDMA READ or atomic on a QP whose max_rd_atomic is 0 (IBV_QP_MAX_QP_RD_ATOMIC "
             "not given when it moved to RTS): it may have none of them outstanding, so a NIC "
             "never starts it");
    report("max-rd-atomic-zero", h, call, site, what,
           "ibv_modify_qp(3): max_rd_atomic is the \"Number of outstanding RDMA reads & atomic "
           "operations on the destination QP\"");
  }
  // The rkey: a peer in this process has its keys in our table; one in another process of
  // this host publishes its table (check_peer_rkey).
  if (route != wire::Route::Loop && route != wire::Route::Shm) return;
  unsigned need = 0;
  uint64_t raddr = wr->wr.rdma.remote_addr, rlen = total;
  uint32_t rkey = wr->wr.rdma.rkey;
  switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: need = IBV_ACCESS_REMOTE_WRITE; break;
    case IBV_WR_RDMA_READ: need = IBV_ACCESS_REMOTE_READ; break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      need = IBV_ACCESS_REMOTE_ATOMIC;
      raddr = wr->wr.atomic.remote_addr;
      rkey = wr->wr.atomic.rkey;
      rlen = 8;
      break;
    default: return;
  }
  if (!rlen) return;
  if (route == wire::Route::Loop)
    check_key(call, h, site, false, 0, nullptr, rkey, raddr, rlen, need);
  else
    check_peer_rkey(qp, call, h, site, rkey, raddr, rlen, need, read_atomic, max_rd_atomic);
}

void check_recv_wr(const char* verb, const void* h, uint32_t max_sge, Pd* pd,
                   const ibv_recv_wr* wr, Site site) {
  const bool srq = std::string(verb) == "ibv_post_srq_recv";
  const std::string call = call_text(verb, h, srq ? "SRQ" : "QP", wr->wr_id);
  if (wr->num_sge > 0 && static_cast<uint32_t>(wr->num_sge) > max_sge) {
    char what[200];
    snprintf(what, sizeof(what),
             "  num_sge %d is more than the queue's max_recv_sge/max_sge %u: the call fails "
             "with EINVAL", wr->num_sge, max_sge);
    report("max-recv-sge", h, call, site, what,
           "ibv_create_qp(3)/ibv_create_srq(3): the receive queue's max scatter/gather "
           "elements per WR, which ibv_post_recv may not exceed");
    return;
  }
  check_sges(call, h, site, pd, wr->sg_list, wr->num_sge, IBV_ACCESS_LOCAL_WRITE);
}

}  // namespace

int checked_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad, Site site) {
  count_call();
  Qp* qp = Qp::from(ibqp);
  if (qp)
    for (ibv_send_wr* w = wr; w; w = w->next) check_send_wr(qp, w, site, "ibv_post_send");
  int rc = real.post_send(ibqp, wr, bad);
  if (rc == ENOMEM && qp) {
    char what[300];
    snprintf(what, sizeof(what),
             "  the send queue holds max_send_wr = %u work requests not yet completed: "
             "ibv_post_send fails with ENOMEM until their completions are polled",
             qp->cap.max_send_wr);
    report("send-queue-full", ibqp, call_text("ibv_post_send", ibqp, "QP", bad && *bad ? (*bad)->wr_id : 0),
           site, what,
           "ibv_create_qp(3): max_send_wr is the \"Requested max number of outstanding WRs in "
           "the SQ\"");
  }
  return rc;
}

int checked_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad, Site site) {
  count_call();
  Qp* qp = Qp::from(ibqp);
  if (qp && !qp->srq) {
    for (ibv_recv_wr* w = wr; w; w = w->next) {
      if (qp->state.load() == IBV_QPS_RESET) {
        report("post-recv-state", ibqp, call_text("ibv_post_recv", ibqp, "QP", w->wr_id), site,
               "  the QP is in RESET: its receive queue takes work requests from INIT on, so "
               "the call fails with EINVAL",
               "the IBA's QP states: a QP in Reset takes no work requests; ibv_modify_qp(3) "
               "moves it to Init");
        break;
      }
      check_recv_wr("ibv_post_recv", ibqp, qp->cap.max_recv_sge, qp->pd, w, site);
    }
  }
  int rc = real.post_recv(ibqp, wr, bad);
  if (rc == ENOMEM && qp) {
    char what[300];
    snprintf(what, sizeof(what),
             "  the receive queue holds max_recv_wr = %u receives not yet completed: "
             "ibv_post_recv fails with ENOMEM", qp->cap.max_recv_wr);
    report("recv-queue-full", ibqp, call_text("ibv_post_recv", ibqp, "QP", bad && *bad ? (*bad)->wr_id : 0),
           site, what,
           "ibv_create_qp(3): max_recv_wr is the \"Requested max number of outstanding WRs in "
           "the RQ\"");
  }
  return rc;
}

int checked_post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad, Site site) {
  count_call();
  if (Srq* srq = Srq::from(ibsrq))
    for (ibv_recv_wr* w = wr; w; w = w->next)
      check_recv_wr("ibv_post_srq_recv", ibsrq, srq->max_sge, srq->pd, w, site);
  return real.post_srq_recv(ibsrq, wr, bad);
}

// The extended post-send API (ibv_wr_post(3)): the batch ibv_wr_start .. ibv_wr_complete
// built is what ibv_post_send would have been given (verbs/qp_ex.cpp keeps each WR as an
// ibv_send_wr), so the same checks look at it before it is posted, and a full send queue
// is explained after.
int checked_wr_complete(ibv_qp_ex* q, Site site) {
  count_call();
  Qp* qp = Qp::from(&q->qp_base);
  size_t count = 0;
  if (qp && qp->ex.open) {
    count = qp->ex.count;
    for (size_t i = 0; i < count; ++i) check_send_wr(qp, &qp->ex.slots[i].wr, site, "ibv_wr_complete");
  }
  const uint64_t first_id = count ? qp->ex.slots[0].wr.wr_id : 0;
  int rc = real.wr_complete(q);
  if (rc == ENOMEM && qp) {
    char what[300];
    snprintf(what, sizeof(what),
             "  the batch of %zu work request(s) does not fit: the send queue holds up to "
             "max_send_wr = %u not yet completed, so ibv_wr_complete fails with ENOMEM and "
             "posts none of them until completions are polled",
             count, qp->cap.max_send_wr);
    report("send-queue-full", qp->qp(), call_text("ibv_wr_complete", qp->qp(), "QP", first_id), site,
           what,
           "ibv_create_qp(3): max_send_wr is the \"Requested max number of outstanding WRs in "
           "the SQ\"; ibv_wr_post(3): ibv_wr_complete posts all the WRs or none");
  }
  return rc;
}

// The wr_set_* calls that refuse a gather list or inline data at once (the WR then holds
// neither, and ibv_wr_complete fails the batch): said here, where the mistake is.
void check_wr_set_sges(ibv_qp_ex* q, size_t n, Site site) {
  Qp* qp = Qp::from(&q->qp_base);
  if (!qp || n <= qp->cap.max_send_sge) return;
  char what[300];
  snprintf(what, sizeof(what),
           "  %zu SGEs is more than the QP's max_send_sge %u: the WR is refused and "
           "ibv_wr_complete fails the whole batch with EINVAL",
           n, qp->cap.max_send_sge);
  report("max-send-sge", qp->qp(), call_text("ibv_wr_set_sge_list", qp->qp(), "QP", q->wr_id),
         site, what,
         "ibv_create_qp(3): max_send_sge is the \"Requested max number of scatter/gather "
         "(s/g) elements in a WR in the SQ\"");
}

void check_wr_set_inline(ibv_qp_ex* q, uint64_t bytes, Site site) {
  Qp* qp = Qp::from(&q->qp_base);
  if (!qp || bytes <= qp->cap.max_inline_data) return;
  char what[300];
  snprintf(what, sizeof(what),
           "  %llu bytes of inline data, more than the QP's max_inline_data %u: the WR is "
           "refused and ibv_wr_complete fails the whole batch with EINVAL",
           static_cast<unsigned long long>(bytes), qp->cap.max_inline_data);
  report("max-inline-data", qp->qp(), call_text("ibv_wr_set_inline_data", qp->qp(), "QP", q->wr_id),
         site, what,
         "ibv_create_qp(3): max_inline_data is the \"Requested max number of data (bytes) "
         "that can be posted inline to the SQ\"");
}

// An access mask by name ("0" for none), for reports.
std::string access_names(unsigned access) {
  std::string out;
  auto add = [&](unsigned bit, const char* name) {
    if (access & bit) out += (out.empty() ? "" : "|") + std::string(name);
  };
  add(IBV_ACCESS_LOCAL_WRITE, "IBV_ACCESS_LOCAL_WRITE");
  add(IBV_ACCESS_REMOTE_WRITE, "IBV_ACCESS_REMOTE_WRITE");
  add(IBV_ACCESS_REMOTE_READ, "IBV_ACCESS_REMOTE_READ");
  add(IBV_ACCESS_REMOTE_ATOMIC, "IBV_ACCESS_REMOTE_ATOMIC");
  return out.empty() ? "0" : out;
}

}  // namespace softverbs::check
