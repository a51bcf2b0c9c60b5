// ps::Node: one scheduler, server or worker. It owns its config, its
// postoffice (node table, barrier, heartbeats, request dispatch) and its van
// (ZeroMQ sockets and their threads). Nodes share nothing, so one process may
// host several (tests run a whole cluster as threads).
//
// Lifecycle: Node(config) -> [Bind()] -> Start() -> ... -> Finalize() (or
// Stop()). Start() binds if Bind() was not called, registers with the
// scheduler (or, for the scheduler, waits for everyone) and returns once the
// node table is known. Threads are started in Start() and joined in Stop();
// see docs/threads.md.
//
// Thread-safety: Barrier(), the accessors and the counters may be called
// from any thread after Start(); Bind/Start/Finalize/Stop from one thread.
#ifndef PS_NODE_H_
#define PS_NODE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/config.h"
#include "ps/status.h"

namespace ps {

namespace core {
class Postoffice;
}  // namespace core

class Node {
 public:
  explicit Node(const Config& config);
  ~Node();  // Stop()s a started node
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Binds the receive socket (DMLC_PORT, the first free port of
  // PS_PORT_RANGE, or an ephemeral one). Lets a scheduler learn its port
  // before Start() blocks. Error names the port (or range) and the reason.
  Status Bind();
  // Rendezvous. Errors: scheduler unreachable within the connect timeout,
  // rendezvous timeout (how many of each role arrived vs expected), rank
  // conflict, bind failure.
  Status Start();
  // Blocks until every node of `group` (a bit-or of kScheduler, kServerGroup,
  // kWorkerGroup) has entered Barrier(group). The caller must be in the
  // group. Error: timeout or a dead member, naming the missing nodes.
  Status Barrier(int group);
  // Barrier of all nodes (when do_barrier), then Stop(). Returns the barrier's
  // error, if any, after stopping anyway.
  Status Finalize(bool do_barrier = true);
  // Stops heartbeats, tells the scheduler it leaves, closes sockets, joins
  // threads. Idempotent; never blocks longer than the configured timeouts.
  // Without a Finalize() first, the scheduler takes the departure for a
  // failure of this node and tells the others at once (NODE_FAILED).
  void Stop();

  const Config& config() const;
  Role role() const;
  int id() const;    // valid after Start()
  int rank() const;  // valid after Start(); 0 for the scheduler
  int num_servers() const;
  int num_workers() const;
  int port() const;  // the bound port, after Bind()/Start()
  // Ids of the nodes in `group`, ascending.
  std::vector<int> GetNodeIds(int group) const;
  // "server 1 (tcp://127.0.0.1:40123)" for any known id.
  std::string DescribeNode(int id) const;

  // Messages received and dropped as malformed or unexpected, or because
  // their header named a sender other than the connection's node.
  uint64_t num_dropped_messages() const;
  // Of those, data messages of a node declared dead (fenced: a node the
  // job went on without is heard again only once it rejoins).
  uint64_t num_fenced_messages() const;
  // Connections refused in the handshake (docs/security.md): peers without the
  // job's key (PS_KEY_FILE). Always 0 without a key.
  uint64_t num_refused_connections() const;
  // Data frames (e.g. a push's values) this node sent and received as
  // shared-memory references instead of bytes (ps/shared_array.h).
  uint64_t num_shared_frames_sent() const;
  uint64_t num_shared_frames_received() const;
  // Resending (PS_RESEND_TIMEOUT_MS): requests this node sent again for
  // want of an answer; requests and answers it received again and let go
  // (a request is applied once); and messages the test switch PS_DROP_MSG
  // let go unread.
  uint64_t num_resent_messages() const;
  uint64_t num_duplicate_messages() const;
  uint64_t num_test_drops() const;
  // Wire messages this node sent (resends and acknowledgements included)
  // and received, of every kind (heartbeats too).
  uint64_t num_messages_sent() const;
  uint64_t num_messages_received() const;
  // OK, or the first peer failure this node learned of (NODE_FAILED).
  Status peer_failure() const;
  // Whether this node is a restarted worker that rejoined a running job
  // under its rank (PS_MAX_RESTARTS): the others passed the start barrier
  // long ago, so it must not wait at it (ps::Start skips it); it learns
  // where the job stands from the servers (e.g. DenseOp::kJoin).
  bool rejoined() const;
  // Runs on the receive thread (never under a lock) when a node this node
  // talks to is declared dead. The Node itself only records and logs it.
  // A worker awaited back (PS_MAX_RESTARTS) is no failure until it did not
  // rejoin within PS_REJOIN_TIMEOUT_MS.
  void SetPeerFailureHandler(std::function<void(const Status&)> handler);
  // The same, told which node failed (its id: IsWorkerId, IdToRank...).
  void SetPeerFailureHandler(
      std::function<void(int id, const Status& why)> handler);

  // Metrics (PS_METRICS_PORT): the port this node serves /metrics on, 0
  // when it serves none (after Bind()/Start()). SetMetric sets the gauge
  // `name` (a Prometheus metric name, e.g. "ps_samples_per_second"),
  // labelled with this node's role and rank like the node's own metrics;
  // false if the name is not valid or names another kind of metric. Any
  // thread; cheap enough to call once a step.
  int metrics_port() const;
  bool SetMetric(const std::string& name, double value);
  // A checkpoint file written: how long it took and its bytes
  // (ps_checkpoint_seconds, ps_checkpoint_bytes, ps_checkpoints_total).
  void RecordCheckpoint(double seconds, uint64_t bytes);

  // Internal: the postoffice, for the KV layer (src/kv). Never null.
  core::Postoffice* postoffice() const;

 private:
  std::unique_ptr<core::Postoffice> postoffice_;
};

// The node of the ps.h convenience layer (ps::Start), made from the
// environment and flags on first use (not started: ps::Start starts it).
// Ends the process with a message naming the variable on a bad
// configuration.
Node* DefaultNode();
// The node ps::Start(customer_id) started for `customer_id`: its own, for a
// worker customer started after the process's first (ps-lite counts each
// worker customer as a worker), else DefaultNode(), also before that
// customer's Start: make its KVWorker or SimpleApp after ps::Start.
Node* CustomerNode(int customer_id);

}  // namespace ps

#endif  // PS_NODE_H_
