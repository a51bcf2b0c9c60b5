// The server role of sparse_ctr: a SparseShard of the job's tables (and,
// with PS_REPLICAS=1, first a replica shard of the server before it),
// serving until the workers' last sync point, then answering worker 0's
// question about the rows held.
#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ctr_checkpoint.h"
#include "ctr_end.h"
#include "ctr_job.h"
#include "ps/ps.h"

namespace ctr {

namespace {

// Test hook: --die_node server:R kills itself once its own shard applied
// --die_after_pushes pushes.
std::thread DieWatcher(const Options& options, const ps::SparseShard* shard,
                       const std::atomic<bool>* done) {
  if (options.die_node != "server:" + std::to_string(ps::MyRank()) ||
      options.die_after_pushes <= 0) {
    return std::thread();
  }
  return std::thread([&options, shard, done] {
    while (!done->load()) {
      if (shard->pushes_applied() >= options.die_after_pushes) {
        std::fprintf(
            stderr, "server %d: killing itself after %lld pushes (test)\n",
            ps::MyRank(), static_cast<long long>(shard->pushes_applied()));
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

}  // namespace

int RunServer(const Options& options) {
  const int rank = ps::MyRank();
  ps::KVServer<float> server(0);
  ps::SparseShardOptions shard_options;
  shard_options.num_workers = ps::NumWorkers();
  shard_options.max_pull_bytes = ps::DefaultNode()->config().max_message_bytes;
  std::unique_ptr<ps::SparseShard> replica;
  if (ps::DefaultNode()->config().replicas > 0) {
    ps::SparseShardOptions replica_options = shard_options;
    replica_options.replica = true;
    const int primary = ps::PrimaryOf(rank, ps::NumServers());
    replica = std::make_unique<ps::SparseShard>(
        &server, options.tables, replica_options,
        ServerSnapshot(options, primary));
    if (options.restore_epoch >= 0) LoadServer(options, primary, replica.get());
    std::printf("server %d also holds the rows of server %d (replica)\n", rank,
                primary);
  }
  ps::SparseShard shard(&server, options.tables, shard_options,
                        ServerSnapshot(options, rank));
  EndWord end;
  if (options.restore_epoch >= 0) LoadServer(options, rank, &shard);

  ps::SimpleApp stats(kStatsApp);
  stats.set_request_handle([&](const ps::SimpleData& req, ps::SimpleApp* app) {
    app->Response(
        req, std::to_string(shard.rows(kLinearTable)) + " " +
                 std::to_string(replica ? replica->rows(kLinearTable) : 0));
  });

  // A restored shard must hold its rows before the first request: the
  // workers wait for this barrier before they pull.
  if (options.restore_epoch >= 0) {
    ps::Barrier(0, ps::kServerGroup | ps::kWorkerGroup);
  }

  std::atomic<bool> done{false};
  std::thread watcher = DieWatcher(options, &shard, &done);
  const int last_point = options.epochs;
  const auto start = std::chrono::steady_clock::now();
  while (!shard.WaitSync(last_point, std::chrono::seconds(30))) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (waited > options.server_wait_s) {
      done = true;
      if (watcher.joinable()) watcher.join();
      Die("server " + std::to_string(rank) + ": the workers did not reach " +
          "sync point " + std::to_string(last_point) + " (the end of epoch " +
          std::to_string(options.epochs) + ") within --server_wait_s " +
          std::to_string(options.server_wait_s) + ": " +
          shard.SyncWaitingFor());
    }
    LOG(INFO) << "server " << rank << ": " << shard.pushes_applied()
              << " pushes applied, " << shard.rows(kLinearTable) << " rows; "
              << shard.SyncWaitingFor();
  }
  done = true;
  if (watcher.joinable()) watcher.join();
  std::printf(
      "server %d done: %zu rows (%zu factor rows), %.1f MB, %lld "
      "pushes applied, %lld bad requests\n",
      rank, shard.rows(kLinearTable), shard.rows(kFactorTable),
      shard.memory_bytes() / 1e6,
      static_cast<long long>(shard.pushes_applied()),
      static_cast<long long>(shard.bad_requests()));
  if (replica) {
    std::printf(
        "server %d replica of server %d done: %zu rows, %lld pushes "
        "applied\n",
        rank, ps::PrimaryOf(rank, ps::NumServers()),
        replica->rows(kLinearTable),
        static_cast<long long>(replica->pushes_applied()));
  }
  std::fflush(stdout);
  // Worker 0 asks for the rows and evaluates meanwhile.
  if (!end.Wait(options.server_wait_s)) {
    Die("server " + std::to_string(rank) +
        ": worker 0 did not report the job's end within --server_wait_s " +
        std::to_string(options.server_wait_s));
  }
  ps::Finalize(0, true);
  return 0;
}

int RunScheduler(const Options& options) {
  EndWord end;
  if (!end.Wait(options.server_wait_s)) {
    Die("scheduler: worker 0 did not report the job's end within "
        "--server_wait_s " +
        std::to_string(options.server_wait_s));
  }
  ps::Finalize(0, true);
  return 0;
}

}  // namespace ctr
