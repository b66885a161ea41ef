// Memory windows: ibv_alloc_mw(3), ibv_dealloc_mw, ibv_bind_mw(3) (type 1), and the bind
// work request of ibv_post_send(3) (type 2). A bind is a send-queue WQE like any other
// (IBV_WR_BIND_MW); it runs, in order, where the QP's requester runs (engine/local_ops.cpp)
// and the key table checks and applies it (core/mw_table.cpp).
#include <cerrno>
#include <mutex>

#include "core/device.hpp"
#include "verbs/stat_publish.hpp"
#include "verbs/verbs.hpp"

namespace softverbs {

ibv_mw* alloc_mw(Pd* pd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  if (!count_object(Counted::Mw)) {  // device_limits().max_mw
    errno = ENOMEM;
    return nullptr;
  }
  auto* mw = new (std::nothrow) Mw{};
  if (!mw) {
    uncount_object(Counted::Mw);
    errno = ENOMEM;
    return nullptr;
  }
  mw->pd = pd;
  mw->ibv.context = pd->ibv.context;
  mw->ibv.pd = &pd->ibv;
  mw->ibv.type = type;
  // A type 1 window is valid (unbound) from the start; a type 2 one is free until bound.
  uint32_t key = MrTable::instance().insert_window(mw);
  if (key == 0) {  // every key of this process is taken (MRs and windows share them)
    delete mw;
    uncount_object(Counted::Mw);
    errno = ENOMEM;
    return nullptr;
  }
  mw->rkey = key;
  mw->ibv.rkey = key;
  mw->ibv.handle = key;
  pd->users++;
  stat::publish(mw);
  return &mw->ibv;
}

int dealloc_mw(Mw* mw) {
  MrTable::instance().erase_window(mw);  // unbinds it; waits for in-flight look-ups
  stat::withdraw(mw);
  mw->pd->users--;
  mw->magic = kDead;
  delete mw;
  uncount_object(Counted::Mw);
  return 0;
}

int fill_bind_wqe(Qp* qp, ibv_mw* m, uint32_t rkey, const ibv_mw_bind_info& info, SendWqe* w) {
  Mw* mw = Mw::from(m);
  if (!mw || mw->pd->ctx != qp->ctx) return EINVAL;
  w->opcode = IBV_WR_BIND_MW;
  w->bind.mw = mw;
  w->bind.mw_index = mw->index;
  w->bind.rkey = rkey;
  w->bind.mr_lkey = info.mr ? info.mr->lkey : 0;
  w->bind.addr = info.addr;
  w->bind.length = info.length;
  w->bind.access = info.mw_access_flags;
  return 0;
}

int bind_mw(Qp* qp, Mw* mw, const ibv_mw_bind* bind) {
  // ibv_bind_mw(3): "The QP Transport Service Type must be either UC, RC or XRC_SEND".
  if (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC && qp->type != IBV_QPT_XRC_SEND)
    return EINVAL;
  if (mw->ibv.type != IBV_MW_TYPE_1) return EINVAL;
  SendWqe w;
  w.wr_id = bind->wr_id;
  w.flags = bind->send_flags;
  uint32_t next = ibv_inc_rkey(mw->ibv.rkey);
  if (int err = fill_bind_wqe(qp, &mw->ibv, next, bind->bind_info, &w)) return err;
  if (int err = post_wqe(qp, std::move(w))) return err;
  // Posted: the key the window will have (the application restores the old one if the
  // bind completes in error, ibv_bind_mw(3)).
  mw->ibv.rkey = next;
  return 0;
}

}  // namespace softverbs
