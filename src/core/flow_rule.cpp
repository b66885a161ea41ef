// Steering rules of ibv_create_flow(3) (flow_rule.hpp).
#include "core/flow_rule.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace softverbs {

namespace {

// value &= mask, byte by byte (the filters are plain structs of bytes and big-endian words).
template <typename Filter>
void mask_value(Filter& val, const Filter& mask) {
  auto* v = reinterpret_cast<uint8_t*>(&val);
  auto* m = reinterpret_cast<const uint8_t*>(&mask);
  for (size_t i = 0; i < sizeof(Filter); ++i) v[i] &= m[i];
}

// Whether `n` bytes of the frame at `field`, masked, equal the masked value.
bool field_matches(const uint8_t* field, const void* val, const void* mask, size_t n) {
  auto* v = static_cast<const uint8_t*>(val);
  auto* m = static_cast<const uint8_t*>(mask);
  for (size_t i = 0; i < n; ++i)
    if ((field[i] & m[i]) != v[i]) return false;
  return true;
}

template <typename T>
bool word_matches(T frame_value, T val, T mask) {
  return (frame_value & mask) == val;
}

uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// A spec of type Spec at `at`, `size` bytes long (at least its struct), its value masked.
template <typename Spec>
bool take(const uint8_t* at, uint16_t size, Spec* dst) {
  if (size < sizeof(Spec)) return false;
  std::memcpy(dst, at, sizeof(Spec));
  mask_value(dst->val, dst->mask);
  return true;
}

}  // namespace

int parse_flow(const ibv_flow_attr* attr, FlowRule* out) {
  out->type = attr->type;
  out->priority = attr->priority;
  out->dont_trap = (attr->flags & IBV_FLOW_ATTR_FLAGS_DONT_TRAP) != 0;
  out->specs.clear();
  const auto* at = reinterpret_cast<const uint8_t*>(attr + 1);
  for (unsigned i = 0; i < attr->num_of_specs; ++i) {
    ibv_flow_spec_type type;
    uint16_t size;
    std::memcpy(&type, at, sizeof(type));
    std::memcpy(&size, at + offsetof(ibv_flow_spec_eth, size), sizeof(size));
    if (size < offsetof(ibv_flow_spec_eth, val)) return EINVAL;
    FlowRule::Spec s{};
    s.type = type;
    bool ok = true;
    switch (type) {
      case IBV_FLOW_SPEC_ETH:
        ok = take(at, size, &s.u.eth);
        break;
      case IBV_FLOW_SPEC_IPV4:
        ok = take(at, size, &s.u.ipv4);
        break;
      case IBV_FLOW_SPEC_IPV4_EXT:
        ok = take(at, size, &s.u.ipv4_ext);
        break;
      case IBV_FLOW_SPEC_IPV6:
        ok = take(at, size, &s.u.ipv6);
        break;
      case IBV_FLOW_SPEC_TCP:
      case IBV_FLOW_SPEC_UDP:
        ok = take(at, size, &s.u.tcp_udp);
        break;
      case IBV_FLOW_SPEC_ACTION_DROP:
        out->drop = true;
        at += size;
        continue;
      case IBV_FLOW_SPEC_ACTION_TAG: {
        // As mlx5 takes it: 24 bits (the CQE's flow tag field).
        ibv_flow_spec_action_tag t;
        if (size < sizeof(t)) return EINVAL;
        std::memcpy(&t, at, sizeof(t));
        if (t.tag_id > 0xffffff) return EINVAL;
        out->tag = t.tag_id;
        at += size;
        continue;
      }
      case IBV_FLOW_SPEC_ESP:
      case IBV_FLOW_SPEC_VXLAN_TUNNEL:
      case IBV_FLOW_SPEC_GRE:
      case IBV_FLOW_SPEC_MPLS:
      case IBV_FLOW_SPEC_ACTION_HANDLE:
      case IBV_FLOW_SPEC_ACTION_COUNT:
        return EOPNOTSUPP;
      default:
        // IBV_FLOW_SPEC_INNER with a layer: a tunnel's inner headers.
        return (type & IBV_FLOW_SPEC_INNER) ? EOPNOTSUPP : EINVAL;
    }
    if (!ok) return EINVAL;
    out->specs.push_back(s);
    at += size;
  }
  return 0;
}

FrameHeaders parse_frame(const uint8_t* frame, size_t len) {
  FrameHeaders h;
  if (len < 14) return h;
  h.eth = frame;
  h.ether_type = load16(frame + 12);
  size_t l3 = 14;
  if (h.ether_type == htons(0x8100) && len >= 18) {
    h.vlan_tag = load16(frame + 14);
    h.ether_type = load16(frame + 16);
    l3 = 18;
  }
  const uint8_t* ip = frame + l3;
  size_t left = len - l3;
  size_t l4 = 0;
  if (h.ether_type == htons(0x0800) && left >= 20 && (ip[0] >> 4) == 4) {
    size_t ihl = (ip[0] & 0xf) * 4u;
    h.ipv4 = ip;
    h.l4_proto = ip[9];
    bool first_fragment = (load16(ip + 6) & htons(0x1fff)) == 0;
    if (ihl >= 20 && first_fragment) l4 = ihl;
  } else if (h.ether_type == htons(0x86dd) && left >= 40 && (ip[0] >> 4) == 6) {
    h.ipv6 = ip;
    h.l4_proto = ip[6];  // the next header right after the fixed one
    l4 = 40;
  }
  if (l4 && left >= l4 + 4 && (h.l4_proto == 6 || h.l4_proto == 17)) h.l4 = ip + l4;
  return h;
}

bool flow_matches(const FlowRule& rule, const FrameHeaders& h) {
  if (!h.eth) return false;
  for (const FlowRule::Spec& s : rule.specs) {
    switch (s.type) {
      case IBV_FLOW_SPEC_ETH: {
        const auto& f = s.u.eth;
        if (!field_matches(h.eth, f.val.dst_mac, f.mask.dst_mac, 6) ||
            !field_matches(h.eth + 6, f.val.src_mac, f.mask.src_mac, 6) ||
            !word_matches(h.ether_type, f.val.ether_type, f.mask.ether_type) ||
            !word_matches(h.vlan_tag, f.val.vlan_tag, f.mask.vlan_tag))
          return false;
        break;
      }
      case IBV_FLOW_SPEC_IPV4: {
        if (!h.ipv4) return false;
        const auto& f = s.u.ipv4;
        if (!field_matches(h.ipv4 + 12, &f.val.src_ip, &f.mask.src_ip, 4) ||
            !field_matches(h.ipv4 + 16, &f.val.dst_ip, &f.mask.dst_ip, 4))
          return false;
        break;
      }
      case IBV_FLOW_SPEC_IPV4_EXT: {
        if (!h.ipv4) return false;
        const auto& f = s.u.ipv4_ext;
        uint8_t flags = static_cast<uint8_t>(h.ipv4[6] >> 5);  // reserved, DF, MF
        if (!field_matches(h.ipv4 + 12, &f.val.src_ip, &f.mask.src_ip, 4) ||
            !field_matches(h.ipv4 + 16, &f.val.dst_ip, &f.mask.dst_ip, 4) ||
            !word_matches(h.ipv4[9], f.val.proto, f.mask.proto) ||
            !word_matches(h.ipv4[1], f.val.tos, f.mask.tos) ||
            !word_matches(h.ipv4[8], f.val.ttl, f.mask.ttl) ||
            !word_matches(flags, f.val.flags, f.mask.flags))
          return false;
        break;
      }
      case IBV_FLOW_SPEC_IPV6: {
        if (!h.ipv6) return false;
        const auto& f = s.u.ipv6;
        const uint8_t* ip = h.ipv6;
        uint8_t traffic_class = static_cast<uint8_t>((ip[0] << 4) | (ip[1] >> 4));
        uint32_t label_host = (uint32_t(ip[1] & 0xf) << 16) | (uint32_t(ip[2]) << 8) | ip[3];
        uint32_t label = htonl(label_host);
        if (!field_matches(ip + 8, f.val.src_ip, f.mask.src_ip, 16) ||
            !field_matches(ip + 24, f.val.dst_ip, f.mask.dst_ip, 16) ||
            !word_matches(label, f.val.flow_label, f.mask.flow_label) ||
            !word_matches(ip[6], f.val.next_hdr, f.mask.next_hdr) ||
            !word_matches(traffic_class, f.val.traffic_class, f.mask.traffic_class) ||
            !word_matches(ip[7], f.val.hop_limit, f.mask.hop_limit))
          return false;
        break;
      }
      case IBV_FLOW_SPEC_TCP:
      case IBV_FLOW_SPEC_UDP: {
        uint8_t proto = s.type == IBV_FLOW_SPEC_TCP ? 6 : 17;
        if (!h.l4 || h.l4_proto != proto) return false;
        const auto& f = s.u.tcp_udp;
        if (!word_matches(load16(h.l4), f.val.src_port, f.mask.src_port) ||
            !word_matches(load16(h.l4 + 2), f.val.dst_port, f.mask.dst_port))
          return false;
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

uint32_t toeplitz_hash(const uint8_t* key, size_t key_len, const uint8_t* in, size_t n) {
  // A 32-bit window slides over the key one bit per input bit; every set input bit XORs it in.
  auto key_byte = [&](size_t i) -> uint32_t { return i < key_len ? key[i] : 0; };
  uint32_t window = (key_byte(0) << 24) | (key_byte(1) << 16) | (key_byte(2) << 8) | key_byte(3);
  uint32_t result = 0;
  for (size_t i = 0; i < n; ++i) {
    for (int bit = 7; bit >= 0; --bit) {
      if (in[i] & (1u << bit)) result ^= window;
      window = (window << 1) | ((key_byte(i + 4) >> bit) & 1u);
    }
  }
  return result;
}

}  // namespace softverbs
