// The route and neighbour lookups rdma_resolve_addr uses between hosts (common/neighbour.*),
// on what every machine has: the loopback interface. Other hosts' neighbours are
// hosts.cm.resolve's (tests/hosts).
#include "common/neighbour.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

namespace softverbs {
namespace {

sockaddr_in v4(const char* text) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, text, &a.sin_addr);
  return a;
}

TEST(Neighbour, LoopbackRouteNeedsNoNeighbour) {
  sockaddr_in lo = v4("127.0.0.1");
  NextHop hop;
  ASSERT_EQ(route_next_hop(reinterpret_cast<sockaddr*>(&lo), &hop), 0);
  EXPECT_EQ(hop.ifindex, int(if_nametoindex("lo")));
  EXPECT_TRUE(hop.no_neighbour);
  ASSERT_EQ(hop.addr.ss_family, AF_INET);
  EXPECT_EQ(std::memcmp(&reinterpret_cast<sockaddr_in*>(&hop.addr)->sin_addr, &lo.sin_addr, 4), 0);
  EXPECT_EQ(neighbour_state(hop), NeighbourState::kValid);
}

TEST(Neighbour, AnEntryNobodyHasIsPending) {
  NextHop hop;
  hop.ifindex = 0x7ffffff0;  // no such interface: no entry
  sockaddr_in a = v4("192.0.2.1");
  std::memcpy(&hop.addr, &a, sizeof a);
  EXPECT_EQ(neighbour_state(hop), NeighbourState::kPending);
}

TEST(Neighbour, OnlyIpAddresses) {
  sockaddr other{};
  other.sa_family = AF_UNIX;
  NextHop hop;
  EXPECT_EQ(route_next_hop(&other, &hop), EAFNOSUPPORT);
}

}  // namespace
}  // namespace softverbs
