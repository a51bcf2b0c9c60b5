// kv_bench: times Push+Wait and Pull+Wait through ps for dense float models
// (1K, 100K, 1.2M = the ConvNet, 10M floats) in two key layouts, plus the
// one-key one-float Push+Wait round trip. One program for every role; run it
// through tracker/launch.py. Each worker prints machine-readable lines
// ("kv ...") that bench/kv/run.py turns into the table of ratios against
// raw_zmq_bench. MB/s counts payload (value) bytes only, 1 MB = 1e6 bytes.
//
// Layouts: "tensor" is one key per ConvNet tensor (8 keys; other sizes scale
// the tensor sizes proportionally, at least 1 float each, the rounding
// difference going to the largest); "chunk" cuts the flat vector into keys
// of --chunk floats (64K by default; the last key takes the rest).
//
// Servers answer pushes without touching the values (unless --server_add)
// and answer pulls zero-copy from their shard, so the numbers measure the
// framework's path, not an optimizer. A kAssign push is stored, so each
// cell first assigns known values and checks what it pulls back.
//
// --shm_sizes adds a shared-memory comparison (chunk layout, after the other
// cells): the same pushes and presized pulls from and into
// ps::SharedArray<float> and from and into ordinary SArrays, in alternating
// blocks of rounds so both see the same load. Since the servers never read a
// plain push, a shared one moves no payload at all; "push_add" therefore also
// times pushes the server adds into its shard, reading every pushed float.
// The worker's shared-frame counters are printed and checked, so a run in
// which the references were not taken aborts instead of reporting socket
// numbers as shared ones.
//
// Each worker also prints "kv security sealed=1" when its job seals every
// frame (a job key, as tracker/launch.py gives unless --insecure), else
// "sealed=0", so run.py's cost-of-encryption section can check each run.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ps/ps.h"

DEFINE_double(seconds, 0.5, "measured time per cell and op, after warm-up");
DEFINE_string(sizes, "1000,100000,1199882,10000000",
              "model sizes in floats, comma-separated");
DEFINE_int32(chunk, 65536, "floats per key in the chunk layout");
DEFINE_string(layouts, "tensor,chunk",
              "key layouts timed for each of --sizes: tensor, chunk or both");
DEFINE_int32(rtt_rounds, 2000,
             "one-float Push+Wait round trips measured (0: none)");
DEFINE_bool(server_add, false,
            "servers add pushed values into their shard (kAdd) instead of "
            "only answering");
DEFINE_string(shm_sizes, "",
              "model sizes in floats (chunk layout) for the shared-memory "
              "comparison, comma-separated; empty: none");

namespace {

using Clock = std::chrono::steady_clock;

// conv1 w/b, conv2 w/b, fc1 w/b, fc2 w/b: 1,199,882 floats.
constexpr int kConvNetTensors[] = {288, 32, 18432, 64, 1179648, 128, 1280, 10};
constexpr size_t kConvNetFloats = 1199882;
constexpr ps::Key kKeyStride = ps::Key{1} << 24;  // keys of one cell
constexpr int kWarmupRounds = 3;
constexpr int kMinRounds = 5;
// The shared-memory comparison's timed rounds per block of one memory, and
// their bound however fast they get.
constexpr int kBlockRounds = 5;
constexpr size_t kMaxRounds = 100000;
// Bench-private push command: the server adds the values into its shard
// whatever --server_add says (kAdd, the default command, is only answered).
constexpr int kBenchAdd = 100;

// One model size in one key layout, with its own key range.
struct Cell {
  size_t floats = 0;
  std::string layout;
  ps::Key first_key = 0;
  std::vector<int> lens;        // floats per key
  std::vector<size_t> offsets;  // of each key in the flat vector
  bool shm = false;             // the shared-memory comparison's cell
};

std::vector<int> TensorLens(size_t floats) {
  std::vector<int> lens;
  long long sum = 0;
  for (int t : kConvNetTensors) {
    double scaled = static_cast<double>(t) * floats / kConvNetFloats;
    lens.push_back(std::max(1, static_cast<int>(std::llround(scaled))));
    sum += lens.back();
  }
  auto largest = std::max_element(lens.begin(), lens.end());
  *largest += static_cast<int>(static_cast<long long>(floats) - sum);
  CHECK_GT(*largest, 0) << "model of " << floats << " floats is too small";
  return lens;
}

std::vector<int> ChunkLens(size_t floats, int chunk) {
  std::vector<int> lens;
  for (size_t left = floats; left > 0; left -= lens.back())
    lens.push_back(static_cast<int>(std::min<size_t>(left, chunk)));
  return lens;
}

Cell MakeCell(size_t floats, const std::string& layout, std::vector<int> lens,
              size_t index) {
  Cell cell;
  cell.floats = floats;
  cell.layout = layout;
  cell.first_key = index * kKeyStride;
  cell.lens = std::move(lens);
  CHECK_LT(cell.lens.size(), kKeyStride);
  size_t offset = 0;
  for (int len : cell.lens) {
    cell.offsets.push_back(offset);
    offset += len;
  }
  CHECK_EQ(offset, floats);
  return cell;
}

std::vector<size_t> ParseSizes(const std::string& flag,
                               const std::string& name) {
  std::vector<size_t> out;
  std::stringstream sizes(flag);
  for (std::string item; std::getline(sizes, item, ',');) {
    size_t floats = std::stoull(item);
    if (floats < 8) LOG(FATAL) << name << ": " << floats << " is below 8";
    out.push_back(floats);
  }
  return out;
}

// Every cell, then the shared-memory cells, then (last) the one-float
// round-trip cell. Identical on every node, so servers know the layout of
// what they are sent.
std::vector<Cell> MakeCells() {
  std::vector<Cell> cells;
  const std::string layouts = "," + FLAGS_layouts + ",";
  const bool tensor = layouts.find(",tensor,") != std::string::npos;
  const bool chunk = layouts.find(",chunk,") != std::string::npos;
  if (!tensor && !chunk) {
    LOG(FATAL) << "--layouts='" << FLAGS_layouts
               << "' names neither tensor nor chunk";
  }
  for (size_t floats : ParseSizes(FLAGS_sizes, "--sizes")) {
    if (tensor) {
      cells.push_back(
          MakeCell(floats, "tensor", TensorLens(floats), cells.size()));
    }
    if (chunk) {
      cells.push_back(MakeCell(floats, "chunk", ChunkLens(floats, FLAGS_chunk),
                               cells.size()));
    }
  }
  for (size_t floats : ParseSizes(FLAGS_shm_sizes, "--shm_sizes")) {
    cells.push_back(MakeCell(floats, "chunk", ChunkLens(floats, FLAGS_chunk),
                             cells.size()));
    cells.back().shm = true;
  }
  cells.push_back(MakeCell(1, "rtt", {1}, cells.size()));
  return cells;
}

// The servers' request handler: one full-size buffer per cell, of which a
// server only touches the keys it owns. Runs on the receive thread only.
class ShardHandler {
 public:
  explicit ShardHandler(const std::vector<Cell>& cells) : cells_(cells) {
    for (const Cell& cell : cells_) {
      shards_.emplace_back(cell.floats, 0.0f);
      lens_.emplace_back(cell.lens);
    }
  }

  void operator()(const ps::KVMeta& req, const ps::KVPairs<float>& data,
                  ps::KVServer<float>* server) {
    size_t c = data.keys[0] / kKeyStride;
    CHECK_LT(c, cells_.size());
    size_t first = data.keys[0] - cells_[c].first_key;
    size_t n = data.keys.size();
    CHECK_EQ(data.keys[n - 1] - data.keys[0], n - 1) << "keys not contiguous";
    size_t begin = cells_[c].offsets[first];
    size_t end = begin;
    for (size_t i = first; i < first + n; ++i) end += cells_[c].lens[i];
    ps::KVPairs<float> res;
    if (req.push) {
      CHECK_EQ(data.vals.size(), end - begin);
      float* dst = shards_[c].data() + begin;
      if (req.cmd == ps::kAssign) {
        std::copy(data.vals.begin(), data.vals.end(), dst);
      } else if (FLAGS_server_add || req.cmd == kBenchAdd) {
        for (size_t i = 0; i < data.vals.size(); ++i) dst[i] += data.vals[i];
      }
    }
    if (req.pull) {
      res.keys = data.keys;
      res.lens = lens_[c].segment(first, first + n);
      res.vals = shards_[c].segment(begin, end);
    }
    server->Response(req, res);
  }

 private:
  const std::vector<Cell>& cells_;
  std::vector<ps::SArray<float>> shards_;
  std::vector<ps::SArray<int>> lens_;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<double> Sorted(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v;
}

void CheckOk(const ps::Status& status, const char* what) {
  if (!status.ok()) LOG(FATAL) << what << ": " << status.ToString();
}

// Times `op` (one request + Wait): warm-up, then rounds until --seconds.
template <typename Op>
std::vector<double> TimeRounds(Op op, int min_rounds, double seconds) {
  for (int i = 0; i < kWarmupRounds; ++i) op();
  std::vector<double> rounds;
  Clock::time_point start = Clock::now();
  while (rounds.size() < static_cast<size_t>(min_rounds) ||
         Seconds(start, Clock::now()) < seconds) {
    Clock::time_point t0 = Clock::now();
    op();
    rounds.push_back(Seconds(t0, Clock::now()));
  }
  return Sorted(rounds);
}

void PrintPlacement(const Cell& cell, const std::vector<ps::Key>& keys,
                    const ps::Placement& placement) {
  std::vector<size_t> cut = placement.Slice(keys.data(), keys.size());
  for (int s = 0; s < placement.num_servers(); ++s) {
    size_t floats = 0;
    for (size_t i = cut[s]; i < cut[s + 1]; ++i) floats += cell.lens[i];
    std::printf("kv split floats=%zu layout=%s server=%d keys=%zu bytes=%zu\n",
                cell.floats, cell.layout.c_str(), s, cut[s + 1] - cut[s],
                floats * sizeof(float));
  }
  std::istringstream lines(placement.Describe());
  for (std::string line; std::getline(lines, line);)
    std::printf("kv placement floats=%zu layout=%s | %s\n", cell.floats,
                cell.layout.c_str(), line.c_str());
}

// Sets the cell's byte-balanced placement; returns the cell's keys.
ps::SArray<ps::Key> UsePlacement(const Cell& cell, ps::KVWorker<float>* kv,
                                 bool print) {
  std::vector<ps::Key> keys;
  std::vector<uint64_t> bytes;
  for (size_t i = 0; i < cell.lens.size(); ++i) {
    keys.push_back(cell.first_key + i);
    bytes.push_back(cell.lens[i] * sizeof(float));
  }
  ps::StatusOr<ps::Placement> placement =
      ps::Placement::ByBytes(keys, bytes, ps::NumServers());
  CheckOk(placement.status(), "Placement::ByBytes");
  if (print) PrintPlacement(cell, keys, *placement);
  kv->SetPlacement(*placement);
  return ps::SArray<ps::Key>(keys);
}

void RunCell(const Cell& cell, ps::KVWorker<float>* kv) {
  ps::SArray<ps::Key> keys = UsePlacement(cell, kv, ps::MyRank() == 0);
  ps::SArray<int> lens(cell.lens);
  ps::SArray<float> vals(cell.floats);
  for (size_t i = 0; i < cell.floats; ++i) vals[i] = static_cast<float>(i);
  CheckOk(kv->Wait(kv->ZPush(keys, vals, lens, ps::kAssign)), "assign");
  // "pull": into an empty SArray each round (zero-copy when one server
  // answers); "pull_into": into a presized buffer, filled in place.
  ps::SArray<float> pulled, pulled_into(cell.floats, -1.0f);
  ps::SArray<int> pulled_lens;
  auto push = [&] { CheckOk(kv->Wait(kv->ZPush(keys, vals, lens)), "push"); };
  auto pull = [&] {
    pulled.clear();
    pulled_lens.clear();
    CheckOk(kv->Wait(kv->ZPull(keys, &pulled, &pulled_lens)), "pull");
  };
  auto pull_into = [&] {
    CheckOk(kv->Wait(kv->ZPull(keys, &pulled_into)), "pull_into");
  };
  ps::Barrier(0, ps::kWorkerGroup);  // Workers push at once.
  std::vector<double> push_s = TimeRounds(push, kMinRounds, FLAGS_seconds);
  ps::Barrier(0, ps::kWorkerGroup);
  std::vector<double> pull_s = TimeRounds(pull, kMinRounds, FLAGS_seconds);
  ps::Barrier(0, ps::kWorkerGroup);
  std::vector<double> pull_into_s =
      TimeRounds(pull_into, kMinRounds, FLAGS_seconds);
  // Without --server_add the shard still holds the assigned values.
  CHECK_EQ(pulled.size(), cell.floats);
  CHECK_EQ(pulled_into.size(), cell.floats);
  CHECK_EQ(pulled_lens.size(), cell.lens.size());
  if (!FLAGS_server_add) {
    for (size_t i = 0; i < cell.floats; ++i) {
      CHECK_EQ(pulled[i], static_cast<float>(i)) << "pulled value " << i;
      CHECK_EQ(pulled_into[i], static_cast<float>(i)) << "pulled value " << i;
    }
  }
  double bytes = cell.floats * sizeof(float);
  for (auto [op, s] :
       {std::make_pair("push", &push_s), std::make_pair("pull", &pull_s),
        std::make_pair("pull_into", &pull_into_s)}) {
    double median = (*s)[s->size() / 2];
    std::printf(
        "kv cell floats=%zu layout=%s keys=%zu op=%s rounds=%zu "
        "median_ms=%.4f mbps=%.1f\n",
        cell.floats, cell.layout.c_str(), cell.lens.size(), op, s->size(),
        median * 1e3, bytes / median / 1e6);
  }
  std::fflush(stdout);
}

// Shared frames the worker's node sent and received.
struct Frames {
  uint64_t sent = 0;
  uint64_t received = 0;
};

Frames CountFrames() {
  const ps::Node* node = ps::DefaultNode();
  return {node->num_shared_frames_sent(), node->num_shared_frames_received()};
}

// The times of one op in both memories and the shared frames each caused.
struct Paired {
  std::vector<double> ordinary, shared;
  Frames ordinary_frames, shared_frames;
};

// Times `ordinary` and `shared` (one request + Wait each) in alternating
// blocks of kBlockRounds, so both see the same load over the run; the one
// going first swaps every block. Each block starts with an untimed round:
// a 40 MB socket round leaves work behind (freeing the received message)
// that would otherwise be charged to the first shared round after it. Then
// blocks until --seconds, at most kMaxRounds. Counts the shared frames
// around each timed call.
Paired TimeAlternated(const std::function<void()>& ordinary,
                      const std::function<void()>& shared) {
  Paired out;
  auto call = [](const std::function<void()>& op, std::vector<double>* times,
                 Frames* frames) {
    Frames before = CountFrames();
    Clock::time_point t0 = Clock::now();
    op();
    Clock::time_point t1 = Clock::now();
    Frames after = CountFrames();
    if (times == nullptr) return;  // untimed, not counted
    times->push_back(Seconds(t0, t1));
    frames->sent += after.sent - before.sent;
    frames->received += after.received - before.received;
  };
  auto block = [&](const std::function<void()>& op, std::vector<double>* times,
                   Frames* frames) {
    call(op, nullptr, nullptr);
    for (int i = 0; i < kBlockRounds; ++i) call(op, times, frames);
  };
  for (int i = 0; i < kWarmupRounds; ++i) {
    call(ordinary, nullptr, nullptr);
    call(shared, nullptr, nullptr);
  }
  Clock::time_point start = Clock::now();
  for (bool shared_first = false;
       out.shared.size() < kMaxRounds &&
       (out.shared.size() < static_cast<size_t>(kMinRounds) ||
        Seconds(start, Clock::now()) < FLAGS_seconds);
       shared_first = !shared_first) {
    if (shared_first) block(shared, &out.shared, &out.shared_frames);
    block(ordinary, &out.ordinary, &out.ordinary_frames);
    if (!shared_first) block(shared, &out.shared, &out.shared_frames);
  }
  out.ordinary = Sorted(out.ordinary);
  out.shared = Sorted(out.shared);
  return out;
}

void PrintShared(const Cell& cell, const char* op, const char* memory,
                 const std::vector<double>& s, const Frames& frames) {
  double median = s[s.size() / 2];
  std::printf(
      "kv shm floats=%zu layout=%s keys=%zu memory=%s op=%s rounds=%zu "
      "median_ms=%.4f mbps=%.1f frames_sent=%" PRIu64
      " frames_received=%" PRIu64 "\n",
      cell.floats, cell.layout.c_str(), cell.lens.size(), memory, op, s.size(),
      median * 1e3, cell.floats * sizeof(float) / median / 1e6, frames.sent,
      frames.received);
}

// Push, push_add and a presized pull, from and into ps::SharedArray<float>
// and ordinary SArrays; prints one "kv shm" line per op and memory. Aborts
// when the shared rounds sent or received no frame by reference, or the
// ordinary ones did.
void RunSharedCell(const Cell& cell, ps::KVWorker<float>* kv) {
  ps::SArray<ps::Key> keys = UsePlacement(cell, kv, false);
  ps::SArray<int> lens(cell.lens);
  ps::SArray<float> vals(cell.floats);
  ps::SArray<float> shared_vals = ps::SharedArray<float>(cell.floats);
  for (size_t i = 0; i < cell.floats; ++i) {
    vals[i] = static_cast<float>(i);
    shared_vals[i] = static_cast<float>(i);
  }
  ps::SArray<float> into(cell.floats, -1.0f);
  ps::SArray<float> shared_into = ps::SharedArray<float>(cell.floats);
  std::fill(shared_into.begin(), shared_into.end(), -1.0f);
  const float* shared_dst = shared_into.data();
  using Op = std::function<void()>;
  auto push = [&](const ps::SArray<float>& v, int cmd) -> Op {
    return [&, v, cmd] {
      CheckOk(kv->Wait(kv->ZPush(keys, v, lens, cmd)), "push");
    };
  };
  auto pull_into = [&](ps::SArray<float>* dst) -> Op {
    return [&, dst] { CheckOk(kv->Wait(kv->ZPull(keys, dst)), "pull_into"); };
  };
  ps::Barrier(0, ps::kWorkerGroup);
  Paired pushed =
      TimeAlternated(push(vals, ps::kAdd), push(shared_vals, ps::kAdd));
  Paired added =
      TimeAlternated(push(vals, kBenchAdd), push(shared_vals, kBenchAdd));
  // Assigned from shared memory, so the pulls below also check that the
  // server read the worker's values right where the worker wrote them.
  CheckOk(kv->Wait(kv->ZPush(keys, shared_vals, lens, ps::kAssign)), "assign");
  Paired pulled = TimeAlternated(pull_into(&into), pull_into(&shared_into));
  CHECK_EQ(into.size(), cell.floats);
  CHECK_EQ(shared_into.size(), cell.floats);
  // ZPull fills a presized array in place; a fresh one would not be shared.
  CHECK_EQ(shared_into.data(), shared_dst);
  for (size_t i = 0; i < cell.floats; ++i) {
    CHECK_EQ(into[i], static_cast<float>(i)) << "pulled value " << i;
    CHECK_EQ(shared_into[i], static_cast<float>(i)) << "pulled value " << i;
  }
  for (auto [op, p] :
       {std::make_pair("push", &pushed), std::make_pair("push_add", &added),
        std::make_pair("pull_into", &pulled)}) {
    PrintShared(cell, op, "ordinary", p->ordinary, p->ordinary_frames);
    PrintShared(cell, op, "shared", p->shared, p->shared_frames);
  }
  std::fflush(stdout);
  // A push's values go by reference; a pull's answer comes back as one.
  for (const Paired* p : {&pushed, &added}) {
    CHECK_GT(p->shared_frames.sent, 0u)
        << cell.floats << " floats: no push from ps::SharedArray went by "
        << "reference (is the server on another host or user?)";
  }
  CHECK_GT(pulled.shared_frames.received, 0u)
      << cell.floats << " floats: no pull into ps::SharedArray was answered "
      << "by reference";
  for (const Paired* p : {&pushed, &added, &pulled}) {
    CHECK_EQ(p->ordinary_frames.sent + p->ordinary_frames.received, 0u)
        << "ordinary SArrays went by reference";
  }
}

void RunRoundTrip(const Cell& cell, ps::KVWorker<float>* kv) {
  if (FLAGS_rtt_rounds == 0) return;  // asked for none
  ps::SArray<ps::Key> keys = UsePlacement(cell, kv, false);
  ps::SArray<float> one(1, 1.0f);
  auto push = [&] { CheckOk(kv->Wait(kv->ZPush(keys, one)), "push"); };
  ps::Barrier(0, ps::kWorkerGroup);
  const ps::Node* node = ps::DefaultNode();
  const uint64_t before =
      node->num_messages_sent() + node->num_messages_received();
  std::vector<double> s = TimeRounds(push, FLAGS_rtt_rounds, 0.0);
  // This worker's messages of every kind (its heartbeats too), a round.
  const double messages =
      static_cast<double>(node->num_messages_sent() +
                          node->num_messages_received() - before) /
      static_cast<double>(s.size() + kWarmupRounds);
  size_t p99 = std::max<size_t>((s.size() * 99 + 99) / 100, 1) - 1;
  std::printf(
      "kv rtt rounds=%zu median_us=%.1f p99_us=%.1f messages_per_round=%.2f\n",
      s.size(), s[s.size() / 2] * 1e6, s[p99] * 1e6, messages);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "python3 tracker/launch.py -s S -w W -- kv_bench [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_chunk < 1)
    LOG(FATAL) << "--chunk must be >= 1, got " << FLAGS_chunk;
  if (FLAGS_rtt_rounds < 0)
    LOG(FATAL) << "--rtt_rounds must be >= 0, got " << FLAGS_rtt_rounds;
  std::vector<Cell> cells = MakeCells();

  // The handle is registered before the barrier that lets workers send, so
  // no request ever waits for it.
  ps::StartAsync(0, argv[0]);
  std::unique_ptr<ps::KVServer<float>> server;
  if (ps::IsServer()) {
    server = std::make_unique<ps::KVServer<float>>(0);
    server->set_request_handle(ShardHandler(cells));
  }
  ps::Barrier(0, ps::kAllGroups);
  if (ps::IsWorker()) {
    // Whether this job seals its frames (a job key), so a comparison of the
    // two can check which one it measured.
    std::printf("kv security sealed=%d\n",
                ps::DefaultNode()->config().key_file.empty() ? 0 : 1);
    ps::KVWorker<float> kv(0, 0);
    bool shared = false;
    for (size_t c = 0; c + 1 < cells.size(); ++c) {
      if (!cells[c].shm) {
        RunCell(cells[c], &kv);
      } else if (ps::DefaultNode()->config().shm) {
        RunSharedCell(cells[c], &kv);
        shared = true;
      } else {
        std::printf("kv shm floats=%zu skipped=PS_SHM=0\n", cells[c].floats);
      }
    }
    if (shared) {  // The node's own counters, warm-up rounds included.
      Frames total = CountFrames();
      std::printf("kv shm_total frames_sent=%" PRIu64
                  " frames_received=%" PRIu64 "\n",
                  total.sent, total.received);
    }
    RunRoundTrip(cells.back(), &kv);
  }
  ps::Finalize(0, true);
  return 0;
}
