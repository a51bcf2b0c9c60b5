// The server role of mnist_dist: one DenseShard holding this server's slice
// of the ConvNet's weights, initialised from the seed exactly as every
// worker's Net, with the optimizer state of that slice.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "dist_common.h"
#include "model/init.h"
#include "ps/ps.h"

namespace mnist {

namespace {

// Averages the summed gradients and runs the optimizer of the range, with
// the learning rate of the StepLR period the step belongs to (the cmd tag:
// the epoch, or step / --lr_every_steps). Workers push a step in ranges
// (dense_server.h); each distinct (offset, n) keeps its own optimizer, which
// equals one optimizer over the slice as SGD and Adam are elementwise.
class SliceUpdater {
 public:
  SliceUpdater(const TrainOptions& options, size_t slice_size)
      : options_(options),
        slice_size_(slice_size),
        schedule_(options.optimizer.lr, options.lr_step, options.lr_gamma) {}

  void operator()(float* w, const float* grad_sum, size_t offset, size_t n,
                  int num_grads, int /*step*/, int lr_period) {
    CHECK_LE(offset + n, slice_size_);
    auto& optimizer = optimizers_[{offset, n}];
    if (!optimizer) {
      auto made = ps::model::MakeOptimizer(options_.optimizer, n);
      if (!made.ok()) Die(made.status().ToString());
      optimizer = std::move(made).value();
    }
    optimizer->set_grad_scale(1.0f / static_cast<float>(num_grads));
    optimizer->set_lr(schedule_.LrAt(lr_period));
    optimizer->Step(w, grad_sum, n);
    // One update of the slice per step: count the range that ends it.
    if (offset + n == slice_size_) ++updates_;
    if (options_.die_after_steps > 0 && updates_ == options_.die_after_steps &&
        options_.die_node == "server:" + std::to_string(ps::MyRank())) {
      std::fprintf(stderr,
                   "server %d: killing itself after %d updates (test)\n",
                   ps::MyRank(), updates_);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }

 private:
  const TrainOptions& options_;
  const size_t slice_size_;
  std::map<std::pair<size_t, size_t>, std::unique_ptr<ps::model::Optimizer>>
      optimizers_;  // by (offset, n)
  ps::model::StepLR schedule_;
  int updates_ = 0;
};

}  // namespace

int RunServer(const TrainOptions& options) {
  const int rank = ps::MyRank();
  const ps::DenseLayout layout = ModelLayout(options);
  auto placement = ModelPlacement(layout, ps::NumServers(), options.placement);
  if (!placement.ok()) Die(placement.status().ToString());
  ps::Key begin, end;
  ServerKeys(*placement, layout, rank, &begin, &end);
  const size_t lo = std::min(layout.offset(begin), layout.total);
  const size_t hi =
      begin == end ? lo : layout.offset(end - 1) + layout.length(end - 1);

  // Same bits as Net::Create(device, seed) on every worker.
  std::vector<float> all(layout.total);
  ps::model::InitParams(ps::model::ConvNetTensors(), options.seed, all.data());
  std::vector<float> slice(all.begin() + lo, all.begin() + hi);
  all = {};
  // Fails here, before serving, on a bad optimizer setting.
  auto optimizer = ps::model::MakeOptimizer(options.optimizer, slice.size());
  if (!optimizer.ok()) Die(optimizer.status().ToString());

  std::printf(
      "server %d owns keys [%llu, %llu) = floats [%zu, %zu): %zu bytes "
      "(%.1f%% of %zu): %s\n",
      rank, static_cast<unsigned long long>(begin),
      static_cast<unsigned long long>(end), lo, hi, (hi - lo) * sizeof(float),
      100.0 * (hi - lo) / layout.total, layout.total * sizeof(float),
      DescribeFloats(lo, hi).c_str());
  std::fflush(stdout);

  ps::DenseShardOptions shard_options;
  shard_options.consistency = options.consistency;
  shard_options.max_delay =
      options.consistency == ps::Consistency::kBounded ? options.max_delay : 0;
  shard_options.num_workers = ps::NumWorkers();
  ps::KVServer<float> server(0);
  auto updater = std::make_shared<SliceUpdater>(options, slice.size());
  ps::DenseShard shard(&server, layout, begin, end, std::move(slice),
                       shard_options,
                       [updater](float* w, const float* g, size_t offset,
                                 size_t n, int num_grads, int step, int tag) {
                         (*updater)(w, g, offset, n, num_grads, step, tag);
                       });
  // A dead worker ends this process through ps (a NODE_FAILED), and makes
  // the shard give up (failure()); a live one always sends done, so this
  // wait ends. A server without keys (more servers than whole tensors, with
  // --placement tensor) hears from no worker and does not wait.
  while (begin < end && !shard.WaitAllDone(std::chrono::seconds(60))) {
    if (!shard.failure().ok()) {
      LOG(ERROR) << "server " << rank << ": " << shard.failure();
      return 1;
    }
    LOG(INFO) << "server " << rank << ": " << shard.updates_applied()
              << " updates applied; still waiting for workers to finish";
  }
  std::printf(
      "server %d done: consistency %s max_delay %d: %lld updates applied, "
      "max staleness %d, %lld bad requests, %lld weight copies, %llu/%llu "
      "frames sent/received by shared memory\n",
      rank, ps::ConsistencyName(options.consistency), shard_options.max_delay,
      static_cast<long long>(shard.updates_applied()), shard.max_staleness(),
      static_cast<long long>(shard.bad_requests()),
      static_cast<long long>(shard.weight_copies()),
      static_cast<unsigned long long>(
          ps::DefaultNode()->num_shared_frames_sent()),
      static_cast<unsigned long long>(
          ps::DefaultNode()->num_shared_frames_received()));
  std::fflush(stdout);
  ps::Finalize(0, true);
  return 0;
}

}  // namespace mnist
