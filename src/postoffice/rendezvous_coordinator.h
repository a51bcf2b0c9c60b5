// RendezvousCoordinator: the scheduler's registration desk at rendezvous,
// as a state machine. Inputs: registrations (ADD_NODE: the node and the
// job's shape it was started for); outputs: whether each is taken or
// refused (and whether a refusal is still answered), and once all arrived
// their ranks and ids. No I/O: the Postoffice connects back, sends ACK and
// the node tables (rendezvous.cc); tests feed it registrations.
//
// Thread-compatible: its owner serializes the calls (the Postoffice holds
// its mu_).
#ifndef PS_SRC_POSTOFFICE_RENDEZVOUS_COORDINATOR_H_
#define PS_SRC_POSTOFFICE_RENDEZVOUS_COORDINATOR_H_

#include <string>
#include <utility>
#include <vector>

#include "postoffice/node_table.h"
#include "ps/status.h"

namespace ps {
namespace core {

class RendezvousCoordinator {
 public:
  RendezvousCoordinator(int num_servers, int num_workers)
      : num_servers_(num_servers), num_workers_(num_workers) {}

  // Why a node started for DMLC_NUM_SERVER=servers, DMLC_NUM_WORKER=workers
  // may not join this job (naming both shapes); OK if it may.
  Status CheckShape(const NodeInfo& node, int servers, int workers) const;
  // Why `node` may not arrive now: one too many of its role, or its PS_RANK
  // out of range or taken (CheckRequestedRank). OK if it may.
  Status CheckArrival(const NodeInfo& node) const;
  // Counts a refusal; whether it is still answered: each answer costs a
  // connection back, so only the job's size and a few more are.
  bool AnswerRefusal();
  // The temporary id of a registering node's connection (negative, fresh).
  int NextTempId() { return next_temp_id_--; }
  // Takes `node` (checked; its id the temporary one); returns whether
  // every expected node has arrived.
  bool Arrive(const NodeInfo& node);
  // Once all arrived: each arrival with its rank and id (AssignRanks), in
  // order of arrival.
  std::vector<NodeInfo> Assign() const;
  const std::vector<NodeInfo>& arrivals() const { return arrivals_; }
  // Whether a server arrived: a fresh job's (servers are never restarted;
  // a worker that registers may be a restart of a running job's).
  bool ServerArrived() const;
  // The arrivals, which leave the desk (a restarted scheduler that took
  // the running job over registers them as restarts).
  std::vector<NodeInfo> TakeArrivals() { return std::move(arrivals_); }
  // Who arrived and who is missing, for the log and the timeout: "1 of 2
  // servers and 2 of 2 workers arrived (...); missing: server 1".
  std::string Shortfall() const;

 private:
  // Refusals answered beyond the job's size.
  static constexpr int kMaxExtraRefusals = 16;

  const int num_servers_;
  const int num_workers_;
  std::vector<NodeInfo> arrivals_;
  int next_temp_id_ = -1000;
  int refusals_answered_ = 0;
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_RENDEZVOUS_COORDINATOR_H_
