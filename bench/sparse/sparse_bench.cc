// sparse_bench: rows per second that one server pulls and pushes+applies
// for sparse tables (ps/sparse.h), in batches of ids drawn Zipf-distributed
// or uniformly from a large vocabulary, with Adagrad. One program for every
// role, run through tracker/launch.py (bench/sparse/run.py does, and puts
// the figures beside raw ZeroMQ's rate for the same payload bytes).
//
// Each worker times, per (width, distribution) cell, PullRows+Wait and
// PushRows+Wait of pre-drawn batches (their unique ids: SparseBatch), one
// request in flight, after one warm-up pass over every batch (which makes
// the rows, so the timed pulls and pushes find them). It prints one line per
// cell: "sparse cell width=W ids=D rows=U pull_rows_s=.. push_rows_s=..
// pull_mb_s=.. push_mb_s=.. payload_bytes=..", where U is the mean unique
// ids per request and MB/s counts the rows' floats (1 MB = 1e6 bytes); the
// keys (8 bytes a row) travel too. After the cells the workers sync and each
// server prints, per table, "sparse memory width=W rows=R bytes=B
// bytes_per_row=X row_floats_bytes=F": the table's B bytes as allocated
// (rows, Adagrad state, hash index), F a row's floats and state alone.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ps/ps.h"
#include "ps/sparse.h"

DEFINE_string(widths, "16,64", "row widths (floats), comma-separated");
DEFINE_string(ids, "zipf,uniform", "id distributions: zipf, uniform or both");
DEFINE_int32(batch, 8192, "ids drawn per request (before making them unique)");
DEFINE_int32(batches, 64, "batches drawn per cell (reused round-robin)");
DEFINE_uint64(vocab, 10000000, "ids are drawn from [0, vocab)");
DEFINE_double(zipf, 1.1, "Zipf exponent of the zipf distribution");
DEFINE_double(seconds, 1.0, "measured time per cell and op");

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> Widths() {
  std::vector<int> out;
  std::stringstream in(FLAGS_widths);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long w = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || w < 1 ||
        w > ps::kMaxSparseWidth) {
      LOG(FATAL) << "--widths: '" << item << "' is no row width in [1, "
                 << ps::kMaxSparseWidth << "]";
    }
    out.push_back(static_cast<int>(w));
  }
  return out;
}

std::vector<ps::SparseTableConfig> Tables() {
  std::vector<ps::SparseTableConfig> tables;
  for (int w : Widths()) {
    ps::SparseTableConfig t;
    t.id = static_cast<int>(tables.size());
    t.width = w;
    t.init = ps::SparseInit::kNormal;
    t.optimizer = ps::SparseOptimizer::kAdagrad;
    tables.push_back(t);
  }
  return tables;
}

// Zipf over [0, n) by inverting the continuous power law's CDF: rank r has
// probability about r^-s.
uint64_t DrawZipf(std::mt19937_64* rng, uint64_t n, double s) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double a = 1.0 - s;
  const double x = std::pow(
      (std::pow(static_cast<double>(n), a) - 1.0) * u(*rng) + 1.0, 1.0 / a);
  return std::min<uint64_t>(static_cast<uint64_t>(x) - 1, n - 1);
}

void RunServer() {
  ps::KVServer<float> server(0);
  ps::SparseShardOptions options;
  options.num_workers = ps::NumWorkers();
  const auto tables = Tables();
  ps::SparseShard shard(&server, tables, options);
  if (!shard.WaitSync(1, std::chrono::hours(1))) {
    LOG(FATAL) << "server " << ps::MyRank()
               << ": the workers did not reach the end within an hour";
  }
  for (const auto& t : tables) {
    const size_t rows = shard.rows(t.id);
    const size_t bytes = shard.memory_bytes(t.id);
    std::printf(
        "sparse memory width=%d rows=%zu bytes=%zu "
        "bytes_per_row=%.1f row_floats_bytes=%d\n",
        t.width, rows, bytes,
        rows == 0 ? 0.0
                  : static_cast<double>(bytes) / static_cast<double>(rows),
        t.width * (1 + t.state_per_float()) * 4);
  }
  std::fflush(stdout);
}

void RunWorker() {
  const auto tables = Tables();
  ps::SparseWorker kv(tables);
  std::mt19937_64 rng(1234 + ps::MyRank());
  std::stringstream dists(FLAGS_ids);
  std::string dist;
  std::vector<std::string> all_dists;
  while (std::getline(dists, dist, ',')) {
    if (dist != "zipf" && dist != "uniform") {
      LOG(FATAL) << "--ids: '" << dist << "' is neither zipf nor uniform";
    }
    all_dists.push_back(dist);
  }
  for (const auto& t : tables) {
    for (const std::string& d : all_dists) {
      std::vector<ps::SparseBatch> batches;
      std::vector<ps::SArray<float>> grads;
      double unique = 0;
      for (int b = 0; b < FLAGS_batches; ++b) {
        std::vector<uint64_t> ids(FLAGS_batch);
        std::uniform_int_distribution<uint64_t> uniform(0, FLAGS_vocab - 1);
        for (auto& id : ids) {
          id = d == "zipf" ? DrawZipf(&rng, FLAGS_vocab, FLAGS_zipf)
                           : uniform(rng);
        }
        batches.push_back(ps::SparseBatch::Of(ids.data(), ids.size()));
        grads.emplace_back(batches.back().size() * t.width, 0.01f);
        unique += static_cast<double>(batches.back().size());
      }
      unique /= FLAGS_batches;
      for (size_t b = 0; b < batches.size(); ++b) {  // warm-up: makes rows
        ps::SArray<float> rows;
        CHECK(kv.Wait(kv.PullRows(t.id, batches[b], &rows)).ok());
        CHECK(kv.Wait(kv.PushRows(t.id, batches[b], grads[b])).ok());
      }
      auto time = [&](bool push) {
        size_t rows_done = 0;
        const auto start = Clock::now();
        const auto until = start + std::chrono::duration<double>(FLAGS_seconds);
        for (size_t i = 0; Clock::now() < until && i < 1000000; ++i) {
          const size_t b = i % batches.size();
          ps::Status st;
          if (push) {
            st = kv.Wait(kv.PushRows(t.id, batches[b], grads[b]));
          } else {
            ps::SArray<float> rows;
            st = kv.Wait(kv.PullRows(t.id, batches[b], &rows));
          }
          CHECK(st.ok()) << st;
          rows_done += batches[b].size();
        }
        const double s =
            std::chrono::duration<double>(Clock::now() - start).count();
        return static_cast<double>(rows_done) / s;
      };
      const double pull = time(false), push = time(true);
      const double row_bytes = 4.0 * t.width;
      std::printf(
          "sparse cell width=%d ids=%s rows=%.0f pull_rows_s=%.0f "
          "push_rows_s=%.0f pull_mb_s=%.1f push_mb_s=%.1f "
          "payload_bytes=%.0f\n",
          t.width, d.c_str(), unique, pull, push, pull * row_bytes / 1e6,
          push * row_bytes / 1e6, unique * row_bytes);
      std::fflush(stdout);
    }
  }
  CHECK(kv.Sync(1).ok());
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_batch < 1 || FLAGS_batches < 1 || FLAGS_vocab < 2 ||
      FLAGS_zipf <= 1.0 || FLAGS_seconds <= 0) {
    LOG(FATAL) << "--batch, --batches and --seconds must be positive, "
                  "--vocab at least 2 and --zipf above 1";
  }
  ps::Start(0, argv[0]);
  if (ps::IsServer()) RunServer();
  if (ps::IsWorker()) RunWorker();
  ps::Finalize(0, true);
  return 0;
}
