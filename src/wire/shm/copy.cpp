// Payload movement: memcpy inside this process, cross-memory attach (process_vm_readv /
// process_vm_writev) into and out of another process's registered buffers.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "wire/registry.hpp"
#include "wire/transport.hpp"

namespace softverbs::wire {

namespace {

constexpr size_t kMaxSegments = 64;  // per side and syscall, well under IOV_MAX

// Moves `len` bytes between our scatter list and the requester's. The syscalls stream
// through both lists independently, so each window only needs equal byte totals.
bool cross_copy(const Request& req, const iovec* ours, int nours, uint64_t len, bool write) {
  int ai = 0, bi = 0;
  size_t aoff = 0, boff = 0;
  iovec a[kMaxSegments], b[kMaxSegments];
  while (len > 0) {
    size_t na = 0, nb = 0, window = 0;
    while (len - window > 0 && ai < nours && bi < req.nlocal && na < kMaxSegments &&
           nb < kMaxSegments) {
      size_t k = std::min<uint64_t>(
          {len - window, ours[ai].iov_len - aoff, req.local[bi].iov_len - boff});
      if (na && static_cast<char*>(a[na - 1].iov_base) + a[na - 1].iov_len ==
                    static_cast<char*>(ours[ai].iov_base) + aoff)
        a[na - 1].iov_len += k;
      else
        a[na++] = {static_cast<char*>(ours[ai].iov_base) + aoff, k};
      if (nb && static_cast<char*>(b[nb - 1].iov_base) + b[nb - 1].iov_len ==
                    static_cast<char*>(req.local[bi].iov_base) + boff)
        b[nb - 1].iov_len += k;
      else
        b[nb++] = {static_cast<char*>(req.local[bi].iov_base) + boff, k};
      window += k;
      aoff += k;
      boff += k;
      if (aoff == ours[ai].iov_len) ++ai, aoff = 0;
      if (boff == req.local[bi].iov_len) ++bi, boff = 0;
    }
    if (window == 0) return false;  // lists shorter than len: the engine sized them wrong
    ssize_t done = write ? process_vm_writev(req.pid, a, na, b, nb, 0)
                         : process_vm_readv(req.pid, a, na, b, nb, 0);
    if (done != static_cast<ssize_t>(window)) return false;  // requester gone or unmapped
    len -= window;
  }
  return true;
}

}  // namespace

void copy_scattered(const iovec* dst, int ndst, const iovec* src, int nsrc, uint64_t len) {
  int di = 0, si = 0;
  size_t doff = 0, soff = 0;
  while (len > 0 && di < ndst && si < nsrc) {
    size_t n = std::min<uint64_t>({len, dst[di].iov_len - doff, src[si].iov_len - soff});
    std::memmove(static_cast<char*>(dst[di].iov_base) + doff,
                 static_cast<const char*>(src[si].iov_base) + soff, n);
    len -= n;
    doff += n;
    soff += n;
    if (doff == dst[di].iov_len) ++di, doff = 0;
    if (soff == src[si].iov_len) ++si, soff = 0;
  }
}

bool copy_from_requester(const Request& req, const iovec* dst, int ndst, uint64_t len) {
  if (req.pid == self_pid()) {
    copy_local(dst, ndst, req.local, req.nlocal, len);
    return true;
  }
  return cross_copy(req, dst, ndst, len, false);
}

bool copy_to_requester(const Request& req, const iovec* src, int nsrc, uint64_t len) {
  if (req.pid == self_pid()) {
    copy_local(req.local, req.nlocal, src, nsrc, len);
    return true;
  }
  return cross_copy(req, src, nsrc, len, true);
}

}  // namespace softverbs::wire
