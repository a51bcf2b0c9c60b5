// The worker role of mnist_dist, and the same loop in a single process: the
// two Exchanges a Trainer (trainer.h) hands each step's gradients to, one
// that pushes them to the servers and pulls fresh weights (KVWorker, no
// copies), one that applies the optimizer locally; and RunWorker and
// RunLocal, which make the Net, rejoin or restore (worker_checkpoint.h),
// train and print the final line.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist_common.h"
#include "model/net.h"
#include "ps/ps.h"
#include "trainer.h"
#include "worker_checkpoint.h"

namespace mnist {

namespace {

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
      : kv_(0, 0),
        layout_(ModelLayout(options)),
        overlap_(overlap),
        die_in_step_(options.die_at_push && options.die_after_steps > 0 &&
                             options.die_node ==
                                 "worker:" + std::to_string(ps::MyRank())
                         ? options.die_after_steps
                         : -1),
        die_freezes_(options.die_freezes) {
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
      if (step == die_in_step_) DieBetweenServers(r.push_ts, step);
      r.pull_ts = kv_.ZPull(
          r.keys, &r.params, nullptr,
          ps::EncodeDenseCmd(ps::DenseOp::kStep, step + 1, lr_period));
      r.sent = true;
    }
  }
  // --die_point push (a test): once the first server answered push `ts`
  // of `step`, before the others go, this worker kills or freezes itself.
  void DieBetweenServers(int ts, int step) {
    die_in_step_ = -1;
    ps::Status st = kv_.Wait(ts);
    if (!st.ok())
      Die("push of step " + std::to_string(step) + ": " + st.ToString());
    std::fprintf(stderr,
                 "worker %d: %s itself between its pushes of step %d to two "
                 "servers (test)\n",
                 ps::MyRank(), die_freezes_ ? "freezing" : "killing", step);
    std::fflush(stderr);
    std::raise(die_freezes_ ? SIGSTOP : SIGKILL);
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
  int die_in_step_;  // --die_point push: the step, else -1
  const bool die_freezes_;
  ps::SArray<ps::Key> keys_;
  ps::SArray<int> lens_;
  std::vector<ps::Key> first_keys_;
  std::vector<ps::Key> server_ends_;  // each server's end key, ascending
  ps::SArray<float> params_, grads_;
  std::vector<KeyRange> early_, late_;
};

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
  const bool rejoined = ps::DefaultNode()->rejoined();
  TrainOptions run = options;
  if (rejoined) run.die_after_steps = 0;  // the test hook killed the one before
  PsExchange exchange(run, net.get(), UseOverlap(options));
  Position from;
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
