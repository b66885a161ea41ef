/*
 * dma-buf MRs between two processes (ibv_reg_dmabuf_mr(3)), on the same host or
 * (hosts.twoproc.dmabuf) between hosts. The errors come first and need no exporter: a bad fd
 * is EBADF and an fd that is not a dma-buf (a memfd) EINVAL, as the kernel answers. Then,
 * where /dev/udmabuf is there to turn a memfd into a dma-buf: B (child) registers a dma-buf
 * MR at offset 100 of a two-page udmabuf with iova 0x10000; A (parent) RDMA WRITEs into it,
 * READs it back and SENDs into a receive posted on it; B checks the bytes through the
 * memfd. Without an exporter the test prints "SKIP twoproc_dmabuf: ..." and ctest shows it
 * skipped (udmabuf needs CONFIG_UDMABUF and access to /dev/udmabuf; DRM devices export
 * dma-bufs too, but need a GPU).
 */
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "common.h"

#define OFFSET 100
#define LEN 4000
#define IOVA 0x10000ull

static int sock;
static size_t page;

struct target_info {
	uint32_t qpn;
	uint32_t rkey;
};

static void say(int v) { sv_say(sock, v); }
static int hear(void) { return sv_hear(sock); }

/* A dma-buf over a fresh two-page memfd, through /dev/udmabuf; -1 (errno set) without one. */
static int make_udmabuf(int *memfd_out)
{
	int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -1;
	int memfd = memfd_create("twoproc_dmabuf", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	CHECK(memfd >= 0);
	CHECK_OK(ftruncate(memfd, (off_t)(2 * page)));
	CHECK_OK(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)); /* udmabuf wants it sealed */
	struct udmabuf_create create = {.memfd = (uint32_t)memfd, .flags = UDMABUF_FLAGS_CLOEXEC,
					.offset = 0, .size = 2 * page};
	int fd = ioctl(dev, UDMABUF_CREATE, &create);
	int err = errno;
	close(dev);
	if (fd < 0) {
		close(memfd);
		errno = err;
		return -1;
	}
	*memfd_out = memfd;
	return fd;
}

static void check_errors(void)
{
	struct sv_dev dev;
	sv_open(&dev);
	unsigned access = IBV_ACCESS_LOCAL_WRITE;
	CHECK(ibv_reg_dmabuf_mr(dev.pd, 0, 4096, 0, -1, access) == NULL);
	CHECK_EQ(errno, EBADF);
	int memfd = memfd_create("not_a_dmabuf", MFD_CLOEXEC);
	CHECK(memfd >= 0);
	CHECK_OK(ftruncate(memfd, 4096));
	CHECK(ibv_reg_dmabuf_mr(dev.pd, 0, 4096, 0, memfd, access) == NULL);
	CHECK_EQ(errno, EINVAL);
	close(memfd);
	CHECK(ibv_reg_dmabuf_mr(dev.pd, 0, 4096, 0, memfd, access) == NULL); /* closed now */
	CHECK_EQ(errno, EBADF);
	sv_close(&dev);
}

static void target(int s)
{
	sock = s;
	int memfd;
	int fd = make_udmabuf(&memfd);
	CHECK(fd >= 0);
	uint8_t *bytes = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	CHECK(bytes != MAP_FAILED);
	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(dev.pd, OFFSET, LEN, IOVA, fd, SV_ACCESS_ALL);
	CHECKF(mr != NULL, "ibv_reg_dmabuf_mr failed: %s", strerror(errno));
	CHECK_EQ((uintptr_t)mr->addr, OFFSET); /* rdma-core shows the offset */
	for (int i = 0; i < 64; i++)
		bytes[OFFSET + 1000 + i] = (uint8_t)(0x70 + i);
	struct target_info me = {.qpn = qp->qp_num, .rkey = mr->rkey}, peer;
	sv_exchange(sock, &me, &peer, sizeof(me));
	sv_trade_gid(sock, qp);
	CHECK_OK(sv_modify_init(qp, &cfg));
	struct ibv_sge sge = {.addr = IOVA + 2000, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK_OK(ibv_post_recv(qp, &rwr, &bad));
	CHECK_OK(sv_modify_rtr(qp, &dev, peer.qpn, &cfg));
	CHECK_OK(sv_modify_rts(qp, &cfg));
	say(1);

	CHECK_EQ(hear(), 1);
	struct ibv_wc wc;
	sv_expect_wc(cq, 5, IBV_WC_SUCCESS, qp, &wc);
	for (int i = 0; i < 64; i++) {
		CHECKF(bytes[OFFSET + 8 + i] == (uint8_t)(0x10 + i), "WRITE byte %d", i);
		CHECKF(bytes[OFFSET + 2000 + i] == (uint8_t)(0x40 + i), "SEND byte %d", i);
	}
	say(2);
	CHECK_EQ(hear(), 3);
	CHECK_OK(ibv_destroy_qp(qp));
	CHECK_OK(ibv_dereg_mr(mr));
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	_exit(0);
}

int main(void)
{
	sv_init("twoproc_dmabuf");
	page = (size_t)sysconf(_SC_PAGESIZE);
	int memfd;
	int probe = make_udmabuf(&memfd);
	if (probe < 0) {
		int err = errno;
		check_errors();
		printf("SKIP twoproc_dmabuf: no dma-buf exporter (/dev/udmabuf: %s)\n", strerror(err));
		return 0;
	}
	close(probe);
	close(memfd);
	pid_t child;
	sock = sv_fork_peer(target, &child);
	check_errors();

	struct sv_dev dev;
	sv_open(&dev);
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	struct ibv_cq *cq = sv_create_cq(&dev, 16, NULL, NULL);
	struct ibv_qp *qp = sv_create_qp(&dev, &cfg, cq, cq, NULL, NULL);
	struct target_info me = {.qpn = qp->qp_num}, b;
	sv_exchange(sock, &me, &b, sizeof(me));
	sv_trade_gid(sock, qp);
	sv_connect_remote(qp, &dev, &cfg, b.qpn, NULL, 0, 0, 0);
	struct ibv_mr *mr = sv_alloc_mr(dev.pd, 4096, SV_ACCESS_ALL);
	CHECK_EQ(hear(), 1);

	sv_step("WRITE, READ and SEND into B's dma-buf MR");
	struct ibv_wc wc;
	for (int i = 0; i < 64; i++) {
		sv_ptr(mr, 0)[i] = (uint8_t)(0x10 + i);
		sv_ptr(mr, 256)[i] = (uint8_t)(0x40 + i);
	}
	CHECK_OK(sv_post_rdma(qp, 1, IBV_WR_RDMA_WRITE, mr, 0, 64, IBV_SEND_SIGNALED, IOVA + 8,
			      b.rkey));
	sv_expect_wc(cq, 1, IBV_WC_SUCCESS, qp, &wc);
	CHECK_OK(sv_post_rdma(qp, 2, IBV_WR_RDMA_READ, mr, 1024, 64, IBV_SEND_SIGNALED, IOVA + 1000,
			      b.rkey));
	sv_expect_wc(cq, 2, IBV_WC_SUCCESS, qp, &wc);
	for (int i = 0; i < 64; i++)
		CHECKF(sv_ptr(mr, 1024)[i] == (uint8_t)(0x70 + i), "READ byte %d", i);
	CHECK_OK(sv_post_send(qp, 3, mr, 256, 64, IBV_SEND_SIGNALED));
	sv_expect_wc(cq, 3, IBV_WC_SUCCESS, qp, &wc);
	say(1);
	CHECK_EQ(hear(), 2);
	say(3);
	sv_wait_peer(child, "target");
	CHECK_OK(ibv_destroy_qp(qp));
	sv_free_mr(mr);
	CHECK_OK(ibv_destroy_cq(cq));
	sv_close(&dev);
	sv_pass();
	return 0;
}
