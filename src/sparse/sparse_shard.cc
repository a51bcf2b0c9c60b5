// SparseShard (ps/sparse.h): the protocol of a server's sparse tables.
// A request is decoded (SparseCmd), checked whole, then applied or answered
// under the shard's mutex; answers go out after it is released. The rows
// and optimizers are SparseTable's (sparse_table.h); the place in a replica
// chain is Replicator's.
//
// Sync points: each worker pushes kSync(point) to every server once it has
// had every earlier push answered; the shard holds those pushes until every
// live worker's came, snapshots, and answers them all. A replica gets the
// copies its primary forwards and holds them the same way (the primary's
// answers to the workers wait for its answers); it snapshots only once the
// primary is down, and then answers the copies it holds to the workers
// themselves: a worker whose sync point the primary never answered resends
// it here, where it is pending, so it is released with the others, never
// before every live worker reached the point.
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kv/checkpointer.h"
#include "kv/replicator.h"
#include "kv/request_internals.h"
#include "ps/sparse.h"
#include "sparse/sparse_table.h"
#include "van/sync.h"

namespace ps {

StatusOr<SparseOptimizer> ParseSparseOptimizer(const std::string& name) {
  if (name == "sgd") return SparseOptimizer::kSgd;
  if (name == "adagrad") return SparseOptimizer::kAdagrad;
  if (name == "ftrl") return SparseOptimizer::kFtrl;
  return Status::InvalidArgument("unknown sparse optimizer '" + name +
                                 "' (expected sgd, adagrad or ftrl)");
}

StatusOr<SparseInit> ParseSparseInit(const std::string& name) {
  if (name == "zero") return SparseInit::kZero;
  if (name == "uniform") return SparseInit::kUniform;
  if (name == "normal") return SparseInit::kNormal;
  return Status::InvalidArgument("unknown sparse initializer '" + name +
                                 "' (expected zero, uniform or normal)");
}

const char* SparseOptimizerName(SparseOptimizer o) {
  switch (o) {
    case SparseOptimizer::kSgd:
      return "sgd";
    case SparseOptimizer::kAdagrad:
      return "adagrad";
    case SparseOptimizer::kFtrl:
      return "ftrl";
  }
  return "unknown";
}

const char* SparseInitName(SparseInit init) {
  switch (init) {
    case SparseInit::kZero:
      return "zero";
    case SparseInit::kUniform:
      return "uniform";
    case SparseInit::kNormal:
      return "normal";
  }
  return "unknown";
}

int SparseTableConfig::state_per_float() const {
  switch (optimizer) {
    case SparseOptimizer::kSgd:
      return 0;
    case SparseOptimizer::kAdagrad:
      return 1;
    case SparseOptimizer::kFtrl:
      return 2;
  }
  return 0;
}

Status SparseTableConfig::Validate() const {
  const std::string table = "sparse table " + std::to_string(id) + ": ";
  if (id < 0 || id >= kMaxSparseTables) {
    return Status::InvalidArgument(table + "id must be in [0, " +
                                   std::to_string(kMaxSparseTables) + ")");
  }
  if (width < 1 || width > kMaxSparseWidth) {
    return Status::InvalidArgument(table + "width " + std::to_string(width) +
                                   " is not in [1, " +
                                   std::to_string(kMaxSparseWidth) + "]");
  }
  const std::pair<const char*, float> positive[] = {
      {"lr", lr},
      {"adagrad_eps", adagrad_eps},
      {"ftrl_alpha", ftrl_alpha},
      {"ftrl_beta", ftrl_beta}};
  for (const auto& [name, v] : positive) {
    if (!(v > 0.0f) || !std::isfinite(v)) {
      return Status::InvalidArgument(table + name + " " + std::to_string(v) +
                                     " must be positive and finite");
    }
  }
  const std::pair<const char*, float> non_negative[] = {
      {"init_scale", init_scale},
      {"adagrad_init", adagrad_init},
      {"ftrl_l1", ftrl_l1},
      {"ftrl_l2", ftrl_l2}};
  for (const auto& [name, v] : non_negative) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      return Status::InvalidArgument(table + name + " " + std::to_string(v) +
                                     " must be non-negative and finite");
    }
  }
  return Status::OK();
}

namespace {
constexpr int kPointBits = 20;
constexpr int kTableBits = 8;
constexpr int kOpShift = kPointBits + kTableBits;
constexpr int kNumOps = 2;
}  // namespace

int EncodeSparseCmd(SparseOp op, int table, int arg) {
  CHECK(table >= 0 && table < kMaxSparseTables) << "table " << table;
  CHECK(arg >= 0 && arg <= kMaxSparsePoint) << "argument " << arg;
  return (static_cast<int>(op) << kOpShift) | (table << kPointBits) | arg;
}

StatusOr<SparseCmd> DecodeSparseCmd(int cmd) {
  const int op = cmd >> kOpShift;
  if (cmd < 0 || op >= kNumOps) {
    return Status::InvalidArgument("cmd " + std::to_string(cmd) +
                                   " is no sparse-table command");
  }
  SparseCmd c;
  c.op = static_cast<SparseOp>(op);
  c.table = (cmd >> kPointBits) & (kMaxSparseTables - 1);
  c.arg = cmd & kMaxSparsePoint;
  return c;
}

class SparseShard::Impl : public KVRequestHandler<float> {
 public:
  Impl(KVServer<float>* server, const std::vector<SparseTableConfig>& tables,
       const SparseShardOptions& options, SparseSnapshot snapshot)
      : server_(server),
        options_(options),
        snapshot_(std::move(snapshot)),
        replicator_(server, options.replica) {
    for (const SparseTableConfig& t : tables) {
      Status st = t.Validate();
      CHECK(st.ok()) << st;
      CHECK(configs_.emplace(t.id, t).second)
          << "sparse table " << t.id << " twice";
      MutexLock lock(&mu_);
      tables_.emplace(t.id, std::make_unique<SparseTable>(t));
    }
    replicator_.Attach(this);
  }
  ~Impl() override { replicator_.Detach(); }

  std::string Save() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return SaveLocked();
  }

  Status Load(const std::string& state) EXCLUDES(mu_) {
    std::map<int, std::unique_ptr<SparseTable>> loaded;
    Unpacker in(state);
    uint64_t count = 0;
    if (!in.Get(&count) || count != configs_.size()) {
      return Status::Corruption("the state holds " + std::to_string(count) +
                                " sparse tables, the shard " +
                                std::to_string(configs_.size()));
    }
    for (const auto& [id, config] : configs_) {
      int32_t got_id, got_width, got_opt;
      if (!in.Get(&got_id) || !in.Get(&got_width) || !in.Get(&got_opt) ||
          got_id != id || got_width != config.width ||
          got_opt != static_cast<int32_t>(config.optimizer)) {
        return Status::Corruption(
            "the state's tables are not the shard's: expected table " +
            std::to_string(id) + " of width " + std::to_string(config.width) +
            " with " + SparseOptimizerName(config.optimizer));
      }
      auto fresh = std::make_unique<SparseTable>(config);
      Status st = fresh->Load(&in);
      if (!st.ok()) {
        return Status::Corruption("sparse table " + std::to_string(id) + ": " +
                                  st.message());
      }
      loaded.emplace(id, std::move(fresh));
    }
    if (!in.done()) return Status::Corruption("trailing bytes after the rows");
    MutexLock lock(&mu_);
    tables_ = std::move(loaded);
    return Status::OK();
  }

  size_t rows(int table) const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = tables_.find(table);
    return it == tables_.end() ? 0 : it->second->size();
  }

  size_t memory_bytes(int which) const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    size_t bytes = 0;
    for (const auto& [id, table] : tables_) {
      if (which < 0 || which == id) bytes += table->memory_bytes();
    }
    return bytes;
  }

  bool Row(int table, uint64_t id, std::vector<float>* values,
           std::vector<float>* state) const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = tables_.find(table);
    if (it == tables_.end()) return false;
    const float* row = it->second->Find(SparseKeyOf(id));
    if (row == nullptr) return false;
    const size_t w = it->second->width(), s = it->second->stride();
    values->assign(row, row + w);
    if (state != nullptr) state->assign(row + w, row + s);
    return true;
  }

  std::string SyncWaitingFor() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (syncs_.empty()) return "";
    const auto& [point, sp] = *syncs_.begin();
    std::string missing;
    for (int rank = 0; rank < options_.num_workers; ++rank) {
      const int id = WorkerRankToId(rank);
      if (sp.arrived.count(id) || dead_.count(id)) continue;
      missing += (missing.empty() ? "" : ", ") + DescribeId(id);
    }
    return "sync point " + std::to_string(point) + ": waiting for " +
           (missing.empty() ? std::string("nobody") : missing);
  }

  int64_t pushes_applied() const { return pushes_applied_.load(); }
  int64_t bad_requests() const { return bad_requests_.load(); }

  bool WaitSync(int point, std::chrono::milliseconds timeout) const
      EXCLUDES(sync_mu_) {
    MutexLock lock(&sync_mu_);
    const auto deadline = CondVar::Clock::now() + timeout;
    while (synced_point_ < point && sync_cv_.WaitUntil(deadline)) {
    }
    return synced_point_ >= point;
  }

 private:
  struct SyncPoint {
    std::set<int> arrived;        // worker ids
    std::vector<KVMeta> waiting;  // held kSync pushes
  };

  void Handle(const KVMeta& meta, const KVPairs<float>& data) override
      EXCLUDES(mu_) {
    if (options_.replica && meta.shard >= 0) {
      MutexLock lock(&mu_);
      held_rank_ = meta.shard;
    }
    StatusOr<SparseCmd> cmd = DecodeSparseCmd(meta.cmd);
    if (!cmd.ok()) return Refuse(meta, cmd.status());
    if (cmd->op == SparseOp::kSync) {
      if (!meta.push || meta.pull) {
        return Refuse(meta, Status::InvalidArgument("a sync point is a push"));
      }
      return OnSync(meta, cmd->arg);
    }
    if (meta.push && meta.pull) {
      return Refuse(meta, Status::InvalidArgument(
                              "a sparse table takes a push or a pull, "
                              "not both at once"));
    }
    KVPairs<float> res;
    Status st = Serve(meta, *cmd, data, &res);
    if (!st.ok()) return Refuse(meta, st);
    server_->Response(meta, res);
  }

  // One push (applied) or pull (its rows into *res), checked whole first.
  Status Serve(const KVMeta& meta, const SparseCmd& cmd,
               const KVPairs<float>& data, KVPairs<float>* res) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = tables_.find(cmd.table);
    if (it == tables_.end()) {
      return Status::InvalidArgument(
          "no sparse table " + std::to_string(cmd.table) + " on this server");
    }
    SparseTable& table = *it->second;
    const size_t n = data.keys.size(), w = table.width();
    if (cmd.arg != 0 && static_cast<size_t>(cmd.arg) != w) {
      return Status::InvalidArgument(
          "sparse table " + std::to_string(cmd.table) +
          ": the worker's rows "
          "are " +
          std::to_string(cmd.arg) + " floats wide, this server's " +
          std::to_string(w));
    }
    if (meta.push) {
      PS_RETURN_IF_ERROR(CheckPush(cmd.table, table, data));
      // Every row first (made when new), so that a full table refuses the
      // push before any row is updated.
      std::vector<float*> rows(n);
      for (size_t i = 0; i < n; ++i) {
        rows[i] = table.FindOrMake(data.keys[i]);
        if (rows[i] == nullptr) {
          return Status::Aborted(
              "sparse table " + std::to_string(cmd.table) + " holds " +
              std::to_string(table.size()) +
              " rows and can make no more (full or out of memory)");
        }
      }
      const float* g = data.vals.data();
      for (size_t i = 0; i < n; ++i) table.Apply(rows[i], g + i * w);
      ++pushes_applied_;
      return Status::OK();
    }
    if (!data.vals.empty() || !data.lens.empty()) {
      return Status::InvalidArgument("sparse table " +
                                     std::to_string(cmd.table) +
                                     ": a pull carries no values");
    }
    if (n * w * sizeof(float) >
        static_cast<uint64_t>(options_.max_pull_bytes)) {
      return Status::InvalidArgument(
          "sparse table " + std::to_string(cmd.table) + ": a pull of " +
          std::to_string(n) + " rows of width " + std::to_string(w) +
          " would answer " + std::to_string(n * w * sizeof(float)) +
          " bytes, above max_pull_bytes " +
          std::to_string(options_.max_pull_bytes));
    }
    res->keys = data.keys;
    res->vals.resize(n * w);
    float* out = res->vals.data();
    for (size_t i = 0; i < n; ++i) table.Read(data.keys[i], out + i * w);
    return Status::OK();
  }

  Status CheckPush(int id, const SparseTable& table,
                   const KVPairs<float>& data) const {
    const size_t n = data.keys.size(), w = table.width();
    if (!data.lens.empty() || data.vals.size() != n * w) {
      return Status::InvalidArgument(
          "sparse table " + std::to_string(id) + ": a push of " +
          std::to_string(n) + " rows of width " + std::to_string(w) +
          " carries " + std::to_string(data.vals.size()) + " floats" +
          (data.lens.empty() ? "" : " with per-key lengths"));
    }
    if (options_.allow_non_finite) return Status::OK();
    const float* g = data.vals.data();
    for (size_t i = 0; i < n * w; ++i) {
      if (!std::isfinite(g[i])) {
        return Status::InvalidArgument(
            "sparse table " + std::to_string(id) + ": gradient " +
            std::to_string(g[i]) + " at value " + std::to_string(i % w) +
            " of the row of key " + std::to_string(data.keys[i / w]) +
            " is not finite");
      }
    }
    return Status::OK();
  }

  void Refuse(const KVMeta& meta, const Status& why) {
    ++bad_requests_;
    LOG_EVERY_N(WARNING, 100) << "sparse shard: refused a request of "
                              << DescribeId(meta.sender) << ": " << why;
    server_->ResponseError(meta, why);
  }

  void OnSync(const KVMeta& meta, int point) EXCLUDES(mu_) {
    std::vector<Completed> done;
    {
      MutexLock lock(&mu_);
      if (point <= last_point_) {
        done.push_back({point, false, {}, {meta}, true});  // a resent one
      } else {
        SyncPoint& sp = syncs_[point];
        sp.arrived.insert(meta.sender);
        sp.waiting.push_back(meta);
        CompleteSyncs(&done);
      }
    }
    Finish(done);
  }

  // A sync point every live worker reached: its snapshot (taken under the
  // lock, delivered after it) and the held pushes to answer then.
  struct Completed {
    int point;
    bool snapshot;
    std::string state;
    std::vector<KVMeta> answer;
    bool resent = false;  // only an answer to a point completed before
  };

  // Completes the sync points every live worker reached, in order.
  void CompleteSyncs(std::vector<Completed>* done) REQUIRES(mu_) {
    while (!syncs_.empty()) {
      auto it = syncs_.begin();
      size_t live_arrived = 0;
      for (int id : it->second.arrived) live_arrived += dead_.count(id) == 0;
      const size_t live =
          static_cast<size_t>(options_.num_workers) - dead_.size();
      if (live_arrived < live) return;
      Completed c{it->first, false, {}, {}, false};
      if (snapshot_ && (!options_.replica || HeldRankDown())) {
        c.snapshot = true;
        c.state = SaveLocked();
      }
      for (KVMeta m : it->second.waiting) {
        // A copy its primary forwarded, now that the primary is gone: the
        // answer goes to the worker itself (whose resend of it this shard
        // holds as pending).
        if (HeldRankDown()) {
          detail::RequestInternals::Change(
              &m, [](detail::RequestInternals* in) { in->reply_to = -1; });
        }
        c.answer.push_back(m);
      }
      syncs_.erase(it);
      last_point_ = c.point;
      done->push_back(std::move(c));
    }
  }

  // Outside the lock (no callback runs under it): each completed point's
  // snapshot callback, then its answers, then WaitSync's waiters; so a
  // worker passes a sync point, and WaitSync returns, only once the
  // snapshot was delivered.
  void Finish(const std::vector<Completed>& done) EXCLUDES(mu_, sync_mu_) {
    for (const Completed& c : done) {
      if (c.snapshot) snapshot_(c.point, c.state);
      for (const KVMeta& m : c.answer) server_->Response(m);
      if (c.resent) continue;
      {
        MutexLock sync_lock(&sync_mu_);
        synced_point_ = std::max(synced_point_, c.point);
      }
      sync_cv_.SignalAll();
    }
  }

  bool HeldRankDown() const REQUIRES(mu_) {
    return options_.replica && replicator_.ServerDown(held_rank_);
  }

  void OnFailure(int id, const Status& why) override EXCLUDES(mu_) {
    std::vector<Completed> done;
    {
      MutexLock lock(&mu_);
      if (!IsWorkerId(id) || why.code() == Status::kUnavailable) return;
      if (!dead_.insert(id).second) return;
      LOG(WARNING) << "sparse shard: sync points go on without "
                   << DescribeId(id) << ": " << why;
      for (auto& [point, sp] : syncs_) {
        auto& w = sp.waiting;
        w.erase(
            std::remove_if(w.begin(), w.end(),
                           [id](const KVMeta& m) { return m.sender == id; }),
            w.end());
      }
      CompleteSyncs(&done);
    }
    Finish(done);
  }

  std::string SaveLocked() const REQUIRES(mu_) {
    Packer out;
    size_t bytes = 8;
    for (const auto& [id, t] : tables_) {
      bytes += 20 + t->size() * (8 + t->stride() * sizeof(float));
    }
    out.Reserve(bytes);
    out.Put<uint64_t>(tables_.size());
    for (const auto& [id, table] : tables_) {
      out.Put<int32_t>(id);
      out.Put<int32_t>(table->config().width);
      out.Put<int32_t>(static_cast<int32_t>(table->config().optimizer));
      table->Save(&out);
    }
    return out.Take();
  }

  KVServer<float>* const server_;
  const SparseShardOptions options_;
  const SparseSnapshot snapshot_;
  Replicator<float> replicator_;
  std::map<int, SparseTableConfig> configs_;  // by id; set once

  mutable Mutex mu_;
  std::map<int, std::unique_ptr<SparseTable>> tables_ GUARDED_BY(mu_);
  std::map<int, SyncPoint> syncs_ GUARDED_BY(mu_);
  int last_point_ GUARDED_BY(mu_) = -1;
  std::set<int> dead_ GUARDED_BY(mu_);  // workers lost for good
  // A replica's primary (KVMeta::shard of the requests it gets); whether it
  // is down, the node's routes say (Replicator::ServerDown).
  int held_rank_ GUARDED_BY(mu_) = -1;

  mutable Mutex sync_mu_;
  mutable CondVar sync_cv_{&sync_mu_};
  int synced_point_ GUARDED_BY(sync_mu_) = -1;

  std::atomic<int64_t> pushes_applied_{0};
  std::atomic<int64_t> bad_requests_{0};
};

SparseShard::SparseShard(KVServer<float>* server,
                         const std::vector<SparseTableConfig>& tables,
                         const SparseShardOptions& options,
                         SparseSnapshot snapshot)
    : impl_(std::make_unique<Impl>(server, tables, options,
                                   std::move(snapshot))) {}
SparseShard::~SparseShard() = default;
std::string SparseShard::Save() const { return impl_->Save(); }
Status SparseShard::Load(const std::string& state) {
  return impl_->Load(state);
}
size_t SparseShard::rows(int table) const { return impl_->rows(table); }
size_t SparseShard::memory_bytes(int table) const {
  return impl_->memory_bytes(table);
}
bool SparseShard::Row(int table, uint64_t id, std::vector<float>* values,
                      std::vector<float>* state) const {
  return impl_->Row(table, id, values, state);
}
std::string SparseShard::SyncWaitingFor() const {
  return impl_->SyncWaitingFor();
}
int64_t SparseShard::pushes_applied() const { return impl_->pushes_applied(); }
int64_t SparseShard::bad_requests() const { return impl_->bad_requests(); }
bool SparseShard::WaitSync(int point, std::chrono::milliseconds timeout) const {
  return impl_->WaitSync(point, timeout);
}

}  // namespace ps
