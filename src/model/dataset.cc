// Loading MNIST-format data and batching it (see dataset.h).
#include "model/dataset.h"

#include <glog/logging.h>
#include <sys/stat.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/idx_reader.h"

namespace ps {
namespace model {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// dir/name, or dir/name.gz when only that exists; empty when neither does.
std::string FindIdx(const std::string& dir, const std::string& name) {
  const std::string plain = dir + "/" + name;
  if (FileExists(plain)) return plain;
  if (FileExists(plain + ".gz")) return plain + ".gz";
  return "";
}

}  // namespace

StatusOr<DatasetKind> ParseDatasetKind(const std::string& name) {
  if (name == "mnist") return DatasetKind::kMnist;
  if (name == "fashion") return DatasetKind::kFashion;
  return Status::InvalidArgument("dataset must be mnist or fashion, got '" +
                                 name + "'");
}

const char* DatasetKindName(DatasetKind kind) {
  return kind == DatasetKind::kMnist ? "mnist" : "fashion";
}

std::string DefaultDataDir(DatasetKind kind) {
  return kind == DatasetKind::kMnist ? "data/mnist"
                                     : "/usr/share/datasets/fashion-mnist";
}

StatusOr<Dataset> LoadIdxPair(const std::string& images_path,
                              const std::string& labels_path, size_t limit) {
  auto images = ReadIdx(images_path, kIdxImagesMagic);
  if (!images.ok()) return images.status();
  auto labels = ReadIdx(labels_path, kIdxLabelsMagic);
  if (!labels.ok()) return labels.status();
  const size_t n = images->dims[0];
  if (labels->dims[0] != n) {
    return Status::Corruption(
        labels_path + ": " + std::to_string(labels->dims[0]) + " labels, but " +
        images_path + " has " + std::to_string(n) + " images");
  }
  Dataset d;
  d.size = limit == 0 ? n : std::min(n, limit);
  d.rows = static_cast<int>(images->dims[1]);
  d.cols = static_cast<int>(images->dims[2]);
  const size_t pixels = d.image_floats();
  d.images.resize(d.size * pixels);
  for (size_t i = 0; i < d.images.size(); ++i) {
    d.images[i] = (images->data[i] / 255.0f - kPixelMean) / kPixelStd;
  }
  d.labels.resize(d.size);
  for (size_t i = 0; i < d.size; ++i) {
    if (labels->data[i] > 9) {
      return Status::Corruption(labels_path + ": label " +
                                std::to_string(labels->data[i]) + " at index " +
                                std::to_string(i) + " is not in [0, 10)");
    }
    d.labels[i] = labels->data[i];
  }
  return d;
}

StatusOr<Dataset> LoadSplit(const std::string& dir, bool train, size_t limit) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string names[2] = {prefix + "-images-idx3-ubyte",
                                prefix + "-labels-idx1-ubyte"};
  std::string paths[2];
  for (int i = 0; i < 2; ++i) {
    paths[i] = FindIdx(dir, names[i]);
    if (paths[i].empty()) {
      return Status::NotFound(dir + "/" + names[i] +
                              " (or .gz): no such file; for MNIST run "
                              "scripts/fetch_mnist.sh " +
                              dir);
    }
  }
  auto d = LoadIdxPair(paths[0], paths[1], limit);
  if (d.ok() && (d->rows != kMnistSide || d->cols != kMnistSide)) {
    return Status::Corruption(
        paths[0] + ": images are " + std::to_string(d->rows) + "x" +
        std::to_string(d->cols) + ", expected " + std::to_string(kMnistSide) +
        "x" + std::to_string(kMnistSide));
  }
  return d;
}

StatusOr<size_t> CountSplit(const std::string& dir, bool train, size_t limit) {
  const std::string name =
      std::string(train ? "train" : "t10k") + "-labels-idx1-ubyte";
  const std::string path = FindIdx(dir, name);
  if (path.empty()) {
    return Status::NotFound(dir + "/" + name + " (or .gz): no such file");
  }
  auto labels = ReadIdx(path, kIdxLabelsMagic);
  if (!labels.ok()) return labels.status();
  const size_t n = labels->dims[0];
  return limit == 0 ? n : std::min(n, limit);
}

namespace {
// Copies a rows x cols image shifted by (dx, dy): out(r, c) = in(r - dy,
// c - dx), the background where that falls outside.
void CopyShifted(const float* in, int rows, int cols, int dx, int dy,
                 float* out) {
  const float background = -kPixelMean / kPixelStd;
  for (int r = 0; r < rows; ++r) {
    const int sr = r - dy;
    for (int c = 0; c < cols; ++c) {
      const int sc = c - dx;
      out[r * cols + c] = sr >= 0 && sr < rows && sc >= 0 && sc < cols
                              ? in[sr * cols + sc]
                              : background;
    }
  }
}

// splitmix64: a well-mixed 64-bit value of x.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

Batcher::Batcher(const Dataset* data, int batch_size, uint64_t seed, int rank,
                 int num_workers, bool shuffle)
    : data_(data),
      batch_size_(batch_size),
      seed_(seed),
      rank_(rank),
      num_workers_(num_workers),
      shuffle_(shuffle) {
  CHECK_GT(batch_size, 0);
  CHECK_GT(num_workers, 0);
  CHECK(rank >= 0 && rank < num_workers) << rank << " of " << num_workers;
  StartEpoch(0);
}

void Batcher::StartEpoch(int epoch) {
  epoch_ = epoch;
  const size_t n = data_->size;
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  if (shuffle_) {
    std::mt19937_64 rng(
        seed_ ^ (0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(epoch) + 1)));
    for (size_t i = n; i > 1; --i) {
      std::swap(perm[i - 1], perm[rng() % i]);
    }
  }
  const size_t per_worker = n / static_cast<size_t>(num_workers_);
  shard_.resize(per_worker);
  for (size_t j = 0; j < per_worker; ++j) {
    shard_[j] = perm[j * num_workers_ + rank_];
  }
  pos_ = 0;
}

bool Batcher::Next(Batch* batch) {
  if (pos_ >= shard_.size()) return false;
  const size_t m = std::min(shard_.size() - pos_, size_t(batch_size_));
  const size_t pixels = data_->image_floats();
  batch->size = static_cast<int>(m);
  batch->images.resize(m * pixels);
  batch->labels.resize(m);
  for (size_t i = 0; i < m; ++i) {
    const size_t src = shard_[pos_ + i];
    const float* image = data_->images.data() + src * pixels;
    float* out = batch->images.data() + i * pixels;
    if (max_shift_ > 0) {
      const uint64_t h =
          Mix(Mix(seed_ ^ Mix(static_cast<uint64_t>(epoch_))) ^ src);
      const uint64_t span = 2 * static_cast<uint64_t>(max_shift_) + 1;
      const int dx = static_cast<int>(h % span) - max_shift_;
      const int dy = static_cast<int>((h >> 32) % span) - max_shift_;
      CopyShifted(image, data_->rows, data_->cols, dx, dy, out);
    } else {
      std::copy_n(image, pixels, out);
    }
    batch->labels[i] = data_->labels[src];
  }
  pos_ += m;
  return true;
}

}  // namespace model
}  // namespace ps
