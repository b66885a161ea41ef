// Object lifetimes as the checker sees them: made where, on what, still there; a destroy
// that answered EBUSY explained by what still uses the object; the keys of deregistered MRs.
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "check/state.hpp"
#include "engine/engine.hpp"

namespace softverbs::check {

namespace {

std::string line(const void* handle, Kind kind, const std::string& extra = "") {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().objects.find(handle);
  char buf[64];
  snprintf(buf, sizeof(buf), "%p", handle);
  std::string out = std::string("    ") + kind_name(kind) + " " + buf + extra;
  if (it != state().objects.end()) out += " made at " + where(it->second.site);
  return out + "\n";
}

std::string qp_extra(const Qp* qp) { return " (qpn " + std::to_string(qp->qpn()) + ")"; }

// The QPs of `ctx` for which `uses` is true, one line each.
template <typename F>
std::string qps_using(Context* ctx, F uses, size_t* count) {
  std::vector<Qp*> found;
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    for (Qp* q : ctx->qps)
      if (uses(q)) found.push_back(q);
  }
  std::string out;
  for (Qp* q : found) out += line(q->qp(), Kind::Qp, qp_extra(q));
  *count += found.size();
  return out;
}

void busy_report(const char* call, const void* handle, Site site, size_t users,
                 const std::string& list, const char* rule) {
  char head[160];
  snprintf(head, sizeof(head), "%s(%p)", call, handle);
  std::string what = "  failed with EBUSY: still in use by " + std::to_string(users) +
                     (users == 1 ? " object" : " objects") + ":\n" + list;
  what.pop_back();
  report("destroy-busy", handle, head, site, what, rule);
}

}  // namespace

void created(Kind kind, const void* handle, const void* parent, Site site) {
  if (!handle) return;
  count_call();
  ObjState o;
  o.kind = kind;
  o.parent = parent;
  o.site = site;
  Dl_info info{};
  if (site && dladdr(const_cast<void*>(site), &info) && info.dli_fname)
    o.internal = std::strstr(info.dli_fname, "librdmacm") != nullptr;
  if (kind == Kind::Mr) {
    auto* mr = static_cast<const ibv_mr*>(handle);
    o.lkey = mr->lkey;
    o.rkey = mr->rkey;
    o.addr = reinterpret_cast<uintptr_t>(mr->addr);
    o.length = mr->length;
  }
  if (kind == Kind::Qp) o.qpn = static_cast<const ibv_qp*>(handle)->qp_num;
  std::lock_guard<std::mutex> lock(state().mu);
  if (kind == Kind::Mr) {
    state().dead_keys.erase(o.lkey);
    state().dead_keys.erase(o.rkey);
  }
  if (kind == Kind::Ah) state().dead_ahs.erase(handle);
  o.seq = ++state().made;
  state().objects[handle] = o;
}

void after_destroy(Kind kind, const void* handle, int rc, Site site) {
  if (rc == EBUSY) busy(kind, handle, site);
  std::lock_guard<std::mutex> lock(state().mu);
  if (rc == 0) {
    if (kind == Kind::Ah) {  // kept to name it if a WR uses it again
      auto it = state().objects.find(handle);
      state().dead_ahs[handle] = {it != state().objects.end() ? it->second.site : nullptr, site};
    }
    state().objects.erase(handle);
  } else if (kind == Kind::Mr) {  // it lives on: its keys are not dead
    auto* mr = static_cast<const ibv_mr*>(handle);
    state().dead_keys.erase(mr->lkey);
    state().dead_keys.erase(mr->rkey);
  }
}

void before_dereg_mr(Mr* mr, Site site) {
  count_call();
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().objects.find(&mr->ibv);
  DeadKey d;
  d.addr = reinterpret_cast<uintptr_t>(mr->ibv.addr);
  d.length = mr->ibv.length;
  d.reg_site = it != state().objects.end() ? it->second.site : nullptr;
  d.dereg_site = site;
  // Kept only if the deregistration succeeds: the caller erases them otherwise (rare).
  state().dead_keys[mr->ibv.lkey] = d;
  state().dead_keys[mr->ibv.rkey] = d;
}

void busy(Kind kind, const void* handle, Site site) {
  size_t n = 0;
  std::string list;
  switch (kind) {
    case Kind::Cq: {
      Cq* cq = Cq::from(static_cast<ibv_cq*>(const_cast<void*>(handle)));
      if (!cq) return;
      list = qps_using(cq->ctx, [cq](Qp* q) { return q->send_cq == cq || q->recv_cq == cq; }, &n);
      busy_report("ibv_destroy_cq", handle, site, n, list,
                  "ibv_destroy_cq(3): \"ibv_destroy_cq() fails if any queue pair is still "
                  "associated with this CQ.\" Destroy the QPs first.");
      return;
    }
    case Kind::Channel: {
      CompChannel* ch = CompChannel::from(static_cast<ibv_comp_channel*>(const_cast<void*>(handle)));
      if (!ch) return;
      std::vector<Cq*> cqs;
      {
        std::lock_guard<std::mutex> lock(ch->cqs_mu);
        cqs = ch->cqs;
      }
      for (Cq* c : cqs) list += line(c->cq(), Kind::Cq);
      busy_report("ibv_destroy_comp_channel", handle, site, cqs.size(), list,
                  "ibv_destroy_comp_channel(3): \"ibv_destroy_comp_channel() fails if any CQs "
                  "are still associated with the completion event channel being destroyed.\"");
      return;
    }
    case Kind::Srq: {
      Srq* srq = Srq::from(static_cast<ibv_srq*>(const_cast<void*>(handle)));
      if (!srq) return;
      list = qps_using(srq->ctx, [srq](Qp* q) { return q->srq == srq; }, &n);
      busy_report("ibv_destroy_srq", handle, site, n, list,
                  "ibv_destroy_srq(3): \"ibv_destroy_srq() fails if any queue pair is still "
                  "associated with this SRQ.\"");
      return;
    }
    case Kind::Pd: {
      std::vector<std::pair<const void*, Kind>> users;
      {
        std::lock_guard<std::mutex> lock(state().mu);
        for (auto& [h, o] : state().objects)
          if (o.parent == handle && o.kind != Kind::Pd) users.emplace_back(h, o.kind);
      }
      std::vector<std::string> lines;
      for (auto& [h, k] : users) lines.push_back(line(h, k));
      std::sort(lines.begin(), lines.end());  // the same order every run
      for (auto& l : lines) list += l;
      busy_report("ibv_dealloc_pd", handle, site, users.size(), list,
                  "ibv_dealloc_pd(3): \"ibv_dealloc_pd() may fail if any other resource is "
                  "still associated with the PD being freed.\"");
      return;
    }
    case Kind::Mr: {
      Mr* mr = Mr::from(static_cast<ibv_mr*>(const_cast<void*>(handle)));
      if (!mr) return;
      int bound = mr->bound_windows.load();
      busy_report("ibv_dereg_mr", handle, site, static_cast<size_t>(bound),
                  "    " + std::to_string(bound) + " memory window(s) bound to it\n",
                  "ibv_dereg_mr(3): \"ibv_dereg_mr() fails if any memory window is still bound "
                  "to this MR.\"");
      return;
    }
    case Kind::Qp: {
      Qp* qp = Qp::from(static_cast<ibv_qp*>(const_cast<void*>(handle)));
      if (!qp) return;
      size_t groups;
      {
        std::lock_guard<std::mutex> lock(qp->attr_mu);
        groups = qp->mcast_groups.size();
      }
      // A raw packet QP: its steering rules hold it instead (docs/raw-packet.md).
      if (qp->type == IBV_QPT_RAW_PACKET && engine::raw_qp_has_flows(qp)) {
        busy_report("ibv_destroy_qp", handle, site, 1, "    its steering rule(s) (ibv_create_flow)\n",
                    "the kernel counts a QP's flows as its users: ibv_destroy_qp of a raw packet "
                    "QP with rules fails with EBUSY. Call ibv_destroy_flow first.");
        return;
      }
      busy_report("ibv_destroy_qp", handle, site, groups,
                  "    " + std::to_string(groups) + " multicast group(s) attached\n",
                  "ibv_destroy_qp(3): \"ibv_destroy_qp() fails if the QP is attached to a "
                  "multicast group.\" Call ibv_detach_mcast first.");
      return;
    }
    default:
      return;
  }
}

}  // namespace softverbs::check
