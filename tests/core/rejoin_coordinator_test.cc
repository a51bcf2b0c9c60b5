// RejoinCoordinator (src/postoffice/rejoin_coordinator.h) and
// TakeoverCoordinator (takeover_coordinator.h) fed registrations, answers,
// losses and ticks, without sockets.
#include "postoffice/rejoin_coordinator.h"

#include <gtest/gtest.h>

#include <chrono>

#include "postoffice/takeover_coordinator.h"

namespace ps {
namespace core {
namespace {

using Clock = RejoinCoordinator::Clock;
using std::chrono::milliseconds;

NodeInfo Restart(int rank, int port) {
  NodeInfo n;
  n.role = Role::kWorker;
  n.host = "127.0.0.1";
  n.port = port;
  n.requested_rank = rank;
  return n;
}

std::string Name(int id) { return DescribeId(id); }

TEST(RejoinCoordinator, TellsTheLiveMembersAndFinishesOnceAllAnswered) {
  RejoinCoordinator desk(2, 1);
  const Clock::time_point t0 = Clock::now();
  NodeInfo successor = Restart(1, 5001);
  ASSERT_TRUE(desk.Check(successor, Name).ok());
  const int id = desk.Register(successor, -1000, t0);
  EXPECT_EQ(id, WorkerRankToId(1));
  EXPECT_TRUE(desk.Waiting(id));
  // A second restart of the same rank is refused, naming the first.
  Status st = desk.Check(Restart(1, 5002), Name);
  EXPECT_EQ(st.code(), Status::kInvalidArgument);
  EXPECT_NE(st.message().find("a restart of worker 1 is rejoining already "
                              "(from tcp://127.0.0.1:5001); worker at "
                              "tcp://127.0.0.1:5002 refused"),
            std::string::npos)
      << st;

  const int s0 = ServerRankToId(0), s1 = ServerRankToId(1);
  RejoinCoordinator::Started started =
      desk.Start(id, {s0, s1}, t0 + milliseconds(10));
  EXPECT_FALSE(started.complete);
  EXPECT_EQ(started.temp_id, -1000);
  EXPECT_EQ(started.node.id, id);
  EXPECT_EQ(started.node.rank, 1);
  EXPECT_FALSE(desk.Waiting(id));

  // An answer about another address (an earlier successor) or from a
  // member not asked is no answer.
  NodeInfo other = started.node;
  other.port = 5009;
  EXPECT_EQ(desk.Answered(s0, other), RejoinCoordinator::Answer::kUnexpected);
  EXPECT_EQ(desk.Answered(WorkerRankToId(0), started.node),
            RejoinCoordinator::Answer::kUnexpected);
  EXPECT_EQ(desk.Answered(s0, started.node),
            RejoinCoordinator::Answer::kWaiting);
  EXPECT_EQ(desk.Answered(s0, started.node),  // twice
            RejoinCoordinator::Answer::kUnexpected);
  EXPECT_EQ(desk.Answered(s1, started.node),
            RejoinCoordinator::Answer::kComplete);
  EXPECT_DOUBLE_EQ(desk.Finish(id, t0 + milliseconds(250)), 0.25);
  EXPECT_EQ(desk.size(), 0u);
  // Once finished, the rank may restart again.
  EXPECT_TRUE(desk.Check(Restart(1, 5003), Name).ok());
}

TEST(RejoinCoordinator, RefusesWithoutRestartsNonWorkersAndRanklessWorkers) {
  NodeInfo server = Restart(0, 5001);
  server.role = Role::kServer;
  Status st = RejoinCoordinator(2, 0).Check(Restart(0, 5001), Name);
  EXPECT_NE(st.message().find("one worker too many: tcp://127.0.0.1:5001 "
                              "registered after all expected had arrived"),
            std::string::npos)
      << st;
  RejoinCoordinator desk(2, 3);
  st = desk.Check(server, Name);
  EXPECT_NE(st.message().find("only restarted workers rejoin"),
            std::string::npos)
      << st;
  for (int rank : {-1, 2}) {
    st = desk.Check(Restart(rank, 5001), Name);
    EXPECT_NE(st.message().find("without a worker rank (PS_RANK in [0, 2))"),
              std::string::npos)
        << st;
  }
}

TEST(RejoinCoordinator, NobodyToTellCompletesAtOnce) {
  RejoinCoordinator desk(1, 1);
  const int id = desk.Register(Restart(0, 5001), -1000, Clock::now());
  // The restarted worker itself is not told of itself.
  EXPECT_TRUE(desk.Start(id, {id}, Clock::now()).complete);
}

TEST(RejoinCoordinator, ALostMemberIsWaitedForNoMore) {
  RejoinCoordinator desk(2, 1);
  const Clock::time_point t0 = Clock::now();
  const int w0 = desk.Register(Restart(0, 5001), -1000, t0);
  const int s0 = ServerRankToId(0), s1 = ServerRankToId(1);
  RejoinCoordinator::Started started = desk.Start(w0, {s0, s1}, t0);
  EXPECT_EQ(desk.Answered(s1, started.node),
            RejoinCoordinator::Answer::kWaiting);
  std::vector<int> complete;
  EXPECT_FALSE(desk.OnLost(s0, false, false, &complete));
  EXPECT_EQ(complete, std::vector<int>{w0});
}

TEST(RejoinCoordinator, ASuccessorThatRegisteredBeforeTheDeathStartsOnIt) {
  RejoinCoordinator desk(2, 1);
  const int w1 = desk.Register(Restart(1, 5001), -1000, Clock::now());
  std::vector<int> complete;
  // The predecessor lost for good: nothing starts.
  EXPECT_FALSE(desk.OnLost(w1, false, false, &complete));
  // Awaited back: the waiting registration starts.
  EXPECT_TRUE(desk.OnLost(w1, false, true, &complete));
  EXPECT_TRUE(complete.empty());
  desk.Start(w1, {ServerRankToId(0)}, Clock::now());
  // The successor dies while rejoining: forgotten, the rank free again.
  EXPECT_FALSE(desk.OnLost(w1, true, true, &complete));
  EXPECT_EQ(desk.size(), 0u);
}

TEST(RejoinCoordinator, AClosedConnectionForgetsItsWaitingRegistration) {
  RejoinCoordinator desk(2, 1);
  desk.Register(Restart(1, 5001), -1000, Clock::now());
  NodeInfo gone;
  EXPECT_EQ(desk.OnConnectionLost(-1001, &gone), -1);
  EXPECT_EQ(desk.OnConnectionLost(-1000, &gone), WorkerRankToId(1));
  EXPECT_EQ(gone.port, 5001);
  EXPECT_EQ(desk.size(), 0u);
}

TEST(RejoinCoordinator, TicksGoAheadWithoutTheSilentAndRefuseTheUndead) {
  RejoinCoordinator desk(2, 1);
  const Clock::time_point t0 = Clock::now();
  const int w0 = desk.Register(Restart(0, 5001), -1000, t0);
  const int w1 = desk.Register(Restart(1, 5002), -1001, t0);
  const int s0 = ServerRankToId(0), s1 = ServerRankToId(1);
  const NodeInfo successor = desk.Start(w0, {s0, s1}, t0).node;
  std::vector<RejoinCoordinator::Overdue> overdue;
  std::vector<RejoinCoordinator::Refused> refused;
  desk.Tick(t0 + milliseconds(500), 1000, 2000, &overdue, &refused);
  EXPECT_TRUE(overdue.empty());
  EXPECT_TRUE(refused.empty());
  EXPECT_EQ(desk.Answered(s1, successor), RejoinCoordinator::Answer::kWaiting);
  desk.Tick(t0 + milliseconds(1500), 1000, 2000, &overdue, &refused);
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0].id, w0);
  EXPECT_EQ(overdue[0].silent, std::vector<int>{s0});
  EXPECT_TRUE(refused.empty());
  desk.Finish(w0, t0 + milliseconds(1500));
  overdue.clear();
  // w1's predecessor never died.
  desk.Tick(t0 + milliseconds(2500), 1000, 2000, &overdue, &refused);
  EXPECT_TRUE(overdue.empty());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].id, w1);
  EXPECT_EQ(refused[0].temp_id, -1001);
  EXPECT_EQ(refused[0].node.port, 5002);
  EXPECT_EQ(desk.size(), 0u);
}

NodeInfo Member(Role role, int rank, int port) {
  NodeInfo n;
  n.role = role;
  n.rank = rank;
  n.id = role == Role::kServer ? ServerRankToId(rank) : WorkerRankToId(rank);
  n.host = "127.0.0.1";
  n.port = port;
  return n;
}

TEST(TakeoverCoordinator, TakesTheJobOverOnceEveryMemberReported) {
  TakeoverCoordinator desk(1, 2, 1);
  const NodeInfo s0 = Member(Role::kServer, 0, 6001);
  const NodeInfo w0 = Member(Role::kWorker, 0, 6002);
  const NodeInfo w1 = Member(Role::kWorker, 1, 6003);
  for (const NodeInfo& n : {s0, w0, w1})
    ASSERT_TRUE(desk.Check(n, {}, 1, 2).ok());
  EXPECT_EQ(desk.Missing(), "server 0, worker 0, worker 1");
  EXPECT_EQ(desk.Classify(s0, false, nullptr),
            TakeoverCoordinator::Outcome::kNew);
  EXPECT_FALSE(desk.Take(s0, {}));
  // A copy of its report (every heartbeat interval) waits with the rest.
  EXPECT_EQ(desk.Classify(s0, false, &s0), TakeoverCoordinator::Outcome::kCopy);
  EXPECT_FALSE(desk.Take(w1, {}));
  EXPECT_EQ(desk.Missing(), "worker 0");
  EXPECT_EQ(desk.reported(), 2);
  EXPECT_TRUE(desk.Take(w0, {}));
  EXPECT_TRUE(desk.complete());
  EXPECT_EQ(desk.Missing(), "");
  // The job runs: a copy sent before the answer arrived is answered again;
  // one from another address is no member of ours.
  EXPECT_EQ(desk.Classify(w0, true, &w0),
            TakeoverCoordinator::Outcome::kAnswerAgain);
  NodeInfo impostor = w0;
  impostor.port = 6009;
  EXPECT_EQ(desk.Classify(impostor, true, &w0),
            TakeoverCoordinator::Outcome::kRefused);
}

TEST(TakeoverCoordinator, ASchedulerWithAJobOfItsOwnTakesNoReports) {
  TakeoverCoordinator desk(1, 1, 1);
  EXPECT_EQ(desk.Classify(Member(Role::kServer, 0, 6001), true, nullptr),
            TakeoverCoordinator::Outcome::kRefused);
}

TEST(TakeoverCoordinator, RefusesReportsThatDoNotFitTheJob) {
  const NodeInfo w1 = Member(Role::kWorker, 1, 6001);
  Status st = TakeoverCoordinator(1, 2, 0).Check(w1, {}, 1, 2);
  EXPECT_NE(st.message().find("only with PS_MAX_RESTARTS > 0"),
            std::string::npos)
      << st;
  TakeoverCoordinator desk(1, 2, 1);
  st = desk.Check(w1, {}, 2, 2);
  EXPECT_NE(st.message().find("it was started for DMLC_NUM_SERVER=2 "
                              "DMLC_NUM_WORKER=2, this scheduler for "
                              "DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=2"),
            std::string::npos)
      << st;
  EXPECT_NE(desk.Check(Member(Role::kWorker, 2, 6001), {}, 1, 2)
                .message()
                .find("no such rank"),
            std::string::npos);
  NodeInfo wrong_id = w1;
  wrong_id.id = ServerRankToId(1);
  st = desk.Check(wrong_id, {}, 1, 2);
  EXPECT_NE(st.message().find("its id is " + std::to_string(wrong_id.id) +
                              ", not " + std::to_string(w1.id)),
            std::string::npos)
      << st;
}

// Server 1 was taken over by server 0 before the scheduler died: the
// members name it, and the takeover completes without its report.
TEST(TakeoverCoordinator, ServersTakenOverAreNotWaitedFor) {
  TakeoverCoordinator desk(3, 1, 1);
  const NodeInfo s0 = Member(Role::kServer, 0, 6001);
  const NodeInfo s1 = Member(Role::kServer, 1, 6002);
  const NodeInfo s2 = Member(Role::kServer, 2, 6003);
  const NodeInfo w0 = Member(Role::kWorker, 0, 6004);
  ASSERT_TRUE(desk.Check(w0, {s1}, 3, 1).ok());
  EXPECT_FALSE(desk.Take(w0, {s1}));
  EXPECT_EQ(desk.Missing(), "server 0, server 2");
  // One that lives reports itself: whoever named it is wrong.
  EXPECT_FALSE(desk.Take(s2, {s1, s2}));
  EXPECT_EQ(desk.Missing(), "server 0");
  EXPECT_TRUE(desk.Take(s0, {}));
  EXPECT_EQ(desk.reported(), 3);
  const std::vector<NodeInfo> covered = desk.Covered();
  ASSERT_EQ(covered.size(), 1u);
  EXPECT_EQ(covered[0].id, s1.id);
  EXPECT_EQ(covered[0].port, 6002);
}

TEST(TakeoverCoordinator, RefusesCoveredNodesThatAreNoServerOfTheJob) {
  TakeoverCoordinator desk(2, 1, 1);
  const NodeInfo w0 = Member(Role::kWorker, 0, 6001);
  for (const NodeInfo& bad :
       {Member(Role::kWorker, 0, 6001), Member(Role::kServer, 2, 6002)}) {
    Status st = desk.Check(w0, {bad}, 2, 1);
    EXPECT_NE(st.message().find("taken over, no server of this job"),
              std::string::npos)
        << st;
  }
  NodeInfo wrong_id = Member(Role::kServer, 1, 6003);
  wrong_id.id = ServerRankToId(0);
  EXPECT_FALSE(desk.Check(w0, {wrong_id}, 2, 1).ok());
  // A server may not name itself taken over.
  const NodeInfo s1 = Member(Role::kServer, 1, 6003);
  EXPECT_FALSE(desk.Check(s1, {s1}, 2, 1).ok());
  EXPECT_TRUE(desk.Check(s1, {Member(Role::kServer, 0, 6004)}, 2, 1).ok());
}

}  // namespace
}  // namespace core
}  // namespace ps
