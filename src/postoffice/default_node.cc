// The ps.h convenience layer: one default node per process, made from the
// environment on first use and started by the first customer's ps::Start.
// This is the program's edge: errors end the process with a message naming
// the variable, address or node at fault.
#include <glog/logging.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "postoffice/logging.h"
#include "ps/ps.h"

namespace ps {

namespace {

// The default node of this process and its customers (the convenience layer
// only; the core never reaches for it). As in ps-lite, every worker customer
// that ps::Start starts is a worker of the job (DMLC_NUM_WORKER counts them):
// the first uses the default node, each later one a node of its own, made
// from the same configuration. Servers' and the scheduler's customers share
// the default node.
struct DefaultState {
  std::mutex node_mu;  // guards `node` creation
  std::unique_ptr<Node> node;
  std::mutex start_mu;  // guards the rest; never held through a rendezvous
  std::map<int, Node*> node_of;                    // started customers' nodes
  std::map<int, std::unique_ptr<Node>> own_nodes;  // worker customers' own
  std::set<Node*> starting;  // Start (and its barrier) under way
  std::set<Node*> started;   // ... done
  std::set<int> finalized;   // customers with a node of their own
  bool stopping = false;     // the default node's Finalize began
  std::set<int> sharing;     // started on the default node, not finalized
  bool customer0_started = false;
  std::condition_variable changed;  // a start or a Finalize ended
  std::function<void()> exit_callback;
};

// Destroyed at exit, after main returns or std::exit: the nodes' destructors
// stop them, which tells the scheduler they leave (a failure unless Finalize
// ran first) and gives queued messages PS's linger time to leave.
DefaultState& State() {
  static DefaultState state;
  return state;
}

[[noreturn]] void Die(const std::string& what) {
  Tell(google::GLOG_ERROR, what);
  google::FlushLogFiles(google::GLOG_INFO);
  std::fflush(stderr);
  // _Exit: other threads of this process are still running; static
  // destructors must not run under them.
  std::_Exit(1);
}

// The node of a worker customer started after the process's first: the
// default node's configuration, with any port and rank the scheduler gives
// (the launcher's PS_RANK and a fixed port are the first node's).
std::unique_ptr<Node> MakeCustomerNode(const Node& first, int customer_id) {
  Config config = first.config();
  if (config.max_restarts > 0) {
    Die("ps::Start(" + std::to_string(customer_id) +
        "): a worker process with several worker customers cannot be "
        "restarted (PS_MAX_RESTARTS=" +
        std::to_string(config.max_restarts) +
        "): its customers are workers of their own, and a restarted "
        "process would not find its ranks again");
  }
  config.rank = -1;
  config.port = 0;
  return std::make_unique<Node>(config);
}

void StartDefault(int customer_id, const char* argv0, bool do_barrier) {
  DefaultState& state = State();
  Node* first = DefaultNode();
  Node* node = nullptr;
  {
    std::unique_lock<std::mutex> lock(state.start_mu);
    const std::string start = "ps::Start(" + std::to_string(customer_id) + ")";
    if (state.stopping) {
      Die(start +
          " after the node was finalized (its last customer called "
          "ps::Finalize)");
    }
    if (state.finalized.count(customer_id) > 0) {
      Die(start + " after ps::Finalize(" + std::to_string(customer_id) + ")");
    }
    auto it = state.node_of.find(customer_id);
    if (it != state.node_of.end()) {
      node = it->second;  // started already, or being started
    } else if (first->role() == Role::kWorker && !state.node_of.empty()) {
      auto& own = state.own_nodes[customer_id];
      own = MakeCustomerNode(*first, customer_id);
      node = own.get();
    } else {
      node = first;
      state.sharing.insert(customer_id);
      if (customer_id == 0) state.customer0_started = true;
    }
    state.node_of[customer_id] = node;
    if (state.starting.count(node) > 0 || state.started.count(node) > 0) {
      // Another thread starts it (a customer sharing the default node, or
      // this customer's own Start again): wait until it is done.
      state.changed.wait(
          lock, [&state, node] { return state.started.count(node) > 0; });
      return;
    }
    state.starting.insert(node);
    if (argv0 != nullptr && !google::IsGoogleLoggingInitialized()) {
      google::InitGoogleLogging(argv0);
    }
  }
  node->SetPeerFailureHandler([node](const Status& why) {
    Die(node->DescribeNode(node->id()) + " stops: " + why.message());
  });
  Status st = node->Start();
  if (!st.ok()) {
    Die(std::string(RoleName(node->role())) +
        " failed to start: " + st.ToString());
  }
  // A restarted worker rejoins a job that passed this barrier long ago.
  if (do_barrier && !node->rejoined()) {
    Status barrier = node->Barrier(kAllGroups);
    if (!barrier.ok()) Die(barrier.ToString());
  }
  std::lock_guard<std::mutex> lock(state.start_mu);
  state.starting.erase(node);
  state.started.insert(node);
  state.changed.notify_all();
}

}  // namespace

Node* DefaultNode() {
  DefaultState& state = State();
  std::lock_guard<std::mutex> lock(state.node_mu);
  if (state.node == nullptr) {
    std::map<std::string, std::string> env = Config::ProcessVariables();
    for (const auto& [name, value] : Environment::Get()->vars()) {
      if (name.rfind("DMLC_", 0) == 0 || name.rfind("PS_", 0) == 0) {
        env[name] = value;
      }
    }
    StatusOr<Config> config = Config::FromEnvAndFlags(env);
    if (!config.ok()) Die("bad configuration: " + config.status().message());
    state.node = std::make_unique<Node>(*config);
  }
  return state.node.get();
}

void Start(int customer_id, const char* argv0) {
  StartDefault(customer_id, argv0, true);
}
void Start(const char* argv0) { Start(0, argv0); }
void Finalize() { Finalize(0, true); }
void StartAsync(int customer_id, const char* argv0) {
  StartDefault(customer_id, argv0, false);
}

void Finalize(int customer_id, bool do_barrier) {
  DefaultState& state = State();
  Node* first = DefaultNode();
  Node* node = first;
  std::function<void()> exit_callback;
  {
    std::unique_lock<std::mutex> lock(state.start_mu);
    auto it = state.node_of.find(customer_id);
    if (it != state.node_of.end()) node = it->second;
    if (node == first) {
      state.sharing.erase(customer_id);
      state.changed.notify_all();
      // As in ps-lite, customer 0 stops the node (when it never started,
      // the last customer does), once every other customer that started on
      // it is done.
      bool owner = customer_id == 0 || !state.customer0_started;
      if (state.stopping || !owner ||
          (customer_id != 0 && !state.sharing.empty())) {
        return;
      }
      auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(first->config().barrier_timeout_ms);
      if (!state.changed.wait_until(
              lock, deadline, [&state] { return state.sharing.empty(); })) {
        std::string left;
        for (int c : state.sharing) left += " " + std::to_string(c);
        Die("ps::Finalize(0): customers" + left +
            " of this process did not finalize within " +
            std::to_string(first->config().barrier_timeout_ms) +
            " ms (PS_BARRIER_TIMEOUT_MS)");
      }
      state.stopping = true;
    } else {
      // A worker customer's own node: it stops it (once).
      if (!state.finalized.insert(customer_id).second) return;
    }
  }
  // No lock held: the barrier waits for the process's other customers too.
  Status st = node->Finalize(do_barrier);
  if (!st.ok()) Die("Finalize failed: " + st.ToString());
  if (node != first) return;
  {
    std::lock_guard<std::mutex> lock(state.start_mu);
    exit_callback = std::move(state.exit_callback);
  }
  // The nodes stay (stopped) until exit: KVWorker/KVServer objects that
  // outlive this call, or that the exit callback deletes, still unregister
  // from them.
  if (exit_callback) exit_callback();
}

void RegisterExitCallback(const std::function<void()>& cb) {
  DefaultState& state = State();
  std::lock_guard<std::mutex> lock(state.start_mu);
  state.exit_callback = cb;
}

int NumWorkers() { return DefaultNode()->num_workers(); }
int NumServers() { return DefaultNode()->num_servers(); }
int MyRank() { return DefaultNode()->rank(); }
bool IsWorker() { return DefaultNode()->role() == Role::kWorker; }
bool IsServer() { return DefaultNode()->role() == Role::kServer; }
bool IsScheduler() { return DefaultNode()->role() == Role::kScheduler; }

Node* CustomerNode(int customer_id) {
  DefaultState& state = State();
  Node* first = DefaultNode();
  std::lock_guard<std::mutex> lock(state.start_mu);
  auto it = state.node_of.find(customer_id);
  return it == state.node_of.end() ? first : it->second;
}

void Barrier(int customer_id, int group) {
  Status st = CustomerNode(customer_id)->Barrier(group);
  if (!st.ok()) Die(st.ToString());
}
void Barrier(int group) {
  Status st = DefaultNode()->Barrier(group);
  if (!st.ok()) Die(st.ToString());
}

}  // namespace ps
