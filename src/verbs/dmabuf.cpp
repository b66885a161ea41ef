// dma-buf MRs (ibv_reg_dmabuf_mr(3)): memory another driver exports as a dma-buf fd (a GPU
// buffer, a udmabuf over a memfd). A NIC DMAs into the buffer's pages; we map the dma-buf
// (mmap of the fd, which exporters such as udmabuf and the DRM drivers offer) and reach the
// bytes through that mapping. The MR holds the mapping until it is deregistered. As the
// kernel: a bad fd is EBADF, an fd that is not a dma-buf EINVAL; an exporter that cannot be
// mapped gives the errno mmap gave.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "verbs/verbs.hpp"

namespace softverbs {

namespace {

// A dma-buf's fdinfo has an "exp_name:" line (the exporter), which no other file has.
bool is_dma_buf(int fd) {
  std::string path = "/proc/self/fdinfo/" + std::to_string(fd);
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return false;
  char line[256];
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f)) found = std::strncmp(line, "exp_name:", 9) == 0;
  std::fclose(f);
  return found;
}

}  // namespace

ibv_mr* reg_fd_mr(Pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, unsigned access) {
  if (check_mr_access(access) || (access & (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_MW_BIND)) ||
      length == 0 || offset > UINT64_MAX - length) {
    errno = EINVAL;
    return nullptr;
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const uint64_t span = offset - start + length;
  const int prot = (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_ATOMIC))
                       ? PROT_READ | PROT_WRITE
                       : PROT_READ;
  void* map = mmap(nullptr, span, prot, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return nullptr;  // errno from mmap (ENODEV: not mappable)
  // ibv_mr.addr shows the offset, as rdma-core's ibv_cmd_reg_dmabuf_mr sets it.
  Mr* mr = make_mr(pd, static_cast<char*>(map) + (offset - start),
                   reinterpret_cast<void*>(static_cast<uintptr_t>(offset)), length, iova, access);
  if (!mr) {
    int err = errno;
    munmap(map, span);
    errno = err;
    return nullptr;
  }
  mr->dmabuf_map = map;
  mr->dmabuf_map_length = span;
  return &mr->ibv;
}

ibv_mr* reg_dmabuf_mr(Pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                      unsigned access) {
  if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
    errno = EBADF;
    return nullptr;
  }
  if (!is_dma_buf(fd)) {
    errno = EINVAL;
    return nullptr;
  }
  return reg_fd_mr(pd, offset, length, iova, fd, access);
}

}  // namespace softverbs
