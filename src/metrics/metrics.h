// Metrics: what a node reports as it runs (traffic per peer, resends,
// refusals, requests, peer states, checkpoints, replication, the
// application's gauges), as one interface that the van, the postoffice and
// the KV engines call where an event happens, one call each. This class
// itself counts nothing: it is what a program gets when it does not link the
// Prometheus exporter (src/exporter/prometheus_metrics.h, the target
// ps::exporter that ps::ps brings), so that a program which only pushes and
// pulls (ps::kv) links no metrics library.
//
// MakeMetrics gives a node its Metrics: the registered factory's (the
// exporter registers one when it is linked) or this one. Label values are
// never text a peer chose: peers are named by node id, refusals by a fixed
// set of reasons (RefusalReason).
//
// Thread-safety: every method may be called from any thread, but Serve and
// StopServing from one (an implementation's contract may say more).
#ifndef PS_SRC_METRICS_METRICS_H_
#define PS_SRC_METRICS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ps/base.h"
#include "ps/status.h"

namespace ps {

// Why a message was refused, as a label value (ps_messages_refused_total).
enum class RefusalReason : uint8_t {
  kAuthentication,  // no token of the job, or frames that do not open
  kSize,            // over a limit of size or count
  kMalformed,       // does not decode, or breaks the protocol
  kNotAMember,      // a sender the node table does not prove
  kOther,
};
const char* RefusalReasonName(RefusalReason reason);
// The reason of a drop from the words that explain it (Van::CountDropped's
// `why`); kOther when none fits.
RefusalReason ClassifyRefusal(const std::string& why);

class Metrics {
 public:
  Metrics() = default;
  virtual ~Metrics() = default;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves the metrics on host:port (PS_METRICS_PORT). Here: always
  // InvalidArgument naming the port and the target to link.
  virtual Status Serve(const std::string& host, int port,
                       const std::string& token = "");
  // Stops serving. Idempotent.
  virtual void StopServing() {}
  // The port the metrics are served on; 0 when not serving.
  virtual int port() const { return 0; }
  // The IPv4 address it listens on ("" when not serving).
  virtual std::string address() const { return ""; }
  // The node's rank, once known (-1 until then).
  virtual void set_rank(int /*rank*/) {}
  // Runs before each scrape (e.g. to refresh gauges of peer states). By
  // value: an implementation keeps it.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  virtual void SetCollectHook(std::function<void()> /*hook*/) {}

  // Traffic with node `peer`: one message of `bytes` (header and data).
  virtual void Sent(int /*peer*/, uint64_t /*bytes*/) {}
  virtual void Received(int /*peer*/, uint64_t /*bytes*/) {}
  virtual void Resent() {}
  virtual void Duplicate() {}
  virtual void Refused(RefusalReason /*reason*/) {}
  // A worker's request, from sending to its last answer.
  virtual void RequestDone(bool /*push*/, bool /*pull*/, double /*seconds*/) {}
  // Peer `peer`'s state and the seconds since it was last heard from.
  virtual void SetPeerState(int /*peer*/, const char* /*state*/) {}
  virtual void SetHeartbeatAge(int /*peer*/, double /*seconds*/) {}
  // A gauge named `name` (a valid Prometheus name), made on first use
  // (ps::Node::SetMetric). False if the name is not valid; here, always
  // true (nothing is kept).
  virtual bool SetGauge(const std::string& /*name*/, double /*value*/) {
    return true;
  }
  // A checkpoint written: its duration and its bytes.
  virtual void CheckpointDone(double /*seconds*/, uint64_t /*bytes*/) {}
  // Replication, at a primary: an update sent to its replica, and one the
  // replica answered.
  virtual void ReplicaForwarded() {}
  virtual void ReplicaAnswered() {}
};

// Makes the Metrics of a node of `role`. Set once, before any node starts
// (the exporter does it while the program's statics are initialized).
using MetricsFactory = std::unique_ptr<Metrics> (*)(Role role);
void RegisterMetricsFactory(MetricsFactory factory);
// The registered factory's Metrics, or a Metrics that counts nothing.
std::unique_ptr<Metrics> MakeMetrics(Role role);

}  // namespace ps

#endif  // PS_SRC_METRICS_METRICS_H_
