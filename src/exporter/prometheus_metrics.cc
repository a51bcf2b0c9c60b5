// PrometheusMetrics: the families, the per-peer cache, the role and rank
// labels added at scrape time, and its registration as the factory of every
// node's Metrics.
#include "exporter/prometheus_metrics.h"

#include <glog/logging.h>
#include <prometheus/check_names.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <utility>
#include <vector>

namespace ps {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

// Seconds, 100 us to ~50 s: a request on one host to a stalled server.
Histogram::BucketBoundaries RequestBuckets() {
  Histogram::BucketBoundaries b;
  for (double s = 1e-4; s < 60; s *= 2.5) b.push_back(s);
  return b;
}

// Seconds, 1 ms to ~10 min: a checkpoint of a small or a large model.
Histogram::BucketBoundaries CheckpointBuckets() {
  Histogram::BucketBoundaries b;
  for (double s = 1e-3; s < 1000; s *= 4) b.push_back(s);
  return b;
}

}  // namespace

// One peer's series (made under mu_; the counters are atomics).
struct PrometheusMetrics::PeerSeries {
  std::string name;
  Counter* bytes_sent;
  Counter* bytes_received;
  Counter* messages_sent;
  Counter* messages_received;
  // Under mu_: the state gauges made so far, and the heartbeat age.
  std::vector<std::pair<std::string, Gauge*>> states;
  Gauge* heartbeat_age = nullptr;
};

// The registry's families with role and rank added to every series.
class PrometheusMetrics::Labelled : public prometheus::Collectable {
 public:
  explicit Labelled(PrometheusMetrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<void()> hook;
    {
      MutexLock lock(&metrics_->mu_);
      hook = metrics_->hook_;
    }
    if (hook) hook();
    std::vector<prometheus::MetricFamily> families =
        metrics_->registry_->Collect();
    const int rank = metrics_->rank_.load();
    const std::string role = RoleName(metrics_->role_);
    const std::string rank_text = rank < 0 ? "" : std::to_string(rank);
    for (prometheus::MetricFamily& family : families) {
      for (prometheus::ClientMetric& m : family.metric) {
        m.label.insert(m.label.begin(), {{"role", role}, {"rank", rank_text}});
      }
    }
    return families;
  }

 private:
  PrometheusMetrics* const metrics_;  // owns this
};

PrometheusMetrics::PrometheusMetrics(Role role)
    : role_(role),
      registry_(std::make_shared<prometheus::Registry>()),
      labelled_(std::make_shared<Labelled>(this)) {
  prometheus::Registry& r = *registry_;
  RegisterPeerFamilies(r);
  RegisterNodeCounters(r);
  RegisterTimings(r);
}

// Per peer: traffic, membership state, heartbeat age.
void PrometheusMetrics::RegisterPeerFamilies(prometheus::Registry& r) {
  bytes_sent_ = &BuildCounter()
                     .Name("ps_bytes_sent_total")
                     .Help("Bytes sent to each peer (header and data)")
                     .Register(r);
  bytes_received_ = &BuildCounter()
                         .Name("ps_bytes_received_total")
                         .Help("Bytes received from each peer")
                         .Register(r);
  messages_sent_ = &BuildCounter()
                        .Name("ps_messages_sent_total")
                        .Help("Messages sent to each peer")
                        .Register(r);
  messages_received_ = &BuildCounter()
                            .Name("ps_messages_received_total")
                            .Help("Messages received from each peer")
                            .Register(r);
  peer_state_ = &BuildGauge()
                     .Name("ps_peer_state")
                     .Help("1 for each peer's present membership state")
                     .Register(r);
  heartbeat_age_ = &BuildGauge()
                        .Name("ps_peer_heartbeat_age_seconds")
                        .Help("Seconds since each watched peer was heard from")
                        .Register(r);
}

// The node's own counters: resends, duplicates, refusals.
void PrometheusMetrics::RegisterNodeCounters(prometheus::Registry& r) {
  resent_ = &BuildCounter()
                 .Name("ps_resent_total")
                 .Help("Requests sent again for want of an answer")
                 .Register(r)
                 .Add({});
  duplicates_ = &BuildCounter()
                     .Name("ps_duplicates_total")
                     .Help(
                         "Messages received again and answered from the "
                         "record (or let go)")
                     .Register(r)
                     .Add({});
  auto& refused = BuildCounter()
                      .Name("ps_messages_refused_total")
                      .Help("Messages and connections refused, by reason")
                      .Register(r);
  for (size_t i = 0; i < refused_.size(); ++i) {
    refused_[i] = &refused.Add(
        {{"reason", RefusalReasonName(static_cast<RefusalReason>(i))}});
  }
}

// Requests and checkpoints (histograms and their gauges), replication.
void PrometheusMetrics::RegisterTimings(prometheus::Registry& r) {
  auto& requests = BuildHistogram()
                       .Name("ps_request_seconds")
                       .Help(
                           "A worker's requests, from sending to the last "
                           "answer, by op")
                       .Register(r);
  request_push_ = &requests.Add({{"op", "push"}}, RequestBuckets());
  request_pull_ = &requests.Add({{"op", "pull"}}, RequestBuckets());
  request_pushpull_ = &requests.Add({{"op", "pushpull"}}, RequestBuckets());
  checkpoint_seconds_ = &BuildHistogram()
                             .Name("ps_checkpoint_seconds")
                             .Help("Time to write a checkpoint")
                             .Register(r)
                             .Add({}, CheckpointBuckets());
  checkpoint_bytes_ = &BuildGauge()
                           .Name("ps_checkpoint_bytes")
                           .Help("Bytes of the last checkpoint written")
                           .Register(r)
                           .Add({});
  checkpoints_ = &BuildCounter()
                      .Name("ps_checkpoints_total")
                      .Help("Checkpoints written")
                      .Register(r)
                      .Add({});
  replica_forwarded_ = &BuildCounter()
                            .Name("ps_replica_updates_sent_total")
                            .Help(
                                "Updates (pushes, step sums) a primary sent "
                                "to its replica")
                            .Register(r)
                            .Add({});
  replica_answered_ = &BuildCounter()
                           .Name("ps_replica_updates_answered_total")
                           .Help(
                               "Updates the replica answered (sent minus "
                               "answered: how far it lags)")
                           .Register(r)
                           .Add({});
}

PrometheusMetrics::~PrometheusMetrics() {
  // The endpoint's thread renders from the registry: joined first.
  endpoint_.Stop();
}

Status PrometheusMetrics::Serve(const std::string& host, int port,
                                const std::string& token) {
  StatusOr<std::string> address = ResolveIPv4(host);
  if (!address.ok()) {
    return Status::InvalidArgument(
        "cannot serve /metrics on " + host + ": " + address.status().message() +
        " (PS_METRICS_HOST, or DMLC_NODE_HOST while that is unset)");
  }
  if (*address != host && host != "localhost" &&
      address->rfind("127.", 0) == 0) {
    // Debian's /etc/hosts names the host itself 127.0.1.1, say.
    LOG(WARNING) << "/metrics listens on " << *address << ", which " << host
                 << " resolves to here: only this host reaches it (set "
                    "PS_METRICS_HOST to the address a scraper reaches)";
  }
  Status st = endpoint_.Start(*address, port, token, [this] { return Text(); });
  if (!st.ok() && port != 0) {
    return Status::Unavailable(st.message() +
                               " (PS_METRICS_PORT; is the port in use?)");
  }
  return st;
}

void PrometheusMetrics::StopServing() { endpoint_.Stop(); }

void PrometheusMetrics::SetCollectHook(std::function<void()> hook) {
  MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

std::string PrometheusMetrics::PeerName(int id) const {
  if (id == kSchedulerId) return "scheduler";
  if (IsServerId(id)) return "server" + std::to_string(IdToRank(id));
  if (IsWorkerId(id)) return "worker" + std::to_string(IdToRank(id));
  return "other";
}

PrometheusMetrics::PeerSeries& PrometheusMetrics::Peer(int id) {
  // No string is made on this path: only a new peer's series is named.
  const bool own = id < kMaxPeerIds &&
                   (id == kSchedulerId || IsServerId(id) || IsWorkerId(id));
  std::atomic<PeerSeries*>& slot = own ? peers_[id] : other_peer_;
  PeerSeries* series = slot.load(std::memory_order_acquire);
  if (series != nullptr) return *series;
  MutexLock lock(&mu_);
  series = slot.load(std::memory_order_relaxed);
  if (series != nullptr) return *series;
  auto made = std::make_unique<PeerSeries>();
  made->name = own ? PeerName(id) : "other";
  const prometheus::Labels labels{{"peer", made->name}};
  made->bytes_sent = &bytes_sent_->Add(labels);
  made->bytes_received = &bytes_received_->Add(labels);
  made->messages_sent = &messages_sent_->Add(labels);
  made->messages_received = &messages_received_->Add(labels);
  series = made.get();
  peer_series_.push_back(std::move(made));
  slot.store(series, std::memory_order_release);
  return *series;
}

void PrometheusMetrics::Sent(int peer, uint64_t bytes) {
  PeerSeries& p = Peer(peer);
  p.bytes_sent->Increment(static_cast<double>(bytes));
  p.messages_sent->Increment();
}

void PrometheusMetrics::Received(int peer, uint64_t bytes) {
  PeerSeries& p = Peer(peer);
  p.bytes_received->Increment(static_cast<double>(bytes));
  p.messages_received->Increment();
}

void PrometheusMetrics::Resent() { resent_->Increment(); }
void PrometheusMetrics::Duplicate() { duplicates_->Increment(); }
void PrometheusMetrics::Refused(RefusalReason reason) {
  refused_[static_cast<size_t>(reason)]->Increment();
}

void PrometheusMetrics::RequestDone(bool push, bool pull, double seconds) {
  Histogram* h = push && pull ? request_pushpull_
                 : push       ? request_push_
                              : request_pull_;
  h->Observe(seconds);
}

void PrometheusMetrics::SetPeerState(int peer, const char* state) {
  PeerSeries& p = Peer(peer);
  MutexLock lock(&mu_);
  Gauge* current = nullptr;
  for (auto& [name, gauge] : p.states) {
    if (name == state) current = gauge;
    gauge->Set(0);
  }
  if (current == nullptr) {
    current = &peer_state_->Add({{"peer", p.name}, {"state", state}});
    p.states.emplace_back(state, current);
  }
  current->Set(1);
}

void PrometheusMetrics::SetHeartbeatAge(int peer, double seconds) {
  PeerSeries& p = Peer(peer);
  MutexLock lock(&mu_);
  if (p.heartbeat_age == nullptr) {
    p.heartbeat_age = &heartbeat_age_->Add({{"peer", p.name}});
  }
  p.heartbeat_age->Set(seconds);
}

bool PrometheusMetrics::SetGauge(const std::string& name, double value) {
  if (!prometheus::CheckMetricName(name)) return false;
  MutexLock lock(&mu_);
  for (auto& [known, gauge] : gauges_) {
    if (known == name) {
      gauge->Set(value);
      return true;
    }
  }
  Gauge* gauge;
  try {
    gauge = &BuildGauge().Name(name).Help(name).Register(*registry_).Add({});
  } catch (const std::exception&) {
    return false;  // a name of another family
  }
  gauges_.emplace_back(name, gauge);
  gauge->Set(value);
  return true;
}

void PrometheusMetrics::CheckpointDone(double seconds, uint64_t bytes) {
  checkpoint_seconds_->Observe(seconds);
  checkpoint_bytes_->Set(static_cast<double>(bytes));
  checkpoints_->Increment();
}

void PrometheusMetrics::ReplicaForwarded() { replica_forwarded_->Increment(); }
void PrometheusMetrics::ReplicaAnswered() { replica_answered_->Increment(); }

std::string PrometheusMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(labelled_->Collect());
}

namespace {

std::unique_ptr<Metrics> MakePrometheusMetrics(Role role) {
  return std::make_unique<PrometheusMetrics>(role);
}

}  // namespace

}  // namespace ps

// Registers PrometheusMetrics while the program's statics are initialized.
// ps::ps names this symbol to the linker (-u, src/CMakeLists.txt), so the
// object is linked from the archive although no code calls into it.
extern "C" {
extern const bool ps_exporter_registered;
const bool ps_exporter_registered =
    (ps::RegisterMetricsFactory(&ps::MakePrometheusMetrics), true);
}
