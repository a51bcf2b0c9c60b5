// BarrierCoordinator (src/postoffice/barrier_coordinator.h) fed arrivals,
// membership events and ticks, and a node's own BarrierWaits
// (barrier_waits.h), without sockets.
#include "postoffice/barrier_coordinator.h"

#include <gtest/gtest.h>

#include <map>

#include "postoffice/barrier_waits.h"
#include "postoffice/node_table.h"

namespace ps {
namespace core {
namespace {

using Clock = BarrierCoordinator::Clock;
using Release = BarrierCoordinator::Release;

// Scheduler, servers 0 and 1, workers 0 and 1; states kept by the test.
// The timeout is 1000 ms, the report interval 300 ms.
class BarrierCoordinatorTest : public ::testing::Test {
 protected:
  BarrierCoordinatorTest()
      : coordinator_({[](int group) { return Ids(group); },
                      [this](int id) {
                        auto it = states_.find(id);
                        return it == states_.end() ? PeerState::kLive
                                                   : it->second;
                      },
                      [](int id) { return DescribeId(id); }},
                     1000, 300) {}

  static std::vector<int> Ids(int group) {
    std::vector<int> ids;
    for (int id : {kSchedulerId, kServer0, kServer1, kWorker0, kWorker1}) {
      if (GroupContains(group, id)) ids.push_back(id);
    }
    return ids;
  }
  PeerEvent Event(PeerEvent::Kind kind, int id, PeerState to) {
    states_[id] = to;
    return PeerEvent{kind,
                     id,
                     PeerState::kLive,
                     to,
                     "test",
                     -1,
                     Status::PeerFailed(DescribeId(id) + " is gone")};
  }

  static constexpr int kServer0 = 8, kServer1 = 10, kWorker0 = 9, kWorker1 = 11;
  const Clock::time_point t0_ = Clock::now();
  std::map<int, PeerState> states_;
  BarrierCoordinator coordinator_;
};

TEST_F(BarrierCoordinatorTest, ReleasesOnceEveryMemberArrived) {
  EXPECT_TRUE(coordinator_.Arrive(kWorkerGroup, kWorker1, t0_).empty());
  EXPECT_TRUE(coordinator_.Arrive(kWorkerGroup, kWorker1, t0_).empty());
  EXPECT_TRUE(coordinator_.waiting(kWorkerGroup));
  std::vector<Release> r = coordinator_.Arrive(kWorkerGroup, kWorker0, t0_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].group, kWorkerGroup);
  EXPECT_TRUE(r[0].status.ok());
  EXPECT_EQ(r[0].arrived, (std::vector<int>{kWorker0, kWorker1}));
  EXPECT_FALSE(coordinator_.waiting(kWorkerGroup));
}

TEST_F(BarrierCoordinatorTest, AMemberLostForGoodFailsItsBarriersOnly) {
  coordinator_.Arrive(kAllGroups, kSchedulerId, t0_);
  coordinator_.Arrive(kServerGroup, kServer1, t0_);
  coordinator_.Arrive(kWorkerGroup, kWorker1, t0_);
  std::vector<Release> r = coordinator_.OnPeerEvent(
      Event(PeerEvent::kPeerLost, kWorker0, PeerState::kDead));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].group, kWorkerGroup);
  EXPECT_EQ(r[1].group, kAllGroups);
  for (const Release& each : r) {
    EXPECT_EQ(each.status.code(), Status::kPeerFailed);
    EXPECT_NE(each.status.message().find("cannot complete: worker 0 is gone"),
              std::string::npos)
        << each.status;
  }
  EXPECT_TRUE(coordinator_.waiting(kServerGroup));
  // A later arrival in a group with a dead member fails at once.
  r = coordinator_.Arrive(kWorkerGroup, kWorker1, t0_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].status.message().find("worker 0 is dead"), std::string::npos);
}

TEST_F(BarrierCoordinatorTest, AnAwaitedMemberIsWaitedFor) {
  coordinator_.Arrive(kWorkerGroup, kWorker1, t0_);
  EXPECT_TRUE(coordinator_
                  .OnPeerEvent(Event(PeerEvent::kPeerLost, kWorker0,
                                     PeerState::kAwaited))
                  .empty());
  EXPECT_TRUE(coordinator_.Arrive(kWorkerGroup, kWorker1, t0_).empty());
  states_[kWorker0] = PeerState::kLive;  // rejoined
  EXPECT_EQ(coordinator_.Arrive(kWorkerGroup, kWorker0, t0_).size(), 1u);
}

TEST_F(BarrierCoordinatorTest, AServerTakenOverIsNotWaitedFor) {
  coordinator_.Arrive(kServerGroup, kServer1, t0_);
  std::vector<Release> r = coordinator_.OnPeerEvent(
      Event(PeerEvent::kPeerCovered, kServer0, PeerState::kCovered));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].status.ok());
  EXPECT_EQ(r[0].arrived, (std::vector<int>{kServer1}));
  // And later barriers complete without it.
  EXPECT_EQ(coordinator_.Arrive(kServerGroup, kServer1, t0_).size(), 1u);
}

TEST_F(BarrierCoordinatorTest, TimeoutNamesWhoIsMissing) {
  coordinator_.Arrive(kAllGroups, kWorker0, t0_);
  coordinator_.Arrive(kAllGroups, kServer0, t0_ + std::chrono::seconds(1));
  EXPECT_TRUE(coordinator_.Tick(t0_ + std::chrono::milliseconds(999)).empty());
  std::vector<Release> r =
      coordinator_.Tick(t0_ + std::chrono::milliseconds(1001));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.code(), Status::kTimeout);
  EXPECT_NE(r[0].status.message().find(
                "timed out after 1000 ms (PS_BARRIER_TIMEOUT_MS); missing: "
                "scheduler, server 1, worker 1"),
            std::string::npos)
      << r[0].status;
  EXPECT_EQ(r[0].arrived, (std::vector<int>{kServer0, kWorker0}));
  EXPECT_FALSE(coordinator_.waiting(kAllGroups));
}

// While a barrier waits, each report interval names who has not arrived
// (a member whose BARRIER never came is named at the first), with the state
// of one not live; one taken over is not waited for, so not named.
TEST_F(BarrierCoordinatorTest, ReportsWhoIsMissingOncePerInterval) {
  using std::chrono::milliseconds;
  coordinator_.Arrive(kAllGroups, kWorker0, t0_);
  coordinator_.Arrive(kAllGroups, kSchedulerId, t0_ + milliseconds(100));
  states_[kServer1] = PeerState::kSuspected;
  EXPECT_TRUE(coordinator_.Reports(t0_ + milliseconds(299)).empty());
  std::vector<BarrierCoordinator::Report> r =
      coordinator_.Reports(t0_ + milliseconds(300));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].group, kAllGroups);
  EXPECT_EQ(r[0].waited_ms, 300);
  EXPECT_EQ(r[0].line,
            "barrier of workers+servers+scheduler: waiting 0.3 s for server "
            "0, server 1 (suspected), worker 1 (2 of 5 arrived; "
            "PS_BARRIER_TIMEOUT_MS=1000)");
  EXPECT_TRUE(coordinator_.Reports(t0_ + milliseconds(599)).empty());
  coordinator_.Arrive(kAllGroups, kServer0, t0_ + milliseconds(550));
  EXPECT_TRUE(coordinator_
                  .OnPeerEvent(Event(PeerEvent::kPeerCovered, kServer1,
                                     PeerState::kCovered))
                  .empty());
  r = coordinator_.Reports(t0_ + milliseconds(700));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].line,
            "barrier of workers+servers+scheduler: waiting 0.7 s for worker 1 "
            "(3 of 5 arrived; PS_BARRIER_TIMEOUT_MS=1000)");
  EXPECT_EQ(coordinator_.Missing(kAllGroups), "worker 1");
  // The late one arrives: released, and reported no more.
  std::vector<Release> done =
      coordinator_.Arrive(kAllGroups, kWorker1, t0_ + milliseconds(800));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_TRUE(coordinator_.Reports(t0_ + milliseconds(2000)).empty());
}

// A member's waits: a release counts for those who entered before it; a
// restarted scheduler gets again only the barriers not released since.
TEST(BarrierWaits, ReleasesCountForEarlierEntriesAndResendTheRest) {
  BarrierWaits waits;
  const BarrierWaits::Ticket a = waits.Enter(kWorkerGroup);
  const BarrierWaits::Ticket b = waits.Enter(kAllGroups);
  EXPECT_FALSE(waits.Released(a));
  EXPECT_EQ(waits.ToResend(), (std::vector<int>{kWorkerGroup, kAllGroups}));
  waits.Release(kWorkerGroup, Status::OK());
  EXPECT_TRUE(waits.Released(a));
  EXPECT_TRUE(waits.StatusOf(a).ok());
  EXPECT_FALSE(waits.Released(b));
  // a's waiter has not woken yet: released, so not sent again.
  EXPECT_EQ(waits.ToResend(), std::vector<int>{kAllGroups});
  waits.Leave(a);
  // A later entry of the same group waits for the next release, which
  // carries its own status.
  const BarrierWaits::Ticket c = waits.Enter(kWorkerGroup);
  EXPECT_FALSE(waits.Released(c));
  EXPECT_EQ(waits.ToResend(), (std::vector<int>{kWorkerGroup, kAllGroups}));
  waits.Release(kWorkerGroup, Status::PeerFailed("worker 1 died"));
  EXPECT_TRUE(waits.Released(c));
  EXPECT_EQ(waits.StatusOf(c).code(), Status::kPeerFailed);
  waits.Leave(c);
  waits.Leave(b);
  EXPECT_TRUE(waits.ToResend().empty());
}

}  // namespace
}  // namespace core
}  // namespace ps
