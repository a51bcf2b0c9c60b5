// MNIST and Fashion-MNIST in memory, and a Batcher that shuffles by seed each
// epoch and shards the training set across data-parallel workers.
//
// Thread-safety: a Dataset is immutable after loading and may be shared; a
// Batcher is used by one thread.
#ifndef PS_MODEL_DATASET_H_
#define PS_MODEL_DATASET_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ps/status.h"

namespace ps {
namespace model {

// Pixel normalisation of the reference (torchvision's MNIST mean and std),
// used for both datasets.
constexpr float kPixelMean = 0.1307f;
constexpr float kPixelStd = 0.3081f;
constexpr int kMnistSide = 28;  // MNIST and Fashion-MNIST images are 28x28

enum class DatasetKind { kMnist, kFashion };

// "mnist" or "fashion"; InvalidArgument naming the value otherwise.
StatusOr<DatasetKind> ParseDatasetKind(const std::string& name);
const char* DatasetKindName(DatasetKind kind);
// data/mnist (relative to the working folder) or
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
std::string DefaultDataDir(DatasetKind kind);

struct Dataset {
  size_t size = 0;              // number of images
  int rows = 0, cols = 0;       // 28 x 28
  std::vector<float> images;    // size x 1 x rows x cols, normalised
  std::vector<int32_t> labels;  // size, each in [0, 10)
  size_t image_floats() const { return static_cast<size_t>(rows) * cols; }
};

// Loads an image file and a label file (raw or gzipped IDX), keeping the first
// `limit` examples (0: all). Checks that the counts agree and that labels are
// digits.
StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                              const std::string& labels_path, size_t limit = 0);

// Loads the train or test split from `dir`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each possibly with ".gz".
// NotFound names the missing file and says how to fetch MNIST; Corruption
// when the images are not 28x28.
StatusOr<Dataset> LoadSplit(const std::string& dir, bool train,
                            size_t limit = 0);

// The number of examples LoadSplit(dir, train, limit) would hold, from the
// label file alone (for a node that needs the count but not the data).
StatusOr<size_t> CountSplit(const std::string& dir, bool train,
                            size_t limit = 0);

// One mini-batch, in the Dataset's layout.
struct Batch {
  int size = 0;
  std::vector<float> images;    // size x 1 x rows x cols
  std::vector<int32_t> labels;  // size
};

// Serves the batches of one worker's shard, epoch by epoch.
//
// Sharding: at each epoch every worker computes the same permutation of
// [0, N) from (seed, epoch) (its own Fisher-Yates over std::mt19937_64, so it
// is identical on every node). Worker `rank` of `num_workers` takes the
// permutation's positions rank, rank + W, rank + 2W, ... below
// W * floor(N / W): the shards are disjoint, each holds floor(N / W) examples
// (so every worker runs the same number of steps), and together they cover
// all but N mod W examples of the epoch; which examples a worker sees changes
// every epoch. With shuffle = false the permutation is the identity.
class Batcher {
 public:
  // `data` must outlive the Batcher. The last batch of an epoch may be short.
  Batcher(const Dataset* data, int batch_size, uint64_t seed, int rank = 0,
          int num_workers = 1, bool shuffle = true);

  // Draws the permutation of `epoch` and rewinds.
  void StartEpoch(int epoch);
  // Fills `batch` with the next batch of the epoch; false at its end.
  bool Next(Batch* batch);
  // Skips the next n batches of the epoch (as n calls of Next would), e.g.
  // to resume an epoch from a checkpoint.
  void Skip(int n) {
    pos_ = std::min(shard_.size(), pos_ + static_cast<size_t>(n) * batch_size_);
  }

  // Augmentation: each image served is shifted by (dx, dy), each drawn
  // uniformly from [-pixels, pixels], the uncovered border filled with the
  // background (a normalised 0). The shift is a function of (seed, epoch,
  // example index) only, so it does not depend on the sharding: W workers
  // see the images one process would. 0 (the default): no shift.
  void set_max_shift(int pixels) { max_shift_ = pixels; }

  size_t shard_size() const { return shard_.size(); }
  int batches_per_epoch() const {
    return static_cast<int>((shard_.size() + batch_size_ - 1) / batch_size_);
  }

 private:
  const Dataset* data_;
  int batch_size_;
  uint64_t seed_;
  int rank_, num_workers_;
  bool shuffle_;
  int max_shift_ = 0;
  int epoch_ = 0;
  std::vector<size_t> shard_;  // this worker's example indices, in order
  size_t pos_ = 0;
};

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_DATASET_H_
