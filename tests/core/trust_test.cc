// Trust in the core, in-process: jobs under the job key, a node
// with another key refused at connect, the job-shape check, who is missing
// named by rank, a departure without Finalize reported at once, timeouts at
// INT_MAX, and the configuration of keys (PS_KEY_FILE, PS_KEY_FD) and limits.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "gtest/gtest.h"
#include "ps/kv_app.h"
#include "van/van.h"

namespace ps {
namespace {

// A fresh job key: 32 random bytes in Z85.
std::string NewSecretKey() {
  char pub[41], sec[41];
  EXPECT_EQ(zmq_curve_keypair(pub, sec), 0);
  return sec;
}

// Pushes (rank+1) from every worker and pulls the sum back on each.
void ExpectExactSum(Cluster* c) {
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  for (auto& node : c->servers) {
    servers.push_back(std::make_unique<KVServer<float>>(node.get(), 0));
    servers.back()->set_request_handle(KVServerDefaultHandle<float>());
  }
  const std::vector<Key> keys = {1, 40000};
  for (size_t w = 0; w < c->workers.size(); ++w) {
    KVWorker<float> kv(c->workers[w].get(), 0, 0);
    float v = static_cast<float>(c->workers[w]->rank() + 1);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {v, v})).ok());
  }
  std::vector<std::thread> barriers;
  std::vector<Status> entered(c->workers.size());
  for (size_t i = 0; i < c->workers.size(); ++i) {
    barriers.emplace_back(
        [&, i] { entered[i] = c->workers[i]->Barrier(kWorkerGroup); });
  }
  for (auto& t : barriers) t.join();
  for (const Status& s : entered) ASSERT_TRUE(s.ok()) << s;
  const float w = static_cast<float>(c->workers.size());
  for (auto& n : c->workers) {
    KVWorker<float> kv(n.get(), 0, 1);
    std::vector<float> out;
    ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
    EXPECT_EQ(out, (std::vector<float>{w * (w + 1) / 2, w * (w + 1) / 2}));
  }
  EXPECT_TRUE(c->Finalize());
}

TEST(Trust, JobUnderItsKeyGivesExactSums) {
  std::string key = NewSecretKey();
  Cluster c(2, 2, [&](Config* cfg) { cfg->secret_key = key; });
  for (const Status& s : c.RunAll([](Node* n) { return n->Start(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  ExpectExactSum(&c);
  for (Node* n : c.All()) {
    EXPECT_EQ(n->num_refused_connections(), 0u);
    EXPECT_EQ(n->num_dropped_messages(), 0u);
  }
}

TEST(Trust, NodeWithAnotherKeyIsRefusedAtConnect) {
  std::string key = NewSecretKey();
  Cluster c(1, 1, [&](Config* cfg) {
    cfg->secret_key = key;
    cfg->connect_timeout_ms = 1500;
    cfg->rendezvous_timeout_ms = 1500;
  });
  Config stranger_config = c.workers[0]->config();
  stranger_config.secret_key = NewSecretKey();
  c.workers[0] = std::make_unique<Node>(stranger_config);
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  EXPECT_EQ(st[2].code(), Status::kUnavailable) << st[2];
  EXPECT_NE(st[2].message().find("same PS_KEY_FILE"), std::string::npos)
      << st[2];
  // The scheduler never saw it register: one worker missing.
  EXPECT_EQ(st[0].code(), Status::kTimeout) << st[0];
  EXPECT_NE(st[0].message().find("missing: worker 0"), std::string::npos)
      << st[0];
  EXPECT_GE(c.scheduler->num_refused_connections(), 1u);
}

TEST(Trust, NodeWithoutAKeyIsRefusedAtConnect) {
  std::string key = NewSecretKey();
  Cluster c(1, 1, [&](Config* cfg) {
    cfg->secret_key = key;
    cfg->connect_timeout_ms = 1500;
    cfg->rendezvous_timeout_ms = 1500;
  });
  Config plain = c.workers[0]->config();
  plain.secret_key.clear();
  c.workers[0] = std::make_unique<Node>(plain);
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  EXPECT_EQ(st[2].code(), Status::kUnavailable) << st[2];
  EXPECT_EQ(st[0].code(), Status::kTimeout) << st[0];
  EXPECT_GE(c.scheduler->num_refused_connections(), 1u);
}

// One worker launched with another DMLC_NUM_WORKER: it is refused naming
// both shapes, and so is every other node, whether it registered before or
// after it: nobody waits for the rendezvous timeout (long here, so that
// waiting for it would fail).
TEST(Trust, NodeOfAnotherJobShapeIsRefusedNamingBothValues) {
  Cluster c(1, 2, [](Config* cfg) { cfg->rendezvous_timeout_ms = 120000; });
  Config odd = c.workers[1]->config();
  odd.num_workers = 3;
  c.workers[1] = std::make_unique<Node>(odd);
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  const std::string shapes =
      "was started for DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=3, the "
      "scheduler for DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2";
  for (size_t i = 0; i < st.size(); ++i) {
    EXPECT_EQ(st[i].code(), Status::kInvalidArgument) << i << ": " << st[i];
    EXPECT_NE(st[i].message().find(shapes), std::string::npos)
        << i << ": " << st[i];
  }
}

// Without a key (launch.py --insecure), the job's token keeps other jobs'
// nodes out: a stranger asking for worker rank 0 first, with another
// token or none, is refused (naming neither token) and takes no rank; the
// job's own worker then gets rank 0.
TEST(Trust, StrangerWithoutTheJobTokenIsRefusedAndTakesNoRank) {
  const std::string token(32, 'a');
  Cluster c(1, 1, [&](Config* cfg) { cfg->job_token = token; });
  Status scheduler;
  std::thread sched([&] { scheduler = c.scheduler->Start(); });
  for (const std::string& other : {std::string(32, 'b'), std::string()}) {
    Config cfg = c.workers[0]->config();
    cfg.job_token = other;
    cfg.rank = 0;
    Node stranger(cfg);
    Status st = stranger.Start();
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("has not this job's token (PS_JOB_TOKEN): "
                                "refused"),
              std::string::npos)
        << st;
    EXPECT_EQ(st.message().find(token), std::string::npos) << st;
    if (!other.empty()) {
      EXPECT_EQ(st.message().find(other), std::string::npos) << st;
    }
  }
  Status server, worker;
  std::thread s([&] { server = c.servers[0]->Start(); });
  worker = c.workers[0]->Start();
  s.join();
  sched.join();
  ASSERT_TRUE(scheduler.ok()) << scheduler;
  ASSERT_TRUE(server.ok()) << server;
  ASSERT_TRUE(worker.ok()) << worker;
  EXPECT_EQ(c.workers[0]->rank(), 0);
  EXPECT_TRUE(c.Finalize());
}

// A token is a secret: a bad one is refused without being shown.
TEST(Trust, JobTokenIsCheckedAndNeverShown) {
  std::map<std::string, std::string> env = {{"DMLC_ROLE", "server"},
                                            {"DMLC_PS_ROOT_PORT", "9000"},
                                            {"DMLC_NUM_SERVER", "1"},
                                            {"DMLC_NUM_WORKER", "1"}};
  for (const std::string& bad :
       {std::string("short-secret"), std::string("has a space in the token"),
        std::string(300, 'x')}) {
    env["PS_JOB_TOKEN"] = bad;
    Status st = Config::FromEnv(env).status();
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("PS_JOB_TOKEN (" + std::to_string(bad.size()) +
                                " characters, not shown) is not a token of 16 "
                                "to 256 printable characters"),
              std::string::npos)
        << st;
    EXPECT_EQ(st.message().find(bad), std::string::npos) << st;
  }
  env["PS_JOB_TOKEN"] = "0123456789abcdef0123456789abcdef";
  StatusOr<Config> ok = Config::FromEnv(env);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->job_token, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(ok->ToString().find(ok->job_token), std::string::npos);
}

TEST(Trust, RendezvousTimeoutNamesMissingRanks) {
  Cluster c(2, 2, [](Config* cfg) { cfg->rendezvous_timeout_ms = 800; });
  for (int r = 0; r < 2; ++r) {
    Config s = c.servers[r]->config();
    s.rank = r;
    c.servers[r] = std::make_unique<Node>(s);
    Config w = c.workers[r]->config();
    w.rank = r;
    c.workers[r] = std::make_unique<Node>(w);
  }
  c.servers.erase(c.servers.begin() + 1);  // server 1 never comes
  c.workers.erase(c.workers.begin());      // nor does worker 0
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  EXPECT_EQ(st[0].code(), Status::kTimeout);
  EXPECT_NE(st[0].message().find("missing: server 1, worker 0"),
            std::string::npos)
      << st[0];
}

TEST(Trust, StopWithoutFinalizeIsReportedAtOnceNamingTheNode) {
  // Heartbeats would take 10 minutes: only the departure report can tell.
  Cluster c(1, 2, [](Config* cfg) { cfg->heartbeat_timeout_ms = 600000; });
  ASSERT_TRUE(c.Start());
  std::string name = c.workers[1]->DescribeNode(c.workers[1]->id());
  c.workers[1]->Stop();  // as a process that exits early would
  Status st = c.servers[0]->Barrier(kServerGroup | kWorkerGroup);
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  Status failure = c.servers[0]->peer_failure();
  EXPECT_NE(failure.message().find(name + " was declared dead: it stopped "
                                          "without Finalize"),
            std::string::npos)
      << failure;
  // Worker 0 hears of it on its own receive thread: wait for that, bounded.
  for (int i = 0; i < 500 && c.workers[0]->peer_failure().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(c.workers[0]->peer_failure().message().find(name),
            std::string::npos)
      << c.workers[0]->peer_failure();
}

TEST(Trust, TimeoutsAtIntMaxDoNotOverflow) {
  Cluster c(1, 1, [](Config* cfg) {
    cfg->barrier_timeout_ms = INT_MAX;
    cfg->connect_timeout_ms = INT_MAX;
    cfg->rendezvous_timeout_ms = INT_MAX;
  });
  ASSERT_TRUE(c.Start());
  for (const Status& s :
       c.RunAll([](Node* n) { return n->Barrier(kAllGroups); })) {
    EXPECT_TRUE(s.ok()) << s;
  }
  for (Node* n : c.All()) n->Stop();
}

// A message over PS_MAX_MESSAGE_BYTES is refused where it is sent, with an
// error naming the limit: a push at the worker, a pull's answer at the
// server (which answers with the error instead).
TEST(Trust, MessagesOverTheLimitFailTheirRequestNamingIt) {
  Cluster c(1, 1, [](Config* cfg) { cfg->max_message_bytes = 1 << 20; });
  ASSERT_TRUE(c.Start());
  KVServer<float> server(c.servers[0].get(), 0);
  server.set_request_handle(KVServerDefaultHandle<float>());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  const size_t big = (1 << 20) / sizeof(float) + 1;  // floats
  Status st = kv.Wait(kv.Push({1}, std::vector<float>(big, 1.0f)));
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("PS_MAX_MESSAGE_BYTES"), std::string::npos) << st;
  // Two pushes that fit, whose sum the server then cannot send back whole.
  const size_t half = big / 2 + 1;
  ASSERT_TRUE(kv.Wait(kv.Push({1}, std::vector<float>(half, 1.0f))).ok());
  ASSERT_TRUE(kv.Wait(kv.Push({2}, std::vector<float>(half, 1.0f))).ok());
  std::vector<float> out;
  st = kv.Wait(kv.Pull({1, 2}, &out));
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("PS_MAX_MESSAGE_BYTES"), std::string::npos) << st;
  // The node keeps serving.
  ASSERT_TRUE(kv.Wait(kv.Pull({1}, &out)).ok());
  EXPECT_EQ(out.size(), half);
  EXPECT_TRUE(c.Finalize());
}

// Requests for an app that has no KVServer yet are held, within
// PS_MAX_MESSAGE_BYTES in all; one past that is refused at once, not lost.
// A held request's resent copies (every 100 ms here) count once.
TEST(Trust, HeldRequestsAreBoundedInBytes) {
  Cluster c(1, 1, [](Config* cfg) {
    cfg->max_message_bytes = 64 << 10;
    cfg->connect_timeout_ms = 1000;  // held ones are refused after this
    cfg->resend_timeout_ms = 100;
  });
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), /*app_id=*/7, 0);
  const std::vector<float> vals((40 << 10) / sizeof(float), 1.0f);
  int first = kv.Push({1}, vals);
  Status second = kv.Wait(kv.Push({2}, vals));
  EXPECT_EQ(second.code(), Status::kUnavailable) << second;
  EXPECT_NE(second.message().find("holds too many requests"), std::string::npos)
      << second;
  Status held = kv.Wait(first);
  EXPECT_EQ(held.code(), Status::kNotFound) << held;
  EXPECT_TRUE(c.Finalize());
}

TEST(Trust, ConnectionsAreNamedReadably) {
  EXPECT_EQ(Van::DescribeConnection("127.0.0.1:4000", "127.0.0.1"),
            "connection '127.0.0.1:4000' from 127.0.0.1");
  EXPECT_EQ(Van::DescribeConnection(std::string("\0\x6b\x8b\x45\x67", 5), ""),
            "connection 0x006b8b4567");
  EXPECT_EQ(Van::DescribeConnection("", "10.0.0.2"),
            "connection (no routing id) from 10.0.0.2");
  EXPECT_EQ(Van::DescribeConnection(std::string(40, '\x01'), ""),
            "connection 0x01010101010101010101010101010101...");
}

std::map<std::string, std::string> BaseEnv() {
  return {{"DMLC_ROLE", "worker"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "1"},
          {"DMLC_NUM_WORKER", "1"}};
}

TEST(Trust, KeyFileIsReadAndCheckedNamingTheFile) {
  std::string dir = testing::TempDir();
  std::string good = dir + "/trust_good.key", bad = dir + "/trust_bad.key";
  std::string key = NewSecretKey();
  FILE* f = std::fopen(good.c_str(), "w");
  std::fprintf(f, "%s\n", key.c_str());
  std::fclose(f);
  f = std::fopen(bad.c_str(), "w");
  std::fprintf(f, "not a key\n");
  std::fclose(f);

  auto env = BaseEnv();
  env["PS_KEY_FILE"] = good;
  StatusOr<Config> c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->secret_key, key);
  EXPECT_EQ(c->ToString().find(key), std::string::npos) << "never printed";

  env["PS_KEY_FILE"] = bad;
  c = Config::FromEnv(env);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("PS_KEY_FILE='" + bad +
                                      "' does not hold a job key"),
            std::string::npos)
      << c.status();

  env["PS_KEY_FILE"] = dir + "/trust_missing.key";
  c = Config::FromEnv(env);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cannot read the key file"),
            std::string::npos)
      << c.status();
}

// A key file is a small regular file: a device that never ends
// (/dev/zero), a pipe, a directory or a large file is refused at once,
// naming the variable and the path, without reading it.
TEST(Trust, KeyFileMustBeASmallRegularFile) {
  auto error = [](const std::string& path) {
    auto env = BaseEnv();
    env["PS_KEY_FILE"] = path;
    StatusOr<Config> c = Config::FromEnv(env);
    EXPECT_FALSE(c.ok()) << path;
    EXPECT_EQ(c.status().code(), Status::kInvalidArgument) << path;
    return c.status().message();
  };
  EXPECT_EQ(error("/dev/zero"),
            "PS_KEY_FILE='/dev/zero' is not a regular file (a key file is "
            "one line of 40 Z85 characters)");
  std::string dir = testing::TempDir();
  EXPECT_EQ(error(dir).rfind("PS_KEY_FILE='" + dir + "'", 0), 0u);

  std::string fifo = dir + "/trust_key.fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error(fifo), "PS_KEY_FILE='" + fifo +
                             "' is not a regular file (a key file is one "
                             "line of 40 Z85 characters)");
  unlink(fifo.c_str());

  // A valid key followed by more than a key file holds.
  std::string big = dir + "/trust_big.key";
  FILE* f = std::fopen(big.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s\n%s\n", NewSecretKey().c_str(),
               std::string(5000, '#').c_str());
  std::fclose(f);
  EXPECT_EQ(error(big), "PS_KEY_FILE='" + big +
                            "' is 5042 bytes, more than a key file's 4096");

  // The flag is named when it gave the path.
  gflags::FlagSaver restore_flags_at_exit;
  ASSERT_FALSE(
      gflags::SetCommandLineOption("ps_key_file", "/dev/zero").empty());
  StatusOr<Config> c = Config::FromEnvAndFlags(BaseEnv());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("--ps_key_file='/dev/zero' is not a "
                                       "regular file",
                                       0),
            0u)
      << c.status();
}

// PS_KEY_FD: what launch.py gives a local node, a memfd (read from its
// start, whatever its offset) or a pipe (read up to its newline, its writer
// still open). The descriptor is closed once read.
TEST(Trust, KeyFdIsReadOnceAndClosed) {
  const std::string key = NewSecretKey(), line = key + "\n";
  int memfd = memfd_create("trust-key", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(write(memfd, line.data(), line.size()),
            static_cast<ssize_t>(line.size()));
  auto env = BaseEnv();
  env["PS_KEY_FD"] = std::to_string(memfd);
  StatusOr<Config> c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->secret_key, key);
  EXPECT_EQ(c->key_file, "fd:" + std::to_string(memfd));
  EXPECT_EQ(c->ToString().find(key), std::string::npos) << "never printed";
  EXPECT_EQ(fcntl(memfd, F_GETFD), -1) << "closed once read";

  c = Config::FromEnv(env);  // read once: the number is closed now
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("PS_KEY_FD='" + std::to_string(memfd) +
                                           "' is not an open file descriptor",
                                       0),
            0u)
      << c.status();

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  ASSERT_EQ(write(pipe_fds[1], line.data(), line.size()),
            static_cast<ssize_t>(line.size()));
  env["PS_KEY_FD"] = std::to_string(pipe_fds[0]);
  c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->secret_key, key);
  EXPECT_EQ(fcntl(pipe_fds[0], F_GETFD), -1);
  close(pipe_fds[1]);
}

// A bad PS_KEY_FD is refused naming the variable (or flag) and the value:
// not a number, a closed descriptor, a device, a large file, a pipe that
// gives too much or no key, or set with PS_KEY_FILE.
TEST(Trust, KeyFdMustBeAnOpenSmallFileOrPipe) {
  auto error = [](const std::string& value) {
    auto env = BaseEnv();
    env["PS_KEY_FD"] = value;
    StatusOr<Config> c = Config::FromEnv(env);
    EXPECT_FALSE(c.ok()) << value;
    EXPECT_EQ(c.status().code(), Status::kInvalidArgument) << value;
    return c.status().message();
  };
  const std::string not_a_number =
      "' is not a file descriptor number (a non-negative integer)";
  EXPECT_EQ(error("three"), "PS_KEY_FD='three" + not_a_number);
  EXPECT_EQ(error("-1"), "PS_KEY_FD='-1" + not_a_number);

  int closed = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(closed, 0);
  close(closed);
  const std::string fd = std::to_string(closed);
  EXPECT_EQ(error(fd),
            "PS_KEY_FD='" + fd +
                "' is not an open file descriptor (Bad file descriptor; the "
                "key's descriptor is read once, then closed)");

  int dev = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(dev, 0);
  EXPECT_EQ(error(std::to_string(dev)),
            "PS_KEY_FD='" + std::to_string(dev) +
                "' is not a regular file or a pipe (a key descriptor holds "
                "one line of 40 Z85 characters)");
  EXPECT_EQ(fcntl(dev, F_GETFD), FD_CLOEXEC) << "left open: not read";
  close(dev);

  std::string big = testing::TempDir() + "/trust_big_fd.key";
  FILE* f = std::fopen(big.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s\n%s\n", NewSecretKey().c_str(),
               std::string(5000, '#').c_str());
  std::fclose(f);
  int big_fd = open(big.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(big_fd, 0);
  EXPECT_EQ(error(std::to_string(big_fd)),
            "PS_KEY_FD='" + std::to_string(big_fd) +
                "' is 5042 bytes, more than a key file's 4096");
  unlink(big.c_str());

  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::string flood(5000, 'x');
  ASSERT_EQ(write(p[1], flood.data(), flood.size()), 5000);
  EXPECT_EQ(error(std::to_string(p[0])),
            "PS_KEY_FD='" + std::to_string(p[0]) +
                "' gave more than a key file's 4096 bytes without a newline");
  close(p[1]);

  ASSERT_EQ(pipe(p), 0);
  close(p[1]);  // an empty pipe: its end at once
  EXPECT_EQ(error(std::to_string(p[0]))
                .rfind("PS_KEY_FD='" + std::to_string(p[0]) +
                           "' does not hold a job key",
                       0),
            0u);

  std::string good = testing::TempDir() + "/trust_fd_and_file.key";
  f = std::fopen(good.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s\n", NewSecretKey().c_str());
  std::fclose(f);
  auto env = BaseEnv();
  env["PS_KEY_FILE"] = good;
  env["PS_KEY_FD"] = "0";
  StatusOr<Config> c = Config::FromEnv(env);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "PS_KEY_FD and PS_KEY_FILE are both set; give the key one way");
  unlink(good.c_str());

  // The flag is named when it gave the number.
  gflags::FlagSaver restore_flags_at_exit;
  ASSERT_FALSE(gflags::SetCommandLineOption("ps_key_fd", fd.c_str()).empty());
  c = Config::FromEnvAndFlags(BaseEnv());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind(
                "--ps_key_fd='" + fd + "' is not an open file descriptor", 0),
            0u)
      << c.status();
}

TEST(Trust, LimitsAreReadAndChecked) {
  auto env = BaseEnv();
  env["PS_MAX_MESSAGE_BYTES"] = "1048576";
  env["DMLC_PS_WATER_MARK"] = "50";
  StatusOr<Config> c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_message_bytes, 1048576);
  EXPECT_EQ(c->water_mark, 50);
  env["PS_MAX_MESSAGE_BYTES"] = "12";
  c = Config::FromEnv(env);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("PS_MAX_MESSAGE_BYTES='12'"),
            std::string::npos);
  env["PS_MAX_MESSAGE_BYTES"] = "1048576";
  env["DMLC_PS_WATER_MARK"] = "0";
  c = Config::FromEnv(env);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("DMLC_PS_WATER_MARK='0'"),
            std::string::npos);
}

}  // namespace
}  // namespace ps
