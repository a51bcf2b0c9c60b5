// Wire: what differs between a job without a key (--insecure: the plain
// wire, frames as they are) and one with a key (the sealed wire: admission
// by token, sessions, every frame sealed; van/seal.h, docs/security.md). The
// Van picks one at construction (MakePlainWire, MakeSealedWire) and does the
// rest itself: sockets, the routing table, shared memory, limits, drop
// reports. A wire is given the van as a WireHost for what it hands back.
//
// Threading: Send runs on any sending thread under the peer's lock; Receive
// on the receive thread only; Admit on the auth thread; the sealed wire
// runs one thread of its own ("ps-van-session", started at construction,
// joined by Stop). Internal to src/van.
#ifndef PS_SRC_VAN_WIRE_H_
#define PS_SRC_VAN_WIRE_H_

#include <zmq.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/sarray.h"
#include "ps/status.h"
#include "van/message.h"
#include "van/sync.h"

namespace ps {

struct VanOptions;

namespace van_internal {

// A message has a header and at most a few data frames (keys, values,
// lens); anything with more parts is malformed, and its extra parts are
// read and discarded rather than kept.
constexpr size_t kMaxParts = 16;
// ZeroMQ's "very small message" capacity (ZMQ_MAX_VSM_SIZE, 33 on 64-bit).
constexpr size_t kInlineFrameBytes = 32;
// Every send: a peer's queue has no limit (ZMQ_SNDHWM 0), so a send waits
// only where the socket has no connection at all, which is for good once
// the peer refused its handshake (ZeroMQ does not reconnect after that).
// Such a send fails at once (EAGAIN) instead of waiting forever.
constexpr int kSendFlags = ZMQ_DONTWAIT;

// Why a send to `address` failed, in words (reads errno).
std::string SendError(const std::string& address);

// What a wire keeps of one peer (the sealed wire: its session); the wire's
// own type, reached only under the peer's lock.
struct PeerState {
  virtual ~PeerState() = default;
};

// One DEALER to one node. Shared by the routing table's snapshots and the
// sends in flight; the socket closes with the last of them.
struct Peer {
  Mutex mu;  // serialises use of `socket` across threads
  void* socket GUARDED_BY(mu) = nullptr;
  std::string address;  // "tcp://host:port"; set before the peer is shared
  int fd = -1;  // the socket's ZMQ_FD where a wire polls it; set likewise
  std::unique_ptr<PeerState> state GUARDED_BY(mu);  // the wire's, or none
  ~Peer() {
    if (socket != nullptr) zmq_close(socket);
  }
};

// A received frame, kept alive by every SArray pointing into it.
struct RecvFrame {
  zmq_msg_t msg;
  RecvFrame() { zmq_msg_init(&msg); }
  ~RecvFrame() { zmq_msg_close(&msg); }
  RecvFrame(const RecvFrame&) = delete;
  RecvFrame& operator=(const RecvFrame&) = delete;

  char* data() { return static_cast<char*>(zmq_msg_data(&msg)); }
  size_t size() const { return zmq_msg_size(&msg); }
};
using RecvParts = std::vector<std::shared_ptr<RecvFrame>>;

// An SArray of the `bytes` bytes at `data` within `part`, keeping it alive.
SArray<char> Adopt(const std::shared_ptr<RecvFrame>& part, char* data,
                   size_t bytes);

// The data parts of one multipart message, each made (allocated, filled,
// sealed) before its header is sent, so that running out of memory leaves
// nothing half-sent on the socket; the parts not sent are closed.
class OutParts {
 public:
  explicit OutParts(size_t n) { parts_.reserve(n); }  // never moved after
  ~OutParts();
  OutParts(const OutParts&) = delete;
  OutParts& operator=(const OutParts&) = delete;

  // A new part of `bytes` bytes to fill, or nullptr without memory.
  void* Add(size_t bytes);
  // A new part that is `frame` itself, no copy; false without memory.
  bool AddFrame(const SArray<char>& frame);
  // Sends `header` (by zmq_send, as the ThreadSanitizer build's shim of
  // ZeroMQ expects: tests/core/tsan_zmq_sync.cc), then every part; false
  // when ZeroMQ refuses one (no connection, or its context ends).
  bool Send(void* socket, const std::string& header);

 private:
  std::vector<zmq_msg_t> parts_;
  size_t sent_ = 0;
};

// What a wire uses of its van.
class WireHost {
 public:
  virtual ~WireHost() = default;
  // Hands a decoded message from connection `from` (at `address`) to the
  // van's handler, or counts it dropped, saying why. Receive thread.
  virtual void Deliver(StatusOr<Message> msg, const std::string& from,
                       const std::string& address) = 0;
  // Counts and reports (rate-limited) a message dropped from `who`.
  virtual void CountDropped(const std::string& who, const std::string& why) = 0;
  // Prints `line` unless the rate limit says no.
  virtual void Report(const std::string& line) = 0;
  // Sends `frame` back on the ROUTER to connection `to`; dropped by ZeroMQ
  // if it is gone or its queue is full. Receive thread only.
  virtual void Answer(const std::string& to, const std::string& frame) = 0;
  // Every DEALER of the routing table now.
  virtual std::vector<std::shared_ptr<Peer>> Peers() const = 0;
  // Whose shared memory connection `from` may name (codec.h's Decode): a
  // function valid while `from` is (the Decode call it is given to).
  virtual std::function<int(int)> SharedPid(const std::string& from) const = 0;
};

class Wire {
 public:
  virtual ~Wire() = default;

  // This process's static public key (32 bytes), for the node table, and
  // the scheduler's; empty on the plain wire.
  virtual const std::string& wire_key() const = 0;
  virtual std::string scheduler_wire_key() const = 0;
  // The largest frame the ROUTER lets in (ZMQ_MAXMSGSIZE), and the most one
  // message's frames may hold in all: a sealed frame is larger than its
  // plaintext.
  virtual int64_t max_frame_bytes() const = 0;
  virtual int64_t max_received_bytes() const = 0;

  // Before the ROUTER binds: its handshake. Returns whether connections are
  // admitted by ZAP (the sealed wire's PLAIN tokens), which Admit decides.
  virtual bool SetUpRouter(void* router) = 0;
  // Auth thread: whether a ZMTP PLAIN handshake of user `user`, password
  // `password` is admitted; if not, *why.
  virtual bool Admit(const std::string& user, const std::string& password,
                     std::string* why) = 0;

  // A new DEALER, before the peer is shared: before it connects (to the
  // node whose static key is `wire_key`; errors name what is wrong with it)
  // and after.
  virtual Status Prepare(Peer* peer, const std::string& wire_key)
      REQUIRES(peer->mu) = 0;
  virtual Status Connected(Peer* peer) REQUIRES(peer->mu) = 0;

  // Sends (or, sealed, keeps until it can be sent and is known taken) the
  // encoded `header` and msg's data frames, shared, not copied; those
  // `by_ref` go as empty frames (shared-memory references in the header).
  virtual Status Send(Peer* peer, std::string header, const Message& msg,
                      std::vector<bool> by_ref) REQUIRES(peer->mu) = 0;
  // Receive thread: one message's parts (the routing id, a header frame,
  // then data frames; at most kMaxParts and max_received_bytes) from
  // connection `from` at `address`: delivers what they make
  // (WireHost::Deliver), or counts them dropped, saying why.
  virtual void Receive(const RecvParts& parts, const std::string& from,
                       const std::string& address) = 0;

  // Whether every message sent to `peer` is known taken (the plain wire
  // cannot know: it says yes, and ZeroMQ's linger sends what is queued).
  // The sealed wire asks the receiver now (a probe) when not.
  virtual bool Settled(Peer* peer) REQUIRES(peer->mu) = 0;

  // Ends the wire's own thread, if any, before the DEALERs close.
  // Idempotent.
  virtual void Stop() = 0;
};

// Frames as they are: an --insecure job.
std::unique_ptr<Wire> MakePlainWire(WireHost* host, const VanOptions& options);
// Every frame sealed with the job key of options.secret_key (van/seal.h);
// a key that is not 40 Z85 characters is a bug of the caller (CHECK).
std::unique_ptr<Wire> MakeSealedWire(WireHost* host, const VanOptions& options);

}  // namespace van_internal
}  // namespace ps

#endif  // PS_SRC_VAN_WIRE_H_
