// The IB CM as Linux 6.1 rxe speaks it, against our codec: GMPs to QP1 captured on a veth
// between two rxe devices in the rxe-vm guest (rxe_capture/cm_capture.sh; frames in
// roce_cm_frames.inc). Every frame's ICRC checks, every CM message decodes to what the
// programs did (rping, udaddy, cm_peer: addresses, ports, QPNs, PSNs, reasons), and
// encoding what was decoded gives the captured bytes back, ICRC included.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

#include "cm/protocol.hpp"
#include "wire/roce/cm_msg.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/mad.hpp"
#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {
namespace {

#include "roce_cm_frames.inc"
#include "roce_cm_data_frames.inc"

struct Frame {
  std::string what;
  IcrcContext wire;  // the IP and UDP headers as sent (IPv4 ID and DF included)
  const uint8_t* dgram = nullptr;  // after the UDP header
  size_t len = 0;
  int number = 0;
};

Frame parse(const RxeFrame& f) {
  Frame p;
  p.what = f.what;
  p.number = std::stoi(p.what.substr(6));
  const uint8_t* ip = f.bytes + 14;
  const bool v6 = f.bytes[12] == 0x86;
  const uint8_t* udp = ip + (v6 ? 40 : 20);
  const uint16_t sport = uint16_t(udp[0] << 8 | udp[1]), dport = uint16_t(udp[2] << 8 | udp[3]);
  EXPECT_EQ(dport, kRoceV2Port) << p.what;
  if (v6) {
    p.wire = IcrcContext::from_gids(ip + 8, ip + 24, sport, dport);
    EXPECT_TRUE(p.wire.ipv6);
  } else {
    p.wire = IcrcContext::from_ipv4(ip + 12, ip + 16, sport, dport);
    p.wire.ipv4_id = uint16_t(ip[4] << 8 | ip[5]);
    p.wire.ipv4_df = ip[6] & 0x40;
  }
  p.dgram = udp + 8;
  p.len = f.len - size_t(p.dgram - f.bytes);
  return p;
}

std::map<int, Frame> frames() {
  std::map<int, Frame> m;
  for (const RxeFrame& f : kRxeFrames) {
    Frame p = parse(f);
    m[p.number] = p;
  }
  return m;
}

CmMad decode_frame(const Frame& f) {
  Gmp g;
  const uint8_t* mad = nullptr;
  EXPECT_EQ(decode_gmp(f.dgram, f.len, &g, &mad), GmpError::kOk) << f.what;
  CmMad m;
  if (mad != nullptr) {
    EXPECT_EQ(decode_cm(mad, kMadBytes, &m), CmError::kOk) << f.what;
  }
  return m;
}

Gid ipv4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}
Gid ipv6(uint8_t last) {  // fd00:9::last
  return {0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last};
}
std::array<uint8_t, 16> cma_ipv4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c, d};
}
template <size_t N>
std::string text(const std::array<uint8_t, N>& a, size_t from = 0) {
  return std::string(reinterpret_cast<const char*>(a.data() + from));
}

TEST(RoceCmFramesTest, IcrcOfEveryFrameChecks) {
  for (const auto& [n, f] : frames()) {
    EXPECT_TRUE(icrc_check_exact(f.wire, f.dgram, f.len)) << f.what;
    EXPECT_EQ(icrc(f.wire, f.dgram, f.len - kIcrcBytes), icrc_stored(f.dgram, f.len)) << f.what;
    if (f.wire.ipv6) continue;
    // A receiver does not see rxe's IPv4 ID (a counter); the some-ID check finds it.
    IcrcContext receiver = f.wire;
    receiver.ipv4_id = 0;
    const IcrcCheck c = icrc_check(receiver, f.dgram, f.len);
    EXPECT_EQ(c.result, IcrcCheck::kSomeIpv4Id) << f.what;
    EXPECT_EQ(c.ipv4_id, f.wire.ipv4_id) << f.what;
  }
}

// The GMP framing: UD SEND_ONLY from QP1 to QP1, Q_Key 0x80010000, P_Key 0xffff, AckReq
// set, and each side's QP1 numbering its sends from PSN 0 (host A 10.9.0.2 / fd00:9::2 sent
// the requests, host B answered).
TEST(RoceCmFramesTest, EveryFrameIsAGmpToQp1) {
  uint32_t next_psn[2] = {0, 0};
  for (const auto& [n, f] : frames()) {
    Gmp g;
    const uint8_t* mad = nullptr;
    ASSERT_EQ(decode_gmp(f.dgram, f.len, &g, &mad), GmpError::kOk) << f.what;
    EXPECT_EQ(f.len, kGmpDatagramBytes);
    EXPECT_EQ(mad, f.dgram + kBthBytes + kDethBytes);
    EXPECT_EQ(g.dest_qp, 1u);
    EXPECT_EQ(g.src_qp, 1u);
    EXPECT_EQ(g.qkey, 0x80010000u);
    EXPECT_EQ(g.pkey, 0xffff);
    EXPECT_TRUE(g.ack_req) << f.what;
    const int from_b = f.wire.src_ip[15] == 1;  // 10.9.0.1 or fd00:9::1
    EXPECT_GE(g.psn, next_psn[from_b]) << f.what;  // not every frame is in the .inc
    next_psn[from_b] = g.psn + 1;
    // rxe uses one UDP source port for QP1, whatever the peer.
    EXPECT_EQ(f.wire.src_port, 55410) << f.what;
  }
}

TEST(RoceCmFramesTest, ReencodingGivesTheCapturedBytes) {
  for (const auto& [n, f] : frames()) {
    Gmp g;
    const uint8_t* mad = nullptr;
    ASSERT_EQ(decode_gmp(f.dgram, f.len, &g, &mad), GmpError::kOk) << f.what;
    CmMad m;
    ASSERT_EQ(decode_cm(mad, kMadBytes, &m), CmError::kOk) << f.what;
    uint8_t again[kMadBytes];
    ASSERT_TRUE(encode_cm(m, again)) << f.what;
    EXPECT_EQ(memcmp(again, mad, kMadBytes), 0) << f.what;
    uint8_t dgram[kGmpDatagramBytes];
    ASSERT_EQ(encode_gmp(g, again, dgram, sizeof dgram), kGmpDatagramBytes);
    icrc_fill(f.wire, dgram, sizeof dgram);
    EXPECT_EQ(memcmp(dgram, f.dgram, f.len), 0) << f.what;
  }
}

// cm_answer_id, which routes a QP1 MAD to its process without decoding it, reads what the
// full decoder reads: the remote comm ID of an answer, SIDR_REP's request ID, 0 for requests.
TEST(RoceCmFramesTest, AnswerIdIsWhatTheDecoderReads) {
  size_t answers = 0;
  for (const auto& [n, f] : frames()) {
    Gmp g;
    const uint8_t* mad = nullptr;
    ASSERT_EQ(decode_gmp(f.dgram, f.len, &g, &mad), GmpError::kOk) << f.what;
    const CmMad m = decode_frame(f);
    const uint32_t want = std::visit(
        [](const auto& b) -> uint32_t {
          using B = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<B, CmSidrRep>) return b.request_id;
          else if constexpr (std::is_same_v<B, CmReq> || std::is_same_v<B, CmSidrReq>) return 0;
          else return b.remote_comm_id;
        },
        m.body);
    EXPECT_EQ(cm_answer_id(mad, kMadBytes), want) << f.what;
    EXPECT_EQ(cm_answer_id(mad, kMadBytes - 1), 0u) << f.what;
    answers += want != 0;
  }
  EXPECT_GT(answers, 10u);
}

// rping -c -a 10.9.0.1 -I 10.9.0.2 -p 7471: REQ, REP, RTU, then the client's DREQ and DREP.
TEST(RoceCmFramesTest, RcConnectionAndDisconnect) {
  auto all = frames();
  const CmMad req_mad = decode_frame(all[1]);
  const CmReq& req = std::get<CmReq>(req_mad.body);
  EXPECT_EQ(req_mad.hdr.method, kMadSend);
  EXPECT_EQ(req_mad.hdr.attr_id, uint16_t(CmAttr::kReq));
  EXPECT_EQ(req_mad.hdr.status, 0);
  EXPECT_EQ(req_mad.hdr.attr_mod, 0u);  // no ECE
  // The kernel's TID: its MAD agent's high TID, then the comm ID as it lies in memory
  // (little-endian host: byte-swapped).
  EXPECT_EQ(req_mad.hdr.tid, 0x4bf560518u);
  EXPECT_EQ(req.local_comm_id, 0x180556bfu);
  EXPECT_EQ(req.service_id, 0x0000000001061d2fu);
  PortSpace ps;
  uint16_t port;
  ASSERT_TRUE(parse_service_id(req.service_id, &ps, &port));
  EXPECT_EQ(ps, PortSpace::kTcp);
  EXPECT_EQ(port, 7471);
  EXPECT_EQ(req.service_id, service_id(PortSpace::kTcp, 7471));
  EXPECT_EQ(req.local_ca_guid, 0xa0fafffffe1abafau);  // EUI-64 of host A's veth MAC
  EXPECT_EQ(req.local_qkey, 0u);
  EXPECT_EQ(req.local_qpn, 0x11u);
  EXPECT_EQ(req.starting_psn, 0x514358u);
  EXPECT_EQ(req.responder_resources, 1);
  EXPECT_EQ(req.initiator_depth, 1);
  EXPECT_EQ(req.transport_service_type, kCmRc);
  EXPECT_FALSE(req.end_to_end_flow_control);
  EXPECT_EQ(req.remote_cm_response_timeout, 20);  // rdma_cm's CMA_CM_RESPONSE_TIMEOUT
  EXPECT_EQ(req.local_cm_response_timeout, 20);
  EXPECT_EQ(req.retry_count, 7);
  EXPECT_EQ(req.rnr_retry_count, 7);
  EXPECT_EQ(req.max_cm_retries, 15);  // CMA_MAX_CM_RETRIES
  EXPECT_EQ(req.pkey, 0xffff);
  EXPECT_EQ(req.path_mtu, 3);  // 1024: a 1500-byte veth
  EXPECT_FALSE(req.srq);
  EXPECT_EQ(req.extended_transport_type, 0);
  EXPECT_EQ(req.vendor_id, 0u);
  const CmPath& p = req.primary;
  EXPECT_EQ(p.local_lid, 0xffff);  // the permissive LID: no LIDs on RoCE
  EXPECT_EQ(p.remote_lid, 0xffff);
  EXPECT_EQ(p.local_gid, ipv4_gid(10, 9, 0, 2));
  EXPECT_EQ(p.remote_gid, ipv4_gid(10, 9, 0, 1));
  EXPECT_EQ(p.flow_label, 0x856c2u);
  EXPECT_EQ(p.packet_rate, 0);
  EXPECT_EQ(p.traffic_class, 0);
  EXPECT_EQ(p.hop_limit, 64);
  EXPECT_EQ(p.sl, 0);
  EXPECT_FALSE(p.subnet_local);  // hop limit > 1
  EXPECT_EQ(p.local_ack_timeout, 19);
  EXPECT_EQ(req.alternate.local_lid, 0);
  EXPECT_EQ(req.alternate.remote_gid, Gid{});
  CmaHeader cma;
  ASSERT_EQ(decode_cma_header(req.private_data.data(), req.private_data.size(), &cma),
            CmaError::kOk);
  EXPECT_EQ(cma.ip_version, 4);
  EXPECT_EQ(cma.src_port, 0xc80d);  // the client's ephemeral rdma_cm port
  EXPECT_EQ(cma.src_addr, cma_ipv4(10, 9, 0, 2));
  EXPECT_EQ(cma.dst_addr, cma_ipv4(10, 9, 0, 1));
  uint8_t again[kCmaHeaderBytes];
  ASSERT_TRUE(encode_cma_header(cma, again));
  EXPECT_EQ(memcmp(again, req.private_data.data(), kCmaHeaderBytes), 0);
  for (size_t i = kCmaHeaderBytes; i < kReqPrivateBytes; ++i) EXPECT_EQ(req.private_data[i], 0);

  const CmMad rep_mad = decode_frame(all[2]);
  const CmRep& rep = std::get<CmRep>(rep_mad.body);
  EXPECT_EQ(rep_mad.hdr.tid, req_mad.hdr.tid);  // the answer carries the REQ's TID
  EXPECT_EQ(rep.local_comm_id, 0x1b0556bfu);
  EXPECT_EQ(rep.remote_comm_id, req.local_comm_id);
  EXPECT_EQ(rep.local_qkey, 0u);
  EXPECT_EQ(rep.local_qpn, 0x11u);  // each rxe device numbers its QPs from 0x11
  EXPECT_EQ(rep.local_eecn, 0u);
  EXPECT_EQ(rep.starting_psn, 0x284002u);
  EXPECT_EQ(rep.responder_resources, 1);
  EXPECT_EQ(rep.initiator_depth, 1);
  EXPECT_EQ(rep.target_ack_delay, 15);
  EXPECT_EQ(rep.failover_accepted, 0);
  EXPECT_FALSE(rep.end_to_end_flow_control);
  EXPECT_EQ(rep.rnr_retry_count, 7);
  EXPECT_FALSE(rep.srq);
  EXPECT_EQ(rep.vendor_id, 0u);
  EXPECT_EQ(rep.local_ca_guid, 0xc865d1fffe28a1dbu);
  EXPECT_EQ(rep.private_data, decltype(rep.private_data){});  // rping sends none

  const CmMad rtu_mad = decode_frame(all[3]);
  const CmRtu& rtu = std::get<CmRtu>(rtu_mad.body);
  EXPECT_EQ(rtu_mad.hdr.tid, req_mad.hdr.tid);
  EXPECT_EQ(rtu.local_comm_id, req.local_comm_id);
  EXPECT_EQ(rtu.remote_comm_id, rep.local_comm_id);

  // The client disconnects; its DREQ names the server's QPN. One TID for the connection.
  const CmMad dreq_mad = decode_frame(all[40]);
  const CmDreq& dreq = std::get<CmDreq>(dreq_mad.body);
  EXPECT_EQ(dreq_mad.hdr.tid, req_mad.hdr.tid);
  EXPECT_EQ(dreq.local_comm_id, req.local_comm_id);
  EXPECT_EQ(dreq.remote_comm_id, rep.local_comm_id);
  EXPECT_EQ(dreq.remote_qpn, rep.local_qpn);
  const CmMad drep_mad = decode_frame(all[41]);
  const CmDrep& drep = std::get<CmDrep>(drep_mad.body);
  EXPECT_EQ(drep_mad.hdr.tid, dreq_mad.hdr.tid);
  EXPECT_EQ(drep.local_comm_id, rep.local_comm_id);
  EXPECT_EQ(drep.remote_comm_id, req.local_comm_id);
}

// Which PSN a REQ's and a REP's starting PSN is: the first data packets of the connection
// above (roce_cm_data_frames.inc) show it. The client's first SEND carries the REP's
// starting PSN, the server's first READ request the REQ's: a side's own number is where its
// receive queue starts, the peer's where its send queue starts (cm::starting_psns, which
// rdma_init_qp_attr uses). Taking the REQ's as the client's send PSN made rxe NAK every
// packet of ours with a PSN sequence error and ours NAK rxe's.
TEST(RoceCmFramesTest, StartingPsnsAreTheReceiveQueues) {
  auto all = frames();
  const CmMad req_mad = decode_frame(all[1]), rep_mad = decode_frame(all[2]);
  const CmReq& req = std::get<CmReq>(req_mad.body);
  const CmRep& rep = std::get<CmRep>(rep_mad.body);
  Packet client_first, server_first;
  for (const RxeFrame& f : kRxeDataFrames) {
    Frame p = parse(f);
    Packet* out = p.number == 4 ? &client_first : &server_first;
    ASSERT_TRUE(decode(p.dgram, p.len, out)) << p.what;
  }
  EXPECT_EQ(client_first.opcode, kRc | kSendOnly);
  EXPECT_EQ(client_first.dest_qp, rep.local_qpn);
  EXPECT_EQ(server_first.opcode, kRc | kReadRequest);
  EXPECT_EQ(server_first.dest_qp, req.local_qpn);

  const auto client = cm::starting_psns(req.starting_psn, rep.starting_psn);
  const auto server = cm::starting_psns(rep.starting_psn, req.starting_psn);
  EXPECT_EQ(client.sq_psn, client_first.psn);
  EXPECT_EQ(server.rq_psn, client_first.psn);
  EXPECT_EQ(server.sq_psn, server_first.psn);
  EXPECT_EQ(client.rq_psn, server_first.psn);
}

// Nobody listens on port 7999: the CM itself rejects with reason 8 and local comm ID 0.
TEST(RoceCmFramesTest, NoListenerIsReason8) {
  auto all = frames();
  const CmMad req_mad = decode_frame(all[42]);
  const CmReq& req = std::get<CmReq>(req_mad.body);
  EXPECT_EQ(req.service_id, service_id(PortSpace::kTcp, 7999));
  EXPECT_EQ(req.local_qpn, 0x12u);
  EXPECT_EQ(req.starting_psn, 0xfbbdb8u);
  const CmMad rej_mad = decode_frame(all[43]);
  const CmRej& rej = std::get<CmRej>(rej_mad.body);
  EXPECT_EQ(rej_mad.hdr.tid, req_mad.hdr.tid);
  EXPECT_EQ(rej.local_comm_id, 0u);
  EXPECT_EQ(rej.remote_comm_id, req.local_comm_id);
  EXPECT_EQ(rej.message_rejected, kCmRespReq);
  EXPECT_EQ(rej.reason, kRejInvalidServiceId);
  EXPECT_EQ(rej.ari_length, 0);
  EXPECT_EQ(rej.private_data, decltype(rej.private_data){});
}

// cm_peer: a REQ with 41 bytes of the application's private data after the rdma_cm header;
// the listener's rdma_reject: reason 28 with its private data.
TEST(RoceCmFramesTest, ConsumerRejectIsReason28WithPrivateData) {
  auto all = frames();
  const CmMad req_mad = decode_frame(all[44]);
  const CmReq& req = std::get<CmReq>(req_mad.body);
  EXPECT_EQ(req.service_id, service_id(PortSpace::kTcp, 7472));
  EXPECT_EQ(req.local_qpn, 0x13u);
  EXPECT_EQ(req.starting_psn, 0xb30403u);
  EXPECT_EQ(req.responder_resources, 2);  // cm_peer's rdma_conn_param
  EXPECT_EQ(req.initiator_depth, 2);
  EXPECT_EQ(req.retry_count, 5);
  EXPECT_EQ(req.rnr_retry_count, 6);
  CmaHeader cma;
  ASSERT_EQ(decode_cma_header(req.private_data.data(), req.private_data.size(), &cma),
            CmaError::kOk);
  EXPECT_EQ(cma.src_port, 0x816f);
  EXPECT_EQ(text(req.private_data, kCmaHeaderBytes), "softverbs: REQ private data from cm_peer");
  const CmMad rej_mad = decode_frame(all[45]);
  const CmRej& rej = std::get<CmRej>(rej_mad.body);
  EXPECT_EQ(rej_mad.hdr.tid, req_mad.hdr.tid);
  EXPECT_EQ(rej.local_comm_id, 0x1e0556bfu);  // the listener had an id for the request
  EXPECT_EQ(rej.remote_comm_id, req.local_comm_id);
  EXPECT_EQ(rej.message_rejected, kCmRespReq);
  EXPECT_EQ(rej.reason, kRejConsumerDefined);
  EXPECT_EQ(rej.ari_length, 0);
  EXPECT_EQ(text(rej.private_data), "softverbs: rejected by cm_peer");
}

// The listener (rping -s, stopped) does not answer: the REQ is resent unchanged after the
// CM response timeout, the listener's CM answers the duplicate with an MRA (service timeout
// 24, rdma_cm's CMA_CM_MRA_SETTING), and the REP follows once the listener runs again.
TEST(RoceCmFramesTest, DuplicateReqGetsAnMra) {
  auto all = frames();
  const CmMad first = decode_frame(all[46]);
  const CmMad again = decode_frame(all[47]);
  EXPECT_EQ(first.hdr.tid, again.hdr.tid);
  const CmReq& req = std::get<CmReq>(first.body);
  EXPECT_EQ(req.service_id, service_id(PortSpace::kTcp, 7473));
  uint8_t a[kMadBytes], b[kMadBytes];
  ASSERT_TRUE(encode_cm(first, a));
  ASSERT_TRUE(encode_cm(again, b));
  EXPECT_EQ(memcmp(a, b, kMadBytes), 0);
  const CmMad mra_mad = decode_frame(all[48]);
  const CmMra& mra = std::get<CmMra>(mra_mad.body);
  EXPECT_EQ(mra_mad.hdr.tid, first.hdr.tid);
  EXPECT_EQ(mra.local_comm_id, 0x130556bfu);
  EXPECT_EQ(mra.remote_comm_id, req.local_comm_id);
  EXPECT_EQ(mra.message_mraed, kCmRespReq);
  EXPECT_EQ(mra.service_timeout, 24);
  const CmMad rep_mad = decode_frame(all[49]);
  const CmRep& rep = std::get<CmRep>(rep_mad.body);
  EXPECT_EQ(rep.local_comm_id, mra.local_comm_id);
  EXPECT_EQ(rep.local_qpn, 0x12u);
  EXPECT_EQ(rep.starting_psn, 0xc1cde7u);
  EXPECT_EQ(std::get<CmRtu>(decode_frame(all[50]).body).remote_comm_id, rep.local_comm_id);
  EXPECT_EQ(std::get<CmDreq>(decode_frame(all[63]).body).remote_qpn, 0x12u);
  EXPECT_EQ(std::get<CmDrep>(decode_frame(all[64]).body).remote_comm_id, req.local_comm_id);
}

// udaddy: a SIDR_REQ before the server runs (status 1: no listener), then one it answers
// with its UD QPN and rdma_cm's Q_Key.
TEST(RoceCmFramesTest, SidrResolvesTheUdQp) {
  auto all = frames();
  for (int n : {65, 67}) {
    const CmMad req_mad = decode_frame(all[n]);
    const CmSidrReq& req = std::get<CmSidrReq>(req_mad.body);
    PortSpace ps;
    uint16_t port;
    ASSERT_TRUE(parse_service_id(req.service_id, &ps, &port));
    EXPECT_EQ(ps, PortSpace::kUdp);
    EXPECT_EQ(port, 7174);
    EXPECT_EQ(req.pkey, 0xffff);
    CmaHeader cma;
    ASSERT_EQ(decode_cma_header(req.private_data.data(), req.private_data.size(), &cma),
              CmaError::kOk);
    EXPECT_EQ(cma.ip_version, 4);
    EXPECT_EQ(cma.src_addr, cma_ipv4(10, 9, 0, 2));
    EXPECT_EQ(cma.dst_addr, cma_ipv4(10, 9, 0, 1));
  }
  const CmMad no_mad = decode_frame(all[66]);
  const CmSidrRep& no = std::get<CmSidrRep>(no_mad.body);
  EXPECT_EQ(no.request_id, std::get<CmSidrReq>(decode_frame(all[65]).body).request_id);
  EXPECT_EQ(no.status, kSidrUnsupported);
  EXPECT_EQ(no.qpn, 0u);
  EXPECT_EQ(no.qkey, 0u);
  EXPECT_EQ(no.service_id, service_id(PortSpace::kUdp, 7174));
  const CmMad req_mad = decode_frame(all[67]);
  const CmMad yes_mad = decode_frame(all[68]);
  const CmSidrRep& yes = std::get<CmSidrRep>(yes_mad.body);
  EXPECT_EQ(yes_mad.hdr.tid, req_mad.hdr.tid);
  EXPECT_EQ(yes.request_id, std::get<CmSidrReq>(req_mad.body).request_id);
  EXPECT_EQ(yes.status, kSidrSuccess);
  EXPECT_EQ(yes.info_length, 0);
  EXPECT_EQ(yes.qpn, 0x13u);
  EXPECT_EQ(yes.qkey, 0x01234567u);  // RDMA_UDP_QKEY
  EXPECT_EQ(yes.service_id, service_id(PortSpace::kUdp, 7174));
  EXPECT_EQ(yes.vendor_id, 0u);
}

// rping over IPv6: the GIDs are the addresses, the rdma_cm header says IP version 6. The
// listener's rdma_cm refused the request (its address check fails in this policy-routed
// setup), so its CM rejected it with reason 28 and, like for no listener, comm ID 0.
TEST(RoceCmFramesTest, Ipv6RequestAndReason28) {
  auto all = frames();
  const CmMad req_mad = decode_frame(all[71]);
  const CmReq& req = std::get<CmReq>(req_mad.body);
  EXPECT_EQ(req.service_id, service_id(PortSpace::kTcp, 7474));
  EXPECT_EQ(req.primary.local_gid, ipv6(2));
  EXPECT_EQ(req.primary.remote_gid, ipv6(1));
  EXPECT_EQ(req.primary.hop_limit, 64);
  EXPECT_EQ(req.primary.flow_label, 0x2f4f7u);
  CmaHeader cma;
  ASSERT_EQ(decode_cma_header(req.private_data.data(), req.private_data.size(), &cma),
            CmaError::kOk);
  EXPECT_EQ(cma.ip_version, 6);
  EXPECT_EQ(cma.src_port, 0x9b9b);
  EXPECT_EQ(cma.src_addr, ipv6(2));
  EXPECT_EQ(cma.dst_addr, ipv6(1));
  uint8_t again[kCmaHeaderBytes];
  ASSERT_TRUE(encode_cma_header(cma, again));
  EXPECT_EQ(memcmp(again, req.private_data.data(), kCmaHeaderBytes), 0);
  const CmMad rej_mad = decode_frame(all[72]);
  const CmRej& rej = std::get<CmRej>(rej_mad.body);
  EXPECT_EQ(rej.reason, kRejConsumerDefined);
  EXPECT_EQ(rej.local_comm_id, 0u);
  EXPECT_EQ(rej.remote_comm_id, req.local_comm_id);
}

}  // namespace
// A host with no CM process answers statelessly (cm_stateless_answer, decision 0007): a REQ
// nobody listens on gets the REJ rxe sent for the same REQ (frames 42, 43), a DREQ the DREP
// rxe sent (frames 40, 41, the same IDs a connection would give); cm_request_service reads
// the service ID the decoder reads. Answers, and anything cut short, get nothing.
TEST(RoceCmFramesTest, StatelessAnswersAreWhatRxeSent) {
  auto all = frames();
  auto mad_of = [](const Frame& f) {
    Gmp g;
    const uint8_t* mad = nullptr;
    EXPECT_EQ(decode_gmp(f.dgram, f.len, &g, &mad), GmpError::kOk) << f.what;
    return mad;
  };
  uint8_t out[kMadBytes];
  for (auto [request, answer] : {std::pair{42, 43}, std::pair{40, 41}}) {
    ASSERT_TRUE(cm_stateless_answer(mad_of(all[request]), kMadBytes, out)) << request;
    CmMad got;
    ASSERT_EQ(decode_cm(out, kMadBytes, &got), CmError::kOk);
    EXPECT_EQ(got, decode_frame(all[answer])) << request;
    EXPECT_FALSE(cm_stateless_answer(mad_of(all[answer]), kMadBytes, out)) << answer;
    EXPECT_FALSE(cm_stateless_answer(mad_of(all[request]), kMadBytes - 1, out)) << request;
  }
  uint64_t sid = 0;
  EXPECT_TRUE(cm_request_service(mad_of(all[42]), kMadBytes, &sid));
  EXPECT_EQ(sid, service_id(PortSpace::kTcp, 7999));
  EXPECT_FALSE(cm_request_service(mad_of(all[43]), kMadBytes, &sid));
  EXPECT_FALSE(cm_request_service(mad_of(all[42]), kMadBytes - 1, &sid));
}

}  // namespace softverbs::wire::roce

