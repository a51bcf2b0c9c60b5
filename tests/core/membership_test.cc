// Membership (src/postoffice/membership.h) fed inputs, without sockets:
// every legal transition taken, every other one refused, the events and
// their order, liveness ticks.
#include "postoffice/membership.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "postoffice/replica_chain.h"

namespace ps {
namespace core {
namespace {

using Clock = Membership::Clock;
constexpr int kWorker0 = 9;  // WorkerRankToId(0)
constexpr int kServer0 = 8;
constexpr int kServer1 = 10;

constexpr PeerState kStates[] = {
    PeerState::kAbsent,    PeerState::kJoining,   PeerState::kLive,
    PeerState::kSuspected, PeerState::kAwaited,   PeerState::kDead,
    PeerState::kCovered,   PeerState::kRejoining, PeerState::kDeparted};
constexpr PeerInput kInputs[] = {PeerInput::kRegister, PeerInput::kAdmit,
                                 PeerInput::kSilent,   PeerInput::kHeard,
                                 PeerInput::kAwait,    PeerInput::kLose,
                                 PeerInput::kCover,    PeerInput::kRejoin,
                                 PeerInput::kRejoined, PeerInput::kDepart};

// The shortest list of inputs that takes a new node to `target` by the
// table (breadth first from kAbsent).
std::vector<PeerInput> PathTo(PeerState target) {
  std::map<PeerState, std::vector<PeerInput>> path{{PeerState::kAbsent, {}}};
  std::deque<PeerState> todo{PeerState::kAbsent};
  while (!todo.empty()) {
    PeerState s = todo.front();
    todo.pop_front();
    for (const PeerTransition& t : kPeerTransitions) {
      if (t.from != s || path.count(t.to) > 0) continue;
      path[t.to] = path[s];
      path[t.to].push_back(t.input);
      todo.push_back(t.to);
    }
  }
  EXPECT_EQ(path.count(target), 1u) << PeerStateName(target);
  return path[target];
}

// Drives node `id` of `m` to `target`; kSilent and kHeard (which Tick and
// Heard take without an event) go through Apply too.
void DriveTo(Membership* m, int id, PeerState target) {
  std::vector<PeerEvent> events;
  for (PeerInput in : PathTo(target)) {
    ASSERT_TRUE(m->Apply(id, in, "test", &events).ok());
  }
  ASSERT_EQ(m->state(id), target);
}

TEST(Membership, EveryStateButAbsentIsReachable) {
  for (PeerState s : kStates) {
    if (s == PeerState::kAbsent) continue;
    EXPECT_FALSE(PathTo(s).empty()) << PeerStateName(s);
  }
}

TEST(Membership, EveryLegalTransitionIsTakenWithItsEvent) {
  for (const PeerTransition& t : kPeerTransitions) {
    SCOPED_TRACE(std::string(PeerStateName(t.from)) + " " +
                 PeerInputName(t.input));
    Membership m;
    if (t.from != PeerState::kAbsent) DriveTo(&m, kServer0, t.from);
    std::vector<PeerEvent> events;
    ASSERT_TRUE(m.Apply(kServer0, t.input, "why", &events, kServer1).ok());
    EXPECT_EQ(m.state(kServer0), t.to);
    const bool eventful =
        t.to == PeerState::kAwaited || t.to == PeerState::kDead ||
        t.to == PeerState::kCovered || t.to == PeerState::kDeparted ||
        (t.to == PeerState::kLive && t.from != PeerState::kSuspected);
    ASSERT_EQ(events.size(), eventful ? 1u : 0u);
    if (!eventful) continue;
    const PeerEvent& e = events[0];
    EXPECT_EQ(e.id, kServer0);
    EXPECT_EQ(e.from, t.from);
    EXPECT_EQ(e.to, t.to);
    EXPECT_EQ(e.why, "why");
    EXPECT_EQ(e.by, t.to == PeerState::kCovered ? kServer1 : -1);
  }
}

TEST(Membership, EveryIllegalTransitionIsRefusedAndChangesNothing) {
  int refused = 0;
  for (PeerState from : kStates) {
    for (PeerInput in : kInputs) {
      if (NextPeerState(from, in) != PeerState::kAbsent) continue;
      SCOPED_TRACE(std::string(PeerStateName(from)) + " " + PeerInputName(in));
      Membership m;
      if (from != PeerState::kAbsent) DriveTo(&m, kWorker0, from);
      const Clock::time_point since = m.since(kWorker0);
      std::vector<PeerEvent> events;
      Status st = m.Apply(kWorker0, in, "from the network", &events);
      EXPECT_EQ(st.code(), Status::kInvalidArgument);
      EXPECT_NE(st.message().find("worker 0"), std::string::npos) << st;
      EXPECT_NE(st.message().find(PeerStateName(from)), std::string::npos);
      EXPECT_TRUE(events.empty());
      EXPECT_EQ(m.state(kWorker0), from);
      EXPECT_EQ(m.since(kWorker0), since);
      ++refused;
    }
  }
  // 9 states x 10 inputs, less the legal ones.
  EXPECT_EQ(refused, 90 - static_cast<int>(std::size(kPeerTransitions)));
}

TEST(Membership, TableHasOneRowPerStateAndInput) {
  for (const PeerTransition& a : kPeerTransitions) {
    EXPECT_NE(a.to, PeerState::kAbsent);
    int rows = 0;
    for (const PeerTransition& b : kPeerTransitions) {
      rows += a.from == b.from && a.input == b.input ? 1 : 0;
    }
    EXPECT_EQ(rows, 1) << PeerStateName(a.from) << " "
                       << PeerInputName(a.input);
  }
}

TEST(Membership, DepartedIsFinal) {
  Membership m;
  DriveTo(&m, kWorker0, PeerState::kDeparted);
  for (PeerInput in : kInputs) {
    std::vector<PeerEvent> events;
    EXPECT_FALSE(m.Apply(kWorker0, in, "late", &events).ok())
        << PeerInputName(in);
    EXPECT_TRUE(events.empty());
  }
  EXPECT_EQ(m.state(kWorker0), PeerState::kDeparted);
  EXPECT_FALSE(m.IsDown(kWorker0));
}

TEST(Membership, DeadForGoodNeverComesBack) {
  Membership m;
  DriveTo(&m, kWorker0, PeerState::kDead);
  std::vector<PeerEvent> events;
  EXPECT_FALSE(m.Apply(kWorker0, PeerInput::kRejoin, "", &events).ok());
  EXPECT_FALSE(m.Apply(kWorker0, PeerInput::kRejoined, "", &events).ok());
  EXPECT_FALSE(m.Apply(kWorker0, PeerInput::kLose, "twice", &events).ok());
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(m.IsDown(kWorker0));
}

TEST(Membership, RejoinAfterDeathTellsLostThenRejoined) {
  Membership m;
  std::vector<PeerEvent> events;
  ASSERT_TRUE(
      m.Apply(kWorker0, PeerInput::kRegister, "rendezvous", &events).ok());
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kAdmit, "", &events).ok());
  ASSERT_TRUE(
      m.Apply(kWorker0, PeerInput::kAwait, "its connection closed", &events)
          .ok());
  EXPECT_TRUE(m.IsDown(kWorker0));
  // Its successor registers, then dies while it rejoins; the next one
  // makes it.
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kRejoin, "", &events).ok());
  EXPECT_FALSE(m.IsDown(kWorker0));
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kAwait, "gone again", &events).ok());
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kRejoin, "", &events).ok());
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kRejoined, "", &events).ok());
  EXPECT_EQ(m.state(kWorker0), PeerState::kLive);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, PeerEvent::kPeerJoined);
  EXPECT_EQ(events[1].kind, PeerEvent::kPeerLost);
  EXPECT_TRUE(events[1].awaited());
  EXPECT_EQ(events[1].why, "its connection closed");
  EXPECT_EQ(events[2].kind, PeerEvent::kPeerLost);
  EXPECT_TRUE(events[2].awaited());
  EXPECT_EQ(events[2].from, PeerState::kRejoining);
  EXPECT_EQ(events[3].kind, PeerEvent::kPeerRejoined);
  EXPECT_EQ(events[3].from, PeerState::kRejoining);
}

TEST(Membership, AwaitedNotBackIsLostForGood) {
  Membership m;
  DriveTo(&m, kWorker0, PeerState::kAwaited);
  std::vector<PeerEvent> events;
  ASSERT_TRUE(
      m.Apply(kWorker0, PeerInput::kLose, "not back in time", &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, PeerEvent::kPeerLost);
  EXPECT_FALSE(events[0].awaited());
  EXPECT_EQ(events[0].from, PeerState::kAwaited);
}

TEST(Membership, CoveredAfterDeadAndAtOnce) {
  Membership m;
  DriveTo(&m, kServer0, PeerState::kDead);
  std::vector<PeerEvent> events;
  ASSERT_TRUE(
      m.Apply(kServer0, PeerInput::kCover, "replica", &events, kServer1).ok());
  DriveTo(&m, kServer1, PeerState::kLive);
  ASSERT_TRUE(
      m.Apply(kServer1, PeerInput::kCover, "replica", &events, kServer0).ok());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, PeerEvent::kPeerCovered);
  EXPECT_EQ(events[0].from, PeerState::kDead);
  EXPECT_EQ(events[0].by, kServer1);
  EXPECT_EQ(events[1].from, PeerState::kLive);
  EXPECT_EQ(events[1].by, kServer0);
  EXPECT_TRUE(m.IsDown(kServer0));
  EXPECT_EQ(m.Count({PeerState::kCovered}), 2);
  EXPECT_EQ(m.InState(PeerState::kCovered), (std::vector<int>{8, 10}));
  // Covered is final but for nothing: no death, no rejoin.
  EXPECT_FALSE(m.Apply(kServer0, PeerInput::kLose, "", &events).ok());
  EXPECT_FALSE(m.Apply(kServer0, PeerInput::kRejoin, "", &events).ok());
}

TEST(Membership, SubscribersGetEventsInOrderUnderNoLock) {
  Membership m;
  std::vector<std::string> seen;
  m.Subscribe([&](const PeerEvent& e) {
    // Under no lock of the membership: asking it back does not deadlock.
    seen.push_back(std::string("a ") + PeerEventName(e.kind) + " " +
                   PeerStateName(m.state(e.id)));
  });
  const int b = m.Subscribe([&](const PeerEvent& e) {
    seen.push_back(std::string("b ") + PeerEventName(e.kind));
  });
  std::vector<PeerEvent> events;
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kRegister, "", &events).ok());
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kAdmit, "", &events).ok());
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kDepart, "bye", &events).ok());
  EXPECT_TRUE(seen.empty());  // Apply tells nobody
  m.Publish(events);
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "a PeerJoined departed", "b PeerJoined",
                      "a PeerDeparted departed", "b PeerDeparted"}));
  m.Unsubscribe(b);
  seen.clear();
  m.Publish(events);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(Membership, EventsASubscriberCausesComeAfterTheOneItReactsTo) {
  Membership m;
  DriveTo(&m, kWorker0, PeerState::kLive);
  std::vector<std::string> seen;
  // The first subscriber lets the lost worker rejoin at once, as the
  // scheduler's rejoin protocol does when the successor waits already.
  m.Subscribe([&](const PeerEvent& e) {
    seen.push_back(std::string("a ") + PeerEventName(e.kind));
    if (e.kind != PeerEvent::kPeerLost) return;
    std::vector<PeerEvent> mine;
    ASSERT_TRUE(m.Apply(e.id, PeerInput::kRejoin, "", &mine).ok());
    ASSERT_TRUE(m.Apply(e.id, PeerInput::kRejoined, "", &mine).ok());
    m.Publish(mine);
  });
  m.Subscribe([&](const PeerEvent& e) {
    seen.push_back(std::string("b ") + PeerEventName(e.kind));
  });
  std::vector<PeerEvent> events;
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kAwait, "", &events).ok());
  m.Publish(events);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"a PeerLost", "b PeerLost",
                                      "a PeerRejoined", "b PeerRejoined"}));
}

TEST(Membership, TicksSuspectThenNameTheSilent) {
  Membership m;
  const Clock::time_point t0 = Clock::now();
  DriveTo(&m, kServer0, PeerState::kLive);
  DriveTo(&m, kWorker0, PeerState::kLive);
  DriveTo(&m, kServer1, PeerState::kLive);  // never watched
  m.Watch(kServer0, t0);
  m.Watch(kWorker0, t0);
  const auto ms = [](int n) { return std::chrono::milliseconds(n); };
  EXPECT_TRUE(m.Tick(t0 + ms(40), ms(50), ms(100)).empty());
  EXPECT_EQ(m.state(kServer0), PeerState::kLive);
  m.Heard(kWorker0, t0 + ms(50));
  EXPECT_TRUE(m.Tick(t0 + ms(60), ms(50), ms(100)).empty());
  EXPECT_EQ(m.state(kServer0), PeerState::kSuspected);
  EXPECT_EQ(m.state(kWorker0), PeerState::kLive);
  m.Heard(kServer0, t0 + ms(70));  // back before its deadline
  EXPECT_EQ(m.state(kServer0), PeerState::kLive);
  EXPECT_EQ(m.Tick(t0 + ms(160), ms(50), ms(100)),
            (std::vector<int>{kWorker0}));
  // This node itself stalled: nobody's silence until now counts.
  m.ForgiveSilence(t0 + ms(500));
  EXPECT_TRUE(m.Tick(t0 + ms(520), ms(50), ms(100)).empty());
  // A shorter stall excuses its own length of silence only.
  m.ExcuseStall(ms(60), t0 + ms(590));  // heard at 500: counts from 560
  EXPECT_TRUE(m.Tick(t0 + ms(650), ms(50), ms(100)).empty());
  EXPECT_EQ(m.Tick(t0 + ms(661), ms(50), ms(100)),
            (std::vector<int>{kServer0, kWorker0}));
  // The dead are not watched.
  std::vector<PeerEvent> events;
  ASSERT_TRUE(m.Apply(kWorker0, PeerInput::kLose, "", &events).ok());
  EXPECT_EQ(m.Tick(t0 + ms(700), ms(50), ms(100)),
            (std::vector<int>{kServer0}));
}

TEST(Membership, ConcurrentInputsAndPublishes) {
  Membership m;
  std::atomic<int> told{0};
  m.Subscribe([&](const PeerEvent&) { told.fetch_add(1); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 50; ++i) {
        const int id = WorkerRankToId(t * 50 + i);
        std::vector<PeerEvent> events;
        m.Apply(id, PeerInput::kRegister, "", &events).IgnoreError();
        m.Apply(id, PeerInput::kAdmit, "", &events).IgnoreError();
        m.Heard(id, Clock::now());
        m.Apply(id, PeerInput::kLose, "", &events).IgnoreError();
        m.Publish(events);
        m.Tick(Clock::now(), std::chrono::seconds(1), std::chrono::seconds(2));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(told.load(), 400);
  EXPECT_EQ(m.Count({PeerState::kDead}), 200);
}

// The KV rule that decides between covered and dead
// (src/postoffice/replica_chain.h).
TEST(ReplicaChain, ADeadServersKeysAreHeldWhileItsChainLives) {
  std::set<int> down;
  auto is_down = [&](int rank) { return down.count(rank) > 0; };
  // Three servers: 0 -> 1 -> 2 -> 0.
  EXPECT_EQ(detail::CoveringServer(0, 3, is_down), 1);
  down = {2};  // 0 holds 2's keys: losing 0 too loses them
  EXPECT_EQ(detail::CoveringServer(0, 3, is_down), -1);
  EXPECT_EQ(detail::CoveringServer(1, 3, is_down), -1);  // its replica is 2
  down = {1};                                            // 2 holds 1's keys
  EXPECT_EQ(detail::CoveringServer(2, 3, is_down), -1);
  down.clear();
  EXPECT_EQ(detail::CoveringServer(2, 3, is_down), 0);
  // One server holds nothing twice; two cover each other.
  EXPECT_EQ(detail::CoveringServer(0, 1, is_down), -1);
  EXPECT_EQ(detail::CoveringServer(1, 2, is_down), 0);
}

TEST(ReplicaChain, OnlyTheChainsNeighboursTradeReplicaTraffic) {
  // At server 1 of 3: pushes forwarded by its primary 0, answers of its
  // replica 2.
  EXPECT_TRUE(detail::IsReplicaTraffic(true, 0, 1, 3));
  EXPECT_FALSE(detail::IsReplicaTraffic(true, 2, 1, 3));
  EXPECT_TRUE(detail::IsReplicaTraffic(false, 2, 1, 3));
  EXPECT_FALSE(detail::IsReplicaTraffic(false, 0, 1, 3));
}

}  // namespace
}  // namespace core
}  // namespace ps
