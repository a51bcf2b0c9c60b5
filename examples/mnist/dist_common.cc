// Key layout, placement, ownership text, metrics and weight dumps of
// mnist_dist (dist_common.h).
#include "dist_common.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "model/backend.h"
#include "ps/ps.h"

namespace mnist {

void Die(const std::string& message) {
  std::fprintf(stderr, "mnist_dist: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

CheckpointJob CheckpointJobOf(const TrainOptions& options) {
  CheckpointJob job;
  job.dir = options.checkpoint_dir;
  job.num_servers = ps::NumServers();
  job.num_workers = ps::NumWorkers();
  job.model_floats = ModelLayout(options).total;
  job.chunk = options.chunk;
  return job;
}

namespace {
std::atomic<bool> worker_lost{false};
constexpr int kClockApp = 1;
// Request heads; the body is the step. Worker 0 announces to the servers,
// server 0 forwards to the workers (workers have no connections to each
// other).
constexpr int kAnnounce = 1;
constexpr int kForward = 2;
constexpr int kVotesApp = 2;
}  // namespace

StopVotes::StopVotes() : app_(kVotesApp) {
  // Body: "<step> <0|1>". As ClockCheckpoints: server 0 forwards a vote
  // from worker 0 to every worker before it answers it.
  app_.set_request_handle(
      [this](const ps::SimpleData& req, ps::SimpleApp* app) {
        int step = 0, stop = 0;
        if (std::sscanf(req.body.c_str(), "%d %d", &step, &stop) == 2) {
          if (ps::IsWorker()) {
            std::lock_guard<std::mutex> lock(mu_);
            verdicts_[step] = stop != 0;
            cv_.notify_all();
          } else if (req.head == kAnnounce && ps::MyRank() == 0) {
            app->Request(kForward, req.body, ps::kWorkerGroup);
          }
        }
        app->Response(req);
      });
}

void StopVotes::Publish(int steps, bool stop) {
  const std::string body =
      std::to_string(steps) + " " + std::to_string(stop ? 1 : 0);
  app_.Wait(app_.Request(kAnnounce, body, ps::kServerGroup));
}

bool StopVotes::Await(int steps) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return verdicts_.count(steps) > 0; });
  const bool stop = verdicts_[steps];
  verdicts_.erase(verdicts_.begin(), verdicts_.upper_bound(steps));
  return stop;
}

int StepsPerEpoch(const TrainOptions& options, int num_workers) {
  const size_t shard = options.train_size / static_cast<size_t>(num_workers);
  const size_t b = static_cast<size_t>(options.batch_size);
  return static_cast<int>((shard + b - 1) / b);
}

ps::model::LrScheduleConfig ScheduleOf(const TrainOptions& options,
                                       int num_workers) {
  ps::model::LrScheduleConfig c;
  c.kind = options.lr_schedule;
  c.base_lr = options.optimizer.lr;
  if (options.lr_ref_batch > 0) {
    c.base_lr *= static_cast<float>(
        std::sqrt(static_cast<double>(num_workers) * options.batch_size /
                  options.lr_ref_batch));
  }
  c.step_size = options.lr_step;
  c.gamma = options.lr_gamma;
  c.total_steps = std::max<int64_t>(1, static_cast<int64_t>(options.epochs) *
                                           StepsPerEpoch(options, num_workers));
  c.warmup_steps = std::min<int64_t>(
      c.total_steps - 1, std::llround(options.warmup * c.total_steps));
  return c;
}

ClockCheckpoints::ClockCheckpoints(double every_s)
    : every_s_(every_s), app_(kClockApp) {
  app_.set_request_handle(
      [this](const ps::SimpleData& req, ps::SimpleApp* app) {
        const int step = std::atoi(req.body.c_str());
        std::function<void(int)> sink;
        {
          std::lock_guard<std::mutex> lock(mu_);
          steps_.insert(step);
          sink = sink_;
        }
        if (sink) sink(step);
        // Before the answer that lets worker 0 push the step: this server's
        // answers to the workers' pulls of that step come after the forward on
        // the same connections, so each worker records the step before it can
        // finish the step before it. (Not waited on: a handle must not wait;
        // the app keeps one small record per forward.)
        if (req.head == kAnnounce && ps::IsServer() && ps::MyRank() == 0) {
          app->Request(kForward, req.body, ps::kWorkerGroup);
        }
        app->Response(req);
      });
}

void ClockCheckpoints::SetSink(std::function<void(int step)> sink) {
  std::set<int> before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sink_ = sink;
    before = steps_;
  }
  if (sink) {
    for (int step : before) sink(step);
  }
}

void ClockCheckpoints::MaybeAnnounce(int steps) {
  if (std::chrono::duration<double>(Clock::now() - last_).count() < every_s_ ||
      WorkerLost()) {
    return;
  }
  last_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.insert(steps + 1);
  }
  app_.Wait(
      app_.Request(kAnnounce, std::to_string(steps + 1), ps::kServerGroup));
}

bool ClockCheckpoints::Announced(int steps) {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_.count(steps) > 0;
}

void GoOnWithoutDeadWorkers() {
  ps::Node* node = ps::DefaultNode();
  node->SetPeerFailureHandler([node](int id, const ps::Status& why) {
    if (ps::IsWorkerId(id)) {
      worker_lost = true;
      LOG(WARNING) << node->DescribeNode(node->id())
                   << " goes on (--on_worker_failure continue): "
                   << why.message();
      return;
    }
    // As ps's own handler: other threads run, so no static destructors.
    std::fprintf(stderr, "ps: %s stops: %s\n",
                 node->DescribeNode(node->id()).c_str(), why.message().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  });
}

bool WorkerLost() { return worker_lost.load(); }

void FinalizeNode(const TrainOptions& options) {
  if (options.on_worker_failure != ps::WorkerFailure::kContinue) {
    ps::Finalize(0, true);
    return;
  }
  if (!ps::IsWorker()) ps::Barrier(0, ps::kScheduler | ps::kServerGroup);
  ps::Finalize(0, false);
}

ps::DenseLayout ModelLayout(const TrainOptions& options) {
  ps::DenseLayout layout;
  layout.total = ps::model::TotalCount(ps::model::ConvNetTensors());
  layout.chunk = options.chunk;
  return layout;
}

ps::StatusOr<ps::Placement> ModelPlacement(const ps::DenseLayout& layout,
                                           int num_servers,
                                           TrainOptions::PlacementKind kind) {
  std::vector<ps::Key> keys;
  std::vector<uint64_t> bytes;
  const auto& tensors = ps::model::ConvNetTensors();
  size_t tensor = 0;  // of the last group's first float
  for (size_t k = 0; k < layout.num_keys(); ++k) {
    const size_t first = layout.offset(k);
    bool new_group =
        keys.empty() || kind == TrainOptions::PlacementKind::kBytes;
    while (tensor + 1 < tensors.size() && tensors[tensor + 1].offset <= first) {
      ++tensor;
      new_group = true;
    }
    if (new_group) {
      keys.push_back(k);
      bytes.push_back(0);
    }
    bytes.back() += layout.length(k) * sizeof(float);
  }
  if (kind == TrainOptions::PlacementKind::kTensor) {
    // An empty key past the model's: servers that no tensor fills own
    // [num_keys, num_keys) rather than the last tensor's tail.
    keys.push_back(layout.num_keys());
    bytes.push_back(0);
  }
  return ps::Placement::ByBytes(keys, bytes, num_servers);
}

void ServerKeys(const ps::Placement& placement, const ps::DenseLayout& layout,
                int rank, ps::Key* begin, ps::Key* end) {
  ps::Key num_keys = layout.num_keys();
  *begin = std::min<ps::Key>(placement.begin(rank), num_keys);
  *end = std::min<ps::Key>(placement.end(rank), num_keys);
}

std::string DescribeFloats(size_t lo, size_t hi) {
  std::ostringstream os;
  for (const ps::model::TensorView& t : ps::model::ConvNetTensors()) {
    size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.count);
    if (a >= b) continue;
    os << (os.tellp() > 0 ? " " : "") << t.name << "[" << a - t.offset << ":"
       << b - t.offset << ")";
  }
  return os.str();
}

ps::Status MetricsLog::Open(const std::string& path, bool append) {
  if (path.empty()) return ps::Status::OK();
  file_.reset(std::fopen(path.c_str(), append ? "a" : "w"));
  if (!file_) {
    return ps::Status::IOError("cannot write metrics file '" + path + "'");
  }
  return ps::Status::OK();
}

void MetricsLog::Progress(double time, int epoch, int64_t step, double loss,
                          double samples_per_s) {
  if (!file_) return;
  std::fprintf(file_.get(),
               "{\"time\": %.3f, \"epoch\": %d, \"step\": %lld, \"loss\": "
               "%.5f, \"samples_per_s\": %.1f}\n",
               time, epoch, static_cast<long long>(step), loss, samples_per_s);
  std::fflush(file_.get());
}

void MetricsLog::Accuracy(double time, int epoch, int64_t step, double accuracy,
                          double test_loss) {
  if (!file_) return;
  std::fprintf(file_.get(),
               "{\"time\": %.3f, \"epoch\": %d, \"step\": %lld, \"accuracy\": "
               "%.5f, \"test_loss\": %.5f}\n",
               time, epoch, static_cast<long long>(step), accuracy, test_loss);
  std::fflush(file_.get());
}

std::string MetricsPath(const TrainOptions& options, int rank) {
  if (!options.metrics_file.empty() && rank == 0) return options.metrics_file;
  if (!options.metrics_dir.empty()) {
    return options.metrics_dir + "/worker" + std::to_string(rank) + ".jsonl";
  }
  return "";
}

ps::Status DumpFloats(const std::string& path, const float* data, size_t n) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"),
                                          &std::fclose);
  if (!f || std::fwrite(data, sizeof(float), n, f.get()) != n) {
    return ps::Status::IOError("cannot write weights to '" + path + "'");
  }
  return ps::Status::OK();
}

}  // namespace mnist
