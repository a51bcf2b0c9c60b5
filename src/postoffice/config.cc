// Config::FromEnv: the one place that reads the DMLC_* / PS_* environment.
#include "ps/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <sstream>

extern char** environ;

namespace ps {

namespace {

using Lookup = std::function<const std::string*(const char*)>;

// Parses an integer in [lo, hi]; `what` words the expectation.
Status ParseInt(const char* name, const std::string& value, int64_t lo,
                int64_t hi, const char* what, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return Status::InvalidArgument(std::string(name) + "='" + value +
                                   "' is not " + what);
  }
  *out = v;
  return Status::OK();
}

// Reads `name` into *out when set; `required` makes absence an error.
Status ReadInt(const Lookup& env, const char* name, bool required, int64_t lo,
               int64_t hi, const char* what, int* out) {
  const std::string* v = env(name);
  if (v == nullptr) {
    return required
               ? Status::InvalidArgument(std::string(name) +
                                         " is not set (expected " + what + ")")
               : Status::OK();
  }
  int64_t parsed = 0;
  PS_RETURN_IF_ERROR(ParseInt(name, *v, lo, hi, what, &parsed));
  *out = static_cast<int>(parsed);
  return Status::OK();
}

constexpr int64_t kIntMax = 2147483647;

Status ReadPortRange(const Lookup& env, Config* c) {
  const std::string* v = env("PS_PORT_RANGE");
  if (v == nullptr) return Status::OK();
  size_t dash = v->find('-');
  int64_t lo = 0, hi = 0;
  auto bad = Status::InvalidArgument("PS_PORT_RANGE='" + *v +
                                     "' is not a port range lo-hi");
  if (dash == std::string::npos) return bad;
  if (!ParseInt("PS_PORT_RANGE", v->substr(0, dash), 1, 65535, "", &lo).ok() ||
      !ParseInt("PS_PORT_RANGE", v->substr(dash + 1), 1, 65535, "", &hi).ok() ||
      lo > hi) {
    return bad;
  }
  c->port_range_lo = static_cast<int>(lo);
  c->port_range_hi = static_cast<int>(hi);
  return Status::OK();
}

Status ReadRoleAndHosts(const Lookup& env, Config* c) {
  const std::string* role = env("DMLC_ROLE");
  if (role == nullptr) {
    return Status::InvalidArgument(
        "DMLC_ROLE is not set (expected scheduler, server or worker)");
  }
  if (*role == "scheduler") {
    c->role = Role::kScheduler;
  } else if (*role == "server") {
    c->role = Role::kServer;
  } else if (*role == "worker") {
    c->role = Role::kWorker;
  } else {
    return Status::InvalidArgument("DMLC_ROLE='" + *role +
                                   "' is not scheduler, server or worker");
  }
  if (const std::string* uri = env("DMLC_PS_ROOT_URI")) {
    if (uri->empty()) {
      return Status::InvalidArgument("DMLC_PS_ROOT_URI='' is not a host");
    }
    c->root_uri = *uri;
  }
  if (const std::string* iface = env("DMLC_INTERFACE")) {
    StatusOr<std::string> addr = InterfaceAddress(*iface);
    if (!addr.ok()) return addr.status();
    c->node_host = *addr;
  }
  if (const std::string* host = env("DMLC_NODE_HOST")) {
    if (host->empty()) {
      return Status::InvalidArgument("DMLC_NODE_HOST='' is not a host");
    }
    c->node_host = *host;
  }
  return Status::OK();
}

StatusOr<Config> Parse(const Lookup& env) {
  Config c;
  PS_RETURN_IF_ERROR(ReadRoleAndHosts(env, &c));
  const char* kPort = "a port number (1-65535)";
  const char* kPositive = "a positive integer";
  const char* kNonNeg = "a non-negative integer";
  PS_RETURN_IF_ERROR(
      ReadInt(env, "DMLC_PS_ROOT_PORT", true, 1, 65535, kPort, &c.root_port));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_NUM_SERVER", true, 1, 10000, kPositive,
                             &c.num_servers));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_NUM_WORKER", true, 1, 10000, kPositive,
                             &c.num_workers));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_PORT", false, 0, 65535,
                             "a port number (0-65535)", &c.port));
  PS_RETURN_IF_ERROR(ReadPortRange(env, &c));
  PS_RETURN_IF_ERROR(
      ReadInt(env, "PS_RANK", false, 0, kIntMax, kNonNeg, &c.rank));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_CONNECT_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c.connect_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_RENDEZVOUS_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c.rendezvous_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_BARRIER_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c.barrier_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_INTERVAL_MS", false, 0, kIntMax,
                             kNonNeg, &c.heartbeat_interval_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c.heartbeat_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_REQUEST_TIMEOUT_MS", false, 0, kIntMax,
                             kNonNeg, &c.request_timeout_ms));
  PS_RETURN_IF_ERROR(
      ReadInt(env, "PS_VERBOSE", false, 0, 2, "0, 1 or 2", &c.verbose));
  if (const std::string* v = env("PS_MAX_KEY")) {
    int64_t max_key = 0;
    PS_RETURN_IF_ERROR(
        ParseInt("PS_MAX_KEY", *v, 1, INT64_MAX, kPositive, &max_key));
    c.max_key = static_cast<Key>(max_key);
  }
  if (c.rank >= 0 && c.role != Role::kScheduler) {
    int n = c.role == Role::kServer ? c.num_servers : c.num_workers;
    if (c.rank >= n) {
      return Status::InvalidArgument(
          "PS_RANK='" + std::to_string(c.rank) + "' is out of range for " +
          std::to_string(n) +
          (c.role == Role::kServer ? " servers" : " workers"));
    }
  }
  if (c.heartbeat_interval_ms > 0 &&
      c.heartbeat_timeout_ms <= c.heartbeat_interval_ms) {
    return Status::InvalidArgument(
        "PS_HEARTBEAT_TIMEOUT_MS='" + std::to_string(c.heartbeat_timeout_ms) +
        "' is not greater than PS_HEARTBEAT_INTERVAL_MS (" +
        std::to_string(c.heartbeat_interval_ms) + ")");
  }
  if (c.role == Role::kScheduler) {
    c.port = c.root_port;
    c.rank = 0;
  }
  return c;
}

}  // namespace

StatusOr<Config> Config::FromEnv(
    const std::map<std::string, std::string>& env) {
  return Parse([&env](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  });
}

StatusOr<Config> Config::FromEnv() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (name.rfind("DMLC_", 0) == 0 || name.rfind("PS_", 0) == 0) {
      env[name] = kv.substr(eq + 1);
    }
  }
  return FromEnv(env);
}

std::string Config::SchedulerAddress() const {
  return "tcp://" + root_uri + ":" + std::to_string(root_port);
}

std::string Config::ToString() const {
  std::ostringstream os;
  os << "role=" << RoleName(role) << " scheduler=" << SchedulerAddress()
     << " servers=" << num_servers << " workers=" << num_workers
     << " host=" << node_host << " port=" << port << " rank=" << rank
     << " connect_timeout_ms=" << connect_timeout_ms
     << " rendezvous_timeout_ms=" << rendezvous_timeout_ms
     << " barrier_timeout_ms=" << barrier_timeout_ms
     << " heartbeat_interval_ms=" << heartbeat_interval_ms
     << " heartbeat_timeout_ms=" << heartbeat_timeout_ms
     << " request_timeout_ms=" << request_timeout_ms << " max_key=" << max_key;
  return os.str();
}

StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return Status::Unavailable("getifaddrs failed for DMLC_INTERFACE='" + name +
                               "'");
  }
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (name != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    found = buf;
    break;
  }
  freeifaddrs(list);
  if (found.empty()) {
    return Status::InvalidArgument(
        "DMLC_INTERFACE='" + name +
        "' is not an interface with an IPv4 address");
  }
  return found;
}

}  // namespace ps
