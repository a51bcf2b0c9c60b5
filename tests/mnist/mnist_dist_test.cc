// End-to-end tests of mnist_dist through tracker/launch.py on 127.0.0.1:
// accuracy on a subset, BSP equal to single-process training, bounded delay
// within tau, async, a killed worker or server, bad flags in every role and
// three servers. Every job runs under a timeout; every exit code and number
// printed is checked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "job_util.h"
#include "model/backend.h"
#include "model/init.h"

namespace {

using mnist_test::FinalAccuracy;
using mnist_test::Result;
using mnist_test::Shell;

const char* kEnv =
    " --env PS_HEARTBEAT_INTERVAL_MS=200 --env PS_HEARTBEAT_TIMEOUT_MS=2000"
    " --env PS_CONNECT_TIMEOUT_MS=5000 --env PS_RENDEZVOUS_TIMEOUT_MS=20000"
    " --env PS_BARRIER_TIMEOUT_MS=30000";

// The settings the step and accuracy counts below were taken with:
// mnist_dist's defaults before the time-to-accuracy recipe, at the peak lr
// of 2e-3 (later flags override them).
const char* kFormerDefaults =
    " --epochs 1 --batch_size 32 --lr 2e-3 --lr_schedule step "
    "--ema_decay 0 --max_shift 0 --label_smoothing 0 ";

// A job of S servers and W workers; `flags` are mnist_dist's, after
// `defaults`.
Result Launch(int s, int w, const std::string& flags, int timeout_s = 90,
              const char* defaults = kFormerDefaults) {
  std::string cmd = std::string(PS_PYTHON) + " " + PS_LAUNCH + " -s " +
                    std::to_string(s) + " -w " + std::to_string(w) +
                    " --timeout " + std::to_string(timeout_s) + kEnv + " -- " +
                    PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR +
                    " --threads 1 " + defaults + flags;
  return Shell(cmd);
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/mnist_dist_test_" +
         std::to_string(getpid()) + "_" + name;
}

std::vector<std::smatch> FindAll(const std::string& text,
                                 const std::regex& re) {
  std::vector<std::smatch> all;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re);
       it != std::sregex_iterator(); ++it) {
    all.push_back(*it);
  }
  return all;
}

// Server lines "server R done: ... N updates applied, max staleness M, B bad
// requests, C weight copies, S/R frames sent/received by shared memory".
struct ServerReport {
  int updates = -1, staleness = -1, bad = -1;
  long shared_received = -1;
};
std::vector<ServerReport> ServerReports(const Result& r) {
  std::vector<ServerReport> v;
  std::regex re(
      R"(server \d+ done: consistency \w+ max_delay \d+: (\d+) updates applied, max staleness (\d+), (\d+) bad requests, \d+ weight copies, \d+/(\d+) frames)");
  for (const auto& m : FindAll(r.out, re)) {
    v.push_back(
        {std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stol(m[4])});
  }
  return v;
}

// Bytes each server printed it owns; they must tile the model.
std::vector<long> OwnedBytes(const Result& r) {
  std::vector<long> v;
  std::regex re(
      R"(server \d+ owns keys \[\d+, \d+\) = floats \[\d+, \d+\): (\d+) bytes)");
  for (const auto& m : FindAll(r.out, re)) v.push_back(std::stol(m[1]));
  return v;
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

constexpr long kModelBytes = 1199882L * 4;

// The first bytes of `path` ("" if it cannot be read).
std::string FileHead(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string head(n, '\0');
  in.read(&head[0], static_cast<std::streamsize>(n));
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

TEST(MnistDist, TwoServersTwoWorkersReachAccuracy) {
  std::string metrics = TempPath("metrics.jsonl"), png = TempPath("plot.png"),
              svg = TempPath("plot.svg");
  Result r =
      Launch(2, 2,
             "--train_limit 6000 --test_limit 2000 --epochs 1 "
             "--batch_size 32 --optimizer adam --lr 1e-3 --metrics_file " +
                 metrics);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_GE(FinalAccuracy(r.out), 88.0) << r.out;
  std::vector<long> bytes = OwnedBytes(r);
  ASSERT_EQ(bytes.size(), 2u) << r.out;
  EXPECT_EQ(bytes[0] + bytes[1], kModelBytes);
  for (long b : bytes) EXPECT_NEAR(b, kModelBytes / 2, kModelBytes / 20);
  std::vector<ServerReport> reports = ServerReports(r);
  ASSERT_EQ(reports.size(), 2u) << r.out;
  for (const auto& s : reports) {
    EXPECT_EQ(s.updates, 94);  // 3000 images a worker / 32, rounded up
    EXPECT_EQ(s.staleness, 0);
    EXPECT_EQ(s.bad, 0);
  }
  std::ifstream in(metrics);
  std::string all((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("\"loss\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"accuracy\""), std::string::npos) << all;
  // The progress line: step, epoch fraction, loss, samples/s and the time
  // left, once per interval (at least at the epoch's end).
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(\] worker 0 epoch 0 step \d+  \([01]\.\d\d of 1 )"
                        R"(epochs\)  loss \d+\.\d{4}  \d+ samples/s  ETA )"
                        R"(\d+(s|m\d\ds|h\d\dm)\n)")))
      << r.out;
  // The plot, drawn by matplotlib (PS_PLOT_PYTHON has it): a PNG, and an
  // SVG whose lines are paths.
  for (const std::string& out : {png, svg}) {
    Result plot = Shell(std::string(PS_PLOT_PYTHON) + " " + PS_PLOT + " " +
                        metrics + " -o " + out);
    ASSERT_EQ(plot.rc, 0) << plot.out;
  }
  EXPECT_EQ(FileHead(png, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::ifstream svg_in(svg);
  std::string svg_text((std::istreambuf_iterator<char>(svg_in)),
                       std::istreambuf_iterator<char>());
  EXPECT_NE(svg_text.find("<svg"), std::string::npos)
      << svg_text.substr(0, 200);
  EXPECT_NE(svg_text.find("</svg>"), std::string::npos);
  EXPECT_NE(svg_text.find("<path"), std::string::npos);
  EXPECT_NE(svg_text.find("samples/s"), std::string::npos);
  std::remove(metrics.c_str());
  std::remove(png.c_str());
  std::remove(svg.c_str());
}

// --target_accuracy: worker 0 evaluates every quarter epoch and every
// worker stops at the same step, the first evaluation at or above the
// target; the line with the samples and epochs it took agrees with the
// steps each server applied. The default recipe (one-cycle Adam, shifts)
// reaches 90% on 6000 images in well under the 2 planned epochs.
TEST(MnistDist, TargetAccuracyStopsEveryWorkerAtOneStep) {
  Result r = Launch(2, 2,
                    "--train_limit 6000 --test_limit 2000 --epochs 2 "
                    "--target_accuracy 90",
                    90, /*defaults=*/"");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex(R"(reached 90% after (\d+) samples \(([0-9.]+) epochs\) in )"
                 R"([0-9.]+ s of training)")))
      << r.out;
  const int samples = std::stoi(m[1]);
  const double epochs = std::stod(m[2]);
  // 3000 images a worker, batch 16: 188 steps an epoch, evaluations every 47.
  ASSERT_EQ(samples % 32, 0) << r.out;
  const int steps = samples / 32;
  EXPECT_EQ(steps % 47, 0) << r.out;
  EXPECT_LT(epochs, 2.0) << r.out;
  EXPECT_NEAR(epochs, steps / 188.0, 0.01) << r.out;
  EXPECT_GE(FinalAccuracy(r.out), 90.0) << r.out;
  // Every evaluation before the last was below the target.
  const auto evals = FindAll(
      r.out, std::regex(R"(\[worker 0\] worker 0 (step \d+ \([0-9.]+ epochs\)|)"
                        R"(epoch \d+ done): test accuracy ([0-9.]+)%)"));
  ASSERT_EQ(static_cast<int>(evals.size()), steps / 47) << r.out;
  for (size_t i = 0; i + 1 < evals.size(); ++i) {
    EXPECT_LT(std::stod(evals[i][2]), 90.0) << r.out;
  }
  EXPECT_NE(r.out.find("worker 1 final: " + std::to_string(steps) + " steps"),
            std::string::npos)
      << r.out;
  std::vector<ServerReport> reports = ServerReports(r);
  ASSERT_EQ(reports.size(), 2u) << r.out;
  for (const auto& s : reports) {
    EXPECT_EQ(s.updates, steps);
    EXPECT_EQ(s.bad, 0);
  }
}

// W workers of batch B under BSP take the same steps as one process with
// batch W*B: worker r's batch i is part r of the single batch i (strided
// sharding, the same random shifts), and the servers average. 640 images:
// 20 full steps. The two sum each step's gradient in another order (batches
// of 16 and of 32), and training amplifies that rounding: at lr 0.05 it
// reached 3e-3 by step 20 with oneDNN's AVX2 kernels; at lr 0.01 it stays
// near 4e-7. Both smooth the labels by the same fading amount each step
// (the planned steps are the same: 20).
TEST(MnistDist, BspEqualsSingleProcessTraining) {
  const std::string common =
      " --train_limit 640 --test_limit 100 --dropout=false --optimizer sgd"
      " --lr 0.01 --momentum 0.9 --consistency bsp --epochs 1"
      " --lr_schedule onecycle --max_shift 1 --label_smoothing 0.05"
      " --label_smoothing_decay";
  std::string local = TempPath("local.bin"), dist = TempPath("dist.bin");
  Result one = Shell(std::string(PS_MNIST_DIST) + " --local --threads 1 " +
                     "--data_dir " + PS_MNIST_DIR + common +
                     " --batch_size 32 --dump_weights " + local);
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto& views = ps::model::ConvNetTensors();
  std::vector<float> init(ps::model::TotalCount(views));
  ps::model::InitParams(views, 1, init.data());
  // Both ways of exchanging: fc keys during the backward pass, or all after;
  // gradients and weights through shared memory (the default on one host),
  // or through the socket.
  for (const char* how :
       {"--overlap on", "--overlap off", "--overlap off --ps_shm 0"}) {
    SCOPED_TRACE(how);
    const bool shm = std::string(how).find("ps_shm") == std::string::npos;
    Result two = Launch(
        2, 2, common + " " + how + " --batch_size 16 --dump_weights " + dist);
    ASSERT_EQ(two.rc, 0) << two.out;
    std::vector<ServerReport> reports = ServerReports(two);
    ASSERT_EQ(reports.size(), 2u) << two.out;
    for (const auto& s : reports) {
      EXPECT_EQ(s.updates, 20);
      if (shm) {
        EXPECT_GE(s.shared_received, 2 * 20) << "both workers' pushes";
      } else {
        EXPECT_EQ(s.shared_received, 0);
      }
    }
    std::vector<float> a = ReadFloats(local), b = ReadFloats(dist);
    ASSERT_EQ(a.size(), init.size());
    ASSERT_EQ(b.size(), init.size());
    double max_diff = 0, max_moved = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(a[i]) - b[i]));
      max_moved = std::max(max_moved, std::fabs(double(a[i]) - init[i]));
    }
    EXPECT_LT(max_diff, 1e-4);
    EXPECT_GT(max_moved, 1e-2);  // training moved the weights far more
  }
  std::remove(local.c_str());
  std::remove(dist.c_str());
}

// The last worker sleeps every step, so the first runs ahead until the
// servers hold it back: staleness reaches tau and never exceeds it.
TEST(MnistDist, BoundedDelayNeverExceedsTau) {
  Result r = Launch(2, 2,
                    "--train_limit 3000 --test_limit 500 --consistency bounded "
                    "--max_delay 2 --slow_worker_ms 20");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<ServerReport> reports = ServerReports(r);
  ASSERT_EQ(reports.size(), 2u) << r.out;
  for (const auto& s : reports) {
    EXPECT_EQ(s.updates, 47);
    EXPECT_LE(s.staleness, 2);
    EXPECT_GE(s.staleness, 1) << "the fast worker never ran ahead";
  }
  EXPECT_GE(FinalAccuracy(r.out), 70.0) << r.out;
}

TEST(MnistDist, AsyncAppliesEveryPush) {
  Result r =
      Launch(2, 2, "--train_limit 3000 --test_limit 500 --consistency async");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<ServerReport> reports = ServerReports(r);
  ASSERT_EQ(reports.size(), 2u) << r.out;
  for (const auto& s : reports) EXPECT_EQ(s.updates, 2 * 47);
  EXPECT_GE(FinalAccuracy(r.out), 70.0) << r.out;
}

TEST(MnistDist, ThreeServersSplitTheBytes) {
  Result r = Launch(3, 1, "--train_limit 640 --test_limit 200 --batch_size 64");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<long> bytes = OwnedBytes(r);
  ASSERT_EQ(bytes.size(), 3u) << r.out;
  EXPECT_EQ(bytes[0] + bytes[1] + bytes[2], kModelBytes);
  for (long b : bytes) EXPECT_NEAR(b, kModelBytes / 3, kModelBytes / 20);
  for (const auto& s : ServerReports(r)) EXPECT_EQ(s.updates, 10);
  EXPECT_GT(FinalAccuracy(r.out), 0.0) << r.out;
}

void ExpectStopsNaming(const std::string& node) {
  Result r = Launch(2, 2,
                    "--train_limit 6000 --test_limit 200 --die_after_steps 5 "
                    "--die_node " +
                        node,
                    60);
  // Exit 1, not launch.py's 124: the job stopped itself within --timeout 60
  // (no wall-clock assertion: a loaded machine may be slow).
  EXPECT_EQ(r.rc, 1) << r.out;
  std::string name =
      node.substr(0, node.find(':')) + " " + node.substr(node.find(':') + 1);
  EXPECT_NE(r.out.find("launch: " + name + " (pid"), std::string::npos)
      << r.out;
}

TEST(MnistDist, KilledWorkerStopsTheJob) { ExpectStopsNaming("worker:1"); }
TEST(MnistDist, KilledServerStopsTheJob) { ExpectStopsNaming("server:0"); }

// Flags are checked before ps::Start: each role fails alone (within the
// `timeout 20` bound: 124 would fail the exit-code check), naming
// the flag (no scheduler is running).
TEST(MnistDist, BadFlagsFailInEveryRole) {
  const char* cases[][2] = {
      {"--epochs 0", "--epochs must be > 0, got 0"},
      {"--consistency sometimes", "unknown consistency 'sometimes'"},
      {"--optimizer rmsprop", "--optimizer"},
      {"--device tpu", "--device"},
      {"--overlap maybe", "--overlap must be on, off or auto, got maybe"},
      {"--lr_schedule cosine", "lr schedule must be step or onecycle"},
      {"--lr_gamma 0.5", "--lr_gamma, --lr_step and --lr_every_steps need"},
      {"--target_accuracy 101", "--target_accuracy must be in [0, 100], got"},
      {"--eval_every 0", "--eval_every must be in (0, 1], got 0"},
      {"--adam_beta2 1", "--adam_beta2 must be in [0, 1), got 1"},
      {"--die_point later", "--die_point must be update or push, got later"},
      {"--data_dir /nonexistent/mnist", "/nonexistent/mnist"},
  };
  for (const char* role : {"scheduler", "server", "worker"}) {
    for (const auto& c : cases) {
      if (std::string(c[0]).find("data_dir") != std::string::npos &&
          std::string(role) != "worker") {
        continue;  // only workers read data
      }
      std::string cmd = std::string("DMLC_ROLE=") + role +
                        " DMLC_PS_ROOT_PORT=1 DMLC_NUM_SERVER=1 "
                        "DMLC_NUM_WORKER=1 timeout 20 " +
                        PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR + " " +
                        c[0];
      Result r = Shell(cmd);
      EXPECT_EQ(r.rc, 1) << role << " " << c[0] << ": " << r.out;
      EXPECT_NE(r.out.find(c[1]), std::string::npos)
          << role << " " << c[0] << ": " << r.out;
    }
  }
}

TEST(MnistDist, CorruptDataFileIsNamed) {
  std::string dir = TempPath("corrupt");
  ASSERT_EQ(
      Shell("mkdir -p " + dir + " && cp " + PS_MNIST_DIR + "/t10k-* " + dir +
            " && head -c 1000 " + PS_MNIST_DIR + "/train-images-idx3-ubyte > " +
            dir + "/train-images-idx3-ubyte && cp " + PS_MNIST_DIR +
            "/train-labels-idx1-ubyte " + dir)
          .rc,
      0);
  Result r = Shell(std::string(PS_MNIST_DIST) + " --local --data_dir " + dir);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("train-images-idx3-ubyte"), std::string::npos) << r.out;
  Shell("rm -rf " + dir);
}

}  // namespace
