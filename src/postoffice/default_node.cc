// The ps.h convenience layer: one default node per process, started from the
// environment. This is the program's edge: errors end the process with a
// message naming the variable, address or node at fault.
#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "ps/ps.h"

namespace ps {

namespace {

// The default node of this process (the convenience layer only; the core
// never reaches for it).
std::unique_ptr<Node>& DefaultNodeSlot() {
  static std::unique_ptr<Node> node;
  return node;
}

[[noreturn]] void Die(const std::string& what) {
  LOG(ERROR) << what;
  google::FlushLogFiles(google::GLOG_INFO);
  std::fprintf(stderr, "ps: %s\n", what.c_str());
  std::fflush(stderr);
  // _Exit: other threads of this process are still running; static
  // destructors must not run under them.
  std::_Exit(1);
}

void StartDefault(const char* argv0, bool do_barrier) {
  if (argv0 != nullptr && !google::IsGoogleLoggingInitialized()) {
    google::InitGoogleLogging(argv0);
  }
  CHECK(DefaultNodeSlot() == nullptr) << "ps::Start called twice";
  StatusOr<Config> config = Config::FromEnvAndFlags();
  if (!config.ok()) Die("bad configuration: " + config.status().message());
  DefaultNodeSlot() = std::make_unique<Node>(*config);
  Node* node = DefaultNodeSlot().get();
  node->SetPeerFailureHandler([node](const Status& why) {
    Die(node->DescribeNode(node->id()) + " stops: " + why.message());
  });
  Status st = node->Start();
  if (!st.ok()) {
    Die(std::string(RoleName(config->role)) +
        " failed to start: " + st.ToString());
  }
  if (do_barrier) Barrier(kAllGroups);
}

}  // namespace

Node* DefaultNode() {
  Node* node = DefaultNodeSlot().get();
  CHECK(node != nullptr) << "ps::Start() has not been called";
  return node;
}

void Start(int /*customer_id*/, const char* argv0) {
  StartDefault(argv0, true);
}
void StartAsync(int /*customer_id*/, const char* argv0) {
  StartDefault(argv0, false);
}

void Finalize(int /*customer_id*/, bool do_barrier) {
  Status st = DefaultNode()->Finalize(do_barrier);
  if (!st.ok()) Die("Finalize failed: " + st.ToString());
  // The node stays (stopped) until exit: KVWorker/KVServer objects that
  // outlive this call still unregister from it.
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
