// The server role of mnist_dist: one DenseShard holding this server's slice
// of the ConvNet's weights, initialised from the seed exactly as every
// worker's Net, with the optimizer state of that slice.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "dist_common.h"
#include "model/init.h"
#include "ps/ps.h"

namespace mnist {

namespace {

// Averages the summed gradients and runs the optimizer of the range, with
// the learning rate of the step (one-cycle), or of the StepLR period the step
// belongs to (the cmd tag: the epoch, or step / --lr_every_steps). Workers push
// a step in ranges (dense_server.h); each distinct (offset, n) keeps its own
// optimizer, which equals one optimizer over the slice as SGD and Adam are
// elementwise.
class SliceUpdater {
 public:
  // `may_die`: this updater is the one --die_node counts (not a replica's).
  SliceUpdater(const TrainOptions& options, size_t slice_size, bool may_die)
      : options_(options),
        slice_size_(slice_size),
        may_die_(may_die),
        schedule_(ScheduleOf(options, ps::NumWorkers())) {}

  void operator()(float* w, const float* grad_sum, size_t offset, size_t n,
                  int num_grads, int step, int lr_period) {
    CHECK_LE(offset + n, slice_size_);
    auto& optimizer = optimizers_[{offset, n}];
    if (!optimizer) {
      auto made = ps::model::MakeOptimizer(options_.optimizer, n);
      if (!made.ok()) Die(made.status().ToString());
      optimizer = std::move(made).value();
    }
    optimizer->set_grad_scale(1.0f / static_cast<float>(num_grads));
    optimizer->set_lr(schedule_.LrAt(step, lr_period));
    optimizer->Step(w, grad_sum, n);
    if (num_grads < ps::NumWorkers()) ++short_updates_;
    // One update of the slice per step: count the range that ends it.
    if (offset + n == slice_size_) ++updates_;
    if (options_.die_at_push) return;
    if (updates_ == options_.die_after_steps) MaybeDie("", updates_);
  }

  // The primary's shard calls this as a worker's push of `step` arrives
  // (DenseShardOptions::on_push), before it is summed.
  void OnPush(int step) {
    if (options_.die_at_push && step == options_.die_after_steps) {
      MaybeDie(", as a push of the next step arrived", step);
    }
  }

  // --die_node: this server kills or freezes itself (once: a frozen one
  // goes on when let go) after `updates` updates.
  void MaybeDie(const char* where, int updates) {
    if (!may_die_ || died_ || options_.die_after_steps <= 0 ||
        options_.die_node != "server:" + std::to_string(ps::MyRank())) {
      return;
    }
    std::fprintf(stderr, "server %d: %s itself after %d updates%s (test)\n",
                 ps::MyRank(), options_.die_freezes ? "freezing" : "killing",
                 updates, where);
    std::fflush(stderr);
    died_ = true;
    std::raise(options_.die_freezes ? SIGSTOP : SIGKILL);
  }

  // The updates counted and every range's optimizer state, for a
  // checkpoint.
  void Save(Packer* out) const {
    out->Put<int32_t>(updates_);
    out->Put<uint64_t>(optimizers_.size());
    for (const auto& [range, optimizer] : optimizers_) {
      out->Put<uint64_t>(range.first);
      out->Put<uint64_t>(range.second);
      out->PutString(optimizer->SaveState());
    }
  }
  ps::Status Load(Unpacker* in) {
    uint64_t count;
    if (!in->Get(&updates_) || !in->Get(&count)) {
      return ps::Status::Corruption("no optimizer state");
    }
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t offset, n;
      std::string state;
      if (!in->Get(&offset) || !in->Get(&n) || !in->GetString(&state) ||
          offset + n > slice_size_) {
        return ps::Status::Corruption("optimizer state " + std::to_string(i) +
                                      " is cut short or outside the slice");
      }
      auto made = ps::model::MakeOptimizer(options_.optimizer, n);
      if (!made.ok()) return made.status();
      PS_RETURN_IF_ERROR((*made)->LoadState(state));
      optimizers_[{offset, n}] = std::move(made).value();
    }
    return ps::Status::OK();
  }

  int64_t short_updates() const { return short_updates_.load(); }

 private:
  const TrainOptions& options_;
  const size_t slice_size_;
  const bool may_die_;
  bool died_ = false;
  std::map<std::pair<size_t, size_t>, std::unique_ptr<ps::model::Optimizer>>
      optimizers_;  // by (offset, n)
  ps::model::LrSchedule schedule_;
  int32_t updates_ = 0;
  // Range updates with fewer than every worker's gradient (a worker lost
  // under --on_worker_failure continue); read after the shard is done.
  std::atomic<int64_t> short_updates_{0};
};

// The floats of keys [begin, end): [*lo, *hi) of the flat vector.
void FloatsOf(const ps::DenseLayout& layout, ps::Key begin, ps::Key end,
              size_t* lo, size_t* hi) {
  *lo = std::min(layout.offset(begin), layout.total);
  *hi = begin == end ? *lo : layout.offset(end - 1) + layout.length(end - 1);
}

// A DenseShard updater for a slice of `size` floats.
ps::DenseUpdater UpdaterOf(std::shared_ptr<SliceUpdater> updater) {
  return [updater](float* w, const float* g, size_t offset, size_t n,
                   int num_grads, int step, int tag) {
    (*updater)(w, g, offset, n, num_grads, step, tag);
  };
}

// A server's checkpoint payload: its slice of the weights, then the
// updater's state.
std::string ServerPayload(const float* w, size_t n,
                          const SliceUpdater& updater) {
  Packer out;
  out.PutBytes(w, n * sizeof(float));
  updater.Save(&out);
  return out.data();
}

// Restores the slice and the updater from the checkpoint of `step`, or dies
// naming the file.
void LoadServer(const TrainOptions& options, int rank, int step,
                std::vector<float>* slice, SliceUpdater* updater) {
  const CheckpointJob job = CheckpointJobOf(options);
  const std::string path =
      CheckpointPath(job, step, CheckpointRole::kServer, rank);
  auto payload = ReadCheckpoint(job, step, CheckpointRole::kServer, rank);
  if (!payload.ok()) Die("--restore: " + payload.status().message());
  Unpacker in(*payload);
  std::string floats;
  ps::Status st;
  if (!in.GetString(&floats) ||
      floats.size() != slice->size() * sizeof(float)) {
    st = ps::Status::Corruption("weights are not the " +
                                std::to_string(slice->size()) +
                                " floats of this server's slice");
  } else {
    std::memcpy(slice->data(), floats.data(), floats.size());
    st = CheckFinite(slice->data(), slice->size(), "the weights");
    if (st.ok()) st = updater->Load(&in);
    if (st.ok() && !in.done()) st = ps::Status::Corruption("trailing bytes");
  }
  if (!st.ok()) Die("--restore: '" + path + "': " + st.message());
  RemoveCheckpointsAfter(job, step, CheckpointRole::kServer, rank);
}

// Writes the checkpoint of server `rank`'s slice: this server's own, or
// (a replica, once it took them over) the keys of the server it stands in
// for, so the sets stay whole after a failover. Empty without
// --checkpoint_dir. On the shard's receive thread: requests wait for the
// write.
ps::DenseSnapshot SnapshotOf(const TrainOptions& options, int rank,
                             std::shared_ptr<SliceUpdater> updater) {
  if (options.checkpoint_dir.empty()) return nullptr;
  return [&options, rank, updater](int step, const float* w, size_t n) {
    const auto start = std::chrono::steady_clock::now();
    const std::string payload = ServerPayload(w, n, *updater);
    const std::string what =
        "server " + std::to_string(ps::MyRank()) + ": checkpoint of step " +
        std::to_string(step) +
        (rank == ps::MyRank() ? std::string()
                              : " for server " + std::to_string(rank));
    ps::Status st =
        WriteCheckpoint(CheckpointJobOf(options), CheckpointRole::kServer, rank,
                        step, payload, ps::DefaultNode());
    if (!st.ok()) {
      // A full disk must not end a job that trains well: the sets already
      // written stay whole, and the next checkpoint is tried again.
      LOG(ERROR) << what << " not written: " << st.message()
                 << "; training goes on (--restore resumes from the last "
                    "complete checkpoint)";
      return;
    }
    LOG(INFO) << what << ", " << payload.size() << " bytes, written in "
              << std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start)
                     .count()
              << " ms";
  };
}

}  // namespace

int RunServer(const TrainOptions& options) {
  const int rank = ps::MyRank();
  const ps::DenseLayout layout = ModelLayout(options);
  auto placement = ModelPlacement(layout, ps::NumServers(), options.placement);
  if (!placement.ok()) Die(placement.status().ToString());
  ps::Key begin, end;
  ServerKeys(*placement, layout, rank, &begin, &end);
  size_t lo, hi;
  FloatsOf(layout, begin, end, &lo, &hi);

  // Same bits as Net::Create(device, seed) on every worker.
  std::vector<float> all(layout.total);
  ps::model::InitParams(ps::model::ConvNetTensors(), options.seed, all.data());
  std::vector<float> slice(all.begin() + lo, all.begin() + hi);
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
  shard_options.on_worker_failure = options.on_worker_failure;
  shard_options.allow_non_finite = options.allow_non_finite;
  shard_options.snapshot_every = options.checkpoint_every_steps;
  ps::KVServer<float> server(0);
  if (options.compressor != nullptr) {
    ps::Status st = server.AddFilter(options.compressor);
    if (!st.ok()) Die("--compress: " + st.ToString());
  }
  auto updater = std::make_shared<SliceUpdater>(options, slice.size(), true);
  if (options.die_at_push) {
    shard_options.on_push = [updater](int step, int) { updater->OnPush(step); };
  }
  if (options.restore_step >= 0) {
    LoadServer(options, rank, options.restore_step, &slice, updater.get());
    shard_options.first_step = options.restore_step;
  }
  // PS_REPLICAS=1 (--replicas 1): this server also holds the keys of the
  // server before it, with their own optimizer state, so that it can take
  // them over when that server dies. Made first (dense_server.h). It writes
  // that server's checkpoints once it took its keys over; a restore starts
  // both copies from that server's file.
  std::unique_ptr<ps::DenseShard> replica;
  bool replica_has_keys = false;
  const int replica_of = ps::DefaultNode()->config().replicas > 0
                             ? ps::PrimaryOf(rank, ps::NumServers())
                             : -1;
  if (replica_of >= 0) {
    ps::Key rbegin, rend;
    ServerKeys(*placement, layout, replica_of, &rbegin, &rend);
    replica_has_keys = rbegin < rend;
    size_t rlo, rhi;
    FloatsOf(layout, rbegin, rend, &rlo, &rhi);
    std::printf(
        "server %d also holds the keys of server %d: [%llu, %llu) "
        "(replica)\n",
        rank, replica_of, static_cast<unsigned long long>(rbegin),
        static_cast<unsigned long long>(rend));
    ps::DenseShardOptions replica_options = shard_options;
    replica_options.replica = true;
    replica_options.on_push = nullptr;  // --die_node counts the primary's

    std::vector<float> rslice(all.begin() + rlo, all.begin() + rhi);
    auto rupdater = std::make_shared<SliceUpdater>(options, rhi - rlo, false);
    if (options.restore_step >= 0) {
      LoadServer(options, replica_of, options.restore_step, &rslice,
                 rupdater.get());
    }
    replica = std::make_unique<ps::DenseShard>(
        &server, layout, rbegin, rend, std::move(rslice), replica_options,
        UpdaterOf(rupdater), SnapshotOf(options, replica_of, rupdater));
  }
  all = {};
  ps::DenseShard shard(&server, layout, begin, end, std::move(slice),
                       shard_options, UpdaterOf(updater),
                       SnapshotOf(options, rank, updater));
  if (options.clock != nullptr) {
    options.clock->SetSink([&shard, &replica](int step) {
      shard.SnapshotAt(step);
      if (replica) replica->SnapshotAt(step);
    });
  }
  // A dead worker ends this process through ps (a NODE_FAILED), and makes
  // the shard give up (failure()), unless under `continue` the shard counts
  // it done; a live one always sends done, so this wait ends. A shard
  // without keys (more servers than whole tensors, with --placement tensor)
  // hears from no worker and is not waited for.
  for (ps::DenseShard* s : {begin < end ? &shard : nullptr,
                            replica_has_keys ? replica.get() : nullptr}) {
    while (s != nullptr && !s->WaitAllDone(std::chrono::seconds(60))) {
      if (!s->failure().ok()) {
        std::fprintf(stderr, "server %d: %s\n", rank,
                     s->failure().ToString().c_str());
        // The workers hear the refusal from the shard and stop, naming the
        // cause; this server leaving first would be the failure the job
        // reports (the launcher stops it once a worker exits).
        std::this_thread::sleep_for(std::chrono::seconds(30));
        return 1;
      }
      LOG(INFO) << "server " << rank << ": " << s->updates_applied()
                << " updates applied; still waiting for workers to finish";
    }
  }
  if (replica) {
    std::printf("server %d replica of server %d done: %lld updates applied\n",
                rank, replica_of,
                static_cast<long long>(replica->updates_applied()));
  }
  std::printf(
      "server %d done: consistency %s max_delay %d: %lld updates applied, "
      "max staleness %d, %lld bad requests, %lld weight copies, %llu/%llu "
      "frames sent/received by shared memory, %d workers lost, %d workers "
      "rejoined, %lld range updates short of a worker\n",
      rank, ps::ConsistencyName(options.consistency), shard_options.max_delay,
      static_cast<long long>(shard.updates_applied()), shard.max_staleness(),
      static_cast<long long>(shard.bad_requests()),
      static_cast<long long>(shard.weight_copies()),
      static_cast<unsigned long long>(
          ps::DefaultNode()->num_shared_frames_sent()),
      static_cast<unsigned long long>(
          ps::DefaultNode()->num_shared_frames_received()),
      shard.workers_lost(), shard.workers_rejoined(),
      static_cast<long long>(updater->short_updates()));
  std::fflush(stdout);
  if (options.clock != nullptr) options.clock->SetSink(nullptr);
  FinalizeNode(options);
  return 0;
}

}  // namespace mnist
