// The sealed wire (van/wire.h): a job with a key (VanOptions::secret_key).
// Every DEALER presents, as its ZMTP PLAIN password, a token that proves
// the job's key and names the receiving process's static key, and the
// ROUTER's ZAP handler admits only such tokens (Admit); on each admitted
// connection the sender offers a session (HELLO) and the receiver answers
// (WELCOME), and every frame is sealed with the session's keys (van/seal.h)
// and taken only in order (van/stream.h, docs/security.md, "Sessions").
//
// Sources: sealed_wire.cc (keys, admission, connecting, sealing a send),
// sealed_session.cc (sessions: the sender's side and the receiver's
// answers; the thread "ps-van-session"), sealed_receive.cc (opening what
// arrives, streamed messages record by record).
//
// Threading: Send and the session thread use a peer's state under its
// lock; `inbound_` is the receive thread's alone. Internal to src/van.
#ifndef PS_SRC_VAN_SEALED_WIRE_H_
#define PS_SRC_VAN_SEALED_WIRE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "meta.pb.h"
#include "van/seal.h"
#include "van/stream.h"
#include "van/van.h"
#include "van/wire.h"

namespace ps {
namespace van_internal {

// The sending side of one sealed connection, under the peer's lock: the
// peer's static key, the session offered (its HELLO), the open session's
// keys (frames sealed with `sealer`, answers opened with `answers`), and
// every message not yet known to be taken.
struct SealedPeer : PeerState {
  std::string peer_key;
  std::optional<seal::JobKey::Offer> offer;
  std::unique_ptr<seal::Sealer> sealer;
  std::unique_ptr<seal::Opener> answers;
  OutStream out;
};

class SealedWire : public Wire {
 public:
  SealedWire(WireHost* host, const VanOptions& options);
  ~SealedWire() override;  // Stop()s

  const std::string& wire_key() const override { return static_key_.pub; }
  std::string scheduler_wire_key() const override {
    return job_key_.SchedulerKeyPair().pub;
  }
  int64_t max_frame_bytes() const override { return max_frame_bytes_; }
  int64_t max_received_bytes() const override { return max_received_bytes_; }

  bool SetUpRouter(void* router) override;
  bool Admit(const std::string& user, const std::string& password,
             std::string* why) override;
  Status Prepare(Peer* peer, const std::string& wire_key)
      REQUIRES(peer->mu) override;
  Status Connected(Peer* peer) REQUIRES(peer->mu) override;
  Status Send(Peer* peer, std::string header, const Message& msg,
              std::vector<bool> by_ref) REQUIRES(peer->mu) override;
  void Receive(const RecvParts& parts, const std::string& from,
               const std::string& address) override;
  bool Settled(Peer* peer) REQUIRES(peer->mu) override;
  void Stop() override;

 private:
  // What the receive thread keeps of one admitted connection
  // (docs/security.md, "Sessions"): the session it confirmed last, one
  // offered and not yet confirmed, and the streamed message whose records
  // are still arriving (seal.h).
  struct Inbound {
    struct Session {
      std::string offered;                   // the sender's e.pub: its name
      std::unique_ptr<seal::Opener> opener;  // its frames, in order only
      std::unique_ptr<seal::Sealer> sealer;  // our answers (ACK, RESET)
      std::string welcome;                   // sent again for a repeated HELLO
      uint64_t taken = 0;    // the last number of the last message taken whole
      uint64_t unacked = 0;  // messages taken since the last ACK
      uint64_t unacked_bytes = 0;                        // and their bytes
      std::chrono::steady_clock::time_point reset_sent;  // the last RESET
    };
    std::optional<Session> open;
    std::optional<Session> pending;
    bool frozen = false;  // `open` takes nothing more: a new one was offered
    struct Stream {
      pb::Meta meta;                     // the opened header
      std::vector<size_t> bytes;         // each data frame's, on the wire
      std::vector<SArray<char>> frames;  // opened into record by record
      uint32_t frame = 0;                // the next record's frame and chunk
      uint32_t chunk = 0;
      std::chrono::steady_clock::time_point last;  // a record last taken
    };
    std::optional<Stream> stream;
  };

  // The peer's state, under its lock.
  static SealedPeer& StateOf(Peer* peer) REQUIRES(peer->mu) {
    return static_cast<SealedPeer&>(*peer->state);
  }
  // Seals msg's header and frames (`by_ref`: sent as references, no bytes)
  // with `sealer` and sends them on `socket` (to `address`), both of one
  // peer, under its lock; its data frames streamed as records when they
  // hold seal::kStreamBytes or more. `last`: the number of its last chunk.
  static Status SendSealed(seal::Sealer* sealer, void* socket,
                           const std::string& address,
                           const std::string& header, const Message& msg,
                           const std::vector<bool>& by_ref, uint64_t* last);
  // Sends msg's streamed data frames, a record a chunk, numbered from `seq`.
  static Status SendRecords(seal::Sealer* sealer, void* socket,
                            const std::string& address, const Message& msg,
                            const std::vector<bool>& by_ref, uint64_t seq);

  // The sending side of a session (sealed_session.cc), under the peer's
  // lock: offers a session (`again`: the same HELLO once more), sends an
  // item in the open one, reads the receiver's answers, and acts on the
  // timer.
  Status OfferLocked(Peer* peer, bool again) REQUIRES(peer->mu);
  // Asks the receiver, with an empty sealed message, what it took.
  void ProbeLocked(Peer* peer) REQUIRES(peer->mu);
  Status TransmitLocked(Peer* peer, OutStream::Item* item) REQUIRES(peer->mu);
  void DrainLocked(Peer* peer) REQUIRES(peer->mu);
  void OnAnswerLocked(Peer* peer, std::string frame) REQUIRES(peer->mu);
  void OnWelcomeLocked(Peer* peer, const std::string& frame) REQUIRES(peer->mu);
  void TickLocked(Peer* peer, std::chrono::steady_clock::time_point now)
      REQUIRES(peer->mu);
  // The thread "ps-van-session": reads the answers on every DEALER and
  // runs their timers.
  void SessionLoop();

  // The receiving side (receive thread): a HELLO on connection `key`; an
  // ACK or RESET of `session` to the sender on connection `from`; a message
  // taken whole in `session`, ACKed when enough are.
  void OnHello(const std::string& key, const std::string& hello,
               const std::string& from, const std::string& address);
  void AnswerSession(const std::string& from, Inbound::Session* session,
                     char type);
  void Took(const std::string& from, Inbound::Session* session, uint64_t bytes);
  // A message numbered `seq` that is not the next of `session`: dropped,
  // and the sender told to RESET.
  void RefuseOutOfOrder(Inbound::Session* session, uint64_t seq,
                        const std::string& from, const std::string& address);
  // The next record of `in`'s streamed message, at `data`.
  void ReceiveRecord(Inbound* in, char* data, size_t size,
                     const std::string& from, const std::string& address);
  // Opens `parts` in `session`'s opener; false (counted dropped) if they
  // do not open.
  bool OpenParts(seal::Opener* opener, const RecvParts& parts,
                 std::vector<seal::Opener::Frame>* frames,
                 const std::string& from, const std::string& address);
  // Hands up (or takes, for a probe) the message of `parts`, opened as
  // `frames` in `in`'s open session.
  void DeliverOpened(Inbound* in, const RecvParts& parts,
                     const std::vector<seal::Opener::Frame>& frames,
                     const std::string& from, const std::string& address);
  // A header that came alone, opened as `header` in `in`'s open session: a
  // message without data frames, or the start of a streamed one.
  void DeliverHeader(Inbound* in, const seal::Opener::Frame& header,
                     const std::string& from, const std::string& address);
  // For a header that came alone: whether it starts a streamed message
  // (then `in` waits for its records), or an error that names what it
  // announces beyond the limits.
  StatusOr<bool> StartStream(Inbound* in, pb::Meta* meta);
  // Opens the record of `bytes` bytes at `record` (in place) into the next
  // chunk of `in`'s streamed message.
  Status TakeRecord(Inbound* in, char* record, size_t bytes);
  void Drop(const std::string& from, const std::string& address,
            const std::string& why) {
    host_->CountDropped(Van::DescribeConnection(from, address), why);
  }

  WireHost* const host_;  // the van; outlives the wire
  const int64_t max_message_bytes_;
  int64_t max_frame_bytes_ = 0;
  int64_t max_received_bytes_ = 0;
  seal::JobKey job_key_;
  seal::KeyPair static_key_;
  // Each admitted connection, by its routing id and its PLAIN token (which
  // ZeroMQ gives its messages as their User-Id); the receive thread's
  // alone. An entry is made by a HELLO that proves the job's key, so only
  // holders of the key add to it (and replays of their connections).
  std::unordered_map<std::string, Inbound> inbound_;
  std::thread session_;  // "ps-van-session"
  std::atomic<bool> stop_session_{false};
};

}  // namespace van_internal
}  // namespace ps

#endif  // PS_SRC_VAN_SEALED_WIRE_H_
