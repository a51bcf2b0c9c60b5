// Resender: resending on a timer that follows each peer's measured round
// trip (Config::resend_adaptive, the default), as TCP's does (RFC 6298).
//
// A worker's KV requests and a server's KV answers to workers are kept
// here (Keep, before the send) until the receiver acknowledges their
// arrival. A message marked with an attempt (Meta.attempt) asks for an
// acknowledgement; the receiving Postoffice owes it from the moment it
// dispatches the message, before any handler sees it (Owe), and pays it,
// as TCP delays its acks (RFC 1122 4.2.3.2), with the next message it
// sends that peer within kAckDelayMs (Meta.acks; an answer that comes
// that soon so acknowledges its own request), or else with one message of
// its own (AckOf, or one naming all that is owed that peer). A loss-free
// round trip answered promptly is two wire messages: the request, and the
// answer carrying its acknowledgement (the worker's of the answer rides
// on its next request, or goes alone kAckDelayMs later). A request is
// settled by its answer too. One not acknowledged within its peer's RTO
// (RttEstimator) is sent again, up to kMaxSends times (after that the KV
// layer's own resend, at PS_RESEND_TIMEOUT_MS, is what is left); the
// receivers already apply a request once and let a second answer go. The
// RTO follows the round trips of acknowledgements, never of answers that
// do not carry one: under BSP an answer may wait a whole step, while an
// acknowledgement waits at most kAckDelayMs. Karn's problem (whose send
// does an acknowledgement answer?) does not arise: the acknowledgement
// echoes the attempt, so a late acknowledgement of a first send is a
// sample from that send (as TCP timestamps, RFC 7323), the one that says
// the RTO was too short.
//
// Thread-safety: every method may be called from any thread. The thread
// "ps-resend" (Start/Stop) sleeps until the earliest resend or owed
// acknowledgement is due and sends, under no lock, through the `send`
// given (which must not Keep; an acknowledgement has Meta.ack set).
#ifndef PS_SRC_POSTOFFICE_RESENDER_H_
#define PS_SRC_POSTOFFICE_RESENDER_H_

#include <chrono>
#include <functional>
#include <map>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "postoffice/rtt_estimator.h"
#include "ps/config.h"
#include "ps/status.h"
#include "van/message.h"
#include "van/sync.h"

namespace ps {

class Resender {
 public:
  using Clock = std::chrono::steady_clock;
  using SendFn = std::function<Status(Message* msg)>;
  // The least RTO. Round trips on one host or a rack are tens of
  // microseconds, but the receive thread that acknowledges may wait a
  // scheduler slice (a few ms) on a busy host, and a message of megabytes
  // takes milliseconds to arrive whole: below this, resends would be
  // spurious copies of messages still on their way.
  static constexpr double kFloorMs = 5;
  // Messages of this many payload bytes or more take their own RTO per
  // peer: their round trips include their transfer, which the small ones'
  // do not, so one estimate for both would be too short for the large
  // (spurious resends of megabytes) or too long for the small.
  static constexpr size_t kLargeBytes = size_t{64} << 10;
  // The most RTO: this many times the initial one (backoff's cap).
  static constexpr int kMaxBackoff = 16;
  static constexpr int kMaxSends = 8;
  // How long an acknowledgement may wait for a message to ride on: a
  // fifth of the least RTO, so that its wait never looks like a loss.
  static constexpr double kAckDelayMs = 1;
  // While anything is kept or owed, the thread wakes at least this often
  // (and a Keep or Owe wakes it only when it sleeps without a deadline):
  // a resend or an owed acknowledgement goes at most this late.
  static constexpr double kTickMs = 1;
  // Owed one peer, they go at once (as TCP acks every second segment).
  static constexpr size_t kMaxOwed = 64;
  // The most a message may carry (more is a malformed message).
  static constexpr int kMaxAcks = 1024;

  // initial_ms: the RTO before a peer's first sample.
  Resender(int initial_ms, SendFn send);
  ~Resender() { Stop(); }
  void Start();
  void Stop();

  // Whether a node of `role` keeps m: a worker's KV request to a server,
  // a server's KV answer to a worker.
  static bool Wants(const pb::Meta& m, Role role);
  // Before *msg is sent: stamps its attempt and keeps a copy (sharing its
  // frames). A copy of one still kept (the KV layer resent it) replaces it
  // as its next attempt. What is owed its receiver rides on it (Meta.acks;
  // not on the copy: a resend carries none).
  void Keep(Message* msg, Clock::time_point now) EXCLUDES(mu_);
  // Received m from `peer`, which asks for an acknowledgement: owes it,
  // for at most kAckDelayMs.
  void Owe(int peer, const pb::Meta& m, Clock::time_point now) EXCLUDES(mu_);
  // m could not be sent: forgets it.
  void Forget(const pb::Meta& m) EXCLUDES(mu_);
  // `peer` (as its connection proves) acknowledged what `m` names: itself,
  // if it is an acknowledgement with an attempt, and each of its acks.
  void OnAck(int peer, const pb::Meta& m, Clock::time_point now) EXCLUDES(mu_);
  // `peer` answered: the request is settled (no sample: see above).
  void OnAnswer(int peer, const pb::Meta& answer) EXCLUDES(mu_);
  // `peer` died or was restarted: forgets what was kept for it.
  void ForgetPeer(int peer) EXCLUDES(mu_);
  // The acknowledgement of received message m, to its sender.
  static Message AckOf(const pb::Meta& m);

  // The acknowledgement m asks for, as an entry of Meta.acks.
  static pb::Acked AckedOf(const pb::Meta& m);

  // Tests.
  size_t num_kept() const EXCLUDES(mu_);
  size_t num_owed() const EXCLUDES(mu_);
  double RtoMs(int peer, bool large = false) const EXCLUDES(mu_);

 private:
  // A message: to (or, acknowledged, from) `peer`.
  using Key = std::tuple<int /*peer*/, int /*app*/, int /*customer*/,
                         int /*timestamp*/, int /*shard*/, bool /*request*/>;
  static Key KeyOf(int peer, const pb::Meta& m, bool request);
  static Key KeyOf(int peer, const pb::Acked& a);
  struct Kept {
    Message msg;
    std::vector<Clock::time_point> sent;  // of each attempt
    Clock::time_point due;                // of the next
    bool large = false;                   // kLargeBytes or more
  };
  // What is owed one peer, and when it goes alone.
  struct Owed {
    std::vector<pb::Acked> acks;
    Clock::time_point due;
  };
  void Loop() EXCLUDES(mu_);
  // The acknowledgement `peer` sent of `key`'s attempt: settles it.
  void SettleLocked(int peer, const Key& key, int attempt,
                    Clock::time_point now) REQUIRES(mu_);
  // Takes the acknowledgements due (to send alone).
  void TakeOwedLocked(Clock::time_point now, std::vector<Message>* out)
      REQUIRES(mu_);
  // Takes what is due (rescheduled, the peers' RTO backed off) to send.
  std::vector<Message> TakeDueLocked(Clock::time_point now) REQUIRES(mu_);
  // The RTO of messages to `peer`, small or `large`.
  RttEstimator& PeerLocked(int peer, bool large) REQUIRES(mu_);
  Clock::time_point DueLocked(int peer, bool large, Clock::time_point now)
      REQUIRES(mu_);

  const double initial_ms_;
  const SendFn send_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  // A few per request in flight.
  std::map<Key, Kept> kept_ GUARDED_BY(mu_);
  std::map<int, Owed> owed_ GUARDED_BY(mu_);  // by peer
  std::map<std::pair<int, bool>, RttEstimator> peers_ GUARDED_BY(mu_);
  // When the thread wakes next (max: when told; else at most kTickMs on).
  Clock::time_point wake_ GUARDED_BY(mu_) = Clock::time_point::max();
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_RESENDER_H_
