// Steering rules of ibv_create_flow (core/flow_rule): parsing a rule's specs, matching
// frames against them, and the Toeplitz hash of RSS against Microsoft's test vectors.
#include "core/flow_rule.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace softverbs {
namespace {

// A frame: Ethernet (optionally one 802.1Q tag), IPv4 or IPv6, UDP or TCP ports.
struct FrameSpec {
  bool vlan = false;
  uint16_t tci = 0x0c0c;
  int ip = 4;
  uint8_t proto = 17;
  uint8_t ihl_words = 5;
  uint16_t frag = 0x4000;  // DF
  uint16_t sport = 1234, dport = 5678;
};

std::vector<uint8_t> frame(const FrameSpec& f) {
  std::vector<uint8_t> b(14);
  const uint8_t dst[6] = {0x01, 0x50, 0x56, 0x19, 0x20, 0xa7}, src[6] = {0x24, 0x8a, 0x07, 0xa5, 0x28, 0xc8};
  std::memcpy(b.data(), dst, 6);
  std::memcpy(b.data() + 6, src, 6);
  auto put16 = [&](size_t at, uint16_t v) {
    b[at] = uint8_t(v >> 8);
    b[at + 1] = uint8_t(v);
  };
  size_t l3 = 14;
  if (f.vlan) {
    b.resize(18);
    put16(12, 0x8100);
    put16(14, f.tci);
    l3 = 18;
  }
  put16(l3 - 2, f.ip == 4 ? 0x0800 : 0x86dd);
  size_t l4;
  if (f.ip == 4) {
    b.resize(l3 + f.ihl_words * 4u);
    b[l3] = uint8_t(0x40 | f.ihl_words);
    b[l3 + 1] = 0x2e;  // TOS
    put16(l3 + 6, f.frag);
    b[l3 + 8] = 64;
    b[l3 + 9] = f.proto;
    const uint8_t s[4] = {1, 1, 1, 1}, d[4] = {2, 2, 2, 2};
    std::memcpy(&b[l3 + 12], s, 4);
    std::memcpy(&b[l3 + 16], d, 4);
    l4 = l3 + f.ihl_words * 4u;
  } else {
    b.resize(l3 + 40);
    b[l3] = 0x60 | 0x0a;  // traffic class 0xab
    b[l3 + 1] = 0xb0 | 0x1;  // flow label 0x12345
    b[l3 + 2] = 0x23;
    b[l3 + 3] = 0x45;
    b[l3 + 6] = f.proto;
    b[l3 + 7] = 64;
    for (int i = 0; i < 16; ++i) {
      b[l3 + 8 + i] = uint8_t(0xa0 + i);
      b[l3 + 24 + i] = uint8_t(0xb0 + i);
    }
    l4 = l3 + 40;
  }
  b.resize(l4 + 20);
  put16(l4, f.sport);
  put16(l4 + 2, f.dport);
  return b;
}

// A rule buffer: the attr, then specs appended one by one.
struct RuleBuf {
  std::vector<uint8_t> b = std::vector<uint8_t>(sizeof(ibv_flow_attr));
  ibv_flow_attr* attr() { return reinterpret_cast<ibv_flow_attr*>(b.data()); }
  template <typename Spec>
  void add(const Spec& s) {
    size_t at = b.size();
    b.resize(at + sizeof(Spec));
    std::memcpy(b.data() + at, &s, sizeof(Spec));
    attr()->num_of_specs++;
    attr()->size = uint16_t(b.size());
  }
};

bool matches(RuleBuf& r, const std::vector<uint8_t>& f) {
  FlowRule rule;
  EXPECT_EQ(parse_flow(r.attr(), &rule), 0);
  return flow_matches(rule, parse_frame(f.data(), f.size()));
}

ibv_flow_spec_tcp_udp ports(ibv_flow_spec_type type, uint16_t dport) {
  ibv_flow_spec_tcp_udp s{};
  s.type = type;
  s.size = sizeof(s);
  s.val.dst_port = htons(dport);
  s.mask.dst_port = 0xffff;
  return s;
}

TEST(FlowRule, EmptyRuleMatchesEveryFrame) {
  RuleBuf r;
  EXPECT_TRUE(matches(r, frame({})));
}

TEST(FlowRule, EthMatchesUnderMaskAndLooksUnderTheVlanTag) {
  RuleBuf r;
  ibv_flow_spec_eth e{};
  e.type = IBV_FLOW_SPEC_ETH;
  e.size = sizeof(e);
  const uint8_t dst[6] = {0x01, 0x50, 0x56, 0x19, 0x20, 0xff};
  std::memcpy(e.val.dst_mac, dst, 6);
  std::memset(e.mask.dst_mac, 0xff, 5);  // the last byte is not looked at
  e.val.ether_type = htons(0x0800);
  e.mask.ether_type = 0xffff;
  r.add(e);
  EXPECT_TRUE(matches(r, frame({})));
  FrameSpec tagged;
  tagged.vlan = true;
  EXPECT_TRUE(matches(r, frame(tagged)));  // the inner type is IPv4
  FrameSpec v6;
  v6.ip = 6;
  EXPECT_FALSE(matches(r, frame(v6)));
}

TEST(FlowRule, VlanTagField) {
  RuleBuf r;
  ibv_flow_spec_eth e{};
  e.type = IBV_FLOW_SPEC_ETH;
  e.size = sizeof(e);
  e.val.vlan_tag = htons(0x0c0c);
  e.mask.vlan_tag = htons(0x0fff);
  r.add(e);
  FrameSpec tagged;
  tagged.vlan = true;
  tagged.tci = 0xac0c;  // priority bits differ: masked off
  EXPECT_TRUE(matches(r, frame(tagged)));
  EXPECT_FALSE(matches(r, frame({})));  // untagged: tag 0
}

TEST(FlowRule, Ipv4AndPortsAskForTheirLayers) {
  RuleBuf r;
  ibv_flow_spec_ipv4 ip{};
  ip.type = IBV_FLOW_SPEC_IPV4;
  ip.size = sizeof(ip);
  ip.val.dst_ip = htonl(0x02020202);
  ip.mask.dst_ip = 0xffffffff;
  r.add(ip);
  r.add(ports(IBV_FLOW_SPEC_UDP, 5678));
  EXPECT_TRUE(matches(r, frame({})));
  FrameSpec tcp;
  tcp.proto = 6;
  EXPECT_FALSE(matches(r, frame(tcp)));  // a UDP spec: UDP only
  FrameSpec other_port;
  other_port.dport = 5679;
  EXPECT_FALSE(matches(r, frame(other_port)));
  FrameSpec options;
  options.ihl_words = 7;  // IPv4 options: the ports are further on
  EXPECT_TRUE(matches(r, frame(options)));
  FrameSpec fragment;
  fragment.frag = 0x0010;  // not the first fragment: no ports in it
  EXPECT_FALSE(matches(r, frame(fragment)));
  FrameSpec v6;
  v6.ip = 6;
  EXPECT_FALSE(matches(r, frame(v6)));
}

TEST(FlowRule, Ipv4ExtFields) {
  RuleBuf r;
  ibv_flow_spec_ipv4_ext ip{};
  ip.type = IBV_FLOW_SPEC_IPV4_EXT;
  ip.size = sizeof(ip);
  ip.val.proto = 6;
  ip.mask.proto = 0xff;
  ip.val.tos = 0x2e;
  ip.mask.tos = 0xff;
  ip.val.flags = 2;  // DF
  ip.mask.flags = 7;
  r.add(ip);
  FrameSpec tcp;
  tcp.proto = 6;
  EXPECT_TRUE(matches(r, frame(tcp)));
  tcp.frag = 0;  // DF clear
  EXPECT_FALSE(matches(r, frame(tcp)));
  EXPECT_FALSE(matches(r, frame({})));  // UDP
}

TEST(FlowRule, Ipv6Fields) {
  RuleBuf r;
  ibv_flow_spec_ipv6 ip{};
  ip.type = IBV_FLOW_SPEC_IPV6;
  ip.size = sizeof(ip);
  for (int i = 0; i < 16; ++i) ip.val.dst_ip[i] = uint8_t(0xb0 + i);
  std::memset(ip.mask.dst_ip, 0xff, 16);
  ip.val.flow_label = htonl(0x12345);
  ip.mask.flow_label = htonl(0xfffff);
  ip.val.traffic_class = 0xab;
  ip.mask.traffic_class = 0xff;
  ip.val.next_hdr = 6;
  ip.mask.next_hdr = 0xff;
  r.add(ip);
  r.add(ports(IBV_FLOW_SPEC_TCP, 5678));
  FrameSpec v6;
  v6.ip = 6;
  v6.proto = 6;
  EXPECT_TRUE(matches(r, frame(v6)));
  v6.proto = 17;
  EXPECT_FALSE(matches(r, frame(v6)));
}

TEST(FlowRule, ValueBitsOutsideTheMaskAreIgnored) {
  RuleBuf r;
  ibv_flow_spec_ipv4 ip{};
  ip.type = IBV_FLOW_SPEC_IPV4;
  ip.size = sizeof(ip);
  ip.val.dst_ip = htonl(0x020202ff);
  ip.mask.dst_ip = htonl(0xffffff00);
  r.add(ip);
  EXPECT_TRUE(matches(r, frame({})));
}

TEST(FlowRule, ParseErrors) {
  FlowRule rule;
  RuleBuf unknown;
  ibv_flow_spec_tcp_udp bad = ports(IBV_FLOW_SPEC_UDP, 1);
  bad.type = static_cast<ibv_flow_spec_type>(0x77);
  unknown.add(bad);
  EXPECT_EQ(parse_flow(unknown.attr(), &rule), EINVAL);
  RuleBuf short_spec;
  ibv_flow_spec_tcp_udp small = ports(IBV_FLOW_SPEC_UDP, 1);
  small.size = 8;
  short_spec.add(small);
  EXPECT_EQ(parse_flow(short_spec.attr(), &rule), EINVAL);
  RuleBuf tunnel;
  ibv_flow_spec_tunnel t{};
  t.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
  t.size = sizeof(t);
  tunnel.add(t);
  EXPECT_EQ(parse_flow(tunnel.attr(), &rule), EOPNOTSUPP);
  RuleBuf inner;
  ibv_flow_spec_tcp_udp in = ports(static_cast<ibv_flow_spec_type>(IBV_FLOW_SPEC_UDP | IBV_FLOW_SPEC_INNER), 1);
  inner.add(in);
  EXPECT_EQ(parse_flow(inner.attr(), &rule), EOPNOTSUPP);
}

TEST(FlowRule, DropAction) {
  RuleBuf r;
  r.add(ports(IBV_FLOW_SPEC_UDP, 5678));
  ibv_flow_spec_action_drop d{};
  d.type = IBV_FLOW_SPEC_ACTION_DROP;
  d.size = sizeof(d);
  r.add(d);
  FlowRule rule;
  ASSERT_EQ(parse_flow(r.attr(), &rule), 0);
  EXPECT_TRUE(rule.drop);
  EXPECT_EQ(rule.specs.size(), 1u);
}

TEST(FlowRule, TagAction) {
  RuleBuf r;
  r.add(ports(IBV_FLOW_SPEC_UDP, 5678));
  ibv_flow_spec_action_tag t{};
  t.type = IBV_FLOW_SPEC_ACTION_TAG;
  t.size = sizeof(t);
  t.tag_id = 0xabcdef;
  r.add(t);
  FlowRule rule;
  ASSERT_EQ(parse_flow(r.attr(), &rule), 0);
  EXPECT_EQ(rule.tag, 0xabcdefu);
  EXPECT_EQ(rule.specs.size(), 1u);
  RuleBuf wide;
  t.tag_id = 0x1000000;  // past the 24 bits a CQE carries
  wide.add(t);
  EXPECT_EQ(parse_flow(wide.attr(), &rule), EINVAL);
}

TEST(FlowRule, ShortFramesMatchNothingBeyondWhatTheyHave) {
  std::vector<uint8_t> f = frame({});
  f.resize(20);  // Ethernet and 6 bytes of IPv4
  RuleBuf r;
  r.add(ports(IBV_FLOW_SPEC_UDP, 5678));
  EXPECT_FALSE(matches(r, f));
  f.resize(10);
  RuleBuf any;
  EXPECT_FALSE(matches(any, f));  // not even an Ethernet header
}

// Microsoft's RSS verification suite: key, and IPv4 hashes without and with the TCP ports.
TEST(Toeplitz, MicrosoftVectors) {
  const uint8_t key[40] = {0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67,
                           0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb,
                           0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
                           0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};
  struct Vector {
    uint8_t src[4], dst[4];
    uint16_t sport, dport;
    uint32_t ip_only, with_ports;
  } vectors[] = {
      {{66, 9, 149, 187}, {161, 142, 100, 80}, 2794, 1766, 0x323e8fc2, 0x51ccc178},
      {{199, 92, 111, 2}, {65, 69, 140, 83}, 14230, 4739, 0xd718262a, 0xc626b0ea},
      {{24, 19, 198, 95}, {12, 22, 207, 184}, 12898, 38024, 0xd2d0a5de, 0x5c2b394a},
  };
  for (const Vector& v : vectors) {
    uint8_t in[12];
    std::memcpy(in, v.src, 4);
    std::memcpy(in + 4, v.dst, 4);
    in[8] = uint8_t(v.sport >> 8);
    in[9] = uint8_t(v.sport);
    in[10] = uint8_t(v.dport >> 8);
    in[11] = uint8_t(v.dport);
    EXPECT_EQ(toeplitz_hash(key, sizeof(key), in, 8), v.ip_only);
    EXPECT_EQ(toeplitz_hash(key, sizeof(key), in, 12), v.with_ports);
  }
}

}  // namespace
}  // namespace softverbs
