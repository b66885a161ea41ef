// Our side of the capture (see capture.sh): with softverbs' packet and ICRC code, sends RC
// requests from a plain UDP socket (LOCAL_IP:4791, DF, so IP ID 0) to rxe's QP B, then
// reports the responses rxe sends back: decoded, ICRC checked as our receiver will (rxe's
// IP IDs are not 0, so the some-ID check must find them). A response at all means rxe
// accepted our requests' ICRCs. Usage: prober INFO_FILE LOCAL_IP PEER_IP
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"

using namespace softverbs::wire::roce;

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  unsigned qpn = 0, rkey = 0;
  unsigned long long va = 0;
  FILE* f = fopen(argv[1], "r");
  if (!f || fscanf(f, "%u %llu %u", &qpn, &va, &rkey) != 3) return 1;
  fclose(f);
  uint8_t local[4], peer[4];
  inet_pton(AF_INET, argv[2], local);
  inet_pton(AF_INET, argv[3], peer);

  int s = socket(AF_INET, SOCK_DGRAM, 0);
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(s, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  sockaddr_in me{}, to{};
  me.sin_family = to.sin_family = AF_INET;
  me.sin_port = to.sin_port = htons(kRoceV2Port);
  memcpy(&me.sin_addr, local, 4);
  memcpy(&to.sin_addr, peer, 4);
  if (bind(s, reinterpret_cast<sockaddr*>(&me), sizeof me) != 0) {
    perror("bind");
    return 1;
  }
  const IcrcContext out_ctx = IcrcContext::from_ipv4(local, peer, kRoceV2Port);

  struct Req {
    uint8_t op;
    const char* payload;
    uint64_t va;
    uint32_t dma_len;
  } reqs[] = {
      {kRc | kSendOnly, "from softverbs", 0, 0},
      {kRc | kWriteOnly, "WRITTEN!", va, 8},
      {kRc | kReadRequest, "", va + 16, 16},
      {kRc | kFetchAdd, "", va + 64, 0},
      {kRc | kCompareSwap, "", va + 72, 0},
      {kRc | kWriteOnlyImm, "imm", va + 24, 3},
  };
  uint32_t psn = 0x200;
  for (const Req& r : reqs) {
    Packet p;
    p.opcode = r.op;
    p.dest_qp = qpn;
    p.psn = psn;
    p.ack_req = true;
    p.va = r.va;
    p.rkey = rkey;
    p.dma_len = r.dma_len;
    p.swap_add = r.op == (kRc | kFetchAdd) ? 5 : 0x1234;
    p.compare = 0x0909090909090909;
    p.imm = htonl(0xfeedf00d);
    uint8_t d[256];
    const size_t n = encode(p, reinterpret_cast<const uint8_t*>(r.payload),
                            uint32_t(strlen(r.payload)), d, sizeof d);
    icrc_fill(out_ctx, d, n);
    if (n == 0 || sendto(s, d, n, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) != ssize_t(n)) {
      perror("sendto");
      return 1;
    }
    printf("prober: sent %s psn 0x%x, %zu bytes\n", opcode_info(r.op).name, psn, n);
    psn += 1;
    usleep(20000);
  }

  int good = 0;
  const time_t end = time(nullptr) + 4;
  while (time(nullptr) < end) {
    pollfd pfd{s, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    uint8_t d[4096];
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    const ssize_t n = recvfrom(s, d, sizeof d, 0, reinterpret_cast<sockaddr*>(&from), &fl);
    if (n <= 0) continue;
    Packet p;
    const DecodeError e = decode_checked(d, size_t(n), &p);
    const IcrcContext in_ctx = IcrcContext::from_ipv4(
        reinterpret_cast<uint8_t*>(&from.sin_addr), local, ntohs(from.sin_port));
    const IcrcCheck c = icrc_check(in_ctx, d, size_t(n));
    printf("prober: got %zd bytes from port %u: %s %s psn 0x%x syndrome 0x%02x msn %u orig 0x%llx "
           "payload %u; ICRC %s (IP ID 0x%04x DF %d)\n",
           n, ntohs(from.sin_port), e == DecodeError::kOk ? "" : decode_error_name(e),
           opcode_info(p.opcode).name, p.psn, p.syndrome, p.msn, (unsigned long long)p.orig,
           p.payload_len, c.result == IcrcCheck::kExact ? "exact" : c.ok() ? "some-ID" : "BAD",
           c.ipv4_id, c.ipv4_df);
    good += e == DecodeError::kOk && c.ok();
  }
  printf("prober: %d good responses\n", good);
  return good > 0 ? 0 : 1;
}
