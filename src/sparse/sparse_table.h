// SparseTable: one table of a SparseShard (ps/sparse.h): rows of `width`
// floats keyed by wire key, each followed by its optimizer state, made on
// first touch with the table's initializer, updated by its optimizer.
//
// Memory: rows live in blocks of about kBlockBytes (at least one row; row
// r at blocks_[r / block_rows] + (r % block_rows) * stride, stride = width *
// (1 + state) floats), so a row never moves once made and growing never
// copies rows;
// an abseil flat_hash_map maps each key to its row number (16-byte slots and
// one control byte each, at most 7/8 full). memory_bytes() counts both as
// allocated. (The map lives in sparse_table.cc: abseil's headers define the
// same thread-annotation macros as van/sync.h.)
//
// Not thread-safe: the shard serializes every call under its mutex.
#ifndef PS_SRC_SPARSE_SPARSE_TABLE_H_
#define PS_SRC_SPARSE_SPARSE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/checkpointer.h"
#include "ps/base.h"
#include "ps/sparse.h"
#include "ps/status.h"

namespace ps {

class SparseTable {
 public:
  static constexpr size_t kBlockBytes = size_t{1} << 20;
  // Rows a table holds at most (row numbers are 32-bit).
  static constexpr size_t kMaxRows = (size_t{1} << 32) - 1;

  explicit SparseTable(const SparseTableConfig& config);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const SparseTableConfig& config() const { return config_; }
  size_t width() const { return width_; }
  size_t stride() const { return stride_; }
  size_t size() const;
  size_t memory_bytes() const;

  // The row of `key` (stride floats: values, then state), made when new;
  // null when it is new and the table is full (kMaxRows) or its block cannot
  // be allocated (nothing is made then).
  float* FindOrMake(Key key);
  // The row of `key`, or null when not held.
  const float* Find(Key key) const;
  // The values (width floats) of `key`'s row into out: the row's when held,
  // else those it will be made with (the row is not made).
  void Read(Key key, float* out) const;

  // One optimizer step of a row with gradient g (width floats).
  void Apply(float* row, const float* g) const;

  // Every row in key order: count, then (key, stride floats) each.
  void Save(Packer* out) const;
  // Adds the rows Save wrote (the table must be empty). Corruption naming
  // the row when cut short, not finite, or with an optimizer state no
  // update can give (a negative sum of squares).
  Status Load(Unpacker* in);

 private:
  // The values of a new row of `key` and its optimizer state.
  void Init(Key key, float* row) const;
  // Its values alone (width floats): what a pull of a key not held reads.
  void InitWeights(Key key, float* w) const;
  float* RowAt(uint32_t r) {
    return blocks_[r / block_rows_].get() + (r % block_rows_) * stride_;
  }
  const float* RowAt(uint32_t r) const {
    return blocks_[r / block_rows_].get() + (r % block_rows_) * stride_;
  }

  const SparseTableConfig config_;
  const size_t width_;
  const size_t stride_;
  const size_t block_rows_;
  struct Index;  // key -> row number
  const std::unique_ptr<Index> index_;
  std::vector<std::unique_ptr<float[]>> blocks_;
};

}  // namespace ps

#endif  // PS_SRC_SPARSE_SPARSE_TABLE_H_
