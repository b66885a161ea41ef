// Writes a pcap file with one RoCE v2 packet of every opcode we know (IPv4, ID 0 and DF as
// softverbs sends), then the same SEND_ONLY over IPv6 and over IPv4 with a nonzero ID, all
// with valid ICRCs, for roce_pcap_tshark.sh to feed to tshark. Usage: roce_pcap_sample FILE
#include <cstdio>
#include <vector>

#include "wire/roce/icrc.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/pcap.hpp"

using namespace softverbs::wire::roce;

namespace {

Packet sample(uint8_t opcode, uint32_t psn) {
  Packet p;
  p.opcode = opcode;
  p.dest_qp = 0x000123;
  p.psn = psn;  // consecutive, or Wireshark's reassembly sees overlapping fragments
  p.ack_req = (opcode_info(opcode).flags & kRequest) != 0;
  p.va = 0x7f0000001000;
  p.rkey = 0x1234;
  p.dma_len = 256;
  p.swap_add = 1;
  p.compare = 2;
  p.syndrome = kAethAck | 0x1f;
  p.msn = 7;
  p.orig = 3;
  p.imm = 0x04030201;
  p.inv_rkey = 0x1234;
  p.qkey = 0x11111111;
  p.src_qp = 0x000789;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  PcapWriter w;
  if (!w.open(argv[1])) {
    perror(argv[1]);
    return 1;
  }
  const uint8_t a[4] = {192, 168, 7, 1}, b[4] = {192, 168, 7, 2};
  const IcrcContext v4 = IcrcContext::from_ipv4(a, b, 0xc001);
  std::vector<uint8_t> payload(256);
  // Text, which none of the payload heuristics (RPC over RDMA, SMB Direct, ...) claims.
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t("softverbs "[i % 10]);
  std::vector<uint8_t> d(1024);
  int frames = 0;
  auto put = [&](const IcrcContext& ctx, uint8_t opcode) {
    const uint32_t flags = opcode_info(opcode).flags;
    uint32_t len = 0;
    // 37: pad 3. (With only a few bytes, Wireshark's RPC-over-RDMA heuristic throws on
    // SEND payloads and marks the frame malformed, whatever the RoCE headers.)
    if (flags & kHasPayload) len = (flags & (kFirst | kMiddle)) ? 256 : 37;
    const size_t n = encode(sample(opcode, 0x456 + frames), payload.data(), len, d.data(), d.size());
    icrc_fill(ctx, d.data(), n);
    if (n == 0 || !w.write(ctx, d.data(), n)) return false;
    ++frames;
    return true;
  };
  for (int op = 0; op < 256; ++op) {
    if (opcode_valid(uint8_t(op)) && !put(v4, uint8_t(op))) return 1;
  }
  uint8_t s6[16] = {0x20, 0x01, 0x0d, 0xb8}, d6[16] = {0x20, 0x01, 0x0d, 0xb8};
  s6[15] = 1;
  d6[15] = 2;
  IcrcContext with_id = v4;
  with_id.ipv4_id = 0xbeef;
  if (!put(IcrcContext::from_gids(s6, d6, 0xc002), kRc | kSendOnly) ||
      !put(with_id, kRc | kSendOnly) || !w.close()) {
    return 1;
  }
  printf("%d\n", frames);
  return 0;
}
