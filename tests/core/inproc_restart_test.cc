// In-process multi-node tests of lost messages and restarts (resend,
// rejoin, scheduler takeover): scheduler + servers + workers as threads.
// The rest of the in-process suite is inproc_test.cc.
#include <gtest/gtest.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "cluster.h"
#include "postoffice/postoffice.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "ps/shared_array.h"

namespace ps {
namespace {

// A fifth of all KV messages lost at random (PS_DROP_MSG), resent every
// 20 ms (a fixed timer, as PS_RESEND_TIMEOUT_MS=20 sets): every push is applied
// exactly once (the sums are exact), every push+pull answers with the running
// sum it asked for, and nothing is left waiting.
TEST(InProc, LostMessagesAreResentAndAppliedOnce) {
  const int kS = 2, kW = 2, kRounds = 40;
  DefaultJob c(kS, kW, [](Config* cfg) {
    cfg->drop_percent = 20;
    cfg->resend_timeout_ms = 20;
    cfg->resend_adaptive = false;
  });
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3, 40000};  // one per server
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    for (int i = 1; i <= kRounds; ++i) {
      std::vector<float> vals = {float(i), float(n->rank() + 1)};
      PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, vals)));
    }
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    std::vector<float> out;
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out)));
    // Key 3: each worker pushed 1..kRounds; key 40000: rank + 1, kRounds
    // times per worker.
    const float want0 = kW * kRounds * (kRounds + 1) / 2;
    const float want1 = kRounds * (kW * (kW + 1) / 2);
    if (out != std::vector<float>{want0, want1}) {
      return Status::Internal(
          "pulled " + std::to_string(out[0]) + ", " + std::to_string(out[1]) +
          "; want " + std::to_string(want0) + ", " + std::to_string(want1));
    }
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    // PushPull: the answer holds this push (each worker adds 0 to key 3 and
    // 1 to key 40000 in turn, so the sum seen only grows).
    for (int i = 0; i < 10; ++i) {
      std::vector<float> got;
      PS_RETURN_IF_ERROR(
          kv.Wait(kv.PushPull(keys, std::vector<float>{0, 1}, &got)));
      if (got.size() != 2 || got[0] != want0 || got[1] <= want1) {
        return Status::Internal("push+pull answered a wrong sum");
      }
    }
    if (kv.num_pending() != 0) return Status::Internal("requests left");
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  const float want1 = kRounds * (kW * (kW + 1) / 2) + kW * 10;
  EXPECT_EQ(c.StoreOf(1).at(40000), std::vector<float>{want1});
  uint64_t drops = 0, resent = 0;
  for (Node* n : c.All()) {
    drops += n->num_test_drops();
    resent += n->num_resent_messages();
  }
  // About 2 x (2 x 40 + 2 + 2 x 10) x 2 = 400 messages: 20% is ~80.
  EXPECT_GT(drops, 0u);
  EXPECT_GE(resent, drops) << "every loss was made good by a resend";
  EXPECT_TRUE(c.Finalize());
}

// The default resend timer follows the measured round trip: a tenth of
// all KV messages (and acknowledgements) lost, nothing tuned, and every
// push is applied once; each worker's timer toward each server (and each
// server's toward each worker) came down from the initial 1000 ms, so a
// loss costs about a round trip (at 1000 ms a loss, the ~150 losses would
// outlast the suite's timeout).
TEST(InProc, LostMessagesAreResentAfterTheMeasuredRoundTrip) {
  const int kS = 2, kW = 2, kRounds = 200;
  DefaultJob c(kS, kW, [](Config* cfg) { cfg->drop_percent = 10; });
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3, 40000};  // one per server
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    std::vector<float> out;
    for (int i = 1; i <= kRounds; ++i) {
      std::vector<float> vals = {1, float(i)};
      PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, vals)));
      PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out)));
    }
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out)));
    const float want0 = kW * kRounds, want1 = kW * kRounds * (kRounds + 1) / 2;
    if (out != std::vector<float>{want0, want1}) {
      return Status::Internal("pulled " + std::to_string(out[0]) + ", " +
                              std::to_string(out[1]));
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  uint64_t drops = 0, resent = 0;
  for (Node* n : c.All()) {
    drops += n->num_test_drops();
    resent += n->num_resent_messages();
    if (n->role() == Role::kScheduler) continue;
    const Resender* r = n->postoffice()->resender();
    ASSERT_NE(r, nullptr) << "the default timer is the adaptive one";
    const int peers = n->role() == Role::kWorker ? kS : kW;
    for (int rank = 0; rank < peers; ++rank) {
      const int peer = n->role() == Role::kWorker ? ServerRankToId(rank)
                                                  : WorkerRankToId(rank);
      EXPECT_LT(r->RtoMs(peer), 1000) << DescribeId(n->id()) << " to " << peer;
    }
  }
  EXPECT_GT(drops, 0u);
  EXPECT_GT(resent, 0u);
  EXPECT_TRUE(c.Finalize());
}

// A server that loses a fifth of what it receives (PS_DROP_MSG=20 on it
// alone) misses acknowledgements of its answers and resends them; some of
// those copies reach the worker after the KVWorker that asked is gone (20
// in turn, each a customer of its own, each for 5 rounds). They are
// duplicates, let go, never counted as dropped messages (which are what
// strangers and malformed messages count).
TEST(InProc, ResentAnswerAfterItsCustomerIsGoneIsADuplicate) {
  DefaultJob c(1, 1);
  Config lossy = c.servers[0]->config();
  lossy.drop_percent = 20;
  c.servers[0] = std::make_unique<Node>(lossy);
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3};
  int pushed = 0;
  for (int customer = 0; customer < 20; ++customer) {
    KVWorker<float> kv(c.workers[0].get(), 0, customer);
    std::vector<float> out;
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(kv.Wait(kv.Push(keys, std::vector<float>{1})).ok());
      ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
      ASSERT_EQ(out, std::vector<float>{float(++pushed)});
    }
  }
  // Until the server keeps no answer (every copy acknowledged): 10 s at
  // most, at most 8 copies of each.
  const Resender* r = c.servers[0]->postoffice()->resender();
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 200 && r->num_kept() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(r->num_kept(), 0u);
  EXPECT_GT(c.servers[0]->num_resent_messages(), 0u);
  EXPECT_GT(c.workers[0]->num_duplicate_messages(), 0u);
  EXPECT_EQ(c.workers[0]->num_dropped_messages(), 0u);
  EXPECT_TRUE(c.Finalize());
}

// The first peer failure node `n` learns of, polled for at most 10 s (OK if
// none came).
Status FirstPeerFailure(Node* n) {
  Status failure;
  for (int i = 0; i < 100 && failure.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    failure = n->peer_failure();
  }
  return failure;
}

// PS_MAX_RESTARTS: a worker that dies (abandoned, as a crash) is awaited,
// not a failure; a new node with its rank rejoins the running job under its
// id, and the job goes on with exact sums: the servers kept what the dead
// process pushed, and the new one's pushes count once.
TEST(InProc, RestartedWorkerRejoinsUnderItsRank) {
  const int kS = 2, kW = 2;
  auto restarts = [](Config* cfg) { cfg->max_restarts = 1; };
  DefaultJob c(kS, kW, restarts);
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3, 40000};  // one per server
  for (auto& w : c.workers) {
    KVWorker<float> kv(w.get(), 0, 0);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {1, float(w->rank() + 1)})).ok());
  }
  Node* victim = c.workers[1].get();
  const int rank = victim->rank(), id = victim->id();
  victim->postoffice()->Abandon();  // gone without a word, like a crash
  // Its successor registers at once: the scheduler holds it until the dead
  // process's connection is found closed.
  Config cfg = TestConfig(Role::kWorker, kS, kW);
  cfg.root_port = c.scheduler->port();
  cfg.rank = rank;
  restarts(&cfg);
  auto successor = std::make_unique<Node>(cfg);
  ASSERT_TRUE(successor->Start().ok());
  EXPECT_TRUE(successor->rejoined());
  EXPECT_EQ(successor->rank(), rank);
  EXPECT_EQ(successor->id(), id);
  c.workers[1] = std::move(successor);
  {
    KVWorker<float> kv(c.workers[1].get(), 0, 0);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {10, 100})).ok());
    std::vector<float> out;
    ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
    // Both first pushes (the dead process's too) and the new one.
    EXPECT_EQ(out, (std::vector<float>{1 + 1 + 10, 1 + 2 + 100}));
  }
  // Nobody took the death for a failure, and the successor is in every
  // barrier (the others passed the start barrier long ago; it did not wait
  // at it).
  for (Node* n : c.All())
    EXPECT_TRUE(n->peer_failure().ok()) << n->peer_failure();
  EXPECT_FALSE(c.workers[0]->rejoined());
  EXPECT_TRUE(c.Finalize());
}

// The successor of a worker that is still alive is refused once the
// scheduler has waited long enough for the death, naming the live one.
TEST(InProc, RestartOfALiveWorkerIsRefused) {
  auto tweak = [](Config* cfg) {
    cfg->max_restarts = 1;
    cfg->connect_timeout_ms = 1500;
    cfg->heartbeat_timeout_ms = 300;
  };
  DefaultJob c(1, 2, tweak);
  ASSERT_TRUE(c.Start());
  Config cfg = TestConfig(Role::kWorker, 1, 2);
  cfg.root_port = c.scheduler->port();
  cfg.rank = c.workers[0]->rank();
  tweak(&cfg);
  cfg.rendezvous_timeout_ms = 20000;
  Node impostor(cfg);
  Status st = impostor.Start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("still alive"), std::string::npos) << st;
  EXPECT_NE(st.message().find("worker " + std::to_string(cfg.rank)),
            std::string::npos)
      << st;
  // A server never rejoins.
  Config server = TestConfig(Role::kServer, 1, 2);
  server.root_port = c.scheduler->port();
  tweak(&server);
  Node late_server(server);
  st = late_server.Start();
  EXPECT_NE(st.message().find("only restarted workers rejoin"),
            std::string::npos)
      << st;
  for (Node* n : c.All()) EXPECT_TRUE(n->peer_failure().ok());
  EXPECT_TRUE(c.Finalize());
}

// Without PS_MAX_RESTARTS a late worker is refused, and says how restarts
// are turned on; with it, a worker that does not come back within
// PS_REJOIN_TIMEOUT_MS fails the job, named with that reason.
TEST(InProc, AWorkerThatDoesNotRejoinInTimeFailsTheJob) {
  {
    DefaultJob c(1, 1);
    ASSERT_TRUE(c.Start());
    Config cfg = TestConfig(Role::kWorker, 1, 1);
    cfg.root_port = c.scheduler->port();
    Node late(cfg);
    Status st = late.Start();
    EXPECT_NE(st.message().find("PS_MAX_RESTARTS"), std::string::npos) << st;
    EXPECT_TRUE(c.Finalize());
  }
  DefaultJob c(1, 2, [](Config* cfg) {
    cfg->max_restarts = 1;
    cfg->rejoin_timeout_ms = 800;
  });
  ASSERT_TRUE(c.Start());
  const int rank = c.workers[1]->rank();
  c.workers[1]->postoffice()->Abandon();
  // The barrier waits for the awaited worker, then fails naming it.
  Status st = c.workers[0]->Barrier(kWorkerGroup);
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_NE(st.message().find("worker " + std::to_string(rank)),
            std::string::npos)
      << st;
  Status failure = FirstPeerFailure(c.servers[0].get());
  EXPECT_NE(failure.message().find("did not rejoin within 800 ms"),
            std::string::npos)
      << failure;
}

// PS_MAX_RESTARTS: the scheduler dies (abandoned, as a crash). The data
// path goes on without it, and a barrier entered meanwhile waits; a new
// scheduler on the same address takes the job over from the members'
// reports (the barrier completes, sent to it again), and the job ends
// cleanly with exact sums.
TEST(InProc, RestartedSchedulerTakesTheJobOver) {
  const int kS = 2, kW = 2;
  auto restarts = [](Config* cfg) { cfg->max_restarts = 1; };
  DefaultJob c(kS, kW, restarts);
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3, 40000};  // one per server
  const int port = c.scheduler->port();
  c.scheduler->postoffice()->Abandon();
  // Found dead through its connection; the members wait for it.
  for (auto& w : c.workers) {
    KVWorker<float> kv(w.get(), 0, 0);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {1, float(w->rank() + 1)})).ok());
  }
  std::vector<Status> barrier(kW);
  std::vector<std::thread> waiting;
  for (int i = 0; i < kW; ++i) {
    waiting.emplace_back(
        [&, i] { barrier[i] = c.workers[i]->Barrier(kWorkerGroup); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Config cfg = TestConfig(Role::kScheduler, kS, kW);
  cfg.port = port;
  restarts(&cfg);
  auto successor = std::make_unique<Node>(cfg);
  ASSERT_TRUE(successor->Start().ok());
  EXPECT_TRUE(successor->rejoined());
  c.scheduler = std::move(successor);
  for (auto& t : waiting) t.join();
  for (const Status& st : barrier) EXPECT_TRUE(st.ok()) << st;
  {
    KVWorker<float> kv(c.workers[0].get(), 0, 0);
    std::vector<float> out;
    ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
    EXPECT_EQ(out, (std::vector<float>{2, 1 + 2}));
  }
  for (Node* n : c.All())
    EXPECT_TRUE(n->peer_failure().ok()) << n->peer_failure();
  EXPECT_TRUE(c.Finalize());
}

// A scheduler that is not back within PS_REJOIN_TIMEOUT_MS: each member
// names it, with that reason.
TEST(InProc, ASchedulerThatDoesNotComeBackIsNamed) {
  DefaultJob c(1, 1, [](Config* cfg) {
    cfg->max_restarts = 1;
    cfg->rejoin_timeout_ms = 600;
  });
  ASSERT_TRUE(c.Start());
  c.scheduler->postoffice()->Abandon();
  for (Node* n : {c.servers[0].get(), c.workers[0].get()}) {
    Status failure = FirstPeerFailure(n);
    EXPECT_NE(failure.message().find("scheduler"), std::string::npos)
        << failure;
    EXPECT_NE(failure.message().find("did not rejoin within 600 ms"),
              std::string::npos)
        << failure;
  }
}

// PS_REPLICAS=1: a KVWorker made after a server died and its replica took
// its keys over sends them to the replica from its first request (as does a
// worker that rejoins the job then).
TEST(InProc, WorkerMadeAfterAFailoverGoesToTheReplica) {
  Cluster c(2, 1, [](Config* cfg) {
    cfg->replicas = 1;
    cfg->resend_timeout_ms = 100;
  });
  ASSERT_TRUE(c.Start());
  KVServerDefaultHandle<float> own[2], held[2];
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<KVServer<float>>(c.servers[i].get(), 0));
    auto* h = &held[i];
    servers[i]->set_replica_handle([h](const KVMeta& m, const KVPairs<float>& d,
                                       KVServer<float>* s) { (*h)(m, d, s); });
    auto* o = &own[i];
    servers[i]->set_request_handle([o](const KVMeta& m, const KVPairs<float>& d,
                                       KVServer<float>* s) { (*o)(m, d, s); });
  }
  const std::vector<Key> keys = {3, 40000};  // one per server
  {
    KVWorker<float> kv(c.workers[0].get(), 0, 0);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {1, 2})).ok());
  }
  int victim = -1;
  for (int i = 0; i < 2; ++i) {
    if (c.servers[i]->rank() == 1) victim = i;
  }
  ASSERT_GE(victim, 0);
  const int dead_id = c.servers[victim]->id();
  c.servers[victim]->postoffice()->Abandon();
  for (int i = 0; i < 100 && !c.workers[0]->postoffice()->TakenOver(dead_id);
       ++i) {  // at most 10 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(c.workers[0]->postoffice()->TakenOver(dead_id));
  KVWorker<float> late(c.workers[0].get(), 0, 1);
  ASSERT_TRUE(late.Wait(late.Push(keys, {10, 20})).ok());
  std::vector<float> out;
  Status st = late.Wait(late.Pull(keys, &out));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(out, (std::vector<float>{11, 22}));
  EXPECT_TRUE(c.workers[0]->peer_failure().ok());
  servers[victim].reset();
  servers[1 - victim].reset();
}

// Two workers die and their successors register at once: each rejoin waits
// for no answer from the other successor (which gets the new address in
// its own table), so both complete, and the sums are exact.
TEST(InProc, TwoWorkersRestartedAtOnceBothRejoin) {
  const int kS = 1, kW = 3;
  auto restarts = [](Config* cfg) { cfg->max_restarts = 1; };
  DefaultJob c(kS, kW, restarts);
  ASSERT_TRUE(c.Start());
  const std::vector<Key> keys = {3};
  for (auto& w : c.workers) {
    KVWorker<float> kv(w.get(), 0, 0);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {1})).ok());
  }
  std::vector<std::unique_ptr<Node>> successors(2);
  std::vector<Status> started(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    Node* victim = c.workers[i + 1].get();
    Config cfg = TestConfig(Role::kWorker, kS, kW);
    cfg.root_port = c.scheduler->port();
    cfg.rank = victim->rank();
    restarts(&cfg);
    victim->postoffice()->Abandon();
    successors[i] = std::make_unique<Node>(cfg);
  }
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { started[i] = successors[i]->Start(); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(started[i].ok()) << started[i];
    EXPECT_TRUE(successors[i]->rejoined());
    c.workers[i + 1] = std::move(successors[i]);
  }
  for (auto& w : c.workers) {
    KVWorker<float> kv(w.get(), 0, 1);
    ASSERT_TRUE(kv.Wait(kv.Push(keys, {10})).ok());
  }
  std::vector<float> out;
  KVWorker<float> kv(c.workers[2].get(), 0, 2);
  ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
  EXPECT_EQ(out, std::vector<float>{3 + 30});
  for (Node* n : c.All())
    EXPECT_TRUE(n->peer_failure().ok()) << n->peer_failure();
  EXPECT_TRUE(c.Finalize());
}

}  // namespace
}  // namespace ps
