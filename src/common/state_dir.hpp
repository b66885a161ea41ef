// The host-wide state directory every softverbs library in every process agrees on:
// $SOFTVERBS_STATE_DIR, else /dev/shm/softverbs-<uid>. Tests give each run its own.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace softverbs {

inline std::string state_dir() {
  if (const char* dir = std::getenv("SOFTVERBS_STATE_DIR"); dir && *dir) return dir;
  return "/dev/shm/softverbs-" + std::to_string(getuid());
}

}  // namespace softverbs
