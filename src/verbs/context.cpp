// Device contexts and the asynchronous event queue (ctx->async_fd).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <set>

#include "engine/engine.hpp"
#include "engine/roce.hpp"
#include "verbs/control.hpp"
#include "core/device.hpp"
#include "verbs/verbs.hpp"
#include "verbs/stat_publish.hpp"

namespace softverbs {

namespace {

// Which counter an async event's element acknowledges; null for port/device events.
// Returns the mutex/cond pair and the counter of the element's object.
struct AckTarget {
  pthread_mutex_t* mutex = nullptr;
  pthread_cond_t* cond = nullptr;
  uint32_t* completed = nullptr;
  uint32_t* reported = nullptr;
};

AckTarget ack_target(ibv_async_event* ev) {
  switch (event_element(ev->event_type)) {
    case EventElement::Cq: {
      Cq* cq = Cq::from(ev->element.cq);
      return {&cq->ibv.mutex, &cq->ibv.cond, &cq->ibv.async_events_completed,
              &cq->async_events_reported};
    }
    case EventElement::Qp: {
      Qp* qp = Qp::from(ev->element.qp);
      return {&qp->ibv.qp_base.mutex, &qp->ibv.qp_base.cond, &qp->ibv.qp_base.events_completed,
              &qp->events_reported};
    }
    case EventElement::Srq: {
      Srq* srq = Srq::from(ev->element.srq);
      return {&srq->ibv.mutex, &srq->ibv.cond, &srq->ibv.events_completed,
              &srq->events_reported};
    }
    default:
      return {};
  }
}

const void* element_pointer(const ibv_async_event& ev, EventElement kind) {
  switch (kind) {
    case EventElement::Cq:
      return ev.element.cq;
    case EventElement::Qp:
      return ev.element.qp;
    case EventElement::Srq:
      return ev.element.srq;
    default:
      return nullptr;
  }
}
}  // namespace

EventElement event_element(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_CQ_ERR:
      return EventElement::Cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return EventElement::Qp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return EventElement::Srq;
    default:
      return EventElement::Port;
  }
}

void drop_async_events_of(Context* ctx, EventElement kind, const void* element) {
  ctx->async_queue.remove_if([kind, element](const ibv_async_event& e) {
    return event_element(e.event_type) == kind && element_pointer(e, kind) == element;
  });
}

void wait_acked(pthread_mutex_t* mutex, pthread_cond_t* cond, const uint32_t* completed,
                const uint32_t* reported) {
  pthread_mutex_lock(mutex);
  while (*completed != *reported) pthread_cond_wait(cond, mutex);
  pthread_mutex_unlock(mutex);
}

Context* Context::from(ibv_context* c) {
  if (!c) return nullptr;
  auto* vctx = reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(c) -
                                                offsetof(verbs_context, context));
  auto* ctx = reinterpret_cast<Context*>(vctx);
  return ctx->magic == kCtxMagic ? ctx : nullptr;
}

ibv_context* open_context(ibv_device* dev, int import_fd) {
  if (!device_from_ibv(dev)) {
    errno = ENODEV;
    return nullptr;
  }
  auto* ctx = new (std::nothrow) Context{};
  if (!ctx) {
    errno = ENOMEM;
    return nullptr;
  }
  if (int err = ctx->async_queue.open()) {
    delete ctx;
    errno = err;
    return nullptr;
  }
  // cmd_fd stands for the uverbs device file; a memfd gives each context a unique inode
  // and holds the record (device, creator) by which ibv_import_device finds the context
  // again from a dup of it, here or in another process (verbs/import.cpp).
  if (import_fd >= 0) {
    ctx->cmd_fd = import_fd;
  } else {
    ctx->cmd_fd = memfd_create("softverbs-context", MFD_CLOEXEC);
    if (ctx->cmd_fd < 0 || !write_context_record(ctx->cmd_fd, dev->name)) {
      int err = errno;
      if (ctx->cmd_fd >= 0) ::close(ctx->cmd_fd);
      delete ctx;
      errno = err;
      return nullptr;
    }
  }
  ibv_context* ibv = ctx->ibv();
  ibv->device = dev;
  ibv->cmd_fd = ctx->cmd_fd;
  ibv->async_fd = ctx->async_queue.fd();
  ibv->num_comp_vectors = Device::instance().num_comp_vectors();
  pthread_mutex_init(&ibv->mutex, nullptr);
  ibv->abi_compat = reinterpret_cast<void*>(UINTPTR_MAX);  // marks a verbs_context
  ctx->vctx.sz = sizeof(verbs_context);
  register_context(ctx);
  control::start_watcher();
  engine::start();
  stat::publish(ctx);
  return ibv;
}

int close_context(Context* ctx) {
  sweep_unimported_pds();  // the objects on them are gone by now, if the program freed them
  unregister_context(ctx);
  ::close(ctx->cmd_fd);
  ctx->cmd_fd = -1;
  stat::withdraw(ctx);
  ctx->magic = kDead;
  // A TGT QP whose creator handle went runs here while other processes hold it (the
  // kernel's outlives the creator's file): the context stays, unseen but for its QPs
  // (for_each_qp: device fatal, dead peers), until the last such QP goes (verbs/xrc.cpp,
  // tgt_qp_destroyed). It joins that list before `closed` is set, last: from then on that
  // destroy may free it at any moment.
  hold_closed_context(ctx);
  bool hosting;
  {
    std::lock_guard<std::mutex> lock(ctx->objects_mu);
    ctx->closed = true;
    hosting = ctx->hosted_tgt_qps > 0;
  }
  if (!hosting) free_closed_context(ctx);
  return 0;
}

void free_closed_context(Context* ctx) {
  release_closed_context(ctx);
  free_tgt_resources(ctx);  // XRC TGT QPs' hidden PD and CQ (verbs/xrc.cpp); uses the mutex
  pthread_mutex_destroy(&ctx->ibv()->mutex);
  delete ctx;
}

int get_async_event(Context* ctx, ibv_async_event* ev) {
  engine::roce_flush_held();  // may sleep: no ACK waits for this thread
  return ctx->async_queue.wait_pop(ev, [](ibv_async_event& e) {
    AckTarget t = ack_target(&e);
    if (!t.mutex) return;
    pthread_mutex_lock(t.mutex);
    ++*t.reported;
    pthread_mutex_unlock(t.mutex);
  });
}

void ack_async_event(ibv_async_event* ev) {
  AckTarget t = ack_target(ev);
  if (!t.mutex) return;
  pthread_mutex_lock(t.mutex);
  ++*t.completed;
  pthread_cond_broadcast(t.cond);
  pthread_mutex_unlock(t.mutex);
}

void raise_device_fatal() {
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_DEVICE_FATAL;
  for_each_context([&](Context* ctx) { ctx->post_async(ev); });
  for_each_qp([](Qp* qp) { engine::set_error(qp, -1); });
}

}  // namespace softverbs
