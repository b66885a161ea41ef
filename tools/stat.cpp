// softverbs-stat: what `softverbs stat [PID]` runs. Reads the stat segments that softverbs
// processes publish in $STATE_DIR/stat (src/common/stat_segment.hpp) and the live fields
// they point at (process_vm_readv, /proc/PID/fdinfo), and prints every process's verbs
// objects as tables or JSON. It never needs the target to answer: a process stopped under
// a debugger reads like a running one, a dead one shows what its segment last said.
// Everything read is untrusted (a process may die mid-write or leave garbage): bounds are
// checked, and what cannot be read shows as "?" (null in JSON).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/qp_state_name.hpp"
#include "common/stat_segment.hpp"

namespace {

using namespace softverbs::stat;
using softverbs::qp_state_name;

// ---- a small JSON-like value, printed as JSON or as table cells ---------------------------

struct Val {
  // kNull: could not be read ("?"); kNone: there is none (a CQ without a channel: "-").
  enum Type { kNull, kNone, kNum, kStr, kBool, kObj, kArr } type = kNull;
  std::string text;  // kNum: digits; kStr: the string
  bool hex = false;  // kNum: tables show it in hex
  uint64_t num = 0;
  bool flag = false;
  std::vector<std::pair<std::string, Val>> fields;
  std::vector<Val> items;

  static Val number(uint64_t v, bool hex = false) {
    Val x;
    x.type = kNum;
    x.num = v;
    x.text = std::to_string(v);
    x.hex = hex;
    return x;
  }
  static Val signed_number(int64_t v) {
    Val x = number(static_cast<uint64_t>(v));
    x.text = std::to_string(v);
    return x;
  }
  static Val none() {
    Val x;
    x.type = kNone;
    return x;
  }
  static Val string(std::string s) {
    Val x;
    x.type = kStr;
    x.text = std::move(s);
    return x;
  }
  static Val boolean(bool b) {
    Val x;
    x.type = kBool;
    x.flag = b;
    return x;
  }
  static Val object() {
    Val x;
    x.type = kObj;
    return x;
  }
  static Val array() {
    Val x;
    x.type = kArr;
    return x;
  }
  template <typename T>
  static Val maybe(const std::optional<T>& v, bool hex = false) {
    return v ? number(static_cast<uint64_t>(*v), hex) : Val{};
  }
  Val& set(const std::string& key, Val v) {
    fields.emplace_back(key, std::move(v));
    return *this;
  }
  const Val* get(const std::string& key) const {
    for (const auto& [k, v] : fields)
      if (k == key) return &v;
    return nullptr;
  }
};

Val address(uint64_t a) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(a));
  return Val::string(buf);
}

void print_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {  // segment strings are untrusted bytes
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

void print_json(std::string& out, const Val& v, int indent) {
  std::string pad(indent + 2, ' ');
  switch (v.type) {
    case Val::kNull:
    case Val::kNone: out += "null"; break;
    case Val::kNum: out += v.text; break;
    case Val::kStr: print_json_string(out, v.text); break;
    case Val::kBool: out += v.flag ? "true" : "false"; break;
    case Val::kObj:
      if (v.fields.empty()) {
        out += "{}";
        break;
      }
      out += "{\n";
      for (size_t i = 0; i < v.fields.size(); ++i) {
        out += pad;
        print_json_string(out, v.fields[i].first);
        out += ": ";
        print_json(out, v.fields[i].second, indent + 2);
        out += i + 1 < v.fields.size() ? ",\n" : "\n";
      }
      out += std::string(indent, ' ') + "}";
      break;
    case Val::kArr:
      if (v.items.empty()) {
        out += "[]";
        break;
      }
      out += "[\n";
      for (size_t i = 0; i < v.items.size(); ++i) {
        out += pad;
        print_json(out, v.items[i], indent + 2);
        out += i + 1 < v.items.size() ? ",\n" : "\n";
      }
      out += std::string(indent, ' ') + "]";
      break;
  }
}

// ---- reading another process --------------------------------------------------------------

std::string state_dir() {
  if (const char* dir = std::getenv("SOFTVERBS_STATE_DIR"); dir && *dir) return dir;
  return "/dev/shm/softverbs-" + std::to_string(getuid());
}

bool read_small_file(const std::string& path, std::string* out, size_t limit = 1 << 16) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  out->clear();
  char buf[4096];
  ssize_t n;
  while (out->size() < limit && (n = read(fd, buf, sizeof(buf))) > 0) out->append(buf, n);
  close(fd);
  return true;
}

struct ProcInfo {
  bool exists = false;
  char state = '?';
  uint64_t start_time = 0;
};

ProcInfo proc_info(pid_t pid) {
  ProcInfo info;
  std::string line;
  if (!read_small_file("/proc/" + std::to_string(pid) + "/stat", &line)) return info;
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return info;
  info.exists = true;
  info.state = line[close + 2];
  const char* p = line.c_str() + close + 1;
  for (int field = 3; field < 22 && *p; ++field) {
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
  }
  info.start_time = std::strtoull(p, nullptr, 10);
  return info;
}

// Copies `n` bytes at `addr` of process `pid`; false unless all of them were read.
bool peek(pid_t pid, uint64_t addr, void* out, size_t n) {
  if (pid <= 0 || addr == 0 || n == 0) return false;
  iovec local{out, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

// Messages waiting in a QP's receive window for the next poll to take: slot n % count
// holds message n once its first word reads n + 1 (src/wire/shm/window.hpp). One read of
// every slot's first word; nullopt when the window cannot be read or makes no sense.
std::optional<uint64_t> window_waiting(pid_t pid, uint64_t slots, uint64_t head, uint32_t count,
                                       uint32_t slot_size) {
  if (slots == 0) return 0;
  if (count == 0 || count > 1024 || slot_size < 8 || slot_size > (1u << 20)) return std::nullopt;
  std::vector<uint64_t> seq(count);
  std::vector<iovec> local(count), remote(count);
  for (uint32_t k = 0; k < count; ++k) {
    uint64_t at = slots + uint64_t{(head + k) % count} * slot_size;
    local[k] = {&seq[k], 8};
    remote[k] = {reinterpret_cast<void*>(at), 8};
  }
  if (process_vm_readv(pid, local.data(), count, remote.data(), count, 0) !=
      static_cast<ssize_t>(8 * uint64_t{count}))
    return std::nullopt;
  uint64_t waiting = 0;
  while (waiting < count && seq[waiting] == head + waiting + 1) ++waiting;
  return waiting;
}

// The count of eventfd `fd` of `pid` (/proc/PID/fdinfo: it reads without the process).
std::optional<uint64_t> eventfd_count(pid_t pid, int fd) {
  if (fd < 0) return std::nullopt;
  std::string text;
  if (!read_small_file("/proc/" + std::to_string(pid) + "/fdinfo/" + std::to_string(fd), &text))
    return std::nullopt;
  size_t at = text.find("eventfd-count:");
  if (at == std::string::npos) return std::nullopt;
  return std::strtoull(text.c_str() + at + 14, nullptr, 16);  // the kernel prints it in hex
}

// The registry (src/wire/registry.cpp): slot -> pid, so a QPN names its process.
std::vector<int32_t> read_registry() {
  constexpr int kSlots = 1024;
  std::vector<int32_t> pids(kSlots, 0);
  int fd = open((state_dir() + "/registry").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return pids;
  std::vector<char> raw(kSlots * 8);
  ssize_t n = pread(fd, raw.data(), raw.size(), 0);
  close(fd);
  for (int s = 0; n > 0 && s < kSlots && (s + 1) * 8 <= n; ++s)
    std::memcpy(&pids[s], raw.data() + s * 8, sizeof(int32_t));
  return pids;
}

// One object of the target, for reading its hot fields: nothing is read unless the tag
// still says the object lives, and every field must lie inside the published object.
struct Target {
  pid_t pid = 0;
  bool live = false;  // the process runs (or is stopped); false: only the segment is left
  const Record* rec = nullptr;
  bool alive_object = false;

  void check() {
    uint32_t magic = 0;
    alive_object = live && rec->object_size <= (1u << 20) &&
                   uint64_t{rec->magic_offset} + 4 <= rec->object_size &&
                   peek(pid, rec->object + rec->magic_offset, &magic, 4) && magic == rec->magic;
  }
  bool field(int index, void* out, size_t n) const {
    if (!alive_object || index < 0 || index >= kMaxHot) return false;
    uint32_t off = rec->hot[index];
    if (off == 0 || uint64_t{off} + n > rec->object_size) return false;
    return peek(pid, rec->object + off, out, n);
  }
  template <typename T>
  std::optional<T> get(int index) const {
    T v{};
    if (!field(index, &v, sizeof(v))) return std::nullopt;
    return v;
  }
  // The size of a std::deque<T> (sizeof(T) = rec->elem_size) in the target: libstdc++'s
  // layout, the library's and ours (same compiler). Any inconsistency gives nullopt.
  std::optional<uint64_t> deque_size(int index) const {
    struct Iter {
      uint64_t cur, first, last, node;
    };
    struct Raw {
      uint64_t map, map_size;
      Iter start, finish;
    } raw;
    static_assert(sizeof(Raw) == sizeof(std::deque<int>));
    uint64_t elem = rec->elem_size;
    if (elem == 0 || elem > (1u << 16) || !field(index, &raw, sizeof(raw))) return std::nullopt;
    uint64_t per_node = elem < 512 ? 512 / elem : 1;  // _GLIBCXX_DEQUE_BUF_SIZE
    uint64_t node_bytes = per_node * elem;
    for (const Iter& it : {raw.start, raw.finish})
      if (it.last - it.first != node_bytes || it.cur < it.first || it.cur > it.last ||
          (it.cur - it.first) % elem)
        return std::nullopt;
    if (raw.finish.node < raw.start.node || (raw.finish.node - raw.start.node) % 8) return std::nullopt;
    uint64_t nodes = (raw.finish.node - raw.start.node) / 8;
    if (nodes > (1u << 24)) return std::nullopt;
    uint64_t size = nodes * per_node + (raw.finish.cur - raw.finish.first) / elem -
                    (raw.start.cur - raw.start.first) / elem;
    if (size > (1u << 28)) return std::nullopt;
    return size;
  }
};

// ---- names --------------------------------------------------------------------------------

const char* qp_type_name(uint32_t t) {
  switch (t) {
    case 2: return "RC";
    case 3: return "UC";
    case 4: return "UD";
    case 8: return "RAW_PACKET";
    case 9: return "XRC_SEND";
    case 10: return "XRC_RECV";
    default: return nullptr;
  }
}

const char* srq_type_name(uint32_t t) {
  static const char* names[] = {"BASIC", "XRC", "TM"};
  return t < 3 ? names[t] : nullptr;
}

const char* arm_name(int32_t a) {
  switch (a) {
    case kArmNone: return "no";
    case kArmSolicited: return "solicited";
    case kArmNext: return "next";
    default: return nullptr;
  }
}

std::string access_names(uint32_t access) {
  static const std::pair<uint32_t, const char*> bits[] = {
      {1, "LOCAL_WRITE"}, {2, "REMOTE_WRITE"}, {4, "REMOTE_READ"}, {8, "REMOTE_ATOMIC"},
      {16, "MW_BIND"},    {32, "ZERO_BASED"},  {64, "ON_DEMAND"},  {128, "HUGETLB"},
      {1u << 8, "FLUSH_GLOBAL"}, {1u << 9, "FLUSH_PERSISTENT"}, {1u << 10, "RELAXED_ORDERING"}};
  std::string s;
  for (auto [bit, name] : bits)
    if (access & bit) {
      if (!s.empty()) s += '|';
      s += name;
      access &= ~bit;
    }
  if (access) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%x", access);
    if (!s.empty()) s += '|';
    s += buf;
  }
  return s.empty() ? "none" : s;
}

std::string gid_text(const uint8_t* g) {
  bool zero = std::all_of(g, g + 16, [](uint8_t b) { return b == 0; });
  if (zero) return "";
  static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[48];
  if (std::memcmp(g, v4_prefix, 12) == 0) {
    std::snprintf(buf, sizeof(buf), "::ffff:%u.%u.%u.%u", g[12], g[13], g[14], g[15]);
  } else {
    std::snprintf(buf, sizeof(buf), "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
                  g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12],
                  g[13], g[14], g[15]);
  }
  return buf;
}

// A string field of the segment: at most `n` bytes, up to the first NUL.
std::string bounded(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

// ---- one process --------------------------------------------------------------------------

struct Segment {
  Header header{};
  std::vector<Record> records;
  int torn = 0;  // records still being written after a few tries
  std::string problem;  // why the segment cannot be used, or empty
};

// Whether process `pid` maps the file at `path` (matched by inode in /proc/PID/maps);
// nullopt when that cannot be told.
std::optional<bool> maps_file(pid_t pid, const std::string& path) {
  struct stat st;
  std::string maps;
  if (stat(path.c_str(), &st) != 0 ||
      !read_small_file("/proc/" + std::to_string(pid) + "/maps", &maps, size_t{64} << 20))
    return std::nullopt;
  const std::string inode = " " + std::to_string(st.st_ino) + " ";
  size_t at = 0;
  while (at < maps.size()) {
    size_t end = maps.find('\n', at);
    if (end == std::string::npos) end = maps.size();
    std::string line = maps.substr(at, end - at);
    if (line.find(inode) != std::string::npos && line.find("/stat/" + std::to_string(pid)) != std::string::npos)
      return true;
    at = end + 1;
  }
  return false;
}

// Reads a segment with pread (never mmap: a file cut short under us must not SIGBUS us).
Segment read_segment(const std::string& path, pid_t name_pid) {
  Segment seg;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    seg.problem = std::string("cannot open: ") + std::strerror(errno);
    return seg;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    seg.problem = "not a regular file";
  } else if (pread(fd, &seg.header, sizeof(Header), 0) != static_cast<ssize_t>(sizeof(Header))) {
    seg.problem = "too short for a header";
  } else if (seg.header.magic != kMagic) {
    seg.problem = "bad magic";
  } else if (seg.header.version != kVersion || seg.header.header_size != sizeof(Header) ||
             seg.header.record_size != sizeof(Record) || seg.header.record_count != kMaxRecords) {
    seg.problem = "another layout (version " + std::to_string(seg.header.version) + ")";
  } else if (seg.header.pid != name_pid) {
    seg.problem = "names pid " + std::to_string(seg.header.pid);
  }
  if (!seg.problem.empty()) {
    close(fd);
    return seg;
  }
  uint32_t used = std::min<uint32_t>(seg.header.used, kMaxRecords);
  seg.records.resize(used);
  for (uint32_t i = 0; i < used; ++i) {
    off_t at = static_cast<off_t>(sizeof(Header) + sizeof(Record) * uint64_t{i});
    Record& r = seg.records[i];
    bool ok = false;
    for (int attempt = 0; attempt < 4 && !ok; ++attempt) {
      uint32_t after = 1;
      ok = pread(fd, &r, sizeof(Record), at) == static_cast<ssize_t>(sizeof(Record)) &&
           pread(fd, &after, sizeof(after), at) == sizeof(after) &&
           r.seq == after && !(after & 1);
    }
    if (!ok) {
      // A short read or a writer mid-record: the kind says nothing trustworthy.
      r.kind = kFree;
      ++seg.torn;
    }
  }
  close(fd);
  return seg;
}

Val process_value(pid_t pid, const std::string& path, const std::vector<int32_t>& registry) {
  Val p = Val::object();
  p.set("pid", Val::signed_number(pid));
  Segment seg = read_segment(path, pid);
  ProcInfo info = proc_info(pid);
  if (!seg.problem.empty()) {
    p.set("program", Val{});
    p.set("status", Val::string("invalid"));
    p.set("segment", Val::string(path));
    p.set("problem", Val::string(seg.problem));
    return p;
  }
  bool same = info.exists && info.start_time == seg.header.start_time && info.state != 'Z' &&
              info.state != 'X';
  // A process that exec'd keeps its pid and start time but no longer maps the segment.
  const bool execd = same && maps_file(pid, path) == false;
  if (execd) same = false;
  std::string status = !same ? "dead"
                       : info.state == 'T' ? "stopped"
                       : info.state == 't' ? "stopped (traced)"
                                           : "running";
  p.set("program", Val::string(bounded(seg.header.exe, sizeof(seg.header.exe))));
  p.set("status", Val::string(status));
  p.set("segment", Val::string(path));
  if (execd) p.set("problem", Val::string("the process no longer maps its segment (exec'd)"));
  // Live fields are read only from the process the segment belongs to; one read of a
  // published object tells whether we may read it at all (ptrace access rules).
  bool readable = same;
  int read_errno = 0;
  for (const Record& r : seg.records)
    if (same && r.kind != kFree && r.object_size >= uint64_t{r.magic_offset} + 4) {
      uint32_t probe = 0;
      readable = peek(pid, r.object + r.magic_offset, &probe, 4);
      read_errno = readable ? 0 : errno;
      break;
    }
  p.set("live_fields", Val::boolean(readable));
  if (same && !readable)
    p.set("problem", Val::string(std::string("process_vm_readv: ") + std::strerror(read_errno)));
  p.set("records_torn", Val::number(seg.torn));
  p.set("objects_not_published", Val::number(seg.header.dropped));

  Val contexts = Val::array(), pds = Val::array(), mrs = Val::array(), cqs = Val::array(),
      channels = Val::array(), qps = Val::array(), srqs = Val::array(), mws = Val::array(),
      ahs = Val::array(), xrcds = Val::array(), dms = Val::array(), tds = Val::array();
  // Our MR objects -> their handles: a window's binding names the object.
  std::map<uint64_t, uint64_t> mr_handles;
  for (const Record& r : seg.records)
    if (r.kind == kMr) mr_handles[r.object] = r.handle;
  // QP handles -> their RoCE v2 link's record (live PSNs, WQEs in flight); receive CQ
  // handles -> messages waiting in their QPs' receive windows (part of what a poll returns).
  std::map<uint64_t, const Record*> links;
  std::map<uint64_t, std::optional<uint64_t>> window_messages;
  for (const Record& r : seg.records) {
    if (r.kind == kRoce) links[r.u.roce.qp] = &r;
    if (r.kind != kQp || !r.u.qp.recv_cq || r.u.qp.srq) continue;
    Target t{pid, same && readable, &r};
    t.check();
    auto slots = t.get<uint64_t>(kQpWindowSlots), head = t.get<uint64_t>(kQpWindowHead);
    std::optional<uint64_t> n;
    if (slots && head) n = window_waiting(pid, *slots, *head, r.u.qp.window_slots, r.u.qp.window_slot_size);
    auto& sum = window_messages.try_emplace(r.u.qp.recv_cq, 0).first->second;
    sum = sum && n ? std::optional<uint64_t>(*sum + *n) : std::nullopt;
  }
  for (const Record& r : seg.records) {
    if (r.kind == kFree || r.kind >= kKinds) continue;
    Target t{pid, same && readable, &r};
    t.check();
    Val o = Val::object();
    o.set("handle", address(r.handle));
    o.set("context", address(r.context));
    switch (r.kind) {
      case kContext: {
        const CtxInfo& c = r.u.ctx;
        o.set("device", Val::string(bounded(c.device, sizeof(c.device))));
        o.set("async_fd", Val::signed_number(c.async_fd));
        o.set("async_events_waiting", Val::maybe(t.deque_size(kCtxAsyncQueue)));
        contexts.items.push_back(std::move(o));
        break;
      }
      case kPd:
        o.set("pd_handle", Val::number(r.u.pd.handle));
        o.set("parent_domain", Val::boolean(r.u.pd.parent_domain != 0));
        o.set("imported", Val::boolean(r.u.pd.imported != 0));
        pds.items.push_back(std::move(o));
        break;
      case kMr: {
        const MrInfo& m = r.u.mr;
        o.set("pd", address(m.pd));
        o.set("addr", address(m.addr));
        o.set("length", Val::number(m.length));
        o.set("iova", address(m.iova));
        o.set("lkey", Val::number(m.lkey, true));
        o.set("rkey", Val::number(m.rkey, true));
        o.set("access", Val::string(access_names(m.access)));
        o.set("imported", Val::boolean(m.imported != 0));
        mrs.items.push_back(std::move(o));
        break;
      }
      case kCq: {
        o.set("channel", r.u.cq.channel ? address(r.u.cq.channel) : Val::none());
        auto head = t.get<uint64_t>(kCqHead), tail = t.get<uint64_t>(kCqTail),
             cap = t.get<uint64_t>(kCqCapacity);
        std::optional<uint64_t> waiting;
        if (head && tail && *tail >= *head && (!cap || *tail - *head <= *cap + 1)) waiting = *tail - *head;
        // Messages still in its QPs' receive windows are completions the next poll makes.
        std::optional<uint64_t> in_windows = 0;
        if (auto it = window_messages.find(r.handle); it != window_messages.end()) in_windows = it->second;
        o.set("cqe", Val::maybe(cap));
        o.set("entries", waiting && in_windows ? Val::number(*waiting + *in_windows) : Val{});
        o.set("entries_in_windows", Val::maybe(in_windows));
        auto armed = t.get<int32_t>(kCqArmed);
        const char* arm = armed ? arm_name(*armed) : nullptr;
        o.set("armed", arm ? Val::string(arm) : Val{});
        auto reported = t.get<uint32_t>(kCqCompReported), acked = t.get<uint32_t>(kCqCompAcked);
        o.set("events_not_acked", reported && acked ? Val::signed_number(int64_t{int32_t(*reported - *acked)}) : Val{});
        auto areported = t.get<uint32_t>(kCqAsyncReported), aacked = t.get<uint32_t>(kCqAsyncAcked);
        o.set("async_events_not_acked",
              areported && aacked ? Val::signed_number(int64_t{int32_t(*areported - *aacked)}) : Val{});
        auto err = t.get<uint8_t>(kCqInError);
        o.set("overrun", err && *err <= 1 ? Val::boolean(*err) : Val{});
        cqs.items.push_back(std::move(o));
        break;
      }
      case kChannel: {
        const ChanInfo& c = r.u.chan;
        o.set("fd", Val::signed_number(c.fd));
        std::optional<uint64_t> level, wake;
        if (same) {
          level = eventfd_count(pid, c.level_fd);
          wake = eventfd_count(pid, c.wake_fd);
        }
        o.set("readable", level && wake ? Val::boolean(*level || *wake) : Val{});
        o.set("events_waiting", Val::maybe(t.deque_size(kChanQueue)));
        o.set("wakeups_waiting", Val::maybe(wake));
        channels.items.push_back(std::move(o));
        break;
      }
      case kQp: {
        const QpInfo& q = r.u.qp;
        o.set("qp_num", Val::number(q.qp_num));
        const char* type = qp_type_name(q.type);
        o.set("type", type ? Val::string(type) : Val::number(q.type));
        auto st = t.get<int32_t>(kQpState);
        const char* state = st ? qp_state_name(*st) : nullptr;
        o.set("state", state ? Val::string(state) : Val{});
        o.set("port", Val::number(q.port));
        // On RoCE v2 the link's PSNs, live; else those ibv_modify_qp set last.
        std::optional<uint64_t> in_flight = 0;
        if (auto it = links.find(r.handle); it != links.end()) {
          Target link{pid, same && readable, it->second};
          link.check();
          o.set("sq_psn", Val::maybe(link.get<uint32_t>(kRoceNextPsn)));
          o.set("rq_psn", Val::maybe(link.get<uint32_t>(kRoceExpectedPsn)));
          o.set("psn_source", Val::string("roce_link"));
          in_flight = link.deque_size(kRoceSendQueue);
        } else {
          o.set("sq_psn", Val::number(q.sq_psn));
          o.set("rq_psn", Val::number(q.rq_psn));
          o.set("psn_source", Val::string("modify_qp"));
        }
        o.set("dest_qp_num", Val::number(q.dest_qp_num));
        o.set("dgid", Val::string(gid_text(q.dgid)));
        // The peer process: as the library found it at RTR, else the registry's owner of
        // the destination number's slot when that is this process itself.
        Val peer = Val::none();
        if (q.peer_pid > 0) {
          peer = Val::signed_number(q.peer_pid);
        } else if (q.dest_qp_num && q.type != 4 && !links.count(r.handle)) {  // not on another host
          uint32_t slot = q.dest_qp_num >> 14;
          if (slot < registry.size() && registry[slot] == pid) peer = Val::signed_number(pid);
        }
        o.set("peer_pid", peer);
        o.set("max_send_wr", Val::number(q.max_send_wr));
        // WQEs not completed: those the same-host requester holds, and those a RoCE v2
        // link has sent (or is sending) and not had acknowledged.
        auto queued = t.deque_size(kQpSendQueue);
        o.set("send_queued", queued && in_flight ? Val::number(*queued + *in_flight) : Val{});
        o.set("send_in_flight", Val::maybe(in_flight));
        o.set("max_recv_wr", Val::number(q.max_recv_wr));
        auto rh = t.get<uint64_t>(kQpRecvHead), rt = t.get<uint64_t>(kQpRecvTail);
        std::optional<uint64_t> posted;
        if (rh && rt && *rt >= *rh && *rt - *rh <= (uint64_t{1} << 32)) posted = *rt - *rh;
        o.set("recv_posted", q.srq ? Val::none() : Val::maybe(posted));
        o.set("max_send_sge", Val::number(q.max_send_sge));
        o.set("max_recv_sge", Val::number(q.max_recv_sge));
        o.set("max_inline_data", Val::number(q.max_inline_data));
        o.set("pd", address(q.pd));
        o.set("send_cq", address(q.send_cq));
        o.set("recv_cq", q.recv_cq ? address(q.recv_cq) : Val::none());
        o.set("srq", q.srq ? address(q.srq) : Val::none());
        o.set("path_mtu", Val::number(q.path_mtu ? 128u << q.path_mtu : 0));
        o.set("timeout", Val::number(q.timeout));
        o.set("retry_cnt", Val::number(q.retry_cnt));
        o.set("rnr_retry", Val::number(q.rnr_retry));
        o.set("max_rd_atomic", Val::number(q.max_rd_atomic));
        o.set("max_dest_rd_atomic", Val::number(q.max_dest_rd_atomic));
        o.set("qkey", Val::number(q.qkey, true));
        o.set("access", Val::string(access_names(q.access)));
        o.set("sq_sig_all", Val::boolean(q.sq_sig_all != 0));
        auto er = t.get<uint32_t>(kQpEventsReported), ea = t.get<uint32_t>(kQpEventsAcked);
        o.set("async_events_not_acked", er && ea ? Val::signed_number(int64_t{int32_t(*er - *ea)}) : Val{});
        // A connected QP as a same-host requester: its peer's receive window (an older
        // library publishes none: "?").
        if (q.type == 2 || q.type == 3) {  // RC, UC
          Val w;
          if (auto c = t.get<PeerWindowCounts>(kQpPeerWindow)) {
            w = Val::object();
            w.set("opened_at_rts", Val::number(c->opened_at_rts));
            w.set("opened_at_post", Val::number(c->opened_at_post));
            w.set("open_failed", Val::number(c->open_failed));
            w.set("ring_waited", Val::number(c->ring_waited));
            Val via = Val::object();
            via.set("no_window", Val::number(c->agent_no_window));
            via.set("ring_full", Val::number(c->agent_ring_full));
            via.set("no_receive", Val::number(c->agent_no_receive));
            via.set("too_small", Val::number(c->agent_too_small));
            via.set("srq", Val::number(c->agent_srq));
            via.set("other", Val::number(c->agent_other));
            w.set("sends_via_agent", std::move(via));
          }
          o.set("peer_window", std::move(w));
        }
        qps.items.push_back(std::move(o));
        break;
      }
      case kSrq: {
        const SrqInfo& s = r.u.srq;
        const char* type = srq_type_name(s.type);
        o.set("type", type ? Val::string(type) : Val::number(s.type));
        o.set("srq_num", Val::number(s.srq_num));
        o.set("pd", address(s.pd));
        auto max_wr = t.get<uint32_t>(kSrqMaxWr);
        o.set("max_wr", Val::maybe(max_wr));
        auto h = t.get<uint64_t>(kSrqHead), tl = t.get<uint64_t>(kSrqTail);
        std::optional<uint64_t> posted;
        if (h && tl && *tl >= *h && *tl - *h <= (uint64_t{1} << 32)) posted = *tl - *h;
        o.set("posted", Val::maybe(posted));
        o.set("limit", Val::maybe(t.get<uint32_t>(kSrqLimit)));
        o.set("max_sge", Val::number(s.max_sge));
        srqs.items.push_back(std::move(o));
        break;
      }
      case kMw: {
        o.set("type", Val::number(r.u.mw.type));
        o.set("pd", address(r.u.mw.pd));
        o.set("rkey", Val::maybe(t.get<uint32_t>(kMwRkey), true));
        // Bound: the MR's handle when the object is one of the MRs published, else "?".
        auto mr = t.get<uint64_t>(kMwMr);
        Val bound;
        if (mr && *mr == 0) bound = Val::none();
        else if (mr && mr_handles.count(*mr)) bound = address(mr_handles[*mr]);
        o.set("bound_mr", bound);
        const bool is_bound = bound.type == Val::kStr;
        auto addr = t.get<uint64_t>(kMwAddr), len = t.get<uint64_t>(kMwLength);
        auto access = t.get<uint32_t>(kMwAccess);
        o.set("addr", is_bound && addr ? address(*addr) : is_bound ? Val{} : Val::none());
        o.set("length", is_bound ? Val::maybe(len) : Val::none());
        o.set("access", is_bound && access ? Val::string(access_names(*access)) : is_bound ? Val{} : Val::none());
        auto qpn = t.get<uint32_t>(kMwQpn);
        o.set("qp_num", r.u.mw.type == 2 && is_bound ? Val::maybe(qpn) : Val::none());
        mws.items.push_back(std::move(o));
        break;
      }
      case kAh: {
        const AhInfo& a = r.u.ah;
        o.set("pd", address(a.pd));
        o.set("dgid", a.is_global ? Val::string(gid_text(a.dgid)) : Val::none());
        o.set("dlid", Val::number(a.dlid));
        o.set("sgid_index", Val::number(a.sgid_index));
        o.set("port", Val::number(a.port));
        o.set("sl", Val::number(a.sl));
        o.set("hop_limit", Val::number(a.hop_limit));
        o.set("traffic_class", Val::number(a.traffic_class));
        o.set("flow_label", Val::number(a.flow_label));
        ahs.items.push_back(std::move(o));
        break;
      }
      case kXrcd: {
        const XrcdInfo& x = r.u.xrcd;
        o.set("shared", Val::boolean(x.shared != 0));
        o.set("file", x.shared ? Val::string(bounded(x.path, sizeof(x.path))) : Val::none());
        o.set("inode", x.shared ? Val::number(x.ino) : Val::none());
        auto users = t.get<int32_t>(kXrcdUsers);
        o.set("users", users && *users >= 0 ? Val::number(static_cast<uint64_t>(*users)) : Val{});
        xrcds.items.push_back(std::move(o));
        break;
      }
      case kTd: {
        auto users = t.get<int32_t>(kTdUsers);
        o.set("users", users && *users >= 0 ? Val::number(static_cast<uint64_t>(*users)) : Val{});
        tds.items.push_back(std::move(o));
        break;
      }
      case kRoce:
        break;  // shown in its QP's row
      case kDm: {
        const DmInfo& m = r.u.dm;
        o.set("length", Val::number(m.length));
        o.set("dm_handle", Val::number(m.handle));
        o.set("imported", Val::boolean(m.imported != 0));
        dms.items.push_back(std::move(o));
        break;
      }
    }
  }
  p.set("contexts", std::move(contexts));
  p.set("pds", std::move(pds));
  p.set("mrs", std::move(mrs));
  p.set("cqs", std::move(cqs));
  p.set("channels", std::move(channels));
  p.set("qps", std::move(qps));
  p.set("srqs", std::move(srqs));
  p.set("mws", std::move(mws));
  p.set("ahs", std::move(ahs));
  p.set("xrcds", std::move(xrcds));
  p.set("dms", std::move(dms));
  p.set("tds", std::move(tds));
  return p;
}

Val gather(pid_t only) {
  Val all = Val::object();
  Val procs = Val::array();
  std::string dir = state_dir() + "/stat";
  std::vector<pid_t> pids;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (pid > 0 && pid <= 0x7fffffff && *end == '\0' && e->d_name[0] != '0') pids.push_back(pid);
    }
    closedir(d);
  }
  std::sort(pids.begin(), pids.end());
  std::vector<int32_t> registry = read_registry();
  for (pid_t pid : pids)
    if (only == 0 || pid == only) procs.items.push_back(process_value(pid, dir + "/" + std::to_string(pid), registry));
  all.set("state_dir", Val::string(state_dir()));
  all.set("processes", std::move(procs));
  return all;
}

// ---- tables -------------------------------------------------------------------------------

std::string cell(const Val* v, const std::map<std::string, std::string>& labels) {
  if (!v) return "?";
  switch (v->type) {
    case Val::kNull: return "?";
    case Val::kNone: return "-";
    case Val::kBool: return v->flag ? "yes" : "no";
    case Val::kNum:
      if (v->hex) {
        char buf[24];
        std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v->num));
        return buf;
      }
      return v->text;
    case Val::kStr: {
      auto it = labels.find(v->text);
      std::string s = it != labels.end() ? it->second : v->text;
      for (char& c : s)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
      return s.empty() ? "-" : s;
    }
    default: return "?";
  }
}

struct Column {
  const char* header;
  std::vector<const char*> keys;  // several: joined with '/'
};

void print_table(std::string& out, const char* title, const Val& rows, const std::vector<Column>& cols,
                 const std::map<std::string, std::string>& labels) {
  if (rows.items.empty()) return;
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> head{title};
  for (const Column& c : cols) head.push_back(c.header);
  cells.push_back(head);
  for (const Val& row : rows.items) {
    std::vector<std::string> line;
    const Val* h = row.get("handle");
    line.push_back(cell(h, labels));
    for (const Column& c : cols) {
      std::string s;
      for (size_t i = 0; i < c.keys.size(); ++i) {
        if (i) s += '/';
        s += cell(row.get(c.keys[i]), labels);
      }
      line.push_back(s);
    }
    cells.push_back(line);
  }
  std::vector<size_t> width(head.size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  for (const auto& line : cells) {
    std::string text = "  ";
    for (size_t i = 0; i < line.size(); ++i) {
      text += line[i];
      if (i + 1 < line.size()) text += std::string(width[i] - line[i].size() + 2, ' ');
    }
    out += text + "\n";
  }
}

std::string tables(const Val& all, pid_t only) {
  std::string out;
  const Val* procs = all.get("processes");
  if (!procs || procs->items.empty()) {
    out += only ? "no stat segment for PID " + std::to_string(only) : std::string("no softverbs process");
    out += " (state directory " + cell(all.get("state_dir"), {}) + ")\n";
    return out;
  }
  for (const Val& p : procs->items) {
    std::map<std::string, std::string> labels;  // handles -> short names within the process
    struct Kind {
      const char* key;
      const char* prefix;
    };
    for (Kind k : {Kind{"contexts", "ctx"}, Kind{"pds", "pd"}, Kind{"mrs", "mr"}, Kind{"cqs", "cq"},
                   Kind{"channels", "ch"}, Kind{"qps", "qp"}, Kind{"srqs", "srq"},
                   Kind{"mws", "mw"}, Kind{"ahs", "ah"}, Kind{"xrcds", "xrcd"}, Kind{"dms", "dm"},
                   Kind{"tds", "td"}}) {
      const Val* list = p.get(k.key);
      for (size_t i = 0; list && i < list->items.size(); ++i)
        if (const Val* h = list->items[i].get("handle"))
          labels[h->text] = std::string(k.prefix) + std::to_string(i);
    }
    out += "PID " + cell(p.get("pid"), {}) + "  " + cell(p.get("program"), {}) + "  " +
           cell(p.get("status"), {});
    if (const Val* prob = p.get("problem")) out += "  (" + cell(prob, {}) + ")";
    out += "\n";
    if (const Val* n = p.get("objects_not_published"); n && n->num)
      out += "  " + n->text + " objects not shown (table full)\n";
    if (const Val* n = p.get("records_torn"); n && n->num)
      out += "  " + n->text + " records unreadable (being written)\n";
    const Val* none = nullptr;
    auto list = [&](const char* key) -> const Val& {
      static const Val empty = Val::array();
      const Val* v = p.get(key);
      return v ? *v : (none ? *none : empty);
    };
    print_table(out, "CONTEXT", list("contexts"), {{"DEVICE", {"device"}}, {"ASYNC_FD", {"async_fd"}},
                                                  {"ASYNC_WAITING", {"async_events_waiting"}}},
                labels);
    print_table(out, "PD", list("pds"),
                {{"CONTEXT", {"context"}}, {"PARENT_DOMAIN", {"parent_domain"}}, {"IMPORTED", {"imported"}}},
                labels);
    print_table(out, "MR", list("mrs"),
                {{"PD", {"pd"}}, {"ADDR", {"addr"}}, {"LENGTH", {"length"}}, {"LKEY", {"lkey"}},
                 {"RKEY", {"rkey"}}, {"ACCESS", {"access"}}, {"IMPORTED", {"imported"}}},
                labels);
    print_table(out, "CQ", list("cqs"),
                {{"CQE", {"cqe"}}, {"ENTRIES", {"entries"}}, {"ARMED", {"armed"}},
                 {"CHANNEL", {"channel"}}, {"EVENTS_NOT_ACKED", {"events_not_acked"}},
                 {"OVERRUN", {"overrun"}}},
                labels);
    print_table(out, "CHANNEL", list("channels"),
                {{"FD", {"fd"}}, {"READABLE", {"readable"}}, {"EVENTS_WAITING", {"events_waiting"}}},
                labels);
    print_table(out, "QP", list("qps"),
                {{"QPN", {"qp_num"}}, {"TYPE", {"type"}}, {"STATE", {"state"}},
                 {"SQ_PSN", {"sq_psn"}}, {"RQ_PSN", {"rq_psn"}}, {"DEST_QPN", {"dest_qp_num"}},
                 {"DGID", {"dgid"}}, {"PEER", {"peer_pid"}}, {"SQ", {"send_queued", "max_send_wr"}},
                 {"RQ", {"recv_posted", "max_recv_wr"}}, {"SCQ", {"send_cq"}}, {"RCQ", {"recv_cq"}},
                 {"SRQ", {"srq"}}},
                labels);
    print_table(out, "SRQ", list("srqs"),
                {{"TYPE", {"type"}}, {"SRQN", {"srq_num"}}, {"POSTED", {"posted", "max_wr"}},
                 {"LIMIT", {"limit"}}},
                labels);
    print_table(out, "MW", list("mws"),
                {{"TYPE", {"type"}}, {"PD", {"pd"}}, {"RKEY", {"rkey"}}, {"MR", {"bound_mr"}},
                 {"ADDR", {"addr"}}, {"LENGTH", {"length"}}, {"ACCESS", {"access"}}, {"QPN", {"qp_num"}}},
                labels);
    print_table(out, "AH", list("ahs"),
                {{"PD", {"pd"}}, {"DGID", {"dgid"}}, {"DLID", {"dlid"}}, {"SGID_INDEX", {"sgid_index"}},
                 {"PORT", {"port"}}, {"SL", {"sl"}}, {"HOP_LIMIT", {"hop_limit"}}},
                labels);
    print_table(out, "XRCD", list("xrcds"), {{"FILE", {"file"}}, {"USERS", {"users"}}}, labels);
    print_table(out, "DM", list("dms"),
                {{"LENGTH", {"length"}}, {"HANDLE", {"dm_handle"}}, {"IMPORTED", {"imported"}}}, labels);
    print_table(out, "TD", list("tds"), {{"CONTEXT", {"context"}}, {"USERS", {"users"}}}, labels);
    out += "\n";
  }
  return out;
}

// ---- main ---------------------------------------------------------------------------------

std::atomic<bool> g_stop{false};

int usage(FILE* to) {
  std::fprintf(to,
               "Usage: softverbs stat [--json] [--watch [SECONDS]] [PID]\n"
               "Shows the verbs objects of every process using softverbs (or of PID):\n"
               "contexts, PDs, MRs, CQs, completion channels, QPs, SRQs, memory windows,\n"
               "address handles, XRC domains and device memory, with their live state.\n"
               "\"?\" (null in JSON): a value that could not be read.\n");
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  double watch = 0;
  pid_t only = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--watch" || a == "-w" || a.rfind("--watch=", 0) == 0) {
      // SECONDS: after '=', or the next argument when it is a number of at most 600 or has
      // a fraction (a larger whole number there is the PID).
      watch = 1;
      std::string value = a.size() > 8 ? a.substr(8) : "";
      if (value.empty() && i + 1 < argc) {
        std::string next = argv[i + 1];
        char* end = nullptr;
        double s = std::strtod(next.c_str(), &end);
        if (!next.empty() && *end == '\0' && s > 0 && (s <= 600 || next.find('.') != std::string::npos)) {
          value = next;
          ++i;
        }
      }
      if (!value.empty()) {
        char* end = nullptr;
        watch = std::strtod(value.c_str(), &end);
        if (*end || !(watch > 0)) {
          std::fprintf(stderr, "softverbs stat: bad --watch interval '%s'\n", value.c_str());
          return usage(stderr);
        }
      }
    } else if (a == "-h" || a == "--help") {
      return usage(stdout);
    } else {
      char* end = nullptr;
      long pid = std::strtol(a.c_str(), &end, 10);
      if (a.empty() || *end || pid <= 0 || pid > 0x7fffffff) {
        std::fprintf(stderr, "softverbs stat: unexpected argument '%s'\n", a.c_str());
        return usage(stderr);
      }
      only = static_cast<pid_t>(pid);
    }
  }
  std::signal(SIGINT, [](int) { g_stop = true; });
  std::signal(SIGTERM, [](int) { g_stop = true; });
  std::signal(SIGPIPE, SIG_IGN);
  for (;;) {
    Val all = gather(only);
    std::string out;
    if (json) {
      print_json(out, all, 0);
      out += "\n";
    } else {
      out = tables(all, only);
    }
    if (watch > 0 && !json) out = "\033[H\033[2J" + out;  // redraw in place
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0)
      return 1;
    if (watch <= 0) {
      const Val* procs = all.get("processes");
      return only && procs && procs->items.empty() ? 1 : 0;
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(watch);
    while (!g_stop && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop) return 0;
  }
}
