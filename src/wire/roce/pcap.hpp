// A capture file of RoCE v2 traffic in the classic libpcap format (LINKTYPE_ETHERNET,
// nanosecond timestamps), for `softverbs trace -w FILE`: each RoCE datagram is wrapped in a
// synthesized Ethernet, IP and UDP header built from its addressing, so Wireshark and
// tshark dissect UDP port 4791 as RoCE v2 (their "InfiniBand" dissector). The IP header
// carries the context's IPv4 ID and DF bit, so the frame's ICRC checks out when the
// datagram's did against that context.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "wire/roce/icrc.hpp"

namespace softverbs::wire::roce {

// Ethernet (14) + IPv6 (40) + UDP (8) in front of a datagram.
inline constexpr size_t kMaxFrameOverhead = 14 + 40 + 8;

// Writes the Ethernet, IP and UDP headers and the datagram into out; returns the frame's
// length, 0 if cap is too small or the datagram too long for the IP version. Addresses and
// ports from ctx; MACs are made up (locally administered 02:00:00:00:00:01 and :02), TTL
// and hop limit 64, TOS 0, checksums (IP and UDP) filled in.
size_t ethernet_frame(const IcrcContext& ctx, const uint8_t* dgram, size_t len, uint8_t* out,
                      size_t cap);

class PcapWriter {
 public:
  PcapWriter() = default;
  ~PcapWriter() { close(); }
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Creates (or truncates) the file and writes the file header. False (errno set) on
  // failure or if already open.
  bool open(const char* path);
  // Appends one datagram (everything after the UDP header, ICRC included) as a frame,
  // stamped now or at `when` (CLOCK_REALTIME). Safe from any thread; a record is written
  // whole. False when closed, when the datagram is too long, or on a write error.
  bool write(const IcrcContext& ctx, const uint8_t* dgram, size_t len);
  bool write(const IcrcContext& ctx, const uint8_t* dgram, size_t len, const timespec& when);
  // Appends one whole Ethernet frame gathered from v[0..n), `len` bytes (a raw packet QP's,
  // docs/raw-packet.md), stamped now. Same guarantees as write.
  bool write_frame(const iovec* v, int n, size_t len);
  // Pushes buffered records to the file.
  bool flush();
  // Flushes and closes; false if any write since open failed. Closing twice is harmless.
  bool close();
  bool is_open() const;

 private:
  mutable std::mutex mutex_;
  FILE* file_ = nullptr;
  bool failed_ = false;
};

}  // namespace softverbs::wire::roce
