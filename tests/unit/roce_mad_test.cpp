// The MAD/CM codec on made-up messages: every field at the bit position of the kernel's
// IBA tables (include/rdma/ibta_vol1_c12.h), round trips, every error, and a fuzz with a
// fixed seed (random bytes, truncations, bit flips never crash; run it under ASan). The
// same codec against frames Linux rxe sent: roce_cm_frames_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "wire/roce/cm_msg.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/mad.hpp"

namespace softverbs::wire::roce {
namespace {

std::vector<uint8_t> encoded(const CmBody& body, uint64_t tid = 0x1122334455667788) {
  std::vector<uint8_t> mad(kMadBytes);
  EXPECT_TRUE(encode_cm(CmMad{cm_header(tid), body}, mad.data()));
  return mad;
}

// The bits (MAD data offsets, bit 0 = MSB of byte 0) that are set in a MAD's data.
std::vector<unsigned> set_bits(const std::vector<uint8_t>& mad) {
  std::vector<unsigned> bits;
  for (unsigned i = 0; i < kMadDataBytes * 8; ++i) {
    if (mad[kMadHeaderBytes + i / 8] & (0x80 >> (i % 8))) bits.push_back(i);
  }
  return bits;
}

struct Position {
  const char* name;
  std::function<void(CmBody&)> fill;  // sets one field to all ones
  unsigned byte, bit, width;          // where the kernel's table puts it
};

// One field at a time at its maximum: exactly its bits are set, nothing else. The expected
// positions are written from the kernel's tables, independently of cm_msg.cpp's.
TEST(RoceMadTest, EveryFieldAtItsBitPosition) {
  const std::vector<Position> positions = {
      {"REQ local comm ID", [](CmBody& b) { std::get<CmReq>(b).local_comm_id = ~0u; }, 0, 0, 32},
      {"REQ vendor ID", [](CmBody& b) { std::get<CmReq>(b).vendor_id = 0xffffff; }, 5, 0, 24},
      {"REQ service ID", [](CmBody& b) { std::get<CmReq>(b).service_id = ~0ull; }, 8, 0, 64},
      {"REQ CA GUID", [](CmBody& b) { std::get<CmReq>(b).local_ca_guid = ~0ull; }, 16, 0, 64},
      {"REQ Q_Key", [](CmBody& b) { std::get<CmReq>(b).local_qkey = ~0u; }, 28, 0, 32},
      {"REQ QPN", [](CmBody& b) { std::get<CmReq>(b).local_qpn = 0xffffff; }, 32, 0, 24},
      {"REQ resp res", [](CmBody& b) { std::get<CmReq>(b).responder_resources = 0xff; }, 35, 0, 8},
      {"REQ EECN", [](CmBody& b) { std::get<CmReq>(b).local_eecn = 0xffffff; }, 36, 0, 24},
      {"REQ init depth", [](CmBody& b) { std::get<CmReq>(b).initiator_depth = 0xff; }, 39, 0, 8},
      {"REQ remote EECN", [](CmBody& b) { std::get<CmReq>(b).remote_eecn = 0xffffff; }, 40, 0, 24},
      {"REQ remote CM timeout",
       [](CmBody& b) { std::get<CmReq>(b).remote_cm_response_timeout = 31; }, 43, 0, 5},
      {"REQ transport", [](CmBody& b) { std::get<CmReq>(b).transport_service_type = 3; }, 43, 5, 2},
      {"REQ EEFC", [](CmBody& b) { std::get<CmReq>(b).end_to_end_flow_control = true; }, 43, 7, 1},
      {"REQ PSN", [](CmBody& b) { std::get<CmReq>(b).starting_psn = 0xffffff; }, 44, 0, 24},
      {"REQ local CM timeout",
       [](CmBody& b) { std::get<CmReq>(b).local_cm_response_timeout = 31; }, 47, 0, 5},
      {"REQ retry", [](CmBody& b) { std::get<CmReq>(b).retry_count = 7; }, 47, 5, 3},
      {"REQ P_Key", [](CmBody& b) { std::get<CmReq>(b).pkey = 0xffff; }, 48, 0, 16},
      {"REQ MTU", [](CmBody& b) { std::get<CmReq>(b).path_mtu = 15; }, 50, 0, 4},
      {"REQ RDC", [](CmBody& b) { std::get<CmReq>(b).rdc_exists = true; }, 50, 4, 1},
      {"REQ RNR retry", [](CmBody& b) { std::get<CmReq>(b).rnr_retry_count = 7; }, 50, 5, 3},
      {"REQ max CM retries", [](CmBody& b) { std::get<CmReq>(b).max_cm_retries = 15; }, 51, 0, 4},
      {"REQ SRQ", [](CmBody& b) { std::get<CmReq>(b).srq = true; }, 51, 4, 1},
      {"REQ ext transport",
       [](CmBody& b) { std::get<CmReq>(b).extended_transport_type = 7; }, 51, 5, 3},
      {"REQ pri local LID", [](CmBody& b) { std::get<CmReq>(b).primary.local_lid = 0xffff; }, 52, 0, 16},
      {"REQ pri remote LID",
       [](CmBody& b) { std::get<CmReq>(b).primary.remote_lid = 0xffff; }, 54, 0, 16},
      {"REQ pri local GID",
       [](CmBody& b) { std::get<CmReq>(b).primary.local_gid.fill(0xff); }, 56, 0, 128},
      {"REQ pri remote GID",
       [](CmBody& b) { std::get<CmReq>(b).primary.remote_gid.fill(0xff); }, 72, 0, 128},
      {"REQ pri flow label",
       [](CmBody& b) { std::get<CmReq>(b).primary.flow_label = 0xfffff; }, 88, 0, 20},
      {"REQ pri rate", [](CmBody& b) { std::get<CmReq>(b).primary.packet_rate = 63; }, 91, 2, 6},
      {"REQ pri TC", [](CmBody& b) { std::get<CmReq>(b).primary.traffic_class = 0xff; }, 92, 0, 8},
      {"REQ pri hop limit", [](CmBody& b) { std::get<CmReq>(b).primary.hop_limit = 0xff; }, 93, 0, 8},
      {"REQ pri SL", [](CmBody& b) { std::get<CmReq>(b).primary.sl = 15; }, 94, 0, 4},
      {"REQ pri subnet local",
       [](CmBody& b) { std::get<CmReq>(b).primary.subnet_local = true; }, 94, 4, 1},
      {"REQ pri ACK timeout",
       [](CmBody& b) { std::get<CmReq>(b).primary.local_ack_timeout = 31; }, 95, 0, 5},
      {"REQ alt local LID",
       [](CmBody& b) { std::get<CmReq>(b).alternate.local_lid = 0xffff; }, 96, 0, 16},
      {"REQ alt remote GID",
       [](CmBody& b) { std::get<CmReq>(b).alternate.remote_gid.fill(0xff); }, 116, 0, 128},
      {"REQ alt flow label",
       [](CmBody& b) { std::get<CmReq>(b).alternate.flow_label = 0xfffff; }, 132, 0, 20},
      {"REQ alt rate", [](CmBody& b) { std::get<CmReq>(b).alternate.packet_rate = 63; }, 135, 2, 6},
      {"REQ alt ACK timeout",
       [](CmBody& b) { std::get<CmReq>(b).alternate.local_ack_timeout = 31; }, 139, 0, 5},
      {"REQ SAP", [](CmBody& b) { std::get<CmReq>(b).sap_supported = true; }, 139, 5, 1},
      {"REQ private data",
       [](CmBody& b) { std::get<CmReq>(b).private_data.fill(0xff); }, 140, 0, 92 * 8},
      {"MRA message", [](CmBody& b) { std::get<CmMra>(b).message_mraed = 3; }, 8, 0, 2},
      {"MRA timeout", [](CmBody& b) { std::get<CmMra>(b).service_timeout = 31; }, 9, 0, 5},
      {"MRA private data",
       [](CmBody& b) { std::get<CmMra>(b).private_data.fill(0xff); }, 10, 0, 222 * 8},
      {"REJ message", [](CmBody& b) { std::get<CmRej>(b).message_rejected = 3; }, 8, 0, 2},
      {"REJ ARI length", [](CmBody& b) { std::get<CmRej>(b).ari_length = 127; }, 9, 0, 7},
      {"REJ reason", [](CmBody& b) { std::get<CmRej>(b).reason = 0xffff; }, 10, 0, 16},
      {"REJ ARI", [](CmBody& b) { std::get<CmRej>(b).ari.fill(0xff); }, 12, 0, 72 * 8},
      {"REJ private data",
       [](CmBody& b) { std::get<CmRej>(b).private_data.fill(0xff); }, 84, 0, 148 * 8},
      {"REP Q_Key", [](CmBody& b) { std::get<CmRep>(b).local_qkey = ~0u; }, 8, 0, 32},
      {"REP QPN", [](CmBody& b) { std::get<CmRep>(b).local_qpn = 0xffffff; }, 12, 0, 24},
      {"REP EECN", [](CmBody& b) { std::get<CmRep>(b).local_eecn = 0xffffff; }, 16, 0, 24},
      {"REP PSN", [](CmBody& b) { std::get<CmRep>(b).starting_psn = 0xffffff; }, 20, 0, 24},
      {"REP vendor ID high", [](CmBody& b) { std::get<CmRep>(b).vendor_id = 0xff0000; }, 15, 0, 8},
      {"REP vendor ID middle", [](CmBody& b) { std::get<CmRep>(b).vendor_id = 0xff00; }, 19, 0, 8},
      {"REP vendor ID low", [](CmBody& b) { std::get<CmRep>(b).vendor_id = 0xff; }, 23, 0, 8},
      {"REP resp res", [](CmBody& b) { std::get<CmRep>(b).responder_resources = 0xff; }, 24, 0, 8},
      {"REP init depth", [](CmBody& b) { std::get<CmRep>(b).initiator_depth = 0xff; }, 25, 0, 8},
      {"REP target ACK delay", [](CmBody& b) { std::get<CmRep>(b).target_ack_delay = 31; }, 26, 0, 5},
      {"REP failover", [](CmBody& b) { std::get<CmRep>(b).failover_accepted = 3; }, 26, 5, 2},
      {"REP EEFC", [](CmBody& b) { std::get<CmRep>(b).end_to_end_flow_control = true; }, 26, 7, 1},
      {"REP RNR retry", [](CmBody& b) { std::get<CmRep>(b).rnr_retry_count = 7; }, 27, 0, 3},
      {"REP SRQ", [](CmBody& b) { std::get<CmRep>(b).srq = true; }, 27, 3, 1},
      {"REP CA GUID", [](CmBody& b) { std::get<CmRep>(b).local_ca_guid = ~0ull; }, 28, 0, 64},
      {"REP private data",
       [](CmBody& b) { std::get<CmRep>(b).private_data.fill(0xff); }, 36, 0, 196 * 8},
      {"RTU remote comm ID", [](CmBody& b) { std::get<CmRtu>(b).remote_comm_id = ~0u; }, 4, 0, 32},
      {"RTU private data",
       [](CmBody& b) { std::get<CmRtu>(b).private_data.fill(0xff); }, 8, 0, 224 * 8},
      {"DREQ remote QPN", [](CmBody& b) { std::get<CmDreq>(b).remote_qpn = 0xffffff; }, 8, 0, 24},
      {"DREQ private data",
       [](CmBody& b) { std::get<CmDreq>(b).private_data.fill(0xff); }, 12, 0, 220 * 8},
      {"DREP private data",
       [](CmBody& b) { std::get<CmDrep>(b).private_data.fill(0xff); }, 8, 0, 224 * 8},
      {"SIDR_REQ request ID", [](CmBody& b) { std::get<CmSidrReq>(b).request_id = ~0u; }, 0, 0, 32},
      {"SIDR_REQ P_Key", [](CmBody& b) { std::get<CmSidrReq>(b).pkey = 0xffff; }, 4, 0, 16},
      {"SIDR_REQ service ID",
       [](CmBody& b) { std::get<CmSidrReq>(b).service_id = ~0ull; }, 8, 0, 64},
      {"SIDR_REQ private data",
       [](CmBody& b) { std::get<CmSidrReq>(b).private_data.fill(0xff); }, 16, 0, 216 * 8},
      {"SIDR_REP status", [](CmBody& b) { std::get<CmSidrRep>(b).status = 0xff; }, 4, 0, 8},
      {"SIDR_REP info length", [](CmBody& b) { std::get<CmSidrRep>(b).info_length = 72; }, 5, 1, 4},
      {"SIDR_REP vendor ID high",
       [](CmBody& b) { std::get<CmSidrRep>(b).vendor_id = 0xffff00; }, 6, 0, 16},
      {"SIDR_REP QPN", [](CmBody& b) { std::get<CmSidrRep>(b).qpn = 0xffffff; }, 8, 0, 24},
      {"SIDR_REP vendor ID low", [](CmBody& b) { std::get<CmSidrRep>(b).vendor_id = 0xff; }, 11, 0, 8},
      {"SIDR_REP service ID",
       [](CmBody& b) { std::get<CmSidrRep>(b).service_id = ~0ull; }, 12, 0, 64},
      {"SIDR_REP Q_Key", [](CmBody& b) { std::get<CmSidrRep>(b).qkey = ~0u; }, 20, 0, 32},
      {"SIDR_REP info", [](CmBody& b) { std::get<CmSidrRep>(b).info.fill(0xff); }, 24, 0, 72 * 8},
      {"SIDR_REP private data",
       [](CmBody& b) { std::get<CmSidrRep>(b).private_data.fill(0xff); }, 96, 0, 136 * 8},
  };
  for (const Position& p : positions) {
    CmBody body;
    const std::string name = p.name;
    const auto kind = name.substr(0, name.find(' '));
    if (kind == "MRA") body = CmMra{};
    if (kind == "REJ") body = CmRej{};
    if (kind == "REP") body = CmRep{};
    if (kind == "RTU") body = CmRtu{};
    if (kind == "DREQ") body = CmDreq{};
    if (kind == "DREP") body = CmDrep{};
    if (kind == "SIDR_REQ") body = CmSidrReq{};
    if (kind == "SIDR_REP") body = CmSidrRep{};
    // Defaults that are not zero on the wire: the P_Keys.
    if (auto* r = std::get_if<CmReq>(&body); r && name != "REQ P_Key") r->pkey = 0;
    if (auto* r = std::get_if<CmSidrReq>(&body); r && name != "SIDR_REQ P_Key") r->pkey = 0;
    p.fill(body);
    std::vector<uint8_t> mad(kMadBytes);
    // Fields with reserved codes or limits do not encode at all ones: write them anyway.
    encode_cm(CmMad{cm_header(0), body}, mad.data());
    std::vector<unsigned> want;
    if (name == "SIDR_REP info length") {
      want = {5 * 8 + 1, 5 * 8 + 4};  // 72 = 0b01001000
    } else {
      for (unsigned i = 0; i < p.width; ++i) want.push_back(p.byte * 8 + p.bit + i);
    }
    EXPECT_EQ(set_bits(mad), want) << p.name;
  }
}

CmBody sample(int kind, std::mt19937& rng) {
  auto r = [&]() { return uint64_t(rng()) << 32 | rng(); };
  auto m = [&](unsigned bits) { return bits == 64 ? r() : r() & ((1ull << bits) - 1); };
  auto fill = [&](auto& a) {
    for (auto& x : a) x = uint8_t(rng());
  };
  auto with_data = [&](auto msg) {
    fill(msg.private_data);
    return CmBody(msg);
  };
  switch (kind) {
    case 0: {
      CmReq q;
      q.local_comm_id = uint32_t(m(32));
      q.vendor_id = uint32_t(m(24));
      q.service_id = m(64);
      q.local_ca_guid = m(64);
      q.local_qkey = uint32_t(m(32));
      q.local_qpn = uint32_t(m(24));
      q.responder_resources = uint8_t(m(8));
      q.starting_psn = uint32_t(m(24));
      q.remote_cm_response_timeout = uint8_t(m(5));
      q.transport_service_type = uint8_t(m(2));
      q.retry_count = uint8_t(m(3));
      q.path_mtu = uint8_t(m(4));
      q.max_cm_retries = uint8_t(m(4));
      q.primary.flow_label = uint32_t(m(20));
      q.primary.packet_rate = uint8_t(m(6));
      q.primary.sl = uint8_t(m(4));
      q.primary.local_ack_timeout = uint8_t(m(5));
      fill(q.primary.local_gid);
      fill(q.alternate.remote_gid);
      q.sap_supported = m(1);
      fill(q.private_data);
      return q;
    }
    case 1: return with_data(CmMra{uint32_t(m(32)), uint32_t(m(32)), uint8_t(m(32) % 3),
                                   uint8_t(m(5)), {}});
    case 2: {
      CmRej j;
      j.local_comm_id = uint32_t(m(32));
      j.message_rejected = uint8_t(m(32) % 3);
      j.ari_length = uint8_t(m(32) % 73);
      j.reason = uint16_t(m(16));
      fill(j.ari);
      fill(j.private_data);
      return j;
    }
    case 3: {
      CmRep p;
      p.remote_comm_id = uint32_t(m(32));
      p.local_qpn = uint32_t(m(24));
      p.local_eecn = uint32_t(m(24));
      p.starting_psn = uint32_t(m(24));
      p.vendor_id = uint32_t(m(24));
      p.target_ack_delay = uint8_t(m(5));
      p.failover_accepted = uint8_t(m(2));
      p.rnr_retry_count = uint8_t(m(3));
      p.srq = m(1);
      p.local_ca_guid = m(64);
      fill(p.private_data);
      return p;
    }
    case 4: return with_data(CmRtu{uint32_t(m(32)), uint32_t(m(32)), {}});
    case 5: return with_data(CmDreq{uint32_t(m(32)), uint32_t(m(32)), uint32_t(m(24)), {}});
    case 6: return with_data(CmDrep{uint32_t(m(32)), uint32_t(m(32)), {}});
    case 7: return with_data(CmSidrReq{uint32_t(m(32)), uint16_t(m(16)), m(64), {}});
    default: {
      CmSidrRep s;
      s.request_id = uint32_t(m(32));
      s.status = uint8_t(m(8));
      s.info_length = uint8_t(m(32) % 73);
      s.vendor_id = uint32_t(m(24));
      s.qpn = uint32_t(m(24));
      s.service_id = m(64);
      s.qkey = uint32_t(m(32));
      fill(s.info);
      fill(s.private_data);
      return s;
    }
  }
}

TEST(RoceMadTest, EveryMessageRoundTrips) {
  std::mt19937 rng(12);
  for (int i = 0; i < 900; ++i) {
    CmMad m{cm_header(uint64_t(rng()) << 32 | rng()), sample(i % 9, rng)};
    m.hdr.attr_id = uint16_t(cm_attr(m.body));
    m.hdr.attr_mod = rng();
    uint8_t mad[kMadBytes];
    ASSERT_TRUE(encode_cm(m, mad)) << i;
    CmMad back;
    ASSERT_EQ(decode_cm(mad, sizeof mad, &back), CmError::kOk) << i;
    EXPECT_TRUE(back == m) << cm_attr_name(m.hdr.attr_id) << " " << i;
  }
}

TEST(RoceMadTest, MadHeaderLayout) {
  MadHeader h;
  h.method = kMadGet;
  h.status = 0x0a0b;
  h.class_specific = 0x0c0d;
  h.tid = 0x0102030405060708;
  h.attr_id = 0x1234;
  h.attr_mod = 0xdeadbeef;
  uint8_t b[kMadHeaderBytes];
  memset(b, 0xee, sizeof b);
  encode_mad_header(h, b);
  const uint8_t want[kMadHeaderBytes] = {1, 7, 2, 1, 0x0a, 0x0b, 0x0c, 0x0d, 1, 2, 3, 4,
                                         5, 6, 7, 8, 0x12, 0x34, 0, 0, 0xde, 0xad, 0xbe, 0xef};
  EXPECT_EQ(memcmp(b, want, sizeof b), 0);
  EXPECT_TRUE(decode_mad_header(b) == h);
}

std::vector<uint8_t> with(std::vector<uint8_t> mad, size_t at, uint8_t value) {
  mad[at] = value;
  return mad;
}

TEST(RoceMadTest, HeaderErrors) {
  const auto rtu = encoded(CmRtu{1, 2, {}});
  CmMad m;
  EXPECT_EQ(decode_cm(rtu.data(), rtu.size(), &m), CmError::kOk);
  EXPECT_EQ(decode_cm(rtu.data(), 255, &m), CmError::kBadLength);
  std::vector<uint8_t> longer = rtu;
  longer.push_back(0);
  EXPECT_EQ(decode_cm(longer.data(), longer.size(), &m), CmError::kBadLength);
  EXPECT_EQ(decode_cm(with(rtu, 0, 2).data(), kMadBytes, &m), CmError::kBadBaseVersion);
  EXPECT_EQ(decode_cm(with(rtu, 1, 0x03).data(), kMadBytes, &m), CmError::kNotCm);  // SA
  EXPECT_EQ(decode_cm(with(rtu, 2, 1).data(), kMadBytes, &m), CmError::kBadClassVersion);
  EXPECT_EQ(decode_cm(with(rtu, 3, kMadGet).data(), kMadBytes, &m), CmError::kBadMethod);
  EXPECT_EQ(decode_cm(with(rtu, 3, kMadSend | kMadResponseBit).data(), kMadBytes, &m),
            CmError::kBadMethod);
  EXPECT_EQ(decode_cm(with(rtu, 17, 0x20).data(), kMadBytes, &m), CmError::kUnknownAttribute);
  EXPECT_EQ(decode_cm(with(rtu, 17, 0x00).data(), kMadBytes, &m), CmError::kUnknownAttribute);
  EXPECT_EQ(decode_cm(with(rtu, 17, 0x19).data(), kMadBytes, &m), CmError::kUnsupported);  // LAP
  EXPECT_EQ(m.hdr.attr_id, uint16_t(CmAttr::kLap));
  EXPECT_EQ(decode_cm(with(rtu, 17, 0x1a).data(), kMadBytes, &m), CmError::kUnsupported);  // APR
  EXPECT_EQ(decode_cm(with(with(rtu, 17, 0x1a), 3, kMadGet).data(), kMadBytes, &m),
            CmError::kBadMethod);
  for (const char* e : {cm_error_name(CmError::kBadMethod), cm_attr_name(0x19), cm_attr_name(7)}) {
    EXPECT_NE(std::string(e), "");
  }
}

// A ClassPortInfo Get is recognised, not served: the answer is a GetResp with status
// "unsupported method/attribute", as the kernel's MAD layer gives for requests no agent takes.
TEST(RoceMadTest, ClassPortInfoGetGetsAnErrorResponse) {
  MadHeader get = cm_header(0xabcdef);
  get.method = kMadGet;
  get.attr_id = uint16_t(CmAttr::kClassPortInfo);
  uint8_t mad[kMadBytes] = {};
  encode_mad_header(get, mad);
  CmMad m;
  ASSERT_EQ(decode_cm(mad, sizeof mad, &m), CmError::kUnsupported);
  ASSERT_TRUE(mad_wants_answer(m.hdr));
  const MadHeader resp = mad_error_response(m.hdr, kMadStatusUnsupportedAttribute);
  EXPECT_EQ(resp.method, kMadGetResp);
  EXPECT_EQ(resp.status, 0x000c);
  EXPECT_EQ(resp.tid, 0xabcdefu);
  EXPECT_EQ(resp.attr_id, 0x0001);
  EXPECT_EQ(resp.mgmt_class, kMgmtClassCm);
  // A GetResp or a Send gets no answer.
  EXPECT_FALSE(mad_wants_answer(resp));
  EXPECT_FALSE(mad_wants_answer(cm_header(1)));
}

TEST(RoceMadTest, FieldErrors) {
  const char* detail = nullptr;
  CmMad m;
  CmRej rej;
  rej.ari_length = 72;
  auto mad = encoded(rej);
  EXPECT_EQ(decode_cm(mad.data(), mad.size(), &m), CmError::kOk);
  mad[kMadHeaderBytes + 9] = 73 << 1;
  EXPECT_EQ(decode_cm(mad.data(), mad.size(), &m, &detail), CmError::kBadField);
  EXPECT_STREQ(detail, "REJ ARI length over 72");
  mad[kMadHeaderBytes + 9] = 0;
  mad[kMadHeaderBytes + 8] = 0xc0;  // message rejected 3
  EXPECT_EQ(decode_cm(mad.data(), mad.size(), &m, &detail), CmError::kBadField);
  mad = encoded(CmMra{});
  mad[kMadHeaderBytes + 8] = 0xc0;
  EXPECT_EQ(decode_cm(mad.data(), mad.size(), &m, &detail), CmError::kBadField);
  mad = encoded(CmSidrRep{});
  mad[kMadHeaderBytes + 5] = 73;
  EXPECT_EQ(decode_cm(mad.data(), mad.size(), &m, &detail), CmError::kBadField);
  EXPECT_STREQ(detail, "SIDR_REP additional information length over 72");
  // Reserved bits are ignored on receipt (IBA: receivers ignore them) and written as 0.
  mad = encoded(CmReq{});
  mad[kMadHeaderBytes + 4] = 0xff;   // the byte before the vendor ID
  mad[kMadHeaderBytes + 90] |= 0x0f;  // reserved bits after the flow label
  ASSERT_EQ(decode_cm(mad.data(), mad.size(), &m), CmError::kOk);
  EXPECT_TRUE(std::get<CmReq>(m.body) == CmReq{});
  EXPECT_EQ(encoded(m.body), encoded(CmReq{}));
}

TEST(RoceMadTest, EncodeRefusesValuesThatDoNotFit) {
  uint8_t mad[kMadBytes];
  CmReq req;
  req.local_qpn = 1u << 24;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), req}, mad));
  req = CmReq{};
  req.primary.flow_label = 1u << 20;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), req}, mad));
  CmRej rej;
  rej.ari_length = 73;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), rej}, mad));
  CmRep rep;
  rep.vendor_id = 1u << 24;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), rep}, mad));
  CmSidrRep srep;
  srep.vendor_id = 1u << 24;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), srep}, mad));
  CmMra mra;
  mra.message_mraed = 3;
  EXPECT_FALSE(encode_cm(CmMad{cm_header(0), mra}, mad));
}

TEST(RoceMadTest, ServiceIds) {
  EXPECT_EQ(service_id(PortSpace::kTcp, 7471), 0x0000000001061d2fu);
  EXPECT_EQ(service_id(PortSpace::kUdp, 7174), 0x0000000001111c06u);
  EXPECT_EQ(service_id(PortSpace::kIb, 1), 0x00000000013f0001u);
  EXPECT_EQ(service_id(PortSpace::kIpoib, 2), 0x0000000000020002u);
  PortSpace ps;
  uint16_t port;
  ASSERT_TRUE(parse_service_id(0x00000000013f1234, &ps, &port));
  EXPECT_EQ(ps, PortSpace::kIb);
  EXPECT_EQ(port, 0x1234);
  ASSERT_TRUE(parse_service_id(0x000000000002ffff, &ps, &port));
  EXPECT_EQ(ps, PortSpace::kIpoib);
  EXPECT_FALSE(parse_service_id(0x0000000001071d2f, &ps, &port));  // no such port space
  EXPECT_FALSE(parse_service_id(0x1000000001061d2f, &ps, &port));  // not rdma_cm's shape
  EXPECT_FALSE(parse_service_id(0x0200000000000001, &ps, &port));  // IB CM assigned IDs
}

TEST(RoceMadTest, CmaHeader) {
  CmaHeader h;
  h.ip_version = 4;
  h.src_port = 0xc80d;
  h.src_addr[12] = 10, h.src_addr[15] = 2;
  h.dst_addr[12] = 10, h.dst_addr[15] = 1;
  uint8_t b[kCmaHeaderBytes];
  ASSERT_TRUE(encode_cma_header(h, b));
  const uint8_t want[kCmaHeaderBytes] = {0, 0x40, 0xc8, 0x0d, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0,    0,    0,    10, 0, 0, 2, 0, 0, 0, 0,
                                         0, 0,    0,    0,    0, 0, 0, 0, 10, 0, 0, 1};
  EXPECT_EQ(memcmp(b, want, sizeof b), 0);
  CmaHeader back;
  ASSERT_EQ(decode_cma_header(b, sizeof b, &back), CmaError::kOk);
  EXPECT_TRUE(back == h);
  // IPv4: what precedes the 4 address bytes is not looked at (the kernel does not), nor the
  // IP version byte's low nibble.
  b[4] = 0xff, b[1] = 0x4f;
  ASSERT_EQ(decode_cma_header(b, sizeof b, &back), CmaError::kOk);
  EXPECT_TRUE(back == h);
  EXPECT_EQ(decode_cma_header(b, kCmaHeaderBytes - 1, &back), CmaError::kTooShort);
  b[0] = 1;
  EXPECT_EQ(decode_cma_header(b, sizeof b, &back), CmaError::kBadVersion);
  b[0] = 0, b[1] = 0x50;
  EXPECT_EQ(decode_cma_header(b, sizeof b, &back), CmaError::kBadIpVersion);
  h.ip_version = 6;
  h.src_addr.fill(0xfd);
  ASSERT_TRUE(encode_cma_header(h, b));
  ASSERT_EQ(decode_cma_header(b, sizeof b, &back), CmaError::kOk);
  EXPECT_TRUE(back == h);
  h.ip_version = 5;
  EXPECT_FALSE(encode_cma_header(h, b));
  EXPECT_STRNE(cma_error_name(CmaError::kBadIpVersion), "?");
}

TEST(RoceMadTest, GmpFraming) {
  const auto mad = encoded(CmRtu{7, 8, {}});
  Gmp g;
  g.psn = 0x123456;
  uint8_t dgram[kGmpDatagramBytes + 8];
  EXPECT_EQ(encode_gmp(g, mad.data(), dgram, kGmpDatagramBytes - 1), 0u);
  ASSERT_EQ(encode_gmp(g, mad.data(), dgram, sizeof dgram), kGmpDatagramBytes);
  // BTH: UD SEND_ONLY, P_Key 0xffff, DestQP 1, AckReq, PSN; DETH: Q_Key, source QP 1.
  const uint8_t head[20] = {0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0x12, 0x34, 0x56,
                            0x80, 0x01, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(memcmp(dgram, head, sizeof head), 0);
  EXPECT_EQ(memcmp(dgram + 20, mad.data(), kMadBytes), 0);
  Gmp back;
  const uint8_t* inner = nullptr;
  ASSERT_EQ(decode_gmp(dgram, kGmpDatagramBytes, &back, &inner), GmpError::kOk);
  EXPECT_TRUE(back == g);
  EXPECT_EQ(inner, dgram + 20);

  auto variant = [&](auto change) {
    Packet p;
    p.opcode = kUd | kSendOnly;
    p.dest_qp = kGsiQpn;
    p.qkey = kGsiQkey;
    p.src_qp = 1;
    uint32_t len = kMadBytes;
    change(p, len);
    std::vector<uint8_t> out(kMaxDatagramBytes);
    std::vector<uint8_t> payload(len);
    out.resize(encode(p, payload.data(), len, out.data(), out.size()));
    return decode_gmp(out.data(), out.size(), &back, &inner);
  };
  EXPECT_EQ(variant([](Packet&, uint32_t&) {}), GmpError::kOk);
  EXPECT_EQ(variant([](Packet& p, uint32_t&) { p.opcode = kRc | kSendOnly; }), GmpError::kNotUdSend);
  EXPECT_EQ(variant([](Packet& p, uint32_t&) { p.opcode = kUd | kSendOnlyImm; }),
            GmpError::kNotUdSend);
  EXPECT_EQ(variant([](Packet& p, uint32_t&) { p.dest_qp = 0; }), GmpError::kNotQp1);  // SMI
  EXPECT_EQ(variant([](Packet& p, uint32_t&) { p.qkey = 0x80010001; }), GmpError::kBadQkey);
  EXPECT_EQ(variant([](Packet&, uint32_t& len) { len = 255; }), GmpError::kBadLength);
  EXPECT_EQ(variant([](Packet&, uint32_t& len) { len = 260; }), GmpError::kBadLength);
  EXPECT_EQ(decode_gmp(dgram, 3, &back, &inner), GmpError::kMalformed);
  EXPECT_STRNE(gmp_error_name(GmpError::kBadQkey), "?");
}

// Decoding reads only [0, len): each input lives in a heap block of exactly its size, so
// that ASan sees any read past it.
void decode_all(const uint8_t* data, size_t len) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[len ? len : 1]);
  if (len) memcpy(copy.get(), data, len);
  Gmp g;
  const uint8_t* mad = nullptr;
  if (decode_gmp(copy.get(), len, &g, &mad) == GmpError::kOk) {
    ASSERT_GE(mad, copy.get());
    ASSERT_LE(mad + kMadBytes, copy.get() + len);
  }
  CmMad m;
  const char* detail = nullptr;
  const CmError e = decode_cm(copy.get(), len, &m, &detail);
  if (e == CmError::kOk) {
    // What decodes re-encodes, and decodes again to the same thing (reserved bits aside).
    uint8_t again[kMadBytes];
    ASSERT_TRUE(encode_cm(m, again));
    CmMad twice;
    ASSERT_EQ(decode_cm(again, sizeof again, &twice), CmError::kOk);
    ASSERT_TRUE(twice == m);
    if (const auto* req = std::get_if<CmReq>(&m.body)) {
      CmaHeader h;
      decode_cma_header(req->private_data.data(), req->private_data.size(), &h);
    }
  } else if (e == CmError::kBadField) {
    ASSERT_NE(detail, nullptr);
  }
  CmaHeader h;
  decode_cma_header(copy.get(), len, &h);
}

TEST(RoceMadTest, FuzzNeverCrashes) {
  std::mt19937 rng(20261124);
  std::vector<uint8_t> buf(kGmpDatagramBytes + 64);
  size_t accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const int mode = i % 4;
    size_t len;
    if (mode == 0) {  // random bytes of any length
      len = rng() % buf.size();
      for (size_t j = 0; j < len; ++j) buf[j] = uint8_t(rng());
    } else {  // a valid CM MAD in a GMP, then damaged
      const auto mad = encoded(sample(int(rng() % 9), rng), rng());
      Gmp g;
      len = encode_gmp(g, mad.data(), buf.data(), buf.size());
      if (mode == 1) len = rng() % (len + 1);  // truncated
      if (mode == 2) {                          // a few flipped bits
        for (int k = 0; k < 1 + int(rng() % 4); ++k) buf[rng() % len] ^= uint8_t(1u << rng() % 8);
      }
      if (mode == 3) {  // random bytes in the MAD body, the header kept
        for (size_t j = 20 + kMadHeaderBytes; j < 20 + kMadBytes; ++j) buf[j] = uint8_t(rng());
      }
    }
    decode_all(buf.data(), len);
    // The MAD alone too, as the GMP layer hands it on.
    if (len >= 20) decode_all(buf.data() + 20, std::min<size_t>(len - 20, kMadBytes + 8));
    CmMad m;
    accepted += len >= 20 + kMadBytes && decode_cm(buf.data() + 20, kMadBytes, &m) == CmError::kOk;
  }
  // The damaged-but-framed inputs mostly still decode: the fuzz reached the bodies.
  EXPECT_GT(accepted, 5000u);
}

}  // namespace
}  // namespace softverbs::wire::roce
