// Checkpoint sets (src/kv/checkpointer.h): which set a restore takes and
// which sets a writer keeps, as pure functions fed steps and verdicts; the
// schedule of a shard's snapshots; and the same rules on files, for a job
// of two servers and one worker in a fresh temporary folder, also with
// every descriptor of the process taken.
#include "kv/checkpointer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ps {
namespace {

TEST(CheckpointSets, KeepFromTheSecondNewestCompleteSet) {
  const std::set<int> steps = {5, 10, 15, 20};
  std::set<int> complete = {5, 10, 15};
  auto is_complete = [&](int s) { return complete.count(s) > 0; };
  // 20 is incomplete (a file still missing): 15 and 10 are the two sets.
  EXPECT_EQ(OldestKeptStep(steps, is_complete, 2), 10);
  complete.insert(20);
  EXPECT_EQ(OldestKeptStep(steps, is_complete, 2), 15);
  EXPECT_EQ(OldestKeptStep(steps, is_complete, 1), 20);
  // Fewer complete sets than kept: nothing is pruned.
  complete = {20};
  EXPECT_EQ(OldestKeptStep(steps, is_complete, 2), -1);
  EXPECT_EQ(OldestKeptStep({}, is_complete, 2), -1);
}

TEST(CheckpointSets, NewestUsableSetSkipsBadOnesAndStopsAtAForeignFile) {
  std::map<int, Status> verdict = {{5, Status::OK()},
                                   {10, Status::OK()},
                                   {15, Status::Corruption("'s15' is torn")},
                                   {20, Status::NotFound("'w20' is missing")}};
  auto verify = [&](int s) { return verdict.at(s); };
  const std::set<int> steps = {5, 10, 15, 20};
  std::string skipped = "stale";
  StatusOr<int> step = NewestUsableStep(steps, verify, &skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  EXPECT_EQ(skipped, "step 20: 'w20' is missing; step 15: 's15' is torn");

  verdict[10] = Status::InvalidArgument("'s10' was written by another job");
  step = NewestUsableStep(steps, verify, &skipped);
  EXPECT_EQ(step.status().code(), Status::kInvalidArgument);
  EXPECT_EQ(step.status().message(), "'s10' was written by another job");

  verdict[10] = Status::Corruption("'s10' is corrupt");
  verdict[5] = Status::Corruption("'s5' is corrupt");
  step = NewestUsableStep(steps, verify, &skipped);
  EXPECT_EQ(step.status().code(), Status::kNotFound);
  EXPECT_EQ(step.status().message(), skipped);
  EXPECT_NE(skipped.find("step 5: 's5' is corrupt"), std::string::npos);
}

TEST(CheckpointSchedule, EveryNStepsAndTheStepsAskedFor) {
  CheckpointSchedule every5(5, 0);
  EXPECT_FALSE(every5.Due(0));  // the state it starts with
  EXPECT_FALSE(every5.Due(3));
  EXPECT_TRUE(every5.Due(5));
  EXPECT_FALSE(every5.Due(5));  // taken
  every5.At(7);
  every5.At(6);
  EXPECT_TRUE(every5.Due(7));
  EXPECT_FALSE(every5.Due(6));  // reached too late: past the last taken
  EXPECT_TRUE(every5.Due(10));

  CheckpointSchedule asked(0, 10);  // restored at step 10
  asked.At(10);
  EXPECT_FALSE(asked.Due(10));
  EXPECT_FALSE(asked.Due(20));
  asked.At(12);
  EXPECT_TRUE(asked.Due(12));
}

class CheckpointerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp ? tmp : "/tmp") + "/checkpointer_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    job_.dir = pattern;
    job_.num_servers = 2;
    job_.num_workers = 1;
    job_.model_floats = 100;
    job_.chunk = 10;
  }
  void TearDown() override {
    ASSERT_EQ(std::system(("rm -rf " + job_.dir).c_str()), 0);
  }
  void WriteSet(const Checkpointer& c, int step) {
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(c.Write(CheckpointRole::kServer, s, step, "s").ok());
    }
    ASSERT_TRUE(c.Write(CheckpointRole::kWorker, 0, step, "w").ok());
  }
  bool Exists(const Checkpointer& c, int step, CheckpointRole role, int rank) {
    return access(c.Path(step, role, rank).c_str(), F_OK) == 0;
  }

  CheckpointJob job_;
};

// Every role keeps the two newest complete sets and drops older sets
// whole (a set its own write completes at once, others' at their next
// write); a torn file of the newest set makes the restore take the one
// before it, whose every file is still there.
TEST_F(CheckpointerFiles, TwoWholeSetsAreKeptAndATornNewestOneIsSkipped) {
  const Checkpointer c(job_);
  for (int step : {5, 10, 15, 20}) WriteSet(c, step);
  auto count = [&](int step) {
    return Exists(c, step, CheckpointRole::kServer, 0) +
           Exists(c, step, CheckpointRole::kServer, 1) +
           Exists(c, step, CheckpointRole::kWorker, 0);
  };
  EXPECT_EQ(count(5), 0);
  // The worker completed 20 and dropped its 10; the servers, writing 20
  // before it was complete, keep theirs until their next write.
  EXPECT_EQ(count(10), 2);
  EXPECT_FALSE(Exists(c, 10, CheckpointRole::kWorker, 0));
  EXPECT_EQ(count(15), 3);
  EXPECT_EQ(count(20), 3);
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(c.Write(CheckpointRole::kServer, s, 25, "s").ok());
  }
  EXPECT_EQ(count(10), 0);
  EXPECT_EQ(count(15), 3);

  const std::string server1 = c.Path(20, CheckpointRole::kServer, 1);
  ASSERT_EQ(truncate(server1.c_str(), 10), 0);
  std::string skipped;
  StatusOr<int> step = c.FindNewest(&skipped);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 15);
  EXPECT_EQ(skipped, "step 25: '" + c.Path(25, CheckpointRole::kWorker, 0) +
                         "' is missing; step 20: '" + server1 +
                         "' is truncated (10 bytes)");
  EXPECT_EQ(*c.Read(15, CheckpointRole::kServer, 1), "s");
  // The resumed run drops the files after the set it resumed from.
  c.RemoveAfter(15, CheckpointRole::kServer, 0);
  EXPECT_FALSE(Exists(c, 20, CheckpointRole::kServer, 0));
  EXPECT_FALSE(Exists(c, 25, CheckpointRole::kServer, 0));
  EXPECT_TRUE(Exists(c, 20, CheckpointRole::kWorker, 0));
}

// At the process's descriptor limit (every number taken, as a flood of
// connections leaves it), sets are still written, pruned and read back:
// their opens borrow the spares the first Checkpointer set aside, and give
// them back (the process is at its limit again after each).
TEST_F(CheckpointerFiles, SetsAreWrittenAndReadAtTheDescriptorLimit) {
  const Checkpointer c(job_);
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 256);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> taken;
  for (int fd; taken.size() < 4096 &&
               (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
    taken.push_back(fd);
  }
  const int full_errno = errno;
  std::string skipped;
  StatusOr<int> newest = Status::Internal("not run");
  StatusOr<std::string> read = Status::Internal("not run");
  bool full_after = false;
  for (int step : {5, 10, 15}) WriteSet(c, step);
  newest = c.FindNewest(&skipped);
  read = c.Read(15, CheckpointRole::kWorker, 0);
  full_after = open("/dev/null", O_RDONLY) < 0 && errno == EMFILE;
  for (int fd : taken) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_EQ(full_errno, EMFILE);
  ASSERT_TRUE(newest.ok()) << newest.status().message();
  EXPECT_EQ(*newest, 15);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "w");
  EXPECT_FALSE(Exists(c, 5, CheckpointRole::kWorker, 0)) << "not pruned";
  EXPECT_TRUE(full_after) << "a spare was not taken back";
}

}  // namespace
}  // namespace ps
