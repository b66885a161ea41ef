// Async events of the objects, and the list of open contexts they reach.
#include <mutex>
#include <set>

#include "wire/shm/agent.hpp"
#include "core/core.hpp"

namespace softverbs {

namespace {
// Never destroyed: background threads (agent, progress, watcher) may still walk the
// contexts while static destructors run at exit.
std::mutex& g_contexts_mu = *new std::mutex;
std::set<Context*>& g_contexts = *new std::set<Context*>;
// Contexts closed by the application but still running XRC TGT QPs for other processes'
// handles (verbs/xrc.cpp): their QPs are walked too, nothing else of them is.
std::set<Context*>& g_closed_hosting = *new std::set<Context*>;

void set_member(std::set<Context*>& set, Context* ctx, bool in) {
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  if (in) set.insert(ctx);
  else set.erase(ctx);
}
}  // namespace

void register_context(Context* ctx) { set_member(g_contexts, ctx, true); }
void unregister_context(Context* ctx) { set_member(g_contexts, ctx, false); }
void hold_closed_context(Context* ctx) { set_member(g_closed_hosting, ctx, true); }
void release_closed_context(Context* ctx) { set_member(g_closed_hosting, ctx, false); }

void for_each_context(const std::function<void(Context*)>& fn) {
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  for (Context* ctx : g_contexts) fn(ctx);
}

void raise_qp_event(Qp* qp, ibv_event_type type) {
  ibv_async_event ev{};
  ev.element.qp = qp->qp();
  ev.event_type = type;
  if (qp->type != IBV_QPT_XRC_RECV) {
    qp->ctx->post_async(ev);
    return;
  }
  // An XRC TGT QP's events go to every handle opened on it too (ibv_open_qp(3)), and to
  // its creator's while that handle is not destroyed. One handed over lives elsewhere.
  if (qp->xrc_moved.load()) return;
  {
    std::lock_guard<std::mutex> lock(qp->xrc_mu);
    if (!qp->xrc_creator_gone) qp->ctx->post_async(ev);
    for (Qp* h : qp->xrc_openers) {
      ev.element.qp = h->qp();
      h->ctx->post_async(ev);
    }
    // One message per opening process: its agent gives the event to each of its handles.
    std::set<int> told;
    for (const auto& [pid, slot] : qp->xrc_remote_openers)
      if (told.insert(slot).second) wire::agent_xrc_event(slot, qp->qpn(), type);
  }
}

void raise_cq_event(Cq* cq, ibv_event_type type) {
  ibv_async_event ev{};
  ev.element.cq = cq->cq();
  ev.event_type = type;
  cq->ctx->post_async(ev);
}

void raise_srq_event(Srq* srq, ibv_event_type type) {
  ibv_async_event ev{};
  ev.element.srq = &srq->ibv;
  ev.event_type = type;
  srq->ctx->post_async(ev);
}

void raise_port_event(ibv_event_type type) {
  ibv_async_event ev{};
  ev.element.port_num = 1;
  ev.event_type = type;
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  for (Context* ctx : g_contexts) ctx->post_async(ev);
}

void for_each_qp(const std::function<void(Qp*)>& fn) {
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  for (const std::set<Context*>* contexts : {&g_contexts, &g_closed_hosting})
    for (Context* ctx : *contexts) {
      std::lock_guard<std::mutex> objects(ctx->objects_mu);
      for (Qp* qp : ctx->qps) fn(qp);
    }
}

void for_each_cq(const std::function<void(Cq*)>& fn) {
  std::lock_guard<std::mutex> lock(g_contexts_mu);
  for (Context* ctx : g_contexts) {
    std::lock_guard<std::mutex> objects(ctx->objects_mu);
    for (Cq* cq : ctx->cqs) fn(cq);
  }
}

}  // namespace softverbs
