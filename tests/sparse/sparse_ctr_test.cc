// End-to-end tests of sparse_ctr through tracker/launch.py on 127.0.0.1:
// a short job on generated data gets within kMargin of the planted model's
// AUC with over a million rows on the servers; a factorization machine
// trains; Criteo's text format trains, and a bad line, a bad flag or a
// missing file is named with its value; with --replicas 1 a server killed
// mid-run costs nothing (the same rows, the AUC within the margin). Every
// job runs under a timeout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <string>

#include "job_util.h"

namespace {

using mnist_test::Result;
using mnist_test::Shell;

// How far below the ceiling the test AUC of a short job may end.
constexpr double kMargin = 0.01;

const char* kEnv =
    " --env PS_HEARTBEAT_INTERVAL_MS=200 --env PS_HEARTBEAT_TIMEOUT_MS=2000"
    " --env PS_CONNECT_TIMEOUT_MS=5000 --env PS_RENDEZVOUS_TIMEOUT_MS=20000"
    " --env PS_BARRIER_TIMEOUT_MS=60000";

Result Launch(int s, int w, const std::string& flags,
              const std::string& launch_flags = "") {
  return Shell(std::string(PS_PYTHON) + " " + PS_LAUNCH + " -s " +
               std::to_string(s) + " -w " + std::to_string(w) +
               " --timeout 100" + kEnv + " " + launch_flags + " -- " +
               PS_SPARSE_CTR + " --log_every_s 1 " + flags);
}

// Worker 0's final line: AUC, ceiling (-1: unknown) and keys; auc < 0 when
// there is none.
struct Final {
  double auc = -1, ceiling = -1;
  long long keys = -1;
};

Final FinalOf(const std::string& out) {
  Final f;
  std::smatch m;
  const std::regex re(
      R"(\[worker 0\] final: test AUC ([0-9.]+) \(ceiling ([^)]*)\) logloss )"
      R"([0-9.]+.*, [0-9]+ samples in [0-9.]+ s \([0-9]+ samples/s\), )"
      R"(keys ([0-9]+)\n)");
  if (!std::regex_search(out, m, re)) return f;
  f.auc = std::stod(m[1].str());
  const std::string ceiling = m[2].str();
  f.ceiling = ceiling.find("unknown") == 0 ? -1 : std::stod(ceiling);
  f.keys = std::stoll(m[3].str());
  return f;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/sparse_ctr_test_" +
         std::to_string(getpid()) + "_" + name;
}

// `lines` lines of Criteo's text format whose label follows C1 (and I1) with
// some noise; line `bad` (1-based; 0: none) gets `bad_text` as C3.
std::string WriteCriteo(const std::string& name, int lines, int bad = 0,
                        const std::string& bad_text = "") {
  const std::string path = TempPath(name);
  std::ofstream f(path);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 1; i <= lines; ++i) {
    const int c1 = static_cast<int>(u(rng) * 40);
    const int i1 = static_cast<int>(u(rng) * 100);
    const bool label = ((c1 % 3 == 0) || i1 > 90) != (u(rng) < 0.15);
    f << (label ? 1 : 0) << '\t' << i1;
    for (int k = 1; k < 13; ++k) {
      f << '\t';
      if (u(rng) > 0.2) f << static_cast<int>(u(rng) * 1000) - 2;
    }
    for (int k = 0; k < 26; ++k) {
      f << '\t';
      if (k == 2 && i == bad) {
        f << bad_text;
      } else if (k == 0 || u(rng) > 0.1) {
        char hex[16];
        std::snprintf(
            hex, sizeof(hex), "%08x",
            k == 0 ? c1 * 2654435761u : static_cast<unsigned>(u(rng) * 5000));
        f << hex;
      }
    }
    f << '\n';
  }
  return path;
}

// The default shape at 300,000 samples per worker (a sixth of the default
// run): within kMargin of the ceiling and over a million rows, under a
// PS_BARRIER_TIMEOUT_MS (1 s) shorter than the training here takes: no
// barrier may span the training or the evaluation.
TEST(SparseCtr, ShortJobReachesTheCeilingWithAMillionRows) {
  Result r =
      Launch(2, 2, "--samples 300000", "--env PS_BARRIER_TIMEOUT_MS=1000");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Final f = FinalOf(r.out);
  ASSERT_GT(f.auc, 0) << r.out;
  EXPECT_GT(f.ceiling, 0.85) << r.out;
  EXPECT_GE(f.auc, f.ceiling - kMargin) << r.out;
  EXPECT_LE(f.auc, f.ceiling + 0.005) << "above the Bayes ceiling\n" << r.out;
  EXPECT_GE(f.keys, 1000000) << r.out;
  // The count is the servers' own: the sum of what each says it holds.
  std::smatch m;
  long long held = 0;
  std::string rest = r.out;
  const std::regex re(R"(\[server [0-9]+\] server [0-9]+ done: ([0-9]+) rows)");
  while (std::regex_search(rest, m, re)) {
    held += std::stoll(m[1].str());
    rest = m.suffix();
  }
  EXPECT_EQ(held, f.keys) << r.out;
}

TEST(SparseCtr, FactorizationMachineTrains) {
  Result r = Launch(2, 2, "--model fm --fm_dim 4 --samples 200000");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Final f = FinalOf(r.out);
  ASSERT_GT(f.auc, 0) << r.out;
  EXPECT_GE(f.auc, f.ceiling - 2 * kMargin) << r.out;
  EXPECT_NE(r.out.find(" factor rows)"), std::string::npos) << r.out;
}

// With --replicas 1, server 1 is killed after its 100th push: server 0
// serves its rows from the replica, the job ends well, and the servers hold
// exactly the rows of the same job without the fault.
TEST(SparseCtr, KilledServerWithReplicaCostsNothing) {
  const std::string flags = "--samples 150000";
  Result clean = Launch(2, 2, flags);
  ASSERT_EQ(clean.rc, 0) << clean.out;
  Result r = Launch(2, 2,
                    flags +
                        " --replicas 1 --die_node server:1 "
                        "--die_after_pushes 100");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("server 1: killing itself after"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the job survived the loss of server 1"),
            std::string::npos)
      << r.out;
  const Final a = FinalOf(clean.out), b = FinalOf(r.out);
  ASSERT_GT(b.auc, 0) << r.out;
  EXPECT_GE(b.auc, b.ceiling - kMargin) << r.out;
  EXPECT_EQ(b.ceiling, a.ceiling);
  EXPECT_EQ(b.keys, a.keys) << "rows lost or made twice\n" << r.out;
  EXPECT_NEAR(b.auc, a.auc, 0.005) << r.out;
}

// --checkpoint_dir: a set per epoch; --restore goes on after the newest
// with the rows and optimizer state it holds, and ends with the rows of a
// job that never stopped; a folder with a set is refused without --restore.
TEST(SparseCtr, CheckpointsRestoreAfterTheLastEpoch) {
  const std::string dir = TempPath("ckpt");
  const std::string flags = "--samples 60000 --checkpoint_dir " + dir;
  Result a = Launch(2, 2, flags + " --epochs 2");
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_NE(a.out.find("server 1: checkpoint of epoch 2"), std::string::npos)
      << a.out;
  Result again = Launch(2, 2, flags + " --epochs 3");
  EXPECT_NE(again.rc, 0);
  EXPECT_NE(again.out.find("sparse_ctr: --checkpoint_dir: '" + dir +
                           "' already holds checkpoints"),
            std::string::npos)
      << again.out;
  Result b = Launch(2, 2, flags + " --epochs 3 --restore");
  std::system(("rm -rf " + dir).c_str());
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("[worker 1] restore: resuming after epoch 2"),
            std::string::npos)
      << b.out;
  const Final fa = FinalOf(a.out), fb = FinalOf(b.out);
  ASSERT_GT(fb.auc, 0) << b.out;
  // The third epoch's 2 x 60000 samples; its ids were all seen already.
  EXPECT_NE(b.out.find(", 120000 samples in"), std::string::npos) << b.out;
  EXPECT_EQ(fb.keys, fa.keys) << b.out;
  EXPECT_GE(fb.auc, fb.ceiling - 2 * kMargin) << b.out;
}

// Criteo's text format: the last --test_samples lines test; a learnable
// label gives an AUC well above chance, and the ceiling is unknown.
TEST(SparseCtr, CriteoTextTrains) {
  const std::string path = WriteCriteo("good.txt", 20000);
  Result r = Launch(1, 2, "--data " + path + " --test_samples 4000 --epochs 3");
  std::remove(path.c_str());
  ASSERT_EQ(r.rc, 0) << r.out;
  const Final f = FinalOf(r.out);
  EXPECT_GT(f.auc, 0.75) << r.out;
  EXPECT_EQ(f.ceiling, -1) << r.out;
  EXPECT_NE(r.out.find("(ceiling unknown: real data)"), std::string::npos);
  EXPECT_NE(r.out.find(", 48000 samples in"), std::string::npos) << r.out;
}

TEST(SparseCtr, BadLineNamesTheFileLineFieldAndValue) {
  const std::string path = WriteCriteo("bad.txt", 3000, 1234, "xyz");
  Result r = Launch(1, 1, "--data " + path + " --test_samples 500");
  std::remove(path.c_str());
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("sparse_ctr: --data: '" + path +
                       "' line 1234: C3 'xyz' is not a hex string"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("final:"), std::string::npos) << r.out;
}

TEST(SparseCtr, MissingFileAndBadFlagsAreNamedWithTheirValue) {
  Result r = Launch(1, 1, "--data /nonexistent/criteo.txt");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("sparse_ctr: --data: '/nonexistent/criteo.txt': No "
                       "such file"),
            std::string::npos)
      << r.out;
  // Flags are checked before the node starts: no launcher needed.
  const std::string bin = PS_SPARSE_CTR;
  struct Case {
    std::string flags, message;
  } cases[] = {
      {"--batch 0", "--batch must be in [1, 1000000], got 0"},
      {"--model dnn", "--model must be lr or fm, got dnn"},
      {"--optimizer adam", "--optimizer: unknown sparse optimizer 'adam'"},
      {"--zipf 0.1", "--zipf must be in [0.5, 3], got 0.1"},
      {"--test_data x.txt", "--test_data needs --data, got x.txt"},
      {"--l1 -1", "--l1 must be >= 0, got -1"},
  };
  for (const Case& c : cases) {
    Result b = Shell(bin + " " + c.flags);
    EXPECT_EQ(b.rc, 1) << c.flags << "\n" << b.out;
    EXPECT_NE(b.out.find("sparse_ctr: " + c.message), std::string::npos)
        << c.flags << "\n"
        << b.out;
  }
}

}  // namespace
