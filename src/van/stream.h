// OutStream: what the sending side of one sealed connection keeps, without
// I/O (docs/security.md, "Sessions"). Every message sent on the connection
// stays here until the receiver says it took it (an ACK, or the count a
// WELCOME quotes); a session that breaks (the receiver saw a gap, a repeat
// or a reorder and said RESET, or its answers stopped) is replaced by a
// new one, and what the receiver had not taken is sent again in it, in
// order, control messages and data alike. The receiver takes each message
// of a session exactly once and only in order, so nothing is lost unseen
// or applied twice.
//
// Sessions are named by the sender's ephemeral key (the offer's). A
// message may be sent in several sessions; the receiver quotes, for the
// last session it confirmed, the last sequence number it took, so a
// message was taken if and only if it was sent in that session with a
// number at or below the quote.
//
// Thread-safety: none; the van uses it under the peer's lock. Internal.
#ifndef PS_SRC_VAN_STREAM_H_
#define PS_SRC_VAN_STREAM_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "van/message.h"

namespace ps {

class OutStream {
 public:
  using Clock = std::chrono::steady_clock;
  // The least time a session's answers may be awaited before a probe, and
  // the most it backs off to.
  static constexpr auto kFirstWait = std::chrono::milliseconds(200);
  static constexpr auto kMostWait = std::chrono::milliseconds(3200);
  // Probes unanswered before the session is given up for a new one.
  static constexpr int kProbesPerSession = 4;

  // A message to send: its encoded header, its frames (shared, not copied)
  // and which of them go as shared-memory references.
  struct Item {
    std::string header;
    Message msg;
    std::vector<bool> by_ref;
    // The sessions it was sent in, with the sequence number of its last
    // chunk in each; the last one is the session it was last sent in.
    std::vector<std::pair<std::string, uint64_t>> sent;
  };

  // What the connection is doing.
  enum class State {
    kOffering,  // a HELLO is out; sends queue until its WELCOME
    kOpen,      // sends go out now, sealed with the session's keys
  };
  State state() const { return state_; }
  const std::string& session() const { return session_; }
  bool had_session() const { return !confirmed_.empty() || resumed_; }

  // A message to send; returns it, to send now when the state is kOpen.
  Item* Add(Item item) {
    items_.push_back(std::move(item));
    return &items_.back();
  }
  // `item` (the last added) could not be handed to ZeroMQ at all: forgets it.
  void Unadd() { items_.pop_back(); }
  // `item` went out in the current session, its last chunk numbered `last`.
  void Sent(Item* item, uint64_t last, Clock::time_point now) {
    item->sent.emplace_back(session_, last);
    if (oldest_unacked_ == Clock::time_point::max()) oldest_unacked_ = now;
  }

  // A new session offered (the first, or one after a RESET), named
  // `session` (the offer's ephemeral public key).
  void Offer(const std::string& session, Clock::time_point now) {
    state_ = State::kOffering;
    session_ = session;
    offered_ = now;
    wait_ = kFirstWait;
    probes_ = 0;
  }
  // The WELCOME of the session offered: the receiver took every message of
  // session `quoted` up to sequence number `taken` (an empty `quoted`: it
  // knows no earlier session of this connection). Returns the messages to
  // send again, in order; `lost` counts those sent in a session it does not
  // know (a receiver restarted in between: the protocol above resends
  // what it needs, docs/failures.md), which are let go.
  std::vector<Item*> Welcome(const std::string& quoted, uint64_t taken,
                             Clock::time_point now, size_t* lost) {
    *lost = 0;
    auto settled = [&](const Item& item) {
      if (quoted.empty()) {
        const bool old = !item.sent.empty();
        if (old) ++*lost;
        return old;
      }
      return std::any_of(item.sent.begin(), item.sent.end(),
                         [&](const auto& s) {
                           return s.first == quoted && s.second <= taken;
                         });
    };
    items_.erase(std::remove_if(items_.begin(), items_.end(), settled),
                 items_.end());
    state_ = State::kOpen;
    confirmed_ = session_;
    resumed_ = true;
    wait_ = kFirstWait;
    probes_ = 0;
    oldest_unacked_ = items_.empty() ? Clock::time_point::max() : now;
    std::vector<Item*> again;
    for (Item& item : items_) again.push_back(&item);
    return again;
  }
  // An ACK of the current session: everything up to `taken` arrived.
  void Ack(uint64_t taken, Clock::time_point now) {
    while (!items_.empty() && !items_.front().sent.empty() &&
           items_.front().sent.back().first == session_ &&
           items_.front().sent.back().second <= taken) {
      items_.pop_front();
    }
    wait_ = kFirstWait;
    probes_ = 0;
    last_probe_ = Clock::time_point();  // none since the ACK
    oldest_unacked_ = items_.empty() ? Clock::time_point::max() : now;
  }

  // What the timer asks for now.
  enum class Due { kNothing, kOfferAgain, kProbe, kNewSession };
  Due Tick(Clock::time_point now) {
    if (state_ == State::kOffering) {
      if (now - offered_ < wait_) return Due::kNothing;
      offered_ = now;
      wait_ = std::min<Clock::duration>(2 * wait_, kMostWait);
      return Due::kOfferAgain;
    }
    if (oldest_unacked_ == Clock::time_point::max() ||
        now - oldest_unacked_ < wait_ || now - last_probe_ < wait_) {
      return Due::kNothing;
    }
    last_probe_ = now;
    wait_ = std::min<Clock::duration>(2 * wait_, kMostWait);
    return ++probes_ > kProbesPerSession ? Due::kNewSession : Due::kProbe;
  }

  size_t size() const { return items_.size(); }

 private:
  std::deque<Item> items_;  // in the order they were added
  State state_ = State::kOffering;
  std::string session_;    // the session now (offered or open)
  std::string confirmed_;  // the last session welcomed
  bool resumed_ = false;
  Clock::time_point offered_;
  Clock::time_point last_probe_;  // the epoch: none since the last ACK
  Clock::time_point oldest_unacked_ = Clock::time_point::max();
  Clock::duration wait_ = kFirstWait;
  int probes_ = 0;
};

}  // namespace ps

#endif  // PS_SRC_VAN_STREAM_H_
