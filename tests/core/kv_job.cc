// A real ps program for the multi-process tests, run by tracker/launch.py.
// Usage: kv_job MODE   with MODE one of
//   sum          each worker pushes (rank+1)*(i+1) for value i, pulls back
//                the exact total; each server prints the sum it holds
//   varlen       the same with variable-length values (key i: i%5+1 values)
//   shared       as sum, with the values and the pull's destination in
//                ps::SharedArrays: co-located servers read and write them
//                in place; each worker also prints its shared-frame counts
//   threads      four threads of each worker push and pull their own keys
//   kill-worker  worker 0 kills itself after its first push
//   kill-server  server 0 kills itself on its first request
//   freeze-server  server 0 stops itself (SIGSTOP) on its first request
//   exit-worker  worker 1 exits 1 after its push, without Finalize
//   exit-server  server 0 calls std::exit(3) inside its request handler
//   odd-shape    worker 1 believes the job has one worker more
//   cut-member   1 server with a DenseShard (BSP); worker 0 pushes step 0
//                whole and pulls step 1, worker 1 (a member holding the
//                key) pushes step 0 cut otherwise and then stays alive,
//                silent, for up to 5 minutes: the shard stops naming it
//   customers-bsp  1 server with a DenseShard (BSP); each worker process
//                runs two worker customers (launch.py --worker-customers
//                2), each a worker of the job: for 5 steps each pushes
//                (its rank + 1) and pulls the next step's weights, which
//                are exact only if every step waited for every customer
//   hostile      as sum, but every node prints its port at start and each
//                worker waits for the file $KV_JOB_GO before it pushes (an
//                attacker acts meanwhile); at the end every node prints
//                its drop and refusal counts and its peak memory
//   fenced-worker  1 server, 2 workers, launched with --tolerate worker
//                --keep-declared-dead: both workers push as in sum; then
//                worker 1 freezes itself (SIGSTOP) for 6 s, past the
//                heartbeat timeout, so it is declared dead, and once let
//                go on (by a child of its own) pushes 1000 times its
//                values at once. The server holds on until it fenced a
//                message (at most 60 s) and prints its sum: exact only if
//                the late push was dropped (fenced)
//   freeze-majority  3 servers, 2 workers: a round as in sum; then worker 0,
//                server 0 and server 1 (3 of the 5 members) freeze
//                themselves (SIGSTOP) at once for 9 s, past the heartbeat
//                timeout and past the stall report's bound: the scheduler,
//                hearing no majority, declares nobody dead, and worker 1
//                reports its push as stalled. Once let go on (each by a
//                child of its own) the second round must complete: each
//                worker pulls exactly twice the sum
//   until-go     as sum, but each worker first pushes zeros every 50 ms
//                until the file $KV_JOB_GO exists (at most 5 minutes): a
//                job that runs, with traffic, as long as a test watches it
// Workers exit 1 when a pulled value differs from the exact expectation.
// The --ps_* flags (include/ps/config.h) are parsed and override the
// environment.
#include <gflags/gflags.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ps/dense_server.h"
#include "ps/ps.h"

namespace {

constexpr int kKeys = 100;

std::vector<ps::Key> Keys() {
  std::vector<ps::Key> keys(kKeys);
  for (int i = 0; i < kKeys; ++i) keys[i] = 1000 * i;  // sparse key space
  return keys;
}

std::vector<int> Lens(bool varlen) {
  std::vector<int> lens(kKeys);
  for (int i = 0; i < kKeys; ++i) lens[i] = varlen ? i % 5 + 1 : 4;
  return lens;
}

ps::Placement MakePlacement(bool varlen) {
  std::vector<uint64_t> sizes;
  for (int len : Lens(varlen)) sizes.push_back(len);
  return ps::Placement::ByBytes(Keys(), sizes, ps::NumServers()).value();
}

// "worker R pulled TOTAL ok|WRONG": ok when value i of `out` is exactly
// rounds * (1 + .. + W) * (i + 1) and there are n of them.
int Verdict(const float* out, size_t size, size_t n, bool lens_ok,
            int rounds = 1) {
  int rank = ps::MyRank(), w = ps::NumWorkers();
  double total = 0;
  bool exact = size == n && lens_ok;
  for (size_t i = 0; exact && i < n; ++i) {
    exact = out[i] == rounds * (w * (w + 1) / 2.0f) * (i + 1);
    total += out[i];
  }
  std::printf("worker %d pulled %.0f %s\n", rank, total,
              exact ? "ok" : "WRONG");
  std::fflush(stdout);
  return exact ? 0 : 1;
}

int RunSharedWorker(ps::KVWorker<float>* kv, const std::vector<ps::Key>& keys,
                    size_t n) {
  ps::SArray<ps::Key> k(keys);
  ps::SArray<float> vals = ps::SharedArray<float>(n);
  for (size_t i = 0; i < n; ++i) vals[i] = (ps::MyRank() + 1.0f) * (i + 1);
  if (!kv->Wait(kv->ZPush(k, vals)).ok()) return 1;
  ps::Barrier(ps::kWorkerGroup);
  ps::SArray<float> out = ps::SharedArray<float>(n);
  const float* before = out.data();
  ps::Status st = kv->Wait(kv->ZPull(k, &out));
  if (!st.ok()) {
    std::printf("worker %d pull failed: %s\n", ps::MyRank(),
                st.ToString().c_str());
    return 1;
  }
  const ps::Node* node = ps::DefaultNode();
  std::printf(
      "worker %d shared frames sent %llu received %llu\n", ps::MyRank(),
      static_cast<unsigned long long>(node->num_shared_frames_sent()),
      static_cast<unsigned long long>(node->num_shared_frames_received()));
  return Verdict(out.data(), out.size(), n, out.data() == before);
}

// The peak resident memory of this process (VmHWM), in KiB.
long PeakKb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// "ROLE RANK dropped D refused R peak_kb K", for the hostile test.
void PrintCounters() {
  const ps::Node* node = ps::DefaultNode();
  std::printf("%s %d dropped %llu refused %llu peak_kb %ld\n",
              ps::RoleName(node->role()), ps::MyRank(),
              static_cast<unsigned long long>(node->num_dropped_messages()),
              static_cast<unsigned long long>(node->num_refused_connections()),
              PeakKb());
  std::fflush(stdout);
}

// Waits (bounded) for the file $KV_JOB_GO.
// Mode until-go: pushes of zeros (the sums stay exact) until $KV_JOB_GO
// exists, every 50 ms, at most 6000 times.
bool PushZerosUntilGo(ps::KVWorker<float>* kv, const std::vector<ps::Key>& keys,
                      size_t n) {
  const char* go = std::getenv("KV_JOB_GO");
  const std::vector<float> zeros(n, 0.0f);
  for (int i = 0; go != nullptr && i < 6000; ++i) {
    if (access(go, F_OK) == 0) return true;
    if (!kv->Wait(kv->Push(keys, zeros)).ok()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

void WaitForGo() {
  const char* go = std::getenv("KV_JOB_GO");
  for (int i = 0; go != nullptr && i < 1200; ++i) {
    if (access(go, F_OK) == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// modes cut-member and customers-bsp: a BSP shard of 10 floats in keys 0,
// 1, 2 of 4, 4, 2, each step taking the mean of the workers' gradients.
std::unique_ptr<ps::DenseShard> MakeBspShard(ps::KVServer<float>* server) {
  return std::make_unique<ps::DenseShard>(
      server, ps::DenseLayout{10, 4}, 0, 3, std::vector<float>(10, 0.0f),
      ps::DenseShardOptions{ps::Consistency::kBsp, 0, ps::NumWorkers()},
      [](float* w, const float* g, size_t, size_t len, int n, int, int) {
        for (size_t i = 0; i < len; ++i) w[i] -= g[i] / n;
      });
}

int RunCutMemberServer() {
  ps::KVServer<float> server(0);
  std::unique_ptr<ps::DenseShard> shard = MakeBspShard(&server);
  if (shard->WaitAllDone(std::chrono::minutes(5))) {
    ps::Finalize(0, true);
    return 0;
  }
  std::printf("server %d: %s\n", ps::MyRank(),
              shard->failure().ToString().c_str());
  std::fflush(stdout);
  // As mnist_dist's servers: the workers act on the refusals first (a
  // server leaving now would be the failure the job reports).
  std::this_thread::sleep_for(std::chrono::seconds(30));
  return 1;
}

int RunCutMemberWorker() {
  ps::KVWorker<float> kv(0, 0);
  const int step0 = ps::EncodeDenseCmd(ps::DenseOp::kStep, 0);
  if (ps::MyRank() == 1) {
    ps::Status st =
        kv.Wait(kv.Push({0, 1}, std::vector<float>(8, 1.0f), {4, 4}, step0));
    std::printf("worker 1 pushed a cut of its own: %s\n",
                st.ToString().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::minutes(5));
    return 0;
  }
  std::vector<float> w;
  ps::Status st = kv.Wait(
      kv.Push({0, 1, 2}, std::vector<float>(10, 1.0f), {4, 4, 2}, step0));
  if (st.ok()) {
    st = kv.Wait(kv.Pull({0, 1, 2}, &w, nullptr,
                         ps::EncodeDenseCmd(ps::DenseOp::kStep, 1)));
  }
  std::printf("worker 0 step 0: %s\n", st.ToString().c_str());
  std::fflush(stdout);
  return st.ok() ? 0 : 1;
}

// mode customers-bsp: the weights after step s are -(s + 1) * (W + 1) / 2
// (every step's gradients are the ranks + 1 of the W worker customers,
// averaged).
constexpr int kCustomerSteps = 5;

int RunCustomersBspServer() {
  ps::KVServer<float> server(0);
  std::unique_ptr<ps::DenseShard> shard = MakeBspShard(&server);
  bool done = shard->WaitAllDone(std::chrono::minutes(2));
  std::printf(
      "server %d: %s\n", ps::MyRank(),
      done ? "all worker customers done" : shard->failure().ToString().c_str());
  std::fflush(stdout);
  ps::Finalize(0, true);
  return done ? 0 : 1;
}

// Worker customer c of this process: a worker of the job, with its own
// rank (ps::CustomerNode).
bool RunCustomerBspWorker(int c, const char* argv0) {
  ps::Start(c, argv0);
  const int rank = ps::CustomerNode(c)->rank();
  const float w = static_cast<float>(ps::NumWorkers());
  bool ok = true;
  {
    ps::KVWorker<float> kv(0, c);
    std::vector<float> weights;
    for (int s = 0; s < kCustomerSteps && ok; ++s) {
      ps::Status st = kv.Wait(
          kv.Push({0, 1, 2}, std::vector<float>(10, rank + 1.0f), {4, 4, 2},
                  ps::EncodeDenseCmd(ps::DenseOp::kStep, s)));
      if (st.ok()) {
        st = kv.Wait(kv.Pull({0, 1, 2}, &weights, nullptr,
                             ps::EncodeDenseCmd(ps::DenseOp::kStep, s + 1)));
      }
      const float expect = -(s + 1) * (w + 1) / 2;
      ok = st.ok() && weights == std::vector<float>(10, expect);
      if (!ok) {
        std::printf("worker %d (customer %d) step %d: %s, weight %g, not %g\n",
                    rank, c, s, st.ToString().c_str(),
                    weights.empty() ? 0.0 : weights[0], expect);
      }
    }
    ok =
        ok &&
        kv.Wait(kv.Push({0}, std::vector<float>(4, 0.0f), {4},
                        ps::EncodeDenseCmd(ps::DenseOp::kDone, kCustomerSteps)))
            .ok();
    std::printf("worker %d customer %d step %d weight %g %s\n", rank, c,
                kCustomerSteps, weights.empty() ? 0.0 : weights[0],
                ok ? "ok" : "WRONG");
    std::fflush(stdout);
  }
  ps::Finalize(c, true);
  return ok;
}

int RunCustomersBsp(const char* argv0) {
  if (!ps::IsWorker()) {
    ps::Start(0, argv0);
    if (ps::IsServer()) return RunCustomersBspServer();
    ps::Finalize(0, true);
    return 0;
  }
  bool ok[2] = {false, false};
  std::thread t0([&] { ok[0] = RunCustomerBspWorker(0, argv0); });
  std::thread t1([&] { ok[1] = RunCustomerBspWorker(1, argv0); });
  t0.join();
  t1.join();
  return ok[0] && ok[1] ? 0 : 1;
}

int RunWorker(const std::string& mode) {
  bool varlen = mode == "varlen";
  ps::KVWorker<float> kv(0, 0);
  kv.SetPlacement(MakePlacement(varlen));
  std::vector<ps::Key> keys = Keys();
  std::vector<int> lens = Lens(varlen);
  size_t n = 0;
  for (int len : lens) n += len;
  int rank = ps::MyRank(), w = ps::NumWorkers();
  if (mode == "threads") {
    int bad = 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Thread t owns keys t, t+4, ...: one push of 1 per round.
        std::vector<ps::Key> mine;
        for (int i = t; i < kKeys; i += 4) mine.push_back(keys[i]);
        for (int r = 0; r < 20; ++r) {
          std::vector<float> ones(mine.size() * 4, 1.0f);
          if (!kv.Wait(kv.Push(mine, ones)).ok()) ++bad;
        }
      });
    }
    for (auto& t : threads) t.join();
    ps::Barrier(ps::kWorkerGroup);
    std::vector<float> out;
    if (!kv.Wait(kv.Pull(keys, &out)).ok()) return 1;
    for (float v : out) bad += v != 20.0f * w;
    std::printf("worker %d threads %s\n", rank, bad == 0 ? "ok" : "WRONG");
    return bad == 0 ? 0 : 1;
  }
  if (mode == "shared") return RunSharedWorker(&kv, keys, n);
  if (mode == "hostile") WaitForGo();
  if (mode == "until-go" && !PushZerosUntilGo(&kv, keys, n)) return 1;
  std::vector<float> vals(n);
  for (size_t i = 0; i < n; ++i) vals[i] = (rank + 1.0f) * (i + 1);
  if (!kv.Wait(kv.Push(keys, vals, varlen ? lens : std::vector<int>{})).ok()) {
    return 1;
  }
  if (mode == "kill-worker" && rank == 0) std::raise(SIGKILL);
  if (mode == "exit-worker" && rank == 1) std::exit(1);
  ps::Barrier(ps::kWorkerGroup);
  std::vector<float> out;
  std::vector<int> out_lens;
  ps::Status st = kv.Wait(kv.Pull(keys, &out, &out_lens));
  if (!st.ok()) {
    std::printf("worker %d pull failed: %s\n", rank, st.ToString().c_str());
    return 1;
  }
  return Verdict(out.data(), out.size(), n, out_lens == lens);
}

// This process stops itself (SIGSTOP) for `seconds`; a child of its own
// lets it go on.
void FreezeFor(int seconds) {
  const pid_t me = getpid();
  if (fork() == 0) {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    kill(me, SIGCONT);
    _exit(0);
  }
  std::printf("%s %d freezes\n", ps::RoleName(ps::DefaultNode()->role()),
              ps::MyRank());
  std::fflush(stdout);
  std::raise(SIGSTOP);
}

// freeze-majority (above).
int RunFreezeMajority() {
  if (ps::IsServer()) {
    ps::KVServer<float> server(0);
    ps::KVServerDefaultHandle<float> store;
    // Round 1 is 2 pushes and 2 pulls; the handle runs on one thread.
    int requests = ps::MyRank() < 2 ? 0 : -1000;
    server.set_request_handle([&](const ps::KVMeta& m,
                                  const ps::KVPairs<float>& d,
                                  ps::KVServer<float>* s) {
      if (++requests == 5) FreezeFor(9);
      store(m, d, s);
    });
    ps::Finalize(0, true);
    return 0;
  }
  if (!ps::IsWorker()) {
    ps::Finalize(0, true);
    return 0;
  }
  ps::KVWorker<float> kv(0, 0);
  kv.SetPlacement(MakePlacement(false));
  const std::vector<ps::Key> keys = Keys();
  std::vector<float> vals(4 * keys.size()), out;  // 4 a key (Lens)
  for (size_t i = 0; i < vals.size(); ++i) {
    vals[i] = (ps::MyRank() + 1.0f) * (i + 1);
  }
  for (int round = 1; round <= 2; ++round) {
    if (round == 2 && ps::MyRank() == 0) FreezeFor(9);
    ps::Status st = kv.Wait(kv.Push(keys, vals));
    if (st.ok()) {
      ps::Barrier(ps::kWorkerGroup);
      st = kv.Wait(kv.Pull(keys, &out));
    }
    if (!st.ok()) {
      std::printf("worker %d round %d failed: %s\n", ps::MyRank(), round,
                  st.ToString().c_str());
      std::fflush(stdout);
      return 1;
    }
    if (Verdict(out.data(), out.size(), vals.size(), true, round) != 0) {
      return 1;
    }
    ps::Barrier(ps::kWorkerGroup);
  }
  ps::Finalize(0, true);
  return 0;
}

// fenced-worker (above). Every node goes on without the dead worker, and
// only the scheduler and the server wait for each other at the end.
int RunFencedWorker() {
  ps::Node* node = ps::DefaultNode();
  node->SetPeerFailureHandler([node](int, const ps::Status& why) {
    std::printf("%s goes on: %s\n", node->DescribeNode(node->id()).c_str(),
                why.message().c_str());
    std::fflush(stdout);
  });
  if (ps::IsServer()) {
    ps::KVServer<float> server(0);
    ps::KVServerDefaultHandle<float> store;
    server.set_request_handle(
        [&store](const ps::KVMeta& m, const ps::KVPairs<float>& d,
                 ps::KVServer<float>* s) { store(m, d, s); });
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    // Fenced, not merely dropped: a push that found a gap in the sealed
    // stream is dropped too, and the sender sends it again in a new session.
    while (node->num_fenced_messages() == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ps::Barrier(0, ps::kScheduler | ps::kServerGroup);
    ps::Finalize(0, false);
    double sum = 0;
    for (auto& [key, v] : store.store) {
      for (float x : v) sum += x;
    }
    std::printf("server %d fenced %llu, holds %zu keys sum %.0f\n",
                ps::MyRank(),
                static_cast<unsigned long long>(node->num_fenced_messages()),
                store.store.size(), sum);
    return 0;
  }
  if (!ps::IsWorker()) {
    ps::Barrier(0, ps::kScheduler | ps::kServerGroup);
    ps::Finalize(0, false);
    return 0;
  }
  ps::KVWorker<float> kv(0, 0);
  kv.SetPlacement(MakePlacement(false));
  const std::vector<ps::Key> keys = Keys();
  const int rank = ps::MyRank();
  std::vector<float> vals(keys.size());
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = (rank + 1.0f) * (i + 1);
  if (!kv.Wait(kv.Push(keys, vals)).ok()) return 1;
  ps::Barrier(ps::kWorkerGroup);
  if (rank == 1) {
    const pid_t me = getpid();
    if (fork() == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(6));
      kill(me, SIGCONT);
      _exit(0);
    }
    std::printf("worker 1 freezes\n");
    std::fflush(stdout);
    std::raise(SIGSTOP);
    for (float& v : vals) v *= 1000;
    kv.Push(keys, vals);  // never answered: the server drops it
    std::printf("worker 1 pushed again, let go on\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(3);
  }
  std::vector<float> out;
  ps::Status st = kv.Wait(kv.Pull(keys, &out));
  const int rc =
      st.ok() ? Verdict(out.data(), out.size(), keys.size(), true) : 1;
  ps::Finalize(0, false);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::string mode = argc > 1 ? argv[1] : "sum";
  const char* env_rank = std::getenv("PS_RANK");
  const char* env_role = std::getenv("DMLC_ROLE");
  if (mode == "odd-shape" && env_rank != nullptr && env_role != nullptr &&
      std::string(env_role) == "worker" && std::string(env_rank) == "1") {
    const char* w = std::getenv("DMLC_NUM_WORKER");
    setenv("DMLC_NUM_WORKER", std::to_string(std::atoi(w) + 1).c_str(), 1);
  }
  if (mode == "customers-bsp") return RunCustomersBsp(argv[0]);
  ps::Start(0, argv[0]);
  if (mode == "hostile") {
    std::printf("%s %d port %d\n", ps::RoleName(ps::DefaultNode()->role()),
                ps::MyRank(), ps::DefaultNode()->port());
    std::fflush(stdout);
  }
  if (mode == "fenced-worker") return RunFencedWorker();
  if (mode == "freeze-majority") return RunFreezeMajority();
  if (mode == "cut-member") {
    if (ps::IsServer()) return RunCutMemberServer();
    if (ps::IsWorker()) return RunCutMemberWorker();
    ps::Finalize(0, true);
    return 0;
  }
  int rc = 0;
  if (ps::IsServer()) {
    ps::KVServer<float> server(0);
    ps::KVServerDefaultHandle<float> store;
    bool suicide = mode == "kill-server" && ps::MyRank() == 0;
    bool freeze = mode == "freeze-server" && ps::MyRank() == 0;
    bool quit = mode == "exit-server" && ps::MyRank() == 0;
    server.set_request_handle([&](const ps::KVMeta& m,
                                  const ps::KVPairs<float>& d,
                                  ps::KVServer<float>* s) {
      if (suicide) std::raise(SIGKILL);
      if (freeze) std::raise(SIGSTOP);
      if (quit) std::exit(3);  // on the receive thread
      store(m, d, s);
    });
    if (mode == "hostile") {
      // Every message of a flood read before Finalize stops the receive
      // thread: wait until no drop came for a second (at most 60 s).
      auto now = std::chrono::steady_clock::now;
      const auto deadline = now() + std::chrono::seconds(60);
      uint64_t seen = ps::DefaultNode()->num_dropped_messages();
      auto quiet_since = now();
      while (now() < deadline &&
             now() - quiet_since < std::chrono::seconds(1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        uint64_t dropped = ps::DefaultNode()->num_dropped_messages();
        if (dropped != seen) {
          seen = dropped;
          quiet_since = now();
        }
      }
    }
    ps::Finalize(0, true);
    if (mode == "hostile") PrintCounters();
    double sum = 0;
    for (auto& [key, v] : store.store) {
      for (float x : v) sum += x;
    }
    std::printf("server %d holds %zu keys sum %.0f\n", ps::MyRank(),
                store.store.size(), sum);
    return 0;
  }
  if (ps::IsWorker()) rc = RunWorker(mode);
  if (rc == 0) ps::Finalize(0, true);
  if (mode == "hostile" && !ps::IsServer()) PrintCounters();
  return rc;
}
