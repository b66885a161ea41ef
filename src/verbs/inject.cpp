// `softverbs inject KIND PID ...`: the request the command leaves in the state directory as
// inject.<pid> (one line, "<token> <kind> key=value ..."), read by this process's watcher
// thread (control.cpp), applied as the hardware fault it stands for, and answered in
// inject-reply.<pid> ("<token> ok: ..." or "<token> error: ..."). The file comes from
// anyone who can write the directory: every field is checked, nothing is trusted.
//   fail n=N status=S [qp=Q]   the next N send WRs complete with IBV_WC_S (name or number);
//                              S = REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR: the QP's
//                              responder fails its next N requests so (debug_respond.cpp)
//   fail side=recv status=LOC_LEN_ERR|LOC_PROT_ERR n=N [qp=Q]  its next N receives so
//   qp-error [qp=Q]            the QP to ERR with IBV_EVENT_QP_FATAL
//   cq-overrun [qp=Q] [cq=send|recv]  the QP's CQ (all CQs without qp) overruns
//   rnr n=N [qp=Q] [timer=T]   the next N messages that arrive needing a receive find none
//   drop|dup n=N [qp=Q]        the next N messages (wire: datagrams) lost / doubled
//   delay n=N ms=T [qp=Q]      the next N messages leave T ms late
//   link-down ms=T             this process's port down for T ms (PORT_ERR, PORT_ACTIVE)
#include "verbs/inject.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/state_dir.hpp"
#include "core/core.hpp"
#include "core/device.hpp"
#include "engine/engine.hpp"
#include "wire/transport.hpp"

namespace softverbs::inject {

namespace {

std::mutex& g_mu = *new std::mutex;  // immortal: the watcher thread outlives exit()
std::string& g_last_token = *new std::string;

std::string request_name() { return "inject." + std::to_string(getpid()); }

// The request's one line (at most 511 bytes: a longer file is not ours).
std::string read_request() {
  std::string path = state_dir() + "/" + request_name();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return {};
  char buf[512];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  if (n <= 0 || size_t(n) == sizeof buf) return {};
  std::string line(buf, size_t(n));
  line = line.substr(0, line.find('\n'));
  return line;
}

void reply(const std::string& token, const std::string& text) {
  std::string dir = state_dir();
  std::string name = "inject-reply." + std::to_string(getpid());
  std::string tmp = dir + "/." + name + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  std::string line = token + " " + text + "\n";
  bool ok = write(fd, line.data(), line.size()) == ssize_t(line.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) unlink(tmp.c_str());
}

// ibv_wc_status names without the IBV_WC_ prefix (rdma-core 44's enum).
const std::map<std::string, ibv_wc_status>& status_names() {
  static const auto* names = new std::map<std::string, ibv_wc_status>{
      {"LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR}, {"LOC_QP_OP_ERR", IBV_WC_LOC_QP_OP_ERR},
      {"LOC_EEC_OP_ERR", IBV_WC_LOC_EEC_OP_ERR}, {"LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR},
      {"WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR}, {"MW_BIND_ERR", IBV_WC_MW_BIND_ERR},
      {"BAD_RESP_ERR", IBV_WC_BAD_RESP_ERR}, {"LOC_ACCESS_ERR", IBV_WC_LOC_ACCESS_ERR},
      {"REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR}, {"REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR},
      {"REM_OP_ERR", IBV_WC_REM_OP_ERR}, {"RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR},
      {"RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR}, {"LOC_RDD_VIOL_ERR", IBV_WC_LOC_RDD_VIOL_ERR},
      {"REM_INV_RD_REQ_ERR", IBV_WC_REM_INV_RD_REQ_ERR}, {"REM_ABORT_ERR", IBV_WC_REM_ABORT_ERR},
      {"INV_EECN_ERR", IBV_WC_INV_EECN_ERR}, {"INV_EEC_STATE_ERR", IBV_WC_INV_EEC_STATE_ERR},
      {"FATAL_ERR", IBV_WC_FATAL_ERR}, {"RESP_TIMEOUT_ERR", IBV_WC_RESP_TIMEOUT_ERR},
      {"GENERAL_ERR", IBV_WC_GENERAL_ERR}, {"TM_ERR", IBV_WC_TM_ERR},
      {"TM_RNDV_INCOMPLETE", IBV_WC_TM_RNDV_INCOMPLETE}};
  return *names;
}

std::string status_name(ibv_wc_status s) {
  for (const auto& [name, status] : status_names())
    if (status == s) return name;
  return std::to_string(int(s));
}

bool parse_number(const std::string& s, uint64_t max, uint64_t* out) {
  if (s.empty() || s.size() > 12) return false;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (*end || v > max) return false;
  *out = v;
  return true;
}

struct Request {
  std::string token, kind;
  uint32_t qpn = 0;  // 0: every QP of the process
  uint64_t n = 1, ms = 0;
  int timer = -1;
  ibv_wc_status status = IBV_WC_GENERAL_ERR;
  bool recv_cq = false;
  bool recv_side = false;  // fail side=recv: the QP's next receives fail
};

// "<token> <kind> key=value ..." into *r; the reason when it is not one.
std::string parse(const std::string& line, Request* r) {
  std::istringstream in(line);
  if (!(in >> r->token >> r->kind)) return "empty request";
  std::string kv;
  bool status_given = false;
  while (in >> kv) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) return "not key=value: " + kv;
    std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    uint64_t v = 0;
    if (key == "qp" && parse_number(value, 0xffffff, &v)) r->qpn = uint32_t(v);
    else if (key == "n" && parse_number(value, 1u << 30, &v) && v) r->n = v;
    else if (key == "ms" && parse_number(value, 3600000, &v)) r->ms = v;
    else if (key == "timer" && parse_number(value, 31, &v)) r->timer = int(v);
    else if (key == "cq" && (value == "send" || value == "recv")) r->recv_cq = value == "recv";
    else if (key == "side" && (value == "send" || value == "recv")) r->recv_side = value == "recv";
    else if (key == "status") {
      std::string name = value;
      for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
      if (name.rfind("IBV_WC_", 0) == 0) name = name.substr(7);
      auto it = status_names().find(name);
      if (it != status_names().end()) r->status = it->second;
      else if (parse_number(value, IBV_WC_TM_RNDV_INCOMPLETE, &v) && v != IBV_WC_SUCCESS)
        r->status = ibv_wc_status(v);
      else return "unknown status " + value;
      status_given = true;
    } else {
      return "bad " + kv;
    }
  }
  if (r->kind == "fail" && !status_given) return "fail needs status=";
  const bool recv_status = r->status == IBV_WC_LOC_LEN_ERR || r->status == IBV_WC_LOC_PROT_ERR;
  if (r->kind == "fail" && r->recv_side && !recv_status)
    return "a receive fails with LOC_LEN_ERR or LOC_PROT_ERR";
  return {};
}

// The numbers of this process's QPs the request names (all of them without qp=).
std::vector<uint32_t> target_qpns(uint32_t qpn) {
  std::vector<uint32_t> out;
  for_each_qp([&](Qp* qp) {
    if (qp->type == IBV_QPT_XRC_RECV) return;  // sends nothing
    if (!qpn || qp->qpn() == qpn) out.push_back(qp->qpn());
  });
  return out;
}

std::string hex(uint32_t qpn) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%06x", qpn);
  return b;
}

// Whether the request is for the QP's responder (debug_respond.cpp): `rnr`, and `fail`
// with a status only a responder detects (REM_*) or with --recv (side=recv).
bool for_responder(const Request& r) {
  return r.kind == "rnr" || (r.kind == "fail" && (r.recv_side || r.status == IBV_WC_REM_ACCESS_ERR ||
                                                  r.status == IBV_WC_REM_INV_REQ_ERR ||
                                                  r.status == IBV_WC_REM_OP_ERR));
}

// A responder fault on each named RC QP: its next requests meet it; the reply text.
std::string arm_responder(const Request& r, const std::vector<uint32_t>& qpns) {
  std::string armed;
  for (uint32_t qpn : qpns) {
    wire::QpRef ref = wire::find_local(qpn);
    Qp* qp = ref.get();
    if (!qp || qp->type != IBV_QPT_RC) continue;  // RC alone answers with NAKs
    QpDebug& d = qp->debug;
    if (r.kind == "rnr") {
      d.resp_rnr_timer.store(r.timer);
      d.resp_rnr.store(uint32_t(r.n));
    } else {
      d.resp_status.store(int(r.status));
      d.resp_fail.store(uint32_t(r.n));
    }
    const bool wire_qp = qp->roce.load() != nullptr;
    // Same host: the peer's requester reaches this responder through the agent only from
    // now on (its window would take SENDs, its shared MR pages WRITEs, past it).
    if (!wire_qp) engine::close_window(qp, true);
    armed += (armed.empty() ? "" : ",") + hex(qpn) + (wire_qp ? "(wire)" : "");
  }
  if (armed.empty()) return "error: no RC QP" + (r.qpn ? " numbered " + hex(r.qpn) : "");
  std::string what = r.kind == "rnr" ? "rnr" : "fail " + status_name(r.status);
  return "ok: " + what + " x" + std::to_string(r.n) + " armed on the responder of QP " + armed;
}

// Arms a send-queue fault on each named QP (or a responder fault); the reply text.
std::string arm(const Request& r) {
  std::vector<uint32_t> qpns = target_qpns(r.qpn);
  if (qpns.empty()) return r.qpn ? "error: no QP " + hex(r.qpn) + " in this process" : "error: no QP";
  g_debug_hooks.store(true);  // from now on the send path looks at the counters
  if (for_responder(r)) return arm_responder(r, qpns);
  const uint32_t n = uint32_t(r.n);
  std::string armed;
  for (uint32_t qpn : qpns) {
    wire::QpRef ref = wire::find_local(qpn);
    Qp* qp = ref.get();
    if (!qp) continue;
    std::lock_guard<QueueMutex> lock(qp->sq_mu);
    QpDebug& d = qp->debug;
    // A connected QP whose peer is on another host (engine/requester.cpp, roce.cpp): drop
    // and dup act on its datagrams, fail and delay on its WQEs before they go out.
    const bool wire_qp = qp->roce.load() && qp->type != IBV_QPT_UD;
    if (r.kind == "fail") {
      d.fail = n;
      d.fail_status = r.status;
    } else if (r.kind == "drop") {
      if (wire_qp) d.wire_drop.store(n);
      else d.drop = n;
    } else if (r.kind == "dup") {
      if (wire_qp) d.wire_dup.store(n);
      else d.dup = n;
    } else if (r.kind == "delay") {
      d.delay = n;
      d.delay_ms = uint32_t(r.ms);
    }
    armed += (armed.empty() ? "" : ",") + hex(qpn) + (wire_qp ? "(wire)" : "");
  }
  return "ok: " + r.kind + " x" + std::to_string(n) + " armed on QP " + armed;
}

std::string qp_error(const Request& r) {
  int count = 0;
  for_each_qp([&](Qp* qp) {
    if (r.qpn && qp->qpn() != r.qpn) return;
    int st = qp->state.load();
    if (st == IBV_QPS_RESET || st == IBV_QPS_ERR) return;
    engine::set_error(qp, IBV_EVENT_QP_FATAL);
    ++count;
  });
  if (!count) return "error: no QP out of RESET/ERR" + (r.qpn ? " numbered " + hex(r.qpn) : "");
  return "ok: " + std::to_string(count) + " QP(s) to ERR with IBV_EVENT_QP_FATAL";
}

// As a real overrun (core/cq_ring.cpp): the CQ fails, CQ_ERR, the QPs feeding it to ERR.
std::string cq_overrun(const Request& r) {
  int count = 0;
  for_each_context([&](Context* ctx) {
    std::lock_guard<std::mutex> objects(ctx->objects_mu);
    std::vector<Cq*> cqs;
    for (Qp* qp : ctx->qps)
      if (qp->qpn() == r.qpn) cqs.push_back(r.recv_cq ? qp->recv_cq : qp->send_cq);
    if (!r.qpn) cqs.assign(ctx->cqs.begin(), ctx->cqs.end());
    for (Cq* cq : cqs) {
      {
        std::lock_guard<SpinLock> lock(cq->produce_mu);
        if (cq->in_error.exchange(true)) continue;
      }
      engine::cq_overrun_locked(cq, true);
      ++count;
    }
  });
  if (!count) return "error: no CQ to overrun";
  return "ok: " + std::to_string(count) + " CQ(s) overrun (IBV_EVENT_CQ_ERR)";
}

std::string link_down(const Request& r) {
  Device& dev = Device::instance();
  if (!dev.port_active()) return "error: the port is already down";
  dev.set_port_active(false);
  raise_port_event(IBV_EVENT_PORT_ERR);
  std::thread([ms = r.ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    // Up again unless `softverbs port down` took the whole host's port down meanwhile.
    if (read_state_word("port1") == "down") return;
    Device::instance().set_port_active(true);
    raise_port_event(IBV_EVENT_PORT_ACTIVE);
  }).detach();
  return "ok: port 1 down for " + std::to_string(r.ms) + " ms";
}

}  // namespace

bool is_request(const char* file_name) { return request_name() == file_name; }

void baseline() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::istringstream in(read_request());
  g_last_token.clear();
  in >> g_last_token;  // a request left for an earlier process with our pid: not ours
}

void apply() {
  std::lock_guard<std::mutex> lock(g_mu);
  Request r;
  std::string why = parse(read_request(), &r);
  if (r.token.empty() || r.token == g_last_token) return;
  g_last_token = r.token;
  std::string text;
  if (!why.empty()) text = "error: " + why;
  else if (r.kind == "fail" || r.kind == "rnr" || r.kind == "drop" || r.kind == "dup" ||
           r.kind == "delay")
    text = arm(r);
  else if (r.kind == "qp-error") text = qp_error(r);
  else if (r.kind == "cq-overrun") text = cq_overrun(r);
  else if (r.kind == "link-down") text = link_down(r);
  else text = "error: unknown fault " + r.kind;
  reply(r.token, text);
}

}  // namespace softverbs::inject
