/* Raw packet QP helpers shared by conformance.raw_packet and the hosts test's raw_frames:
 * a raw QP, its states, and a steering rule on a destination MAC and UDP port. */
#ifndef SV_RAW_HELPERS_H
#define SV_RAW_HELPERS_H

#include "common.h"

#include <arpa/inet.h>

/* A raw packet QP on `cq`, `slots` WRs each way, one SGE, every send signaled; NULL and
 * errno if refused (EPERM without CAP_NET_RAW). */
static inline struct ibv_qp *create_raw(struct sv_dev *d, struct ibv_cq *cq, uint32_t slots)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RAW_PACKET;
	a.send_cq = a.recv_cq = cq;
	a.cap.max_send_wr = a.cap.max_recv_wr = slots;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.sq_sig_all = 1;
	return ibv_create_qp(d->pd, &a);
}

/* INIT (with the port, the one attribute a raw QP takes), RTR, RTS: what ibv_modify_qp
 * returned at the first that failed, else 0. */
static inline int modify_raw(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	int err;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT)))
		return err;
	a.qp_state = IBV_QPS_RTR;
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE)))
		return err;
	a.qp_state = IBV_QPS_RTS;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* A rule for frames to `mac`, UDP port `port`, tagged `tag` unless it is 0; NULL and errno
 * if refused. */
static inline struct ibv_flow *mac_port_rule(struct ibv_qp *qp, const uint8_t *mac, uint16_t port,
					     uint32_t tag)
{
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_eth eth;
		struct ibv_flow_spec_tcp_udp udp;
		struct ibv_flow_spec_action_tag tag;
	} r;
	memset(&r, 0, sizeof(r));
	r.attr.type = IBV_FLOW_ATTR_NORMAL;
	r.attr.port = 1;
	r.attr.num_of_specs = tag ? 3 : 2;
	r.attr.size = tag ? sizeof(r) : sizeof(r) - sizeof(r.tag);
	r.eth.type = IBV_FLOW_SPEC_ETH;
	r.eth.size = sizeof(r.eth);
	memcpy(r.eth.val.dst_mac, mac, 6);
	memset(r.eth.mask.dst_mac, 0xff, 6);
	r.udp.type = IBV_FLOW_SPEC_UDP;
	r.udp.size = sizeof(r.udp);
	r.udp.val.dst_port = htons(port);
	r.udp.mask.dst_port = 0xffff;
	r.tag.type = IBV_FLOW_SPEC_ACTION_TAG;
	r.tag.size = sizeof(r.tag);
	r.tag.tag_id = tag;
	return ibv_create_flow(qp, &r.attr);
}

#endif
