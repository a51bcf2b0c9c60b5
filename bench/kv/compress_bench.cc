// The codecs' own cost (ps/compress.h), where the wire is not the limit:
// each codec encodes a real gradient of the ConvNet (1,199,882 floats in
// mnist_dist's 8192-float keys, from one ForwardBackward) as a worker's
// push and decodes it as a server, median of --reps; beside it the time of
// one training step (ForwardBackward of --batch images on --threads
// threads) on the same machine, in the same run. Prints one line a codec:
//   codec=NAME encode_ms=E decode_ms=D wire=BYTES (F of raw) cost/step=R
// R = (E + D) / step: what the codec adds to a step on one core. Not a test.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/net.h"
#include "ps/compress.h"

DEFINE_int32(reps, 15, "repetitions per codec (the median is printed)");
DEFINE_int32(batch, 8, "images per training step");
DEFINE_int32(threads, 1, "compute threads of the training step");
DEFINE_string(codecs, "fp16,bf16,topk:0.01,randomk:0.01,onebit",
              "the push codecs to measure");
DEFINE_uint64(chunk, 8192, "floats per key, as mnist_dist --chunk");

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "compress_bench: %s\n", why.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  ps::model::SetCpuThreads(FLAGS_threads);
  auto net = ps::model::Net::Create(ps::model::Device::kCpu, 1);
  if (!net.ok()) Die(net.status().ToString());
  // Images of noise and random labels: a gradient of the right shape and
  // spread, and the step's cost (which does not depend on the pixels).
  std::mt19937 rng(1);
  std::normal_distribution<float> pixel(0, 1);
  std::vector<float> images(static_cast<size_t>(FLAGS_batch) * 28 * 28);
  std::vector<int32_t> labels(FLAGS_batch);
  for (float& p : images) p = pixel(rng);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng() % 10);
  std::vector<double> step;
  for (int r = 0; r < FLAGS_reps; ++r) {
    auto t0 = Clock::now();
    (*net)->ForwardBackward(images.data(), labels.data(), FLAGS_batch);
    step.push_back(Ms(t0));
  }
  const double step_ms = Median(step);
  const size_t n = (*net)->num_params();
  std::printf(
      "training step: batch %d, %d thread(s): %.2f ms (median of %d); "
      "gradient of %zu floats in %llu-float keys\n",
      FLAGS_batch, FLAGS_threads, step_ms, FLAGS_reps, n,
      static_cast<unsigned long long>(FLAGS_chunk));

  std::vector<uint64_t> keys;
  std::vector<int> lens;
  for (size_t at = 0, k = 0; at < n; at += FLAGS_chunk, ++k) {
    keys.push_back(k);
    lens.push_back(static_cast<int>(std::min<size_t>(FLAGS_chunk, n - at)));
  }
  ps::KVFrames grad;
  grad.keys = ps::SArray<char>(ps::SArray<uint64_t>(keys));
  grad.lens = ps::SArray<char>(ps::SArray<int>(lens));
  grad.has_lens = grad.has_vals = true;
  grad.val_type = 9;  // float
  std::vector<float> g((*net)->grads(), (*net)->grads() + n);
  grad.vals = ps::SArray<char>(ps::SArray<float>(g));
  ps::FilterContext push;
  push.push = true;

  std::string list = FLAGS_codecs;
  for (size_t begin = 0; begin < list.size();) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string name = list.substr(begin, end - begin);
    begin = end + 1;
    auto codec = ps::Codec::Parse(name);
    if (!codec.ok()) Die(codec.status().ToString());
    ps::CompressOptions options;
    options.push = *codec;
    auto worker = ps::Compressor::Make(options);
    auto server = ps::Compressor::Make(ps::CompressOptions());
    if (!worker.ok()) Die(worker.status().ToString());
    std::vector<double> enc, dec;
    size_t wire = 0;
    for (int r = 0; r < FLAGS_reps; ++r) {
      ps::KVFrames f = grad;
      std::string note;
      auto t0 = Clock::now();
      auto applied = (*worker)->Encode(push, &f, &note);
      enc.push_back(Ms(t0));
      if (!applied.ok() || !*applied) Die(name + ": not encoded");
      wire = f.vals.size();
      t0 = Clock::now();
      ps::Status st = (*server)->Decode(push, note, &f);
      dec.push_back(Ms(t0));
      if (!st.ok()) Die(name + ": " + st.ToString());
    }
    const double e = Median(enc), d = Median(dec);
    std::printf(
        "codec=%s encode_ms=%.2f decode_ms=%.2f wire=%zu (%.4f of raw) "
        "cost/step=%.3f\n",
        name.c_str(), e, d, wire, static_cast<double>(wire) / (4.0 * n),
        (e + d) / step_ms);
  }
  return 0;
}
