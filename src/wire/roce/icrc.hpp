// The RoCE v2 ICRC (IBA annex A17.4.1, as Linux rxe computes it in rxe_icrc.c): CRC-32 with
// the Ethernet polynomial, register seeded with ones, run over
//   8 bytes of 0xff (standing for the IB LRH, which RoCE v2 does not carry),
//   the IP header with its variant fields set to ones (IPv4: TOS, TTL, header checksum;
//     IPv6: traffic class, flow label, hop limit),
//   the UDP header with its checksum set to ones,
//   the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to ones,
//   the rest of the datagram up to the ICRC (extension headers, payload, pad);
// the register inverted is the ICRC, stored least significant byte first (as crc32_le's
// value stored from a little-endian CPU, i.e. zlib.crc32's value in Ethernet FCS order).
//
// A user-space sender's kernel builds the IP and UDP headers, and a user-space receiver never
// sees them, so the context below describes them instead: lengths follow from the datagram's,
// TOS/TTL/checksums are masked anyway, and what remains unknown to a receiver are the IPv4
// Identification and DF bit (see icrc_check).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "wire/roce/packet.hpp"

namespace softverbs::wire::roce {

// The IP and UDP header fields that the ICRC covers and that the datagram does not imply.
struct IcrcContext {
  bool ipv6 = false;
  // Network order. IPv4 addresses sit in bytes 12..15 in the IPv4-mapped form
  // ::ffff:a.b.c.d, which is also the RoCE v2 GID of an IPv4 address.
  std::array<uint8_t, 16> src_ip{};
  std::array<uint8_t, 16> dst_ip{};
  uint16_t src_port = 0;  // host order
  uint16_t dst_port = kRoceV2Port;
  // IPv4 only. Linux sends a DF datagram from an unconnected UDP socket with ID 0 (and
  // softverbs sends that way); rxe and NICs put a counter or hash there.
  uint16_t ipv4_id = 0;
  bool ipv4_df = true;

  // From two RoCE v2 GIDs: IPv4 when both are IPv4-mapped, else IPv6.
  static IcrcContext from_gids(const uint8_t sgid[16], const uint8_t dgid[16], uint16_t src_port,
                               uint16_t dst_port = kRoceV2Port);
  // From two IPv4 addresses in network order (4 bytes each).
  static IcrcContext from_ipv4(const uint8_t src[4], const uint8_t dst[4], uint16_t src_port,
                               uint16_t dst_port = kRoceV2Port);
};

// The ICRC of a datagram (what follows the UDP header) of `len_without_icrc` bytes, whose
// ICRC will follow; the value to store least significant byte first.
uint32_t icrc(const IcrcContext& ctx, const uint8_t* dgram, size_t len_without_icrc);
// Computes and stores the ICRC in the last 4 bytes of a datagram of `len` bytes (as encode
// returned it). Does nothing for len < 4.
void icrc_fill(const IcrcContext& ctx, uint8_t* dgram, size_t len);
// The ICRC stored in the last 4 bytes of a datagram of len >= 4 bytes.
uint32_t icrc_stored(const uint8_t* dgram, size_t len);

// A datagram's ICRC checked as a receiver can: exactly against ctx, or, over IPv4, against
// ctx with some IPv4 Identification and DF bit that the receiver never saw.
struct IcrcCheck {
  enum Result : uint8_t { kBad, kExact, kSomeIpv4Id };
  Result result = kBad;
  // For kSomeIpv4Id: the Identification and DF bit the sender's IP header had (the only
  // ones that make the ICRC match); for kExact ctx's.
  uint16_t ipv4_id = 0;
  bool ipv4_df = false;
  bool ok() const { return result != kBad; }
};

// Checks the ICRC at the end of a datagram of `len` bytes (ICRC included). First exactly
// against ctx (IPv4 ID and DF as given: what softverbs sends). When that fails over IPv4,
// finds whether one of the 2^17 (ID, DF) pairs makes the ICRC match: the CRC is affine over
// GF(2), so the ICRC is the exact attempt's XOR a linear function of the 17 bits; the 17
// bits' contributions at this datagram length are computed and reduced once per length
// (each thread caches the last few lengths) and the 32x17 system is solved, instead of
// trying 131072 values. Cost: one CRC pass plus ~0.1 us (measured: 4 KiB, 2.6 us in all).
//
// What this costs in strength: the exact check accepts a random corruption with
// probability 2^-32 and catches every error burst up to 32 bits; the some-ID check accepts
// one when its syndrome lies in the 17-dimensional span of the ID/DF bits' contributions,
// with probability 2^17 / 2^32 = 2^-15, and no longer catches every short burst: at a given
// length, about one bit position in 2^15 can flip alone and still be accepted (with another
// ID), e.g. about one such position per 4 KiB packet (measured: 2 of 33024 single-bit
// errors of a 4 KiB WRITE, 1 of 11880 over 15 captured rxe frames). Since the check names
// the ID it found, a caller can win strength back by expecting IDs near the last ones from
// that peer (rxe's count up per destination). The ICRC is the end-to-end check
// behind the Ethernet FCS (and the UDP checksum, when the sender sets one), so it only
// matters for corruption inside switches and routers; a receiver that knows its peer sends
// ID 0 keeps the full strength with the exact check.
IcrcCheck icrc_check(const IcrcContext& ctx, const uint8_t* dgram, size_t len);
// Only the exact check.
bool icrc_check_exact(const IcrcContext& ctx, const uint8_t* dgram, size_t len);

// The ICRC computed piece by piece, for a sender that gathers headers, payload and pad
// from separate buffers: feed the datagram from its first byte (the BTH) up to the ICRC.
class IcrcBuilder {
 public:
  // `len` is the whole datagram's length, ICRC included (the IP and UDP lengths need it).
  IcrcBuilder(const IcrcContext& ctx, size_t len);
  void add(const uint8_t* data, size_t n);
  // The whole datagram at once (nothing added before), as icrc() does.
  void add_all(const uint8_t* dgram, size_t n);
  uint32_t value() const { return ~reg_ ^ id_delta_; }  // as icrc() returns it

 private:
  uint32_t reg_;
  uint32_t id_delta_ = 0;  // ctx's IPv4 ID, when reg_ started from the pseudo-header with 0
  size_t offset_ = 0;  // bytes of the datagram added so far
};

// CRC-32 (Ethernet, reflected) register update without pre- or post-inversion, as the
// kernel's crc32_le: zlib's crc32(c, p, n) == ~crc32_update(~c, p, n).
uint32_t crc32_update(uint32_t reg, const uint8_t* data, size_t n);

}  // namespace softverbs::wire::roce
