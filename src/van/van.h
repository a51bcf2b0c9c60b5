// Van: the ZeroMQ transport of one node. One ROUTER socket, bound by Bind()
// and owned by the receive thread ("ps-van-recv"), receives every message;
// one DEALER socket per peer sends to it.
//
// Threading: Send() may be called from any thread. Each DEALER is guarded by
// its own mutex; ZeroMQ allows a socket to be used from several threads as
// long as each hand-over passes a full memory barrier, which the mutex
// provides. No lock of the whole Van is taken on a send or a receive: the
// routing table (peers, and who may send or receive shared-memory
// references) is a copy-on-write snapshot (van/snapshot.h) that Send and the
// receive thread read without a lock, and that Connect, Rekey, Disconnect,
// SendReferencesTo and AcceptReferencesFrom (any thread) replace whole. A
// send that read the table just before a Disconnect may still go out on the
// old DEALER, which closes when that send lets go of it. The receive
// handler runs on the receive thread, never under a lock of the Van.
//
// Zero copy: data frames are sent with zmq_msg_init_data and a free function
// that drops one reference of the SArray's buffer (frames of at most 32
// bytes, which ZeroMQ keeps inside the zmq_msg_t, are copied instead); received
// frames are received into heap-held zmq_msg_t's whose deleter closes them, and
// the SArrays handed up point into the frame's data.
//
// Shared memory (van/shm.h): to a peer that mapped our probe
// (SendReferencesTo), a data frame that lies in shared memory
// (ps::SharedArray, or a mapping of the peer's) goes as a reference in the
// header and an empty frame, and a pull's reply_into goes along; to others
// the bytes go and reply_into is dropped. References are accepted only from
// peers whose probe we mapped (AcceptReferencesFrom), naming their memory or
// ours; any other is a malformed message.
//
// Trust (docs/architecture.md, "Who sent it"): every message is handed up
// with the routing id of the connection it came on (Message::from); the
// postoffice checks the header's sender against it. With a job key
// (VanOptions::secret_key) every frame is sealed (van/seal.h): each DEALER
// presents, as its ZMTP PLAIN password, a token that proves the job's key
// and names the receiving process's static key (wire_key(), carried in the
// node table), and seals with the key the token agrees; the ROUTER's ZAP
// handler (thread "ps-van-auth") admits only such tokens, so a stranger's
// connection is refused in the handshake, before any of its bytes are read,
// and the receive thread opens each message with its connection's key,
// refusing replayed, reordered and tampered frames. Limits: a frame over
// max_message_bytes is refused by ZeroMQ before it is buffered (the peer is
// disconnected); at most water_mark messages queue per peer and direction;
// drops are counted and reported at a bounded rate.
//
// Watching (WatchConnections, the scheduler's): every DEALER's socket
// monitor reports its connection's state to the thread "ps-van-watch";
// a connection that closes and cannot be made again within a grace period
// (the peer's process is gone: its port refuses) is reported at once,
// instead of after the heartbeat timeout.
//
// Wires (van/wire.h): what differs between a job without a key and one
// with is one object, picked at construction: the plain wire
// (plain_wire.cc) or the sealed one (sealed_wire.h). Send and ReceiveOne
// hand it the encoded message or the received parts.
//
// Sources: van.cc (bind, start, stop, routes, send, receive), van_watch.cc
// (watching), van_auth.cc (the auth thread: ZAP and the idle-connection
// guard), wire.h/wire.cc (the wire interface, the peer record, frames in
// and out), plain_wire.cc, sealed_wire.h/.cc, sealed_session.cc,
// sealed_receive.cc, van_internal.h (ZeroMQ helpers).
#ifndef PS_SRC_VAN_VAN_H_
#define PS_SRC_VAN_VAN_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "meta.pb.h"
#include "metrics/metrics.h"
#include "ps/sarray.h"
#include "ps/status.h"
#include "van/message.h"
#include "van/snapshot.h"
#include "van/sync.h"
#include "van/wire.h"

namespace ps {

class SharedMemory;

struct VanOptions {
  std::string secret_key;  // Z85 job key (32 bytes); empty: plain TCP
  // With a key: this van is the scheduler's, whose static key every node
  // derives from the job key (it is reached before any table exists).
  bool scheduler = false;
  int64_t max_message_bytes = int64_t{1} << 30;
  // Inbound messages queued per connection (ZMQ_RCVHWM): past it ZeroMQ
  // stops reading that connection. Our own outbound queues are bounded by
  // the requests our code has in flight, and never block a send (a send
  // that blocked on the receive thread could deadlock two nodes).
  int water_mark = 1000;
  // ZeroMQ's own connection heartbeats (ZMTP PING), so that a connection
  // whose peer vanished without a FIN is closed and its routing id freed.
  int heartbeat_interval_ms = 0;  // 0: none
  int heartbeat_timeout_ms = 0;
  // A connection whose handshake (ZMTP greeting, and the token's with a key)
  // is not done within this is closed (ZMQ_HANDSHAKE_IVL): anyone can open
  // TCP connections to our port, and idle ones must not pile up until the
  // process runs out of descriptors.
  int handshake_timeout_ms = 3000;
  // Idle connections held at once (accepted, nothing sent past a ZMTP
  // greeting) from one source address and in all; past a cap the oldest
  // is shut down (van/conn_guard.h), so that a flood of them within the
  // handshake deadline cannot take the process's last descriptors. 0: a
  // sixteenth and a quarter of the soft RLIMIT_NOFILE.
  int max_idle_connections_per_source = 0;
  int max_idle_connections = 0;
  // Where refusals are counted by reason (null: nowhere); outlives the van.
  Metrics* metrics = nullptr;
};

class Van : private van_internal::WireHost {
 public:
  // Receives each well-formed message; runs on the receive thread.
  using Handler = std::function<void(Message&& msg)>;

  explicit Van(const VanOptions& options = VanOptions());
  ~Van() override;  // Stop()s
  Van(const Van&) = delete;
  Van& operator=(const Van&) = delete;

  // Binds the ROUTER on `host` (a numeric IPv4, else all interfaces) at
  // `port`; port 0 with a range [lo, hi] takes the first free port in it,
  // port 0 without one an ephemeral port. Errors name the port or range.
  Status Bind(const std::string& host, int port, int range_lo, int range_hi);
  int port() const { return port_; }
  // The name other nodes see in our routing id: "host:port".
  void set_identity(const std::string& identity) { identity_ = identity; }

  // Starts the receive thread. Bind() must have succeeded.
  void Start(Handler handler);
  // Closes every socket and joins the receive thread. Pending outbound
  // messages get up to `linger_ms` to leave. Idempotent.
  void Stop(int linger_ms);
  // Waits up to `timeout_ms` until everything sent to node `id` is known
  // taken (the sealed wire's streams; a plain wire's are at once), so that
  // a last message (a goodbye) survives a session started again at the
  // end. Returns whether it is.
  bool Flush(int id, int timeout_ms);

  // Reports a peer whose connection closed and did not come back within
  // `grace_ms`: lost(id, why), on the watch thread, under no lock of the
  // van, once per loss (a connection made again, e.g. to a restarted peer
  // at the same address, may be reported lost again). Call before Start();
  // applies to the DEALERs opened from then on: all of them, or only node
  // `only_id`'s.
  using LostHandler = std::function<void(int id, const std::string& why)>;
  // regained(id): a connection that had closed was made again (e.g. to a
  // peer restarted at the same address), whether or not it was reported
  // lost; on the watch thread, under no lock of the van.
  using RegainedHandler = std::function<void(int id)>;
  void WatchConnections(int grace_ms, LostHandler lost, int only_id = -1,
                        RegainedHandler regained = nullptr);

  // Opens (or replaces) the DEALER to node `id` at tcp://host:port, whose
  // static key is `wire_key` (its wire_key(); ignored without a job key);
  // with `watch`, under WatchConnections' watch (if on).
  Status Connect(int id, const std::string& host, int port,
                 const std::string& wire_key, bool watch = true);
  // This process's static public key (32 bytes), for the node table; the
  // scheduler's, for connecting to it. Empty without a job key.
  const std::string& wire_key() const { return wire_->wire_key(); }
  std::string scheduler_wire_key() const { return wire_->scheduler_wire_key(); }
  // Node `id` can map our shared memory: send it references.
  void SendReferencesTo(int id);
  // We can map the shared memory of node `id`, process `pid`, whose
  // connections carry routing id `identity`: resolve the references that
  // arrive on them (only those: a header's claim of being node `id` is
  // checked later, and references are resolved before).
  void AcceptReferencesFrom(int id, const std::string& identity, int pid);
  // Moves the connection known as `old_id` to `new_id`.
  void Rekey(int old_id, int new_id);
  void Disconnect(int id);
  bool IsConnected(int id) const;
  // Whether frames in shared memory go to node `id` by reference.
  bool SharesMemoryWith(int id) const;

  // Sends msg to msg->meta.recver(); fills the header's data sizes.
  Status Send(Message* msg);

  // Shared memory (van/shm.h), for the layers above the van, so that they
  // name no process-wide registry themselves. Any thread.
  // Whether [data, data + bytes) lies within one shared region of this
  // process or one it mapped; if so fills every field of `ref` but `frame`
  // and `bytes` (SharedMemory::Find).
  bool FindShared(const void* data, size_t bytes, pb::SharedRef* ref) const;
  // The `bytes` bytes that `ref` names, mapping another process's region on
  // first use; errors name the region, the process and why
  // (SharedMemory::Resolve).
  StatusOr<SArray<char>> ResolveShared(const pb::SharedRef& ref,
                                       size_t bytes) const;

  // Counts and reports (WARNING, on stderr, at most a few lines every
  // 10 s) a dropped message from `from`.
  void CountDropped(const std::string& from, const std::string& why) override;
  uint64_t num_dropped() const { return num_dropped_.load(); }
  // Connections refused in the handshake (no token of this job's key for
  // this process, or another mechanism).
  uint64_t num_refused() const { return num_refused_.load(); }
  // "connection '127.0.0.1:4000' from 127.0.0.1", or the id in hex when it
  // is not printable: names a peer by what the connection proves.
  static std::string DescribeConnection(const std::string& routing_id,
                                        const std::string& address);
  // Data frames sent and received as shared-memory references (a message
  // the sealed wire sends again in a new session counts once).
  uint64_t num_shared_sent() const { return num_shared_sent_.load(); }
  uint64_t num_shared_received() const { return num_shared_received_.load(); }

 private:
  using Peer = van_internal::Peer;
  using RecvParts = van_internal::RecvParts;
  struct Watched;  // one watched connection (below)

  // WireHost: what the wire hands back (see van/wire.h).
  void Deliver(StatusOr<Message> msg, const std::string& from,
               const std::string& address) override;
  void Report(const std::string& line) override;
  void Answer(const std::string& to, const std::string& frame) override;
  std::vector<std::shared_ptr<Peer>> Peers() const override;
  std::function<int(int)> SharedPid(const std::string& from) const override;

  // Lists in msg->meta.shared the data frames that go to a peer as
  // shared-memory references (only with `references`: a peer that mapped
  // our probe) and marks them in *by_ref; without, drops reply_into.
  // Returns the bytes of regions made for this message alone
  // (SharedRef.once): copies of the caller's, counted against the limit as
  // if they were sent.
  int64_t MarkReferences(Message* msg, bool references,
                         std::vector<bool>* by_ref) const;
  void ReceiveLoop();
  // Receives one multipart message; false when the context is shut down.
  bool ReceiveOne();
  // Binds the ROUTER's monitor and, if `with_zap` (the wire admits by token),
  // the ZAP endpoint; starts the auth thread.
  void StartAuth(bool with_zap);
  void AuthLoop(void* zap, void* monitor);
  // Answers one ZAP request: admits what the wire's Admit does.
  void AnswerZap(void* zap);
  // Starts monitoring a new DEALER's connection (WatchConnections).
  void Watch(const std::shared_ptr<Peer>& peer, void* socket)
      EXCLUDES(watch_mu_);
  void WatchLoop();
  // Moves the monitors handed over by Watch to the watch thread's list.
  void TakeNewWatches(std::vector<Watched>* watched) EXCLUDES(watch_mu_);
  // Calls the handlers for the peers `lost` (with their addresses) and
  // `regained`, those still in the routes, on the watch thread.
  void Tell(
      const std::vector<std::pair<std::shared_ptr<Peer>, std::string>>& lost,
      const std::vector<std::shared_ptr<Peer>>& regained);
  // ZMTP heartbeats on `socket`, when configured.
  void SetHeartbeats(void* socket) const;

  // Where messages go and which references are allowed: read whole, without
  // a lock, on every send and every received reference; replaced whole by
  // Connect, Rekey, Disconnect, SendReferencesTo and AcceptReferencesFrom.
  struct Routes {
    std::unordered_map<int, std::shared_ptr<Peer>> peers;  // by node id
    std::unordered_set<int> send_references;               // node ids
    // Routing id -> pid, and node id -> routing id (to forget it).
    std::unordered_map<std::string, int> accept_pid;
    std::unordered_map<int, std::string> accept_identity;
  };

  const VanOptions options_;
  SharedMemory* const shared_memory_;  // the process's; outlives every Van
  void* context_ = nullptr;
  void* router_ = nullptr;  // owned by the receive thread once started
  std::thread auth_;        // "ps-van-auth"
  int port_ = 0;
  std::string identity_;
  Handler handler_;
  std::thread receiver_;
  bool stopped_ = false;

  Snapshot<Routes> routes_;

  // One watched connection: its monitor's PAIR socket (the watch thread's
  // alone once handed over) and its state.
  struct Watched {
    std::weak_ptr<Peer> peer;
    void* monitor = nullptr;
    bool down = false;  // closed and not yet made again
    std::chrono::steady_clock::time_point down_since;
    bool reported = false;
  };
  int watch_grace_ms_ = 0;  // 0: no watching
  int watch_only_id_ = -1;  // -1: every peer
  LostHandler lost_;
  RegainedHandler regained_;
  std::thread watcher_;  // "ps-van-watch"
  Mutex watch_mu_;
  std::vector<Watched> new_watches_ GUARDED_BY(watch_mu_);  // to hand over
  uint64_t num_watches_ GUARDED_BY(watch_mu_) = 0;  // names the endpoints
  std::atomic<bool> stopped_watch_{false};

  std::atomic<uint64_t> num_dropped_{0};
  std::atomic<uint64_t> num_refused_{0};
  Mutex report_mu_;  // guards the three below
  std::chrono::steady_clock::time_point report_window_ GUARDED_BY(report_mu_);
  int reported_in_window_ GUARDED_BY(report_mu_) = 0;
  uint64_t suppressed_ GUARDED_BY(report_mu_) = 0;
  std::atomic<uint64_t> num_shared_sent_{0};
  std::atomic<uint64_t> num_shared_received_{0};

  // Plain or sealed, by options_.secret_key; made last (the sealed wire's
  // thread reads the routes), stopped first.
  std::unique_ptr<van_internal::Wire> wire_;
};

}  // namespace ps

#endif  // PS_SRC_VAN_VAN_H_
