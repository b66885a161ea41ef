// The checks of completion events and CQs: a destroy that will wait for events never
// acked, a wait on a channel that no event can reach (nothing armed, or armed while
// completions were already waiting and not polled since: the lost wake-up), an overrun and
// what fed the CQ, RNR waits and the error completions they end in.
#include <fcntl.h>
#include <poll.h>

#include <cstdio>
#include <string>
#include <vector>

#include "check/state.hpp"
#include "core/check_hooks.hpp"

namespace softverbs::check {

namespace {

std::string fmt_ptr(const char* what, const void* p) {
  char buf[96];
  snprintf(buf, sizeof(buf), "%s %p", what, p);
  return buf;
}

ObjState* find_locked(const void* handle) {
  auto it = state().objects.find(handle);
  return it == state().objects.end() ? nullptr : &it->second;
}

// Why a blocking wait on `ch` cannot end by itself, or "" if it can. `kind` gets the
// report's kind and `object` what it is about; `ends_now` whether softverbs' early event
// (a lost wake-up by the man page) ends the wait at once.
std::string diagnose_wait(CompChannel* ch, const char** kind, const void** object,
                          bool* ends_now) {
  // Readable: an event (or a peer's wake-up) is there already; but the early event of a
  // CQ armed over unpolled completions is ours (and mlx4/mlx5's), not the man page's.
  pollfd p{ch->ibv.fd, POLLIN, 0};
  const bool readable = poll(&p, 1, 0) != 0;
  std::vector<Cq*> cqs;
  {
    std::lock_guard<std::mutex> lock(ch->cqs_mu);
    cqs = ch->cqs;
  }
  std::string lost, unarmed;
  bool any_armed = false;
  *ends_now = false;
  std::lock_guard<std::mutex> lock(state().mu);
  for (Cq* cq : cqs) {
    ObjState* o = find_locked(cq->cq());
    const bool armed = cq->armed.load() != 0;
    any_armed |= armed;
    const uint64_t head = cq->head.load(), tail = cq->tail.load();
    // Lost: some of what waited when it was armed is still there (ibv_poll_cq and the
    // poll API both move head past what they take).
    const uint64_t taken = o ? head - o->head_at_arm : 0;
    const bool early = cq->early_hint.load();
    if (armed && o && o->waiting_at_arm > taken && tail != head && lost.empty() &&
        (early || !readable)) {
      char buf[600];
      snprintf(buf, sizeof(buf),
               "  %s was armed by ibv_req_notify_cq at %s while %llu completion(s) were already "
               "waiting in it, and %llu of them are still there, not polled: %s\n"
               "  poll the CQ until it is empty after ibv_req_notify_cq and before waiting",
               fmt_ptr("CQ", cq->cq()).c_str(), where(o->arm_site).c_str(),
               static_cast<unsigned long long>(o->waiting_at_arm),
               static_cast<unsigned long long>(o->waiting_at_arm - taken),
               early ? "softverbs ends this wait at once with an early event for them, as mlx4 "
                       "and mlx5 do, but by the man page they make no event: on rxe or siw "
                       "this wait ends only if another completion comes"
                     : "those completions make no event, so this wait ends only if another "
                       "completion comes");
      lost = buf;
      *ends_now = early;
      *object = cq->cq();
    }
    if (!armed) {
      unarmed += "\n    " + fmt_ptr("CQ", cq->cq());
      if (o && o->event_since_arm)
        unarmed += ": its event was got at " + where(o->event_site) + " and it was not re-armed since";
      else if (o && !o->arm_site)
        unarmed += ": never armed";
      else
        unarmed += ": not armed";
    }
  }
  if (!lost.empty()) {
    *kind = "lost-wakeup";
    return lost;
  }
  if (readable || any_armed) return "";
  *kind = "wait-unarmed";
  *object = ch;
  if (cqs.empty()) return "  no CQ uses this channel: no completion event can come";
  return "  none of the channel's CQs is armed (ibv_req_notify_cq), so no completion event can "
         "come:" + unarmed;
}

// An overrun, and the QPs that complete into the CQ with how much work they can have.
void on_cq_overrun(Cq* cq) {
  char head[300];
  snprintf(head, sizeof(head),
           "  the CQ holds %d completions and all of them were waiting, unpolled, when one more "
           "came: the CQ is in error (IBV_EVENT_CQ_ERR) and its QPs go to the error state",
           cq->cq()->cqe);
  std::string what = head;
  std::unique_lock<std::mutex> objects(cq->ctx->objects_mu, std::try_to_lock);
  if (objects.owns_lock()) {
    uint64_t sum = 0;
    std::string list;
    int qps = 0;
    for (Qp* q : cq->ctx->qps) {
      uint64_t send = q->send_cq == cq ? q->cap.max_send_wr : 0;
      uint64_t recv = q->recv_cq == cq ? (q->srq ? q->srq->max_wr : q->cap.max_recv_wr) : 0;
      if (!send && !recv) continue;
      ++qps;
      sum += send + recv;
      char line[200];
      snprintf(line, sizeof(line), "\n    QP %p (qpn %u): send queue %llu + receive queue %llu",
               static_cast<void*>(q->qp()), q->qpn(), static_cast<unsigned long long>(send),
               static_cast<unsigned long long>(recv));
      list += line;
    }
    objects.unlock();
    char sums[200];
    snprintf(sums, sizeof(sums),
             "\n  %d QP(s) complete into it, whose queues hold up to %llu work requests%s",
             qps, static_cast<unsigned long long>(sum),
             sum > static_cast<uint64_t>(cq->cq()->cqe) ? " (more than the CQ's depth):" : ":");
    what += sums + list;
  }
  what += "\n  make the CQ as deep as the work its QPs can have outstanding, or poll it sooner";
  report("cq-overrun", cq->cq(), fmt_ptr("completion into CQ", cq->cq()), nullptr, what,
         "ibv_poll_cq(3): \"The user should consume work completions at a rate that prevents "
         "CQ overrun from occurrence. In case of a CQ overrun, the async event IBV_EVENT_CQ_ERR "
         "will be triggered, and the CQ cannot be used.\"");
}

void on_rnr_wait(Qp* qp) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (ObjState* o = find_locked(qp->qp())) ++o->rnr_waits;
}

}  // namespace

void install_engine_hooks() {
  check_hooks::cq_overrun = &on_cq_overrun;
  check_hooks::rnr_wait = &on_rnr_wait;
}

void before_destroy_cq(Cq* cq, Site site) {
  count_call();
  if (cq->users.load() != 0) return;  // EBUSY, explained then
  ibv_cq* c = cq->cq();
  pthread_mutex_lock(&c->mutex);
  const uint32_t got = cq->comp_events_reported, acked = c->comp_events_completed;
  const uint32_t async_got = cq->async_events_reported, async_acked = c->async_events_completed;
  pthread_mutex_unlock(&c->mutex);
  if (got == acked && async_got == async_acked) return;
  Site event_site = nullptr;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (ObjState* o = find_locked(c)) event_site = o->event_site;
  }
  std::string what;
  char buf[300];
  if (got != acked) {
    snprintf(buf, sizeof(buf),
             "  will wait for ever: %u completion event(s) got by ibv_get_cq_event (the last at "
             "%s) and %u acked by ibv_ack_cq_events",
             got, where(event_site).c_str(), acked);
    what = buf;
  } else {
    snprintf(buf, sizeof(buf),
             "  will wait for ever: %u async event(s) of this CQ got by ibv_get_async_event and "
             "%u acked by ibv_ack_async_event",
             async_got, async_acked);
    what = buf;
  }
  report("unacked-events", c, fmt_ptr("ibv_destroy_cq: CQ", c), site, what,
         "ibv_get_cq_event(3): \"All completion events that ibv_get_cq_event() returns must be "
         "acknowledged using ibv_ack_cq_events(). To avoid races, destroying a CQ will wait for "
         "all completion events to be acknowledged\"");
}

void before_get_cq_event(CompChannel* ch, Site site) {
  count_call();
  int flags = fcntl(ch->ibv.fd, F_GETFL);
  if (flags < 0 || (flags & O_NONBLOCK)) return;  // it answers EAGAIN, it does not hang
  const char* kind = nullptr;
  const void* object = nullptr;
  bool ends_now = false;
  std::string what = diagnose_wait(ch, &kind, &object, &ends_now);
  if (what.empty()) return;
  // An early event is queued: the wait ends now, with it; report at once.
  if (!ends_now) {
    // Another thread may still arm or poll: look again after a second without an event.
    pollfd p{ch->ibv.fd, POLLIN, 0};
    if (poll(&p, 1, 1000) != 0) return;
    what = diagnose_wait(ch, &kind, &object, &ends_now);
    if (what.empty()) return;
  }
  const bool lost = std::string(kind) == "lost-wakeup";
  report(kind, object, fmt_ptr("ibv_get_cq_event: channel", &ch->ibv),
         site, what,
         lost ? "ibv_req_notify_cq(3): \"Upon the addition of a new CQ entry (CQE) to cq, a "
                "completion event will be added to the completion channel associated with the "
                "CQ.\" Only a new one: what was there when it was armed makes no event"
              : "ibv_req_notify_cq(3) arms a CQ for one event; ibv_get_cq_event(3)'s example "
                "re-arms it after each (\"Request notification upon the next completion event\")");
}

void got_cq_event(ibv_cq* cq, Site site) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (ObjState* o = find_locked(cq)) {
    o->event_since_arm = true;
    o->event_site = site;
  }
}

void before_req_notify(Cq* cq, Site site) {
  count_call();
  const uint64_t head = cq->head.load(), tail = cq->tail.load();
  std::lock_guard<std::mutex> lock(state().mu);
  if (ObjState* o = find_locked(cq->cq())) {
    o->arm_site = site;
    o->waiting_at_arm = tail - head;
    o->head_at_arm = head;
    o->event_since_arm = false;
  }
}

void explain_completions(const ibv_wc* wc, int n, Site site, const char* verb) {
  for (int i = 0; i < n; ++i) {
    const ibv_wc& w = wc[i];
    if (w.status == IBV_WC_SUCCESS || w.status == IBV_WC_WR_FLUSH_ERR) continue;
    // The QP, if it is one the application made in this process.
    const void* qp_handle = nullptr;
    uint64_t rnr_waits = 0;
    {
      std::lock_guard<std::mutex> lock(state().mu);
      for (auto& [h, o] : state().objects)
        if (o.kind == Kind::Qp && o.qpn == w.qp_num) {
          qp_handle = h;
          rnr_waits = o.rnr_waits;
          break;
        }
    }
    char call[140];
    snprintf(call, sizeof(call), "%s: QP %p (qpn %u) wr_id %llu", verb, qp_handle, w.qp_num,
             static_cast<unsigned long long>(w.wr_id));
    char what[600];
    switch (w.status) {
      case IBV_WC_RNR_RETRY_EXC_ERR: {
        int rnr_retry = -1;
        if (Qp* q = Qp::from(static_cast<ibv_qp*>(const_cast<void*>(qp_handle)))) {
          std::lock_guard<std::mutex> lock(q->attr_mu);
          rnr_retry = q->attr.rnr_retry;
        }
        snprintf(what, sizeof(what),
                 "  IBV_WC_RNR_RETRY_EXC_ERR: the peer QP had no receive posted when the message "
                 "came (RNR NAK) more often than rnr_retry = %d allows; this QP waited %llu "
                 "time(s) for receives so far\n"
                 "  post the peer's receives before the sends that need them can arrive, or "
                 "raise rnr_retry (7: retry for ever)",
                 rnr_retry, static_cast<unsigned long long>(rnr_waits));
        report("rnr-retry-exceeded", qp_handle, call, site, what,
               "a responder with no receive posted answers RNR NAK; the requester retries "
               "rnr_retry times (ibv_modify_qp(3), IBV_QP_RNR_RETRY), then completes the WR with "
               "IBV_WC_RNR_RETRY_EXC_ERR");
        break;
      }
      case IBV_WC_REM_ACCESS_ERR:
        report("remote-access", qp_handle, call, site,
               "  IBV_WC_REM_ACCESS_ERR: the peer refused the access: its rkey named no MR or "
               "window of the peer QP's PD, or one without the access asked for "
               "(IBV_ACCESS_REMOTE_WRITE, _READ, _ATOMIC), or [remote_addr, +length) is not "
               "inside it",
               "ibv_reg_mr(3): the access flags say what a peer may do through the rkey; the "
               "key, its PD and the range are checked too");
        break;
      case IBV_WC_REM_INV_REQ_ERR:
        report("remote-invalid-request", qp_handle, call, site,
               "  IBV_WC_REM_INV_REQ_ERR: the peer found the request invalid: a message longer "
               "than its receive buffer, an atomic on an address not 8-byte aligned, an "
               "opcode its QP does not allow, or a READ/atomic when its max_dest_rd_atomic is 0",
               "the responder answers an invalid request NAK");
        break;
      default:
        break;
    }
  }
}

}  // namespace softverbs::check
