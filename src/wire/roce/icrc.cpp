// RoCE v2 ICRC: the masked pseudo-header, a slicing-by-8 CRC-32, and the receive-side
// search for the IPv4 Identification and DF bit that a UDP socket hides (see icrc.hpp).
#include "wire/roce/icrc.hpp"

#include <immintrin.h>
#include <zlib.h>

#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/fast_tls.hpp"

namespace softverbs::wire::roce {
namespace {

static_assert(std::endian::native == std::endian::little, "the CRC loads words little-endian");

constexpr uint32_t kPoly = 0xedb88320;  // x^32 + x^26 + ... + 1, bit-reversed

struct CrcTables {
  uint32_t t[8][256];
  uint32_t x_pow_2k[32];  // x^(2^k) mod P, reflected (bit 31 is x^0)
};

uint32_t mul_mod_p(uint32_t a, uint32_t b);

CrcTables build_tables() {
  CrcTables c{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t r = i;
    for (int k = 0; k < 8; ++k) r = (r & 1) ? (r >> 1) ^ kPoly : r >> 1;
    c.t[0][i] = r;
  }
  for (int s = 1; s < 8; ++s) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = c.t[s - 1][i];
      c.t[s][i] = (prev >> 8) ^ c.t[0][prev & 0xff];
    }
  }
  c.x_pow_2k[0] = 1u << 30;  // x^1
  for (int k = 1; k < 32; ++k) c.x_pow_2k[k] = mul_mod_p(c.x_pow_2k[k - 1], c.x_pow_2k[k - 1]);
  return c;
}

const CrcTables& tables() {
  static const CrcTables c = build_tables();
  return c;
}

// a * b mod P in the reflected representation: walk a's terms from x^0 up while b
// becomes b * x^i.
uint32_t mul_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t term = 1u << 31; term != 0; term >>= 1) {
    if (a & term) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: what running the register through `bytes` zero bytes multiplies by.
uint32_t x_pow_bytes(size_t bytes) {
  const CrcTables& c = tables();
  uint64_t exponent = uint64_t(bytes) * 8;
  uint32_t result = 1u << 31;  // x^0
  for (int k = 0; exponent != 0 && k < 32; ++k, exponent >>= 1) {
    if (exponent & 1) result = mul_mod_p(result, c.x_pow_2k[k]);
  }
  return result;
}

uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// Stream offsets of the fields that icrc_check solves for: the LRH stand-in is 8 bytes,
// the IPv4 Identification is at IP header offset 4..5, flags (DF = 0x40) at 6.
constexpr size_t kLrhBytes = 8;
constexpr size_t kIpv4IdOffset = kLrhBytes + 4;
constexpr size_t kIpv4FlagsOffset = kLrhBytes + 6;
constexpr uint8_t kIpv4Df = 0x40;
constexpr size_t kMaxPseudoBytes = kLrhBytes + 40 + 8;

// The masked LRH, IP and UDP headers for a datagram of `len` bytes (ICRC included) into
// h[kMaxPseudoBytes]; returns how many bytes.
size_t pseudo_header(const IcrcContext& c, size_t len, uint8_t* h) {
  memset(h, 0xff, kLrhBytes);
  uint8_t* ip = h + kLrhBytes;
  const size_t udp_len = len + 8;
  size_t ip_bytes;
  if (c.ipv6) {
    ip[0] = 0x6f;                  // version 6, traffic class high nibble masked
    memset(ip + 1, 0xff, 3);       // traffic class low nibble and flow label masked
    ip[4] = uint8_t(udp_len >> 8);  // payload length
    ip[5] = uint8_t(udp_len);
    ip[6] = 17;                    // next header: UDP
    ip[7] = 0xff;                  // hop limit masked
    memcpy(ip + 8, c.src_ip.data(), 16);
    memcpy(ip + 24, c.dst_ip.data(), 16);
    ip_bytes = 40;
  } else {
    const size_t total = udp_len + 20;
    ip[0] = 0x45;                  // version 4, 5 words: no options
    ip[1] = 0xff;                  // TOS masked
    ip[2] = uint8_t(total >> 8);
    ip[3] = uint8_t(total);
    ip[4] = uint8_t(c.ipv4_id >> 8);
    ip[5] = uint8_t(c.ipv4_id);
    ip[6] = c.ipv4_df ? kIpv4Df : 0;  // no fragments: RoCE never fragments
    ip[7] = 0;
    ip[8] = 0xff;                  // TTL masked
    ip[9] = 17;                    // protocol: UDP
    ip[10] = ip[11] = 0xff;        // header checksum masked
    memcpy(ip + 12, c.src_ip.data() + 12, 4);
    memcpy(ip + 16, c.dst_ip.data() + 12, 4);
    ip_bytes = 20;
  }
  uint8_t* udp = ip + ip_bytes;
  udp[0] = uint8_t(c.src_port >> 8);
  udp[1] = uint8_t(c.src_port);
  udp[2] = uint8_t(c.dst_port >> 8);
  udp[3] = uint8_t(c.dst_port);
  udp[4] = uint8_t(udp_len >> 8);
  udp[5] = uint8_t(udp_len);
  udp[6] = udp[7] = 0xff;          // checksum masked
  return kLrhBytes + ip_bytes + 8;
}

// The 17 unknowns' contributions to the ICRC of an IPv4 datagram of `len` bytes (ICRC
// included): bits 0..15 the Identification's (value bits, sent big-endian), bit 16 DF's.
void id_contributions(size_t len, uint32_t out[17]) {
  const CrcTables& c = tables();
  const size_t stream = kLrhBytes + 20 + 8 + len - kIcrcBytes;
  const uint32_t shift = x_pow_bytes(stream - kIpv4FlagsOffset - 1);
  for (int bit = 0; bit < 17; ++bit) {
    uint8_t delta[3] = {0, 0, 0};  // stream bytes 12, 13, 14
    if (bit < 8) delta[1] = uint8_t(1u << bit);
    else if (bit < 16) delta[0] = uint8_t(1u << (bit - 8));
    else delta[2] = kIpv4Df;
    uint32_t reg = 0;
    for (uint8_t d : delta) reg = (reg >> 8) ^ c.t[0][(reg ^ d) & 0xff];
    out[bit] = mul_mod_p(reg, shift);
  }
}

// The 17 contributions in reduced form, for solving sum(m_i * v_i) = target over GF(2):
// pivot_vec[b] has highest bit b and is the sum of the v_i named in pivot_mix[b]. The v_i
// are independent (a CRC-32 tells apart any two patterns within 32 bits of each other).
struct IdSolver {
  size_t len = 0;  // the datagram length it is for; 0: empty
  uint32_t pivot_vec[32];
  uint32_t pivot_mix[32];
  // What an ID's low and high byte add to the ICRC computed with ID 0 (id_delta).
  uint32_t id_low[256];
  uint32_t id_high[256];

  uint32_t id_delta(uint16_t id) const { return id_low[id & 0xff] ^ id_high[id >> 8]; }

  void build(size_t datagram_len) {
    uint32_t v[17];
    id_contributions(datagram_len, v);
    for (uint32_t byte = 0; byte < 256; ++byte) {
      id_low[byte] = id_high[byte] = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (!(byte >> bit & 1)) continue;
        id_low[byte] ^= v[bit];
        id_high[byte] ^= v[bit + 8];
      }
    }
    memset(pivot_vec, 0, sizeof pivot_vec);
    memset(pivot_mix, 0, sizeof pivot_mix);
    for (int i = 0; i < 17; ++i) {
      uint32_t vec = v[i], mix = 1u << i;
      for (int b = 31; b >= 0 && vec != 0; --b) {
        if (!(vec >> b & 1)) continue;
        if (pivot_vec[b] == 0) {
          pivot_vec[b] = vec;
          pivot_mix[b] = mix;
          vec = 0;
        } else {
          vec ^= pivot_vec[b];
          mix ^= pivot_mix[b];
        }
      }
    }
    len = datagram_len;
  }

  // Which v_i sum to target; false when none do.
  bool solve(uint32_t target, uint32_t* mix_out) const {
    uint32_t mix = 0;
    for (int b = 31; b >= 0; --b) {
      if (!(target >> b & 1)) continue;
      if (pivot_vec[b] == 0) return false;
      target ^= pivot_vec[b];
      mix ^= pivot_mix[b];
    }
    *mix_out = mix;
    return true;
  }
};

// Building a solver costs about as much as the CRC of a 4 KiB packet, and a peer like rxe
// sends every packet with a nonzero ID, so each thread keeps the solvers of the last few
// lengths (a stream mostly has a handful: full MTUs, ACKs, its last packets).
// On the heap, behind one pointer: libibverbs is loaded with dlopen (python, for one), and
// glibc has only a little static TLS to spare for such a library (common/fast_tls.hpp).
using Solvers = FastTlsHeap<std::array<IdSolver, 8>>;
const IdSolver& solver_for(size_t len) {
  IdSolver& slot = Solvers::get()[(len / 4) % 8];  // valid datagrams are multiples of 4
  if (slot.len != len) slot.build(len);
  return slot;
}
// The solver of `len` if this thread has it built, else nullptr (a sender of many lengths
// would rebuild one per packet: it computes the pseudo-header with the ID instead).
const IdSolver* solver_if_built(size_t len) {
  const auto* solvers = Solvers::peek();
  if (!solvers) return nullptr;
  const IdSolver& slot = (*solvers)[(len / 4) % 8];
  return slot.len == len ? &slot : nullptr;
}

// The CRC register after the pseudo-header of a datagram of `len` bytes with ctx's fields
// but IPv4 ID 0: the same for every packet of a flow and length, so each thread keeps the
// last few (an ID other than 0 is added at the end, IdSolver::id_delta: the CRC is affine).
bool same_flow(const IcrcContext& a, const IcrcContext& b) {
  return a.ipv6 == b.ipv6 && a.src_port == b.src_port && a.dst_port == b.dst_port &&
         a.ipv4_df == b.ipv4_df && a.src_ip == b.src_ip && a.dst_ip == b.dst_ip;
}
uint32_t pseudo_reg(const IcrcContext& ctx, size_t len) {
  struct Entry {
    IcrcContext key;
    size_t len = 0;
    uint32_t reg = 0;
  };
  auto& cache = FastTlsHeap<std::array<Entry, 4>>::get();  // see solver_for
  Entry& e = cache[(len / 4) % 4];
  if (e.len == len && same_flow(e.key, ctx)) return e.reg;
  e.key = ctx;
  e.key.ipv4_id = 0;
  e.len = len;
  uint8_t h[kMaxPseudoBytes];
  e.reg = crc32_update(0xffffffff, h, pseudo_header(e.key, len, h));
  return e.reg;
}

// The datagram's own bytes (BTH up to the ICRC, `n` of them) onto reg, byte 4 of the BTH
// (FECN, BECN and reserved bits: variant) masked to ones.
uint32_t crc32_run(uint32_t reg, const uint8_t* data, size_t n, uint8_t or4);
uint32_t body_crc(uint32_t reg, const uint8_t* d, size_t n) { return crc32_run(reg, d, n, 0xff); }

}  // namespace

namespace {

// CRC-32 by carry-less multiplication (Intel's "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ"): 64 bytes at a time are folded four 128-bit lanes forward by 512 bits,
// the lanes into one, then 128 -> 64 -> 32 bits and a Barrett reduction. The constants are
// x^k mod P(x) for the reflected Ethernet polynomial, as published with that method.
// Every path takes n >= 16 bytes, any length, and a byte `or4` ORed into byte 4 of the
// data: the ICRC's masked BTH byte, applied to the first block as it is loaded (no copy).
// x * K folded forward: its low half times K's low, its high half times K's high.
__attribute__((target("pclmul,sse4.1"))) inline __m128i clmul_fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul,sse4.1"))) inline __m128i load16(const uint8_t* at) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
}

// What the first block is XORed with: the register in bytes 0..3 (a CRC from register r
// over M is the CRC from 0 over M with r added to its first four bytes) and or4's bits
// in byte 4 (or4 is ORed: ORing is XORing with the bits that were not set yet).
__attribute__((target("pclmul,sse4.1"))) inline __m128i first_block(const uint8_t* p, uint32_t reg,
                                                                    uint8_t or4) {
  const __m128i data = load16(p);
  const __m128i ones4 = _mm_cvtsi32_si128(or4);
  const __m128i set4 = _mm_andnot_si128(data, _mm_slli_si128(ones4, 4));
  return _mm_xor_si128(_mm_xor_si128(data, set4), _mm_cvtsi32_si128(static_cast<int>(reg)));
}

// One 128-bit lane (everything folded so far, from a zero register), the rest `p`, `n` any
// length, to the CRC register.
// Always inlined: in the AVX2 path it is then VEX-encoded too (legacy SSE code right after
// 256-bit code pays a state transition on some CPUs).
__attribute__((target("pclmul,sse4.1"), always_inline)) inline uint32_t crc32_finish(__m128i x1, const uint8_t* p,
                                                                                     size_t n) {
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  for (; n >= 16; n -= 16, p += 16) x1 = _mm_xor_si128(clmul_fold(x1, k3k4), load16(p));
  if (n != 0) {
    // The last n < 16 bytes T: from a zero register, leading zero bytes change nothing, so
    // the stream [x1][T] is [16 - n zeros][x1][T], two whole blocks to fold as above.
    alignas(16) uint8_t both[32] = {};
    _mm_storeu_si128(reinterpret_cast<__m128i*>(both + 16 - n), x1);
    memcpy(both + 32 - n, p, n);
    x1 = _mm_xor_si128(clmul_fold(_mm_load_si128(reinterpret_cast<const __m128i*>(both)), k3k4),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(both + 16)));
  }
  // 128 -> 64 bits: the low half times k4, into the high half.
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(k3k4, x1, 0x01), _mm_srli_si128(x1, 8));
  // 64 -> 32 bits, k5.
  __m128i high = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), high);
  // Barrett reduction to 32 bits.
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly_mu, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(t, x1), 1));
}

// Four lanes (64 bytes folded so far) into one, 128 bits apart, then the rest.
__attribute__((target("pclmul,sse4.1"), always_inline)) inline uint32_t crc32_lanes(__m128i x1, __m128i x2, __m128i x3,
                                                                __m128i x4, const uint8_t* p,
                                                                size_t n) {
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  x1 = _mm_xor_si128(clmul_fold(x1, k3k4), x2);
  x1 = _mm_xor_si128(clmul_fold(x1, k3k4), x3);
  x1 = _mm_xor_si128(clmul_fold(x1, k3k4), x4);
  return crc32_finish(x1, p, n);
}

// n >= 16: one lane below 64 bytes, four from 64 on.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_clmul(uint32_t reg, const uint8_t* p,
                                                                size_t n, uint8_t or4) {
  const __m128i x0 = first_block(p, reg, or4);
  if (n < 64) return crc32_finish(x0, p + 16, n - 16);
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^480, x^544: 512 bits on
  __m128i x1 = x0, x2 = load16(p + 16), x3 = load16(p + 32), x4 = load16(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; n -= 64, p += 64) {
    x1 = _mm_xor_si128(clmul_fold(x1, k1k2), load16(p));
    x2 = _mm_xor_si128(clmul_fold(x2, k1k2), load16(p + 16));
    x3 = _mm_xor_si128(clmul_fold(x3, k1k2), load16(p + 32));
    x4 = _mm_xor_si128(clmul_fold(x4, k1k2), load16(p + 48));
  }
  return crc32_lanes(x1, x2, x3, x4, p, n);
}

// The same with AVX-512 VPCLMULQDQ: a 512-bit register is the four lanes above, and four of
// them take 256 bytes a step, each folded 2048 bits on (x^2016 and x^2080 mod P, reflected
// and shifted as the 512-bit constants are); then the four fold into one 512 bits apart.
// About twice the speed on 1 KiB packets, where most of a RoCE datagram's CRC time goes.
// n >= 256.
#define SV_AVX512_CLMUL __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))
SV_AVX512_CLMUL inline __m512i clmul_fold512(__m512i x, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11));
}

SV_AVX512_CLMUL uint32_t crc32_vclmul(uint32_t reg, const uint8_t* p, size_t n, uint8_t or4) {
  const __m512i k2048 = _mm512_set_epi64(0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a,
                                         0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a);
  const __m512i k512 = _mm512_set_epi64(0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4,
                                        0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4);
  __m512i a0 = _mm512_inserti32x4(_mm512_loadu_si512(p), first_block(p, reg, or4), 0);
  __m512i a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128),
          a3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  for (; n >= 256; n -= 256, p += 256) {
    a0 = _mm512_xor_si512(clmul_fold512(a0, k2048), _mm512_loadu_si512(p));
    a1 = _mm512_xor_si512(clmul_fold512(a1, k2048), _mm512_loadu_si512(p + 64));
    a2 = _mm512_xor_si512(clmul_fold512(a2, k2048), _mm512_loadu_si512(p + 128));
    a3 = _mm512_xor_si512(clmul_fold512(a3, k2048), _mm512_loadu_si512(p + 192));
  }
  a0 = _mm512_xor_si512(clmul_fold512(a0, k512), a1);
  a0 = _mm512_xor_si512(clmul_fold512(a0, k512), a2);
  a0 = _mm512_xor_si512(clmul_fold512(a0, k512), a3);
  for (; n >= 64; n -= 64, p += 64) a0 = _mm512_xor_si512(clmul_fold512(a0, k512), _mm512_loadu_si512(p));
  alignas(64) __m128i lanes[4];  // (gcc 12's lane-extract intrinsics warn spuriously)
  _mm512_store_si512(lanes, a0);
  return crc32_lanes(lanes[0], lanes[1], lanes[2], lanes[3], p, n);
}
#undef SV_AVX512_CLMUL

// The same with AVX2 VPCLMULQDQ (CPUs with it and without AVX-512): a 256-bit register is
// two lanes, four of them take 128 bytes a step, each folded 1024 bits on (x^992 and x^1056
// mod P); then the four fold into one 256 bits apart (x^224, x^288), and its two lanes
// finish as the PCLMULQDQ path's last lanes do. n >= 128.
#define SV_AVX2_CLMUL __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))
SV_AVX2_CLMUL inline __m256i clmul_fold256(__m256i x, __m256i k) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11));
}

SV_AVX2_CLMUL inline __m256i load32(const uint8_t* at) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
}

SV_AVX2_CLMUL uint32_t crc32_vclmul256(uint32_t reg, const uint8_t* p, size_t n, uint8_t or4) {
  const __m256i k1024 = _mm256_set_epi64x(0x14a7fe880, 0x1e88ef372, 0x14a7fe880, 0x1e88ef372);
  const __m256i k256 = _mm256_set_epi64x(0x15a546366, 0x0f1da05aa, 0x15a546366, 0x0f1da05aa);
  __m256i a0 = _mm256_inserti128_si256(load32(p), first_block(p, reg, or4), 0);
  __m256i a1 = load32(p + 32), a2 = load32(p + 64), a3 = load32(p + 96);
  p += 128;
  n -= 128;
  for (; n >= 128; n -= 128, p += 128) {
    a0 = _mm256_xor_si256(clmul_fold256(a0, k1024), load32(p));
    a1 = _mm256_xor_si256(clmul_fold256(a1, k1024), load32(p + 32));
    a2 = _mm256_xor_si256(clmul_fold256(a2, k1024), load32(p + 64));
    a3 = _mm256_xor_si256(clmul_fold256(a3, k1024), load32(p + 96));
  }
  a0 = _mm256_xor_si256(clmul_fold256(a0, k256), a1);
  a0 = _mm256_xor_si256(clmul_fold256(a0, k256), a2);
  a0 = _mm256_xor_si256(clmul_fold256(a0, k256), a3);
  // A zero lane folds to zero: the 32 bytes left are the last two of four.
  const __m128i zero = _mm_setzero_si128();
  return crc32_lanes(zero, zero, _mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1), p, n);
}
#undef SV_AVX2_CLMUL

// SOFTVERBS_NO_VPCLMUL=1 leaves both VPCLMULQDQ paths aside (tests of the plain one).
bool vpclmul_allowed() {
  static const bool yes = !std::getenv("SOFTVERBS_NO_VPCLMUL") && !std::getenv("SOFTVERBS_NO_CLMUL");
  return yes;
}

bool have_vclmul() {
  static const bool yes = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq") &&
                          !std::getenv("SOFTVERBS_NO_AVX512") && vpclmul_allowed();
  return yes;
}

bool have_vclmul256() {
  static const bool yes = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("vpclmulqdq") &&
                          __builtin_cpu_supports("pclmul") && vpclmul_allowed();
  return yes;
}

// SOFTVERBS_NO_CLMUL=1 leaves every carry-less path aside (tests of zlib and the tables).
bool have_clmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1") &&
                          !std::getenv("SOFTVERBS_NO_CLMUL");
  return yes;
}

// Eight bytes at a time through the tables, then one at a time.
uint32_t crc32_tables(uint32_t reg, const uint8_t* data, size_t n) {
  const CrcTables& c = tables();
  for (; n >= 8; n -= 8, data += 8) {
    const uint32_t lo = reg ^ load_le32(data);
    const uint32_t hi = load_le32(data + 4);
    reg = c.t[7][lo & 0xff] ^ c.t[6][(lo >> 8) & 0xff] ^ c.t[5][(lo >> 16) & 0xff] ^
          c.t[4][lo >> 24] ^ c.t[3][hi & 0xff] ^ c.t[2][(hi >> 8) & 0xff] ^
          c.t[1][(hi >> 16) & 0xff] ^ c.t[0][hi >> 24];
  }
  for (; n != 0; --n, ++data) reg = (reg >> 8) ^ c.t[0][(reg ^ *data) & 0xff];
  return reg;
}

// crc32_update with `or4` ORed into byte 4 of data (0: none).
uint32_t crc32_run(uint32_t reg, const uint8_t* data, size_t n, uint8_t or4) {
  // Long runs (payloads) by carry-less multiplication where the CPU has it, tail included,
  // else through zlib's CRC-32 (the same polynomial and reflection: zlib's crc32(c, p, n)
  // is ~crc32_update(~c, p, n)); both beat the tables (on this VM: tables 2.2 GB/s,
  // zlib 3.8). From 16 bytes on the carry-less path also beats two table steps.
  if (n >= 256 && have_vclmul()) return crc32_vclmul(reg, data, n, or4);
  if (n >= 128 && have_vclmul256()) return crc32_vclmul256(reg, data, n, or4);
  if (n >= 16 && have_clmul()) return crc32_clmul(reg, data, n, or4);
  if (or4 != 0 && n > 4) {
    uint8_t head[8];
    const size_t h = n < sizeof head ? n : sizeof head;
    memcpy(head, data, h);
    head[4] |= or4;
    reg = crc32_tables(reg, head, h);
    data += h;
    n -= h;
  }
  if (n >= 256) return ~static_cast<uint32_t>(::crc32(~reg, data, static_cast<uInt>(n)));
  return crc32_tables(reg, data, n);
}

}  // namespace

uint32_t crc32_update(uint32_t reg, const uint8_t* data, size_t n) { return crc32_run(reg, data, n, 0); }

IcrcContext IcrcContext::from_gids(const uint8_t sgid[16], const uint8_t dgid[16],
                                   uint16_t src_port, uint16_t dst_port) {
  static constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  IcrcContext c;
  memcpy(c.src_ip.data(), sgid, 16);
  memcpy(c.dst_ip.data(), dgid, 16);
  c.ipv6 = memcmp(sgid, kV4Mapped, 12) != 0 || memcmp(dgid, kV4Mapped, 12) != 0;
  c.src_port = src_port;
  c.dst_port = dst_port;
  return c;
}

IcrcContext IcrcContext::from_ipv4(const uint8_t src[4], const uint8_t dst[4],
                                   uint16_t src_port, uint16_t dst_port) {
  uint8_t sgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  uint8_t dgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  memcpy(sgid + 12, src, 4);
  memcpy(dgid + 12, dst, 4);
  return from_gids(sgid, dgid, src_port, dst_port);
}

IcrcBuilder::IcrcBuilder(const IcrcContext& ctx, size_t len) {
  // A sender's IDs other than 0 are a UDP GSO send's segment numbers: from the 16th segment
  // of one length on, it is a stream, worth the per-length tables (about one 4 KiB CRC).
  constexpr uint16_t kStreamSegments = 16;
  if (ctx.ipv6 || ctx.ipv4_id == 0) {
    reg_ = pseudo_reg(ctx, len);
  } else if (const IdSolver* s = ctx.ipv4_id >= kStreamSegments ? &solver_for(len)
                                                                : solver_if_built(len)) {
    reg_ = pseudo_reg(ctx, len);
    id_delta_ = s->id_delta(ctx.ipv4_id);
  } else {
    uint8_t pseudo[kMaxPseudoBytes];
    reg_ = crc32_update(0xffffffff, pseudo, pseudo_header(ctx, len, pseudo));
  }
}

void IcrcBuilder::add_all(const uint8_t* dgram, size_t n) {
  reg_ = body_crc(reg_, dgram, n);
  offset_ = n;
}

void IcrcBuilder::add(const uint8_t* data, size_t n) {
  constexpr size_t kMaskedBthByte = 4;  // FECN, BECN and reserved bits: variant
  if (offset_ == 0 && n > kMaskedBthByte) {
    reg_ = crc32_run(reg_, data, n, 0xff);
    offset_ = n;
    return;
  }
  if (offset_ <= kMaskedBthByte && offset_ + n > kMaskedBthByte) {
    const size_t before = kMaskedBthByte - offset_;
    static constexpr uint8_t kOnes = 0xff;
    reg_ = crc32_update(reg_, data, before);
    reg_ = crc32_update(reg_, &kOnes, 1);
    data += before + 1;
    n -= before + 1;
    offset_ += before + 1;
  }
  reg_ = crc32_update(reg_, data, n);
  offset_ += n;
}

uint32_t icrc(const IcrcContext& ctx, const uint8_t* dgram, size_t len_without_icrc) {
  const size_t len = len_without_icrc + kIcrcBytes;
  IcrcBuilder b(ctx, len);
  b.add_all(dgram, len_without_icrc);
  return b.value();
}

uint32_t icrc_stored(const uint8_t* dgram, size_t len) {
  return load_le32(dgram + len - kIcrcBytes);
}

void icrc_fill(const IcrcContext& ctx, uint8_t* dgram, size_t len) {
  if (len < kIcrcBytes) return;
  const uint32_t v = icrc(ctx, dgram, len - kIcrcBytes);
  memcpy(dgram + len - kIcrcBytes, &v, 4);  // little-endian host: least significant first
}

bool icrc_check_exact(const IcrcContext& ctx, const uint8_t* dgram, size_t len) {
  if (len < kIcrcBytes || len > kMaxDatagramBytes) return false;
  return icrc(ctx, dgram, len - kIcrcBytes) == icrc_stored(dgram, len);
}

IcrcCheck icrc_check(const IcrcContext& ctx, const uint8_t* dgram, size_t len) {
  IcrcCheck check;
  if (len < kIcrcBytes || len > kMaxDatagramBytes) return check;
  // One pass with ID 0 (and ctx's DF); what the sender's ID must add to it is `target`.
  const uint32_t computed = ~body_crc(pseudo_reg(ctx, len), dgram, len - kIcrcBytes);
  const uint32_t target = computed ^ icrc_stored(dgram, len);
  const uint16_t id = ctx.ipv6 ? 0 : ctx.ipv4_id;
  if (target == 0) {  // ID 0, what a lone datagram of softverbs or rxe carries: no search
    check.result = id == 0 ? IcrcCheck::kExact : IcrcCheck::kSomeIpv4Id;
    check.ipv4_id = id == 0 ? ctx.ipv4_id : 0;
    check.ipv4_df = ctx.ipv4_df;
    return check;
  }
  if (ctx.ipv6 || len > kMaxDatagramBytes - 20) return check;
  const IdSolver& solver = solver_for(len);
  if (id != 0 && solver.id_delta(id) == target) {  // the ID ctx expected
    check.result = IcrcCheck::kExact;
    check.ipv4_id = id;
    check.ipv4_df = ctx.ipv4_df;
    return check;
  }
  uint32_t flips;
  if (!solver.solve(target, &flips)) return check;
  check.result = IcrcCheck::kSomeIpv4Id;
  check.ipv4_id = uint16_t(flips & 0xffff);
  check.ipv4_df = ctx.ipv4_df != bool(flips >> 16);
  return check;
}

}  // namespace softverbs::wire::roce
