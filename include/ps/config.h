// ps::Config: everything a node needs to know about its job, read once from
// the environment (ps-lite's DMLC_* names plus our PS_* additions) and the
// --ps_* gflags that override it, by Config::FromEnvAndFlags (what ps::Start
// uses) or Config::FromEnv: the one place that reads them. Fields may be set
// directly afterwards (tests build configs by hand). A plain value; not
// shared.
//
//   DMLC_ROLE                scheduler | server | worker          (required)
//   DMLC_PS_ROOT_URI         scheduler host                       (127.0.0.1)
//   DMLC_PS_ROOT_PORT        scheduler port                       (required)
//   DMLC_NUM_SERVER          number of servers, >= 1              (required)
//   DMLC_NUM_WORKER          number of workers, >= 1              (required)
//   DMLC_NODE_HOST           this node's address as others see it
//   DMLC_INTERFACE           or: take the IPv4 of this interface  (lo -> ...)
//   DMLC_PORT                this node's port; 0 or unset: ephemeral
//   PS_PORT_RANGE            "lo-hi": bind the first free port in it
//   PS_RANK                  requested rank of this server/worker (tracker)
//   PS_CONNECT_TIMEOUT_MS    scheduler must answer within this    (10000)
//   PS_RENDEZVOUS_TIMEOUT_MS all nodes must register within this  (60000)
//   PS_BARRIER_TIMEOUT_MS    a barrier must complete within this  (1800000)
//   PS_HEARTBEAT_INTERVAL_MS heartbeat period; 0 disables         (1000)
//   PS_HEARTBEAT_TIMEOUT_MS  silent this long = dead: two missed
//                            heartbeats and half an interval      (2500)
//   PS_REQUEST_TIMEOUT_MS    KVWorker::Wait gives up; 0 = never   (0)
//   PS_WAIT_SPIN_US          KVWorker::Wait spins (yielding) this
//                            long before it blocks; 0 = never     (100)
//   PS_MAX_KEY               default placement: EvenKeys over it
//                            (the whole key space, as ps-lite)
//   PS_VERBOSE               0, 1 (rendezvous), 2 (every message) (0)
//   PS_SHM                   1: shared arrays (ps/shared_array.h) go to
//                            nodes of this host and user by
//                            reference; 0: always by socket      (1)
//   PS_KEY_FILE              the job's CurveZMQ secret key (Z85, first
//                            line of the file): every socket
//                            authenticates and encrypts with it, and
//                            a peer without it is refused at connect;
//                            unset: plain TCP, no authentication  (unset)
//   PS_MAX_MESSAGE_BYTES     a larger frame from the network is
//                            refused before it is buffered, and its
//                            sender disconnected; a larger message
//                            is not sent (its request fails)      (1 GiB)
//   DMLC_PS_WATER_MARK       messages queued per inbound connection
//                            (ZeroMQ's receive high-water mark)   (1000)
//   PS_RESEND_TIMEOUT_MS     a request (KV data, barrier) not
//                            answered within this is sent again,
//                            the wait doubling each time up to
//                            16x; receivers apply each request
//                            once; 0: never resend                (1000)
//   PS_REPLICAS              0 or 1: with 1 (needs >= 2 servers and
//                            resending), server r's keys are also
//                            held by server (r+1)%S, which takes
//                            them over when r dies                (0)
//   PS_MAX_RESTARTS          > 0: a dead worker or scheduler may be
//                            restarted (launch.py --max-restarts
//                            sets it): the job waits for it
//                            instead of failing; a worker rejoins
//                            with its rank (PS_RANK), a scheduler
//                            at its address takes the job over   (0)
//   PS_REJOIN_TIMEOUT_MS     with PS_MAX_RESTARTS, how long the job
//                            waits for a dead worker or scheduler
//                            to come back before it fails naming
//                            it                                  (60000)
//   PS_DROP_MSG              tests and benchmarks only: drop this
//                            percentage of received KV data and
//                            barrier messages at random           (0)
// ps-lite's names, read too: PS_HEARTBEAT_INTERVAL / PS_HEARTBEAT_TIMEOUT
// (seconds; the _MS names win when both are set), PS_RESEND (0 turns
// resending off; 1, the default, keeps it on) and PS_RESEND_TIMEOUT
// (milliseconds; PS_RESEND_TIMEOUT_MS wins), DMLC_LOCAL (0 or 1; 1 needs
// PS_SHM on: nodes of one host then pass shared arrays by reference).
//
// Flags (gflags, defined by the library), one per variable:
//   --ps_role DMLC_ROLE                   --ps_rank PS_RANK
//   --ps_root_uri DMLC_PS_ROOT_URI        --ps_connect_timeout_ms
//   --ps_root_port DMLC_PS_ROOT_PORT      --ps_rendezvous_timeout_ms
//   --ps_num_servers DMLC_NUM_SERVER      --ps_barrier_timeout_ms
//   --ps_num_workers DMLC_NUM_WORKER      --ps_heartbeat_interval_ms
//   --ps_node_host DMLC_NODE_HOST         --ps_heartbeat_timeout_ms
//   --ps_interface DMLC_INTERFACE         --ps_request_timeout_ms
//   --ps_port DMLC_PORT                   --ps_max_key PS_MAX_KEY
//   --ps_port_range PS_PORT_RANGE         --ps_verbose PS_VERBOSE
//   --ps_wait_spin_us PS_WAIT_SPIN_US     --ps_shm PS_SHM
//   --ps_key_file PS_KEY_FILE             --ps_max_message_bytes
//   --ps_water_mark DMLC_PS_WATER_MARK    --ps_resend_timeout_ms
//   --ps_replicas PS_REPLICAS             --ps_max_restarts PS_MAX_RESTARTS
//   --ps_rejoin_timeout_ms
// (each --ps_*_timeout_ms / _interval_ms overrides the PS_* of that name). A
// flag at its default ("" for text, -1 for numbers) is not set and the
// variable decides; a flag that is set wins over its variable, and
// --ps_interface also over DMLC_NODE_HOST. The program parses its command
// line (gflags::ParseCommandLineFlags) or sets them
// (gflags::SetCommandLineOption) before ps::Start. Errors name the variable
// or flag and the value: "--ps_num_servers='0' is not a positive integer".
#ifndef PS_CONFIG_H_
#define PS_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>

#include "ps/base.h"
#include "ps/status.h"

namespace ps {

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
  int request_timeout_ms = 0;
  // A reply that comes within this many microseconds of Wait is picked up
  // without a thread wake-up (bench/kv: the one-float round trip).
  int wait_spin_us = 100;
  Key max_key = kMaxKey;
  int verbose = 0;
  bool shm = true;
  // CurveZMQ: the job's secret key in Z85 (40 characters) as read from
  // key_file; empty: no encryption or authentication. Never logged.
  std::string key_file;
  std::string secret_key;
  int64_t max_message_bytes = int64_t{1} << 30;
  int water_mark = 1000;
  int resend_timeout_ms = 1000;  // 0: never resend
  int drop_percent = 0;          // tests: PS_DROP_MSG
  int replicas = 0;              // 0 or 1 (PS_REPLICAS)
  int max_restarts = 0;          // > 0: dead workers may rejoin
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

// The IPv4 address of network interface `name` (getifaddrs).
StatusOr<std::string> InterfaceAddress(const std::string& name);

}  // namespace ps

#endif  // PS_CONFIG_H_
