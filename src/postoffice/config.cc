// Config::FromEnv / FromEnvAndFlags: the one place that reads the DMLC_* /
// PS_* environment and the --ps_* flags that override it.
#include "ps/config.h"

#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <zmq.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

// Every flag's default ("" or -1) means "not set": the environment decides.
DEFINE_string(ps_role, "", "overrides DMLC_ROLE: scheduler | server | worker");
DEFINE_string(ps_root_uri, "", "overrides DMLC_PS_ROOT_URI: scheduler host");
DEFINE_int32(ps_root_port, -1, "overrides DMLC_PS_ROOT_PORT: scheduler port");
DEFINE_int32(ps_num_servers, -1, "overrides DMLC_NUM_SERVER");
DEFINE_int32(ps_num_workers, -1, "overrides DMLC_NUM_WORKER");
DEFINE_string(ps_node_host, "",
              "overrides DMLC_NODE_HOST: this node's address as others see it");
DEFINE_string(ps_interface, "",
              "overrides DMLC_INTERFACE: take this interface's IPv4 address");
DEFINE_int32(ps_port, -1, "overrides DMLC_PORT: this node's port (0: any)");
DEFINE_string(ps_port_range, "", "overrides PS_PORT_RANGE: lo-hi");
DEFINE_int32(ps_rank, -1, "overrides PS_RANK: requested rank of this node");
DEFINE_int32(ps_connect_timeout_ms, -1, "overrides PS_CONNECT_TIMEOUT_MS");
DEFINE_int32(ps_rendezvous_timeout_ms, -1,
             "overrides PS_RENDEZVOUS_TIMEOUT_MS");
DEFINE_int32(ps_barrier_timeout_ms, -1, "overrides PS_BARRIER_TIMEOUT_MS");
DEFINE_int32(ps_heartbeat_interval_ms, -1,
             "overrides PS_HEARTBEAT_INTERVAL_MS (0 disables heartbeats)");
DEFINE_int32(ps_heartbeat_timeout_ms, -1, "overrides PS_HEARTBEAT_TIMEOUT_MS");
DEFINE_int32(ps_request_timeout_ms, -1,
             "overrides PS_REQUEST_TIMEOUT_MS (0: wait forever)");
DEFINE_int32(ps_wait_spin_us, -1,
             "overrides PS_WAIT_SPIN_US (0: Wait blocks at once)");
DEFINE_int64(ps_max_key, -1, "overrides PS_MAX_KEY");
DEFINE_int32(ps_verbose, -1, "overrides PS_VERBOSE: 0, 1 or 2");
DEFINE_int32(ps_shm, -1,
             "overrides PS_SHM: 1 shared memory to local nodes, 0 never");
DEFINE_string(ps_key_file, "",
              "overrides PS_KEY_FILE: the job's CurveZMQ secret key file");
DEFINE_int64(ps_max_message_bytes, -1, "overrides PS_MAX_MESSAGE_BYTES");
DEFINE_int32(ps_water_mark, -1, "overrides DMLC_PS_WATER_MARK");
DEFINE_int32(ps_resend_timeout_ms, -1,
             "overrides PS_RESEND_TIMEOUT_MS (0: never resend)");
DEFINE_int32(ps_replicas, -1,
             "overrides PS_REPLICAS: 1 keeps every server's keys on a second "
             "server too");
DEFINE_int32(ps_max_restarts, -1,
             "overrides PS_MAX_RESTARTS: > 0 lets a dead worker rejoin the "
             "job under its rank");
DEFINE_int32(ps_rejoin_timeout_ms, -1, "overrides PS_REJOIN_TIMEOUT_MS");

namespace ps {

namespace {

// One setting by its environment name: its value, and where it came from
// (the variable's name or "--flag"), which is what error messages name.
struct Setting {
  std::string value;
  std::string source;
};
using Settings = std::map<std::string, Setting>;

constexpr int64_t kUnsetFlag = -1;

// The Settings of an environment given as variable -> value.
Settings FromVariables(const std::map<std::string, std::string>& env) {
  Settings s;
  for (const auto& [name, value] : env) s[name] = {value, name};
  return s;
}

void Override(const char* variable, const char* flag, const std::string& v,
              Settings* s) {
  if (!v.empty()) (*s)[variable] = {v, std::string("--") + flag};
}
void Override(const char* variable, const char* flag, int64_t v, Settings* s) {
  if (v != kUnsetFlag) Override(variable, flag, std::to_string(v), s);
}

// Puts every --ps_* flag that is set over its variable. The node's host has
// two sources: --ps_interface wins over DMLC_NODE_HOST (a flag over the
// environment), --ps_node_host over both.
void ApplyFlags(Settings* s) {
  if (!FLAGS_ps_interface.empty()) s->erase("DMLC_NODE_HOST");
  Override("DMLC_ROLE", "ps_role", FLAGS_ps_role, s);
  Override("DMLC_PS_ROOT_URI", "ps_root_uri", FLAGS_ps_root_uri, s);
  Override("DMLC_PS_ROOT_PORT", "ps_root_port", FLAGS_ps_root_port, s);
  Override("DMLC_NUM_SERVER", "ps_num_servers", FLAGS_ps_num_servers, s);
  Override("DMLC_NUM_WORKER", "ps_num_workers", FLAGS_ps_num_workers, s);
  Override("DMLC_NODE_HOST", "ps_node_host", FLAGS_ps_node_host, s);
  Override("DMLC_INTERFACE", "ps_interface", FLAGS_ps_interface, s);
  Override("DMLC_PORT", "ps_port", FLAGS_ps_port, s);
  Override("PS_PORT_RANGE", "ps_port_range", FLAGS_ps_port_range, s);
  Override("PS_RANK", "ps_rank", FLAGS_ps_rank, s);
  Override("PS_CONNECT_TIMEOUT_MS", "ps_connect_timeout_ms",
           FLAGS_ps_connect_timeout_ms, s);
  Override("PS_RENDEZVOUS_TIMEOUT_MS", "ps_rendezvous_timeout_ms",
           FLAGS_ps_rendezvous_timeout_ms, s);
  Override("PS_BARRIER_TIMEOUT_MS", "ps_barrier_timeout_ms",
           FLAGS_ps_barrier_timeout_ms, s);
  Override("PS_HEARTBEAT_INTERVAL_MS", "ps_heartbeat_interval_ms",
           FLAGS_ps_heartbeat_interval_ms, s);
  Override("PS_HEARTBEAT_TIMEOUT_MS", "ps_heartbeat_timeout_ms",
           FLAGS_ps_heartbeat_timeout_ms, s);
  Override("PS_REQUEST_TIMEOUT_MS", "ps_request_timeout_ms",
           FLAGS_ps_request_timeout_ms, s);
  Override("PS_WAIT_SPIN_US", "ps_wait_spin_us", FLAGS_ps_wait_spin_us, s);
  Override("PS_MAX_KEY", "ps_max_key", FLAGS_ps_max_key, s);
  Override("PS_VERBOSE", "ps_verbose", FLAGS_ps_verbose, s);
  Override("PS_SHM", "ps_shm", FLAGS_ps_shm, s);
  Override("PS_KEY_FILE", "ps_key_file", FLAGS_ps_key_file, s);
  Override("PS_MAX_MESSAGE_BYTES", "ps_max_message_bytes",
           FLAGS_ps_max_message_bytes, s);
  Override("DMLC_PS_WATER_MARK", "ps_water_mark", FLAGS_ps_water_mark, s);
  Override("PS_RESEND_TIMEOUT_MS", "ps_resend_timeout_ms",
           FLAGS_ps_resend_timeout_ms, s);
  Override("PS_REPLICAS", "ps_replicas", FLAGS_ps_replicas, s);
  Override("PS_MAX_RESTARTS", "ps_max_restarts", FLAGS_ps_max_restarts, s);
  Override("PS_REJOIN_TIMEOUT_MS", "ps_rejoin_timeout_ms",
           FLAGS_ps_rejoin_timeout_ms, s);
}

// Looks a setting up by its variable name; nullptr when unset.
class Lookup {
 public:
  explicit Lookup(const Settings& s) : settings_(s) {}
  const Setting* operator()(const char* name) const {
    auto it = settings_.find(name);
    return it == settings_.end() ? nullptr : &it->second;
  }

 private:
  const Settings& settings_;
};

// The name errors give a setting: its source when set, else the variable.
std::string NameOf(const Lookup& env, const char* variable) {
  const Setting* v = env(variable);
  return v != nullptr ? v->source : variable;
}

// Parses an integer in [lo, hi]; `what` words the expectation.
Status ParseInt(const std::string& name, const std::string& value, int64_t lo,
                int64_t hi, const char* what, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return Status::InvalidArgument(name + "='" + value + "' is not " + what);
  }
  *out = v;
  return Status::OK();
}

// Reads `name` into *out when set; `required` makes absence an error.
Status ReadInt(const Lookup& env, const char* name, bool required, int64_t lo,
               int64_t hi, const char* what, int* out) {
  const Setting* v = env(name);
  if (v == nullptr) {
    return required
               ? Status::InvalidArgument(std::string(name) +
                                         " is not set (expected " + what + ")")
               : Status::OK();
  }
  int64_t parsed = 0;
  PS_RETURN_IF_ERROR(ParseInt(v->source, v->value, lo, hi, what, &parsed));
  *out = static_cast<int>(parsed);
  return Status::OK();
}

constexpr int64_t kIntMax = 2147483647;

Status ReadPortRange(const Lookup& env, Config* c) {
  const Setting* v = env("PS_PORT_RANGE");
  if (v == nullptr) return Status::OK();
  const std::string& range = v->value;
  size_t dash = range.find('-');
  int64_t lo = 0, hi = 0;
  auto bad = Status::InvalidArgument(v->source + "='" + range +
                                     "' is not a port range lo-hi");
  if (dash == std::string::npos) return bad;
  if (!ParseInt(v->source, range.substr(0, dash), 1, 65535, "", &lo).ok() ||
      !ParseInt(v->source, range.substr(dash + 1), 1, 65535, "", &hi).ok() ||
      lo > hi) {
    return bad;
  }
  c->port_range_lo = static_cast<int>(lo);
  c->port_range_hi = static_cast<int>(hi);
  return Status::OK();
}

Status ReadRole(const Lookup& env, Config* c) {
  const Setting* role = env("DMLC_ROLE");
  if (role == nullptr) {
    return Status::InvalidArgument(
        "DMLC_ROLE is not set (expected scheduler, server or worker)");
  }
  if (role->value == "scheduler") {
    c->role = Role::kScheduler;
  } else if (role->value == "server") {
    c->role = Role::kServer;
  } else if (role->value == "worker") {
    c->role = Role::kWorker;
  } else {
    return Status::InvalidArgument(role->source + "='" + role->value +
                                   "' is not scheduler, server or worker");
  }
  return Status::OK();
}

Status ReadHosts(const Lookup& env, Config* c) {
  if (const Setting* uri = env("DMLC_PS_ROOT_URI")) {
    if (uri->value.empty()) {
      return Status::InvalidArgument(uri->source + "='' is not a host");
    }
    c->root_uri = uri->value;
  }
  if (const Setting* iface = env("DMLC_INTERFACE")) {
    StatusOr<std::string> addr = InterfaceAddress(iface->value);
    if (!addr.ok()) {
      std::string name = iface->source + "='" + iface->value + "'";
      return addr.status().code() == Status::kInvalidArgument
                 ? Status::InvalidArgument(
                       name + " is not an interface with an IPv4 address")
                 : Status(addr.status().code(),
                          name + ": " + addr.status().message());
    }
    c->node_host = *addr;
  }
  if (const Setting* host = env("DMLC_NODE_HOST")) {
    if (host->value.empty()) {
      return Status::InvalidArgument(host->source + "='' is not a host");
    }
    c->node_host = host->value;
  }
  return Status::OK();
}

// ps-lite's heartbeat names, in seconds, where the _MS name is not set.
Status ReadPsLiteHeartbeat(const Lookup& env, Config* c) {
  int seconds = 0;
  if (env("PS_HEARTBEAT_INTERVAL_MS") == nullptr &&
      env("PS_HEARTBEAT_INTERVAL") != nullptr) {
    PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_INTERVAL", false, 0,
                               kIntMax / 1000,
                               "a non-negative number of seconds", &seconds));
    c->heartbeat_interval_ms = seconds * 1000;
  }
  if (env("PS_HEARTBEAT_TIMEOUT_MS") == nullptr &&
      env("PS_HEARTBEAT_TIMEOUT") != nullptr) {
    PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_TIMEOUT", false, 1,
                               kIntMax / 1000,
                               "a positive number of seconds (a silent node "
                               "is always declared dead in the end)",
                               &seconds));
    c->heartbeat_timeout_ms = seconds * 1000;
  }
  return Status::OK();
}

// Resending: PS_RESEND_TIMEOUT_MS, or ps-lite's PS_RESEND (0 turns it off)
// and PS_RESEND_TIMEOUT (milliseconds, as ps-lite's); the test switch
// PS_DROP_MSG.
Status ReadResend(const Lookup& env, Config* c) {
  int resend = 1;
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_RESEND", false, 0, 1, "0 or 1", &resend));
  if (env("PS_RESEND_TIMEOUT_MS") == nullptr) {
    PS_RETURN_IF_ERROR(ReadInt(env, "PS_RESEND_TIMEOUT", false, 1, kIntMax,
                               "a positive number of milliseconds",
                               &c->resend_timeout_ms));
  }
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_RESEND_TIMEOUT_MS", false, 0, kIntMax,
                             "a non-negative integer", &c->resend_timeout_ms));
  if (resend == 0) c->resend_timeout_ms = 0;
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_DROP_MSG", false, 0, 99,
                             "a percentage in [0, 99]", &c->drop_percent));
  PS_RETURN_IF_ERROR(
      ReadInt(env, "PS_REPLICAS", false, 0, 1, "0 or 1", &c->replicas));
  if (c->replicas > 0 && c->num_servers < 2) {
    return Status::InvalidArgument(NameOf(env, "PS_REPLICAS") +
                                   "='1' needs at least 2 servers (" +
                                   NameOf(env, "DMLC_NUM_SERVER") + " is " +
                                   std::to_string(c->num_servers) + ")");
  }
  if (c->replicas > 0 && c->resend_timeout_ms == 0) {
    return Status::InvalidArgument(
        NameOf(env, "PS_REPLICAS") +
        "='1' needs resending (a failover resends to the replica what the "
        "dead server did not answer); PS_RESEND_TIMEOUT_MS is 0");
  }
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_MAX_RESTARTS", false, 0, kIntMax,
                             "a non-negative integer", &c->max_restarts));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_REJOIN_TIMEOUT_MS", false, 1, kIntMax,
                             "a positive number of milliseconds",
                             &c->rejoin_timeout_ms));
  return Status::OK();
}

// ps-lite's DMLC_LOCAL.
Status ReadPsLiteOptions(const Lookup& env, Config* c) {
  int local = 0;
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_LOCAL", false, 0, 1, "0 or 1", &local));
  if (local == 1 && !c->shm) {
    return Status::InvalidArgument(
        NameOf(env, "DMLC_LOCAL") + "='1' asks for local transport, but " +
        NameOf(env, "PS_SHM") + "='0' turns shared memory off");
  }
  return Status::OK();
}

Status ReadTimeouts(const Lookup& env, Config* c) {
  const char* kPositive = "a positive integer";
  const char* kNonNeg = "a non-negative integer";
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_CONNECT_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c->connect_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_RENDEZVOUS_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c->rendezvous_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_BARRIER_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c->barrier_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_INTERVAL_MS", false, 0, kIntMax,
                             kNonNeg, &c->heartbeat_interval_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_HEARTBEAT_TIMEOUT_MS", false, 1, kIntMax,
                             kPositive, &c->heartbeat_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_REQUEST_TIMEOUT_MS", false, 0, kIntMax,
                             kNonNeg, &c->request_timeout_ms));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_WAIT_SPIN_US", false, 0, 1000000,
                             "an integer in [0, 1000000]", &c->wait_spin_us));
  PS_RETURN_IF_ERROR(ReadPsLiteHeartbeat(env, c));
  if (c->heartbeat_interval_ms > 0 &&
      c->heartbeat_timeout_ms <= c->heartbeat_interval_ms) {
    return Status::InvalidArgument(
        NameOf(env, "PS_HEARTBEAT_TIMEOUT_MS") + "='" +
        std::to_string(c->heartbeat_timeout_ms) + "' is not greater than " +
        NameOf(env, "PS_HEARTBEAT_INTERVAL_MS") + " (" +
        std::to_string(c->heartbeat_interval_ms) + ")");
  }
  return Status::OK();
}

// The job's key: the first line of PS_KEY_FILE, a Z85 CurveZMQ secret key.
Status ReadKeyFile(const Lookup& env, Config* c) {
  const Setting* v = env("PS_KEY_FILE");
  if (v == nullptr || v->value.empty()) return Status::OK();
  std::string name = v->source + "='" + v->value + "'";
  std::ifstream in(v->value);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return Status::InvalidArgument(
        name + ": cannot read the key file: " + std::strerror(errno));
  }
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  uint8_t key[32];
  if (line.size() != 40 || zmq_z85_decode(key, line.c_str()) == nullptr) {
    return Status::InvalidArgument(
        name +
        " does not hold a CurveZMQ secret key (its first line must be "
        "40 Z85 characters; make one with tracker/launch.py "
        "--make-key FILE)");
  }
  c->key_file = v->value;
  c->secret_key = line;
  return Status::OK();
}

StatusOr<Config> Parse(const Lookup& env) {
  Config c;
  PS_RETURN_IF_ERROR(ReadRole(env, &c));
  PS_RETURN_IF_ERROR(ReadHosts(env, &c));
  const char* kPositive = "a positive integer";
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_PS_ROOT_PORT", true, 1, 65535,
                             "a port number (1-65535)", &c.root_port));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_NUM_SERVER", true, 1, 10000, kPositive,
                             &c.num_servers));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_NUM_WORKER", true, 1, 10000, kPositive,
                             &c.num_workers));
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_PORT", false, 0, 65535,
                             "a port number (0-65535)", &c.port));
  PS_RETURN_IF_ERROR(ReadPortRange(env, &c));
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_RANK", false, 0, kIntMax,
                             "a non-negative integer", &c.rank));
  PS_RETURN_IF_ERROR(ReadTimeouts(env, &c));
  PS_RETURN_IF_ERROR(
      ReadInt(env, "PS_VERBOSE", false, 0, 2, "0, 1 or 2", &c.verbose));
  int shm = 1;
  PS_RETURN_IF_ERROR(ReadInt(env, "PS_SHM", false, 0, 1, "0 or 1", &shm));
  c.shm = shm == 1;
  PS_RETURN_IF_ERROR(ReadPsLiteOptions(env, &c));
  PS_RETURN_IF_ERROR(ReadResend(env, &c));
  PS_RETURN_IF_ERROR(ReadKeyFile(env, &c));
  if (const Setting* v = env("PS_MAX_MESSAGE_BYTES")) {
    PS_RETURN_IF_ERROR(ParseInt(v->source, v->value, 4096, INT64_MAX,
                                "an integer >= 4096", &c.max_message_bytes));
  }
  PS_RETURN_IF_ERROR(ReadInt(env, "DMLC_PS_WATER_MARK", false, 1, kIntMax,
                             kPositive, &c.water_mark));
  if (const Setting* v = env("PS_MAX_KEY")) {
    int64_t max_key = 0;
    PS_RETURN_IF_ERROR(
        ParseInt(v->source, v->value, 1, INT64_MAX, kPositive, &max_key));
    c.max_key = static_cast<Key>(max_key);
  }
  if (c.rank >= 0 && c.role != Role::kScheduler) {
    int n = c.role == Role::kServer ? c.num_servers : c.num_workers;
    if (c.rank >= n) {
      return Status::InvalidArgument(
          NameOf(env, "PS_RANK") + "='" + std::to_string(c.rank) +
          "' is out of range for " + std::to_string(n) +
          (c.role == Role::kServer ? " servers" : " workers"));
    }
  }
  if (c.role == Role::kScheduler) {
    c.port = c.root_port;
    c.rank = 0;
  }
  return c;
}

// The process environment's DMLC_* and PS_* variables.
std::map<std::string, std::string> ProcessEnvironment() {
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
  return env;
}

}  // namespace

StatusOr<Config> Config::FromEnv(
    const std::map<std::string, std::string>& env) {
  Settings settings = FromVariables(env);
  return Parse(Lookup(settings));
}

StatusOr<Config> Config::FromEnv() { return FromEnv(ProcessEnvironment()); }

std::map<std::string, std::string> Config::ProcessVariables() {
  return ProcessEnvironment();
}

StatusOr<Config> Config::FromEnvAndFlags(
    const std::map<std::string, std::string>& env) {
  Settings settings = FromVariables(env);
  ApplyFlags(&settings);
  return Parse(Lookup(settings));
}

StatusOr<Config> Config::FromEnvAndFlags() {
  return FromEnvAndFlags(ProcessEnvironment());
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
     << " request_timeout_ms=" << request_timeout_ms
     << " wait_spin_us=" << wait_spin_us << " max_key=" << max_key
     << " shm=" << shm << " key_file=" << (key_file.empty() ? "-" : key_file)
     << " max_message_bytes=" << max_message_bytes
     << " water_mark=" << water_mark
     << " resend_timeout_ms=" << resend_timeout_ms
     << " drop_percent=" << drop_percent << " replicas=" << replicas
     << " max_restarts=" << max_restarts
     << " rejoin_timeout_ms=" << rejoin_timeout_ms;
  return os.str();
}

StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return Status::Unavailable("getifaddrs failed looking for interface '" +
                               name + "'");
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
    return Status::InvalidArgument("interface '" + name +
                                   "' has no IPv4 address");
  }
  return found;
}

}  // namespace ps
