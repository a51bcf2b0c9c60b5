// TakeoverCoordinator: a restarted scheduler taking a running job over
// (PS_MAX_RESTARTS), as a state machine. The restarted scheduler binds the
// old one's address and knows nothing of the job; the members, which
// awaited it, report themselves every heartbeat interval (ADD_NODE with
// rejoin, their id and rank, and the servers they know taken over by their
// replica). Once every member reported (but the servers taken over, which
// are dead), it holds the node table again, with the membership's
// coverings, and answers each; the members then send again the barriers
// they were waiting in.
//
//   report ─(Check)─> refused (another job's shape, rank, id)
//          ─(Classify)─> new: Take (connect, table) ─ the last ─> complete
//                        copy: nothing (its answer comes with the others')
//                        answer again (its answer was lost)
//                        refused (this scheduler runs a job of its own)
//
// No I/O and no node table: the Postoffice connects, keeps the table,
// applies the membership's transitions and answers (rejoin.cc); tests
// feed it reports.
//
// Thread-compatible: its owner serializes the calls (the Postoffice holds
// its mu_).
#ifndef PS_SRC_POSTOFFICE_TAKEOVER_COORDINATOR_H_
#define PS_SRC_POSTOFFICE_TAKEOVER_COORDINATOR_H_

#include <map>
#include <string>
#include <vector>

#include "postoffice/node_table.h"
#include "ps/status.h"

namespace ps {
namespace core {

class TakeoverCoordinator {
 public:
  TakeoverCoordinator(int num_servers, int num_workers, int max_restarts)
      : num_servers_(num_servers),
        num_workers_(num_workers),
        max_restarts_(max_restarts) {}

  // Why a member's report of `node`, sent by a node started for
  // DMLC_NUM_SERVER=servers DMLC_NUM_WORKER=workers and naming `covered`
  // as servers taken over by their replica, does not fit this job (its
  // shape, a node's role, rank or id); OK if it does.
  Status Check(const NodeInfo& node, const std::vector<NodeInfo>& covered,
               int servers, int workers) const;

  enum class Outcome {
    kNew,          // the first report of this member: Take it
    kCopy,         // reported already; answered once all have
    kAnswerAgain,  // this scheduler holds the job and knows the member at
                   // this address: its answer was lost, answer again
    kRefused,      // this scheduler began a job of its own: no takeover
  };
  // What a checked report of `node` is. `running`: this scheduler holds a
  // job (registrations arrived, or the job is ready); `known`: the node
  // table's entry of node.id (null if none).
  Outcome Classify(const NodeInfo& node, bool running,
                   const NodeInfo* known) const;
  // Takes a new report, and the servers it names taken over (a server that
  // reports itself is not); true when it completes the job: every node
  // either reported or is a server taken over. The job goes on (the caller
  // answers every member, and enters Covered() as such).
  bool Take(const NodeInfo& node, const std::vector<NodeInfo>& covered);
  bool complete() const { return complete_; }
  // Who has neither reported nor been named taken over, for the timeout:
  // "server 1, worker 0".
  std::string Missing() const;
  // Their ids and roles, as nodes of unknown address.
  std::vector<NodeInfo> MissingNodes() const;
  int reported() const { return static_cast<int>(reported_.size()); }
  // The servers named taken over that did not report themselves.
  std::vector<NodeInfo> Covered() const;

 private:
  const int num_servers_;
  const int num_workers_;
  const int max_restarts_;
  std::map<int, NodeInfo> reported_;  // by id
  std::map<int, NodeInfo> covered_;   // by id: named taken over
  bool complete_ = false;
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_TAKEOVER_COORDINATOR_H_
