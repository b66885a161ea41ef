/* Captures the RoCE v2 frames (UDP port 4791, IPv4 or IPv6) seen on one interface into a
 * classic pcap file (LINKTYPE_ETHERNET), for the guest of shared/tools/rxe-vm, which has no
 * tcpdump. Usage: cap IFNAME FILE SECONDS. Needs CAP_NET_RAW (the guest runs it as root). */
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int is_roce(const uint8_t *f, ssize_t n) {
  if (n >= 14 + 20 + 8 && f[12] == 0x08 && f[13] == 0x00 && f[14 + 9] == 17) {
    const uint8_t *udp = f + 14 + (f[14] & 15) * 4;
    return udp + 4 <= f + n && ((udp[0] << 8 | udp[1]) == 4791 || (udp[2] << 8 | udp[3]) == 4791);
  }
  if (n >= 14 + 40 + 8 && f[12] == 0x86 && f[13] == 0xdd && f[14 + 6] == 17) {
    const uint8_t *udp = f + 14 + 40;
    return (udp[0] << 8 | udp[1]) == 4791 || (udp[2] << 8 | udp[3]) == 4791;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: cap IFNAME FILE SECONDS\n");
    return 2;
  }
  int s = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (s < 0) { perror("socket"); return 1; }
  struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                            .sll_ifindex = (int)if_nametoindex(argv[1])};
  if (sll.sll_ifindex == 0 || bind(s, (struct sockaddr *)&sll, sizeof sll) < 0) {
    perror(argv[1]);
    return 1;
  }
  /* A slow (emulated) capturer must not lose frames to a full socket queue. */
  int rcvbuf = 32 << 20;
  setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
  FILE *out = fopen(argv[2], "wb");
  if (!out) { perror(argv[2]); return 1; }
  const uint32_t hdr[6] = {0xa1b2c3d4, 2 | 4u << 16, 0, 0, 65535, 1};
  fwrite(hdr, sizeof hdr, 1, out);
  time_t end = time(NULL) + atoi(argv[3]);
  int frames = 0;
  static uint8_t buf[65536];
  while (time(NULL) < end) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n <= 0 || !is_roce(buf, n)) continue;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    const uint32_t rec[4] = {(uint32_t)tv.tv_sec, (uint32_t)tv.tv_usec, (uint32_t)n, (uint32_t)n};
    fwrite(rec, sizeof rec, 1, out);
    fwrite(buf, n, 1, out);
    fflush(out);
    ++frames;
  }
  fclose(out);
  fprintf(stderr, "cap: %d RoCE frames\n", frames);
  return 0;
}
