// A whole ps job inside one test process: a scheduler, S servers and W
// workers as Node objects on 127.0.0.1 with ephemeral ports.
#ifndef PS_TESTS_CORE_CLUSTER_H_
#define PS_TESTS_CORE_CLUSTER_H_

#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gtest/gtest.h"
#include "ps/kv_app.h"
#include "ps/node.h"

namespace ps {

// Short timeouts so that failure tests end in seconds.
inline Config TestConfig(Role role, int num_servers, int num_workers) {
  Config c;
  c.role = role;
  c.num_servers = num_servers;
  c.num_workers = num_workers;
  c.connect_timeout_ms = 5000;
  c.rendezvous_timeout_ms = 10000;
  c.barrier_timeout_ms = 10000;
  c.heartbeat_interval_ms = 100;
  // These tests spread small keys over the servers (the default, ps-lite's
  // split of the whole key space, would put them all on server 0).
  c.max_key = 65536;
  c.heartbeat_timeout_ms = 3000;
  c.request_timeout_ms = 20000;
  return c;
}

struct Cluster {
  Cluster(int num_servers, int num_workers,
          const std::function<void(Config*)>& tweak = nullptr) {
    Config sc = TestConfig(Role::kScheduler, num_servers, num_workers);
    if (tweak) tweak(&sc);
    scheduler = std::make_unique<Node>(sc);
    bind_status = scheduler->Bind();
    for (int i = 0; i < num_servers + num_workers; ++i) {
      Config c = TestConfig(i < num_servers ? Role::kServer : Role::kWorker,
                            num_servers, num_workers);
      c.root_port = scheduler->port();
      if (tweak) tweak(&c);
      (i < num_servers ? servers : workers)
          .push_back(std::make_unique<Node>(c));
    }
  }

  std::vector<Node*> All() {
    std::vector<Node*> all{scheduler.get()};
    for (auto& s : servers) all.push_back(s.get());
    for (auto& w : workers) all.push_back(w.get());
    return all;
  }

  // Runs fn(node) for every node on its own thread; returns the statuses
  // (scheduler first, then servers, then workers).
  std::vector<Status> RunAll(const std::function<Status(Node*)>& fn) {
    std::vector<Node*> all = All();
    std::vector<Status> st(all.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < all.size(); ++i) {
      threads.emplace_back([&, i] { st[i] = fn(all[i]); });
    }
    for (auto& t : threads) t.join();
    return st;
  }

  // Starts every node; true when all succeeded.
  bool Start() {
    if (!bind_status.ok()) return false;
    bool ok = true;
    for (const Status& s : RunAll([](Node* n) { return n->Start(); })) {
      ok = ok && s.ok();
    }
    return ok;
  }

  bool Finalize() {
    bool ok = true;
    for (const Status& s : RunAll([](Node* n) { return n->Finalize(); })) {
      ok = ok && s.ok();
    }
    return ok;
  }

  Status bind_status;
  std::unique_ptr<Node> scheduler;
  std::vector<std::unique_ptr<Node>> servers;
  std::vector<std::unique_ptr<Node>> workers;
};

// A cluster whose servers answer with KVServerDefaultHandle<float> (app 0)
// once started, as most in-process tests want.
struct DefaultJob : Cluster {
  using Cluster::Cluster;
  // Starts the nodes, then the servers' handles.
  bool Start() {
    if (!Cluster::Start()) return false;
    handles.resize(servers.size());
    for (size_t i = 0; i < servers.size(); ++i) {
      kv_servers.push_back(
          std::make_unique<KVServer<float>>(servers[i].get(), 0));
      if (before_handle) before_handle(kv_servers.back().get());
      auto* handle = &handles[i];
      kv_servers.back()->set_request_handle(
          [handle](const KVMeta& m, const KVPairs<float>& d,
                   KVServer<float>* s) { (*handle)(m, d, s); });
    }
    return true;
  }
  // The store of the server of rank r.
  const std::unordered_map<Key, std::vector<float>>& StoreOf(int rank) {
    for (size_t i = 0; i < servers.size(); ++i) {
      if (servers[i]->rank() == rank) return handles[i].store;
    }
    ADD_FAILURE() << "no server of rank " << rank;
    return handles[0].store;
  }

  // Runs on each KVServer before its handle is set (e.g. AddFilter).
  std::function<void(KVServer<float>*)> before_handle;
  std::vector<KVServerDefaultHandle<float>> handles;  // by server index
  std::vector<std::unique_ptr<KVServer<float>>> kv_servers;
};

}  // namespace ps

#endif  // PS_TESTS_CORE_CLUSTER_H_
