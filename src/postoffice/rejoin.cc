// Postoffice, continued: restarts (PS_MAX_RESTARTS) of a running job; the
// protocol itself is NodeProtocol's (node_protocol_restarts.cc).
//
// A worker registering while the job runs is a restart of a dead one, under
// its rank (PS_RANK). Its registration waits until the old process is
// declared dead (the membership: awaited -> rejoining), then:
//   successor                 scheduler                   members
//   ADD_NODE request ->       ACK, table takes the new address,
//                             NODE_JOINED request ->      reconnect, probe
//                                                         its shm, forget the
//                                                         old one's requests
//                             <- NODE_JOINED response     (SHM_READY to it)
//   <- ADD_NODE response (table, rejoin)
// so that no member hears the successor before it knows its address.
//
// A restarted scheduler (PS_MAX_RESTARTS) binds the old one's address. The
// members, which waited for it (the data path does not need it), report
// themselves every heartbeat interval (ADD_NODE with rejoin, their id and
// rank) until it answers; once every member reported, it holds the table
// again and answers each (ADD_NODE response with rejoin); they send it
// again the barriers they were waiting in.
#include <glog/logging.h>

#include <utility>

#include "postoffice/postoffice.h"

namespace ps {

void Postoffice::SchedulerOnMemberReport(const Message& msg,
                                         const NodeInfo& node) {
  const pb::Control& ctrl = msg.meta.control();
  std::vector<NodeInfo> covered;
  for (const pb::NodeInfo& c : ctrl.covered()) covered.push_back(FromProto(c));
  NodeProtocol::Output out;
  {
    MutexLock lock(&mu_);
    // Only a registered server proves a fresh job: a worker that registered
    // first may be a restart of this job's (it is taken as one below).
    protocol_.OnReport(node, covered, ctrl.num_servers(), ctrl.num_workers(),
                       rendezvous_.ServerArrived(),
                       Van::DescribeConnection(msg.from, msg.peer_address),
                       Clock::now(), &out);
    TakeHeldRestartsLocked(&out);
    AfterStepLocked(&out);
  }
  Flush(&out);
}

void Postoffice::TakeHeldRestartsLocked(NodeProtocol::Output* out) {
  // rejoined(): this scheduler holds the job by its members' reports (a
  // rendezvous that completed leaves its arrivals on the desk).
  if (!IsScheduler() || !protocol_.ready() || !protocol_.rejoined() ||
      rendezvous_.arrivals().empty()) {
    return;
  }
  for (const NodeInfo& node : rendezvous_.TakeArrivals()) {
    const Status st = protocol_.CheckRestart(node);
    if (!st.ok()) {
      LOG(WARNING) << st;
      Message reject = ControlMessage(pb::ADD_NODE, node.id, false);
      reject.meta.mutable_control()->set_error(st.message());
      reject.meta.mutable_control()->set_error_code(st.code());
      out->messages.push_back(std::move(reject));
      continue;
    }
    bool started = false;
    protocol_.RegisterRestart(node, Clock::now(), &started, out);
  }
}

void Postoffice::MemberOnSchedulerBack() {
  NodeProtocol::Output out;
  {
    MutexLock lock(&mu_);
    protocol_.OnSchedulerBack(Clock::now(), &out);
    AfterStepLocked(&out);
  }
  Flush(&out);
}

}  // namespace ps
