// Faults, end to end: mnist_dist through tracker/launch.py.
// - Lost messages: the test switch PS_DROP_MSG drops received KV messages at
//   random. Every request is resent until answered and applied once, so a
//   BSP job ends with weights bit-identical to the same job without drops.
// - A killed node: its connections close, and the scheduler declares it
//   dead from that (not from missed heartbeats), naming it by role and
//   rank; no healthy node is blamed. A killed scheduler is named by the
//   members the same way.
// - Replication: with --replicas 1 a server killed at any step costs no
//   step; the weights equal the fault-free job's bit for bit.
// - Restarts: with launch.py --max-restarts a killed worker is started
//   again and rejoins; every update still has both workers' gradients, and
//   a worker killed between steps resumes bit-exactly. A killed scheduler
//   is started again and takes the job over; nothing is lost.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "job_util.h"

namespace {

using mnist_test::FinalAccuracy;
using mnist_test::ReadBytes;
using mnist_test::Result;
using mnist_test::Shell;

// A BSP job of S servers and 2 workers; `env` are launch.py options
// (--env ones: later ones win).
std::string LaunchCommand(const std::string& env, const std::string& flags,
                          int s = 2) {
  return std::string(PS_PYTHON) + " " + PS_LAUNCH + " -s " + std::to_string(s) +
         " -w 2 --timeout 240"
         " --env PS_HEARTBEAT_INTERVAL_MS=200 --env "
         "PS_HEARTBEAT_TIMEOUT_MS=5000"
         " --env PS_BARRIER_TIMEOUT_MS=60000 --env PS_RESEND_TIMEOUT_MS=100 " +
         env + " -- " + PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR +
         " --threads 1 --consistency bsp --dropout=false --optimizer sgd"
         " --lr 0.02 --momentum 0.5 --batch_size 16 --test_limit 500"
         " --epochs 1 --lr_schedule step --ema_decay 0 --max_shift 0 " +
         flags;
}

Result Launch(const std::string& env, const std::string& flags, int s = 2) {
  return Shell(LaunchCommand(env, flags, s));
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/fault_test_" +
         std::to_string(getpid()) + "_" + name;
}

// Expects the model weights dumped at `expected` and `got` to be the same
// bytes (`why` names the fault on failure), then removes both files.
void ExpectSameWeights(const std::string& expected, const std::string& got,
                       const std::string& why) {
  std::string wa = ReadBytes(expected), wb = ReadBytes(got);
  EXPECT_EQ(wa.size(), 1199882u * 4);
  EXPECT_TRUE(wa == wb) << "weights differ " << why;
  std::remove(expected.c_str());
  std::remove(got.c_str());
}

// A job started in the background, so that the test can act on it while it
// runs: its output and exit code land in files (removed at the end).
class BackgroundJob {
 public:
  explicit BackgroundJob(const std::string& name)
      : out_(TempPath(name + ".out")), rc_(TempPath(name + ".rc")) {}
  ~BackgroundJob() {
    std::remove(out_.c_str());
    std::remove(rc_.c_str());
  }
  bool Start(const std::string& cmd) {
    return std::system(
               ("(" + cmd + " >" + out_ + " 2>&1; echo $? >" + rc_ + ") &")
                   .c_str()) == 0;
  }
  std::string Output() const { return ReadBytes(out_); }
  // Polls the output for `text`, for at most `seconds`.
  bool WaitFor(const std::string& text, int seconds) const {
    for (int i = 0; i < seconds * 10; ++i) {
      if (Output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // The exit code ("1\n"), or "" when it did not end within `seconds`.
  std::string Code(int seconds) const {
    std::string code;
    for (int i = 0; i < seconds * 10 && code.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      code = ReadBytes(rc_);
    }
    return code;
  }

 private:
  const std::string out_, rc_;
};

// Sums of the "ps: NODE: R requests resent, D duplicates let go, X
// messages dropped by PS_DROP_MSG" lines of every node.
struct Counters {
  long resent = 0, duplicates = 0, dropped = 0;
  int lines = 0;
};
Counters ResendCounters(const std::string& out) {
  Counters c;
  std::regex re(
      R"(ps: .*: (\d+) requests resent, (\d+) duplicates let go, (\d+) messages dropped by PS_DROP_MSG)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    c.resent += std::stol((*it)[1]);
    c.duplicates += std::stol((*it)[2]);
    c.dropped += std::stol((*it)[3]);
    ++c.lines;
  }
  return c;
}

int UpdatesOf(const std::string& out, int server) {
  std::smatch m;
  std::regex re(
      "server " + std::to_string(server) +
      R"( done: consistency \w+ max_delay \d+: (\d+) updates applied)");
  return std::regex_search(out, m, re) ? std::stoi(m[1]) : -1;
}

// 3200 images, 100 steps of 2 x 16: about 1,600 KV messages received in
// all, so 1% drops some 16 of them (none at all: p < 1e-7).
void ExpectSameWeightsUnderDrops(const std::string& how) {
  const std::string flags = "--train_limit 3200 " + how;
  std::string clean = TempPath("clean.bin"), lossy = TempPath("lossy.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(ResendCounters(a.out).dropped, 0) << a.out;
  Result b = Launch("--env PS_DROP_MSG=1", flags + " --dump_weights " + lossy);
  ASSERT_EQ(b.rc, 0) << b.out;
  Counters c = ResendCounters(b.out);
  EXPECT_GT(c.dropped, 0) << b.out;
  // Every loss is made good by a resend: a lost request or a lost answer.
  EXPECT_GE(c.resent, c.dropped) << b.out;
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(UpdatesOf(a.out, s), 100) << a.out;
    EXPECT_EQ(UpdatesOf(b.out, s), 100) << b.out;  // none twice, none lost
  }
  // The weights are worth comparing: the job trained.
  EXPECT_GE(FinalAccuracy(a.out), 80.0) << a.out;
  ExpectSameWeights(clean, lossy, "after drops");
}

TEST(Resend, BspWeightsBitIdenticalWithOnePercentDropped) {
  ExpectSameWeightsUnderDrops("--overlap off");
}

TEST(Resend, BspWeightsBitIdenticalWithDropsThroughSockets) {
  ExpectSameWeightsUnderDrops("--overlap on --ps_shm 0");
}

// Heartbeats would take a minute to miss: only the closed connection can
// name the dead node before the job's --timeout.
void ExpectKilledNodeNamedFast(const std::string& node) {
  Result r = Launch(
      "--env PS_HEARTBEAT_INTERVAL_MS=1000 --env PS_HEARTBEAT_TIMEOUT_MS=60000",
      "--train_limit 6000 --die_after_steps 5 --die_node " + node);
  EXPECT_EQ(r.rc, 1) << r.out;
  const std::string role = node.substr(0, node.find(':'));
  const std::string rank = node.substr(node.find(':') + 1);
  std::regex declared(
      R"(\[(\w+ ?\d*)\] .*(scheduler|server \d+|worker \d+) \(tcp://[^)]*\) was declared dead: (.*))");
  int named = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), declared);
       it != std::sregex_iterator(); ++it) {
    const std::string who = (*it)[2], why = (*it)[3];
    EXPECT_EQ(who, std::string(role).append(" ").append(rank))
        << "a healthy node was blamed: " << it->str();
    EXPECT_NE(why.find("closed and could not be made again"), std::string::npos)
        << it->str();
    ++named;
  }
  EXPECT_GE(named, 1) << r.out;
  EXPECT_NE(r.out.find("launch: " + role + " " + rank + " (pid"),
            std::string::npos)
      << r.out;
}

// The pid of a process whose environment holds every one of `vars`
// (KEY=VALUE), or -1.
int FindProcess(const std::vector<std::string>& vars) {
  std::vector<int> pids = mnist_test::ProcessesWith(vars);
  return pids.empty() ? -1 : pids.front();
}

// kill -9 of the scheduler while the workers train: each member sees its
// connection to the scheduler close for good and stops, naming it (the
// job's heartbeats would take a minute).
TEST(Detection, KilledSchedulerIsNamedByTheMembers) {
  BackgroundJob job("scheduler");
  const int port = 20000 + getpid() % 20000;
  ASSERT_TRUE(job.Start(std::string(PS_PYTHON) + " " + PS_LAUNCH +
                        " -s 2 -w 2 --timeout 120 --port " +
                        std::to_string(port) +
                        " --env PS_HEARTBEAT_INTERVAL_MS=1000"
                        " --env PS_HEARTBEAT_TIMEOUT_MS=60000 -- " +
                        PS_MNIST_DIST + " --data_dir " + PS_MNIST_DIR +
                        " --threads 1 --log_every_s 0.2 --test_limit 200"));
  // Until a worker reports a step (at most 60 s), then kill the scheduler.
  ASSERT_TRUE(job.WaitFor("] worker 0 epoch 0 step", 60)) << job.Output();
  int pid = FindProcess(
      {"DMLC_ROLE=scheduler", "DMLC_PS_ROOT_PORT=" + std::to_string(port)});
  ASSERT_GT(pid, 0) << "no scheduler process on port " << port;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  std::string code = job.Code(120);
  std::string text = job.Output();
  EXPECT_EQ(code, "1\n") << text;
  EXPECT_NE(text.find("launch: scheduler (pid"), std::string::npos) << text;
  std::regex declared(
      R"(\[(server|worker) \d\] .*scheduler \(tcp://[^)]*\) was declared dead: its connection .* closed and could not be made again)");
  EXPECT_TRUE(std::regex_search(text, declared)) << text;
}

// A server frozen (SIGSTOP) keeps its port, so its connections stay up:
// with the default heartbeats (1 s, dead after 2.5 s) the scheduler
// declares it dead once it missed two, naming it, and no other node.
TEST(Detection, FrozenServerDeclaredDeadAfterTwoMissedHeartbeats) {
  BackgroundJob job("frozen");
  const int port = 20000 + (getpid() + 7) % 20000;
  ASSERT_TRUE(job.Start(std::string(PS_PYTHON) + " " + PS_LAUNCH +
                        " -s 2 -w 2 --timeout 120 --port " +
                        std::to_string(port) + " -- " + PS_MNIST_DIST +
                        " --data_dir " + PS_MNIST_DIR +
                        " --threads 1 --log_every_s 0.2 --test_limit 200"));
  ASSERT_TRUE(job.WaitFor("] worker 0 epoch 0 step", 60)) << job.Output();
  int pid = FindProcess({"DMLC_ROLE=server", "PS_RANK=1",
                         "DMLC_PS_ROOT_PORT=" + std::to_string(port)});
  ASSERT_GT(pid, 0) << "no server 1 on port " << port;
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::string code = job.Code(120);
  kill(pid, SIGKILL);  // the launcher stopped it already; never leave it
  std::string text = job.Output();
  EXPECT_EQ(code, "1\n") << text;
  EXPECT_NE(text.find("launch: server 1 (pid"), std::string::npos) << text;
  std::regex declared(
      R"((scheduler|server \d+|worker \d+) \(tcp://[^)]*\) was declared dead: (.*))");
  int named = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), declared);
       it != std::sregex_iterator(); ++it) {
    EXPECT_EQ((*it)[1].str(), "server 1") << it->str();
    EXPECT_NE((*it)[2].str().find("no heartbeat for more than 2500 ms"),
              std::string::npos)
        << it->str();
    ++named;
  }
  EXPECT_GE(named, 1) << text;
}

TEST(Detection, KilledServerDeclaredDeadByItsConnection) {
  ExpectKilledNodeNamedFast("server:1");
}

TEST(Detection, KilledWorkerDeclaredDeadByItsConnection) {
  ExpectKilledNodeNamedFast("worker:0");
}

// The job's output `out` says server `victim` of `servers` died and its
// replica took its keys over, and every live server applied all 100 steps:
// the heir every step of the dead server's keys too, none twice.
void ExpectTakenOver(const std::string& out, int servers, int victim) {
  const int heir = (victim + 1) % servers;
  EXPECT_NE(
      out.find("the job survived the loss of server " + std::to_string(victim)),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("server " + std::to_string(heir) + " takes over its keys"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("server " + std::to_string(heir) + " replica of server " +
                     std::to_string(victim) + " done: 100 updates applied"),
            std::string::npos)
      << out;
  for (int s = 0; s < servers; ++s) {
    if (s != victim) {
      EXPECT_EQ(UpdatesOf(out, s), 100) << out;
    }
  }
}

// With --replicas 1, a server killed (kill -9) at a step picked at random
// costs nothing: its replica takes over its keys, the workers send it what
// the dead server left unanswered, and the job ends with the weights of the
// job that never failed (and never replicated), bit for bit.
void ExpectFailoverLosesNothing(int servers, int victim,
                                const std::string& env) {
  std::srand(static_cast<unsigned>(std::time(nullptr)) ^ getpid());
  const int step = 5 + std::rand() % 85;  // of 100
  SCOPED_TRACE("server " + std::to_string(victim) + " killed after update " +
               std::to_string(step));
  const std::string flags = "--train_limit 3200 --overlap off";
  std::string clean = TempPath("clean.bin"), failed = TempPath("failed.bin");
  Result a = Launch("", flags + " --dump_weights " + clean, servers);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_GE(FinalAccuracy(a.out), 80.0) << a.out;
  Result b = Launch("--tolerate server " + env,
                    flags + " --replicas 1 --dump_weights " + failed +
                        " --die_node server:" + std::to_string(victim) +
                        " --die_after_steps " + std::to_string(step),
                    servers);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("killing itself after " + std::to_string(step)),
            std::string::npos)
      << b.out;
  ExpectTakenOver(b.out, servers, victim);
  ExpectSameWeights(clean, failed, "after the failover");
}

TEST(Replication, KilledServerCostsNoStepTwoServers) {
  ExpectFailoverLosesNothing(2, 1, "");
}

// Three servers (server 0's keys go to server 1), and 1% of the messages
// lost on top: the forwarded copies and their answers are made good too.
TEST(Replication, KilledServerCostsNoStepThreeServersWithDrops) {
  ExpectFailoverLosesNothing(3, 0, "--env PS_DROP_MSG=1");
}

// The seed of a test's random draws: PS_FAULT_SEED when set (to replay a
// run), else drawn from the clock; printed either way.
unsigned FaultSeed() {
  const char* given = std::getenv("PS_FAULT_SEED");
  const unsigned seed =
      given != nullptr ? static_cast<unsigned>(std::strtoul(given, nullptr, 10))
                       : static_cast<unsigned>(std::time(nullptr)) ^
                             (getpid() * 2654435761u);
  std::printf("seed %u (PS_FAULT_SEED=%u replays the draw)\n", seed, seed);
  std::fflush(stdout);
  return seed;
}

// The highest step any worker of `out` logged ("] worker R epoch E step
// N"), or -1.
int LastLoggedStep(const std::string& out) {
  static const std::regex re(R"(\] worker \d+ epoch \d+ step (\d+) )");
  int last = -1;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    last = std::max(last, std::stoi((*it)[1]));
  }
  return last;
}

// Polls the job's output until a worker logged step `step`, for at most
// `seconds`; false if it did not (or the job ended first).
bool WaitForStep(const BackgroundJob& job, int step, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    if (LastLoggedStep(job.Output()) >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A fault from outside on a server drawn at random, at a moment drawn at
// random while the workers train (a step below `steps_before`, then a delay
// into it), in a job of 3 servers with --replicas 1 and every value through
// the sockets (PS_SHM=0). `fault(pid, heir)` acts on the server's process
// (`heir`: the server that takes its keys over). The job must exit 0 with
// the weights of the job that never failed, bit for bit. `env`: launch.py
// options. Returns the faulted job's output and sets *victim.
std::string ExpectServerFaultCostsNothing(
    const std::string& what, const std::string& env, int steps_before,
    const std::function<void(int pid, int heir, const BackgroundJob& job)>&
        fault,
    int* victim) {
  const unsigned seed = FaultSeed();
  std::mt19937 draw(seed);
  constexpr int kServers = 3;
  *victim = static_cast<int>(draw() % kServers);
  const int step = 5 + static_cast<int>(draw() % steps_before);  // of 100
  const int delay_ms = static_cast<int>(draw() % 300);
  const std::string drawn =
      "seed " + std::to_string(seed) + ": server " + std::to_string(*victim) +
      " " + what + " " + std::to_string(delay_ms) +
      " ms after a worker logged step " + std::to_string(step);
  std::printf("%s\n", drawn.c_str());
  SCOPED_TRACE(drawn);
  const std::string flags =
      "--train_limit 3200 --overlap off --ps_shm 0 --log_every_s 0.05";
  std::string clean = TempPath("clean.bin"), failed = TempPath("fault.bin");
  Result a = Launch("", flags + " --dump_weights " + clean, kServers);
  EXPECT_EQ(a.rc, 0) << a.out;
  EXPECT_GE(FinalAccuracy(a.out), 80.0) << a.out;
  BackgroundJob job("server-fault");
  // Its processes are found by a tag of their own (a port of its own
  // could be taken).
  const std::string tag =
      "FAULT_TEST_JOB=" + std::to_string(getpid()) + "-" + std::to_string(seed);
  EXPECT_TRUE(job.Start(LaunchCommand(
      "--tolerate server --env " + tag + " " + env,
      flags + " --replicas 1 --dump_weights " + failed, kServers)));
  EXPECT_TRUE(WaitForStep(job, step, 180)) << job.Output();
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const int pid = FindProcess(
      {"DMLC_ROLE=server", "PS_RANK=" + std::to_string(*victim), tag});
  EXPECT_GT(pid, 0) << job.Output();
  if (pid > 0) fault(pid, (*victim + 1) % kServers, job);
  EXPECT_EQ(job.Code(300), "0\n") << job.Output();
  ExpectSameWeights(clean, failed,
                    "after server " + std::to_string(*victim) + " was " + what +
                        " (seed " + std::to_string(seed) + ")");
  return job.Output();
}

// kill -9 of a server from outside: the primary forwards the frames it
// received, which its shard then sums into, so the replica must get bytes
// of its own. Its replica takes over, and nothing is lost.
TEST(Replication, ServerKilledFromOutsideThroughSocketsCostsNoStep) {
  int victim = -1;
  const std::string out = ExpectServerFaultCostsNothing(
      "killed", "", 80,
      [](int pid, int, const BackgroundJob&) {
        EXPECT_EQ(kill(pid, SIGKILL), 0);
      },
      &victim);
  EXPECT_LT(LastLoggedStep(out.substr(0, out.find("was killed by signal"))),
            100)
      << "killed after the last step: " << out;
  ExpectTakenOver(out, 3, victim);
}

// A server frozen (SIGSTOP) past the heartbeat timeout (1.5 s here), then
// let go on (SIGCONT) 4 s later, as an operator would try it (an earlier
// build lost or repeated a step this way in 4 of 6 tries). The job
// declares it dead, its replica takes its keys over, and the launcher
// kills it (the SIGCONT finds it gone); nothing is lost.
TEST(Replication, FrozenPrimaryIsReplacedExactly) {
  int victim = -1;
  ExpectServerFaultCostsNothing(
      "frozen", "--env PS_HEARTBEAT_TIMEOUT_MS=1500", 70,
      [](int pid, int heir, const BackgroundJob& job) {
        EXPECT_EQ(kill(pid, SIGSTOP), 0);
        EXPECT_TRUE(job.WaitFor(
            "server " + std::to_string(heir) + " takes over its keys", 30))
            << job.Output();
        std::this_thread::sleep_for(std::chrono::seconds(4));
        kill(pid, SIGCONT);
      },
      &victim);
}

// The same freeze at a moment drawn at random, but the frozen primary is
// not killed once declared dead (--keep-declared-dead): let go on, it
// sends what it held (a step's sum to its replica, answers to workers)
// from a placement that is no more. Its replica and the workers drop it
// all (fenced), and nothing is lost or applied twice.
TEST(Replication, FrozenPrimaryLetGoOnIsFenced) {
  int victim = -1;
  ExpectServerFaultCostsNothing(
      "frozen and let go on",
      "--env PS_HEARTBEAT_TIMEOUT_MS=1500 --keep-declared-dead", 70,
      [](int pid, int heir, const BackgroundJob& job) {
        EXPECT_EQ(kill(pid, SIGSTOP), 0);
        EXPECT_TRUE(job.WaitFor(
            "server " + std::to_string(heir) + " takes over its keys", 30))
            << job.Output();
        EXPECT_EQ(kill(pid, SIGCONT), 0);
      },
      &victim);
}

// A primary that freezes itself (--die_signal stop) at `point` of a step
// drawn at random (--die_point, below). It is declared dead, its replica
// takes its keys over and the workers resend that step's pushes there; then
// it is let go on, not killed: whatever it sends then (a sum to its
// replica, answers to the workers) is dropped (fenced). The job ends with
// the fault-free weights, bit for bit.
void ExpectPrimaryFrozenAtAPointFenced(const std::string& point) {
  const unsigned seed = FaultSeed();
  std::mt19937 draw(seed);
  constexpr int kServers = 3;
  const int victim = static_cast<int>(draw() % kServers);
  const int heir = (victim + 1) % kServers;
  const int step = 5 + static_cast<int>(draw() % 85);  // of 100
  SCOPED_TRACE("seed " + std::to_string(seed) + ": server " +
               std::to_string(victim) + " frozen at " + point + " after " +
               std::to_string(step) + " updates");
  const std::string flags = "--train_limit 3200 --overlap off --ps_shm 0";
  std::string clean = TempPath("clean.bin"), failed = TempPath("fenced.bin");
  Result a = Launch("", flags + " --dump_weights " + clean, kServers);
  EXPECT_EQ(a.rc, 0) << a.out;
  BackgroundJob job("fenced");
  const std::string tag =
      "FAULT_TEST_JOB=" + std::to_string(getpid()) + "-" + std::to_string(seed);
  EXPECT_TRUE(job.Start(LaunchCommand(
      "--tolerate server --keep-declared-dead --env " + tag +
          " --env PS_HEARTBEAT_TIMEOUT_MS=1500",
      flags + " --replicas 1 --dump_weights " + failed + " --die_node server:" +
          std::to_string(victim) + " --die_after_steps " +
          std::to_string(step) + " --die_signal stop --die_point " + point,
      kServers)));
  EXPECT_TRUE(job.WaitFor(
      "freezing itself after " + std::to_string(step) + " updates", 180))
      << job.Output();
  EXPECT_TRUE(job.WaitFor(
      "server " + std::to_string(heir) + " takes over its keys", 30))
      << job.Output();
  const int pid = FindProcess(
      {"DMLC_ROLE=server", "PS_RANK=" + std::to_string(victim), tag});
  EXPECT_GT(pid, 0) << job.Output();
  if (pid > 0) {
    EXPECT_EQ(kill(pid, SIGCONT), 0);
  }
  EXPECT_EQ(job.Code(300), "0\n") << job.Output();
  ExpectSameWeights(clean, failed, "after the primary came back");
}

// In its optimizer step: it summed the step and sent the sum to its
// replica, whose answer it has not read, and no answer went to the
// workers. Their resent pushes are repeats of the sum the replica applied.
TEST(Replication, PrimaryFrozenAfterForwardingItsStepIsFenced) {
  ExpectPrimaryFrozenAtAPointFenced("update");
}

// As a worker's push of the step arrives, before it is summed: nothing of
// the step went to the replica, which sums it afresh from the workers'
// resent pushes.
TEST(Replication, PrimaryFrozenBeforeForwardingItsStepIsFenced) {
  ExpectPrimaryFrozenAtAPointFenced("push");
}

// The "server R done: ..." line's count of range updates made with fewer
// than every worker's gradient (-1: no such line).
int ShortUpdatesOf(const std::string& out, int server) {
  std::smatch m;
  std::regex re(
      "server " + std::to_string(server) +
      R"( done: .*, (\d+) workers rejoined, (\d+) range updates short of a worker)");
  return std::regex_search(out, m, re) ? std::stoi(m[2]) : -1;
}

// Every server applied all 100 steps, each with both workers' gradients,
// and saw one worker come back.
void ExpectEveryStepWhole(const std::string& out) {
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(UpdatesOf(out, s), 100) << out;
    EXPECT_EQ(ShortUpdatesOf(out, s), 0) << out;
    EXPECT_NE(out.find("server " + std::to_string(s) + " done: "),
              std::string::npos);
  }
  EXPECT_NE(out.find("1 workers rejoined"), std::string::npos) << out;
  EXPECT_NE(out.find("rejoined the job"), std::string::npos) << out;
}

// Job `b` restarted worker 1, which rejoined at `step`, every update had
// both workers' gradients, and it ended as the fault-free job `a`: the
// same accuracy and the same weights (dumped at `clean` and `restarted`).
void ExpectRestartedAtTheSameEnd(const Result& a, const Result& b, int step,
                                 const std::string& clean,
                                 const std::string& restarted) {
  EXPECT_NE(b.out.find("restarting it"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("worker 1 rejoined at step " + std::to_string(step)),
            std::string::npos)
      << b.out;
  ExpectEveryStepWhole(b.out);
  EXPECT_EQ(FinalAccuracy(b.out), FinalAccuracy(a.out)) << b.out;
  ExpectSameWeights(clean, restarted, "after the restart");
}

// Worker 1 kills itself (kill -9) right after a step drawn at random: the
// launcher starts it again, it rejoins at that step, and, as it lost no
// step and BSP without dropout is deterministic, the job ends with the
// fault-free weights, bit for bit. The job writes checkpoints: the new
// worker takes the folder its job filled (it rejoins; it does not restore).
TEST(Restart, WorkerKilledBetweenStepsResumesBitExactly) {
  std::srand(static_cast<unsigned>(std::time(nullptr)) ^ getpid());
  const int step = 5 + std::rand() % 85;  // of 100
  SCOPED_TRACE("worker 1 killed after step " + std::to_string(step));
  const std::string flags = "--train_limit 3200 --overlap off";
  std::string clean = TempPath("clean.bin"), restarted = TempPath("re.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  const std::string dir = TempPath("restart-ckpt");
  Shell("rm -rf " + dir + " && mkdir -p " + dir);
  Result b = Launch("--max-restarts 1",
                    flags + " --dump_weights " + restarted +
                        " --checkpoint_every_steps 10 --checkpoint_dir " + dir +
                        " --die_node worker:1 --die_after_steps " +
                        std::to_string(step));
  Shell("rm -rf " + dir);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("killing itself after " + std::to_string(step)),
            std::string::npos)
      << b.out;
  EXPECT_GE(FinalAccuracy(a.out), 80.0) << a.out;
  ExpectRestartedAtTheSameEnd(a, b, step, clean, restarted);
}

// Worker 1 freezes itself (SIGSTOP) in a step drawn at random, between its
// pushes to the two servers: the first server got its push (and applies
// that range once worker 0's comes), the other did not. It is declared
// dead, the launcher kills it and starts it again, and every server
// answers where it resumes; it resumes at the least answer and pulls that
// step's weights everywhere, the range applied ahead as it was before that
// update. So the job ends with the fault-free weights, bit for bit, on
// either transport (`shm`: --ps_shm).
void ExpectFrozenBetweenServersResumesBitExactly(const std::string& shm) {
  const unsigned seed = FaultSeed();
  const int step = 5 + static_cast<int>(std::mt19937(seed)() % 85);  // of 100
  SCOPED_TRACE("seed " + std::to_string(seed) + ": worker 1 frozen in step " +
               std::to_string(step) + ", --ps_shm " + shm);
  const std::string flags = "--train_limit 3200 --overlap off --ps_shm " + shm;
  std::string clean = TempPath("clean.bin"), restarted = TempPath("re.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  Result b = Launch("--max-restarts 1 --env PS_HEARTBEAT_TIMEOUT_MS=1500",
                    flags + " --dump_weights " + restarted +
                        " --die_node worker:1 --die_signal stop --die_point "
                        "push --die_after_steps " +
                        std::to_string(step));
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("worker 1: freezing itself between its pushes of step " +
                       std::to_string(step) + " to two servers"),
            std::string::npos)
      << b.out;
  ExpectRestartedAtTheSameEnd(a, b, step, clean, restarted);
}

TEST(Restart, WorkerFrozenBetweenItsPushesResumesBitExactlyThroughSockets) {
  ExpectFrozenBetweenServersResumesBitExactly("0");
}

TEST(Restart, WorkerFrozenBetweenItsPushesResumesBitExactlyInSharedMemory) {
  ExpectFrozenBetweenServersResumesBitExactly("1");
}

// The pid of worker 1 of the job on `port` (its PS_RESTART_COUNT, when
// restarted), or -1.
// The scheduler of the job whose scheduler listens on `port`.
int SchedulerOf(int port) {
  return FindProcess(
      {"DMLC_ROLE=scheduler", "DMLC_PS_ROOT_PORT=" + std::to_string(port)});
}

int WorkerOne(int port, const std::string& restart = "") {
  std::vector<std::string> vars = {"DMLC_ROLE=worker", "PS_RANK=1",
                                   "DMLC_PS_ROOT_PORT=" + std::to_string(port)};
  if (!restart.empty()) vars.push_back("PS_RESTART_COUNT=" + restart);
  return FindProcess(vars);
}

// kill -9 of worker 1 from outside, at a moment drawn at random while it
// trains (mid-step, most likely): its restart rejoins, no update misses a
// gradient or counts one twice, and the job reaches the fault-free run's
// accuracy (the step in flight may differ: see dense_server.h, kRestart).
TEST(Restart, WorkerKilledMidStepRejoinsAndTrainingGoesOn) {
  std::srand(static_cast<unsigned>(std::time(nullptr)) ^ (getpid() * 31));
  const std::string flags = "--train_limit 3200 --log_every_s 0.1";
  Result a = Launch("", flags);
  ASSERT_EQ(a.rc, 0) << a.out;
  BackgroundJob job("restart");
  const int port = 20000 + (getpid() + 13) % 20000;
  ASSERT_TRUE(job.Start(
      LaunchCommand("--max-restarts 1 --port " + std::to_string(port), flags)));
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  std::this_thread::sleep_for(std::chrono::milliseconds(std::rand() % 400));
  const int pid = WorkerOne(port);
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(job.Code(240), "0\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("restarting it"), std::string::npos) << out;
  std::smatch at;
  ASSERT_TRUE(std::regex_search(
      out, at, std::regex(R"(worker 1 rejoined at step (\d+))")))
      << out;
  SCOPED_TRACE("rejoined at step " + at[1].str());
  ExpectEveryStepWhole(out);
  EXPECT_GE(FinalAccuracy(a.out), 80.0) << a.out;
  EXPECT_NEAR(FinalAccuracy(out), FinalAccuracy(a.out), 1.0) << out;
}

// Restarts are bounded: with --max-restarts 1, worker 1 killed, then its
// restart killed too, stops the job (exit 1), the launcher naming worker 1
// and its spent restarts; nothing waits for the third process.
TEST(Restart, SpentRestartsStopTheJob) {
  BackgroundJob job("spent");
  const int port = 20000 + (getpid() + 29) % 20000;
  ASSERT_TRUE(
      job.Start(LaunchCommand("--max-restarts 1 --port " + std::to_string(port),
                              "--train_limit 6400 --log_every_s 0.1")));
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  int pid = WorkerOne(port);
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(job.WaitFor("] worker 1 rejoined at step", 60)) << job.Output();
  pid = WorkerOne(port, "1");
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(job.Code(120), "1\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("after 1 restart"), std::string::npos) << out;
  EXPECT_EQ(WorkerOne(port), -1) << "a worker 1 is left running";
}

// kill -9 of the scheduler while the workers train, under --max-restarts:
// the launcher starts it again at the same address, the members report
// themselves to it, and it takes the job over. The data path never needed
// it: the job ends with the fault-free weights, bit for bit.
TEST(Restart, KilledSchedulerIsRestartedAndTakesTheJobOver) {
  const std::string flags =
      "--train_limit 3200 --overlap off --log_every_s 0.1";
  std::string clean = TempPath("clean.bin"), restarted = TempPath("sch.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  BackgroundJob job("scheduler-restart");
  const int port = 20000 + (getpid() + 41) % 20000;
  ASSERT_TRUE(
      job.Start(LaunchCommand("--max-restarts 1 --port " + std::to_string(port),
                              flags + " --dump_weights " + restarted)));
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  const int pid = SchedulerOf(port);
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(job.Code(240), "0\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("scheduler (pid " + std::to_string(pid) +
                     ") was killed by signal SIGKILL; restarting it"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("the restarted scheduler took the running job over "
                     "from its 4 members"),
            std::string::npos)
      << out;
  for (int s = 0; s < 2; ++s) EXPECT_EQ(UpdatesOf(out, s), 100) << out;
  ExpectSameWeights(clean, restarted, "after the scheduler's restart");
}

// Both, in the order that made a restarted scheduler refuse the running
// job (bench/chaos seed 30001): the scheduler is stopped, worker 1 is
// killed and restarted (its registration waits at the stopped scheduler),
// then the scheduler is killed and restarted. The new one hears the
// worker's registration before the members' reports (one per heartbeat
// interval): it takes the job over from the members, judges worker 1's
// predecessor dead, and takes the registration as its restart. The job
// ends with the fault-free weights, bit for bit.
TEST(Restart, WorkerRegisteredBeforeTheMembersReportToARestartedScheduler) {
  const std::string flags =
      "--train_limit 3200 --overlap off --log_every_s 0.1";
  std::string clean = TempPath("clean.bin"), restarted = TempPath("both.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  BackgroundJob job("scheduler-and-worker-restart");
  const int port = 20000 + (getpid() + 47) % 20000;
  ASSERT_TRUE(job.Start(
      LaunchCommand("--max-restarts 1 --port " + std::to_string(port) +
                        " --env PS_HEARTBEAT_INTERVAL_MS=1500",
                    flags + " --dump_weights " + restarted)));
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  const int scheduler = SchedulerOf(port), worker = WorkerOne(port);
  ASSERT_GT(scheduler, 0) << job.Output();
  ASSERT_GT(worker, 0) << job.Output();
  ASSERT_EQ(kill(scheduler, SIGSTOP), 0);
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  int successor = -1;
  for (int i = 0; i < 300 && successor <= 0; ++i) {  // 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    successor = WorkerOne(port, "1");
  }
  ASSERT_GT(successor, 0) << job.Output();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(scheduler, SIGKILL), 0);
  ASSERT_EQ(job.Code(240), "0\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("the restarted scheduler took the running job over "
                     "from 3 of its 4 members, a majority; worker 1 did not "
                     "report"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("worker 1 rejoined at step"), std::string::npos) << out;
  ExpectSameWeights(clean, restarted, "after both restarts");
}

// Both at once: with --replicas 1, server 1 dies (server 0 takes its keys
// over), then worker 1 is killed and restarted. The new worker learns that
// server 1 is dead, sends its keys to server 0, and the job ends with every
// step applied with both workers' gradients, on server 0's own keys and on
// those it took over.
TEST(Restart, WorkerRestartedAfterAServerFailover) {
  BackgroundJob job("failover-restart");
  const int port = 20000 + (getpid() + 53) % 20000;
  ASSERT_TRUE(job.Start(LaunchCommand(
      "--max-restarts 1 --tolerate server --port " + std::to_string(port),
      "--train_limit 3200 --overlap off --log_every_s 0.1 --replicas 1 "
      "--die_node server:1 --die_after_steps 20")));
  ASSERT_TRUE(job.WaitFor("server 0 takes over its keys", 120)) << job.Output();
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  const int pid = WorkerOne(port);
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(job.Code(240), "0\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("worker 1 rejoined at step"), std::string::npos) << out;
  EXPECT_EQ(UpdatesOf(out, 0), 100) << out;
  EXPECT_EQ(ShortUpdatesOf(out, 0), 0) << out;
  EXPECT_NE(out.find("server 0 replica of server 1 done: 100 updates applied"),
            std::string::npos)
      << out;
  EXPECT_GE(FinalAccuracy(out), 80.0) << out;
}

// Two faults, one after the other: with --replicas 1 server 1 is killed
// (server 0 takes its keys over), then the scheduler is killed and, under
// --max-restarts, started again. The members tell the new scheduler that
// server 1 is taken over, so it does not wait for it: it takes the job over
// from the three that live, and the job ends at once with exit 0 and the
// weights of a job that never failed, bit for bit.
TEST(Restart, SchedulerKilledAfterAServerFailoverTakesTheJobOver) {
  const std::string flags =
      "--train_limit 3200 --overlap off --log_every_s 0.1";
  std::string clean = TempPath("clean.bin"), failed = TempPath("twice.bin");
  Result a = Launch("", flags + " --dump_weights " + clean);
  ASSERT_EQ(a.rc, 0) << a.out;
  BackgroundJob job("failover-then-scheduler");
  const int port = 20000 + (getpid() + 67) % 20000;
  ASSERT_TRUE(job.Start(LaunchCommand(
      "--max-restarts 3 --port " + std::to_string(port),
      flags + " --replicas 1 --die_node server:1 --die_after_steps 20" +
          " --dump_weights " + failed)));
  ASSERT_TRUE(job.WaitFor("server 0 takes over its keys", 120)) << job.Output();
  ASSERT_TRUE(job.WaitFor("] worker 1 epoch 0 step", 60)) << job.Output();
  const int pid = SchedulerOf(port);
  ASSERT_GT(pid, 0) << job.Output();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(job.Code(240), "0\n") << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(out.find("the restarted scheduler took the running job over "
                     "from its 3 members (1 server(s) taken over by their "
                     "replica)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("server 0 replica of server 1 done: 100 updates applied"),
            std::string::npos)
      << out;
  EXPECT_EQ(UpdatesOf(out, 0), 100) << out;
  ExpectSameWeights(clean, failed, "after a failover and a scheduler restart");
}

}  // namespace
