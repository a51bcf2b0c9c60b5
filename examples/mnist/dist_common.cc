// Key layout, placement, ownership text, metrics and weight dumps of
// mnist_dist (dist_common.h).
#include "dist_common.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "model/backend.h"

namespace mnist {

void Die(const std::string& message) {
  std::fprintf(stderr, "mnist_dist: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

ps::DenseLayout ModelLayout(const TrainOptions& options) {
  ps::DenseLayout layout;
  layout.total = ps::model::TotalCount(ps::model::ConvNetTensors());
  layout.chunk = options.chunk;
  return layout;
}

ps::StatusOr<ps::Placement> ModelPlacement(const ps::DenseLayout& layout,
                                           int num_servers,
                                           TrainOptions::PlacementKind kind) {
  std::vector<ps::Key> keys;
  std::vector<uint64_t> bytes;
  const auto& tensors = ps::model::ConvNetTensors();
  size_t tensor = 0;  // of the last group's first float
  for (size_t k = 0; k < layout.num_keys(); ++k) {
    const size_t first = layout.offset(k);
    bool new_group =
        keys.empty() || kind == TrainOptions::PlacementKind::kBytes;
    while (tensor + 1 < tensors.size() && tensors[tensor + 1].offset <= first) {
      ++tensor;
      new_group = true;
    }
    if (new_group) {
      keys.push_back(k);
      bytes.push_back(0);
    }
    bytes.back() += layout.length(k) * sizeof(float);
  }
  if (kind == TrainOptions::PlacementKind::kTensor) {
    // An empty key past the model's: servers that no tensor fills own
    // [num_keys, num_keys) rather than the last tensor's tail.
    keys.push_back(layout.num_keys());
    bytes.push_back(0);
  }
  return ps::Placement::ByBytes(keys, bytes, num_servers);
}

void ServerKeys(const ps::Placement& placement, const ps::DenseLayout& layout,
                int rank, ps::Key* begin, ps::Key* end) {
  ps::Key num_keys = layout.num_keys();
  *begin = std::min<ps::Key>(placement.begin(rank), num_keys);
  *end = std::min<ps::Key>(placement.end(rank), num_keys);
}

std::string DescribeFloats(size_t lo, size_t hi) {
  std::ostringstream os;
  for (const ps::model::TensorView& t : ps::model::ConvNetTensors()) {
    size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.count);
    if (a >= b) continue;
    os << (os.tellp() > 0 ? " " : "") << t.name << "[" << a - t.offset << ":"
       << b - t.offset << ")";
  }
  return os.str();
}

ps::Status MetricsLog::Open(const std::string& path) {
  if (path.empty()) return ps::Status::OK();
  file_.reset(std::fopen(path.c_str(), "w"));
  if (!file_) {
    return ps::Status::IOError("cannot write metrics file '" + path + "'");
  }
  return ps::Status::OK();
}

void MetricsLog::Progress(double time, int epoch, int64_t step, double loss,
                          double samples_per_s) {
  if (!file_) return;
  std::fprintf(file_.get(),
               "{\"time\": %.3f, \"epoch\": %d, \"step\": %lld, \"loss\": "
               "%.5f, \"samples_per_s\": %.1f}\n",
               time, epoch, static_cast<long long>(step), loss, samples_per_s);
  std::fflush(file_.get());
}

void MetricsLog::Accuracy(double time, int epoch, int64_t step, double accuracy,
                          double test_loss) {
  if (!file_) return;
  std::fprintf(file_.get(),
               "{\"time\": %.3f, \"epoch\": %d, \"step\": %lld, \"accuracy\": "
               "%.5f, \"test_loss\": %.5f}\n",
               time, epoch, static_cast<long long>(step), accuracy, test_loss);
  std::fflush(file_.get());
}

std::string MetricsPath(const TrainOptions& options, int rank) {
  if (!options.metrics_file.empty() && rank == 0) return options.metrics_file;
  if (!options.metrics_dir.empty()) {
    return options.metrics_dir + "/worker" + std::to_string(rank) + ".jsonl";
  }
  return "";
}

ps::Status DumpFloats(const std::string& path, const float* data, size_t n) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"),
                                          &std::fclose);
  if (!f || std::fwrite(data, sizeof(float), n, f.get()) != n) {
    return ps::Status::IOError("cannot write weights to '" + path + "'");
  }
  return ps::Status::OK();
}

}  // namespace mnist
