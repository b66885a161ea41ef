#include "verbs/control.hpp"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/state_dir.hpp"
#include "engine/engine.hpp"
#include "core/device.hpp"
#include "verbs/inject.hpp"
#include "verbs/verbs.hpp"

namespace softverbs::control {

namespace {

std::mutex& g_mu = *new std::mutex;  // immortal: the watcher thread outlives exit()
pid_t g_owner = 0;
std::string& g_device_token = *new std::string;  // last "device" content seen; a change to "fatal …" fires

void apply_port_state(bool raise) {
  std::string s = read_state_word("port1");
  bool up = s != "down";
  Device& dev = Device::instance();
  if (dev.port_active() == up) return;
  dev.set_port_active(up);
  if (raise) raise_port_event(up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
}

void apply_device_state() {
  std::string s = read_state_word("device");
  std::lock_guard<std::mutex> lock(g_mu);
  if (s == g_device_token) return;
  g_device_token = s;
  if (s.rfind("fatal", 0) == 0) raise_device_fatal();
}

void watch(int fd) {
  alignas(inotify_event) char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));  // blocks: no spinning
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      if (ev->len) {
        if (std::strcmp(ev->name, "port1") == 0) apply_port_state(true);
        if (std::strcmp(ev->name, "device") == 0) apply_device_state();
        if (inject::is_request(ev->name)) inject::apply();
      }
      p += sizeof(inotify_event) + ev->len;
    }
  }
}

}  // namespace

std::string state_dir() { return softverbs::state_dir(); }

void start_watcher() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_owner == getpid()) return;
    g_owner = getpid();
    g_device_token = read_state_word("device");  // baseline: no event
  }
  inject::baseline();
  std::string dir = state_dir();
  mkdir(dir.c_str(), 0700);
  apply_port_state(false);
  int fd = inotify_init1(IN_CLOEXEC);
  if (fd < 0) return;
  if (inotify_add_watch(fd, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    close(fd);
    return;
  }
  std::thread(watch, fd).detach();
}

}  // namespace softverbs::control
