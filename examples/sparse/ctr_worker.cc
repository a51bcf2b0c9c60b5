// The worker role of sparse_ctr: trains on its samples, pulling the rows of
// each batch's unique ids (the next batch's pull overlapping this batch's
// compute) and pushing their summed gradients; worker 0 then counts the
// servers' rows and evaluates on the test set.
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "ctr_checkpoint.h"
#include "ctr_end.h"
#include "ctr_job.h"
#include "ctr_model.h"
#include "ps/ps.h"

namespace ctr {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A worker's training samples, one epoch after another.
class Source {
 public:
  Source(const Options& options, int rank, int workers)
      : options_(options),
        rank_(rank),
        workers_(workers),
        generator_(options.generator) {}

  // Rewinds to the epoch's first sample.
  void Rewind() {
    index_ = 0;
    if (options_.data.empty()) return;
    reader_ = std::make_unique<CriteoReader>();
    ps::Status st = reader_->Open(options_.data);
    if (!st.ok()) Die("--data: " + st.message());
  }

  // Up to `n` samples into `out` (cleared); none at the epoch's end.
  void Next(size_t n, Samples* out) {
    out->clear();
    if (options_.data.empty()) {
      for (; out->size() < n && index_ < options_.samples; ++index_) {
        generator_.Draw(1 + static_cast<uint64_t>(rank_), index_, out);
      }
      return;
    }
    // Lines (rank + 1), (rank + 1) + W, ... of the training lines.
    Samples line;
    while (out->size() < n && reader_->line() < options_.data_lines) {
      size_t got = 0;
      line.clear();
      ps::Status st = reader_->Read(1, &line, &got);
      if (!st.ok()) Die("--data: " + st.message());
      if (got == 0) break;
      if ((reader_->line() - 1) % workers_ != static_cast<uint64_t>(rank_)) {
        continue;
      }
      out->ids.insert(out->ids.end(), line.ids.begin(), line.ids.end());
      out->labels.push_back(line.labels[0]);
    }
  }

 private:
  const Options& options_;
  const int rank_, workers_;
  Generator generator_;
  uint64_t index_ = 0;
  std::unique_ptr<CriteoReader> reader_;
};

// One batch on its way: samples, unique ids and their pulled rows.
struct Step {
  Samples samples;
  std::vector<uint64_t> ids;
  ps::SparseBatch batch;
  ps::SArray<float> linear, factors;
  int linear_ts = -1, factors_ts = -1;
};

class Trainer {
 public:
  explicit Trainer(const Options& options)
      : options_(options), kv_(options.tables) {}

  // Draws the next batch and sends its pulls; false at the epoch's end.
  bool Prepare(Source* source, Step* step) {
    source->Next(static_cast<size_t>(options_.batch), &step->samples);
    if (step->samples.size() == 0) return false;
    step->ids.clear();
    BatchIds(step->samples, 0, step->samples.size(), &step->ids);
    step->batch = ps::SparseBatch::Of(step->ids.data(), step->ids.size());
    step->linear = {};
    step->factors = {};
    step->linear_ts = kv_.PullRows(kLinearTable, step->batch, &step->linear);
    if (options_.fm) {
      step->factors_ts =
          kv_.PullRows(kFactorTable, step->batch, &step->factors);
    }
    return true;
  }

  // Waits for the step's rows, computes and pushes its gradients. Returns
  // the batch's summed logloss.
  double Train(Step* step) {
    Check(kv_.Wait(step->linear_ts), "pull");
    if (options_.fm) Check(kv_.Wait(step->factors_ts), "pull");
    const size_t unique = step->batch.size();
    ps::SArray<float> grad_linear(unique), grad_factors;
    if (options_.fm) grad_factors.resize(unique * options_.fm_dim);
    ModelRows rows{step->linear.data(),
                   options_.fm ? step->factors.data() : nullptr,
                   options_.fm ? options_.fm_dim : 0};
    const double loss =
        Gradients(rows, step->batch.slot.data(), step->samples.size(),
                  step->samples.labels.data(), grad_linear.data(),
                  grad_factors.data(), unique);
    // At most two steps' pushes in flight; each keeps its keys and
    // gradients until answered.
    while (pushes_.size() >= 2 * (options_.fm ? 2 : 1)) WaitOnePush();
    pushes_.push_back({kv_.PushRows(kLinearTable, step->batch, grad_linear),
                       step->batch.keys, grad_linear});
    if (options_.fm) {
      pushes_.push_back({kv_.PushRows(kFactorTable, step->batch, grad_factors),
                         step->batch.keys, grad_factors});
    }
    return loss;
  }

  void WaitPushes() {
    while (!pushes_.empty()) WaitOnePush();
  }

  void Sync(int point) { Check(kv_.Sync(point), "sync point"); }

  // Logits of `test` (pulled in chunks).
  std::vector<float> Predict(const Samples& test) {
    constexpr size_t kChunk = 10000;
    std::vector<float> logits(test.size());
    for (size_t begin = 0; begin < test.size(); begin += kChunk) {
      const size_t end = std::min(test.size(), begin + kChunk);
      std::vector<uint64_t> ids;
      BatchIds(test, begin, end, &ids);
      const ps::SparseBatch batch = ps::SparseBatch::Of(ids.data(), ids.size());
      ps::SArray<float> linear, factors;
      Check(kv_.Wait(kv_.PullRows(kLinearTable, batch, &linear)), "pull");
      if (options_.fm) {
        Check(kv_.Wait(kv_.PullRows(kFactorTable, batch, &factors)), "pull");
      }
      ModelRows rows{linear.data(), options_.fm ? factors.data() : nullptr,
                     options_.fm ? options_.fm_dim : 0};
      Logits(rows, batch.slot.data(), end - begin, logits.data() + begin);
    }
    return logits;
  }

 private:
  struct Push {
    int ts;
    ps::SArray<ps::Key> keys;
    ps::SArray<float> grads;
  };

  void WaitOnePush() {
    Check(kv_.Wait(pushes_.front().ts), "push");
    pushes_.pop_front();
  }

  static void Check(const ps::Status& st, const char* what) {
    if (!st.ok()) {
      Die("worker " + std::to_string(ps::MyRank()) + ": " + what +
          " failed: " + st.ToString());
    }
  }

  const Options& options_;
  ps::SparseWorker kv_;
  std::deque<Push> pushes_;
};

// The test set: generated (stream 0) or read.
Samples TestSet(const Options& options) {
  Samples test;
  if (options.data.empty()) {
    Generator generator(options.generator);
    for (uint64_t i = 0; i < options.test_samples; ++i) {
      generator.Draw(0, i, &test);
    }
    return test;
  }
  CriteoReader reader;
  const std::string& path =
      options.test_data.empty() ? options.data : options.test_data;
  ps::Status st = reader.Open(path);
  Samples skipped;
  size_t got = 0;
  // --data alone: its lines after the training ones.
  while (st.ok() && options.test_data.empty() &&
         reader.line() < options.data_lines) {
    skipped.clear();
    st = reader.Read(
        std::min<uint64_t>(10000, options.data_lines - reader.line()), &skipped,
        &got);
    if (got == 0) break;
  }
  if (st.ok()) st = reader.Read(options.test_lines, &test, &got);
  if (!st.ok()) Die("test set: " + st.message());
  return test;
}

// The rows the servers hold (table 0), summed over their answers to
// kStatsApp: each live server's own rows, and for a server that cannot
// answer (dead, its rows taken over: its request counts as answered) its
// replica's copy.
uint64_t ServerRows() {
  ps::SimpleApp app(kStatsApp);
  std::mutex mu;
  std::map<int, std::pair<uint64_t, uint64_t>> answers;  // rank: own, replica
  app.set_response_handle([&](const ps::SimpleData& r, ps::SimpleApp*) {
    std::istringstream in(r.body);
    uint64_t own = 0, replica = 0;
    in >> own >> replica;
    std::lock_guard<std::mutex> lock(mu);
    answers[ps::IdToRank(r.sender)] = {own, replica};
  });
  app.Wait(app.Request(0, "", ps::kServerGroup));
  const int servers = ps::NumServers();
  std::lock_guard<std::mutex> lock(mu);
  uint64_t rows = 0;
  for (int r = 0; r < servers; ++r) {
    auto it = answers.find(r);
    if (it != answers.end()) {
      rows += it->second.first;
      continue;
    }
    auto heir = answers.find(ps::ReplicaOf(r, servers));
    if (heir == answers.end() || heir->first == r) {
      LOG(WARNING) << "no count of server " << r << "'s rows";
      continue;
    }
    rows += heir->second.second;
  }
  return rows;
}

}  // namespace

int RunWorker(const Options& options) {
  const int rank = ps::MyRank(), workers = ps::NumWorkers();
  Trainer trainer(options);
  EndWord end;
  Source source(options, rank, workers);
  Step steps[2];
  const auto start = Clock::now();
  auto last_log = start;
  // This run's samples (the rate), and all since the job began.
  uint64_t samples = 0, interval_samples = 0;
  uint64_t job_samples = 0;
  if (options.restore_epoch >= 0) {
    job_samples = LoadWorker(options);
    // The servers loaded their rows (ctr_server.cc).
    ps::Barrier(0, ps::kServerGroup | ps::kWorkerGroup);
  }
  double interval_loss = 0;
  const int first_epoch = std::max(options.restore_epoch, 0) + 1;
  for (int epoch = first_epoch; epoch <= options.epochs; ++epoch) {
    source.Rewind();
    Step* cur = &steps[0];
    Step* next = &steps[1];
    bool have = trainer.Prepare(&source, cur);
    while (have) {
      have = trainer.Prepare(&source, next);
      interval_loss += trainer.Train(cur);
      samples += cur->samples.size();
      job_samples += cur->samples.size();
      interval_samples += cur->samples.size();
      std::swap(cur, next);
      if (Seconds(last_log) >= options.log_every_s) {
        std::printf(
            "epoch %d: %llu samples, %.0f samples/s, train logloss "
            "%.4f\n",
            epoch, static_cast<unsigned long long>(job_samples),
            interval_samples / Seconds(last_log),
            interval_loss / std::max<uint64_t>(1, interval_samples));
        std::fflush(stdout);
        last_log = Clock::now();
        interval_samples = 0;
        interval_loss = 0;
      }
    }
    trainer.WaitPushes();
    trainer.Sync(epoch);
    WriteWorker(options, epoch, job_samples);
  }
  const double train_s = Seconds(start);
  std::printf("worker %d done: %llu samples in %.1f s\n", rank,
              static_cast<unsigned long long>(samples), train_s);
  std::fflush(stdout);
  if (rank == 0) {
    const uint64_t keys = ServerRows();
    const Samples test = TestSet(options);
    double clicks = 0;
    for (float y : test.labels) clicks += y;
    std::printf("test set: %zu samples, %.1f%% clicks\n", test.size(),
                100 * clicks / std::max<size_t>(1, test.size()));
    const std::vector<float> logits = trainer.Predict(test);
    double loss = 0, best_loss = 0;
    for (size_t i = 0; i < test.size(); ++i) {
      loss += LogLoss(logits[i], test.labels[i]);
      if (!test.logit.empty())
        best_loss += LogLoss(test.logit[i], test.labels[i]);
    }
    const double n = std::max<double>(1, test.size());
    char ceiling[64] = "unknown: real data";
    if (!test.logit.empty()) {
      std::snprintf(ceiling, sizeof(ceiling), "%.4f",
                    Auc(test.logit, test.labels));
    }
    const double auc = Auc(logits, test.labels);
    if (std::isnan(auc)) {
      const size_t bad = static_cast<size_t>(
          std::count_if(logits.begin(), logits.end(),
                        [](float z) { return !std::isfinite(z); }));
      Die("worker 0: " + std::to_string(bad) + " of " +
          std::to_string(logits.size()) +
          " test logits are not finite: the model diverged (lower --lr)");
    }
    // Every worker trains as many samples (generated), or about (--data).
    const uint64_t total = samples * static_cast<uint64_t>(workers);
    std::printf("final: test AUC %.4f (ceiling %s) logloss %.4f", auc, ceiling,
                loss / n);
    if (!test.logit.empty()) std::printf(" (ceiling %.4f)", best_loss / n);
    std::printf(", %llu samples in %.1f s (%.0f samples/s), keys %llu\n",
                static_cast<unsigned long long>(total), train_s,
                total / train_s, static_cast<unsigned long long>(keys));
    std::fflush(stdout);
  }
  if (rank == 0) {
    end.Announce();
  } else if (!end.Wait(options.server_wait_s)) {
    Die("worker " + std::to_string(rank) +
        ": worker 0 did not report the job's end within --server_wait_s " +
        std::to_string(options.server_wait_s));
  }
  ps::Finalize(0, true);
  return 0;
}

}  // namespace ctr
