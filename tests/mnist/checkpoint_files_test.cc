// mnist_dist's checkpoint files (examples/mnist/checkpoint.h) in a fresh
// temporary folder: the newest complete step is found, incomplete newer
// steps are skipped and named, two complete sets are kept by every role,
// corrupt, torn and other jobs' files are refused naming the file, planted
// links and FIFOs are neither followed nor waited on, and a failed write
// leaves no temporary file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace mnist {
namespace {

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp ? tmp : "/tmp") + "/ckpt_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    job_.dir = pattern;
    job_.num_servers = 1;
    job_.num_workers = 2;
    job_.model_floats = 1000;
    job_.chunk = 100;
  }
  void TearDown() override {
    ASSERT_EQ(std::system(("rm -rf " + job_.dir).c_str()), 0);
  }
  void WriteAll(int step, bool last_worker = true) {
    ASSERT_TRUE(WriteCheckpoint(job_, CheckpointRole::kServer, 0, step,
                                "server" + std::to_string(step))
                    .ok());
    for (int w = 0; w < (last_worker ? 2 : 1); ++w) {
      ASSERT_TRUE(WriteCheckpoint(job_, CheckpointRole::kWorker, w, step,
                                  "worker" + std::to_string(w))
                      .ok());
    }
  }
  bool Exists(int step, CheckpointRole role, int rank) {
    return access(CheckpointPath(job_, step, role, rank).c_str(), F_OK) == 0;
  }
  // Overwrites byte `at` of a file (from its end when negative) or cuts it.
  void Damage(const std::string& path, long at, bool cut) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const long size = f.tellg();
    f.close();
    if (cut) {
      ASSERT_EQ(truncate(path.c_str(), size - 3), 0);
      return;
    }
    f.open(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at < 0 ? size + at : at);
    f.put('\x7f');
  }

  CheckpointJob job_;
};

TEST_F(CheckpointFiles, NewestCompleteStepAndItsPayloads) {
  std::string skipped;
  auto none = FindCheckpoint(job_, &skipped);
  EXPECT_EQ(none.status().code(), ps::Status::kNotFound);
  EXPECT_NE(none.status().message().find("no checkpoint in '" + job_.dir),
            std::string::npos)
      << none.status();
  EXPECT_TRUE(CheckEmptyCheckpointDir(job_).ok());

  WriteAll(5);
  WriteAll(10, /*last_worker=*/false);
  auto step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_EQ(skipped, "step 10: '" + job_.dir +
                         "/step-00000010.worker-1.ckpt' is missing");
  // Step 10 is not complete: the files of step 5 stay.
  EXPECT_TRUE(Exists(5, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(5, CheckpointRole::kWorker, 0));
  auto payload = ReadCheckpoint(job_, 5, CheckpointRole::kWorker, 1);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "worker1");

  // Complete now: two complete sets, 5 and 10, so every file of 5 stays.
  ASSERT_TRUE(
      WriteCheckpoint(job_, CheckpointRole::kWorker, 1, 10, "worker1").ok());
  EXPECT_TRUE(Exists(5, CheckpointRole::kWorker, 1));
  EXPECT_TRUE(Exists(5, CheckpointRole::kServer, 0));
  step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  EXPECT_EQ(skipped, "");
  // Step 15 is complete once worker 1 wrote it: the server and worker 0,
  // writing before that, kept step 5; worker 1 dropped its 5 and kept 10.
  WriteAll(15);
  EXPECT_TRUE(Exists(5, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(5, CheckpointRole::kWorker, 0));
  EXPECT_FALSE(Exists(5, CheckpointRole::kWorker, 1));
  EXPECT_TRUE(Exists(10, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kWorker, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kWorker, 1));
  EXPECT_EQ(*ReadCheckpoint(job_, 15, CheckpointRole::kServer, 0), "server15");
  EXPECT_EQ(std::system(("ls " + job_.dir + " | grep -q tmp").c_str()) == 0,
            false)
      << "a temporary file was left";
  // Their next write drops the server's and worker 0's step 5 too; worker
  // 1, completing step 20, drops its 10.
  WriteAll(20);
  EXPECT_FALSE(Exists(5, CheckpointRole::kServer, 0));
  EXPECT_FALSE(Exists(5, CheckpointRole::kWorker, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kWorker, 0));
  EXPECT_FALSE(Exists(10, CheckpointRole::kWorker, 1));
  for (int w = 0; w < 2; ++w)
    EXPECT_TRUE(Exists(15, CheckpointRole::kWorker, w));

  ps::Status st = CheckEmptyCheckpointDir(job_);
  EXPECT_NE(st.message().find("already holds checkpoints (steps 10 to 20)"),
            std::string::npos)
      << st;

  RemoveCheckpointsAfter(job_, 15, CheckpointRole::kWorker, 0);
  EXPECT_FALSE(Exists(20, CheckpointRole::kWorker, 0));
  EXPECT_TRUE(Exists(20, CheckpointRole::kWorker, 1));
}

TEST_F(CheckpointFiles, CorruptTornAndForeignFilesAreNamed) {
  WriteAll(5);
  WriteAll(10);
  const std::string server10 =
      CheckpointPath(job_, 10, CheckpointRole::kServer, 0);
  std::string skipped;

  Damage(server10, -6, /*cut=*/false);  // a payload byte
  auto step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_EQ(skipped,
            "step 10: '" + server10 + "' is corrupt: checksum mismatch");

  WriteAll(10);  // a good file again, then cut short
  Damage(CheckpointPath(job_, 10, CheckpointRole::kWorker, 0), 0, true);
  step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_NE(skipped.find("step-00000010.worker-0.ckpt' is torn: "),
            std::string::npos)
      << skipped;
  auto read = ReadCheckpoint(job_, 10, CheckpointRole::kWorker, 0);
  EXPECT_EQ(read.status().code(), ps::Status::kCorruption);

  WriteAll(10);
  Damage(server10, 0, false);  // the magic
  step = FindCheckpoint(job_, &skipped);
  EXPECT_NE(skipped.find(server10 + "' is no checkpoint"), std::string::npos)
      << skipped;

  // Both sets bad: nothing to restore, each named.
  Damage(CheckpointPath(job_, 5, CheckpointRole::kWorker, 1), -6, false);
  step = FindCheckpoint(job_, &skipped);
  EXPECT_EQ(step.status().code(), ps::Status::kNotFound);
  EXPECT_NE(
      step.status().message().find(
          "step 5: '" + CheckpointPath(job_, 5, CheckpointRole::kWorker, 1) +
          "' is corrupt"),
      std::string::npos)
      << step.status();

  WriteAll(10);
  CheckpointJob other = job_;
  other.num_workers = 3;
  step = FindCheckpoint(other, &skipped);
  EXPECT_EQ(step.status().code(), ps::Status::kInvalidArgument);
  EXPECT_EQ(step.status().message(),
            "'" + server10 +
                "' was written by a job of 1 servers, 2 workers, a model of "
                "1000 floats in keys of 100; this job has 1 servers, 3 "
                "workers, a model of 1000 floats in keys of 100");
  other = job_;
  other.chunk = 50;
  EXPECT_EQ(FindCheckpoint(other, &skipped).status().code(),
            ps::Status::kInvalidArgument);
  step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
}

// The case sets exist for: one torn server file of the newest step. With
// one set kept per worker, nothing was left to restore.
TEST_F(CheckpointFiles, TornNewestServerFileLeavesThePreviousSet) {
  WriteAll(5);
  WriteAll(10);
  WriteAll(15);
  Damage(CheckpointPath(job_, 15, CheckpointRole::kServer, 0), 0, true);
  std::string skipped;
  auto step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  EXPECT_NE(skipped.find("step-00000015.server-0.ckpt' is torn"),
            std::string::npos)
      << skipped;
  for (int w = 0; w < 2; ++w) {
    auto payload = ReadCheckpoint(job_, 10, CheckpointRole::kWorker, w);
    ASSERT_TRUE(payload.ok()) << payload.status();
    EXPECT_EQ(*payload, "worker" + std::to_string(w));
  }
}

// A link planted under the temporary name is removed, not written through;
// the file is private; links and FIFOs under a final name are refused
// without being followed or waited on; an oversized file is refused before
// it is read.
TEST_F(CheckpointFiles, PlantedLinksAndFifosAreNotFollowed) {
  const std::string victim = job_.dir + "/victim";
  {
    std::ofstream f(victim);
    f << "precious";
  }
  const std::string server5 =
      CheckpointPath(job_, 5, CheckpointRole::kServer, 0);
  ASSERT_EQ(symlink(victim.c_str(), (server5 + ".tmp").c_str()), 0);
  WriteAll(5);
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)),
                      std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious");
  struct stat st;
  ASSERT_EQ(lstat(server5.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*ReadCheckpoint(job_, 5, CheckpointRole::kServer, 0), "server5");

  const std::string worker0 =
      CheckpointPath(job_, 5, CheckpointRole::kWorker, 0);
  ASSERT_EQ(unlink(worker0.c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", worker0.c_str()), 0);
  auto read = ReadCheckpoint(job_, 5, CheckpointRole::kWorker, 0);
  EXPECT_EQ(read.status().code(), ps::Status::kCorruption);
  EXPECT_NE(read.status().message().find("is a symbolic link"),
            std::string::npos)
      << read.status();

  const std::string worker1 =
      CheckpointPath(job_, 5, CheckpointRole::kWorker, 1);
  ASSERT_EQ(unlink(worker1.c_str()), 0);
  ASSERT_EQ(mkfifo(worker1.c_str(), 0600), 0);
  read = ReadCheckpoint(job_, 5, CheckpointRole::kWorker, 1);
  EXPECT_EQ(read.status().code(), ps::Status::kCorruption);
  EXPECT_NE(read.status().message().find("is not a regular file"),
            std::string::npos)
      << read.status();

  ASSERT_EQ(unlink(worker1.c_str()), 0);
  ASSERT_EQ(truncate(victim.c_str(), 1 << 24), 0);  // 16 MiB of zeros
  ASSERT_EQ(rename(victim.c_str(), worker1.c_str()), 0);
  read = ReadCheckpoint(job_, 5, CheckpointRole::kWorker, 1);
  EXPECT_EQ(read.status().code(), ps::Status::kCorruption);
  EXPECT_NE(read.status().message().find(
                "16777216 bytes, more than a checkpoint of this job can be"),
            std::string::npos)
      << read.status();
}

// A write that fails part way (here the file size limit, as a full disk
// would) is an error naming the file, and leaves no temporary file.
TEST_F(CheckpointFiles, FailedWriteLeavesNoTemporaryFile) {
  WriteAll(5);
  std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 64;  // smaller than a header and its payload
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const ps::Status st = WriteCheckpoint(job_, CheckpointRole::kServer, 0, 10,
                                        std::string(4096, 'x'));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, SIG_DFL);
  EXPECT_EQ(st.code(), ps::Status::kIOError);
  EXPECT_NE(st.message().find(
                "cannot write '" +
                CheckpointPath(job_, 10, CheckpointRole::kServer, 0) + ".tmp'"),
            std::string::npos)
      << st;
  EXPECT_FALSE(Exists(10, CheckpointRole::kServer, 0));
  EXPECT_NE(std::system(("ls " + job_.dir + " | grep -q tmp").c_str()), 0)
      << "a temporary file was left";
  std::string skipped;
  auto step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
}

TEST_F(CheckpointFiles, FolderIsMadePrivateAndWeightsMustBeFinite) {
  CheckpointJob fresh = job_;
  fresh.dir = job_.dir + "/new";
  ASSERT_TRUE(PrepareCheckpointDir(fresh).ok());
  struct stat st;
  ASSERT_EQ(stat(fresh.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_TRUE(PrepareCheckpointDir(fresh).ok());  // an existing one is fine
  fresh.dir = job_.dir + "/victim-file";
  { std::ofstream f(fresh.dir); }
  EXPECT_EQ(PrepareCheckpointDir(fresh).code(), ps::Status::kIOError);

  std::vector<float> w(10, 1.0f);
  EXPECT_TRUE(CheckFinite(w.data(), w.size(), "the weights").ok());
  w[7] = std::numeric_limits<float>::quiet_NaN();
  const ps::Status bad = CheckFinite(w.data(), w.size(), "the weights");
  EXPECT_EQ(bad.code(), ps::Status::kCorruption);
  EXPECT_NE(bad.message().find("the weights holds a non-finite value (nan) "
                               "at index 7"),
            std::string::npos)
      << bad;
}

}  // namespace
}  // namespace mnist
