// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)). A parent
// domain is a PD (it is passed wherever an ibv_pd is) whose protection is that of the PD it
// extends; a QP or SRQ created on one takes its receive ring from the application's
// allocator when the parent domain has one.
#include <cerrno>
#include <memory>

#include "verbs/verbs.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

struct ParentDomain {
  Pd pd;  // first: the ibv_pd the application sees
  Td* td = nullptr;
  void* pd_context = nullptr;
  std::unique_ptr<QueueMemory> memory;  // with IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
};

Td* Td::from(ibv_td* t) {
  auto* td = reinterpret_cast<Td*>(t);
  return t && td->magic == kTdMagic ? td : nullptr;
}

ibv_td* alloc_td(Context* ctx, const ibv_td_init_attr* attr) {
  if (!attr || attr->comp_mask) {
    errno = EINVAL;
    return nullptr;
  }
  auto* td = new (std::nothrow) Td{};
  if (!td) {
    errno = ENOMEM;
    return nullptr;
  }
  td->ibv.context = ctx->ibv();
  td->ctx = ctx;
  stat::publish(td);
  return &td->ibv;
}

int dealloc_td(Td* td) {
  if (td->users.load() != 0) return EBUSY;  // a parent domain still uses it
  stat::withdraw(td);
  td->magic = kDead;
  delete td;
  return 0;
}

ibv_pd* alloc_parent_domain(Context* ctx, const ibv_parent_domain_init_attr* attr) {
  constexpr uint32_t kKnown =
      IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (!attr || (attr->comp_mask & ~kKnown)) {
    errno = EINVAL;
    return nullptr;
  }
  Pd* base = Pd::from(attr->pd);
  Td* td = attr->td ? Td::from(attr->td) : nullptr;
  const bool allocators = attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  // The PD must be a plain one of this context; a TD, if any, too.
  if (!base || base->parent || base->ctx != ctx || (attr->td && (!td || td->ctx != ctx)) ||
      (allocators && (!attr->alloc || !attr->free))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* p = new (std::nothrow) ParentDomain{};
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  p->pd.ibv.context = ctx->ibv();
  p->pd.ibv.handle = base->ibv.handle;
  p->pd.ctx = ctx;
  p->pd.prot = base->prot;  // an imported PD stands for its origin
  p->pd.parent = p;
  p->td = td;
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) p->pd_context = attr->pd_context;
  if (allocators) {
    p->memory = std::make_unique<QueueMemory>(&p->pd.ibv, p->pd_context, attr->alloc, attr->free);
  }
  base->users++;
  if (td) td->users++;
  stat::publish(&p->pd);
  return &p->pd.ibv;
}

void free_parent_domain(Pd* pd) {
  ParentDomain* p = pd->parent;
  pd->prot->users--;
  if (p->td) p->td->users--;
  stat::withdraw(pd);
  pd->magic = kDead;
  delete p;
}

QueueMemory* queue_memory_of(Pd* pd) { return pd->parent ? pd->parent->memory.get() : nullptr; }

bool queue_memory_for(Pd* pd, RingQueue<RecvWqe>* rq, uint64_t resource_type, size_t n) {
  QueueMemory* memory = queue_memory_of(pd);
  if (!memory) return true;
  try {
    rq->use_memory(memory, resource_type, n);
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return false;
  }
  return true;
}

}  // namespace softverbs
