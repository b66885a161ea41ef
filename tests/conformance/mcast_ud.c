/*
 * UD multicast (ibv_attach_mcast(3), ibv_detach_mcast(3)): a send to a multicast GID
 * reaches every UD QP attached to the group, with the group's GID in the GRH and the
 * sender's QPN in src_qp; IBV_QP_CREATE_BLOCK_SELF_MCAST_LB keeps a sender's own copy away;
 * a detached QP gets nothing more. Bad arguments: attaching an RC QP, or to a GID that is
 * not multicast, is EINVAL; detaching a group the QP is not in is EINVAL.
 */
#include "common.h"

#include <arpa/inet.h>

#define NAME "mcast_ud"
#define QKEY 0x11111111u
#define MSG 64

struct member {
	struct ibv_qp *qp;
	struct ibv_cq *scq, *cq; /* sends, receives */
	struct ibv_mr *mr;
};

static struct ibv_qp *create_ud(struct sv_dev *d, struct ibv_cq *scq, struct ibv_cq *cq,
				int block_self)
{
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp_attr m;
	struct ibv_qp *qp;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_UD;
	a.send_cq = scq;
	a.recv_cq = cq;
	a.cap.max_send_wr = a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.sq_sig_all = 1;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = d->pd;
	if (block_self) {
		a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
		a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	}
	qp = ibv_create_qp_ex(d->ctx, &a);
	CHECK(qp != NULL);
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.port_num = 1;
	m.qkey = QKEY;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	CHECK_OK(sv_modify_state(qp, IBV_QPS_RTR));
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 1;
	CHECK_OK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN));
	return qp;
}

static void member_open(struct sv_dev *d, struct member *m, int block_self)
{
	m->scq = sv_create_cq(d, 32, NULL, NULL);
	m->cq = sv_create_cq(d, 32, NULL, NULL);
	m->qp = create_ud(d, m->scq, m->cq, block_self);
	m->mr = sv_alloc_mr(d->pd, 4 * (40 + MSG), IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < 4; ++i)
		CHECK_OK(sv_post_recv(m->qp, 100 + i, m->mr, i * (40 + MSG), 40 + MSG));
}

static void member_close(struct member *m)
{
	CHECK_OK(ibv_destroy_qp(m->qp));
	CHECK_OK(ibv_destroy_cq(m->cq));
	CHECK_OK(ibv_destroy_cq(m->scq));
	sv_free_mr(m->mr);
}

/* One SEND of MSG bytes from `from` to the group; its own completion is checked. */
static void send_to_group(struct sv_dev *d, struct member *from, struct ibv_ah *ah, uint64_t id)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct ibv_wc wc;
	sv_wr_init(&wr, &sge, id, IBV_WR_SEND, from->mr, 3 * (40 + MSG) + 40, MSG, 0);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = QKEY;
	CHECK_OK(ibv_post_send(from->qp, &wr, &bad));
	(void)d;
	sv_poll_one(from->scq, &wc);
	CHECK_WC(wc, id, IBV_WC_SUCCESS, from->qp);
	CHECK_OPCODE(wc, IBV_WC_SEND);
}

static void expect_copy(struct member *m, struct member *from, const union ibv_gid *group)
{
	struct ibv_wc wc;
	const uint8_t *grh;
	sv_poll_one(m->cq, &wc);
	CHECK_STATUS(wc, IBV_WC_SUCCESS);
	CHECK_OPCODE(wc, IBV_WC_RECV);
	CHECK_EQ(wc.qp_num, m->qp->qp_num);
	CHECK_EQ(wc.src_qp, from->qp->qp_num);
	CHECK_EQ(wc.byte_len, 40 + MSG);
	CHECK(wc.wc_flags & IBV_WC_GRH);
	/* RoCE v2 with IPv4 addresses: an IPv4 header in the GRH's last 20 bytes. */
	grh = sv_ptr(m->mr, (wc.wr_id - 100) * (40 + MSG));
	CHECK(memcmp(grh + 20 + 16, &group->raw[12], 4) == 0);
}

int main(void)
{
	struct sv_dev d;
	struct member a, b, c;
	struct ibv_ah_attr ah_attr;
	struct ibv_ah *ah;
	union ibv_gid group, unicast;
	struct ibv_wc wc;

	sv_init(NAME);
	sv_open(&d);
	memset(&group, 0, sizeof(group));
	group.raw[10] = group.raw[11] = 0xff;
	inet_pton(AF_INET, "230.0.0.7", &group.raw[12]);

	sv_step("the device says it has multicast");
	CHECK(d.dev_attr.max_mcast_grp > 0 && d.dev_attr.max_mcast_qp_attach > 0);

	sv_step("bad arguments");
	member_open(&d, &a, 0);
	member_open(&d, &b, 0);
	member_open(&d, &c, 1);
	{
		struct sv_pair_cfg cfg;
		struct ibv_qp *rc;
		sv_pair_cfg_init(&cfg);
		rc = sv_create_qp(&d, &cfg, a.cq, a.cq, NULL, NULL);
		CHECK_ERR(ibv_attach_mcast(rc, &group, 0), EINVAL);
		CHECK_OK(ibv_destroy_qp(rc));
	}
	unicast = d.gid;
	CHECK_ERR(ibv_attach_mcast(a.qp, &unicast, 0), EINVAL);
	CHECK_ERR(ibv_detach_mcast(a.qp, &group, 0), EINVAL);

	sv_step("three members; a send from the one that blocks its own loopback");
	CHECK_OK(ibv_attach_mcast(a.qp, &group, 0));
	CHECK_OK(ibv_attach_mcast(b.qp, &group, 0));
	CHECK_OK(ibv_attach_mcast(c.qp, &group, 0));
	CHECK_OK(ibv_attach_mcast(a.qp, &group, 0)); /* again: still one membership */
	memset(&ah_attr, 0, sizeof(ah_attr));
	ah_attr.is_global = 1;
	ah_attr.grh.dgid = group;
	ah_attr.grh.hop_limit = 64;
	ah_attr.port_num = 1;
	ah = ibv_create_ah(d.pd, &ah_attr);
	CHECK(ah != NULL);
	memcpy(sv_ptr(c.mr, 3 * (40 + MSG) + 40), "to the group", 13);
	send_to_group(&d, &c, ah, 1);
	expect_copy(&a, &c, &group);
	expect_copy(&b, &c, &group);
	usleep(SV_QUIET_MS * 1000);
	sv_expect_empty(c.cq, "the sender with BLOCK_SELF_MCAST_LB got its own message");
	sv_expect_empty(a.cq, "a second copy");

	sv_step("a sender without the flag gets its own copy too");
	send_to_group(&d, &a, ah, 2);
	expect_copy(&a, &a, &group);
	expect_copy(&b, &a, &group);
	expect_copy(&c, &a, &group);

	sv_step("after ibv_detach_mcast, nothing more");
	CHECK_OK(ibv_detach_mcast(b.qp, &group, 0));
	CHECK_ERR(ibv_detach_mcast(b.qp, &group, 0), EINVAL);
	send_to_group(&d, &a, ah, 3);
	expect_copy(&a, &a, &group);
	expect_copy(&c, &a, &group);
	usleep(SV_QUIET_MS * 1000);
	CHECKF(ibv_poll_cq(b.cq, 1, &wc) == 0, "a detached QP received a multicast message");

	sv_step("destroying attached QPs leaves their groups");
	CHECK_OK(ibv_destroy_ah(ah));
	member_close(&a);
	member_close(&b);
	member_close(&c);
	sv_close(&d);
	sv_pass();
	return 0;
}
