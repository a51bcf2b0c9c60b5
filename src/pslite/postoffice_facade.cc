// ps::Postoffice (ps/internal/postoffice.h): ps-lite's singleton view,
// answered from the default node of the ps.h layer.
#include <string>

#include "ps/ps.h"

namespace ps {

Postoffice* Postoffice::Get() {
  static Postoffice* post = new Postoffice;  // never destroyed: threads
  return post;
}

void Postoffice::Start(int customer_id, const char* argv0,
                       const bool do_barrier) {
  if (do_barrier) {
    ps::Start(customer_id, argv0);
  } else {
    ps::StartAsync(customer_id, argv0);
  }
}

void Postoffice::Finalize(const int customer_id, const bool do_barrier) {
  ps::Finalize(customer_id, do_barrier);
}

void Postoffice::RegisterExitCallback(const Callback& cb) {
  ps::RegisterExitCallback(cb);
}

bool Postoffice::is_recovery() const { return DefaultNode()->rejoined(); }

const std::vector<int>& Postoffice::GetNodeIDs(int node_id) const {
  std::vector<int> ids = node_id >= 8 ? std::vector<int>{node_id}
                                      : DefaultNode()->GetNodeIds(node_id);
  CHECK(!ids.empty()) << "node " << node_id << " doesn't exist";
  std::lock_guard<std::mutex> lock(mu_);
  // Entries are never erased, so a returned reference stays valid; an
  // entry's contents are fixed once the node table is.
  std::vector<int>& cached = node_ids_[node_id];
  if (cached != ids) cached = ids;
  return cached;
}

const std::vector<Range>& Postoffice::GetServerKeyRanges() {
  Node* node = DefaultNode();
  std::lock_guard<std::mutex> lock(mu_);
  if (server_key_ranges_.empty()) {
    Placement p =
        Placement::EvenKeys(node->num_servers(), node->config().max_key);
    for (int s = 0; s < p.num_servers(); ++s) {
      server_key_ranges_.emplace_back(p.begin(s), p.end(s));
    }
  }
  return server_key_ranges_;
}

int Postoffice::num_workers() const { return ps::NumWorkers(); }
int Postoffice::num_servers() const { return ps::NumServers(); }
int Postoffice::my_rank() const { return ps::MyRank(); }
int Postoffice::is_worker() const { return ps::IsWorker(); }
int Postoffice::is_server() const { return ps::IsServer(); }
int Postoffice::is_scheduler() const { return ps::IsScheduler(); }
int Postoffice::verbose() const { return DefaultNode()->config().verbose; }

void Postoffice::Barrier(int customer_id, int node_group) {
  ps::Barrier(customer_id, node_group);
}

}  // namespace ps
