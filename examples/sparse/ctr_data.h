// Click-through samples for sparse_ctr: Criteo-shaped ones drawn from a
// planted sparse logistic model (so the best possible AUC is known), or
// lines of Criteo's text format. Either way a sample is 39 64-bit feature
// ids (one per field: 13 bucketized counts, then 26 categorical values; an
// empty field is an id of its own) and a label.
//
// Not thread-safe: one generator or reader per thread.
#ifndef PS_EXAMPLES_SPARSE_CTR_DATA_H_
#define PS_EXAMPLES_SPARSE_CTR_DATA_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ps/status.h"

namespace ctr {

constexpr int kCountFields = 13;
constexpr int kCategoricalFields = 26;
constexpr int kFields = kCountFields + kCategoricalFields;
// The value of an empty field (its id is FeatureId(field, kMissing)).
constexpr uint64_t kMissing = ~uint64_t{0};

// The 64-bit id of (field, value): a mix of both, so the fields' values
// never share an id (up to 2^-64 collisions).
uint64_t FeatureId(int field, uint64_t value);
// An id no feature has: the model's bias row.
uint64_t BiasId();
// A count's bucket: floor(log2(1 + x)) for x >= 0, capped at 40; negative
// counts (Criteo has a few) go to bucket 41.
uint64_t CountBucket(int64_t x);

// Samples in rows of kFields ids. `logit` holds the planted model's logit
// of each sample (generated data), or is empty (read data).
struct Samples {
  std::vector<uint64_t> ids;  // size() * kFields
  std::vector<float> labels;  // 0 or 1
  std::vector<float> logit;
  size_t size() const { return labels.size(); }
  void clear() {
    ids.clear();
    labels.clear();
    logit.clear();
  }
};

// The shape of the generated data and its planted model.
struct GeneratorOptions {
  uint64_t seed = 1;
  double zipf = 1.05;      // exponent of every categorical field
  double vocab_scale = 1;  // multiplies Criteo's per-field vocabularies
  int head = 100;  // ranks of each categorical field with a non-zero weight
  double weight_scale = 0.5;  // stddev of a non-zero weight
  double bias = -1.4;
};

// Draws sample `index` of stream `stream` as a pure function of (options,
// stream, index): disjoint streams for the workers' training data and one
// test set that every worker draws alike. Categorical field f's value is a
// rank in [1, V_f], Zipf-distributed (V_f: Criteo's cardinality of field f
// times vocab_scale, at least 2); some fields are empty at Criteo's rates.
// Counts are heavy-tailed, then bucketized. The planted model: a weight for
// every count bucket, for the `head` most frequent ranks of each
// categorical field and for empty fields (Gaussian, weight_scale, a pure
// function of the id), zero for every other id, plus `bias`; the label is
// Bernoulli(sigmoid(logit)).
class Generator {
 public:
  explicit Generator(const GeneratorOptions& options);
  void Draw(uint64_t stream, uint64_t index, Samples* out) const;
  uint64_t vocabulary(int categorical_field) const {
    return vocab_[categorical_field];
  }

 private:
  GeneratorOptions options_;
  std::vector<uint64_t> vocab_;  // kCategoricalFields
  std::vector<double> zipf_a_;   // V^(1 - s) - 1, for the inverse CDF
  std::vector<double> missing_;  // kFields: chance a field is empty
  std::vector<double> tail_;     // kCountFields: counts' tail exponent
};

// Reads Criteo's text format: label<TAB>13 integers<TAB>26 hex strings,
// any field but the label may be empty. Errors name the file and line.
class CriteoReader {
 public:
  CriteoReader() = default;
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  ps::Status Open(const std::string& path);
  // Appends up to `n` samples to `out`; *got says how many (0: end of file).
  ps::Status Read(size_t n, Samples* out, size_t* got);
  // Lines read so far.
  uint64_t line() const { return line_; }

 private:
  ps::Status ParseLine(const std::string& text, Samples* out) const;
  std::string path_;
  FILE* file_ = nullptr;
  uint64_t line_ = 0;
};

// Counts the lines of `path`, a last one without a newline included
// (IOError naming it).
ps::StatusOr<uint64_t> CountLines(const std::string& path);

}  // namespace ctr

#endif  // PS_EXAMPLES_SPARSE_CTR_DATA_H_
