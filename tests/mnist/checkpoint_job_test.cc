// Checkpoints and failures of mnist_dist end to end, through
// tracker/launch.py on 127.0.0.1 with real processes: a job killed after a
// checkpoint and relaunched with --restore ends with the very bytes of the
// job that was never killed (checkpoints every N steps, or at steps worker
// 0 picks by the clock; a torn server file of the newest set makes it
// resume from the set before); --restore refuses another job shape, and a
// new job a used folder, in every role; a worker killed (SIGKILL) under
// --on_worker_failure continue leaves a job that ends with exit 0, the same
// bytes every time. Every job runs under a timeout; every exit code and
// number printed is checked.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "flood.h"
#include "job_util.h"

namespace {

using mnist_test::FinalAccuracyText;
using mnist_test::ReadBytes;
using mnist_test::Result;
using mnist_test::Shell;

const char* kEnv =
    " --env PS_HEARTBEAT_INTERVAL_MS=200 --env PS_HEARTBEAT_TIMEOUT_MS=2000"
    " --env PS_CONNECT_TIMEOUT_MS=5000 --env PS_RENDEZVOUS_TIMEOUT_MS=20000"
    " --env PS_BARRIER_TIMEOUT_MS=60000";

// 2 servers, 2 workers; `launch` are launch.py's flags, `flags`
// mnist_dist's. 640 images, batch 16: 20 steps an epoch.
std::string LaunchCommand(const std::string& launch, const std::string& flags) {
  return std::string(PS_PYTHON) + " " + PS_LAUNCH + " -s 2 -w 2 --timeout 120" +
         kEnv + " " + launch + " -- " + PS_MNIST_DIST + " --data_dir " +
         PS_MNIST_DIR +
         " --threads 1 --train_limit 640 --test_limit 200"
         " --batch_size 16 --optimizer adam --lr 2e-3"
         " --epochs 1 --lr_schedule step --ema_decay 0 --max_shift 0 " +
         flags;
}

Result Launch(const std::string& launch, const std::string& flags) {
  return Shell(LaunchCommand(launch, flags));
}

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/checkpoint_job_test_" +
                     std::to_string(getpid()) + "_" + name;
  Shell("rm -rf " + path + " && mkdir -p " + path);
  return path;
}

// Starts Launch(launch, flags) in the background, writing to `log`; the
// launcher's pid.
int LaunchInBackground(const std::string& flags, const std::string& log) {
  Result r =
      Shell("(" + std::string(PS_PYTHON) + " " + PS_LAUNCH +
            " -s 2 -w 2 --timeout 120" + kEnv + " -- " + PS_MNIST_DIST +
            " --data_dir " + PS_MNIST_DIR +
            " --threads 1 --train_limit 640 --test_limit 200"
            " --batch_size 16 --optimizer adam --lr 2e-3"
            " --epochs 1 --lr_schedule step --ema_decay 0 --max_shift 0 " +
            flags + " > " + log + " 2>&1 & echo $!)");
  return r.rc == 0 ? std::atoi(r.out.c_str()) : -1;
}

// SIGKILL to every child of `parent`, then to it.
void KillJob(int parent) {
  for (int pid : mnist_test::ProcessesWith({}, parent)) kill(pid, SIGKILL);
  kill(parent, SIGKILL);
}

// The newest step of any checkpoint file in `dir` (-1: none).
int NewestFileStep(const std::string& dir) {
  Result r = Shell("ls " + dir +
                   " | sed -n 's/^step-0*\\([0-9]*\\)\\..*/\\1/p'"
                   " | sort -n | tail -1");
  return r.out.empty() ? -1 : std::atoi(r.out.c_str());
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// "server R done: ... N updates applied, ... L workers lost", per server.
std::vector<std::pair<int, int>> UpdatesAndLost(const std::string& out) {
  std::vector<std::pair<int, int>> v;
  std::regex re(
      R"(server \d+ done: .*: (\d+) updates applied, .* (\d+) workers lost)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    v.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
  }
  return v;
}

// Two epochs (40 steps) with dropout and Adam, run once per test process
// without a stop (with checkpoints every 5 steps, which change nothing):
// the bytes and accuracy every restored job must end with. BSP with two
// workers is exact (a sum of two gradients does not depend on their
// order), so a restored job ends with the very same bytes.
class Checkpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = TempDir("whole");
    Result whole = Launch("",
                          " --epochs 2 --checkpoint_every_steps 5"
                          " --checkpoint_dir " +
                              dir + " --dump_weights " + dir + "/weights.bin");
    whole_rc_ = whole.rc;
    whole_out_ = whole.out;
    whole_bytes_ = ReadBytes(dir + "/weights.bin");
    Shell("rm -rf " + dir);
  }
  void SetUp() override {
    ASSERT_EQ(whole_rc_, 0) << whole_out_;
    for (const auto& [updates, lost] : UpdatesAndLost(whole_out_)) {
      EXPECT_EQ(updates, 40);
      EXPECT_EQ(lost, 0);
    }
    ASSERT_EQ(whole_bytes_.size(), 1199882u * 4);
    ASSERT_NE(FinalAccuracyText(whole_out_), "none") << whole_out_;
  }
  // A restored job: exit 0, `step` resumed by all 4 processes, 40 updates,
  // the bytes and accuracy of the job never stopped.
  void ExpectSameEnd(const Result& restored, const std::string& bin,
                     const std::string& dir, int step) {
    ASSERT_EQ(restored.rc, 0) << restored.out;
    EXPECT_EQ(Count(restored.out,
                    "restore: resuming from the checkpoint of "
                    "step " +
                        std::to_string(step) + " in " + dir),
              4)
        << restored.out;
    std::vector<std::pair<int, int>> reports = UpdatesAndLost(restored.out);
    ASSERT_EQ(reports.size(), 2u) << restored.out;
    for (const auto& [updates, lost] : reports) EXPECT_EQ(updates, 40);
    EXPECT_TRUE(ReadBytes(bin) == whole_bytes_)
        << "the job restored from step " << step << " ends with other weights";
    EXPECT_EQ(FinalAccuracyText(restored.out), FinalAccuracyText(whole_out_))
        << restored.out;
  }

  static int whole_rc_;
  static std::string whole_out_, whole_bytes_;
};
int Checkpoint::whole_rc_ = -1;
std::string Checkpoint::whole_out_, Checkpoint::whole_bytes_;

// Checkpoints every 5 steps; worker 1 kills itself after 27 steps and the
// launcher stops the others at once. Step 25 is complete on disk by then
// (worker 1 finishing step 26 means every node passed step 25) and step 30
// cannot be (worker 1 never pushes step 27): the relaunch resumes at 25 in
// every role. Then --restore refuses another job shape, and a new job the
// used folder, in a server and a worker (they fail before ps::Start, so no
// scheduler is needed; `timeout 20` bounds them).
TEST_F(Checkpoint, KilledJobRestoresToTheSameBytes) {
  const std::string dir = TempDir("killed"), bin = dir + "/weights.bin";
  const std::string flags =
      " --epochs 2 --checkpoint_every_steps 5 --checkpoint_dir " + dir;
  Result killed =
      Launch("", flags + " --die_node worker:1 --die_after_steps 27");
  ASSERT_EQ(killed.rc, 1) << killed.out;
  EXPECT_NE(killed.out.find("launch: worker 1 (pid"), std::string::npos)
      << killed.out;
  ExpectSameEnd(Launch("", flags + " --restore --dump_weights " + bin), bin,
                dir, 25);

  for (const char* role : {"server", "worker"}) {
    Result r = Shell(std::string("DMLC_ROLE=") + role +
                     " DMLC_PS_ROOT_PORT=1 DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=3"
                     " timeout 20 " +
                     PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR +
                     " --train_limit 640 --checkpoint_every_steps 5"
                     " --checkpoint_dir " +
                     dir + " --restore");
    EXPECT_EQ(r.rc, 1) << role << ": " << r.out;
    EXPECT_NE(r.out.find("mnist_dist: --restore: '" + dir +
                         "/step-00000040.server-0.ckpt' was written by a job "
                         "of 2 servers, 2 workers"),
              std::string::npos)
        << role << ": " << r.out;
    EXPECT_NE(r.out.find("this job has 2 servers, 3 workers"),
              std::string::npos)
        << role << ": " << r.out;
    r = Shell(std::string("DMLC_ROLE=") + role +
              " DMLC_PS_ROOT_PORT=1 DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2"
              " timeout 20 " +
              PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR +
              " --train_limit 640 --checkpoint_every_steps 5"
              " --checkpoint_dir " +
              dir);
    EXPECT_EQ(r.rc, 1) << role << ": " << r.out;
    EXPECT_NE(r.out.find("mnist_dist: --checkpoint_dir: '" + dir +
                         "' already holds checkpoints"),
              std::string::npos)
        << role << ": " << r.out;
  }
  Shell("rm -rf " + dir);
}

// What whole sets are kept for: the job killed as above (the sets of steps
// 20 and 25 complete on disk), then one server's file of the newest step
// torn (cut short, as a crash during a copy leaves it). --restore names
// the file in every role, skips step 25 and resumes from 20, and the job
// ends with the bytes of the job never stopped.
TEST_F(Checkpoint, TornServerFileRestoresThePreviousSet) {
  const std::string dir = TempDir("torn"), bin = dir + "/weights.bin";
  const std::string flags =
      " --epochs 2 --checkpoint_every_steps 5 --checkpoint_dir " + dir;
  Result killed =
      Launch("", flags + " --die_node worker:1 --die_after_steps 27");
  ASSERT_EQ(killed.rc, 1) << killed.out;
  const std::string server1 = dir + "/step-00000025.server-1.ckpt";
  const size_t size = ReadBytes(server1).size();
  ASSERT_GT(size, 1000u) << killed.out;
  ASSERT_EQ(truncate(server1.c_str(), static_cast<off_t>(size / 2)), 0);
  Result restored = Launch("", flags + " --restore --dump_weights " + bin);
  EXPECT_EQ(
      Count(restored.out, "restore: skipping unusable checkpoints: step 25: '" +
                              server1 + "' is torn: "),
      4)
      << restored.out;
  ExpectSameEnd(restored, bin, dir, 20);
  Shell("rm -rf " + dir);
}

// Checkpoints by the clock (--checkpoint_every_s), and every process of the
// job killed with SIGKILL at once from outside, at whatever point it is
// once a file of step 15 or later exists (maybe in the middle of writing
// one): the step resumed from is not known in advance, but every role
// resumes from the same one, and the end is the same.
TEST_F(Checkpoint, JobKilledFromOutsideRestoresToTheSameBytes) {
  const std::string dir = TempDir("clock"), bin = dir + "/weights.bin";
  const std::string flags =
      " --epochs 2 --checkpoint_every_s 0.2 --checkpoint_dir " + dir;
  const int launcher = LaunchInBackground(flags, dir + ".log");
  ASSERT_GT(launcher, 0);
  for (int i = 0; i < 6000 && NewestFileStep(dir) < 15; ++i) {
    usleep(20 * 1000);  // bounded: 6000 x 20 ms
  }
  KillJob(launcher);
  for (int i = 0; i < 500 && kill(launcher, 0) == 0; ++i) usleep(20 * 1000);
  const std::string log = ReadBytes(dir + ".log");
  EXPECT_GE(NewestFileStep(dir), 15) << log;
  EXPECT_EQ(log.find("final: test accuracy"), std::string::npos)
      << "the job ended before it was killed: " << log;

  Result restored = Launch("", flags + " --restore --dump_weights " + bin);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      restored.out, m,
      std::regex(R"(resuming from the checkpoint of step (\d+))")))
      << restored.out;
  const int step = std::stoi(m[1]);
  EXPECT_GE(step, 1);
  EXPECT_LE(step, 40);
  ExpectSameEnd(restored, bin, dir, step);
  Shell("rm -rf " + dir + " " + dir + ".log");
}

// Compression with error feedback (topk, values through the sockets, pulls
// in bf16): what each worker kept unsent is in its checkpoint, so a job
// killed after step 25 and restored ends with the bytes of the same job
// never killed. (Without the kept values in the files it would not.)
TEST(CompressedCheckpoint, KilledJobRestoresToTheSameBytes) {
  const std::string dir = TempDir("compressed"), bin = dir + "/weights.bin";
  const std::string whole_bin = dir + "/whole.bin";
  const std::string shm = "--env PS_SHM=0";
  const std::string compress = " --compress topk:0.05,pull=bf16";
  Result whole =
      Launch(shm, " --epochs 2" + compress + " --dump_weights " + whole_bin);
  ASSERT_EQ(whole.rc, 0) << whole.out;
  const std::string flags = " --epochs 2 --checkpoint_every_steps 5" +
                            compress + " --checkpoint_dir " + dir;
  Result killed =
      Launch(shm, flags + " --die_node worker:1 --die_after_steps 27");
  ASSERT_EQ(killed.rc, 1) << killed.out;
  Result restored = Launch(shm, flags + " --restore --dump_weights " + bin);
  ASSERT_EQ(restored.rc, 0) << restored.out;
  EXPECT_EQ(Count(restored.out,
                  "restore: resuming from the checkpoint of step 25 in " + dir),
            4)
      << restored.out;
  const std::string want = ReadBytes(whole_bin);
  ASSERT_EQ(want.size(), 1199882u * 4);
  EXPECT_TRUE(ReadBytes(bin) == want)
      << "the compressed job restored from step 25 ends with other weights";
  EXPECT_EQ(FinalAccuracyText(restored.out), FinalAccuracyText(whole.out));
  Shell("rm -rf " + dir);
}

// The child of `parent` whose environment says DMLC_ROLE=`role` (-1: none).
int ChildWithRole(int parent, const std::string& role) {
  std::vector<int> pids =
      mnist_test::ProcessesWith({"DMLC_ROLE=" + role}, parent);
  return pids.empty() ? -1 : pids.front();
}

// The scheduler killed (SIGKILL) while the job trains: every member sees
// its connection to the scheduler close for good and stops, naming it; the
// job relaunched with --restore resumes from the last complete checkpoint
// and ends with the bytes of the job never stopped. (The last worker sleeps
// every step so that the job is still training when the kill comes; sleep
// changes no number.)
TEST_F(Checkpoint, KilledSchedulerRestoresToTheSameBytes) {
  const std::string dir = TempDir("scheduler"), bin = dir + "/weights.bin";
  const std::string flags =
      " --epochs 2 --checkpoint_every_steps 5 --checkpoint_dir " + dir;
  const int launcher =
      LaunchInBackground(flags + " --slow_worker_ms 100", dir + ".log");
  ASSERT_GT(launcher, 0);
  for (int i = 0; i < 6000 && NewestFileStep(dir) < 10; ++i) {
    usleep(20 * 1000);  // bounded: 6000 x 20 ms
  }
  const int scheduler = ChildWithRole(launcher, "scheduler");
  ASSERT_GT(scheduler, 0) << ReadBytes(dir + ".log");
  ASSERT_EQ(kill(scheduler, SIGKILL), 0);
  for (int i = 0; i < 3000 && kill(launcher, 0) == 0; ++i) {
    usleep(20 * 1000);  // bounded: 60 s
  }
  const std::string log = ReadBytes(dir + ".log");
  EXPECT_NE(log.find("launch: scheduler (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("scheduler (tcp://"), std::string::npos) << log;
  EXPECT_NE(log.find("closed and could not be made again"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("final: test accuracy"), std::string::npos)
      << "the job ended before the scheduler was killed: " << log;

  Result restored = Launch("", flags + " --restore --dump_weights " + bin);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      restored.out, m,
      std::regex(R"(resuming from the checkpoint of step (\d+))")))
      << restored.out;
  const int step = std::stoi(m[1]);
  EXPECT_GE(step, 10);
  ExpectSameEnd(restored, bin, dir, step);
  Shell("rm -rf " + dir + " " + dir + ".log");
}

// A server failover, then checkpoints (--replicas 1, values through the
// sockets): server 1 kills itself after 12 updates and server 0, its
// replica, takes its keys over. From then on server 0 also writes server
// 1's file of each set, so the newest two sets (35 and 40) stay whole and
// the older ones are pruned as sets. The job ends with the bytes of the
// job never stopped; so does one restored from step 35 (set 40 removed),
// whose server-1 file the replica wrote.
TEST_F(Checkpoint, ReplicaWritesTheCheckpointsOfAFailedServer) {
  const std::string dir = TempDir("failover"), bin = dir + "/weights.bin";
  const std::string flags =
      " --epochs 2 --checkpoint_every_steps 5"
      " --replicas 1 --checkpoint_dir " +
      dir + " --dump_weights " + bin;
  Result failover = Launch("--env PS_SHM=0",
                           flags + " --die_node server:1 --die_after_steps 12");
  ASSERT_EQ(failover.rc, 0) << failover.out;
  EXPECT_NE(failover.out.find("the job survived the loss of server 1"),
            std::string::npos)
      << failover.out;
  EXPECT_TRUE(ReadBytes(bin) == whole_bytes_)
      << "the job that failed over ends with other weights";
  for (int step : {15, 40}) {
    EXPECT_NE(failover.out.find("server 0: checkpoint of step " +
                                std::to_string(step) + " for server 1, "),
              std::string::npos)
        << failover.out;
  }
  const Result listed = Shell("ls " + dir + " | grep ckpt");
  for (const char* step : {"35", "40"}) {
    for (const char* who : {"server-0", "server-1", "worker-0", "worker-1"}) {
      const std::string file =
          std::string("step-000000") + step + "." + who + ".ckpt";
      EXPECT_NE(listed.out.find(file), std::string::npos) << listed.out;
    }
  }
  for (const char* pruned :
       {"step-00000005.", "step-00000020.", "step-00000025."}) {
    EXPECT_EQ(listed.out.find(pruned), std::string::npos) << listed.out;
  }

  Shell("rm -f " + dir + "/step-00000040.* " + bin);
  const std::string restore =
      " --epochs 2 --checkpoint_every_steps 5"
      " --replicas 1 --checkpoint_dir " +
      dir + " --restore --dump_weights " + bin;
  ExpectSameEnd(Launch("--env PS_SHM=0", restore), bin, dir, 35);
  Shell("rm -rf " + dir);
}

// Anyone can open TCP connections to a node's port. A stranger opens 480
// idle ones a second to the ports of every server and worker of a
// checkpointing job (PS_PORT_RANGE), each held up to 15 s, while each
// process of the job may hold 512 descriptors (ulimit -n): without a
// deadline a node would hold about 80 more each second of the job's 6
// epochs, past its limit, and fail its checkpoints and connections. A node
// closes each within PS_HANDSHAKE_TIMEOUT_MS (3 s): every checkpoint is
// written, and the job ends with the bytes of the same job never flooded.
TEST(Flood, IdleConnectionsStarveNoCheckpoint) {
  const std::string dir = TempDir("flood"), bin = dir + "/weights.bin";
  const int lo = 30000 + getpid() % 20000, hi = lo + 5;
  const std::string launch =
      "--env PS_PORT_RANGE=" + std::to_string(lo) + "-" + std::to_string(hi);
  // The last worker sleeps 25 ms a step: the job's 120 steps last at
  // least 3 s, however fast the machine, so the flood outgrows the limit.
  const std::string flags =
      " --epochs 6 --checkpoint_every_steps 10 --slow_worker_ms 25"
      " --checkpoint_dir " +
      dir + " --dump_weights " + bin;
  Result quiet = Shell("ulimit -n 512 && " + LaunchCommand(launch, flags));
  ASSERT_EQ(quiet.rc, 0) << quiet.out;
  const std::string quiet_bytes = ReadBytes(bin);
  Shell("rm -rf " + dir + " && mkdir -p " + dir);

  mnist_test::Flood flood(lo, hi, 480, 15);
  Result r = Shell("ulimit -n 512 && " + LaunchCommand(launch, flags));
  flood.Stop();
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(ReadBytes(bin) == quiet_bytes)
      << "the flooded job ends with other weights";
  EXPECT_EQ(r.out.find("not written"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Too many open files"), std::string::npos) << r.out;
  const Result listed = Shell("ls " + dir + " | grep -c '^step-00000120'");
  EXPECT_EQ(listed.out, "4\n") << listed.out;
  EXPECT_GT(flood.accepted(), 1000) << "the flood did not reach the job";
  EXPECT_EQ(flood.held_in_full(), 0);
  std::printf(
      "flood: %d connections accepted, %d closed by a node, at most %d open "
      "at once\n",
      flood.accepted(), flood.closed_by_node(), flood.peak_open());
  Shell("rm -rf " + dir);
}

// The sum of the connections each node's van reports it shut down.
int ShutByTheVans(const std::string& out, int* reports) {
  std::regex re(R"(van: shut down (\d+) idle connections)");
  int sum = 0;
  *reports = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    sum += std::stoi((*it)[1]);
    ++*reports;
  }
  return sum;
}

// A flood past the descriptor limit: each process of a checkpointing job
// may hold 1,024 descriptors (ulimit -n), the handshake deadline is past
// the job's end (60 s), and a stranger opens 4,000 idle connections a
// second to the ports of the servers and workers, keeping up to 1,500 open
// to each (each one closed replaced): each node is offered more
// connections than it has descriptors, and only the caps on idle
// connections hold them off (PS_MAX_IDLE_CONNECTIONS_PER_SOURCE, a sixteenth of
// the limit: 64, all come from 127.0.0.1; the oldest shut first). Every
// checkpoint file of every step is completed (seen as it is renamed into the
// folder), no open fails, the job ends with the bytes of the same job
// never flooded, and the vans report the connections they shut.
TEST(Flood, HeldIdleConnectionsPastTheDescriptorLimitCostNoCheckpoint) {
  const std::string dir = TempDir("held"), bin = dir + "/weights.bin";
  const int lo = 30000 + (getpid() + 10000) % 20000, hi = lo + 5;
  const std::string launch = "--env PS_PORT_RANGE=" + std::to_string(lo) + "-" +
                             std::to_string(hi) +
                             " --env PS_HANDSHAKE_TIMEOUT_MS=60000";
  // The last worker sleeps 40 ms a step: the job's 80 steps last at least
  // 3.2 s, however fast the machine, so each node is offered its limit.
  const std::string flags =
      " --epochs 4 --checkpoint_every_steps 5 --slow_worker_ms 40"
      " --checkpoint_dir " +
      dir + " --dump_weights " + bin;
  Result quiet = Shell("ulimit -n 1024 && " + LaunchCommand(launch, flags));
  ASSERT_EQ(quiet.rc, 0) << quiet.out;
  const std::string quiet_bytes = ReadBytes(bin);
  ASSERT_EQ(quiet_bytes.size(), 1199882u * 4);
  Shell("rm -rf " + dir + " && mkdir -p " + dir);

  mnist_test::RenameWatch renamed(dir);
  ASSERT_TRUE(renamed.ok()) << "inotify on " << dir;
  mnist_test::Flood flood(lo, hi, 4000, 600, 1500);
  Result r = Shell("ulimit -n 1024 && " + LaunchCommand(launch, flags));
  flood.Stop();
  renamed.Stop();
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(ReadBytes(bin) == quiet_bytes)
      << "the flooded job ends with other weights";
  EXPECT_EQ(r.out.find("not written"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Too many open files"), std::string::npos) << r.out;
  const std::set<std::string> names = renamed.names();
  for (int step = 5; step <= 80; step += 5) {
    for (const char* who : {"server-0", "server-1", "worker-0", "worker-1"}) {
      char file[64];
      std::snprintf(file, sizeof(file), "step-%08d.%s.ckpt", step, who);
      EXPECT_EQ(names.count(file), 1u) << file << " was never completed";
    }
  }
  const Result kept =
      Shell("ls " + dir + " | grep -cE '^step-000000(75|80)[.]'");
  EXPECT_EQ(kept.out, "8\n") << "the sets of steps 75 and 80";
  // More than its descriptor limit offered to each of the 4 nodes.
  const std::vector<int> by_port = flood.accepted_by_port();
  EXPECT_EQ(std::count_if(by_port.begin(), by_port.end(),
                          [](int n) { return n > 1024; }),
            4)
      << "the flood did not reach every node past its limit";
  EXPECT_GE(flood.peak_held(), 1500);
  int reports = 0;
  const int shut = ShutByTheVans(r.out, &reports);
  EXPECT_EQ(reports, 4) << r.out;
  // All but those each node held (64) when the job ended and those still
  // in each port's listen backlog (ZMQ_BACKLOG, 100) when it closed, which
  // no node ever saw.
  EXPECT_GE(shut, flood.accepted() - 4 * (64 + 100) - 64) << r.out;
  std::printf(
      "flood: %d connections accepted, %d shut down by the nodes, at most %d "
      "open at once (%d held by the flood)\n",
      flood.accepted(), shut, flood.peak_open(), flood.peak_held());
  Shell("rm -rf " + dir);
}

// Worker 1 kills itself (SIGKILL) after 5 of its 20 steps; under continue
// the launcher and the other nodes go on: the servers apply all 20 steps
// (from step 5 on with worker 0's gradient alone), worker 0 reports its
// accuracy, and every process left exits 0. The outcome does not depend on
// when the death was noticed: a second run ends with the same bytes.
TEST(Continue, KilledWorkerLetsTheJobFinish) {
  const std::string dir = TempDir("continue");
  std::string bytes[2];
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::string bin = dir + "/weights" + std::to_string(run) + ".bin";
    Result r = Launch("--tolerate worker",
                      "--on_worker_failure continue --die_node worker:1 "
                      "--die_after_steps 5 --dump_weights " +
                          bin);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("launch: worker 1 (pid"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("was killed by signal SIGKILL; the job goes on "
                         "(--tolerate worker)"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("launch: 4 processes exited 0"), std::string::npos)
        << r.out;
    std::vector<std::pair<int, int>> reports = UpdatesAndLost(r.out);
    ASSERT_EQ(reports.size(), 2u) << r.out;
    for (const auto& [updates, lost] : reports) {
      EXPECT_EQ(updates, 20);
      EXPECT_EQ(lost, 1);
    }
    EXPECT_EQ(r.out.find("worker 1 final"), std::string::npos) << r.out;
    const std::string acc = FinalAccuracyText(r.out);
    ASSERT_NE(acc, "none") << r.out;
    EXPECT_GE(std::stod(acc), 60.0) << r.out;
    bytes[run] = ReadBytes(bin);
    EXPECT_EQ(bytes[run].size(), 1199882u * 4);
  }
  EXPECT_TRUE(bytes[0] == bytes[1]) << "the two runs' weights differ";
  Shell("rm -rf " + dir);
}

}  // namespace
