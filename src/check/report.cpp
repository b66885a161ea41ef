// How the checker speaks: SOFTVERBS_CHECK read once at load, one report per object and kind
// on stderr or SOFTVERBS_CHECK_FILE ("%p" in it becomes the pid), call sites named with
// dladdr(3), the caller's backtrace with SOFTVERBS_CHECK=stack, and at exit the resources
// still there and a summary table.
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "check/state.hpp"

namespace softverbs::check {

bool enabled = false;

namespace {

bool g_stack = false;
const char* g_file = nullptr;  // SOFTVERBS_CHECK_FILE, or null: stderr
pid_t g_pid = 0;               // the process that loaded us (a forked child has another)
std::atomic<uint64_t> g_calls{0};

struct Tally {
  uint64_t count = 0;
  std::string first;  // where the first one was
};

// Reports and their tally: their own lock, so that a report can be made while the caller
// holds nothing and state().mu is free for others. Never freed: at_exit runs when the
// library's static objects may be gone already.
struct Reports {
  std::mutex mu;
  std::set<std::pair<std::string, const void*>> reported;
  std::map<std::string, Tally> tally;
};
Reports& reports() {
  static Reports* r = new Reports;
  return *r;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// Writes `text` whole to the report file (opened per write: a forked child with "%p" in
// the name gets its own file) or stderr.
void emit(const std::string& text) {
  int fd = 2;
  if (g_file) {
    std::string path = g_file;
    if (size_t at = path.find("%p"); at != std::string::npos)
      path.replace(at, 2, std::to_string(getpid()));
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) fd = 2;
  }
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (fd != 2) close(fd);
}

// Frames of this library are ours, not the caller's.
bool in_this_library(void* pc) {
  Dl_info self{}, it{};
  return dladdr(reinterpret_cast<void*>(&emit), &self) && dladdr(pc, &it) &&
         self.dli_fbase == it.dli_fbase;
}

std::string backtrace_text() {
  void* frames[48];
  int n = backtrace(frames, 48);
  std::string out = "  backtrace:\n";
  int shown = 0;
  for (int i = 0; i < n; ++i) {
    if (in_this_library(frames[i])) continue;
    out += format("    #%d %s\n", shown++, where(frames[i]).c_str());
  }
  return out;
}

void at_exit();

__attribute__((constructor)) void read_environment() {
  const char* v = getenv("SOFTVERBS_CHECK");
  if (!v || !*v || std::strcmp(v, "0") == 0) return;
  g_stack = std::strcmp(v, "stack") == 0;
  const char* file = getenv("SOFTVERBS_CHECK_FILE");
  g_file = file && *file ? strdup(file) : nullptr;
  g_pid = getpid();
  install_engine_hooks();
  // Registered before main() runs: it runs after the program's own atexit handlers, which
  // may still free resources.
  atexit(&at_exit);
  enabled = true;
}

// Resources still there at exit (not those librdmacm made for itself), events not acked.
void report_leaks() {
  std::vector<std::pair<Kind, ObjState>> left;
  std::vector<const void*> handles;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    for (auto& [handle, o] : state().objects) {
      if (o.internal || o.kind == Kind::Context) continue;
      left.emplace_back(o.kind, o);
      handles.push_back(handle);
    }
  }
  // In the order they were made.
  std::vector<size_t> order(left.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return left[a].second.seq < left[b].second.seq; });
  std::string what;
  size_t shown = 0;
  for (size_t i : order) {
    const ObjState& o = left[i].second;
    if (++shown > 20) continue;
    what += format("    %s %p made at %s", kind_name(o.kind), handles[i], where(o.site).c_str());
    if (o.kind == Kind::Cq) {
      Cq* cq = Cq::from(static_cast<ibv_cq*>(const_cast<void*>(handles[i])));
      if (cq && cq->comp_events_reported > cq->cq()->comp_events_completed)
        what += format(", %u completion event(s) not acked",
                       cq->comp_events_reported - cq->cq()->comp_events_completed);
    }
    what += "\n";
  }
  if (shown > 20) what += format("    ... and %zu more\n", shown - 20);
  if (left.empty()) return;
  what.pop_back();
  report("leak", nullptr, "exit", nullptr,
         format("  %zu verbs resource(s) not destroyed:\n", left.size()) + what,
         "each ibv_create_*/ibv_alloc_*/ibv_reg_mr has its ibv_destroy_*/ibv_dealloc_*/"
         "ibv_dereg_mr; a NIC keeps what a process leaks until its file closes");
}

void at_exit() {
  if (getpid() != g_pid) return;  // a forked child that exits holds its parent's objects
  report_leaks();
  std::lock_guard<std::mutex> lock(reports().mu);
  uint64_t total = 0;
  for (auto& [kind, t] : reports().tally) total += t.count;
  if (total == 0) {
    emit(format("softverbs check: pid %d: no misuse found (%llu verbs calls checked)\n",
                static_cast<int>(getpid()), static_cast<unsigned long long>(g_calls.load())));
    return;
  }
  std::string out = format("softverbs check: summary of pid %d: %llu report(s), %llu verbs calls checked\n",
                           static_cast<int>(getpid()), static_cast<unsigned long long>(total),
                           static_cast<unsigned long long>(g_calls.load()));
  out += format("  %-22s %7s  %s\n", "check", "reports", "first at");
  for (auto& [kind, t] : reports().tally)
    out += format("  %-22s %7llu  %s\n", kind.c_str(), static_cast<unsigned long long>(t.count),
                  t.first.c_str());
  emit(out);
}

}  // namespace

State& state() {
  static State* s = new State;  // never freed: at_exit and late calls still use it
  return *s;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Context: return "context";
    case Kind::Pd: return "PD";
    case Kind::Mr: return "MR";
    case Kind::Mw: return "MW";
    case Kind::Cq: return "CQ";
    case Kind::Channel: return "channel";
    case Kind::Qp: return "QP";
    case Kind::Srq: return "SRQ";
    case Kind::Ah: return "AH";
  }
  return "object";
}

std::string where(Site site) {
  if (!site) return "?";
  // A return address is one past the call: look up the call itself.
  void* pc = const_cast<void*>(site);
  Dl_info info{};
  if (!dladdr(static_cast<char*>(pc) - 1, &info) || !info.dli_fname) return format("%p", pc);
  const char* file = std::strrchr(info.dli_fname, '/');
  file = file ? file + 1 : info.dli_fname;
  if (!*file) file = program_invocation_short_name;
  if (info.dli_sname && info.dli_saddr)
    return format("%s+0x%zx (%s)", info.dli_sname,
                  static_cast<size_t>(static_cast<char*>(pc) - static_cast<char*>(info.dli_saddr)), file);
  // No symbol (a program linked without -rdynamic): the offset addr2line -e FILE takes.
  return format("%s+0x%zx", file,
                static_cast<size_t>(static_cast<char*>(pc) - static_cast<char*>(info.dli_fbase)));
}

bool report(const char* kind, const void* object, const std::string& call, Site site,
            const std::string& what, const char* rule) {
  std::string at = site ? where(site) : call;
  {
    std::lock_guard<std::mutex> lock(reports().mu);
    if (!reports().reported.emplace(kind, object).second) return false;
    Tally& t = reports().tally[kind];
    if (t.count++ == 0) t.first = at;
  }
  std::string text = format("softverbs check: [%s] %s", kind, call.c_str());
  if (site) text += " at " + at;
  text += "\n" + what + "\n";
  if (rule) text += std::string("  rule: ") + rule + "\n";
  if (g_stack && site) text += backtrace_text();
  emit(text);
  return true;
}

void count_call() { g_calls.fetch_add(1, std::memory_order_relaxed); }

}  // namespace softverbs::check
