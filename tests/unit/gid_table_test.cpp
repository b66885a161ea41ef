// The GID table's order (src/wire/host.hpp): the interfaces' IPv4 addresses first, as a RoCE
// NIC lists its netdev's, then ::ffff:127.0.0.1, then IPv6; every entry names this host.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "wire/host.hpp"

using namespace softverbs;

namespace {

bool is_v4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

bool is_loopback_v4(const ibv_gid& g) { return is_v4_mapped(g) && g.raw[12] == 127; }

const ibv_gid kLoopback = wire::ipv4_mapped_gid(htonl(INADDR_LOOPBACK));

int index_of(const std::vector<wire::HostAddress>& table, const ibv_gid& gid) {
  for (size_t i = 0; i < table.size(); ++i)
    if (std::memcmp(table[i].gid.raw, gid.raw, 16) == 0) return static_cast<int>(i);
  return -1;
}

// The up, non-loopback IPv4 addresses getifaddrs reports, read independently of host.cpp.
std::vector<uint32_t> interface_ipv4() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if (!(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK)) continue;
    out.push_back(reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr.s_addr);
  }
  freeifaddrs(list);
  return out;
}

// Checks the order rules on `table`; empty when they hold, else what broke.
std::string order_violation(const std::vector<wire::HostAddress>& table) {
  int lo = index_of(table, kLoopback);
  if (lo < 0) return "::ffff:127.0.0.1 missing";
  for (size_t i = 0; i < table.size(); ++i) {
    const ibv_gid& g = table[i].gid;
    const bool before = static_cast<int>(i) < lo;
    if (static_cast<int>(i) != lo && std::memcmp(g.raw, kLoopback.raw, 16) == 0)
      return "::ffff:127.0.0.1 twice";
    if (is_v4_mapped(g) && !is_loopback_v4(g) && !before)
      return "an interface IPv4 GID after loopback, at " + std::to_string(i);
    if (!is_v4_mapped(g) && before) return "an IPv6 GID before loopback, at " + std::to_string(i);
  }
  return {};
}

}  // namespace

TEST(GidTable, InterfaceIpv4FirstThenLoopbackThenIpv6) {
  const auto& table = wire::host_addresses();
  EXPECT_EQ(order_violation(table), "");
  const std::vector<uint32_t> v4 = interface_ipv4();
  ASSERT_FALSE(table.empty());
  if (v4.empty()) {
    EXPECT_EQ(std::memcmp(table[0].gid.raw, kLoopback.raw, 16), 0) << "only lo: GID 0 is loopback";
  } else {
    const ibv_gid first = wire::ipv4_mapped_gid(v4[0]);
    EXPECT_EQ(std::memcmp(table[0].gid.raw, first.raw, 16), 0) << "GID 0: the first interface IPv4";
    EXPECT_EQ(index_of(table, kLoopback), static_cast<int>(v4.size()));
  }
}

TEST(GidTable, EveryEntryIsThisHost) {
  for (const auto& e : wire::host_addresses()) {
    EXPECT_TRUE(wire::is_host_gid(e.gid));
    EXPECT_TRUE(Device::instance().is_local_gid(e.gid));
  }
  ibv_gid other = wire::ipv4_mapped_gid(inet_addr("198.51.100.77"));  // TEST-NET-2
  EXPECT_FALSE(wire::is_host_gid(other));
}

// In a network namespace of its own (root only), a forked child reads the table again: with
// only lo, GID 0 is loopback; with an interface address, that address comes first.
TEST(GidTable, ForkedChildInAnotherNamespace) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for unshare(CLONE_NEWNET)";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    const auto& only_lo = wire::host_addresses();
    if (only_lo.empty() || std::memcmp(only_lo[0].gid.raw, kLoopback.raw, 16) != 0) _exit(1);
    // A veth pair (the hosts tests' kind of link; dummy needs a module), gone with the
    // namespace when the child exits.
    if (std::system("ip link add svgid0 type veth peer name svgid1 && "
                    "ip addr add 10.251.0.1/24 dev svgid0 && ip link set svgid0 up && "
                    "ip link set lo up") != 0)
      _exit(78);  // no ip(8) or no veth: the first half was checked
    pid_t again = fork();  // a new fork generation reads the interfaces again
    if (again == 0) {
      const auto& table = wire::host_addresses();
      const ibv_gid veth = wire::ipv4_mapped_gid(inet_addr("10.251.0.1"));
      if (!order_violation(table).empty()) _exit(2);
      if (table.size() < 2 || std::memcmp(table[0].gid.raw, veth.raw, 16) != 0) _exit(3);
      if (std::memcmp(table[1].gid.raw, kLoopback.raw, 16) != 0) _exit(4);
      _exit(0);
    }
    int status = 0;
    if (again < 0 || waitpid(again, &status, 0) != again || !WIFEXITED(status)) _exit(5);
    _exit(WEXITSTATUS(status));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "unshare(CLONE_NEWNET) refused";
  if (WEXITSTATUS(status) == 78) GTEST_SKIP() << "could not add a veth interface";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: GID 0 not loopback with only lo; 2: order; "
                                       "3: GID 0 not the interface address; 4: loopback not 1";
}
