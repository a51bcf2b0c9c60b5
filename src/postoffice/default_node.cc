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
// only; the core never reaches for it).
struct DefaultState {
  std::mutex node_mu;  // guards `node` creation
  std::unique_ptr<Node> node;
  // Held through Start's rendezvous and Finalize, so that several threads
  // (one customer each) start and stop the one node in turn.
  std::mutex start_mu;
  bool started = false;                 // guarded by start_mu
  bool stopped = false;                 // guarded by start_mu
  std::set<int> customers;              // started, not yet finalized; start_mu
  bool customer0_started = false;       // start_mu
  std::condition_variable finalized;    // a customer finalized; start_mu
  std::function<void()> exit_callback;  // start_mu
};

// Destroyed at exit, after main returns or std::exit: the node's destructor
// stops it, which tells the scheduler it leaves (a failure unless Finalize
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

void StartDefault(int customer_id, const char* argv0, bool do_barrier) {
  DefaultState& state = State();
  Node* node = DefaultNode();
  std::lock_guard<std::mutex> lock(state.start_mu);
  if (state.stopped) {
    Die("ps::Start(" + std::to_string(customer_id) +
        ") after the node was finalized (its last customer called "
        "ps::Finalize)");
  }
  state.customers.insert(customer_id);
  if (customer_id == 0) state.customer0_started = true;
  if (state.started) return;  // another customer of this process started it
  if (argv0 != nullptr && !google::IsGoogleLoggingInitialized()) {
    google::InitGoogleLogging(argv0);
  }
  node->SetPeerFailureHandler([node](const Status& why) {
    Die(node->DescribeNode(node->id()) + " stops: " + why.message());
  });
  Status st = node->Start();
  if (!st.ok()) {
    Die(std::string(RoleName(node->role())) +
        " failed to start: " + st.ToString());
  }
  state.started = true;
  // A restarted worker rejoins a job that passed this barrier long ago.
  if (do_barrier && !node->rejoined()) Barrier(kAllGroups);
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
  Node* node = DefaultNode();
  std::function<void()> exit_callback;
  {
    std::unique_lock<std::mutex> lock(state.start_mu);
    state.customers.erase(customer_id);
    state.finalized.notify_all();
    // As in ps-lite, customer 0 stops the node (when it never started, the
    // last customer does), once every other customer that started is done.
    bool owner = customer_id == 0 || !state.customer0_started;
    if (state.stopped || !owner ||
        (customer_id != 0 && !state.customers.empty())) {
      return;
    }
    auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(node->config().barrier_timeout_ms);
    while (!state.customers.empty()) {
      if (state.finalized.wait_until(lock, deadline) ==
          std::cv_status::timeout) {
        std::string left;
        for (int c : state.customers) left += " " + std::to_string(c);
        Die("ps::Finalize(0): customers" + left +
            " of this process did not finalize within " +
            std::to_string(node->config().barrier_timeout_ms) +
            " ms (PS_BARRIER_TIMEOUT_MS)");
      }
    }
    Status st = node->Finalize(do_barrier);
    if (!st.ok()) Die("Finalize failed: " + st.ToString());
    state.stopped = true;
    exit_callback = std::move(state.exit_callback);
  }
  // The node stays (stopped) until exit: KVWorker/KVServer objects that
  // outlive this call, or that the exit callback deletes, still unregister
  // from it.
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

void Barrier(int /*customer_id*/, int group) { Barrier(group); }
void Barrier(int group) {
  Status st = DefaultNode()->Barrier(group);
  if (!st.ok()) Die(st.ToString());
}

}  // namespace ps
