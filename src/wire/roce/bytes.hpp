// Big-endian (network order) loads and stores of 16, 24, 32 and 64 bits at any alignment:
// every IBA header field is big-endian (IBA 1.1.4), and its 24-bit QPNs and PSNs have no
// native type. Shared by the packet, MAD and pcap encoders.
#pragma once

#include <cstdint>

namespace softverbs::wire::roce {

inline void put16(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
inline void put24(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 16);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v);
}
inline void put32(uint8_t* p, uint32_t v) {
  put16(p, v >> 16);
  put16(p + 2, v);
}
inline void put64(uint8_t* p, uint64_t v) {
  put32(p, uint32_t(v >> 32));
  put32(p + 4, uint32_t(v));
}
inline uint32_t get16(const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; }
inline uint32_t get24(const uint8_t* p) { return uint32_t(p[0]) << 16 | get16(p + 1); }
inline uint32_t get32(const uint8_t* p) { return get16(p) << 16 | get16(p + 2); }
inline uint64_t get64(const uint8_t* p) { return uint64_t(get32(p)) << 32 | get32(p + 4); }

}  // namespace softverbs::wire::roce
