// Steering rules of ibv_create_flow(3): what a flow's specs mean, and whether an Ethernet
// frame matches them. A field matches when (frame's field & mask) == (value & mask), every
// field in network byte order as on the wire; a spec of a layer also asks for that layer
// (an IPv4 spec matches IPv4 frames only, a TCP spec TCP segments only).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace softverbs {

struct FlowRule {
  ibv_flow_attr_type type = IBV_FLOW_ATTR_NORMAL;
  uint16_t priority = 0;
  bool dont_trap = false;
  bool drop = false;  // IBV_FLOW_SPEC_ACTION_DROP: matching frames go nowhere
  uint32_t tag = 0;   // IBV_FLOW_SPEC_ACTION_TAG: the receives' flow tag (0: none)
  // One entry per spec (value already masked).
  struct Spec {
    ibv_flow_spec_type type;
    union {
      ibv_flow_spec_eth eth;
      ibv_flow_spec_ipv4 ipv4;
      ibv_flow_spec_ipv4_ext ipv4_ext;
      ibv_flow_spec_ipv6 ipv6;
      ibv_flow_spec_tcp_udp tcp_udp;
    } u;
  };
  std::vector<Spec> specs;
};

// Reads the attr->num_of_specs specs that follow `attr`, each as long as its size says (as
// rdma-core walks them): 0, EINVAL for a malformed list (an unknown spec type, a spec
// smaller than its struct, a tag past 24 bits), EOPNOTSUPP for what softverbs does not
// steer on (tunnels, GRE, MPLS, ESP, inner headers, counters, flow actions).
int parse_flow(const ibv_flow_attr* attr, FlowRule* out);

// The headers of one frame, as far as it has them.
struct FrameHeaders {
  const uint8_t* eth = nullptr;  // dst MAC, src MAC
  uint16_t ether_type = 0;       // network order; the inner type under one 802.1Q tag
  uint16_t vlan_tag = 0;         // network order; 0 without a tag
  const uint8_t* ipv4 = nullptr;
  const uint8_t* ipv6 = nullptr;
  uint8_t l4_proto = 0;
  const uint8_t* l4 = nullptr;   // TCP/UDP header (its first 4 bytes: the ports)
};
FrameHeaders parse_frame(const uint8_t* frame, size_t len);

// Whether a frame with these headers matches every spec of `rule` (a NORMAL rule).
bool flow_matches(const FlowRule& rule, const FrameHeaders& h);

// The Toeplitz hash of RSS (Microsoft's "Receive Side Scaling" verification suite has test
// vectors): `n` input bytes under a key of key_len bytes; key bits past its end count as 0.
uint32_t toeplitz_hash(const uint8_t* key, size_t key_len, const uint8_t* in, size_t n);

}  // namespace softverbs
