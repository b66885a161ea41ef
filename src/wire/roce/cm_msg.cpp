// CM message bodies, the rdma_cm private-data header and service IDs (cm_msg.hpp).
//
// Each message is one table of its fields at IBA's positions, walked by a reader (decode)
// or a writer (encode), so that the two directions cannot disagree.
#include "wire/roce/cm_msg.hpp"

#include <cstring>

#include "wire/roce/bytes.hpp"

namespace softverbs::wire::roce {
namespace {

// A field of IBA's CM tables: `bits` wide from bit `bit` of byte `byte` of the message (the
// MAD data, after the 24-byte header); bit 0 is the most significant. The constructor is
// consteval so that a field that spans more than 8 bytes is a compile error.
struct Field {
  uint16_t byte;
  uint8_t bit;
  uint8_t bits;
  consteval Field(unsigned at, unsigned first_bit, unsigned width)
      : byte(uint16_t(at)), bit(uint8_t(first_bit)), bits(uint8_t(width)) {
    if (first_bit > 7 || width == 0 || first_bit + width > 64 || at * 8 + first_bit + width >
                                                                     kMadDataBytes * 8) {
      throw "field outside 8 bytes or outside the MAD";
    }
  }
  unsigned span() const { return (bit + bits + 7u) / 8u; }  // bytes it touches
  unsigned shift() const { return span() * 8 - bit - bits; }
  uint64_t mask() const { return bits == 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1; }
};

uint64_t load(const uint8_t* msg, Field f) {
  uint64_t v = 0;
  for (unsigned i = 0; i < f.span(); ++i) v = v << 8 | msg[f.byte + i];
  return v >> f.shift() & f.mask();
}

void store(uint8_t* msg, Field f, uint64_t value) {
  uint64_t v = 0;
  for (unsigned i = 0; i < f.span(); ++i) v = v << 8 | msg[f.byte + i];
  const uint64_t mask = f.mask() << f.shift();
  v = (v & ~mask) | (value << f.shift() & mask);
  for (unsigned i = f.span(); i-- > 0; v >>= 8) msg[f.byte + i] = uint8_t(v);
}

struct Reader {
  const uint8_t* msg;
  template <class T>
  void operator()(T& v, Field f) const {
    v = T(load(msg, f));
  }
  template <size_t N>
  void bytes(std::array<uint8_t, N>& a, unsigned at) const {
    memcpy(a.data(), msg + at, N);
  }
};

// `ok` turns false when a value does not fit its field (it is stored truncated).
struct Writer {
  uint8_t* msg;
  bool ok = true;
  template <class T>
  void operator()(const T& v, Field f) {
    const uint64_t x = uint64_t(v);
    if ((x & ~f.mask()) != 0) ok = false;
    store(msg, f, x);
  }
  template <size_t N>
  void bytes(const std::array<uint8_t, N>& a, unsigned at) {
    memcpy(msg + at, a.data(), N);
  }
};

// REQ's primary path at byte 52 and alternate path at 96 share one layout.
template <unsigned At, class Io>
void path_fields(Io& io, CmPath& p) {
  io(p.local_lid, Field(At, 0, 16));
  io(p.remote_lid, Field(At + 2, 0, 16));
  io.bytes(p.local_gid, At + 4);
  io.bytes(p.remote_gid, At + 20);
  io(p.flow_label, Field(At + 36, 0, 20));  // then 6 reserved bits
  io(p.packet_rate, Field(At + 39, 2, 6));
  io(p.traffic_class, Field(At + 40, 0, 8));
  io(p.hop_limit, Field(At + 41, 0, 8));
  io(p.sl, Field(At + 42, 0, 4));
  io(p.subnet_local, Field(At + 42, 4, 1));
  io(p.local_ack_timeout, Field(At + 43, 0, 5));
}

// The tables, in IBA's order. Gaps are reserved bits, written as 0.
template <class Io>
void fields(Io& io, CmReq& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.vendor_id, Field(5, 0, 24));
  io(m.service_id, Field(8, 0, 64));
  io(m.local_ca_guid, Field(16, 0, 64));
  io(m.local_qkey, Field(28, 0, 32));
  io(m.local_qpn, Field(32, 0, 24));
  io(m.responder_resources, Field(35, 0, 8));
  io(m.local_eecn, Field(36, 0, 24));
  io(m.initiator_depth, Field(39, 0, 8));
  io(m.remote_eecn, Field(40, 0, 24));
  io(m.remote_cm_response_timeout, Field(43, 0, 5));
  io(m.transport_service_type, Field(43, 5, 2));
  io(m.end_to_end_flow_control, Field(43, 7, 1));
  io(m.starting_psn, Field(44, 0, 24));
  io(m.local_cm_response_timeout, Field(47, 0, 5));
  io(m.retry_count, Field(47, 5, 3));
  io(m.pkey, Field(48, 0, 16));
  io(m.path_mtu, Field(50, 0, 4));
  io(m.rdc_exists, Field(50, 4, 1));
  io(m.rnr_retry_count, Field(50, 5, 3));
  io(m.max_cm_retries, Field(51, 0, 4));
  io(m.srq, Field(51, 4, 1));
  io(m.extended_transport_type, Field(51, 5, 3));
  path_fields<52>(io, m.primary);
  path_fields<96>(io, m.alternate);
  io(m.sap_supported, Field(139, 5, 1));
  io.bytes(m.private_data, 140);
}

template <class Io>
void fields(Io& io, CmMra& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io(m.message_mraed, Field(8, 0, 2));
  io(m.service_timeout, Field(9, 0, 5));
  io.bytes(m.private_data, 10);
}

template <class Io>
void fields(Io& io, CmRej& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io(m.message_rejected, Field(8, 0, 2));
  io(m.ari_length, Field(9, 0, 7));
  io(m.reason, Field(10, 0, 16));
  io.bytes(m.ari, 12);
  io.bytes(m.private_data, 84);
}

template <class Io>
void fields(Io& io, CmRep& m) {
  // ECE's vendor ID lives in the reserved byte after each 24-bit number (kernel
  // CM_REP_VENDOR_ID_H/M/L), high byte first.
  uint8_t vendor[3] = {uint8_t(m.vendor_id >> 16), uint8_t(m.vendor_id >> 8),
                       uint8_t(m.vendor_id)};
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io(m.local_qkey, Field(8, 0, 32));
  io(m.local_qpn, Field(12, 0, 24));
  io(vendor[0], Field(15, 0, 8));
  io(m.local_eecn, Field(16, 0, 24));
  io(vendor[1], Field(19, 0, 8));
  io(m.starting_psn, Field(20, 0, 24));
  io(vendor[2], Field(23, 0, 8));
  io(m.responder_resources, Field(24, 0, 8));
  io(m.initiator_depth, Field(25, 0, 8));
  io(m.target_ack_delay, Field(26, 0, 5));
  io(m.failover_accepted, Field(26, 5, 2));
  io(m.end_to_end_flow_control, Field(26, 7, 1));
  io(m.rnr_retry_count, Field(27, 0, 3));
  io(m.srq, Field(27, 3, 1));
  io(m.local_ca_guid, Field(28, 0, 64));
  io.bytes(m.private_data, 36);
  m.vendor_id = uint32_t(vendor[0]) << 16 | uint32_t(vendor[1]) << 8 | vendor[2];
}

template <class Io>
void fields(Io& io, CmRtu& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io.bytes(m.private_data, 8);
}

template <class Io>
void fields(Io& io, CmDreq& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io(m.remote_qpn, Field(8, 0, 24));
  io.bytes(m.private_data, 12);
}

template <class Io>
void fields(Io& io, CmDrep& m) {
  io(m.local_comm_id, Field(0, 0, 32));
  io(m.remote_comm_id, Field(4, 0, 32));
  io.bytes(m.private_data, 8);
}

template <class Io>
void fields(Io& io, CmSidrReq& m) {
  io(m.request_id, Field(0, 0, 32));
  io(m.pkey, Field(4, 0, 16));
  io(m.service_id, Field(8, 0, 64));
  io.bytes(m.private_data, 16);
}

template <class Io>
void fields(Io& io, CmSidrRep& m) {
  // ECE's vendor ID: its high 16 bits at byte 6, its low 8 after the QPN (kernel
  // CM_SIDR_REP_VENDOR_ID_H/L).
  uint32_t vendor_high = m.vendor_id >> 8;
  uint8_t vendor_low = uint8_t(m.vendor_id);
  io(m.request_id, Field(0, 0, 32));
  io(m.status, Field(4, 0, 8));
  io(m.info_length, Field(5, 0, 8));
  io(vendor_high, Field(6, 0, 16));
  io(m.qpn, Field(8, 0, 24));
  io(vendor_low, Field(11, 0, 8));
  io(m.service_id, Field(12, 0, 64));
  io(m.qkey, Field(20, 0, 32));
  io.bytes(m.info, 24);
  io.bytes(m.private_data, 96);
  m.vendor_id = vendor_high << 8 | vendor_low;
}

// Fields whose value makes the message meaningless; nullptr when none. Values a CM answers
// with a REJ are not checked here (cm_msg.hpp).
const char* check(const CmReq&) { return nullptr; }
const char* check(const CmMra& m) {
  return m.message_mraed > kCmRespOther ? "MRA message MRAed is the reserved code 3" : nullptr;
}
const char* check(const CmRej& m) {
  if (m.message_rejected > kCmRespOther) return "REJ message rejected is the reserved code 3";
  if (m.ari_length > kRejAriBytes) return "REJ ARI length over 72";
  return nullptr;
}
const char* check(const CmRep& m) {
  return m.vendor_id >> 24 ? "REP vendor ID over 24 bits" : nullptr;  // only encode can
}
const char* check(const CmRtu&) { return nullptr; }
const char* check(const CmDreq&) { return nullptr; }
const char* check(const CmDrep&) { return nullptr; }
const char* check(const CmSidrReq&) { return nullptr; }
const char* check(const CmSidrRep& m) {
  if (m.info_length > kSidrRepInfoBytes) return "SIDR_REP additional information length over 72";
  return m.vendor_id >> 24 ? "SIDR_REP vendor ID over 24 bits" : nullptr;  // only encode can
}

// The body type of an attribute ID: constructs it in *body; false for LAP, APR,
// ClassPortInfo and unknown IDs.
bool body_for(uint16_t attr_id, CmBody* body) {
  switch (CmAttr(attr_id)) {
    case CmAttr::kReq: body->emplace<CmReq>(); return true;
    case CmAttr::kMra: body->emplace<CmMra>(); return true;
    case CmAttr::kRej: body->emplace<CmRej>(); return true;
    case CmAttr::kRep: body->emplace<CmRep>(); return true;
    case CmAttr::kRtu: body->emplace<CmRtu>(); return true;
    case CmAttr::kDreq: body->emplace<CmDreq>(); return true;
    case CmAttr::kDrep: body->emplace<CmDrep>(); return true;
    case CmAttr::kSidrReq: body->emplace<CmSidrReq>(); return true;
    case CmAttr::kSidrRep: body->emplace<CmSidrRep>(); return true;
    case CmAttr::kClassPortInfo:
    case CmAttr::kLap:
    case CmAttr::kApr: return false;
  }
  return false;
}

}  // namespace

CmAttr cm_attr(const CmBody& body) {
  static constexpr CmAttr kByIndex[] = {CmAttr::kReq,  CmAttr::kMra,     CmAttr::kRej,
                                        CmAttr::kRep,  CmAttr::kRtu,     CmAttr::kDreq,
                                        CmAttr::kDrep, CmAttr::kSidrReq, CmAttr::kSidrRep};
  static_assert(std::size(kByIndex) == std::variant_size_v<CmBody>);
  return kByIndex[body.index()];
}

const char* cm_attr_name(uint16_t attr_id) {
  switch (CmAttr(attr_id)) {
    case CmAttr::kClassPortInfo: return "ClassPortInfo";
    case CmAttr::kReq: return "REQ";
    case CmAttr::kMra: return "MRA";
    case CmAttr::kRej: return "REJ";
    case CmAttr::kRep: return "REP";
    case CmAttr::kRtu: return "RTU";
    case CmAttr::kDreq: return "DREQ";
    case CmAttr::kDrep: return "DREP";
    case CmAttr::kSidrReq: return "SIDR_REQ";
    case CmAttr::kSidrRep: return "SIDR_REP";
    case CmAttr::kLap: return "LAP";
    case CmAttr::kApr: return "APR";
  }
  return "?";
}

const char* cm_error_name(CmError e) {
  switch (e) {
    case CmError::kOk: return "ok";
    case CmError::kBadLength: return "not a 256-byte MAD";
    case CmError::kBadBaseVersion: return "MAD base version not 1";
    case CmError::kNotCm: return "not the CM management class";
    case CmError::kBadClassVersion: return "CM class version not 2";
    case CmError::kBadMethod: return "method not allowed for this attribute";
    case CmError::kUnknownAttribute: return "unknown CM attribute";
    case CmError::kUnsupported: return "CM attribute not supported (LAP, APR, ClassPortInfo)";
    case CmError::kBadField: return "field out of range";
  }
  return "?";
}

CmError decode_cm(const uint8_t* mad, size_t len, CmMad* out, const char** detail) {
  if (len != kMadBytes) return CmError::kBadLength;
  out->hdr = decode_mad_header(mad);
  const MadHeader& h = out->hdr;
  if (h.base_version != kMadBaseVersion) return CmError::kBadBaseVersion;
  if (h.mgmt_class != kMgmtClassCm) return CmError::kNotCm;
  if (h.class_version != kCmClassVersion) return CmError::kBadClassVersion;
  const CmAttr attr = CmAttr(h.attr_id);
  if (attr == CmAttr::kClassPortInfo) return CmError::kUnsupported;  // any method
  if (!body_for(h.attr_id, &out->body)) {
    if (attr != CmAttr::kLap && attr != CmAttr::kApr) return CmError::kUnknownAttribute;
    return h.method == kMadSend ? CmError::kUnsupported : CmError::kBadMethod;
  }
  if (h.method != kMadSend) return CmError::kBadMethod;
  const Reader r{mad + kMadHeaderBytes};
  const char* bad = std::visit(
      [&](auto& body) {
        fields(r, body);
        return check(body);
      },
      out->body);
  if (bad == nullptr) return CmError::kOk;
  if (detail != nullptr) *detail = bad;
  return CmError::kBadField;
}

bool encode_cm(const CmMad& m, uint8_t out[kMadBytes]) {
  MadHeader h = m.hdr;
  h.attr_id = uint16_t(cm_attr(m.body));
  encode_mad_header(h, out);
  memset(out + kMadHeaderBytes, 0, kMadDataBytes);
  Writer w{out + kMadHeaderBytes};
  CmBody body = m.body;  // the tables take non-const bodies; the writer only reads them
  const char* bad = std::visit(
      [&](auto& b) {
        const char* why = check(b);  // before the tables rebuild split fields (REP's vendor ID)
        fields(w, b);
        return why;
      },
      body);
  return w.ok && bad == nullptr;
}

bool parse_service_id(uint64_t sid, PortSpace* ps, uint16_t* port) {
  if (sid >> 32 != 0) return false;
  switch (PortSpace(sid >> 16)) {
    case PortSpace::kIpoib:
    case PortSpace::kTcp:
    case PortSpace::kUdp:
    case PortSpace::kIb:
      *ps = PortSpace(sid >> 16);
      *port = uint16_t(sid);
      return true;
  }
  return false;
}

const char* cma_error_name(CmaError e) {
  switch (e) {
    case CmaError::kOk: return "ok";
    case CmaError::kTooShort: return "private data shorter than the rdma_cm header";
    case CmaError::kBadVersion: return "rdma_cm header version not 0";
    case CmaError::kBadIpVersion: return "rdma_cm header IP version neither 4 nor 6";
  }
  return "?";
}

CmaError decode_cma_header(const uint8_t* private_data, size_t len, CmaHeader* out) {
  if (len < kCmaHeaderBytes) return CmaError::kTooShort;
  if (private_data[0] != kCmaVersion) return CmaError::kBadVersion;
  const uint8_t ip_version = private_data[1] >> 4;
  if (ip_version != 4 && ip_version != 6) return CmaError::kBadIpVersion;
  out->ip_version = ip_version;
  out->src_port = uint16_t(get16(private_data + 2));
  memcpy(out->src_addr.data(), private_data + 4, 16);
  memcpy(out->dst_addr.data(), private_data + 20, 16);
  if (ip_version == 4) {  // only the last 4 bytes count; the kernel never reads the rest
    memset(out->src_addr.data(), 0, 12);
    memset(out->dst_addr.data(), 0, 12);
  }
  return CmaError::kOk;
}

bool encode_cma_header(const CmaHeader& h, uint8_t* out) {
  if (h.ip_version != 4 && h.ip_version != 6) return false;
  out[0] = kCmaVersion;
  out[1] = uint8_t(h.ip_version << 4);
  put16(out + 2, h.src_port);
  memcpy(out + 4, h.src_addr.data(), 16);
  memcpy(out + 20, h.dst_addr.data(), 16);
  if (h.ip_version == 4) {
    memset(out + 4, 0, 12);
    memset(out + 20, 0, 12);
  }
  return true;
}

uint32_t cm_answer_id(const uint8_t* mad, size_t len) {
  if (len != kMadBytes || mad[1] != kMgmtClassCm) return 0;
  const uint8_t* body = mad + kMadHeaderBytes;
  switch (static_cast<CmAttr>(get16(mad + 16))) {  // the header's attribute ID
    case CmAttr::kMra:
    case CmAttr::kRej:
    case CmAttr::kRep:
    case CmAttr::kRtu:
    case CmAttr::kDreq:
    case CmAttr::kDrep: return get32(body + 4);  // after the sender's own local comm ID
    case CmAttr::kSidrRep: return get32(body);
    default: return 0;
  }
}

bool cm_request_service(const uint8_t* mad, size_t len, uint64_t* service_id) {
  if (len != kMadBytes || mad[1] != kMgmtClassCm) return false;
  auto attr = static_cast<CmAttr>(get16(mad + 16));
  if (attr != CmAttr::kReq && attr != CmAttr::kSidrReq) return false;
  *service_id = get64(mad + kMadHeaderBytes + 8);  // at byte 8 of both messages
  return true;
}

bool cm_stateless_answer(const uint8_t* mad, size_t len, uint8_t out[kMadBytes]) {
  CmMad in;
  if (decode_cm(mad, len, &in) != CmError::kOk) return false;
  CmMad answer{cm_header(in.hdr.tid), CmRtu{}};
  if (const auto* req = std::get_if<CmReq>(&in.body)) {
    CmRej rej;
    rej.remote_comm_id = req->local_comm_id;  // local comm ID 0: no id took it
    rej.message_rejected = kCmRespReq;
    rej.reason = kRejInvalidServiceId;
    answer.body = rej;
  } else if (const auto* sreq = std::get_if<CmSidrReq>(&in.body)) {
    CmSidrRep rep;
    rep.request_id = sreq->request_id;
    rep.status = kSidrUnsupported;
    rep.service_id = sreq->service_id;
    answer.body = rep;
  } else if (const auto* dreq = std::get_if<CmDreq>(&in.body)) {
    CmDrep drep;
    drep.local_comm_id = dreq->remote_comm_id;
    drep.remote_comm_id = dreq->local_comm_id;
    answer.body = drep;
  } else {
    return false;
  }
  return encode_cm(answer, out);
}

}  // namespace softverbs::wire::roce
