// Config::FromEnv / FromEnvAndFlags: the one place that reads the DMLC_* /
// PS_* environment and the --ps_* flags that override it, row by row of
// options.def.
#include "ps/config.h"

#include <arpa/inet.h>
#include <gflags/gflags.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "metrics/token_file.h"
#include "postoffice/key_file.h"
#include "postoffice/options.h"

// The --ps_* flags, one per option that has one (options.def). At its
// default ("" or -1) a flag is not set: the environment decides.
#define PS_FLAG_Text(flag, help) DEFINE_string(flag, "", help);
#define PS_FLAG_Int(flag, help) DEFINE_int32(flag, -1, help);
#define PS_FLAG_Int64(flag, help) DEFINE_int64(flag, -1, help);
#define PS_FLAG_HELP(var, values, def, doc) \
  "overrides " #var ", " values " (default " def "): " doc
#define PS_OPTION(var, flag, type, lo, hi, values, def, doc, store) \
  PS_FLAG_##type(flag, PS_FLAG_HELP(var, values, def, doc))
#define PS_ENV_OPTION(...)
#define PS_ALIAS(...)
#include "postoffice/options.def"
#undef PS_FLAG_Text
#undef PS_FLAG_Int
#undef PS_FLAG_Int64
#undef PS_FLAG_HELP

namespace ps {

namespace {

// One setting by its environment name: its value, and where it came from
// (the variable's name or "--flag"), which is what error messages name.
struct Setting {
  std::string value;
  std::string source;
};
using Settings = std::map<std::string, Setting>;

// The options by name, in the order of options.def: the parser can only
// ask for a variable that is in the table.
enum class Id {
#define PS_OPTION(var, ...) var,
#define PS_ENV_OPTION(var, ...) var,
#define PS_ALIAS(var, ...) var,
#include "postoffice/options.def"
};

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
  if (v != -1) Override(variable, flag, std::to_string(v), s);  // -1: unset
}

// Puts every --ps_* flag that is set over its variable. The node's host has
// two sources: --ps_interface wins over DMLC_NODE_HOST (a flag over the
// environment), --ps_node_host over both.
void ApplyFlags(Settings* s) {
  if (!FLAGS_ps_interface.empty()) s->erase("DMLC_NODE_HOST");
#define PS_OPTION(var, flag, ...) Override(#var, #flag, FLAGS_##flag, s);
#define PS_ENV_OPTION(...)
#define PS_ALIAS(...)
#include "postoffice/options.def"
}

// Looks a setting up by its option; nullptr when unset.
class Lookup {
 public:
  explicit Lookup(const Settings& s) : settings_(s) {}
  const Setting* operator()(Id id) const {
    return Find(kConfigOptions[static_cast<int>(id)].variable);
  }
  const Setting* Find(const char* variable) const {
    auto it = settings_.find(variable);
    return it == settings_.end() ? nullptr : &it->second;
  }

 private:
  const Settings& settings_;
};

// The name errors give an option: its source when set, else the variable.
std::string NameOf(const Lookup& env, Id id) {
  const Setting* v = env(id);
  return v != nullptr ? v->source
                      : kConfigOptions[static_cast<int>(id)].variable;
}

// One set option as a reader of options.def sees it: the setting, its
// value as an integer (integer options; checked against the row's range)
// and the others.
struct Value {
  const ConfigOption& option;
  const Setting& setting;
  int64_t number;
  const Lookup& env;

  // "NAME='value' is not <the row's values>".
  Status Invalid() const {
    return Status::InvalidArgument(setting.source + "='" + setting.value +
                                   "' is not " + option.values);
  }
};

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

// The readers options.def names.

// A host name or address: not empty. DMLC_NODE_HOST's, read after
// DMLC_INTERFACE, wins over it.
template <std::string Config::*kHost>
Status ReadHost(const Value& v, Config* c) {
  if (v.setting.value.empty()) return v.Invalid();
  c->*kHost = v.setting.value;
  return Status::OK();
}

// An integer (in the row's range) into a field of another type than int.
template <auto kField>
Status ReadAs(const Value& v, Config* c) {
  using Type = std::remove_reference_t<decltype(c->*kField)>;
  c->*kField = static_cast<Type>(v.number);
  return Status::OK();
}

Status ReadRole(const Value& v, Config* c) {
  const std::string& role = v.setting.value;
  if (role == "scheduler") {
    c->role = Role::kScheduler;
  } else if (role == "server") {
    c->role = Role::kServer;
  } else if (role == "worker") {
    c->role = Role::kWorker;
  } else {
    return v.Invalid();
  }
  return Status::OK();
}

Status ReadInterface(const Value& v, Config* c) {
  StatusOr<std::string> addr = InterfaceAddress(v.setting.value);
  if (!addr.ok()) {
    return addr.status().code() == Status::kInvalidArgument
               ? v.Invalid()
               : Status(addr.status().code(),
                        v.setting.source + "='" + v.setting.value +
                            "': " + addr.status().message());
  }
  c->node_host = *addr;
  return Status::OK();
}

Status ReadPortRange(const Value& v, Config* c) {
  const std::string& range = v.setting.value;
  size_t dash = range.find('-');
  int64_t lo = 0, hi = 0;
  if (dash == std::string::npos ||
      !ParseInt("", range.substr(0, dash), 1, 65535, "", &lo).ok() ||
      !ParseInt("", range.substr(dash + 1), 1, 65535, "", &hi).ok() ||
      lo > hi) {
    return v.Invalid();
  }
  c->port_range_lo = static_cast<int>(lo);
  c->port_range_hi = static_cast<int>(hi);
  return Status::OK();
}

// ps-lite's heartbeat names, in seconds.
template <int Config::*kMillis>
Status ReadSeconds(const Value& v, Config* c) {
  c->*kMillis = static_cast<int>(v.number * 1000);
  return Status::OK();
}

// Read after PS_SHM.
Status ReadLocal(const Value& v, Config* c) {
  if (v.number == 1 && !c->shm) {
    return Status::InvalidArgument(
        v.setting.source + "='1' asks for local transport, but " +
        NameOf(v.env, Id::PS_SHM) + "='0' turns shared memory off");
  }
  return Status::OK();
}

// PS_RESEND_TIMEOUT_MS (or ps-lite's name) set: a fixed timer.
Status ReadResendTimeout(const Value& v, Config* c) {
  c->resend_timeout_ms = static_cast<int>(v.number);
  c->resend_adaptive = false;
  return Status::OK();
}

// Read after the resend timeouts: 0 turns resending off.
Status ReadResend(const Value& v, Config* c) {
  if (v.number == 0) c->resend_timeout_ms = 0;
  return Status::OK();
}

Status ReadKeyFile(const Value& v, Config* c) {
  if (v.setting.value.empty()) return Status::OK();
  StatusOr<std::string> key = ReadSecretKey(
      v.setting.source + "='" + v.setting.value + "'", v.setting.value);
  if (!key.ok()) return key.status();
  c->key_file = v.setting.value;
  c->secret_key = *key;
  return Status::OK();
}

// Read after PS_KEY_FILE; Config::key_file says "fd:N".
Status ReadKeyFd(const Value& v, Config* c) {
  if (!c->key_file.empty()) {
    return Status::InvalidArgument(v.setting.source + " and " +
                                   NameOf(v.env, Id::PS_KEY_FILE) +
                                   " are both set; give the key one way");
  }
  StatusOr<std::string> key =
      ReadSecretKeyFromFd(v.setting.source + "='" + v.setting.value + "'",
                          static_cast<int>(v.number));
  if (!key.ok()) return key.status();
  c->key_file = "fd:" + std::to_string(v.number);
  c->secret_key = *key;
  return Status::OK();
}

// A secret of the job: its value never appears in an error.
Status ReadJobToken(const Value& v, Config* c) {
  const std::string& token = v.setting.value;
  if (token.empty()) return Status::OK();
  bool printable = token.size() >= 16 && token.size() <= 256;
  for (unsigned char ch : token) printable = printable && ch > 32 && ch < 127;
  if (!printable) {
    return Status::InvalidArgument(
        v.setting.source + " (" + std::to_string(token.size()) +
        " characters, not shown) is not " + v.option.values);
  }
  c->job_token = token;
  return Status::OK();
}

// A numeric IPv4 address (no name: what /metrics listens on is explicit).
Status ReadMetricsHost(const Value& v, Config* c) {
  in_addr addr{};
  if (inet_pton(AF_INET, v.setting.value.c_str(), &addr) != 1) {
    return v.Invalid();
  }
  c->metrics_host = v.setting.value;
  return Status::OK();
}

// The token is checked and kept; errors name the file, never the token.
Status ReadMetricsTokenFile(const Value& v, Config* c) {
  if (v.setting.value.empty()) return Status::OK();
  StatusOr<std::string> token = ReadBearerToken(
      v.setting.source + "='" + v.setting.value + "'", v.setting.value);
  if (!token.ok()) return token.status();
  c->metrics_token_file = v.setting.value;
  c->metrics_token = *token;
  return Status::OK();
}

// How a row's value goes into the Config: an int field as it is, or a
// reader above.
struct Store {
  int Config::*field;
  Status (*read)(const Value&, Config*);
};
constexpr Store Field(int Config::*field) { return {field, nullptr}; }
constexpr Store Apply(Status (*read)(const Value&, Config*)) {
  return {nullptr, read};
}

constexpr Store kStores[] = {
#define PS_OPTION(var, flag, type, lo, hi, values, def, doc, store) store,
#define PS_ENV_OPTION(var, type, lo, hi, values, def, doc, store) store,
#define PS_ALIAS(var, main, type, lo, hi, values, doc, store) store,
#include "postoffice/options.def"
};
static_assert(std::size(kStores) == kNumConfigOptions);

// Field(&m) rows are Int rows (their range fits an int).
constexpr bool FieldsAreInts() {
  for (size_t i = 0; i < kNumConfigOptions; ++i) {
    if (kStores[i].field && kConfigOptions[i].type != ConfigOption::kInt) {
      return false;
    }
  }
  return true;
}
static_assert(FieldsAreInts(), "a Field(&m) row of options.def is not Int");

bool IsRequired(const ConfigOption& o) {
  return std::strcmp(o.default_value, "required") == 0;
}

// Reads option `i` into *c when it is set; one not set keeps Config's
// default, which the table's "default" states.
Status ReadOption(const Lookup& env, size_t i, Config* c) {
  const ConfigOption& o = kConfigOptions[i];
  const Setting* v = env(static_cast<Id>(i));
  if (v == nullptr) {
    return IsRequired(o) ? Status::InvalidArgument(std::string(o.variable) +
                                                   " is not set (expected " +
                                                   o.values + ")")
                         : Status::OK();
  }
  if (o.alias_of != nullptr && env.Find(o.alias_of) != nullptr) {
    return Status::OK();  // the main name wins
  }
  int64_t number = 0;
  if (o.type != ConfigOption::kText) {
    PS_RETURN_IF_ERROR(
        ParseInt(v->source, v->value, o.lo, o.hi, o.values, &number));
  }
  const Store& store = kStores[i];
  if (store.field != nullptr) {
    c->*store.field = static_cast<int>(number);
    return Status::OK();
  }
  return store.read(Value{o, *v, number, env}, c);
}

// The rules between options, once each is read.
Status CheckTogether(const Lookup& env, const Config& c) {
  if (c.heartbeat_interval_ms > 0 &&
      c.heartbeat_timeout_ms <= c.heartbeat_interval_ms) {
    return Status::InvalidArgument(
        NameOf(env, Id::PS_HEARTBEAT_TIMEOUT_MS) + "='" +
        std::to_string(c.heartbeat_timeout_ms) + "' is not greater than " +
        NameOf(env, Id::PS_HEARTBEAT_INTERVAL_MS) + " (" +
        std::to_string(c.heartbeat_interval_ms) + ")");
  }
  if (c.replicas > 0 && c.num_servers < 2) {
    return Status::InvalidArgument(NameOf(env, Id::PS_REPLICAS) +
                                   "='1' needs at least 2 servers (" +
                                   NameOf(env, Id::DMLC_NUM_SERVER) + " is " +
                                   std::to_string(c.num_servers) + ")");
  }
  if (c.replicas > 0 && c.resend_timeout_ms == 0) {
    return Status::InvalidArgument(
        NameOf(env, Id::PS_REPLICAS) +
        "='1' needs resending (a failover resends to the replica what the "
        "dead server did not answer); PS_RESEND_TIMEOUT_MS is 0");
  }
  if (c.rank >= 0 && c.role != Role::kScheduler) {
    int n = c.role == Role::kServer ? c.num_servers : c.num_workers;
    if (c.rank >= n) {
      return Status::InvalidArgument(
          NameOf(env, Id::PS_RANK) + "='" + std::to_string(c.rank) +
          "' is out of range for " + std::to_string(n) +
          (c.role == Role::kServer ? " servers" : " workers"));
    }
  }
  return Status::OK();
}

StatusOr<Config> Parse(const Lookup& env) {
  Config c;
  for (size_t i = 0; i < kNumConfigOptions; ++i) {
    PS_RETURN_IF_ERROR(ReadOption(env, i, &c));
  }
  PS_RETURN_IF_ERROR(CheckTogether(env, c));
  if (c.role == Role::kScheduler) {
    c.port = c.root_port;
    c.rank = 0;
  }
  return c;
}

}  // namespace

StatusOr<Config> Config::FromEnv(
    const std::map<std::string, std::string>& env) {
  Settings settings = FromVariables(env);
  return Parse(Lookup(settings));
}

StatusOr<Config> Config::FromEnv() { return FromEnv(ProcessVariables()); }

StatusOr<Config> Config::FromEnvAndFlags(
    const std::map<std::string, std::string>& env) {
  Settings settings = FromVariables(env);
  ApplyFlags(&settings);
  return Parse(Lookup(settings));
}

StatusOr<Config> Config::FromEnvAndFlags() {
  return FromEnvAndFlags(ProcessVariables());
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
     << " handshake_timeout_ms=" << handshake_timeout_ms
     << " max_idle_connections_per_source=" << max_idle_connections_per_source
     << " max_idle_connections=" << max_idle_connections
     << " resend_timeout_ms=" << resend_timeout_ms
     << " resend_adaptive=" << resend_adaptive
     << " drop_percent=" << drop_percent << " replicas=" << replicas
     << " max_restarts=" << max_restarts
     << " rejoin_timeout_ms=" << rejoin_timeout_ms
     << " metrics_port=" << metrics_port
     << " metrics_host=" << (metrics_host.empty() ? "-" : metrics_host)
     << " metrics_token_file="
     << (metrics_token_file.empty() ? "-" : metrics_token_file);
  return os.str();
}

}  // namespace ps
