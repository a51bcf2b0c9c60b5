// The training loop (trainer.h): a Trainer holds one run's state and walks
// it step by step, in this order:
//   Run -> for each epoch: RunEpoch -> for each batch: Step (forward and
//   backward, the Exchange) -> AfterStep (position, checkpoint) ->
//   LogProgress (every --log_every_s) -> EvaluateWithinEpoch (at
//   --eval_every's points, with a target) ... -> Evaluate (after the
//   epoch) ... -> ReportTarget.
#include "trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "worker_checkpoint.h"

namespace mnist {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Worker 0's evaluation: of the weights, or of their exponential moving
// average (--ema_decay), updated after every step from the pulled weights.
class Evaluator {
 public:
  Evaluator(const TrainOptions& options, ps::model::Net* net,
            const ps::model::Dataset& test)
      : net_(net), test_(test), decay_(options.ema_decay) {
    if (decay_ > 0 && test.size > 0) {
      ema_.assign(net->params(), net->params() + net->num_params());
    }
  }
  void AfterStep() {
    if (ema_.empty()) return;
    // Early on the average would be mostly the initial weights: the decay
    // grows as (1 + t) / (10 + t) up to decay_ (TensorFlow's
    // ExponentialMovingAverage with num_updates).
    ++steps_;
    const float d =
        static_cast<float>(std::min(decay_, (1.0 + steps_) / (10.0 + steps_)));
    const float* w = net_->params();
    float* __restrict e = ema_.data();
    for (size_t i = 0; i < ema_.size(); ++i) e[i] += (w[i] - e[i]) * (1 - d);
  }
  // Evaluates without dropout and restores the training mode and weights.
  ps::model::EvalResult Evaluate(bool training) {
    std::vector<float> live;
    if (!ema_.empty()) {
      live.assign(net_->params(), net_->params() + net_->num_params());
      std::copy(ema_.begin(), ema_.end(), net_->params());
    }
    ps::model::EvalResult r = ps::model::Evaluate(net_, test_);
    if (!live.empty()) std::copy(live.begin(), live.end(), net_->params());
    net_->set_training(training);
    return r;
  }

 private:
  ps::model::Net* net_;
  const ps::model::Dataset& test_;
  const double decay_;
  int64_t steps_ = 0;
  std::vector<float> ema_;
};

int LrPeriod(const TrainOptions& options, int epoch, int step) {
  int period =
      options.lr_every_steps > 0 ? step / options.lr_every_steps : epoch;
  return std::min(period, ps::kMaxDenseTag);
}

// "1h02m", "3m05s", "42s": a time left, to the second.
std::string Duration(double seconds) {
  const long s = seconds > 0 ? std::lround(seconds) : 0;
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%ldh%02ldm", s / 3600, s / 60 % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lds", s);
  }
  return text;
}

// The metrics file of `rank` (appended to by a restored run); dies naming
// it.
MetricsLog OpenMetrics(const TrainOptions& options, int rank, bool append) {
  MetricsLog metrics;
  ps::Status st = metrics.Open(MetricsPath(options, rank), append);
  if (!st.ok()) Die(st.ToString());
  return metrics;
}

// `net` set up for training: dropout (its generator seeded by rank, unless
// restored) and label smoothing.
ps::model::Net* PrepareNet(const TrainOptions& options, int rank, bool restored,
                           ps::model::Net* net) {
  net->set_training(options.dropout);
  net->set_label_smoothing(options.label_smoothing);
  if (!restored) net->SeedDropout(options.seed * 1000003ull + rank);
  return net;
}

// One Train: its arguments, as Train's, and the state its steps share.
class Trainer {
 public:
  Trainer(const TrainOptions& options, const char* who, int rank,
          int num_workers, ps::model::Net* net, Exchange* exchange,
          const ps::model::Dataset& train, const ps::model::Dataset& test,
          ps::Node* node, const Position* from)
      : options_(options),
        who_(who),
        rank_(rank),
        num_workers_(num_workers),
        metrics_(OpenMetrics(options, rank, from != nullptr)),
        net_(PrepareNet(options, rank, from != nullptr, net)),
        exchange_(exchange),
        test_(test),
        node_(node),
        batcher_(&train, options.batch_size, options.seed, rank, num_workers),
        evaluator_(options, net, test),
        eval_interval_(std::max(
            1.0,
            options.eval_every * std::max(batcher_.batches_per_epoch(), 1))),
        slow_(options.slow_worker_ms > 0 && rank == num_workers - 1),
        die_(options.die_after_steps > 0 && !options.die_at_push &&
             options.die_node == "worker:" + std::to_string(rank)),
        planned_(
            static_cast<double>(ScheduleOf(options, num_workers).total_steps)),
        at_(from == nullptr ? Position() : *from) {
    batcher_.set_max_shift(options.max_shift);
    sum_.steps = at_.steps;
  }

  Summary Run();

 private:
  // What the progress lines (--log_every_s) count since the last one.
  struct Interval {
    Clock::time_point last_log = Clock::now();
    Clock::time_point step_start = Clock::now();  // of the running step
    int steps = 0;
    double loss_sum = 0;
    size_t samples = 0;
  };

  // One epoch from where at_ stands in it; true: stop training.
  bool RunEpoch(int epoch);
  // One step on batch_: ForwardBackward and the exchange of its gradients
  // for weights, the next batch read meanwhile into next_, then swapped in.
  // Returns whether the epoch has that next batch.
  bool Step(int epoch, Interval* interval);
  // After a step: the position, the checkpoint, the test hook that kills
  // this worker (--die_after_steps).
  void AfterStep();
  // Prints the progress line and sets the training metrics; starts a new
  // interval.
  void LogProgress(int epoch, Interval* interval);
  // --target_accuracy: every worker stops to hear worker 0's verdict every
  // --eval_every epochs: at the batches of an epoch where floor(batches /
  // eval_interval_) grows, and at its end.
  bool IsEvalPoint(int batches) const {
    return std::floor(batches / eval_interval_) !=
           std::floor((batches - 1) / eval_interval_);
  }
  // An evaluation at such a point within an epoch, its time left out of the
  // interval's rates and step time; true: stop.
  bool EvaluateWithinEpoch(int epoch, Interval* interval);
  // Evaluates at a step boundary (`steps` done; worker 0 only) and, with a
  // target, hears the verdict; true: stop.
  bool Evaluate(int epoch, int steps, bool epoch_end);
  void PrintEvaluation(int epoch, int steps, bool epoch_end) const;
  // Worker 0's line on --target_accuracy, reached or not.
  void ReportTarget() const;

  const TrainOptions& options_;
  const char* const who_;
  const int rank_, num_workers_;
  MetricsLog metrics_;
  ps::model::Net* const net_;
  Exchange* const exchange_;
  const ps::model::Dataset& test_;
  ps::Node* const node_;
  ps::model::Batcher batcher_;
  Evaluator evaluator_;
  const bool target_ = options_.target_accuracy > 0;
  const double eval_interval_;
  const bool slow_;
  bool die_;
  const double planned_;  // steps of the whole run (label smoothing decay)
  Clock::time_point start_;
  double eval_s_ = 0;  // in evaluations (and waits for them)
  ps::model::Batch batch_, next_;
  Summary sum_;
  Position at_;
};

Summary Trainer::Run() {
  start_ = Clock::now();
  bool stop = false;
  for (int epoch = at_.epoch; epoch < options_.epochs && !stop; ++epoch) {
    if (RunEpoch(epoch)) break;
    if (test_.size == 0 && !target_) continue;
    stop = Evaluate(epoch, sum_.steps, true);
  }
  if (rank_ == 0 && test_.size > 0 && target_) ReportTarget();
  sum_.wall_s = Seconds(start_);
  return sum_;
}

bool Trainer::RunEpoch(int epoch) {
  batcher_.StartEpoch(epoch);
  if (epoch == at_.epoch) {
    batcher_.Skip(at_.batches_in_epoch);
  } else {
    at_.batches_in_epoch = 0;
  }
  at_.epoch = epoch;
  const auto epoch_start = Clock::now();
  const double eval_s_before = eval_s_;
  Interval interval;
  bool stop = false;
  bool have = batcher_.Next(&batch_);
  while (have && !stop) {
    have = Step(epoch, &interval);
    AfterStep();
    if (Seconds(interval.last_log) >= options_.log_every_s || !have) {
      LogProgress(epoch, &interval);
    }
    stop = target_ && have && IsEvalPoint(at_.batches_in_epoch) &&
           EvaluateWithinEpoch(epoch, &interval);
  }
  sum_.train_s += Seconds(epoch_start) - (eval_s_ - eval_s_before);
  return stop;
}

bool Trainer::Step(int epoch, Interval* interval) {
  if (options_.clock != nullptr && rank_ == 0) {
    options_.clock->MaybeAnnounce(sum_.steps);
  }
  const int lr_period = LrPeriod(options_, epoch, sum_.steps);
  if (options_.label_smoothing_decay) {
    const double left = 1.0 - static_cast<double>(sum_.steps) / planned_;
    net_->set_label_smoothing(
        static_cast<float>(options_.label_smoothing * std::max(0.0, left)));
  }
  interval->loss_sum += net_->ForwardBackward(
      batch_.images.data(), batch_.labels.data(), batch_.size,
      [&](size_t first_float) {
        exchange_->StartEarly(sum_.steps, lr_period, first_float);
      });
  exchange_->Start(sum_.steps, lr_period);
  const bool have = batcher_.Next(&next_);  // overlaps the round trip
  if (slow_) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(options_.slow_worker_ms));
  }
  ps::Status st = exchange_->Finish();
  if (!st.ok())
    Die("step " + std::to_string(sum_.steps) + ": " + st.ToString());
  ++sum_.steps;
  if (rank_ == 0) evaluator_.AfterStep();
  ++interval->steps;
  if (node_ != nullptr) {
    node_->SetMetric("ps_train_step", sum_.steps);
    node_->SetMetric("ps_step_seconds", Seconds(interval->step_start));
  }
  interval->step_start = Clock::now();
  interval->samples += batch_.size;
  sum_.samples += batch_.size;
  std::swap(batch_, next_);
  return have;
}

void Trainer::AfterStep() {
  at_.steps = sum_.steps;
  ++at_.batches_in_epoch;
  MaybeCheckpoint(options_, rank_, at_, *net_);
  if (die_ && sum_.steps == options_.die_after_steps) {
    std::fprintf(stderr, "worker %d: %s itself after %d steps (test)\n", rank_,
                 options_.die_freezes ? "freezing" : "killing", sum_.steps);
    std::fflush(stderr);
    std::raise(options_.die_freezes ? SIGSTOP : SIGKILL);
    die_ = false;  // let go (SIGCONT): it trains on
  }
}

void Trainer::LogProgress(int epoch, Interval* interval) {
  const double elapsed = Seconds(interval->last_log);
  const double rate = interval->samples / elapsed;
  const double loss = interval->loss_sum / interval->steps;
  // Where the run stands in epochs, and the time left at this interval's
  // pace.
  const int per_epoch = std::max(batcher_.batches_per_epoch(), 1);
  const double epochs_done =
      epoch + static_cast<double>(at_.batches_in_epoch) / per_epoch;
  const double steps_left =
      static_cast<double>(options_.epochs - epoch) * per_epoch -
      at_.batches_in_epoch;
  const double eta = steps_left * elapsed / interval->steps;
  std::printf(
      "%s %d epoch %d step %d  (%.2f of %d epochs)  loss %.4f  "
      "%.0f samples/s  ETA %s\n",
      who_, rank_, epoch, sum_.steps, epochs_done, options_.epochs, loss, rate,
      Duration(eta).c_str());
  std::fflush(stdout);
  if (node_ != nullptr) {
    node_->SetMetric("ps_train_epochs", epochs_done);
    node_->SetMetric("ps_train_loss", loss);
    node_->SetMetric("ps_samples_per_second", rate);
    node_->SetMetric("ps_train_eta_seconds", eta);
  }
  metrics_.Progress(Seconds(start_), epoch, sum_.steps, loss, rate);
  interval->last_log = Clock::now();
  interval->loss_sum = 0;
  interval->samples = 0;
  interval->steps = 0;
}

bool Trainer::EvaluateWithinEpoch(int epoch, Interval* interval) {
  const double eval_s_was = eval_s_;
  if (Evaluate(epoch, sum_.steps, false)) return true;
  // The progress lines' rates and the step time leave it out too.
  const auto spent = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(eval_s_ - eval_s_was));
  interval->last_log += spent;
  interval->step_start += spent;
  return false;
}

bool Trainer::Evaluate(int epoch, int steps, bool epoch_end) {
  const auto eval_start = Clock::now();
  if (test_.size > 0) {
    sum_.eval = evaluator_.Evaluate(options_.dropout);
    PrintEvaluation(epoch, steps, epoch_end);
    metrics_.Accuracy(Seconds(start_), epoch, steps, sum_.eval.accuracy,
                      sum_.eval.loss);
    sum_.reached =
        target_ && 100.0 * sum_.eval.accuracy >= options_.target_accuracy;
  }
  bool stop = sum_.reached;
  if (target_ && options_.votes != nullptr) {
    if (rank_ == 0) options_.votes->Publish(steps, stop);
    stop = options_.votes->Await(steps);
  }
  eval_s_ += Seconds(eval_start);
  return stop;
}

void Trainer::PrintEvaluation(int epoch, int steps, bool epoch_end) const {
  if (epoch_end) {
    std::printf(
        "%s %d epoch %d done: test accuracy %.2f%%  test loss %.4f  "
        "(%zu images)\n",
        who_, rank_, epoch, 100.0 * sum_.eval.accuracy, sum_.eval.loss,
        sum_.eval.count);
  } else {
    const double epochs_done =
        static_cast<double>(steps) / batcher_.batches_per_epoch();
    std::printf(
        "%s %d step %d (%.2f epochs): test accuracy %.2f%%  test loss "
        "%.4f\n",
        who_, rank_, steps, epochs_done, 100.0 * sum_.eval.accuracy,
        sum_.eval.loss);
  }
  std::fflush(stdout);
}

void Trainer::ReportTarget() const {
  const double epochs_done =
      static_cast<double>(sum_.steps) / batcher_.batches_per_epoch();
  const size_t samples = sum_.samples * static_cast<size_t>(num_workers_);
  if (sum_.reached) {
    std::printf(
        "reached %g%% after %zu samples (%.2f epochs) in %.1f s of "
        "training\n",
        options_.target_accuracy, samples, epochs_done, sum_.train_s);
  } else {
    std::printf(
        "not reached: %g%% wanted, %.2f%% after %zu samples (%.2f "
        "epochs) in %.1f s of training\n",
        options_.target_accuracy, 100.0 * sum_.eval.accuracy, samples,
        epochs_done, sum_.train_s);
  }
  std::fflush(stdout);
}

}  // namespace

Summary Train(const TrainOptions& options, const char* who, int rank,
              int num_workers, ps::model::Net* net, Exchange* exchange,
              const ps::model::Dataset& train, const ps::model::Dataset& test,
              ps::Node* node, const Position* from) {
  Trainer trainer(options, who, rank, num_workers, net, exchange, train, test,
                  node, from);
  return trainer.Run();
}

}  // namespace mnist
