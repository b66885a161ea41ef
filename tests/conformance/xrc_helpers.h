/* XRC helpers shared by the XRC conformance tests (twoproc_xrc, twoproc_xrc_creator_leaves,
 * twoproc_xrc_creator_dies): a domain on a file, a TGT QP, an XRC SRQ, an INI QP, a handle on
 * another process's TGT QP, connecting an INI or TGT QP, a WR at an XRC SRQ. */
#ifndef SV_XRC_HELPERS_H
#define SV_XRC_HELPERS_H

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static inline struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags)
{
	struct ibv_xrcd_init_attr a = {0};
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = fd;
	a.oflags = oflags;
	return ibv_open_xrcd(ctx, &a);
}

/* The domain of the file at `path` (opened for the call only); NULL and errno if refused. */
static inline struct ibv_xrcd *open_xrcd_file(struct ibv_context *ctx, const char *path, int oflags)
{
	int fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	struct ibv_xrcd *x = open_xrcd(ctx, fd, oflags);
	int err = errno;
	close(fd);
	errno = err;
	return x;
}

static inline struct ibv_qp *tgt_qp(struct sv_dev *d, struct ibv_xrcd *x)
{
	struct ibv_qp_init_attr_ex a = {0};
	a.qp_type = IBV_QPT_XRC_RECV;
	a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	a.xrcd = x;
	struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &a);
	CHECK(qp != NULL);
	return qp;
}

static inline struct ibv_srq *xrc_srq(struct sv_dev *d, struct ibv_xrcd *x, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {0};
	a.attr.max_wr = 16;
	a.attr.max_sge = 1;
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
		      IBV_SRQ_INIT_ATTR_CQ;
	a.srq_type = IBV_SRQT_XRC;
	a.pd = d->pd;
	a.xrcd = x;
	a.cq = cq;
	struct ibv_srq *s = ibv_create_srq_ex(d->ctx, &a);
	CHECK(s != NULL);
	return s;
}

static inline uint32_t srq_num(struct ibv_srq *s)
{
	uint32_t n = 0;
	CHECK_OK(ibv_get_srq_num(s, &n));
	return n;
}

/* An INI QP; with `ops`, an extended one with those send ops (NULL and errno if refused). */
static inline struct ibv_qp *ini_qp_ops(struct sv_dev *d, struct ibv_cq *cq, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a = {0};
	a.qp_type = IBV_QPT_XRC_SEND;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	if (ops) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = ops;
	}
	a.pd = d->pd;
	a.send_cq = cq;
	a.cap.max_send_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_wr = 4; /* an INI QP has no receive queue: ignored, reported 0 */
	struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &a);
	if (qp)
		CHECK_EQ(a.cap.max_recv_wr, 0);
	return qp;
}

static inline struct ibv_qp *ini_qp(struct sv_dev *d, struct ibv_cq *cq)
{
	struct ibv_qp *qp = ini_qp_ops(d, cq, 0);
	CHECK(qp != NULL);
	return qp;
}

/* A handle on the TGT QP `qpn` of domain x (ibv_open_qp(3)); NULL and errno if refused. */
static inline struct ibv_qp *open_tgt(struct ibv_context *ctx, struct ibv_xrcd *x, uint32_t qpn)
{
	struct ibv_qp_open_attr oa = {0};
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = qpn;
	oa.xrcd = x;
	oa.qp_type = IBV_QPT_XRC_RECV;
	return ibv_open_qp(ctx, &oa);
}

/* A holder process's start: reads the TGT QP's number from sock, opens the domain of the
 * file at `path` and `n` handles on that QP into h[] (the domain in *x). */
static inline uint32_t open_tgt_handles(struct sv_dev *d, int sock, const char *path,
					struct ibv_xrcd **x, struct ibv_qp **h, int n)
{
	uint32_t tgt_qpn;
	CHECK_EQ(read(sock, &tgt_qpn, sizeof(tgt_qpn)), (ssize_t)sizeof(tgt_qpn));
	*x = open_xrcd_file(d->ctx, path, 0);
	CHECKF(*x != NULL, "open_xrcd: %s", strerror(errno));
	for (int i = 0; i < n; i++) {
		h[i] = open_tgt(d->ctx, *x, tgt_qpn);
		CHECKF(h[i] != NULL, "ibv_open_qp: %s", strerror(errno));
	}
	return tgt_qpn;
}

/* INIT, then RTR to dest (and RTS for an INI QP), with the masks the kernel's table wants
 * for XRC: an INI QP takes no receive attributes (max_dest_rd_atomic: EINVAL). */
static inline void connect_xrc_gid(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest,
				   int ini, const union ibv_gid *peer);

static inline void connect_xrc(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest, int ini)
{
	connect_xrc_gid(qp, d, dest, ini, sv_peer_gid(qp));
}

/* The same, towards the GID `peer` (NULL: a QP on this host). */
static inline void connect_xrc_gid(struct ibv_qp *qp, const struct sv_dev *d, uint32_t dest,
				   int ini, const union ibv_gid *peer)
{
	struct sv_pair_cfg cfg;
	sv_pair_cfg_init(&cfg);
	CHECK_OK(sv_modify_init(qp, &cfg));
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = cfg.mtu;
	a.dest_qp_num = dest;
	a.rq_psn = cfg.psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer ? *peer : d->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (ini)
		CHECK_ERR(ibv_modify_qp(qp, &a, mask | IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
	else
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK_OK(ibv_modify_qp(qp, &a, mask));
	if (ini)
		CHECK_OK(sv_modify_rts(qp, &cfg));
}

/* A WR at XRC SRQ `srqn`; `rkey`: the remote key, or SEND_WITH_INV's key to invalidate. */
static inline int post_xrc(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, uint32_t srqn,
		    struct ibv_mr *mr, size_t off, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {sv_addr(mr, off), len, mr->lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.qp_type.xrc.remote_srqn = srqn;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (op == IBV_WR_SEND_WITH_INV)
		wr.invalidate_rkey = rkey; /* the window's key to invalidate */
	return ibv_post_send(qp, &wr, &bad);
}

/* A SEND of `len` bytes of `fill` (at mr offset 4096) from INI QP `ini` through TGT QP
 * tgt_qpn into XRC SRQ srq (number srqn, receive at mr offset 0, wr_id id + 100, on rcq):
 * both completions, the receive naming the TGT and INI QPs, and the payload. */
static inline void xrc_send_through(struct ibv_qp *ini, struct ibv_cq *cq, struct ibv_cq *rcq,
				    struct ibv_srq *srq, uint32_t srqn, struct ibv_mr *mr,
				    uint32_t len, uint64_t id, char fill, uint32_t tgt_qpn)
{
	struct ibv_wc wc;
	CHECK_OK(sv_post_srq_recv(srq, id + 100, mr, 0, len));
	memset(sv_ptr(mr, 4096), fill, len);
	CHECK_OK(post_xrc(ini, id, IBV_WR_SEND, srqn, mr, 4096, len, 0, 0));
	sv_expect_wc(cq, id, IBV_WC_SUCCESS, ini, &wc);
	sv_poll_one(rcq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, id + 100);
	CHECK_EQ(wc.qp_num, tgt_qpn);
	CHECK_EQ(wc.src_qp, ini->qp_num);
	CHECKF(sv_ptr(mr, 0)[0] == fill && sv_ptr(mr, 0)[len - 1] == fill, "SEND payload");
}

/* For the tests of a handle in another process (ibv_open_qp), which run on one host: makes
 * the domain's file from `path_template` (mkstemp). 0 when the test is skipped (said). */
static inline int xrc_same_host_file(char *path_template)
{
	if (sv_peer_on_other_host()) {
		printf("SKIP: same host only (a handle in another process: ibv_open_qp)\n");
		return 0;
	}
	int tmp = mkstemp(path_template);
	CHECK(tmp >= 0);
	close(tmp);
	return 1;
}

static inline void modify_state(struct ibv_qp *qp, enum ibv_qp_state s)
{
	struct ibv_qp_attr a = {.qp_state = s};
	CHECK_OK(ibv_modify_qp(qp, &a, IBV_QP_STATE));
}

#endif
