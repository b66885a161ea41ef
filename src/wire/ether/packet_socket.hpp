// The port's Ethernet, for raw packet QPs (IBV_QPT_RAW_PACKET): frames go out and come in
// through AF_PACKET sockets on one network interface of this host, so a raw QP talks to
// the other raw QPs of this host (in any process) and to whatever is on that link, as a
// NIC's raw Ethernet QP does. Which interface: docs/raw-packet.md.
//
// AF_PACKET needs CAP_NET_RAW, as the kernel asks of a raw packet QP on a real NIC: the
// sender opened at QP creation is that check.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace softverbs::wire::ether {

// The interface: $SOFTVERBS_RAW_NETDEV, else the one of the default IPv4 route, else "lo".
std::string netdev_name();

// One sender for the process, opened by the first raw QP and closed with the last.
// 0, or an errno (EPERM without CAP_NET_RAW, ENODEV without the interface).
int hold_sender();
void release_sender();
// The largest frame the interface takes: its MTU, the Ethernet header and one VLAN tag.
size_t max_frame();
// Sends one frame gathered from v[0..n) of `len` bytes (hold_sender first). A frame the
// link drops (the interface down, no buffer) is lost, as Ethernet loses it: 0 all the same.
// EMSGSIZE when it is shorter than an Ethernet header or longer than max_frame() (than
// max_frame() less the tag when it has no 802.1Q/802.1ad tag).
int send_frame(const iovec* v, int n, size_t len);

// Frames that come in, and those this host sends on the interface (a NIC's loopback: the
// raw QPs of one port see each other's frames). `outgoing`: sent from this host.
using FrameHandler = void (*)(const uint8_t* frame, size_t len, bool outgoing);
// The receiver runs while anyone holds it: a thread blocked in poll on the socket. The
// handler is called on that thread, one frame at a time. 0 or an errno.
int hold_receiver(FrameHandler handler);
void release_receiver();
// A thread polling a CQ fed by raw QPs takes the frames waiting on the receiver's socket
// itself (at most `max`; how many it took), in order with the receiver thread's. While one
// does, the receiver thread stops watching the socket (it looks again every few ms, or at
// once after stop_polling): a frame costs no thread wake-up then.
int poll_frames(int max);
void stop_polling();  // the application is about to wait for an event
// Whether a receiver runs (rules exist): a load, for the empty-poll path.
bool receiving();

// The interface's own MAC (zero for lo): an outgoing frame loops back to this host's raw
// QPs when it is addressed to it, or to a group.
const uint8_t* own_mac();
// While rules want frames to other hosts' MACs (sniffers, catch-alls, rules on another
// unicast MAC), the receiver takes every frame on the link (promiscuous), as a NIC's
// steering sees what the wire brings. Group frames it always takes.
// `generation` orders concurrent callers: an older answer than the last applied is ignored.
void set_promiscuous(bool on, uint64_t generation);

}  // namespace softverbs::wire::ether
