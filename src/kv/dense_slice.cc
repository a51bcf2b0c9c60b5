// DenseSlice: the weights of a dense shard, the optimizer step on a range
// and the pull answers (dense_slice.h).
#include "kv/dense_slice.h"

#include <glog/logging.h>

#include <cstring>
#include <utility>

namespace ps {

DenseSlice::DenseSlice(const DenseLayout& layout, Key first_key, Key end_key,
                       const std::vector<float>& weights, DenseUpdater updater)
    : layout_(layout),
      first_key_(first_key),
      end_key_(end_key),
      updater_(std::move(updater)),
      weights_(weights) {
  CHECK_LE(first_key_, end_key_);
  size_t expect = 0;
  for (Key k = first_key_; k < end_key_; ++k) expect += layout_.length(k);
  CHECK_EQ(expect, weights_.size())
      << "keys [" << first_key_ << ", " << end_key_ << ") hold " << expect
      << " floats";
}

bool DenseSlice::Apply(Key begin, Key end, const float* grad_sum, int num_grads,
                       int step, int tag) {
  const bool copy = weights_.ptr().use_count() > 1;
  if (copy) {
    SArray<float> fresh;
    fresh.CopyFrom(weights_);
    weights_ = fresh;
  }
  const size_t offset = Offset(begin);
  if (!previous_.empty()) {
    std::memcpy(previous_.data() + offset, weights_.data() + offset,
                (Offset(end) - offset) * sizeof(float));
  }
  updater_(weights_.data() + offset, grad_sum, offset, Offset(end) - offset,
           num_grads, step, tag);
  return copy;
}

void DenseSlice::KeepPrevious() {
  // Before any update, a key's previous floats are its floats: a pull one
  // step behind a restored slice's first step is refused by the shard.
  previous_.assign(weights_.begin(), weights_.end());
}

bool DenseSlice::SumRange(const SArray<Key>& keys, size_t num_vals, Key* begin,
                          Key* end, std::string* why) const {
  if (keys.size() != 2 || keys[0] < first_key_ || keys[1] > end_key_ ||
      keys[0] >= keys[1]) {
    *why = "a step's sum must name a range {begin, end} of " + Describe();
    return false;
  }
  *begin = keys[0];
  *end = keys[1];
  if (num_vals != Floats(*begin, *end)) {
    *why = "a step's sum of " + std::to_string(num_vals) +
           " floats for keys [" + std::to_string(*begin) + ", " +
           std::to_string(*end) + ") of " + Describe() + ", which hold " +
           std::to_string(Floats(*begin, *end));
    return false;
  }
  return true;
}

bool DenseSlice::PushRange(const SArray<Key>& keys, size_t num_vals, Key* begin,
                           Key* end, std::string* why) const {
  if (keys.empty()) {
    *why = "a gradient push carries no keys";
    return false;
  }
  *begin = keys[0];
  *end = *begin + keys.size();
  if (*begin < first_key_ || *end > end_key_ || *end < *begin) {
    *why = "a gradient push leaves the shard " + Describe();
    return false;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] != *begin + i) {
      *why = "a gradient push must carry a contiguous range of keys of " +
             Describe() + " in order";
      return false;
    }
  }
  if (num_vals != Offset(*end) - Offset(*begin)) {
    *why = "a gradient push of keys [" + std::to_string(*begin) + ", " +
           std::to_string(*end) + ") carries " + std::to_string(num_vals) +
           " floats";
    return false;
  }
  return true;
}

bool DenseSlice::Answer(const SArray<Key>& keys, KVPairs<float>* res,
                        std::string* why) const {
  size_t total = 0;
  bool uniform = true;
  for (Key k : keys) {
    size_t offset, length;
    if (!Locate(k, &offset, &length)) {
      *why = "key " + std::to_string(k) + " is not in " + Describe();
      return false;
    }
    total += length;
    uniform = uniform && length == layout_.chunk;
  }
  // Sorted keys that are contiguous (the usual pull: a whole shard or a
  // range of it) are one segment of the weights; any other subset is
  // gathered into a new buffer.
  res->keys = keys;
  if (!uniform) res->lens.resize(keys.size());
  size_t first = 0, length = 0;
  bool contiguous = !keys.empty() && Locate(keys[0], &first, &length);
  size_t next = first;
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t offset;
    Locate(keys[i], &offset, &length);
    contiguous = contiguous && offset == next;
    next = offset + length;
    if (!uniform) res->lens[i] = static_cast<int>(length);
  }
  if (contiguous) {
    res->vals = weights_.segment(first, first + total);
    return true;
  }
  res->vals.resize(total);
  float* dst = res->vals.data();
  for (Key k : keys) {
    size_t offset;
    Locate(k, &offset, &length);
    std::memcpy(dst, weights_.data() + offset, length * sizeof(float));
    dst += length;
  }
  return true;
}

bool DenseSlice::AnswerStep(const SArray<Key>& keys, int step,
                            const std::function<int(Key)>& applied,
                            KVPairs<float>* res, std::string* why) const {
  CHECK(keeps_previous()) << "a slice that keeps no previous weights";
  if (!Answer(keys, res, why)) return false;
  bool behind = false;
  for (Key k : keys) {
    const int n = applied(k);
    if (n > step + 1) {
      *why = "the weights of step " + std::to_string(step) + " of key " +
             std::to_string(k) + " are gone: it has " + std::to_string(n) +
             " updates applied";
      return false;
    }
    behind = behind || n == step + 1;
  }
  if (!behind) return true;
  SArray<float> own;
  own.CopyFrom(res->vals);
  float* dst = own.data();
  for (Key k : keys) {
    size_t offset, length;
    Locate(k, &offset, &length);
    if (applied(k) == step + 1) {
      std::memcpy(dst, previous_.data() + offset, length * sizeof(float));
    }
    dst += length;
  }
  res->vals = own;
  return true;
}

bool DenseSlice::Locate(Key k, size_t* offset, size_t* length) const {
  if (k < first_key_ || k >= end_key_) return false;
  *offset = layout_.offset(k) - layout_.offset(first_key_);
  *length = layout_.length(k);
  return true;
}

std::string DenseSlice::Describe() const {
  return "[" + std::to_string(first_key_) + ", " + std::to_string(end_key_) +
         ")";
}

size_t DenseSlice::Offset(Key k) const {
  if (k >= end_key_) return weights_.size();
  return layout_.offset(k) - layout_.offset(first_key_);
}

}  // namespace ps
