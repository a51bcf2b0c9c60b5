// DenseSlice: a dense shard's weights and the optimizer step on them. It
// owns the floats of keys [first_key, end_key) of a DenseLayout, runs the
// user's DenseUpdater (the optimizer) on a range with its summed gradient,
// and cuts the answers to pulls out of the weights: a contiguous run of keys
// is a segment of them (shared, no copy), any other subset a gathered copy.
// An update that finds the weights still shared with an answer ZeroMQ has
// not finished sending writes to a fresh copy first (copy on write).
//
// A slice may also keep, for each key, the weights it had before its last
// update (KeepPrevious): a restarted worker that resumes at a step some
// keys have already applied (its predecessor's push had reached them) pulls
// that step's weights from there. It costs a copy of each range updated.
//
// What a push's keys must be (a contiguous, ascending run inside the slice
// with the floats to match) is checked here too: it is the slice's
// geometry.
//
// Thread-safety: none of its own. Its owner (DenseShard::Impl) keeps it
// GUARDED_BY the shard's mutex; the updater runs on the caller's thread,
// under that mutex.
#ifndef PS_SRC_KV_DENSE_SLICE_H_
#define PS_SRC_KV_DENSE_SLICE_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "ps/sarray.h"

namespace ps {

class DenseSlice {
 public:
  // `weights`: the floats of keys [first_key, end_key) of `layout`; CHECKs
  // that their number matches.
  DenseSlice(const DenseLayout& layout, Key first_key, Key end_key,
             const std::vector<float>& weights, DenseUpdater updater);

  // From now on, Apply copies a range's floats aside before it updates
  // them (see AnswerBefore).
  void KeepPrevious();
  bool keeps_previous() const { return !previous_.empty(); }

  // The optimizer step: runs the updater on the floats of [begin, end) with
  // `grad_sum`, the sum of `num_grads` gradients of `step` (tag: its cmd
  // tag). True when the weights had to be copied first (copy on write).
  bool Apply(Key begin, Key end, const float* grad_sum, int num_grads, int step,
             int tag);

  // The range [*begin, *end) a gradient push of `keys` carrying `num_vals`
  // floats covers, or false and why it is no range of this slice.
  bool PushRange(const SArray<Key>& keys, size_t num_vals, Key* begin, Key* end,
                 std::string* why) const;

  // The floats of [begin, end), a range of the slice.
  size_t Floats(Key begin, Key end) const {
    return Offset(end) - Offset(begin);
  }
  // The range [*begin, *end) of a step's sum from the primary (keys:
  // {begin, end}) carrying `num_vals` floats, or false and why it is none.
  bool SumRange(const SArray<Key>& keys, size_t num_vals, Key* begin, Key* end,
                std::string* why) const;

  // The answer to a pull of `keys`, or false and why (a key not ours).
  bool Answer(const SArray<Key>& keys, KVPairs<float>* res,
              std::string* why) const;

  // As Answer, for a pull of the weights of `step`, where key k has had
  // applied(k) updates: a key one update past the step is answered with
  // the floats it had before it (a copy), and one further past is refused
  // (false, and why). CHECKs that the slice keeps them (KeepPrevious).
  bool AnswerStep(const SArray<Key>& keys, int step,
                  const std::function<int(Key)>& applied, KVPairs<float>* res,
                  std::string* why) const;

  // Whether key k is ours; where its floats are within weights() if so.
  bool Locate(Key k, size_t* offset, size_t* length) const;
  // "[first, end)", for messages.
  std::string Describe() const;

  const SArray<float>& weights() const { return weights_; }

 private:
  // Offset of key k (or of end_key_, the slice's size) within weights_.
  size_t Offset(Key k) const;

  const DenseLayout layout_;
  const Key first_key_, end_key_;
  const DenseUpdater updater_;
  // Shared with pull answers in flight.
  SArray<float> weights_;
  // Each range as it was before its last update (KeepPrevious), else empty.
  std::vector<float> previous_;
};

}  // namespace ps

#endif  // PS_SRC_KV_DENSE_SLICE_H_
