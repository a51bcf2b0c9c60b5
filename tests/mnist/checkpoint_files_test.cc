// mnist_dist's checkpoint files (examples/mnist/checkpoint.h) in a fresh
// temporary folder: the newest complete step is found, incomplete newer
// steps are skipped and named, the previous step stays until the new one is
// complete, and corrupt, torn and other jobs' files are refused naming the
// file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

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

  // Complete now: the last writer drops its step 5; the others drop theirs
  // at their next checkpoint.
  ASSERT_TRUE(
      WriteCheckpoint(job_, CheckpointRole::kWorker, 1, 10, "worker1").ok());
  EXPECT_FALSE(Exists(5, CheckpointRole::kWorker, 1));
  EXPECT_TRUE(Exists(5, CheckpointRole::kServer, 0));
  step = FindCheckpoint(job_, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  EXPECT_EQ(skipped, "");
  // Step 15 is complete once worker 1 wrote it: the server and worker 0,
  // writing before that, kept step 10 (and dropped 5); worker 1 dropped 10.
  WriteAll(15);
  EXPECT_FALSE(Exists(5, CheckpointRole::kServer, 0));
  EXPECT_FALSE(Exists(5, CheckpointRole::kWorker, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(10, CheckpointRole::kWorker, 0));
  EXPECT_FALSE(Exists(10, CheckpointRole::kWorker, 1));
  EXPECT_EQ(*ReadCheckpoint(job_, 15, CheckpointRole::kServer, 0), "server15");
  EXPECT_EQ(std::system(("ls " + job_.dir + " | grep -q tmp").c_str()) == 0,
            false)
      << "a temporary file was left";

  ps::Status st = CheckEmptyCheckpointDir(job_);
  EXPECT_NE(st.message().find("already holds checkpoints (steps 10 to 15)"),
            std::string::npos)
      << st;

  RemoveCheckpointsAfter(job_, 5, CheckpointRole::kWorker, 0);
  EXPECT_FALSE(Exists(15, CheckpointRole::kWorker, 0));
  EXPECT_TRUE(Exists(15, CheckpointRole::kWorker, 1));
}

TEST_F(CheckpointFiles, CorruptTornAndForeignFilesAreNamed) {
  WriteAll(5);
  WriteAll(10);
  const std::string server10 =
      CheckpointPath(job_, 10, CheckpointRole::kServer, 0);
  std::string skipped;

  Damage(server10, -6, /*cut=*/false);  // a payload byte
  auto step = FindCheckpoint(job_, &skipped);
  EXPECT_EQ(step.status().code(), ps::Status::kNotFound);
  EXPECT_EQ(step.status().message(),
            "no usable checkpoint in '" + job_.dir + "': step 10: '" +
                server10 + "' is corrupt: checksum mismatch; step 5: '" +
                CheckpointPath(job_, 5, CheckpointRole::kWorker, 1) +
                "' is missing");

  WriteAll(10);  // a good file again, then cut short
  Damage(CheckpointPath(job_, 10, CheckpointRole::kWorker, 0), 0, true);
  step = FindCheckpoint(job_, &skipped);
  EXPECT_NE(step.status().message().find("step-00000010.worker-0.ckpt' is "
                                         "torn: "),
            std::string::npos)
      << step.status();
  auto read = ReadCheckpoint(job_, 10, CheckpointRole::kWorker, 0);
  EXPECT_EQ(read.status().code(), ps::Status::kCorruption);

  WriteAll(10);
  Damage(server10, 0, false);  // the magic
  step = FindCheckpoint(job_, &skipped);
  EXPECT_NE(step.status().message().find(server10 + "' is no checkpoint"),
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

}  // namespace
}  // namespace mnist
