// The MAD header and the GMP's RoCE v2 framing (mad.hpp).
#include "wire/roce/mad.hpp"

#include "wire/roce/bytes.hpp"

namespace softverbs::wire::roce {

void encode_mad_header(const MadHeader& h, uint8_t* mad) {
  mad[0] = h.base_version;
  mad[1] = h.mgmt_class;
  mad[2] = h.class_version;
  mad[3] = h.method;
  put16(mad + 4, h.status);
  put16(mad + 6, h.class_specific);
  put64(mad + 8, h.tid);
  put16(mad + 16, h.attr_id);
  put16(mad + 18, 0);  // reserved
  put32(mad + 20, h.attr_mod);
}

MadHeader decode_mad_header(const uint8_t* mad) {
  MadHeader h;
  h.base_version = mad[0];
  h.mgmt_class = mad[1];
  h.class_version = mad[2];
  h.method = mad[3];
  h.status = uint16_t(get16(mad + 4));
  h.class_specific = uint16_t(get16(mad + 6));
  h.tid = get64(mad + 8);
  h.attr_id = uint16_t(get16(mad + 16));
  h.attr_mod = get32(mad + 20);
  return h;
}

MadHeader mad_error_response(const MadHeader& request, uint16_t status) {
  MadHeader h = request;
  h.method = kMadGetResp;
  h.status = status;
  return h;
}

size_t encode_gmp(const Gmp& g, const uint8_t* mad, uint8_t* out, size_t cap) {
  Packet p;
  p.opcode = kUd | kSendOnly;
  p.pkey = g.pkey;
  p.dest_qp = g.dest_qp;
  p.ack_req = g.ack_req;
  p.psn = g.psn;
  p.qkey = g.qkey;
  p.src_qp = g.src_qp;
  return encode(p, mad, kMadBytes, out, cap);
}

const char* gmp_error_name(GmpError e) {
  switch (e) {
    case GmpError::kOk: return "ok";
    case GmpError::kMalformed: return "malformed datagram";
    case GmpError::kNotUdSend: return "not a UD SEND_ONLY";
    case GmpError::kNotQp1: return "not for QP1";
    case GmpError::kBadQkey: return "Q_Key is not QP1's";
    case GmpError::kBadLength: return "payload is not one 256-byte MAD";
  }
  return "?";
}

GmpError decode_gmp(const uint8_t* dgram, size_t len, Gmp* g, const uint8_t** mad) {
  Packet p;
  if (!decode(dgram, len, &p)) return GmpError::kMalformed;
  if (p.opcode != (kUd | kSendOnly)) return GmpError::kNotUdSend;
  if (p.dest_qp != kGsiQpn) return GmpError::kNotQp1;
  if (p.qkey != kGsiQkey) return GmpError::kBadQkey;
  if (p.payload_len != kMadBytes) return GmpError::kBadLength;
  g->pkey = p.pkey;
  g->dest_qp = p.dest_qp;
  g->src_qp = p.src_qp;
  g->qkey = p.qkey;
  g->psn = p.psn;
  g->ack_req = p.ack_req;
  *mad = p.payload;
  return GmpError::kOk;
}

}  // namespace softverbs::wire::roce
