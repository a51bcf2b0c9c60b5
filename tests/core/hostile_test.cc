// Hostile peers against a running job of real processes (tests/core/kv_job
// through tracker/launch.py on 127.0.0.1): a stranger spoofs a push as a
// worker, spoofs control messages as the scheduler and as a worker,
// registers as one worker too many, pulls as a worker, floods a server with
// garbage and sends it a frame larger than PS_MAX_MESSAGE_BYTES. With the
// job's key it is refused at connect (a forged sealing token, a CurveZMQ
// key of its own, no mechanism); without one (--insecure)
// every message is dropped because its connection does not prove the sender
// it claims. Either way the job's sums stay exact and what happened is
// counted. Also: failures are named by role and rank (a worker that exits
// early, a node started with another job shape, a frozen server).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ps/base.h"
#include "van/codec.h"
#include "van/seal.h"

extern char** environ;

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeys = 100;  // kv_job's key count, 4 floats each
constexpr int kLaunchTimeoutSeconds = 90;
constexpr int kFloodMessages = 100000;
constexpr int64_t kMaxMessageBytes = 16 << 20;  // the job's limit
constexpr size_t kOversizeBytes = size_t{256} << 20;

// tracker/launch.py running in the background, its output collected by a
// thread. Every wait is bounded.
class Job {
 public:
  explicit Job(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] { Read(fd); });
  }
  ~Job() {
    if (pid_ > 0 && exit_code_ == -2) {
      kill(pid_, SIGTERM);
      Finish(30);
    }
    if (reader_.joinable()) reader_.join();
  }

  bool started() const { return pid_ > 0; }

  // Waits up to `seconds` for a line starting with `prefix`; returns the
  // integer that follows it, or -1.
  long WaitForNumber(const std::string& prefix, int seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    long value = -1;
    cv_.wait_for(lock, std::chrono::seconds(seconds), [&] {
      size_t at = output_.find("\n" + prefix);
      if (at == std::string::npos) return eof_;
      value = std::atol(output_.c_str() + at + 1 + prefix.size());
      return true;
    });
    return value;
  }

  // Waits up to `seconds` for the launcher to exit; its exit code, or -1.
  int Finish(int seconds) {
    auto deadline = Clock::now() + std::chrono::seconds(seconds);
    int status = 0;
    while (Clock::now() < deadline) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    exit_code_ = -1;
    return -1;
  }

  std::string output() {
    if (reader_.joinable()) reader_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }

 private:
  void Read(int fd) {
    char buf[65536];
    while (true) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (n <= 0) {
        eof_ = true;
        cv_.notify_all();
        break;
      }
      output_.append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
    close(fd);
  }

  pid_t pid_ = -1;
  int exit_code_ = -2;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string output_ = "\n";  // so that every line follows a "\n"
  bool eof_ = false;
};

std::vector<std::string> LaunchArgs(int servers, int workers,
                                    const std::vector<std::string>& extra,
                                    const std::string& mode) {
  std::vector<std::string> args = {
      PS_PYTHON,   PS_LAUNCH_PY,
      "-s",        std::to_string(servers),
      "-w",        std::to_string(workers),
      "--timeout", std::to_string(kLaunchTimeoutSeconds)};
  for (const char* env :
       {"PS_HEARTBEAT_INTERVAL_MS=200", "PS_HEARTBEAT_TIMEOUT_MS=3000",
        "PS_CONNECT_TIMEOUT_MS=5000", "PS_RENDEZVOUS_TIMEOUT_MS=30000",
        "PS_BARRIER_TIMEOUT_MS=600000"}) {
    args.push_back("--env");
    args.push_back(env);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("--");
  args.push_back(PS_KV_JOB);
  args.push_back(mode);
  return args;
}

// How a stranger's socket speaks: no security mechanism; CurveZMQ with a key
// pair of its own; or ZMTP PLAIN with the job's sealing user name and a
// token it forged (it lacks the job's key).
enum class Mechanism { kNull, kCurve, kForgedToken };

// A stranger's socket: a DEALER to tcp://127.0.0.1:port.
class Stranger {
 public:
  Stranger(void* context, int port, Mechanism mechanism,
           const std::string& routing_id = "")
      : socket_(zmq_socket(context, ZMQ_DEALER)) {
    // Long enough for an accepted stranger's queue to leave; a refused
    // one's never does.
    int linger = mechanism == Mechanism::kNull ? 10000 : 1000;
    zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof(linger));
    if (!routing_id.empty()) {
      zmq_setsockopt(socket_, ZMQ_ROUTING_ID, routing_id.data(),
                     routing_id.size());
    }
    if (mechanism == Mechanism::kCurve) {
      char pub[41], sec[41];
      zmq_curve_keypair(pub, sec);
      zmq_setsockopt(socket_, ZMQ_CURVE_SERVERKEY, pub, 40);
      zmq_setsockopt(socket_, ZMQ_CURVE_PUBLICKEY, pub, 40);
      zmq_setsockopt(socket_, ZMQ_CURVE_SECRETKEY, sec, 40);
    } else if (mechanism == Mechanism::kForgedToken) {
      std::string token(128, 'a');  // 64 bytes in hex, proving nothing
      zmq_setsockopt(socket_, ZMQ_PLAIN_USERNAME, seal::kUserName,
                     std::strlen(seal::kUserName));
      zmq_setsockopt(socket_, ZMQ_PLAIN_PASSWORD, token.data(), token.size());
    }
    std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
    zmq_connect(socket_, endpoint.c_str());
  }
  ~Stranger() { zmq_close(socket_); }

  // Sends msg as the codec would (never blocks: a refused stranger's queue
  // fills and the rest is discarded).
  void Send(Message msg) {
    std::string header = EncodeHeader(&msg);
    size_t n = msg.data.size();
    zmq_send(socket_, header.data(), header.size(),
             ZMQ_DONTWAIT | (n > 0 ? ZMQ_SNDMORE : 0));
    for (size_t i = 0; i < n; ++i) {
      zmq_send(socket_, msg.data[i].data(), msg.data[i].size(),
               ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0));
    }
  }
  void SendRaw(const void* data, size_t size) {
    zmq_send(socket_, data, size, ZMQ_DONTWAIT);
  }
  // Queues up to `count` garbage messages and returns how many; stops when
  // the peer takes nothing for `patience_ms` (a refused stranger's queue
  // stays full).
  int Flood(int count, int patience_ms) {
    const char garbage[] = "\x08\xff\xff\xff\xff\x0f not a header";
    auto deadline = Clock::now() + std::chrono::seconds(120);
    int sent = 0;
    while (sent < count && Clock::now() < deadline) {
      if (zmq_send(socket_, garbage, sizeof(garbage), ZMQ_DONTWAIT) >= 0) {
        ++sent;
        continue;
      }
      zmq_pollitem_t item{socket_, 0, ZMQ_POLLOUT, 0};
      if (zmq_poll(&item, 1, patience_ms) <= 0) break;
    }
    // What was queued may leave as slowly as the peer takes it.
    int linger = std::max(patience_ms, 1000) * 2;
    zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof(linger));
    return sent;
  }

 private:
  void* socket_;
};

Message SpoofedPush(int recver) {
  Message msg;
  msg.meta.set_sender(WorkerRankToId(0));
  msg.meta.set_recver(recver);
  msg.meta.set_request(true);
  msg.meta.set_push(true);
  msg.meta.set_val_type(pb::FLOAT);
  SArray<Key> keys(std::vector<Key>{0});
  SArray<float> vals(std::vector<float>(4, std::nanf("")));
  msg.AddData(SArray<char>(keys), pb::UINT64);
  msg.AddData(SArray<char>(vals), pb::FLOAT);
  return msg;
}

Message SpoofedControl(pb::Command cmd, int sender, int recver, bool request) {
  Message msg;
  msg.meta.set_sender(sender);
  msg.meta.set_recver(recver);
  msg.meta.set_request(request);
  msg.meta.mutable_control()->set_cmd(cmd);
  return msg;
}

// Everything a stranger tries against the job's nodes; then runs
// `meanwhile` (the job) with the stranger's connections still open. Returns
// how many garbage messages the flood at server 0 queued.
//
// Why open: a connection closed while its peer still has bytes of it to
// read can lose them (measured: up to 96% of a flood of 100,000; most
// likely a reset, sent because the closing side had heartbeats unread,
// which discards what the peer's kernel held). A stranger that stays
// connected is read to its last message, and every one of them is counted.
int Attack(int scheduler_port, int server0_port, int server1_port,
           int worker0_port, bool with_key,
           const std::function<void()>& meanwhile) {
  void* context = zmq_ctx_new();
  int flooded = 0;
  {
    // As worker 0: a push of NaNs, then a pull of the weights.
    Stranger s0(context, server0_port,
                with_key ? Mechanism::kForgedToken : Mechanism::kNull);
    s0.Send(SpoofedPush(ServerRankToId(0)));
    Message pull =
        SpoofedControl(pb::EMPTY, WorkerRankToId(0), ServerRankToId(0), true);
    pull.meta.set_pull(true);
    pull.meta.set_val_type(pb::FLOAT);
    pull.AddData(SArray<char>(SArray<Key>(std::vector<Key>{0})), pb::UINT64);
    s0.Send(pull);
    // As the scheduler: "worker 1 is dead" to server 0 and worker 0.
    Message failed =
        SpoofedControl(pb::NODE_FAILED, kSchedulerId, ServerRankToId(0), false);
    pb::NodeInfo* dead = failed.meta.mutable_control()->add_node();
    dead->set_role(pb::WORKER);
    dead->set_id(WorkerRankToId(1));
    failed.meta.mutable_control()->set_verdict(pb::LOSE);
    s0.Send(failed);
    // As the scheduler: "worker 1 was restarted, at my address".
    Message joined =
        SpoofedControl(pb::NODE_JOINED, kSchedulerId, ServerRankToId(0), true);
    pb::NodeInfo* moved = joined.meta.mutable_control()->add_node();
    moved->set_role(pb::WORKER);
    moved->set_id(WorkerRankToId(1));
    moved->set_rank(1);
    moved->set_host("127.0.0.1");
    moved->set_port(9);
    s0.Send(joined);
    Stranger w0(context, worker0_port,
                with_key ? Mechanism::kCurve : Mechanism::kNull);
    failed.meta.set_recver(WorkerRankToId(0));
    w0.Send(failed);
    // At the scheduler: worker 1 "stopped without Finalize", worker 0
    // enters a barrier, and one worker too many registers.
    Stranger sch(context, scheduler_port,
                 with_key ? Mechanism::kForgedToken : Mechanism::kNull,
                 "127.0.0.1:9");
    Message bye =
        SpoofedControl(pb::TERMINATE, WorkerRankToId(1), kSchedulerId, true);
    bye.meta.mutable_control()->set_error("spoofed");
    sch.Send(bye);
    Message barrier =
        SpoofedControl(pb::BARRIER, WorkerRankToId(0), kSchedulerId, true);
    barrier.meta.mutable_control()->set_barrier_group(kAllGroups);
    sch.Send(barrier);
    Message add = SpoofedControl(pb::ADD_NODE, 0, kSchedulerId, true);
    pb::NodeInfo* me = add.meta.mutable_control()->add_node();
    me->set_role(pb::WORKER);
    me->set_host("127.0.0.1");
    me->set_port(9);
    me->set_requested_rank(-1);
    add.meta.mutable_control()->set_num_servers(2);
    add.meta.mutable_control()->set_num_workers(2);
    sch.Send(add);
    // And reports itself as worker 0 to a "restarted" scheduler.
    Message report = add;
    report.meta.mutable_control()->set_rejoin(true);
    report.meta.mutable_control()->mutable_node(0)->set_id(WorkerRankToId(0));
    report.meta.mutable_control()->mutable_node(0)->set_rank(0);
    sch.Send(report);
    // A flood of garbage at server 0 and one oversize frame at server 1.
    // A node that takes what it is sent keeps taking it: a slow (sanitized,
    // loaded) one is given 30 s, a refused connection's queue 1 s.
    flooded = s0.Flood(kFloodMessages, with_key ? 1000 : 30000);
    if (with_key) {
      // A stranger that speaks no security mechanism at all.
      Stranger plain(context, server0_port, Mechanism::kNull);
      plain.Send(SpoofedPush(ServerRankToId(0)));
    }
    Stranger s1(context, server1_port,
                with_key ? Mechanism::kCurve : Mechanism::kNull);
    {
      std::vector<char> big(kOversizeBytes);
      s1.SendRaw(big.data(), big.size());
    }
    meanwhile();
  }  // each socket lingers until its queue left (a minute at most)
  zmq_ctx_term(context);
  return flooded;
}

struct Counters {
  long long dropped = -1, refused = -1, peak_kb = -1;
};

// "[ROLE RANK] ROLE RANK dropped D refused R peak_kb K" lines, by "ROLE RANK".
std::map<std::string, Counters> ParseCounters(const std::string& out) {
  std::map<std::string, Counters> found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    char role[16] = {};
    int rank = -1;
    Counters c;
    size_t close = line.find("] ");
    if (close == std::string::npos) continue;
    if (std::sscanf(line.c_str() + close + 2,
                    "%15s %d dropped %lld refused %lld peak_kb %lld", role,
                    &rank, &c.dropped, &c.refused, &c.peak_kb) == 5) {
      found[std::string(role) + " " + std::to_string(rank)] = c;
    }
  }
  return found;
}

// Runs kv_job hostile with 2 servers and 2 workers while a stranger attacks,
// and checks that every sum is exact. Returns the nodes' counters and sets
// *flooded to the number of garbage messages queued at server 0.
std::map<std::string, Counters> RunAttackedJob(bool with_key,
                                               std::string* output,
                                               int* flooded) {
  std::string dir = testing::TempDir() + "/hostile_" +
                    std::to_string(getpid()) + (with_key ? "_key" : "_plain");
  mkdir(dir.c_str(), 0700);
  std::string go = dir + "/go";
  unlink(go.c_str());
  std::vector<std::string> extra = {
      "--env", "KV_JOB_GO=" + go, "--env",
      "PS_MAX_MESSAGE_BYTES=" + std::to_string(kMaxMessageBytes)};
  if (with_key) {
    char pub[41], sec[41];
    zmq_curve_keypair(pub, sec);  // the job's key: 32 random bytes in Z85
    std::string key_file = dir + "/job.key";
    int fd = open(key_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::string line = std::string(sec) + "\n";
    EXPECT_EQ(write(fd, line.data(), line.size()),
              static_cast<ssize_t>(line.size()));
    close(fd);
    extra.insert(extra.end(), {"--key-file", key_file});
  } else {
    extra.push_back("--insecure");
  }
  Job job(LaunchArgs(2, 2, extra, "hostile"));
  EXPECT_TRUE(job.started());
  long scheduler = job.WaitForNumber("[scheduler] scheduler 0 port ", 60);
  long server0 = job.WaitForNumber("[server 0] server 0 port ", 60);
  long server1 = job.WaitForNumber("[server 1] server 1 port ", 60);
  long worker0 = job.WaitForNumber("[worker 0] worker 0 port ", 60);
  EXPECT_GT(scheduler, 0);
  EXPECT_GT(server0, 0);
  EXPECT_GT(server1, 0);
  EXPECT_GT(worker0, 0);
  int exit_code = -1;
  auto run_job = [&] {
    { std::ofstream(go.c_str()) << "go\n"; }
    exit_code = job.Finish(kLaunchTimeoutSeconds + 30);
  };
  if (scheduler > 0 && server0 > 0 && server1 > 0 && worker0 > 0) {
    *flooded = Attack(scheduler, server0, server1, worker0, with_key, run_job);
  } else {
    run_job();
  }
  *output = job.output();
  unlink(go.c_str());
  EXPECT_EQ(exit_code, 0);

  // Exact sums: value i of the flat vector is (1 + 2) * (i + 1).
  const long long n = kKeys * 4, expected = 3 * n * (n + 1) / 2;
  int workers_ok = 0;
  long long server_sum = 0;
  std::istringstream in(*output);
  for (std::string line; std::getline(in, line);) {
    int p, r;
    long long total, keys, sum;
    char verdict[16] = {};
    if (std::sscanf(line.c_str(), "[worker %d] worker %d pulled %lld %15s", &p,
                    &r, &total, verdict) == 4) {
      EXPECT_EQ(total, expected) << line;
      workers_ok += std::string(verdict) == "ok";
    }
    if (std::sscanf(line.c_str(),
                    "[server %d] server %d holds %lld keys sum %lld", &p, &r,
                    &keys, &sum) == 4) {
      server_sum += sum;
    }
  }
  EXPECT_EQ(workers_ok, 2);
  EXPECT_EQ(server_sum, expected);
  return ParseCounters(*output);
}

TEST(Hostile, StrangerWithoutTheKeyIsRefusedAtConnect) {
  std::string out;
  int flooded = 0;
  std::map<std::string, Counters> c = RunAttackedJob(true, &out, &flooded);
  SCOPED_TRACE(out);
  ASSERT_EQ(c.size(), 5u);
  for (const char* who : {"scheduler 0", "server 0", "server 1", "worker 0"}) {
    EXPECT_GE(c[who].refused, 1) << who << " refused the stranger";
  }
  EXPECT_GE(c["server 0"].refused, 2) << "with a wrong key and with none";
  for (const auto& [who, counters] : c) {
    EXPECT_EQ(counters.dropped, 0) << who << ": nothing got past the handshake";
  }
  EXPECT_LT(c["server 1"].peak_kb, 128 * 1024);
}

TEST(Hostile, WithoutKeysEverySpoofIsDroppedAndCounted) {
  std::string out;
  int flooded = 0;
  std::map<std::string, Counters> c = RunAttackedJob(false, &out, &flooded);
  SCOPED_TRACE(out);
  ASSERT_EQ(c.size(), 5u);
  // Spoofed push, pull, NODE_FAILED and NODE_JOINED, and the whole flood:
  // server 0 kept reading it all, and dropped every message.
  EXPECT_EQ(flooded, kFloodMessages);
  EXPECT_GE(c["server 0"].dropped, flooded + 4);
  EXPECT_GE(c["worker 0"].dropped, 1);  // NODE_FAILED "from the scheduler"
  // TERMINATE and BARRIER as others, one worker too many, and a member's
  // report to a scheduler that did not restart.
  EXPECT_GE(c["scheduler 0"].dropped, 4);
  // The oversize frame was refused before it was buffered.
  EXPECT_GT(c["server 1"].peak_kb, 0);
  EXPECT_LT(c["server 1"].peak_kb, 128 * 1024);
  // Reports are rate-limited: a few lines per node, not one per message.
  size_t reports = 0;
  for (size_t at = out.find("dropped a message"); at != std::string::npos;
       at = out.find("dropped a message", at + 1)) {
    ++reports;
  }
  EXPECT_GE(reports, 1u);
  EXPECT_LE(reports, 60u);
}

// Failures are named by role and rank, at once.
int RunFailing(const std::string& mode, std::string* output) {
  Job job(LaunchArgs(1, 2, {}, mode));
  int code = job.Finish(kLaunchTimeoutSeconds + 30);
  *output = job.output();
  return code;
}

TEST(Hostile, WorkerThatExitsWithoutFinalizeIsNamedAtOnce) {
  // The barrier timeout is 10 minutes: only the departure report can end
  // this job within the launcher's timeout.
  std::string out;
  EXPECT_EQ(RunFailing("exit-worker", &out), 1);
  EXPECT_NE(out.find("worker 1 (tcp://"), std::string::npos) << out;
  EXPECT_NE(out.find("was declared dead: it stopped without Finalize"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("launch: worker 1 (pid"), std::string::npos) << out;
}

// exit() inside a request handler stops the node from its own receive
// thread: the process exits with its code (no abort on a self-join), and
// the scheduler hears that it left without Finalize.
TEST(Hostile, ExitInsideAHandlerIsACleanReportedFailure) {
  std::string out;
  EXPECT_EQ(RunFailing("exit-server", &out), 1);
  EXPECT_NE(out.find("launch: server 0 (pid"), std::string::npos) << out;
  EXPECT_NE(out.find("was declared dead: it stopped without Finalize"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  EXPECT_EQ(out.find("SIGABRT"), std::string::npos) << out;
}

// A worker launched with another DMLC_NUM_WORKER: the scheduler fails the
// rendezvous at once (tests/core/trust_test.cc shows every node told), and
// the launcher says why the job could not start, naming both shapes,
// whichever node exited first.
TEST(Hostile, NodeOfAnotherJobShapeIsRefusedNamingBothValues) {
  std::string out;
  EXPECT_EQ(RunFailing("odd-shape", &out), 1);
  EXPECT_NE(out.find("launch: the job could not start: rendezvous failed: "
                     "the worker at tcp://"),
            std::string::npos)
      << out;
  const size_t line = out.find("launch: the job could not start");
  ASSERT_NE(line, std::string::npos) << out;
  EXPECT_NE(out.substr(line, out.find('\n', line) - line)
                .find("was started for DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=3, "
                      "the scheduler for DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2"),
            std::string::npos)
      << out;
}

// A member holding the key pushes step 0 cut into other key ranges than
// the honest worker, then stays alive and silent. Whoever pushed first,
// the shard refuses the other cut and stops: the honest worker's step
// fails naming the member, and the job ends without waiting on the member
// (it would sleep 5 minutes, longer than this test's bound).
TEST(Hostile, GradientCutOtherwiseByAMemberStopsTheJobNamingIt) {
  std::string out;
  EXPECT_EQ(RunFailing("cut-member", &out), 1);
  // The member's cut came second: refused, and the shard stopped ("of
  // worker 1: keys [0, 2) ..."); or first: the honest cut is refused,
  // naming the member ("... that worker 1 pushed").
  const size_t at = out.find("worker 0 step 0: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_TRUE(line.find("Peer failed: server 0 (tcp://") != std::string::npos ||
              line.find("Invalid argument: server 0 (tcp://") !=
                  std::string::npos)
      << line;
  EXPECT_TRUE(line.find("it refused the gradient of step 0 of worker 1: "
                        "keys [0, 2) of step 0 overlap") != std::string::npos ||
              line.find("that worker 1 pushed, cut otherwise") !=
                  std::string::npos)
      << line;
  EXPECT_NE(out.find("server 0: Peer failed: the dense shard stopped serving "
                     "steps: it refused the gradient of step 0 of worker "),
            std::string::npos)
      << out;
  // The launcher repeats the worker's reason before its verdict.
  EXPECT_NE(out.find("launch: worker 0 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find(") said last: " + line), std::string::npos) << out;
}

// A worker declared dead (frozen past the heartbeat timeout) that comes
// back and pushes is fenced by the postoffice, under any layer: the plain
// KVServer, which keeps no membership of its own, never sees the push. Its
// sum stays that of the two workers' first pushes, 3 x (1 + .. + 100), and
// it counts the push fenced (the log may not show it: the worker's
// connection was made again while it was frozen, so its first messages
// after find a gap in the sealed stream, are sent again in a new session,
// and those reports can fill the log's window of drop reports).
TEST(Hostile, WorkerDeclaredDeadIsFencedWhenItComesBack) {
  Job job(LaunchArgs(1, 2,
                     {"--tolerate", "worker", "--keep-declared-dead", "--env",
                      "PS_HEARTBEAT_TIMEOUT_MS=1500"},
                     "fenced-worker"));
  EXPECT_EQ(job.Finish(kLaunchTimeoutSeconds + 30), 0) << job.output();
  const std::string out = job.output();
  EXPECT_NE(out.find("worker 1 pushed again, let go on"), std::string::npos)
      << out;
  EXPECT_NE(out.find("worker 0 pulled 15150 ok"), std::string::npos) << out;
  const size_t at = out.find("server 0 fenced ");
  ASSERT_NE(at, std::string::npos) << out;
  unsigned long long fenced = 0, keys = 0, sum = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + at,
                        "server 0 fenced %llu, holds %llu keys sum %llu",
                        &fenced, &keys, &sum),
            3)
      << out;
  EXPECT_GE(fenced, 1u) << out;  // the push, and maybe its resends
  EXPECT_EQ(keys, 100u) << out;
  EXPECT_EQ(sum, 15150u) << out;
}

// Worker 0 and servers 0 and 1, 3 of the 5 members, frozen together for
// 9 s (past the 3 s heartbeat timeout): the scheduler hears no majority and
// declares nobody dead, and says so; worker 1, whose push to them waits,
// reports it stalled once the heartbeat timeout and 5 s have passed, naming
// the server; and the job goes on once they are let go: the second round
// completes with exact sums.
TEST(Hostile, MajorityFrozenTogetherIsNotJudgedAndGoesOn) {
  Job job(LaunchArgs(3, 2, {}, "freeze-majority"));
  EXPECT_EQ(job.Finish(kLaunchTimeoutSeconds + 30), 0) << job.output();
  const std::string out = job.output();
  for (const char* line :
       {"worker 0 freezes", "server 0 freezes", "server 1 freezes",
        "worker 0 pulled 481200 ok", "worker 1 pulled 481200 ok"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  EXPECT_EQ(out.find("was declared dead"), std::string::npos) << out;
  EXPECT_NE(out.find("more than half of the job at once"), std::string::npos)
      << out;
  // worker 1's line: "stalled: request N (push, cmd 0) for server 0 (...)'s
  // keys unanswered for 8.0 s" (no std::regex: GCC 12 warns inside it).
  const size_t stalled = out.find("stalled: request ");
  ASSERT_NE(stalled, std::string::npos) << out;
  const std::string line =
      out.substr(out.rfind('\n', stalled) + 1,
                 out.find('\n', stalled) - out.rfind('\n', stalled) - 1);
  EXPECT_EQ(line.rfind("[worker 1] ", 0), 0u) << line;
  EXPECT_NE(line.find(" (push, cmd 0) for server "), std::string::npos) << line;
  EXPECT_NE(line.find("'s keys unanswered for 8."), std::string::npos) << line;
}

TEST(Hostile, FrozenServerIsNamedNotTheHealthyNodes) {
  std::string out;
  EXPECT_EQ(RunFailing("freeze-server", &out), 1);
  EXPECT_NE(out.find("launch: server 0 (pid"), std::string::npos) << out;
  EXPECT_NE(out.find("server 0 (tcp://"), std::string::npos) << out;
  EXPECT_NE(out.find("was declared dead"), std::string::npos) << out;
}

}  // namespace
}  // namespace ps
