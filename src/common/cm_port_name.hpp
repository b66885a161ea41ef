// The host-wide names of rdma_cm's ports (decision 0004): every bound rdma_cm id holds an
// abstract Unix SOCK_SEQPACKET socket named after (state directory, port space, port), so
// a port belongs to one process of the host. librdmacm binds and connects to these names;
// the RoCE v2 receive path asks who holds one, to pass a REQ from another host to the
// process that listens there (decision 0007).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstdint>

namespace softverbs {

// The abstract address of (port space, port): `ps` is rdma_port_space's value (0x0106 for
// RDMA_PS_TCP, as in the service ID). Returns the address length.
socklen_t cm_port_name(int ps, uint16_t port, sockaddr_un* out);

// The pid of the process that holds (ps, port) and listens on it, 0 when nobody does.
// Connects to the name (non-blocking) and reads SO_PEERCRED, the listener's credentials
// from its listen(); the listener sees a connection that closes before its first message,
// which it drops. Only a listening name answers: a bound, unlistening one refuses.
pid_t cm_port_holder(int ps, uint16_t port);

}  // namespace softverbs
