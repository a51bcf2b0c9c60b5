// Membership: the node-state table and its transitions (membership.h).
#include "postoffice/membership.h"

#include <glog/logging.h>

#include <deque>
#include <utility>

namespace ps {
namespace core {

namespace {

int64_t Ms(Membership::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// The event a transition into `to` from `from` causes, if any.
bool EventOf(PeerState from, PeerState to, PeerEvent::Kind* kind) {
  switch (to) {
    case PeerState::kLive:
      if (from == PeerState::kJoining) {
        *kind = PeerEvent::kPeerJoined;
        return true;
      }
      if (from == PeerState::kAwaited || from == PeerState::kRejoining) {
        *kind = PeerEvent::kPeerRejoined;
        return true;
      }
      return false;  // no longer suspected
    case PeerState::kAwaited:
    case PeerState::kDead:
      *kind = PeerEvent::kPeerLost;
      return true;
    case PeerState::kCovered:
      *kind = PeerEvent::kPeerCovered;
      return true;
    case PeerState::kDeparted:
      *kind = PeerEvent::kPeerDeparted;
      return true;
    default:
      return false;
  }
}

}  // namespace

const char* PeerStateName(PeerState state) {
  switch (state) {
    case PeerState::kAbsent:
      return "absent";
    case PeerState::kJoining:
      return "joining";
    case PeerState::kLive:
      return "live";
    case PeerState::kSuspected:
      return "suspected";
    case PeerState::kAwaited:
      return "awaited";
    case PeerState::kDead:
      return "dead";
    case PeerState::kCovered:
      return "covered";
    case PeerState::kRejoining:
      return "rejoining";
    case PeerState::kDeparted:
      return "departed";
  }
  return "unknown";
}

const char* PeerInputName(PeerInput input) {
  switch (input) {
    case PeerInput::kRegister:
      return "register";
    case PeerInput::kAdmit:
      return "admit";
    case PeerInput::kSilent:
      return "silent";
    case PeerInput::kHeard:
      return "heard";
    case PeerInput::kAwait:
      return "await";
    case PeerInput::kLose:
      return "lose";
    case PeerInput::kCover:
      return "cover";
    case PeerInput::kRejoin:
      return "rejoin";
    case PeerInput::kRejoined:
      return "rejoined";
    case PeerInput::kDepart:
      return "depart";
  }
  return "unknown";
}

const char* PeerEventName(PeerEvent::Kind kind) {
  switch (kind) {
    case PeerEvent::kPeerJoined:
      return "PeerJoined";
    case PeerEvent::kPeerLost:
      return "PeerLost";
    case PeerEvent::kPeerCovered:
      return "PeerCovered";
    case PeerEvent::kPeerRejoined:
      return "PeerRejoined";
    case PeerEvent::kPeerDeparted:
      return "PeerDeparted";
    case PeerEvent::kStopped:
      return "Stopped";
  }
  return "unknown";
}

void Membership::set_self(int self) {
  MutexLock lock(&mu_);
  self_ = self;
}

std::string Membership::SelfLocked() const {
  return self_ == 0 ? std::string() : DescribeId(self_) + ": ";
}

Status Membership::Apply(int id, PeerInput input, const std::string& why,
                         std::vector<PeerEvent>* events, int by,
                         const Status& status) {
  CHECK(events != nullptr);
  std::string line;
  MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  const PeerState from =
      it == nodes_.end() ? PeerState::kAbsent : it->second.state;
  const PeerState to = NextPeerState(from, input);
  if (to == PeerState::kAbsent) {
    return Status::InvalidArgument("membership: " + DescribeId(id) + " is " +
                                   PeerStateName(from) + "; it cannot " +
                                   PeerInputName(input) + " (" + why + ")");
  }
  Record& r = nodes_[id];
  const Clock::time_point now = advanced_ ? now_ : Clock::now();
  r.state = to;
  r.reason = why;
  r.by = to == PeerState::kCovered ? by : -1;
  r.status = status;
  r.since = now;
  if (from == PeerState::kAbsent) r.last_heard = now;
  line = SelfLocked() + "membership: " + DescribeId(id) + " " +
         PeerStateName(from) + " -> " + PeerStateName(to) +
         (by >= 0 && to == PeerState::kCovered ? " by " + DescribeId(by)
                                               : std::string()) +
         (why.empty() ? std::string() : ": " + why);
  PeerEvent::Kind kind;
  if (EventOf(from, to, &kind)) {
    PeerEvent event{kind, id, from, to, why, -1, status};
    if (kind == PeerEvent::kPeerCovered) event.by = by;
    events->push_back(std::move(event));
  }
  lock.Unlock();
  // One line per transition, naming the node by role and rank, written
  // under no lock of ours. Joining and admission happen to every node at
  // every node (N * N lines at start): verbose only.
  if (to == PeerState::kJoining ||
      (from == PeerState::kJoining && to == PeerState::kLive)) {
    VLOG(1) << line;
  } else {
    LOG(INFO) << line;
  }
  return Status::OK();
}

void Membership::Publish(const std::vector<PeerEvent>& events) {
  if (events.empty()) return;
  // The events this thread is delivering now, per membership.
  struct Delivery {
    const Membership* owner;
    std::deque<PeerEvent>* queue;
    Delivery* outer;
  };
  thread_local Delivery* delivering = nullptr;
  for (Delivery* d = delivering; d != nullptr; d = d->outer) {
    if (d->owner != this) continue;
    d->queue->insert(d->queue->end(), events.begin(), events.end());
    return;  // a subscriber's: after the event it reacts to
  }
  std::deque<PeerEvent> queue(events.begin(), events.end());
  Delivery mine{this, &queue, delivering};
  delivering = &mine;
  while (!queue.empty()) {
    const PeerEvent event = std::move(queue.front());
    queue.pop_front();
    std::vector<Subscriber> subscribers;
    {
      MutexLock lock(&mu_);
      for (const auto& [handle, s] : subscribers_) subscribers.push_back(s);
    }
    for (const Subscriber& s : subscribers) s(event);
  }
  delivering = mine.outer;
}

int Membership::Subscribe(Subscriber subscriber) {
  MutexLock lock(&mu_);
  subscribers_[next_handle_] = std::move(subscriber);
  return next_handle_++;
}

void Membership::Unsubscribe(int handle) {
  MutexLock lock(&mu_);
  subscribers_.erase(handle);
}

void Membership::Watch(int id, Clock::time_point now) {
  MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  it->second.watched = true;
  it->second.last_heard = now;
}

void Membership::Advance(Clock::time_point now) {
  MutexLock lock(&mu_);
  advanced_ = true;
  now_ = now;
}

void Membership::Heard(int id, Clock::time_point now) {
  MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Record& r = it->second;
  r.last_heard = now;
  if (r.state != PeerState::kSuspected) return;
  r.state = PeerState::kLive;
  r.reason = "heard from again";
  r.since = now;
  const std::string line = SelfLocked() + "membership: " + DescribeId(id) +
                           " suspected -> live: " + r.reason;
  lock.Unlock();
  LOG(INFO) << line;
}

void Membership::ForgiveSilence(Clock::time_point now) {
  MutexLock lock(&mu_);
  for (auto& [id, r] : nodes_) r.last_heard = now;
}

void Membership::ExcuseStall(Clock::duration stalled, Clock::time_point now) {
  MutexLock lock(&mu_);
  for (auto& [id, r] : nodes_)
    r.last_heard = std::min(now, r.last_heard + stalled);
}

std::vector<int> Membership::Tick(Clock::time_point now,
                                  Clock::duration suspect_after,
                                  Clock::duration dead_after) {
  std::vector<int> silent;
  std::vector<std::string> lines;
  MutexLock lock(&mu_);
  for (auto& [id, r] : nodes_) {
    // (A rejoining node sends no heartbeat before it has the node table;
    // its connection's loss is its death until then.)
    if (!r.watched ||
        (r.state != PeerState::kLive && r.state != PeerState::kSuspected)) {
      continue;
    }
    const Clock::duration quiet = now - r.last_heard;
    if (quiet > dead_after) {
      silent.push_back(id);
    } else if (quiet > suspect_after && r.state == PeerState::kLive) {
      r.state = PeerState::kSuspected;
      r.reason = "silent for " + std::to_string(Ms(quiet)) + " ms";
      r.since = now;
      lines.push_back(SelfLocked() + "membership: " + DescribeId(id) +
                      " live -> suspected: " + r.reason);
    }
  }
  lock.Unlock();
  for (const std::string& line : lines) LOG(INFO) << line;
  return silent;
}

std::vector<Membership::PeerView> Membership::Peers() const {
  MutexLock lock(&mu_);
  std::vector<PeerView> peers;
  for (const auto& [id, r] : nodes_) {
    if (id != self_) peers.push_back({id, r.state, r.watched, r.last_heard});
  }
  return peers;
}

PeerState Membership::state(int id) const {
  MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  return it == nodes_.end() ? PeerState::kAbsent : it->second.state;
}

Membership::Clock::time_point Membership::since(int id) const {
  MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  return it == nodes_.end() ? Clock::time_point() : it->second.since;
}

namespace {
bool DownState(PeerState s) {
  return s == PeerState::kAwaited || s == PeerState::kDead ||
         s == PeerState::kCovered;
}
}  // namespace

bool Membership::IsDown(int id) const { return DownState(state(id)); }

std::vector<Membership::DownPeer> Membership::Down() const {
  std::vector<DownPeer> down;
  MutexLock lock(&mu_);
  for (const auto& [id, r] : nodes_) {
    if (!DownState(r.state)) continue;
    down.push_back({id, r.state, r.by,
                    r.status.ok() ? Status::PeerFailed(DescribeId(id) + " is " +
                                                       PeerStateName(r.state) +
                                                       ": " + r.reason)
                                  : r.status});
  }
  return down;
}

std::vector<int> Membership::InState(PeerState state) const {
  std::vector<int> ids;
  MutexLock lock(&mu_);
  for (const auto& [id, r] : nodes_) {
    if (r.state == state) ids.push_back(id);
  }
  return ids;
}

int Membership::Count(std::initializer_list<PeerState> states) const {
  int n = 0;
  MutexLock lock(&mu_);
  for (const auto& [id, r] : nodes_) {
    for (PeerState s : states) n += r.state == s ? 1 : 0;
  }
  return n;
}

void Membership::Clear() {
  MutexLock lock(&mu_);
  nodes_.clear();
}

}  // namespace core
}  // namespace ps
