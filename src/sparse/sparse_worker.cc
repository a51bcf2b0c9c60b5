// SparseWorker and SparseBatch (ps/sparse.h): a batch's ids made unique and
// keyed, and the rows of a table pulled and pushed through a KVWorker whose
// placement splits the whole key space evenly (SparseKeyOf spreads ids).
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ps/node.h"
#include "ps/placement.h"
#include "ps/sparse.h"

namespace ps {

SparseBatch SparseBatch::Of(const uint64_t* ids, size_t n) {
  std::vector<std::pair<Key, uint32_t>> order(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = {SparseKeyOf(ids[i]), static_cast<uint32_t>(i)};
  }
  std::sort(order.begin(), order.end());
  SparseBatch batch;
  batch.slot.resize(n);
  std::vector<Key> keys;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || order[i].first != order[i - 1].first) {
      keys.push_back(order[i].first);
    }
    batch.slot[order[i].second] = static_cast<uint32_t>(keys.size() - 1);
  }
  batch.keys = SArray<Key>(keys);
  return batch;
}

SparseWorker::SparseWorker(const std::vector<SparseTableConfig>& tables,
                           int app_id, int customer_id)
    : SparseWorker(CustomerNode(customer_id), tables, app_id, customer_id) {}

SparseWorker::SparseWorker(Node* node,
                           const std::vector<SparseTableConfig>& tables,
                           int app_id, int customer_id)
    : kv_(node, app_id, customer_id),
      widths_(kMaxSparseTables, 0),
      num_servers_(node->num_servers()) {
  for (const SparseTableConfig& t : tables) {
    CHECK(t.id >= 0 && t.id < kMaxSparseTables) << "sparse table " << t.id;
    CHECK(t.width >= 1 && t.width <= kMaxSparseWidth)
        << "sparse table " << t.id << " width " << t.width;
    widths_[t.id] = t.width;
  }
  kv_.SetPlacement(Placement::EvenKeys(num_servers_, kMaxKey));
}

int SparseWorker::width(int table) const {
  CHECK(table >= 0 && table < kMaxSparseTables && widths_[table] > 0)
      << "no sparse table " << table << " on this worker";
  return widths_[table];
}

int SparseWorker::PullRows(int table, const SparseBatch& batch,
                           SArray<float>* rows) {
  const size_t w = static_cast<size_t>(width(table));
  CHECK(rows->empty() || rows->size() == batch.size() * w)
      << "a pull of " << batch.size() << " rows of width " << w << " into "
      << rows->size() << " floats";
  return kv_.ZPull(
      batch.keys, rows, nullptr,
      EncodeSparseCmd(SparseOp::kRows, table, static_cast<int>(w)));
}

int SparseWorker::PushRows(int table, const SparseBatch& batch,
                           const SArray<float>& grads) {
  const size_t w = static_cast<size_t>(width(table));
  CHECK_EQ(grads.size(), batch.size() * w)
      << "a push of " << batch.size() << " rows of width " << w;
  const int ts =
      kv_.ZPush(batch.keys, grads, {},
                EncodeSparseCmd(SparseOp::kRows, table, static_cast<int>(w)));
  std::lock_guard<std::mutex> lock(mu_);
  pushes_.insert(ts);
  return ts;
}

Status SparseWorker::Wait(int timestamp) {
  Status st = kv_.Wait(timestamp);
  std::lock_guard<std::mutex> lock(mu_);
  pushes_.erase(timestamp);
  return st;
}

Status SparseWorker::Pull(int table, const uint64_t* ids, size_t n,
                          float* out) {
  if (n == 0) return Status::OK();
  const size_t w = static_cast<size_t>(width(table));
  const SparseBatch batch = SparseBatch::Of(ids, n);
  SArray<float> rows;
  PS_RETURN_IF_ERROR(Wait(PullRows(table, batch, &rows)));
  if (rows.size() != batch.size() * w) {  // a server broke the protocol
    return Status::InvalidArgument(
        "sparse table " + std::to_string(table) + ": a pull of " +
        std::to_string(batch.size()) + " rows of width " + std::to_string(w) +
        " was answered with " + std::to_string(rows.size()) + " floats");
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out + i * w, rows.data() + batch.slot[i] * w,
                w * sizeof(float));
  }
  return Status::OK();
}

Status SparseWorker::Push(int table, const uint64_t* ids, size_t n,
                          const float* grads) {
  if (n == 0) return Status::OK();
  const size_t w = static_cast<size_t>(width(table));
  const SparseBatch batch = SparseBatch::Of(ids, n);
  SArray<float> sum(batch.size() * w, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    float* dst = sum.data() + batch.slot[i] * w;
    const float* g = grads + i * w;
    for (size_t j = 0; j < w; ++j) dst[j] += g[j];
  }
  return Wait(PushRows(table, batch, sum));
}

Status SparseWorker::Sync(int point) {
  CHECK(point >= 0 && point <= kMaxSparsePoint) << "sync point " << point;
  std::vector<int> pushes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pushes.assign(pushes_.begin(), pushes_.end());
  }
  for (int ts : pushes) PS_RETURN_IF_ERROR(Wait(ts));
  // One key of every server's range (each gets the sync point).
  std::vector<Key> keys(num_servers_);
  for (int s = 0; s < num_servers_; ++s) keys[s] = kv_.placement().begin(s);
  std::vector<float> vals(keys.size(), 0.0f);
  return Wait(
      kv_.Push(keys, vals, {}, EncodeSparseCmd(SparseOp::kSync, 0, point)));
}

}  // namespace ps
