// Sparse tables: rows of a fixed width keyed by any 64-bit id, the
// embedding tables and linear weights of click-through, recommendation and
// text models. A step touches a few thousand rows of tables with millions:
// workers pull the rows of a batch's unique ids and push their gradients,
// and each server applies an optimizer to the rows it holds, row by row.
//
// Rows: a table (SparseTableConfig) has an id, a width and an initializer.
// A row is made on its id's first push, with initial values that are a pure
// function of (seed, table, id), so every server, replica and restored
// shard makes the same row; a pull of an id not held yet returns those
// values without making the row (reading unseen ids costs no memory, and a
// replica, which gets the pushes only, holds exactly its primary's rows). Ids
// are spread over the servers by SparseKeyOf, a bijection of the 64-bit ids (no
// two ids share a key), so consecutive or skewed ids still balance over the
// servers' even key ranges.
//
// Optimizers, per row and lazily (a row untouched by a push is not
// updated; no step decays it):
//   sgd      w -= lr * g
//   adagrad  h += g^2; w -= lr * g / (sqrt(h) + eps), h starting at
//            adagrad_init (Duchi et al. 2011)
//   ftrl     FTRL-Proximal (McMahan et al., KDD 2013, Algorithm 1), per
//            coordinate: sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;
//            z += g - sigma * w; n += g^2; w = 0 if |z| <= l1, else
//            -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2). With l1 > 0
//            a weight whose |z| stays under l1 is exactly zero. A row made
//            with a non-zero initializer starts with the z that gives it.
// g is the gradient of one push: a worker's sum over its batch (duplicate
// ids summed; the worker scales it as its loss says). Pushes are applied as
// they arrive (asynchronous, as sparse training runs), each exactly once
// (the KV layer drops resent duplicates).
//
// Wire: a request names one table. Its keys are SparseKeyOf(id) of the
// batch's unique ids (sorted, as the KV layer requires), its values the rows
// (width floats each, in key order); cmd = EncodeSparseCmd. A pull of n keys
// is answered with n rows; a push of n keys carries n gradient rows and is
// answered once applied. kSync (a push of any one key to every server)
// is a sync point: see SparseWorker::Sync.
//
// Refusals: an unknown table, a width other than the table's, values that
// are not n * width floats, a non-finite gradient (unless
// allow_non_finite), a pull whose answer would pass max_pull_bytes or a bad
// cmd are answered with an InvalidArgument naming the table and the value,
// and a push that would make more rows than the table can hold (or memory
// allows) with Aborted; nothing of the request is applied.
//
// Checkpoints and replicas, as a DenseShard has them: Save and Load give
// and take a shard's whole state (every row with its optimizer state); a
// shard calls its snapshot callback at a sync point that every live worker
// reached, where no push of any worker is in flight. With PS_REPLICAS=1 a
// server also holds its primary's rows (a shard made with `replica`): the KV
// layer forwards each push to it before the worker's answer, so it applies
// the same pushes in the same order and holds the same rows bit for bit;
// when the primary dies it serves its workers, and it snapshots the primary's
// rows (as the primary would) only then.
//
// Thread-safety: a SparseShard's requests run on its server's receive
// thread; its accessors may be called from any thread (they take the shard's
// mutex); Save only while no request is in flight. A SparseWorker may be
// used from any number of threads at once, as KVWorker.
#ifndef PS_SPARSE_H_
#define PS_SPARSE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/kv_app.h"
#include "ps/sarray.h"
#include "ps/status.h"

namespace ps {

enum class SparseOptimizer { kSgd, kAdagrad, kFtrl };
enum class SparseInit { kZero, kUniform, kNormal };

// "sgd", "adagrad", "ftrl"; "zero", "uniform", "normal". InvalidArgument
// naming the value otherwise.
StatusOr<SparseOptimizer> ParseSparseOptimizer(const std::string& name);
StatusOr<SparseInit> ParseSparseInit(const std::string& name);
const char* SparseOptimizerName(SparseOptimizer o);
const char* SparseInitName(SparseInit init);

constexpr int kMaxSparseTables = 256;  // table ids [0, 256)
constexpr int kMaxSparseWidth = 1 << 16;

struct SparseTableConfig {
  int id = 0;     // [0, kMaxSparseTables)
  int width = 1;  // floats per row, [1, kMaxSparseWidth]
  SparseInit init = SparseInit::kZero;
  float init_scale = 0.01f;  // uniform: [-scale, scale); normal: stddev
  uint64_t seed = 0;
  SparseOptimizer optimizer = SparseOptimizer::kAdagrad;
  float lr = 0.05f;           // sgd, adagrad
  float adagrad_init = 0.1f;  // h's start
  float adagrad_eps = 1e-8f;
  float ftrl_alpha = 0.05f, ftrl_beta = 1.0f;
  float ftrl_l1 = 0.0f, ftrl_l2 = 0.0f;

  // Floats of optimizer state per row, per float of width (0, 1 or 2).
  int state_per_float() const;
  // InvalidArgument naming the field and value of a bad config.
  Status Validate() const;
};

// The wire key of id `id`: a bijection of the 64-bit integers (splitmix64's
// finalizer, Steele et al. 2014), so ids spread evenly over the servers'
// key ranges whatever their pattern.
Key SparseKeyOf(uint64_t id);

enum class SparseOp { kRows = 0, kSync = 1 };
constexpr int kMaxSparsePoint = (1 << 20) - 1;
// bits 0..19 the argument, 20..27 table, 28..30 op. The argument of kSync
// is the sync point; of kRows, the row width the worker expects (the
// server refuses a request whose table has another). CHECKs the ranges.
int EncodeSparseCmd(SparseOp op, int table, int arg = 0);
struct SparseCmd {
  SparseOp op = SparseOp::kRows;
  int table = 0;
  int arg = 0;  // kSync: the point; kRows: the width
};
StatusOr<SparseCmd> DecodeSparseCmd(int cmd);

// The unique ids of a batch: keys[j] = SparseKeyOf(an id), ascending and
// unique (what a request sends), and slot[i] = j where ids[i] went.
struct SparseBatch {
  SArray<Key> keys;
  std::vector<uint32_t> slot;
  size_t size() const { return keys.size(); }
  // O(n log n); ids in any order, duplicates allowed.
  static SparseBatch Of(const uint64_t* ids, size_t n);
};

class SparseWorker {
 public:
  // The tables' ids and widths are what the worker needs (the other fields
  // are the servers'). Requests go to app `app_id` of customer
  // `customer_id`'s node (the default node: ps::Start). `node` must outlive
  // this worker.
  explicit SparseWorker(const std::vector<SparseTableConfig>& tables,
                        int app_id = 0, int customer_id = 0);
  SparseWorker(Node* node, const std::vector<SparseTableConfig>& tables,
               int app_id = 0, int customer_id = 0);

  // Rows of the batch's unique ids (batch.size() * width floats, in its key
  // order) into `rows`: empty, it adopts the received frame when one server
  // answered (zero-copy); presized, it is filled in place.
  int PullRows(int table, const SparseBatch& batch, SArray<float>* rows);
  // Gradients of the batch's unique ids (batch.size() * width floats, in
  // key order); `grads` is sent as it is (keep it until Wait returns).
  int PushRows(int table, const SparseBatch& batch, const SArray<float>& grads);
  Status Wait(int timestamp);

  // Blocking forms over raw ids: Pull writes ids[i]'s row to out[i * width]
  // (duplicates and order as given); Push sums the gradients of duplicate
  // ids and pushes once per unique id.
  Status Pull(int table, const uint64_t* ids, size_t n, float* out);
  Status Push(int table, const uint64_t* ids, size_t n, const float* grads);

  // A sync point: waits for this worker's pushes still in flight, then
  // returns once every live worker called Sync(point) and every server
  // answered, so every push made before it by any worker is applied; the
  // servers snapshot there (SparseShard's callback). Points increase per
  // job.
  Status Sync(int point);

  int width(int table) const;

 private:
  KVWorker<float> kv_;
  std::vector<int> widths_;  // by table id; 0: unknown
  int num_servers_;
  std::mutex mu_;
  std::set<int> pushes_;  // PushRows not yet waited for (Sync waits them)
};

struct SparseShardOptions {
  int num_workers = 1;  // workers that take part in sync points
  // A pull whose answer would be larger is refused (set it to the node's
  // PS_MAX_MESSAGE_BYTES, Config::max_message_bytes, which it defaults to).
  int64_t max_pull_bytes = int64_t{1} << 30;
  // This shard holds the rows of the server this one is the replica of
  // (PrimaryOf its rank, PS_REPLICAS=1); make it before the server's own.
  bool replica = false;
  bool allow_non_finite = false;
};

// Called at a sync point every live worker reached, with the point and the
// shard's state there (Save(), taken under the shard's lock); it runs
// outside that lock, on the server's receive thread (or the thread that
// told the shard of a lost worker), before the point's answers go out, so
// no worker passes the point, and WaitSync does not return, before it
// returned.
using SparseSnapshot = std::function<void(int point, const std::string& state)>;

class SparseShard {
 public:
  // Registers itself as the request handle of `server` (or its replica
  // handle), which must outlive it. CHECKs the configs (Validate them first
  // for an error).
  SparseShard(KVServer<float>* server,
              const std::vector<SparseTableConfig>& tables,
              const SparseShardOptions& options,
              SparseSnapshot snapshot = nullptr);
  ~SparseShard();
  SparseShard(const SparseShard&) = delete;
  SparseShard& operator=(const SparseShard&) = delete;

  // The shard's whole state: every table's rows with their optimizer state.
  std::string Save() const;
  // Replaces the state with what Save gave (before requests come).
  // Corruption naming what is wrong (another table set, a cut-off row, a
  // non-finite value); the state is unchanged then.
  Status Load(const std::string& state);

  // Rows held in `table` (0 for an unknown table), and the bytes `table`
  // holds (-1: all tables): rows, optimizer state and the hash index, as
  // allocated.
  size_t rows(int table) const;
  size_t memory_bytes(int table = -1) const;
  // Id `id`'s row of `table` (width floats) and its optimizer state, when
  // held; for tests and tools.
  bool Row(int table, uint64_t id, std::vector<float>* values,
           std::vector<float>* state = nullptr) const;
  int64_t pushes_applied() const;
  int64_t bad_requests() const;
  // Blocks until sync point `point` completed on this shard or `timeout`.
  bool WaitSync(int point, std::chrono::milliseconds timeout) const;
  // Who the oldest sync point still waits for ("sync point 3: waiting for
  // worker 1, worker 2"; "" when none waits), e.g. for a timeout's message.
  std::string SyncWaitingFor() const;

 private:
  class Impl;  // src/sparse/sparse_shard.cc
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps

#endif  // PS_SPARSE_H_
