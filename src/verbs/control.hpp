// Host-wide soft "hardware" state that the `softverbs` command changes, as `ip link set`
// would for a real port: files in the state directory ($SOFTVERBS_STATE_DIR, default
// /dev/shm/softverbs-<uid>), watched with inotify by one thread per process that blocks
// in read(2). Changes raise the async events a NIC would (PORT_ERR, PORT_ACTIVE,
// DEVICE_FATAL) on every open context of this process.
//   port1:  "up" or "down" (level: read at start, events on change)
//   device: "fatal <token>" (edge: a new token raises DEVICE_FATAL in running processes)
//   inject.<pid>: a `softverbs inject` request for one process (verbs/inject.hpp), answered
//           in inject-reply.<pid>
#pragma once

#include <string>

namespace softverbs::control {

std::string state_dir();
// Reads the current state and starts the watcher (once per process, again after fork).
void start_watcher();

}  // namespace softverbs::control
