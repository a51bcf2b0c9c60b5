#include "sparse/sparse_table.h"

#include <absl/container/flat_hash_map.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

namespace ps {

namespace {

// splitmix64 (Steele, Lea and Flood, OOPSLA 2014): a 64-bit bijection and
// the generator built on it; the init values of a row are a pure function of
// (seed, table, key).
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // (0, 1]: 24 bits, as a float holds them.
  double Unit() {
    return (static_cast<double>(Next() >> 40) + 1.0) / 16777216.0;
  }

 private:
  uint64_t state_;
};

}  // namespace

Key SparseKeyOf(uint64_t id) { return Mix64(id); }

struct SparseTable::Index {
  absl::flat_hash_map<Key, uint32_t> rows;
};

SparseTable::SparseTable(const SparseTableConfig& config)
    : config_(config),
      width_(static_cast<size_t>(config.width)),
      stride_(width_ * (1 + config.state_per_float())),
      block_rows_(std::max<size_t>(1, kBlockBytes / (stride_ * sizeof(float)))),
      index_(std::make_unique<Index>()) {
  Status st = config.Validate();
  CHECK(st.ok()) << st;
}

SparseTable::~SparseTable() = default;

size_t SparseTable::size() const { return index_->rows.size(); }

size_t SparseTable::memory_bytes() const {
  return index_->rows.capacity() *
             (sizeof(std::pair<const Key, uint32_t>) + 1) +
         blocks_.size() * block_rows_ * stride_ * sizeof(float);
}

void SparseTable::InitWeights(Key key, float* w) const {
  const double scale = config_.init_scale;
  SplitMix64 rng(
      Mix64(config_.seed ^ Mix64(static_cast<uint64_t>(config_.id) + 1)) ^ key);
  switch (config_.init) {
    case SparseInit::kZero:
      for (size_t i = 0; i < width_; ++i) w[i] = 0.0f;
      break;
    case SparseInit::kUniform:
      for (size_t i = 0; i < width_; ++i) {
        w[i] = static_cast<float>((2.0 * rng.Unit() - 1.0) * scale);
      }
      break;
    case SparseInit::kNormal:
      for (size_t i = 0; i < width_; i += 2) {  // Box-Muller, two at a time
        const double r = std::sqrt(-2.0 * std::log(rng.Unit()));
        const double theta = 2.0 * M_PI * rng.Unit();
        w[i] = static_cast<float>(r * std::cos(theta) * scale);
        if (i + 1 < width_) {
          w[i + 1] = static_cast<float>(r * std::sin(theta) * scale);
        }
      }
      break;
  }
}

void SparseTable::Init(Key key, float* row) const {
  float* w = row;
  InitWeights(key, w);
  float* state = row + width_;
  switch (config_.optimizer) {
    case SparseOptimizer::kSgd:
      break;
    case SparseOptimizer::kAdagrad:
      for (size_t i = 0; i < width_; ++i) state[i] = config_.adagrad_init;
      break;
    case SparseOptimizer::kFtrl: {
      // z that makes w(z, n = 0) the initial value (sparse.h).
      float* z = state;
      float* n = state + width_;
      const float c = config_.ftrl_beta / config_.ftrl_alpha + config_.ftrl_l2;
      for (size_t i = 0; i < width_; ++i) {
        n[i] = 0.0f;
        z[i] = w[i] == 0.0f ? 0.0f
                            : -w[i] * c - std::copysign(config_.ftrl_l1, w[i]);
      }
      break;
    }
  }
}

float* SparseTable::FindOrMake(Key key) {
  auto& rows = index_->rows;
  if (auto it = rows.find(key); it != rows.end()) return RowAt(it->second);
  const size_t r = rows.size();
  if (r >= kMaxRows) return nullptr;
  if (r / block_rows_ >= blocks_.size()) {
    std::unique_ptr<float[]> block(
        new (std::nothrow) float[block_rows_ * stride_]);
    if (block == nullptr) return nullptr;
    blocks_.push_back(std::move(block));
  }
  rows.emplace(key, static_cast<uint32_t>(r));
  float* row = RowAt(static_cast<uint32_t>(r));
  Init(key, row);
  return row;
}

const float* SparseTable::Find(Key key) const {
  auto it = index_->rows.find(key);
  return it == index_->rows.end() ? nullptr : RowAt(it->second);
}

void SparseTable::Read(Key key, float* out) const {
  if (const float* row = Find(key)) {
    std::memcpy(out, row, width_ * sizeof(float));
  } else {
    InitWeights(key, out);
  }
}

void SparseTable::Apply(float* row, const float* g) const {
  float* w = row;
  const size_t d = width_;
  switch (config_.optimizer) {
    case SparseOptimizer::kSgd: {
      const float lr = config_.lr;
      for (size_t i = 0; i < d; ++i) w[i] -= lr * g[i];
      break;
    }
    case SparseOptimizer::kAdagrad: {
      float* h = row + d;
      const float lr = config_.lr, eps = config_.adagrad_eps;
      for (size_t i = 0; i < d; ++i) {
        h[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (std::sqrt(h[i]) + eps);
      }
      break;
    }
    case SparseOptimizer::kFtrl: {
      float* z = row + d;
      float* n = row + 2 * d;
      const float alpha = config_.ftrl_alpha, beta = config_.ftrl_beta;
      const float l1 = config_.ftrl_l1, l2 = config_.ftrl_l2;
      for (size_t i = 0; i < d; ++i) {
        const float n_new = n[i] + g[i] * g[i];
        const float sigma = (std::sqrt(n_new) - std::sqrt(n[i])) / alpha;
        z[i] += g[i] - sigma * w[i];
        n[i] = n_new;
        w[i] = std::fabs(z[i]) <= l1
                   ? 0.0f
                   : -(z[i] - std::copysign(l1, z[i])) /
                         ((beta + std::sqrt(n_new)) / alpha + l2);
      }
      break;
    }
  }
}

void SparseTable::Save(Packer* out) const {
  // In key order, so that the same rows always give the same bytes (a
  // replica's checkpoint equals its primary's).
  std::vector<std::pair<Key, uint32_t>> rows(index_->rows.begin(),
                                             index_->rows.end());
  std::sort(rows.begin(), rows.end());
  out->Put<uint64_t>(rows.size());
  for (const auto& [key, r] : rows) {
    out->Put<uint64_t>(key);
    out->PutRaw(RowAt(r), stride_ * sizeof(float));
  }
}

Status SparseTable::Load(Unpacker* in) {
  CHECK(index_->rows.empty());
  uint64_t count = 0;
  if (!in->Get(&count)) return Status::Corruption("no row count");
  std::vector<float> row(stride_);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t key;
    if (!in->Get(&key) || !in->GetRaw(row.data(), stride_ * sizeof(float))) {
      return Status::Corruption("row " + std::to_string(i) + " of " +
                                std::to_string(count) + " is cut short");
    }
    PS_RETURN_IF_ERROR(
        CheckFinite(row.data(), stride_, "row " + std::to_string(i)));
    // Adagrad's h and FTRL's n are sums of squares.
    const size_t squares =
        config_.optimizer == SparseOptimizer::kAdagrad ? width_
        : config_.optimizer == SparseOptimizer::kFtrl  ? 2 * width_
                                                       : stride_;
    for (size_t j = squares; j < stride_; ++j) {
      if (row[j] < 0.0f) {
        return Status::Corruption(
            "row " + std::to_string(i) + ": optimizer state " +
            std::to_string(row[j]) + " is a negative sum of squares");
      }
    }
    if (index_->rows.contains(key)) {
      return Status::Corruption("row " + std::to_string(i) + " repeats key " +
                                std::to_string(key));
    }
    float* dst = FindOrMake(key);
    if (dst == nullptr) {
      return Status::Corruption("row " + std::to_string(i) +
                                ": the table is full or out of memory");
    }
    std::copy(row.begin(), row.end(), dst);
  }
  return Status::OK();
}

}  // namespace ps
