// Multi-process tests: tests/core/kv_job run as real processes through
// tracker/launch.py (one scheduler, S servers, W workers), asserting the
// launcher's exit code and every number the processes print. The paths come
// from compile definitions: PS_PYTHON, PS_LAUNCH_PY and PS_KV_JOB.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeys = 100;                 // kv_job's key count
constexpr int kLaunchTimeoutSeconds = 40;  // launch.py --timeout
// On top of launch.py's own timeout: then the launcher itself is stopped.
constexpr int kHardBoundSeconds = kLaunchTimeoutSeconds + 20;
// Short heartbeats so that a killed process is noticed within seconds.
constexpr const char* kJobEnv[] = {
    "PS_HEARTBEAT_INTERVAL_MS=200", "PS_HEARTBEAT_TIMEOUT_MS=2000",
    "PS_CONNECT_TIMEOUT_MS=5000", "PS_RENDEZVOUS_TIMEOUT_MS=20000",
    "PS_BARRIER_TIMEOUT_MS=20000"};

struct RunResult {
  int exit_code = -1;  // launch.py's, or -1 when it did not exit normally
  std::string output;  // stdout and stderr, interleaved as written
};

// Reads `fd` until EOF or `deadline`; true on EOF.
bool ReadUntil(int fd, Clock::time_point deadline, std::string* out) {
  char buf[4096];
  while (Clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (n > 0) out->append(buf, static_cast<size_t>(n));
  }
  return false;
}

// Runs `python3 launch.py -s S -w W --timeout T --env ... LAUNCH_ARGS --
// kv_job MODE [FLAG]` with stdout and stderr on one pipe, kJobEnv and `env`
// (KEY=VALUE each) in the processes' environment. Past kHardBoundSeconds
// the launcher gets SIGTERM (it stops its children), then SIGKILL.
RunResult Launch(int servers, int workers, const std::string& mode,
                 const std::string& flag = "",
                 const std::vector<std::string>& env = {},
                 const std::vector<std::string>& launch_args = {}) {
  std::vector<std::string> args = {
      PS_PYTHON,   PS_LAUNCH_PY,
      "-s",        std::to_string(servers),
      "-w",        std::to_string(workers),
      "--timeout", std::to_string(kLaunchTimeoutSeconds)};
  for (const char* setting : kJobEnv) {
    args.push_back("--env");
    args.push_back(setting);
  }
  for (const std::string& setting : env) {
    args.push_back("--env");
    args.push_back(setting);
  }
  args.insert(args.end(), launch_args.begin(), launch_args.end());
  for (const char* arg : {"--", PS_KV_JOB}) args.push_back(arg);
  args.push_back(mode);
  if (!flag.empty()) args.push_back(flag);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  RunResult result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  Clock::time_point start = Clock::now();
  pid_t pid = -1;
  int err = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(err);
    return result;
  }
  bool eof = ReadUntil(fds[0], start + std::chrono::seconds(kHardBoundSeconds),
                       &result.output);
  if (!eof) {
    ADD_FAILURE() << "launch.py ran past " << kHardBoundSeconds << " s";
    kill(pid, SIGTERM);
    if (!ReadUntil(fds[0], Clock::now() + std::chrono::seconds(5),
                   &result.output)) {
      kill(pid, SIGKILL);
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

// The lines of `text`.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "[worker R] worker R pulled TOTAL VERDICT", as kv_job prints it.
struct WorkerLine {
  int prefix = -1, rank = -1;
  long long total = -1;
  std::string verdict;
};
std::vector<WorkerLine> WorkerLines(const std::string& out) {
  std::vector<WorkerLine> found;
  for (const std::string& line : Lines(out)) {
    WorkerLine w;
    char verdict[16] = {};
    if (std::sscanf(line.c_str(), "[worker %d] worker %d pulled %lld %15s",
                    &w.prefix, &w.rank, &w.total, verdict) == 4) {
      w.verdict = verdict;
      found.push_back(w);
    }
  }
  return found;
}

// "[server R] server R holds KEYS keys sum SUM", as kv_job prints it.
struct ServerLine {
  int prefix = -1, rank = -1;
  long long keys = -1, sum = -1;
};
std::vector<ServerLine> ServerLines(const std::string& out) {
  std::vector<ServerLine> found;
  for (const std::string& line : Lines(out)) {
    ServerLine s;
    if (std::sscanf(line.c_str(),
                    "[server %d] server %d holds %lld keys sum %lld", &s.prefix,
                    &s.rank, &s.keys, &s.sum) == 4) {
      found.push_back(s);
    }
  }
  return found;
}

// Every worker pulled the exact total and every server holds its share:
// value i of the flat vector is (1+..+W) * (i+1) after all pushes.
// The job's result goes to *result when given.
void ExpectExactSums(int servers, int workers, const std::string& mode,
                     RunResult* result = nullptr) {
  RunResult r = Launch(servers, workers, mode);
  if (result != nullptr) *result = r;
  SCOPED_TRACE(r.output);
  ASSERT_EQ(r.exit_code, 0);
  int64_t n = 0;
  for (int i = 0; i < kKeys; ++i) n += mode == "varlen" ? i % 5 + 1 : 4;
  const int64_t expected =
      int64_t{workers} * (workers + 1) / 2 * n * (n + 1) / 2;

  std::vector<WorkerLine> worker_lines = WorkerLines(r.output);
  ASSERT_EQ(worker_lines.size(), static_cast<size_t>(workers));
  for (const WorkerLine& w : worker_lines) {
    EXPECT_EQ(w.prefix, w.rank) << "prefix matches the worker's rank";
    EXPECT_EQ(w.total, expected) << "worker " << w.rank;
    EXPECT_EQ(w.verdict, "ok") << "worker " << w.rank;
  }

  std::vector<ServerLine> server_lines = ServerLines(r.output);
  ASSERT_EQ(server_lines.size(), static_cast<size_t>(servers));
  int64_t keys = 0, sum = 0;
  for (const ServerLine& s : server_lines) {
    EXPECT_EQ(s.prefix, s.rank) << "prefix matches the server's rank";
    keys += s.keys;
    sum += s.sum;
  }
  EXPECT_EQ(keys, kKeys) << "keys over servers";
  EXPECT_EQ(sum, expected) << "server sums";
}

// A process that kills itself makes the job fail (exit 1, not launch.py's
// timeout; Launch fails the test past kHardBoundSeconds) and the output
// names it. No wall-clock assertion: a loaded machine may be slow.
void ExpectFailureNaming(const std::string& mode, const std::string& who) {
  RunResult r = Launch(2, 2, mode);
  SCOPED_TRACE(r.output);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(who), std::string::npos) << "names " << who;
}

class MultiProcGrid : public testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(MultiProcGrid, PushedSumsArePulledAndHeldExactly) {
  auto [servers, workers] = GetParam();
  ExpectExactSums(servers, workers, "sum");
}

// ctest names each case by its filter, e.g. Grid/MultiProcGrid.*/S2W4.
INSTANTIATE_TEST_SUITE_P(
    Grid, MultiProcGrid,
    testing::Combine(testing::Values(1, 2, 3), testing::Values(1, 2, 4)),
    [](const testing::TestParamInfo<std::tuple<int, int>>& p) {
      return "S" + std::to_string(std::get<0>(p.param)) + "W" +
             std::to_string(std::get<1>(p.param));
    });

TEST(MultiProc, VariableLengthValues) { ExpectExactSums(2, 3, "varlen"); }

// Values and pull destinations in ps::SharedArrays: the servers (other
// processes of this host) map the workers' memory, sums stay exact, and
// each worker's push and pull went by reference, one frame per server.
TEST(MultiProc, SharedArraysBetweenProcesses) {
  RunResult r;
  ExpectExactSums(2, 2, "shared", &r);
  SCOPED_TRACE(r.output);
  int checked = 0;
  for (const std::string& line : Lines(r.output)) {
    int prefix, rank;
    unsigned long long sent, received;  // NOLINT(runtime/int): %llu
    if (std::sscanf(line.c_str(),
                    "[worker %d] worker %d shared frames sent %llu received "
                    "%llu",
                    &prefix, &rank, &sent, &received) == 4) {
      EXPECT_EQ(sent, 2u) << line;
      EXPECT_EQ(received, 2u) << line;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
}

TEST(MultiProc, ConcurrentThreadsOfEachWorker) {
  RunResult r = Launch(2, 2, "threads");
  SCOPED_TRACE(r.output);
  EXPECT_EQ(r.exit_code, 0);
  int ok = 0;
  for (const std::string& line : Lines(r.output)) {
    int prefix = -1, rank = -1;
    char verdict[16] = {};
    ok += std::sscanf(line.c_str(), "[worker %d] worker %d threads %15s",
                      &prefix, &rank, verdict) == 3 &&
          prefix == rank && std::string(verdict) == "ok";
  }
  EXPECT_EQ(ok, 2);
}

// ps-lite's semantics: each worker customer is a worker. Two processes of
// two customers make a BSP job of 4 workers, and every step waits for all
// of them (kv_job customers-bsp checks the weights exactly).
TEST(MultiProc, WorkerCustomersAreWorkersOfEveryBspStep) {
  RunResult r =
      Launch(1, 4, "customers-bsp", "", {}, {"--worker-customers", "2"});
  SCOPED_TRACE(r.output);
  EXPECT_EQ(r.exit_code, 0);
  std::set<int> ranks;
  int ok = 0;
  for (const std::string& line : Lines(r.output)) {
    int prefix = -1, rank = -1, customer = -1, steps = -1;
    float weight = 0;
    char verdict[16] = {};
    if (std::sscanf(line.c_str(),
                    "[worker %d] worker %d customer %d step %d weight %f %15s",
                    &prefix, &rank, &customer, &steps, &weight, verdict) == 6 &&
        std::string(verdict) == "ok") {
      ++ok;
      ranks.insert(rank);
      EXPECT_EQ(steps, 5);
      EXPECT_EQ(weight, -12.5f) << "5 steps of the mean of 1, 2, 3 and 4";
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_NE(r.output.find("server 0: all worker customers done"),
            std::string::npos);
  EXPECT_NE(r.output.find("launch: all 4 processes exited 0"),
            std::string::npos);
}

TEST(MultiProc, KilledWorkerFailsTheJobNamingIt) {
  ExpectFailureNaming("kill-worker", "worker 0");
}

TEST(MultiProc, KilledServerFailsTheJobNamingIt) {
  ExpectFailureNaming("kill-server", "server 0");
}

// ps::Start reads the --ps_* flags over the environment; a bad one ends the
// process naming the flag, the value and the variable it is checked against.
TEST(MultiProc, BadFlagStopsTheJobNamingIt) {
  RunResult r = Launch(1, 1, "sum", "--ps_heartbeat_timeout_ms=150");
  SCOPED_TRACE(r.output);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--ps_heartbeat_timeout_ms='150' is not greater "
                          "than PS_HEARTBEAT_INTERVAL_MS (200)"),
            std::string::npos);
}

// A node logs to stderr and leaves no log files (glog's default dir is
// $TMPDIR) unless a log directory is asked for; then its files are there.
TEST(MultiProc, LogsGoToStderrUnlessFilesAreAskedFor) {
  std::string tmp = testing::TempDir() + "/ps_logs_XXXXXX";
  ASSERT_NE(mkdtemp(tmp.data()), nullptr) << std::strerror(errno);
  auto glog_files = [&tmp] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(tmp)) {
      if (e.path().filename().string().rfind("kv_job.", 0) == 0) ++n;
    }
    return n;
  };
  RunResult r = Launch(1, 1, "sum", "--ps_verbose=1", {"TMPDIR=" + tmp});
  SCOPED_TRACE(r.output);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("is ready"), std::string::npos) << "on stderr";
  EXPECT_EQ(glog_files(), 0);

  r = Launch(1, 1, "sum", "--ps_verbose=1", {"GLOG_log_dir=" + tmp});
  SCOPED_TRACE(r.output);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_GT(glog_files(), 0);
  std::filesystem::remove_all(tmp);
}

}  // namespace
