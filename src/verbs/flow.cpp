// ibv_create_flow(3) / ibv_destroy_flow: steering rules that bring Ethernet frames to a raw
// packet QP's receive queue (engine/raw_packet.cpp, docs/raw-packet.md).
#include <cerrno>
#include <new>

#include "engine/engine.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

constexpr uint32_t kFlowMagic = 0x5356464c;  // "SVFL"

struct Flow {
  ibv_flow ibv;  // what the application holds
  uint32_t magic = kFlowMagic;
  uint64_t handle = 0;  // the rule in the steering table
};

}  // namespace

ibv_flow* create_flow(Qp* qp, ibv_flow_attr* attr) {
  // The kernel steers to UD QPs too (IPoIB); softverbs to raw packet QPs only.
  if (qp->type == IBV_QPT_UD) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (qp->type != IBV_QPT_RAW_PACKET || !attr || attr->comp_mask || attr->port != 1) {
    errno = EINVAL;
    return nullptr;
  }
  // The kernel's checks (ib_uverbs_ex_create_flow): known flags, DONT_TRAP not on the
  // catch-all rules, at most 10 specs (IB_FLOW_SPEC_SUPPORT_LAYERS).
  constexpr uint32_t kKnownFlags = IBV_FLOW_ATTR_FLAGS_DONT_TRAP | IBV_FLOW_ATTR_FLAGS_EGRESS;
  const bool catch_all = attr->type == IBV_FLOW_ATTR_ALL_DEFAULT || attr->type == IBV_FLOW_ATTR_MC_DEFAULT;
  if ((attr->flags & ~kKnownFlags) || attr->num_of_specs > 10 ||
      ((attr->flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP) && catch_all) ||
      (attr->type != IBV_FLOW_ATTR_NORMAL && !catch_all && attr->type != IBV_FLOW_ATTR_SNIFFER)) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->flags & IBV_FLOW_ATTR_FLAGS_EGRESS) {
    errno = EOPNOTSUPP;  // rules on what the QP sends
    return nullptr;
  }
  FlowRule rule;
  if (int err = parse_flow(attr, &rule)) {
    errno = err;
    return nullptr;
  }
  // The catch-all rules match on nothing: a spec there is a malformed request.
  if (attr->type != IBV_FLOW_ATTR_NORMAL && !rule.specs.empty()) {
    errno = EINVAL;
    return nullptr;
  }
  auto* flow = new (std::nothrow) Flow;
  if (!flow) {
    errno = ENOMEM;
    return nullptr;
  }
  if (int err = engine::attach_flow(qp, std::move(rule), &flow->handle)) {
    delete flow;
    errno = err;
    return nullptr;
  }
  flow->ibv.comp_mask = 0;
  flow->ibv.context = qp->qp()->context;
  flow->ibv.handle = static_cast<uint32_t>(flow->handle);
  return &flow->ibv;
}

int destroy_flow(ibv_flow* f) {
  auto* flow = reinterpret_cast<Flow*>(f);
  if (!f || flow->magic != kFlowMagic) return EINVAL;
  engine::detach_flow(flow->handle);
  flow->magic = kDead;
  delete flow;
  return 0;
}

}  // namespace softverbs
