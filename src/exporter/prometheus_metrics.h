// PrometheusMetrics: the Metrics of metrics/metrics.h kept in a registry of
// Prometheus metrics (prometheus-cpp's core: counters, gauges, histograms,
// the text format), and the HTTP endpoint that serves it as /metrics
// (PS_METRICS_PORT; http_endpoint.h). Linking this layer (ps::exporter, part
// of ps::ps) registers it as the factory of every node's Metrics
// (RegisterMetricsFactory); every series gets the node's role and rank as
// labels when it is scraped (the rank is known only after rendezvous, and
// changes nothing already counted).
//
// Cost: a count is an atomic add on a handle looked up once. Per-peer
// series are made on a peer's first message and cached by node id in an
// array read without a lock; ids past kMaxPeerIds (or not yet assigned,
// before rendezvous) share the series of peer="other". Label values are
// never text a peer chose: peers are named by role and rank, refusals by a
// fixed set of reasons (RefusalReason).
//
// Thread-safety: every method may be called from any thread, but Serve
// and StopServing from one. The collect hook runs on a thread of the HTTP
// endpoint ("ps-metrics", started by Serve and joined by StopServing),
// under no lock of this class.
#ifndef PS_SRC_EXPORTER_PROMETHEUS_METRICS_H_
#define PS_SRC_EXPORTER_PROMETHEUS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "exporter/http_endpoint.h"
#include "metrics/metrics.h"
#include "ps/base.h"
#include "ps/status.h"
#include "van/sync.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace ps {

class PrometheusMetrics : public Metrics {
 public:
  // Node ids below this get series of their own (a job of up to ~500
  // servers and ~500 workers); the others share peer="other".
  static constexpr int kMaxPeerIds = 1024;

  explicit PrometheusMetrics(Role role);
  ~PrometheusMetrics() override;

  // Serves /metrics on host:port: host an IPv4 address (0.0.0.0: every
  // interface) or a name, which listens on the first IPv4 address it
  // resolves to; port 0: an ephemeral one. A non-empty `token` must come
  // with every scrape as "Authorization: Bearer <token>" (else 401). Error
  // names the address and why (e.g. the port is in use).
  Status Serve(const std::string& host, int port,
               const std::string& token = "") override;
  // Stops serving (joins the endpoint's thread). Idempotent; the
  // destructor stops too.
  void StopServing() override;
  // The port /metrics is served on; 0 when not serving.
  int port() const override { return endpoint_.port(); }
  // The IPv4 address it listens on ("" when not serving).
  std::string address() const override { return endpoint_.address(); }
  // The rank label (-1 until known: rank="").
  void set_rank(int rank) override { rank_.store(rank); }

  // Runs before each scrape (e.g. to refresh gauges of peer states).
  void SetCollectHook(std::function<void()> hook) override;

  // Traffic with node `peer`: one message of `bytes` (header and data).
  void Sent(int peer, uint64_t bytes) override;
  void Received(int peer, uint64_t bytes) override;
  void Resent() override;
  void Duplicate() override;
  void Refused(RefusalReason reason) override;
  // A worker's request, from sending to its last answer.
  void RequestDone(bool push, bool pull, double seconds) override;
  // Peer `peer`'s state (one of `states`: exactly one gauge is 1) and the
  // seconds since it was last heard from (negative: never; not set).
  void SetPeerState(int peer, const char* state) override;
  void SetHeartbeatAge(int peer, double seconds) override;
  // Training (the application's, through ps::Node::SetMetric, and the
  // dense shard's): a gauge named `name` (a valid Prometheus name), made on
  // first use. False if the name is not valid.
  bool SetGauge(const std::string& name, double value) override;
  // A checkpoint written: its duration and its bytes.
  void CheckpointDone(double seconds, uint64_t bytes) override;

  // Replication, at a primary: an update (a push copied, or a step's sum)
  // sent to its replica, and one the replica answered. Their difference
  // is how far the replica lags.
  void ReplicaForwarded() override;
  void ReplicaAnswered() override;

  // The text a scrape would get (tests; also without Serve).
  std::string Text() const;

 private:
  // The constructor's parts: each registers its families in r.
  void RegisterPeerFamilies(prometheus::Registry& r);
  void RegisterNodeCounters(prometheus::Registry& r);
  void RegisterTimings(prometheus::Registry& r);
  struct PeerSeries;
  class Labelled;

  PeerSeries& Peer(int id);
  std::string PeerName(int id) const;

  const Role role_;
  std::atomic<int> rank_{-1};
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Labelled> labelled_;
  HttpEndpoint endpoint_;

  prometheus::Family<prometheus::Counter>* bytes_sent_;
  prometheus::Family<prometheus::Counter>* bytes_received_;
  prometheus::Family<prometheus::Counter>* messages_sent_;
  prometheus::Family<prometheus::Counter>* messages_received_;
  prometheus::Family<prometheus::Gauge>* peer_state_;
  prometheus::Family<prometheus::Gauge>* heartbeat_age_;
  prometheus::Counter* resent_;
  prometheus::Counter* duplicates_;
  std::array<prometheus::Counter*, 5> refused_;
  prometheus::Histogram* request_push_;
  prometheus::Histogram* request_pull_;
  prometheus::Histogram* request_pushpull_;
  prometheus::Histogram* checkpoint_seconds_;
  prometheus::Gauge* checkpoint_bytes_;
  prometheus::Counter* checkpoints_;
  prometheus::Counter* replica_forwarded_;
  prometheus::Counter* replica_answered_;

  // Made under mu_, read without it once set.
  std::array<std::atomic<PeerSeries*>, kMaxPeerIds> peers_{};
  std::atomic<PeerSeries*> other_peer_{nullptr};
  Mutex mu_;
  std::vector<std::unique_ptr<PeerSeries>> peer_series_ GUARDED_BY(mu_);
  std::vector<std::pair<std::string, prometheus::Gauge*>> gauges_
      GUARDED_BY(mu_);
  std::function<void()> hook_ GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_SRC_EXPORTER_PROMETHEUS_METRICS_H_
