// Classic libpcap files of RoCE v2 datagrams in synthesized Ethernet/IP/UDP frames.
// File format: 24-byte file header, then per record a 16-byte header and the frame, all in
// the writer's byte order (readers tell by the magic number).
#include "wire/roce/pcap.hpp"

#include <cerrno>
#include <cstring>

#include "wire/roce/bytes.hpp"

namespace softverbs::wire::roce {
namespace {

constexpr uint32_t kMagicNanoseconds = 0xa1b23c4d;
constexpr uint32_t kLinkTypeEthernet = 1;
constexpr uint32_t kSnapLen = 262144;

// One's complement sum of 16-bit big-endian words (RFC 1071), not yet folded.
uint64_t ones_sum(const uint8_t* p, size_t n, uint64_t sum = 0) {
  for (; n >= 2; n -= 2, p += 2) sum += uint32_t(p[0]) << 8 | p[1];
  if (n) sum += uint32_t(p[0]) << 8;
  return sum;
}
uint16_t fold(uint64_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(~sum);
}

// Ethernet, IP and UDP headers for the datagram into h[kMaxFrameOverhead]; returns their
// length, 0 if the datagram is too long for the IP version.
size_t frame_headers(const IcrcContext& c, const uint8_t* dgram, size_t len, uint8_t* h) {
  const size_t udp_len = len + 8;
  if (udp_len > 65535 || (!c.ipv6 && udp_len + 20 > 65535)) return 0;
  static constexpr uint8_t kMacs[12] = {2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1};  // dst, src
  memcpy(h, kMacs, 12);
  put16(h + 12, c.ipv6 ? 0x86dd : 0x0800);
  uint8_t* ip = h + 14;
  uint64_t pseudo_sum;  // the UDP checksum's pseudo-header
  size_t ip_bytes;
  if (c.ipv6) {
    memset(ip, 0, 4);
    ip[0] = 0x60;
    put16(ip + 4, uint32_t(udp_len));
    ip[6] = 17;
    ip[7] = 64;
    memcpy(ip + 8, c.src_ip.data(), 16);
    memcpy(ip + 24, c.dst_ip.data(), 16);
    ip_bytes = 40;
    pseudo_sum = ones_sum(ip + 8, 32) + udp_len + 17;
  } else {
    ip[0] = 0x45;
    ip[1] = 0;
    put16(ip + 2, uint32_t(udp_len + 20));
    put16(ip + 4, c.ipv4_id);
    put16(ip + 6, c.ipv4_df ? 0x4000 : 0);
    ip[8] = 64;
    ip[9] = 17;
    put16(ip + 10, 0);
    memcpy(ip + 12, c.src_ip.data() + 12, 4);
    memcpy(ip + 16, c.dst_ip.data() + 12, 4);
    put16(ip + 10, fold(ones_sum(ip, 20)));
    ip_bytes = 20;
    pseudo_sum = ones_sum(ip + 12, 8) + udp_len + 17;
  }
  uint8_t* udp = ip + ip_bytes;
  put16(udp, c.src_port);
  put16(udp + 2, c.dst_port);
  put16(udp + 4, uint32_t(udp_len));
  put16(udp + 6, 0);
  uint16_t sum = fold(ones_sum(dgram, len, ones_sum(udp, 8, pseudo_sum)));
  put16(udp + 6, sum == 0 ? 0xffff : sum);  // 0 would mean "no checksum"
  return 14 + ip_bytes + 8;
}

}  // namespace

size_t ethernet_frame(const IcrcContext& ctx, const uint8_t* dgram, size_t len, uint8_t* out,
                      size_t cap) {
  uint8_t headers[kMaxFrameOverhead];
  const size_t n = frame_headers(ctx, dgram, len, headers);
  if (n == 0 || cap < n + len) return 0;
  memcpy(out, headers, n);
  if (len != 0) memcpy(out + n, dgram, len);
  return n + len;
}

bool PcapWriter::open(const char* path) {
  std::lock_guard lock(mutex_);
  if (file_ != nullptr) {
    errno = EBUSY;
    return false;
  }
  FILE* f = fopen(path, "wbe");
  if (f == nullptr) return false;
  const uint32_t header[6] = {kMagicNanoseconds, 2 | 4u << 16, 0, 0, kSnapLen, kLinkTypeEthernet};
  if (fwrite(header, sizeof header, 1, f) != 1) {
    const int saved = errno;
    fclose(f);
    errno = saved;
    return false;
  }
  // The header reaches the file now: a process that ends with _exit still leaves a valid
  // (if empty) capture.
  if (fflush(f) != 0) {
    const int saved = errno;
    fclose(f);
    errno = saved;
    return false;
  }
  file_ = f;
  failed_ = false;
  return true;
}

bool PcapWriter::write(const IcrcContext& ctx, const uint8_t* dgram, size_t len) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return write(ctx, dgram, len, now);
}

bool PcapWriter::write(const IcrcContext& ctx, const uint8_t* dgram, size_t len,
                       const timespec& when) {
  uint8_t headers[kMaxFrameOverhead];
  const size_t n = frame_headers(ctx, dgram, len, headers);
  if (n == 0) return false;
  const uint32_t frame = uint32_t(n + len);
  const uint32_t record[4] = {uint32_t(when.tv_sec), uint32_t(when.tv_nsec), frame, frame};
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return false;
  bool ok = fwrite(record, sizeof record, 1, file_) == 1 && fwrite(headers, n, 1, file_) == 1 &&
            (len == 0 || fwrite(dgram, len, 1, file_) == 1);
  if (!ok) failed_ = true;
  return ok;
}

bool PcapWriter::write_frame(const iovec* v, int n, size_t len) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const uint32_t frame = uint32_t(len);
  const uint32_t record[4] = {uint32_t(now.tv_sec), uint32_t(now.tv_nsec), frame, frame};
  std::lock_guard lock(mutex_);
  if (file_ == nullptr || len > 0xffffffffu) return false;
  bool ok = fwrite(record, sizeof record, 1, file_) == 1;
  size_t left = len;
  for (int i = 0; ok && i < n && left > 0; ++i) {
    size_t k = v[i].iov_len < left ? v[i].iov_len : left;
    ok = k == 0 || fwrite(v[i].iov_base, k, 1, file_) == 1;
    left -= k;
  }
  if (!ok) failed_ = true;
  return ok;
}

bool PcapWriter::flush() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return false;
  if (fflush(file_) != 0) failed_ = true;
  return !failed_;
}

bool PcapWriter::close() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return true;
  const bool ok = fclose(file_) == 0 && !failed_;
  file_ = nullptr;
  return ok;
}

bool PcapWriter::is_open() const {
  std::lock_guard lock(mutex_);
  return file_ != nullptr;
}

}  // namespace softverbs::wire::roce
