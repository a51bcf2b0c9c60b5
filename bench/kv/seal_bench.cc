// The crypto's own rate on this machine: seals and opens one frame of each
// size (src/van/seal.h, AES-256-GCM in 128 KiB chunks, on one thread),
// best of --reps, and prints GB/s of plaintext with the same frame
// copied by memcpy beside it (what a plain send's copy costs). run.py's
// encryption section prints it; no sockets, no job.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "van/seal.h"

DEFINE_int32(reps, 20, "repetitions per size (the best is printed)");

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string key(ps::seal::kKeyBytes, 'k');
  ps::seal::Sealer sealer(key);
  ps::seal::Opener opener(key);
  for (size_t floats : {size_t{100000}, size_t{1199882}, size_t{10000000}}) {
    const size_t bytes = floats * 4;
    std::vector<char> plain(bytes, 1), copy(bytes);
    std::vector<char> sealed(ps::seal::SealedBytes(bytes));
    double seal = 1e9, open = 1e9, memcpy_s = 1e9;
    for (int r = 0; r < FLAGS_reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      uint64_t seq = sealer.Begin(ps::seal::Chunks(bytes));
      sealer.Seal(seq, 0, 1, plain.data(), bytes, sealed.data());
      auto t1 = std::chrono::steady_clock::now();
      ps::seal::Opener::Frame f{sealed.data(), sealed.size()};
      if (!opener.Open(&f, 1).ok()) {
        std::fprintf(stderr, "seal_bench: a sealed frame did not open\n");
        return 1;
      }
      auto t2 = std::chrono::steady_clock::now();
      std::memcpy(copy.data(), plain.data(), bytes);
      auto t3 = std::chrono::steady_clock::now();
      seal = std::min(seal, Seconds(t1 - t0));
      open = std::min(open, Seconds(t2 - t1));
      memcpy_s = std::min(memcpy_s, Seconds(t3 - t2));
    }
    std::printf(
        "seal floats=%zu seal_GBps=%.2f open_GBps=%.2f memcpy_GBps=%.2f\n",
        floats, bytes / seal / 1e9, bytes / open / 1e9, bytes / memcpy_s / 1e9);
  }
  return 0;
}
