// The host-wide state directory every softverbs library in every process agrees on:
// $SOFTVERBS_STATE_DIR, else /dev/shm/softverbs-<uid>. Tests give each run its own.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace softverbs {

inline std::string state_dir() {
  if (const char* dir = std::getenv("SOFTVERBS_STATE_DIR"); dir && *dir) return dir;
  return "/dev/shm/softverbs-" + std::to_string(getuid());
}

// The first line of a state file (e.g. "down", "fatal <token>"), without trailing blanks;
// empty when the file is not there.
inline std::string read_state_word(const std::string& name) {
  std::ifstream in(state_dir() + "/" + name);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace softverbs
