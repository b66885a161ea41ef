// What kind of L3 header the 40-byte GRH slot of a UD receive holds, and how a completion
// reports it. RoCE v2 (IBA Annex A17.4.5.2) fills the slot with the packet's IP header: an
// IPv6 header takes all 40 bytes, an IPv4 header the last 20 (the first 20 are undefined).
// A receiver learns which from the completion: ConnectX puts the CQE's L3 header type in
// the SL field of a RoCE completion (libmlx5: wc.sl = flags_rqpn[27:24]; the kernel's mlx5
// reads the same bits as its RoCE packet type: 0 GRH, 1 IPv6, 2 IPv4), and UCX's UD
// transport (uct_ud_iface_check_grh, UCX 1.13) trusts wc.sl & 7 to find the destination
// address: 2 means "the last 4 bytes are an IPv4 address", anything else "the last 16 are
// a GID". Reporting 0 for an IPv4 slot makes it drop every datagram.
#pragma once

#include <cstdint>

namespace softverbs::wire::roce {

inline constexpr uint8_t kL3Grh = 0;   // IB GRH (RoCE v1)
inline constexpr uint8_t kL3Ipv6 = 1;  // IPv6 header (RoCE v2)
inline constexpr uint8_t kL3Ipv4 = 2;  // IPv4 header in the last 20 bytes (RoCE v2)

// The L3 header type of a 40-byte GRH slot as softverbs fills it (engine build_grh): IPv6
// when its first byte says IP version 6 (checked first: an IPv6 slot's byte 20 is inside
// the source GID), IPv4 when its second half starts with an IPv4 version/IHL byte.
inline uint8_t grh_slot_l3_type(const uint8_t* slot) {
  if ((slot[0] >> 4) == 6) return kL3Ipv6;
  if ((slot[20] >> 4) == 4) return kL3Ipv4;
  return kL3Grh;
}

}  // namespace softverbs::wire::roce
