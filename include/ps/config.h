// ps::Config: everything a node needs to know about its job, read once from
// the environment (ps-lite's DMLC_* names plus our PS_* additions) and the
// --ps_* gflags that override it, by Config::FromEnvAndFlags (what ps::Start
// uses) or Config::FromEnv: the one place that reads them. Fields may be set
// directly afterwards (tests build configs by hand). A plain value; not
// shared.
//
// Every option (variable, flag, accepted values, default, meaning) is one
// row of src/postoffice/options.def; docs/environment.md lists them (made
// from the table), as do `ps_options` and ConfigOptions() below. A flag at
// its default ("" for text, -1 for numbers) is not set and the variable
// decides; a flag that is set wins over its variable, and --ps_interface
// also over DMLC_NODE_HOST. The program parses its command line
// (gflags::ParseCommandLineFlags) or sets them (gflags::SetCommandLineOption)
// before ps::Start. Errors name the variable or flag and the value:
// "--ps_num_servers='0' is not a positive integer".
#ifndef PS_CONFIG_H_
#define PS_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/status.h"

namespace ps {

// The defaults below are the table's (core_unit_test's
// Options.DocumentedDefaultsAreTheDefaults keeps them equal).
struct Config {
  Role role = Role::kWorker;
  std::string root_uri = "127.0.0.1";
  int root_port = 0;
  int num_servers = 1;
  int num_workers = 1;
  std::string node_host = "127.0.0.1";
  int port = 0;           // 0: ephemeral (or the first free in the range)
  int port_range_lo = 0;  // both 0: no range
  int port_range_hi = 0;
  int rank = -1;  // -1: the scheduler assigns in order of arrival
  int connect_timeout_ms = 10000;
  int rendezvous_timeout_ms = 60000;
  int barrier_timeout_ms = 1800000;
  int heartbeat_interval_ms = 1000;
  int heartbeat_timeout_ms = 2500;
  int request_timeout_ms = 1800000;
  // A reply that comes within this many microseconds of Wait is picked up
  // without a thread wake-up (bench/kv: the one-float round trip).
  int wait_spin_us = 100;
  Key max_key = kMaxKey;
  int verbose = 0;
  int metrics_port = -1;  // -1: no /metrics; 0: an ephemeral port
  // The IPv4 address /metrics listens on; empty: node_host's (resolved
  // when a name); "0.0.0.0": every interface.
  std::string metrics_host;
  // PS_METRICS_TOKEN_FILE and the token read from it, which a scrape must
  // present as a bearer token (empty: none needed). The token is never
  // logged.
  std::string metrics_token_file;
  std::string metrics_token;
  bool shm = true;
  // The job's secret key in Z85 (40 characters) as read from
  // key_file (a path, or "fd:N" for PS_KEY_FD=N); empty: no encryption or
  // authentication. Never logged.
  std::string key_file;
  std::string secret_key;
  // PS_JOB_TOKEN: a registration must present it (empty: none needed).
  // Never logged.
  std::string job_token;
  int64_t max_message_bytes = int64_t{1} << 30;
  int water_mark = 1000;
  int handshake_timeout_ms = 3000;  // a connection's handshake, at most
  // Idle connections held at once from one source address, and in all
  // (VanOptions); 0: derived from the soft RLIMIT_NOFILE.
  int max_idle_connections_per_source = 0;
  int max_idle_connections = 0;
  int resend_timeout_ms = 1000;     // 0: never resend
  // Resends follow each peer's measured round trip, resend_timeout_ms
  // being the first timeout (src/postoffice/resender.h); false (set
  // PS_RESEND_TIMEOUT_MS): a fixed timer of resend_timeout_ms.
  bool resend_adaptive = true;
  int drop_percent = 0;  // tests: PS_DROP_MSG
  int replicas = 0;      // 0 or 1 (PS_REPLICAS)
  int max_restarts = 0;  // > 0: dead workers may rejoin
  int rejoin_timeout_ms = 60000;

  // Reads the process environment. Errors name the variable and the value.
  static StatusOr<Config> FromEnv();
  // Same, from a map of variable -> value (tests; a missing name = unset).
  static StatusOr<Config> FromEnv(
      const std::map<std::string, std::string>& env);
  // The environment with the --ps_* flags that are set applied over it;
  // errors name the variable or flag that gave the bad value. Reads the
  // flags' current values (not thread-safe against changing them).
  static StatusOr<Config> FromEnvAndFlags();
  static StatusOr<Config> FromEnvAndFlags(
      const std::map<std::string, std::string>& env);

  // The process environment's DMLC_* and PS_* variables (what FromEnv
  // reads).
  static std::map<std::string, std::string> ProcessVariables();

  // "tcp://root_uri:root_port".
  std::string SchedulerAddress() const;
  // One line naming every field, for logs.
  std::string ToString() const;
};

// One option of a node: a row of src/postoffice/options.def.
struct ConfigOption {
  enum Type { kText, kInt, kInt64 };
  const char* variable;  // "DMLC_NUM_SERVER"
  const char* flag;      // "ps_num_servers"; nullptr: environment only
  // ps-lite's name for this variable, read only while it is unset; else
  // nullptr.
  const char* alias_of;
  Type type;
  int64_t lo;  // integers: the accepted range [lo, hi]
  int64_t hi;
  const char* values;         // what errors say a bad value is not
  const char* default_value;  // the value when unset, "required" or "unset"
  const char* doc;            // one line
};

// Every option, in the order Config reads them.
const std::vector<ConfigOption>& ConfigOptions();
// The options as plain text, a few lines each (what `ps_options` prints).
std::string ConfigOptionsHelp();
// docs/environment.md: the options as a Markdown table, with the rules
// around them.
std::string ConfigOptionsMarkdown();

// The IPv4 address of network interface `name` (getifaddrs).
StatusOr<std::string> InterfaceAddress(const std::string& name);

}  // namespace ps

#endif  // PS_CONFIG_H_
