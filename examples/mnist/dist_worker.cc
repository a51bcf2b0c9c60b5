// The worker role of mnist_dist, and the same loop in a single process: a
// Trainer runs epochs of ForwardBackward on its shard of the training set
// and hands each step's gradients to an Exchange, which either pushes them
// to the servers and pulls fresh weights (KVWorker, no copies) or applies
// the optimizer locally.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist_common.h"
#include "model/net.h"
#include "ps/ps.h"

namespace mnist {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// One step's communication: StartEarly from within ForwardBackward once
// grads()[first_float..] are final (model::GradsReady), Start after all of
// grads() are ready, Finish before the next ForwardBackward reads params().
// Between Start and Finish the trainer prepares the next batch, overlapping
// it with the network round trip.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // lr_period: the StepLR period of this step (the epoch, or step /
  // --lr_every_steps); it travels to the servers as the cmd tag.
  virtual void StartEarly(int /*step*/, int /*lr_period*/,
                          size_t /*first_float*/) {}
  virtual void Start(int step, int lr_period) = 0;
  virtual ps::Status Finish() = 0;
};

class LocalExchange : public Exchange {
 public:
  LocalExchange(const TrainOptions& options, ps::model::Net* net)
      : net_(net),
        optimizer_(
            ps::model::MakeOptimizer(options.optimizer, net->num_params())
                .value()),
        schedule_(ScheduleOf(options, 1)) {}
  void Start(int step, int lr_period) override {
    optimizer_->set_lr(schedule_.LrAt(step, lr_period));
    optimizer_->Step(net_->params(), net_->grads(), net_->num_params());
  }
  ps::Status Finish() override { return ps::Status::OK(); }

 private:
  ps::model::Net* net_;
  std::unique_ptr<ps::model::Optimizer> optimizer_;
  ps::model::LrSchedule schedule_;
};

// Pushes grads() and pulls into params() through SArrays that wrap the
// Net's buffers (no-op deleters: the Net owns them and outlives this); they
// are shared memory, so a server on this host reads and writes them in place.
// The keys are cut in two parts: the early ones (chunks wholly at or after
// the fc1.weight offset, 98% of the bytes) go out from within the backward
// pass (StartEarly) while the conv layers' backward still runs, when
// `overlap`; the late ones (the conv tensors and the chunk straddling the
// boundary) after it. Each part is cut further at server boundaries, so that
// every pull has one server and a known place for its answer (which a
// co-located server writes there directly).
class PsExchange : public Exchange {
 public:
  PsExchange(const TrainOptions& options, ps::model::Net* net, bool overlap)
      : kv_(0, 0), layout_(ModelLayout(options)), overlap_(overlap) {
    auto placement =
        ModelPlacement(layout_, ps::NumServers(), options.placement);
    if (!placement.ok()) Die(placement.status().ToString());
    kv_.SetPlacement(*placement);
    if (options.compressor != nullptr) {
      ps::Status st = kv_.AddFilter(options.compressor);
      if (!st.ok()) Die("--compress: " + st.ToString());
    }
    for (size_t k = 0; k < layout_.num_keys(); ++k) {
      keys_.push_back(k);
      lens_.push_back(static_cast<int>(layout_.length(k)));
    }
    for (int s = 0; s < ps::NumServers(); ++s) {
      ps::Key begin, end;
      ServerKeys(*placement, layout_, s, &begin, &end);
      if (begin < end) {
        first_keys_.push_back(begin);
        server_ends_.push_back(end);
      }
    }
    auto keep = [](float*) {};
    params_ = ps::SArray<float>(net->params(), net->num_params(), keep);
    grads_ = ps::SArray<float>(net->grads(), net->num_params(), keep);
    const size_t boundary = net->tensors()[ps::model::kFc1Weight].offset;
    const size_t first_early = std::min(
        (boundary + layout_.chunk - 1) / layout_.chunk, layout_.num_keys());
    early_ = MakeRanges(first_early, layout_.num_keys());
    late_ = MakeRanges(0, first_early);
  }

  // Weights for the first step (0, or the restored one): the servers'
  // (at step 0 equal to our own initialisation).
  ps::Status PullInitial(int step) {
    return kv_.Wait(kv_.ZPull(keys_, &params_, nullptr,
                              ps::EncodeDenseCmd(ps::DenseOp::kStep, step)));
  }
  void StartEarly(int step, int lr_period, size_t first_float) override {
    // The early keys' grads are final and their params free to overwrite.
    if (!early_.empty()) CHECK_LE(first_float, early_[0].first_float);
    if (overlap_) Send(&early_, step, lr_period);
  }
  void Start(int step, int lr_period) override {
    Send(&early_, step, lr_period);  // the pieces not sent yet
    Send(&late_, step, lr_period);
  }
  ps::Status Finish() override {
    ps::Status st = Wait(&early_);
    ps::Status late = Wait(&late_);
    return st.ok() ? late : st;
  }
  // A restarted worker (ps::Node::rejoined): the step the servers expect
  // from it next, the least of every server's answer (DenseOp::kJoin).
  ps::StatusOr<int> Rejoin() {
    std::vector<float> steps;
    std::vector<int> lens;
    ps::Status st = kv_.Wait(kv_.Pull(
        first_keys_, &steps, &lens, ps::EncodeDenseCmd(ps::DenseOp::kJoin, 0)));
    if (!st.ok()) return st;
    if (steps.size() != first_keys_.size() || steps.empty()) {
      return ps::Status::Corruption(
          "join: " + std::to_string(steps.size()) + " answers from " +
          std::to_string(first_keys_.size()) + " servers");
    }
    return static_cast<int>(*std::min_element(steps.begin(), steps.end()));
  }
  // Tells every server this worker pushed `steps` steps and is finished.
  ps::Status Done(int steps) {
    std::vector<float> zeros(first_keys_.size(), 0.0f);
    std::vector<int> ones(first_keys_.size(), 1);
    return kv_.Wait(kv_.Push(first_keys_, zeros, ones,
                             ps::EncodeDenseCmd(ps::DenseOp::kDone, steps)));
  }

 private:
  // Keys [begin, end) and the segments of grads_/params_ they hold; every
  // worker pushes the same ranges each step, as the DenseShard requires.
  struct KeyRange {
    ps::SArray<ps::Key> keys;
    ps::SArray<int> lens;
    ps::SArray<float> grads, params;
    size_t first_float = 0;
    bool sent = false;
    int push_ts = 0, pull_ts = 0;
  };

  // Keys [begin, end) cut at the servers' boundaries (non-empty pieces).
  std::vector<KeyRange> MakeRanges(size_t begin, size_t end) const {
    std::vector<KeyRange> ranges;
    size_t server_begin = 0;
    for (ps::Key server_end : server_ends_) {
      const size_t b = std::max(begin, server_begin);
      const size_t e = std::min<size_t>(end, server_end);
      server_begin = server_end;
      if (b >= e) continue;
      KeyRange r;
      r.first_float = layout_.offset(b);
      const size_t end_float = layout_.offset(e - 1) + layout_.length(e - 1);
      r.keys = keys_.segment(b, e);
      r.lens = lens_.segment(b, e);
      r.grads = grads_.segment(r.first_float, end_float);
      r.params = params_.segment(r.first_float, end_float);
      ranges.push_back(r);
    }
    return ranges;
  }
  void Send(std::vector<KeyRange>* ranges, int step, int lr_period) {
    for (KeyRange& r : *ranges) {
      if (r.sent) continue;
      r.push_ts =
          kv_.ZPush(r.keys, r.grads, r.lens,
                    ps::EncodeDenseCmd(ps::DenseOp::kStep, step, lr_period));
      r.pull_ts = kv_.ZPull(
          r.keys, &r.params, nullptr,
          ps::EncodeDenseCmd(ps::DenseOp::kStep, step + 1, lr_period));
      r.sent = true;
    }
  }
  ps::Status Wait(std::vector<KeyRange>* ranges) {
    ps::Status first;
    for (KeyRange& r : *ranges) {
      if (!r.sent) continue;
      r.sent = false;
      ps::Status push = kv_.Wait(r.push_ts);
      ps::Status pull = kv_.Wait(r.pull_ts);
      if (first.ok()) first = push.ok() ? pull : push;
    }
    return first;
  }

  ps::KVWorker<float> kv_;
  ps::DenseLayout layout_;
  const bool overlap_;
  ps::SArray<ps::Key> keys_;
  ps::SArray<int> lens_;
  std::vector<ps::Key> first_keys_;
  std::vector<ps::Key> server_ends_;  // each server's end key, ascending
  ps::SArray<float> params_, grads_;
  std::vector<KeyRange> early_, late_;
};

// Where a worker is: steps done in all, and within its epoch (a
// checkpoint's position; the batcher's order follows from the epoch).
struct Position {
  int steps = 0;
  int epoch = 0;
  int batches_in_epoch = 0;
};

struct Summary {
  ps::model::EvalResult eval;
  int steps = 0;
  double wall_s = 0, train_s = 0;  // train_s: without evaluations
  size_t samples = 0;
  bool reached = false;  // --target_accuracy reached (then training stopped)
};

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

// A worker's checkpoint payload: its position, dropout generator and what
// its compression's error feedback holds (empty without).
std::string WorkerPayload(const TrainOptions& options, const Position& at,
                          const ps::model::Net& net) {
  Packer out;
  out.Put<int32_t>(at.epoch);
  out.Put<int32_t>(at.batches_in_epoch);
  out.PutString(net.DropoutState());
  out.PutString(options.compressor ? options.compressor->SaveState() : "");
  return out.data();
}

// The position and dropout generator of the checkpoint of `step`, or dies
// naming the file.
Position LoadWorker(const TrainOptions& options, int rank, int step,
                    ps::model::Net* net) {
  const CheckpointJob job = CheckpointJobOf(options);
  auto payload = ReadCheckpoint(job, step, CheckpointRole::kWorker, rank);
  if (!payload.ok()) Die("--restore: " + payload.status().message());
  Unpacker in(*payload);
  Position at;
  at.steps = step;
  std::string dropout, feedback;
  if (!in.Get(&at.epoch) || !in.Get(&at.batches_in_epoch) ||
      !in.GetString(&dropout) ||
      // The compression state (files written before it had none).
      (!in.done() && !in.GetString(&feedback)) || !in.done() || at.epoch < 0 ||
      at.batches_in_epoch < 0 || !net->SetDropoutState(dropout)) {
    Die("--restore: '" +
        CheckpointPath(job, step, CheckpointRole::kWorker, rank) +
        "': not a worker position (epoch, batch, dropout state, "
        "compression state)");
  }
  if (options.compressor != nullptr) {
    ps::Status st = options.compressor->RestoreState(feedback);
    if (!st.ok()) {
      Die("--restore: '" +
          CheckpointPath(job, step, CheckpointRole::kWorker, rank) +
          "': " + st.message());
    }
  }
  RemoveCheckpointsAfter(job, step, CheckpointRole::kWorker, rank);
  return at;
}

// Writes this worker's checkpoint every --checkpoint_every_steps steps and
// at the steps worker 0 announced (--checkpoint_every_s), until a worker was
// lost (its files would never complete a step again).
void MaybeCheckpoint(const TrainOptions& options, int rank, const Position& at,
                     const ps::model::Net& net) {
  const int every = options.checkpoint_every_steps;
  const bool due =
      (every > 0 && at.steps % every == 0) ||
      (options.clock != nullptr && options.clock->Announced(at.steps));
  if (options.checkpoint_dir.empty() || !due || WorkerLost()) return;
  ps::Status st = WriteCheckpoint(
      CheckpointJobOf(options), CheckpointRole::kWorker, rank, at.steps,
      WorkerPayload(options, at, net), ps::DefaultNode());
  if (!st.ok()) {  // as a server's (dist_server.cc): the job goes on
    LOG(ERROR) << "worker " << rank << ": checkpoint of step " << at.steps
               << " not written: " << st.message()
               << "; training goes on (--restore resumes from the last "
                  "complete checkpoint)";
  }
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

// Runs every epoch from `from` (restored: the dropout generator too);
// evaluates after each when `test` is not empty. `node`: where the step,
// loss and samples/s go as metrics (PS_METRICS_PORT); null: nowhere.
Summary Train(const TrainOptions& options, const char* who, int rank,
              int num_workers, ps::model::Net* net, Exchange* exchange,
              const ps::model::Dataset& train, const ps::model::Dataset& test,
              ps::Node* node, const Position* from = nullptr) {
  MetricsLog metrics;
  ps::Status st = metrics.Open(MetricsPath(options, rank), from != nullptr);
  if (!st.ok()) Die(st.ToString());
  net->set_training(options.dropout);
  net->set_label_smoothing(options.label_smoothing);
  if (from == nullptr) net->SeedDropout(options.seed * 1000003ull + rank);
  ps::model::Batcher batcher(&train, options.batch_size, options.seed, rank,
                             num_workers);
  batcher.set_max_shift(options.max_shift);
  Evaluator evaluator(options, net, test);
  // --target_accuracy: every worker stops to hear worker 0's verdict every
  // --eval_every epochs: at the batches of an epoch where floor(batches /
  // eval_interval) grows, and at its end.
  const bool target = options.target_accuracy > 0;
  const double eval_interval = std::max(
      1.0, options.eval_every * std::max(batcher.batches_per_epoch(), 1));
  auto eval_point = [eval_interval](int batches) {
    return std::floor(batches / eval_interval) !=
           std::floor((batches - 1) / eval_interval);
  };
  double eval_s = 0;  // in evaluations (and waits for them)
  ps::model::Batch batch, next;
  Summary sum;
  Position at = from == nullptr ? Position() : *from;
  sum.steps = at.steps;
  const auto start = Clock::now();
  const bool slow = options.slow_worker_ms > 0 && rank == num_workers - 1;
  const bool die = options.die_after_steps > 0 &&
                   options.die_node == "worker:" + std::to_string(rank);
  // Evaluates at a step boundary (`steps` done; worker 0 only) and, with a
  // target, hears the verdict; true: stop.
  auto evaluate = [&](int epoch, int steps, bool epoch_end) {
    const auto eval_start = Clock::now();
    if (test.size > 0) {
      sum.eval = evaluator.Evaluate(options.dropout);
      const double epochs_done =
          static_cast<double>(steps) / batcher.batches_per_epoch();
      if (epoch_end) {
        std::printf(
            "%s %d epoch %d done: test accuracy %.2f%%  test loss %.4f  "
            "(%zu images)\n",
            who, rank, epoch, 100.0 * sum.eval.accuracy, sum.eval.loss,
            sum.eval.count);
      } else {
        std::printf(
            "%s %d step %d (%.2f epochs): test accuracy %.2f%%  test loss "
            "%.4f\n",
            who, rank, steps, epochs_done, 100.0 * sum.eval.accuracy,
            sum.eval.loss);
      }
      std::fflush(stdout);
      metrics.Accuracy(Seconds(start), epoch, steps, sum.eval.accuracy,
                       sum.eval.loss);
      sum.reached =
          target && 100.0 * sum.eval.accuracy >= options.target_accuracy;
    }
    bool stop = sum.reached;
    if (target && options.votes != nullptr) {
      if (rank == 0) options.votes->Publish(steps, stop);
      stop = options.votes->Await(steps);
    }
    eval_s += Seconds(eval_start);
    return stop;
  };
  const double planned =
      static_cast<double>(ScheduleOf(options, num_workers).total_steps);
  bool stop = false;
  for (int epoch = at.epoch; epoch < options.epochs && !stop; ++epoch) {
    batcher.StartEpoch(epoch);
    if (epoch == at.epoch) {
      batcher.Skip(at.batches_in_epoch);
    } else {
      at.batches_in_epoch = 0;
    }
    at.epoch = epoch;
    const auto epoch_start = Clock::now();
    const double eval_s_before = eval_s;
    auto last_log = Clock::now();
    auto step_start = Clock::now();
    const int per_epoch = std::max(batcher.batches_per_epoch(), 1);
    int logged_steps = 0;
    double loss_sum = 0;
    int loss_count = 0;
    size_t logged = 0;
    bool have = batcher.Next(&batch);
    while (have) {
      if (options.clock != nullptr && rank == 0) {
        options.clock->MaybeAnnounce(sum.steps);
      }
      const int lr_period = LrPeriod(options, epoch, sum.steps);
      if (options.label_smoothing_decay) {
        const double left = 1.0 - static_cast<double>(sum.steps) / planned;
        net->set_label_smoothing(
            static_cast<float>(options.label_smoothing * std::max(0.0, left)));
      }
      loss_sum += net->ForwardBackward(batch.images.data(), batch.labels.data(),
                                       batch.size, [&](size_t first_float) {
                                         exchange->StartEarly(
                                             sum.steps, lr_period, first_float);
                                       });
      exchange->Start(sum.steps, lr_period);
      have = batcher.Next(&next);  // overlaps the round trip
      if (slow) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(options.slow_worker_ms));
      }
      st = exchange->Finish();
      if (!st.ok())
        Die("step " + std::to_string(sum.steps) + ": " + st.ToString());
      ++sum.steps;
      if (rank == 0) evaluator.AfterStep();
      ++loss_count;
      ++logged_steps;
      if (node != nullptr) {
        node->SetMetric("ps_train_step", sum.steps);
        node->SetMetric("ps_step_seconds", Seconds(step_start));
      }
      step_start = Clock::now();
      logged += batch.size;
      sum.samples += batch.size;
      std::swap(batch, next);
      at.steps = sum.steps;
      ++at.batches_in_epoch;
      MaybeCheckpoint(options, rank, at, *net);
      if (die && sum.steps == options.die_after_steps) {
        std::fprintf(stderr,
                     "worker %d: killing itself after %d steps (test)\n", rank,
                     sum.steps);
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      if (Seconds(last_log) >= options.log_every_s || !have) {
        const double interval = Seconds(last_log);
        const double rate = logged / interval;
        const double loss = loss_sum / loss_count;
        // Where the run stands in epochs, and the time left at this
        // interval's pace.
        const double epochs_done =
            epoch + static_cast<double>(at.batches_in_epoch) / per_epoch;
        const double steps_left =
            static_cast<double>(options.epochs - epoch) * per_epoch -
            at.batches_in_epoch;
        const double eta = steps_left * interval / logged_steps;
        std::printf(
            "%s %d epoch %d step %d  (%.2f of %d epochs)  loss %.4f  "
            "%.0f samples/s  ETA %s\n",
            who, rank, epoch, sum.steps, epochs_done, options.epochs, loss,
            rate, Duration(eta).c_str());
        std::fflush(stdout);
        if (node != nullptr) {
          node->SetMetric("ps_train_epochs", epochs_done);
          node->SetMetric("ps_train_loss", loss);
          node->SetMetric("ps_samples_per_second", rate);
          node->SetMetric("ps_train_eta_seconds", eta);
        }
        metrics.Progress(Seconds(start), epoch, sum.steps,
                         loss_sum / loss_count, rate);
        last_log = Clock::now();
        loss_sum = 0;
        loss_count = 0;
        logged = 0;
        logged_steps = 0;
      }
      if (target && have && eval_point(at.batches_in_epoch)) {
        const double eval_s_was = eval_s;
        if (evaluate(epoch, sum.steps, false)) {
          stop = true;
          break;
        }
        // The progress lines' rates and the step time leave it out too.
        const auto spent = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(eval_s - eval_s_was));
        last_log += spent;
        step_start += spent;
      }
    }
    sum.train_s += Seconds(epoch_start) - (eval_s - eval_s_before);
    if (stop) break;
    if (test.size == 0 && !target) continue;
    stop = evaluate(epoch, sum.steps, true);
  }
  if (rank == 0 && test.size > 0 && target) {
    const double epochs_done =
        static_cast<double>(sum.steps) / batcher.batches_per_epoch();
    const size_t samples = sum.samples * static_cast<size_t>(num_workers);
    if (sum.reached) {
      std::printf(
          "reached %g%% after %zu samples (%.2f epochs) in %.1f s of "
          "training\n",
          options.target_accuracy, samples, epochs_done, sum.train_s);
    } else {
      std::printf(
          "not reached: %g%% wanted, %.2f%% after %zu samples (%.2f "
          "epochs) in %.1f s of training\n",
          options.target_accuracy, 100.0 * sum.eval.accuracy, samples,
          epochs_done, sum.train_s);
    }
    std::fflush(stdout);
  }
  sum.wall_s = Seconds(start);
  return sum;
}

bool UseOverlap(const TrainOptions& options) {
  using Overlap = TrainOptions::Overlap;
  if (options.overlap != Overlap::kAuto) return options.overlap == Overlap::kOn;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return options.threads > 0 && options.threads < cores;
}

// A worker's Net keeps its weights and gradients in shared memory, so that
// co-located servers read the pushed gradients and write the pulled weights
// in place (ps/shared_array.h); remote servers get them through the socket.
std::unique_ptr<ps::model::Net> MakeNet(const TrainOptions& options,
                                        bool shared) {
  ps::model::SetCpuThreads(options.threads);
  ps::model::FloatAllocator alloc;
  if (shared) {
    alloc = [](size_t n) { return ps::SharedArray<float>(n).ptr(); };
  }
  auto net = ps::model::Net::Create(options.device, options.seed, alloc);
  if (!net.ok()) Die("--device: " + net.status().ToString());
  return std::move(net).value();
}

void Finish(const TrainOptions& options, const ps::model::Net& net) {
  if (options.dump_weights.empty()) return;
  ps::Status st =
      DumpFloats(options.dump_weights, net.params(), net.num_params());
  if (!st.ok()) Die(st.ToString());
}

}  // namespace

int RunWorker(const TrainOptions& options, const ps::model::Dataset& train,
              const ps::model::Dataset& test) {
  const int rank = ps::MyRank(), num_workers = ps::NumWorkers();
  auto net = MakeNet(options, true);
  PsExchange exchange(options, net.get(), UseOverlap(options));
  Position from;
  const bool rejoined = ps::DefaultNode()->rejoined();
  TrainOptions run = options;
  if (rejoined) {
    // A restart: the servers say where the job stands; the position in the
    // data follows from the step (every worker has as many per epoch).
    ps::StatusOr<int> step = exchange.Rejoin();
    if (!step.ok()) Die("rejoin: " + step.status().ToString());
    const int per_epoch = ps::model::Batcher(&train, options.batch_size,
                                             options.seed, rank, num_workers)
                              .batches_per_epoch();
    from.steps = *step;
    from.epoch = per_epoch > 0 ? *step / per_epoch : 0;
    from.batches_in_epoch = per_epoch > 0 ? *step % per_epoch : 0;
    net->SeedDropout(options.seed * 1000003ull + rank);
    run.die_after_steps = 0;  // the test hook killed the one before
    std::printf("worker %d rejoined at step %d (epoch %d, batch %d)\n", rank,
                from.steps, from.epoch, from.batches_in_epoch);
    std::fflush(stdout);
  } else if (options.restore_step >= 0) {
    from = LoadWorker(options, rank, options.restore_step, net.get());
  }
  ps::Status st = exchange.PullInitial(from.steps);
  if (!st.ok()) Die("initial pull: " + st.ToString());
  Summary sum = Train(run, "worker", rank, num_workers, net.get(), &exchange,
                      train, test, ps::DefaultNode(),
                      rejoined || options.restore_step >= 0 ? &from : nullptr);
  st = exchange.Done(sum.steps);
  if (!st.ok()) Die("done: " + st.ToString());
  const double rate = sum.samples / sum.train_s;
  if (test.size > 0) {
    std::printf(
        "final: test accuracy %.2f%%  wall %.1f s  %.0f train "
        "samples/s (this worker; %d workers: ~%.0f)\n",
        100.0 * sum.eval.accuracy, sum.wall_s, rate, num_workers,
        rate * num_workers);
  } else {
    std::printf(
        "worker %d final: %d steps  wall %.1f s  %.0f train "
        "samples/s\n",
        rank, sum.steps, sum.wall_s, rate);
  }
  std::fflush(stdout);
  if (rank == 0) Finish(options, *net);
  FinalizeNode(options);
  return 0;
}

int RunLocal(const TrainOptions& options, const ps::model::Dataset& train,
             const ps::model::Dataset& test) {
  auto net = MakeNet(options, false);
  LocalExchange exchange(options, net.get());
  Summary sum = Train(options, "local", 0, 1, net.get(), &exchange, train, test,
                      /*node=*/nullptr);
  std::printf(
      "final: test accuracy %.2f%%  wall %.1f s  %.0f train "
      "samples/s (single process)\n",
      100.0 * sum.eval.accuracy, sum.wall_s, sum.samples / sum.train_s);
  std::fflush(stdout);
  Finish(options, *net);
  return 0;
}

}  // namespace mnist
