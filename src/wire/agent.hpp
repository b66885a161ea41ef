// The agent: one thread per process that serves requests from other processes of this
// host for the QPs of this process. It sleeps in poll(2) on its sockets (never spins),
// runs the responder on the target QP and answers; payload moves directly between the
// requester's buffers and ours with cross-memory attach, so no copy goes through the socket.
#pragma once

#include "wire/arena.hpp"
#include "wire/transport.hpp"

namespace softverbs::wire {

// Starts the agent of this process (once, and again in a forked child).
void start_agent(const EngineHooks& hooks);
// Sends `req` to the agent of `slot` and waits for its answer. A peer that is gone, or
// does not answer within the deadline, is NoResponse.
Reply agent_call(int slot, const Request& req);
// Asks the agent of `slot` to retry the send queue of QP `qpn` (no answer expected).
void agent_kick(int slot, uint32_t qpn);
// Asks the agent of `slot` for the receive window of its QP `dst_qpn` for our QP
// `src_qpn`: maps that process's arena here and returns the window's offset, or 0.
// *wake_fd gets an fd that wakes the target's completion channel (or -1); ours to close.
uint64_t agent_open_window(int slot, uint32_t src_qpn, uint32_t dst_qpn, PeerArena* arena,
                           int* wake_fd);
// True when SOFTVERBS_NO_CMA asks for payload through sockets instead of cross-memory attach.
bool cross_memory_disabled();
// Asks the agent of `slot` to drain the receive window of its QP `dst_qpn` (no answer).
void agent_drain(int slot, uint32_t dst_qpn);

}  // namespace softverbs::wire
