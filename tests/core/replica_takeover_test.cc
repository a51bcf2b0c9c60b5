// The replica takeover's two sides fed inputs, without sockets: a worker's
// routes (src/postoffice/routes.h, made from a membership) and
// ReplicaHold (a primary's held answers, src/kv/replica_takeover.h).
#include "kv/replica_takeover.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "kv/request_internals.h"
#include "postoffice/membership.h"
#include "postoffice/routes.h"

namespace ps {
namespace detail {
namespace {

// Three servers: rank r's replica is rank (r + 1) % 3.
constexpr int kServers = 3;
constexpr int kServer0 = 8, kServer1 = 10, kServer2 = 12;
constexpr int kWorker0 = 9, kWorker1 = 11;

// For ReplicaHold: server 0 of three, whose replica is server 1.
class ReplicaTakeover : public ::testing::Test {
 protected:
  static KVMeta Push(int worker, int ts, int customer = 0) {
    KVMeta req;
    req.push = true;
    req.sender = worker;
    req.timestamp = ts;
    req.customer_id = customer;
    return req;
  }
  // The handle's answer to req, told apart by its timestamp and receiver.
  static Message AnswerTo(const KVMeta& req) {
    Message msg;
    msg.meta.set_timestamp(req.timestamp);
    msg.meta.set_recver(req.sender);
    msg.meta.set_customer_id(req.customer_id);
    return msg;
  }
  ReplicaHold::ReplicaAnswer ReplicaAnswers(const KVMeta& req) {
    return hold_.OnReplicaAnswer(req.sender, req.customer_id, req.timestamp);
  }

  // The replica's death as the node's routes hold it before OnFailure.
  std::vector<Message> ReplicaDies(int id) {
    down_.insert(id);
    return hold_.OnFailure(id);
  }

  int rank_ = 0;
  std::set<int> down_;
  ReplicaHold hold_{1, kServers, [this] { return rank_; },
                    [this](int id) { return down_.count(id) > 0; }};
};

// ---- Routes (the worker's side: who serves each server's keys) ----------
//
// The node's routes (src/postoffice/routes.h) as the postoffice publishes
// them: made from a membership fed the scheduler's verdicts.

class TakeoverRoutes : public ::testing::Test {
 protected:
  TakeoverRoutes() {
    for (int id : {kServer0, kServer1, kServer2, kWorker0, kWorker1}) {
      Apply(id, core::PeerInput::kRegister);
      Apply(id, core::PeerInput::kAdmit);
    }
  }
  void Apply(int id, core::PeerInput input, int by = -1,
             const Status& why = Status::OK()) {
    std::vector<core::PeerEvent> events;
    ASSERT_TRUE(membership_.Apply(id, input, "test", &events, by, why).ok());
  }
  // Server `id` died and its replica covers it.
  void Cover(int id, int by) {
    Apply(id, core::PeerInput::kCover, by,
          Status::PeerFailed("server " + std::to_string(id) + " covered"));
  }
  void Lose(int id, const std::string& why) {
    Apply(id, core::PeerInput::kLose, -1, Status::PeerFailed(why));
  }
  core::Routes Routes() const {
    core::Routes routes;
    routes.down = membership_.Down();
    return routes;
  }
  Status Unserved(const core::Routes& routes,
                  const std::vector<int>& ids) const {
    Status why;
    for (int id : ids) {
      Status st = routes.Unserved(id);
      if (!st.ok()) why = st;
    }
    return why;
  }

  core::Membership membership_;
};

TEST_F(TakeoverRoutes, EachServerServesItsOwnKeysUntilCovered) {
  core::Routes routes = Routes();
  for (int slot : {kServer0, kServer1, kServer2}) {
    EXPECT_EQ(routes.ServerOf(slot), slot);
  }
  EXPECT_TRUE(Unserved(routes, {kServer0, kServer1, kServer2}).ok());
}

TEST_F(TakeoverRoutes, ACoverRoutesTheServersSlotToItsReplica) {
  Cover(kServer1, kServer2);
  core::Routes routes = Routes();
  EXPECT_EQ(routes.ServerOf(kServer0), kServer0);
  EXPECT_EQ(routes.ServerOf(kServer1), kServer2);
  EXPECT_EQ(routes.ServerOf(kServer2), kServer2);
  EXPECT_TRUE(routes.IsDown(kServer1));
  EXPECT_EQ(routes.CoveredBy(kServer2), (std::vector<int>{kServer1}));
  // A covered server's keys are still served.
  EXPECT_TRUE(Unserved(routes, {kServer0, kServer1, kServer2}).ok());
}

TEST_F(TakeoverRoutes, TheLastServersReplicaIsTheFirst) {
  Cover(kServer2, kServer0);
  EXPECT_EQ(Routes().ServerOf(kServer2), kServer0);
}

TEST_F(TakeoverRoutes, ACoverMovesOnlyThatServersUnansweredSlices) {
  struct Slice {
    int ts;
    int slot;
  };
  std::vector<Slice> unanswered = {{1, kServer0}, {1, kServer1}, {2, kServer2},
                                   {2, kServer1}, {3, kServer1}, {4, kServer0}};
  Cover(kServer1, kServer2);
  Takeover t{kServer1, Routes().ServerOf(kServer1)};
  EXPECT_EQ(t.replica, kServer2);
  EXPECT_FALSE(t.Moves(kServer0));
  EXPECT_TRUE(t.Moves(kServer1));
  EXPECT_FALSE(t.Moves(kServer2));
  std::vector<Slice*> moved = t.Moved(&unanswered);
  ASSERT_EQ(moved.size(), 3u);
  EXPECT_EQ(moved[0], &unanswered[1]);
  EXPECT_EQ(moved[1], &unanswered[3]);
  EXPECT_EQ(moved[2], &unanswered[4]);
  for (const Slice* s : moved) EXPECT_EQ(s->slot, kServer1);

  std::vector<Slice> none = {{5, kServer0}, {5, kServer2}};
  EXPECT_TRUE(t.Moved(&none).empty());
}

TEST_F(TakeoverRoutes, ALostServerFailsItsSlotAndRefusesRequestsTouchingIt) {
  Lose(kServer1, "server 1 is gone");
  core::Routes routes = Routes();
  EXPECT_EQ(routes.ServerOf(kServer1), kServer1);  // not taken over
  EXPECT_TRUE(routes.CoveredBy(kServer1).empty());
  Status st = Unserved(routes, {kServer0, kServer1, kServer2});
  EXPECT_EQ(st.code(), Status::kPeerFailed);
  EXPECT_EQ(st.message(), "server 1 is gone");
  EXPECT_TRUE(Unserved(routes, {kServer0, kServer2}).ok());
  EXPECT_TRUE(Unserved(routes, {}).ok());
}

TEST_F(TakeoverRoutes, AReplicaLostLosesTheKeysItHadTakenOver) {
  Cover(kServer0, kServer1);  // served by server 1 now
  Lose(kServer1, "server 1 is gone");
  core::Routes routes = Routes();
  // The worker fails server 1's slot and those it covered.
  EXPECT_EQ(routes.CoveredBy(kServer1), (std::vector<int>{kServer0}));
  // Still routed to the dead replica, but refused before anything is sent.
  EXPECT_EQ(routes.ServerOf(kServer0), kServer1);
  EXPECT_EQ(routes.Unserved(kServer0).message(), "server 1 is gone");
  EXPECT_EQ(routes.Unserved(kServer1).message(), "server 1 is gone");
  EXPECT_TRUE(routes.Unserved(kServer2).ok());
}

TEST_F(TakeoverRoutes, UnservedNamesTheLastLostSlotAsked) {
  Lose(kServer0, "server 0 is gone");
  Lose(kServer2, "server 2 is gone too");
  core::Routes routes = Routes();
  EXPECT_EQ(Unserved(routes, {kServer0, kServer1, kServer2}).message(),
            "server 2 is gone too");
  EXPECT_EQ(Unserved(routes, {kServer2, kServer0}).message(),
            "server 0 is gone");
}

TEST_F(TakeoverRoutes, ANodeDownWithoutAStatusIsNamedWithItsReason) {
  // As a rejoining node learns of deaths from its node table.
  std::vector<core::PeerEvent> events;
  ASSERT_TRUE(membership_
                  .Apply(kServer1, core::PeerInput::kLose,
                         "dead when this node joined", &events)
                  .ok());
  Status st = Routes().Unserved(kServer1);
  EXPECT_EQ(st.code(), Status::kPeerFailed);
  EXPECT_NE(st.message().find("dead when this node joined"), std::string::npos)
      << st.message();
}

// ---- ReplicaHold (the primary's side) -----------------------------------

TEST_F(ReplicaTakeover, HoldWithoutAChainNothingIsForwardedOrHeld) {
  ReplicaHold off(
      0, kServers, [] { return 0; }, [](int) { return false; });
  EXPECT_FALSE(off.Forwards());
  KVMeta req = Push(kWorker0, 1);
  Message msg = AnswerTo(req);
  EXPECT_FALSE(off.Hold(req, &msg));
  EXPECT_EQ(msg.meta.timestamp(), 1);  // not moved from
  EXPECT_TRUE(off.OnFailure(kServer1).empty());
}

TEST_F(ReplicaTakeover, HoldTheReplicaIsTheNextRankAskedWhenNeeded) {
  EXPECT_TRUE(hold_.Forwards());
  EXPECT_EQ(hold_.replica_id(), kServer1);
  rank_ = 2;  // the rank a later rendezvous gave
  EXPECT_EQ(hold_.replica_id(), kServer0);
}

TEST_F(ReplicaTakeover, HoldTheAnswerWaitsUntilTheReplicaAnswered) {
  KVMeta req = Push(kWorker0, 7, 3);
  hold_.Forwarded(req);
  EXPECT_TRUE(hold_.Awaits(req));
  Message msg = AnswerTo(req);
  EXPECT_TRUE(hold_.Hold(req, &msg));
  EXPECT_TRUE(hold_.Awaits(req));
  ReplicaHold::ReplicaAnswer a = ReplicaAnswers(req);
  EXPECT_FALSE(a.duplicate);
  ASSERT_EQ(a.release.size(), 1u);
  EXPECT_EQ(a.release[0].meta.timestamp(), 7);
  EXPECT_EQ(a.release[0].meta.recver(), kWorker0);
  EXPECT_EQ(a.release[0].meta.customer_id(), 3);
  EXPECT_FALSE(hold_.Awaits(req));
}

TEST_F(ReplicaTakeover, HoldAReplicaAnswerFirstLetsTheHandlesAnswerGoAtOnce) {
  KVMeta req = Push(kWorker0, 7);
  hold_.Forwarded(req);
  ReplicaHold::ReplicaAnswer a = ReplicaAnswers(req);
  EXPECT_FALSE(a.duplicate);
  EXPECT_TRUE(a.release.empty());
  EXPECT_TRUE(hold_.Awaits(req));  // the handle's answer is still to come
  Message msg = AnswerTo(req);
  EXPECT_FALSE(hold_.Hold(req, &msg));
  EXPECT_EQ(msg.meta.timestamp(), 7);  // the caller sends it
  EXPECT_FALSE(hold_.Awaits(req));
}

TEST_F(ReplicaTakeover, HoldASecondReplicaAnswerIsADuplicate) {
  KVMeta req = Push(kWorker0, 7);
  hold_.Forwarded(req);
  Message msg = AnswerTo(req);
  hold_.Hold(req, &msg);
  EXPECT_EQ(ReplicaAnswers(req).release.size(), 1u);
  ReplicaHold::ReplicaAnswer again = ReplicaAnswers(req);
  EXPECT_TRUE(again.duplicate);
  EXPECT_TRUE(again.release.empty());
  // And one for a push never forwarded.
  EXPECT_TRUE(ReplicaAnswers(Push(kWorker1, 8)).duplicate);
}

TEST_F(ReplicaTakeover, HoldOnlyAWorkersRequestForOwnKeysForwardedIsHeld) {
  KVMeta never = Push(kWorker0, 1);
  Message msg = AnswerTo(never);
  EXPECT_FALSE(hold_.Hold(never, &msg));

  // A copy this server (as a replica) got from its primary: answered to it.
  KVMeta copy = Push(kWorker0, 2);
  RequestInternals::Change(
      &copy, [](RequestInternals* in) { in->reply_to = kServer2; });
  copy.shard = 2;
  hold_.Forwarded(copy);  // (no primary forwards such; still not held)
  msg = AnswerTo(copy);
  EXPECT_FALSE(hold_.Hold(copy, &msg));

  // A worker's request for the keys of server 2, whose replica this is.
  KVMeta taken = Push(kWorker0, 3);
  taken.shard = 2;
  hold_.Forwarded(taken);
  msg = AnswerTo(taken);
  EXPECT_FALSE(hold_.Hold(taken, &msg));

  // The shard named as this server's own is.
  KVMeta own = Push(kWorker0, 4);
  own.shard = 0;
  hold_.Forwarded(own);
  msg = AnswerTo(own);
  EXPECT_TRUE(hold_.Hold(own, &msg));
}

TEST_F(ReplicaTakeover,
       HoldTheReplicasDeathReleasesTheAnsweredAndStopsHolding) {
  KVMeta a = Push(kWorker0, 1), b = Push(kWorker1, 2), c = Push(kWorker0, 3);
  hold_.Forwarded(a);
  hold_.Forwarded(b);
  hold_.Forwarded(c);
  Message msg_c = AnswerTo(c), msg_a = AnswerTo(a);
  EXPECT_TRUE(hold_.Hold(c, &msg_c));
  EXPECT_TRUE(hold_.Hold(a, &msg_a));

  // Another node's death changes nothing.
  EXPECT_TRUE(ReplicaDies(kServer2).empty());
  EXPECT_TRUE(ReplicaDies(kWorker0).empty());
  EXPECT_TRUE(hold_.OnFailure(-1).empty());
  EXPECT_TRUE(hold_.Forwards());
  EXPECT_TRUE(hold_.Awaits(b));

  std::vector<Message> released = ReplicaDies(kServer1);
  ASSERT_EQ(released.size(), 2u);  // in request order: a, then c
  EXPECT_EQ(released[0].meta.timestamp(), 1);
  EXPECT_EQ(released[1].meta.timestamp(), 3);
  EXPECT_FALSE(hold_.Forwards());
  EXPECT_FALSE(hold_.Awaits(b));
  // b's answer, not given yet, goes as the handle gives it.
  Message msg_b = AnswerTo(b);
  EXPECT_FALSE(hold_.Hold(b, &msg_b));
  EXPECT_EQ(msg_b.meta.timestamp(), 2);
  // A late answer of the dead replica finds nothing.
  EXPECT_TRUE(ReplicaAnswers(a).duplicate);
  EXPECT_TRUE(hold_.OnFailure(kServer1).empty());
  // A push forwarded after the death was published, before OnFailure ran,
  // is not held either.
  KVMeta d = Push(kWorker1, 4);
  hold_.Forwarded(d);
  Message msg_d = AnswerTo(d);
  EXPECT_FALSE(hold_.Hold(d, &msg_d));
}

TEST_F(ReplicaTakeover, HoldAResentCopyLeavesTheHeldAnswerAsItWas) {
  KVMeta req = Push(kWorker0, 5);
  hold_.Forwarded(req);
  Message msg = AnswerTo(req);
  EXPECT_TRUE(hold_.Hold(req, &msg));
  hold_.Forwarded(req);  // the worker resent it; the copy goes again
  EXPECT_TRUE(hold_.Awaits(req));
  ReplicaHold::ReplicaAnswer a = ReplicaAnswers(req);
  ASSERT_EQ(a.release.size(), 1u);
  EXPECT_EQ(a.release[0].meta.timestamp(), 5);
  EXPECT_TRUE(ReplicaAnswers(req).duplicate);
}

TEST_F(ReplicaTakeover, HoldARefusedRequestIsNotHeld) {
  KVMeta req = Push(kWorker0, 5);
  hold_.Forwarded(req);
  hold_.Refused(req);
  EXPECT_FALSE(hold_.Awaits(req));
  EXPECT_TRUE(ReplicaAnswers(req).duplicate);
}

TEST_F(ReplicaTakeover, HoldAWorkersRejoinForgetsTheOldProcessesAnswers) {
  KVMeta old0 = Push(kWorker0, 1), old1 = Push(kWorker0, 2, 1);
  KVMeta other = Push(kWorker1, 1);
  for (const KVMeta* req : {&old0, &old1, &other}) {
    hold_.Forwarded(*req);
    Message msg = AnswerTo(*req);
    EXPECT_TRUE(hold_.Hold(*req, &msg));
  }
  hold_.ForgetWorker(kWorker0);
  EXPECT_FALSE(hold_.Awaits(old0));
  EXPECT_FALSE(hold_.Awaits(old1));
  EXPECT_TRUE(ReplicaAnswers(old0).duplicate);
  EXPECT_TRUE(ReplicaAnswers(old1).duplicate);
  ReplicaHold::ReplicaAnswer a = ReplicaAnswers(other);
  ASSERT_EQ(a.release.size(), 1u);
  EXPECT_EQ(a.release[0].meta.recver(), kWorker1);
  // The new process's request with an old timestamp is held afresh.
  hold_.Forwarded(old0);
  Message msg = AnswerTo(old0);
  EXPECT_TRUE(hold_.Hold(old0, &msg));
}

// A step forward stands for the pushes summed into it: their answers wait
// for the replica's answer to it (this server's id, customer 0, its ticket).
TEST_F(ReplicaTakeover, HoldAStepForwardReleasesEveryPushItCovers) {
  KVMeta a = Push(kWorker0, 4), b = Push(kWorker1, 9);
  Message early = AnswerTo(a);  // answered before the step was forwarded
  EXPECT_FALSE(hold_.Hold(a, &early));  // nothing holds it yet
  Message forward;
  forward.meta.set_timestamp(17);
  hold_.ForwardedStep(forward, {a, b});
  EXPECT_TRUE(hold_.Awaits(a));
  ASSERT_TRUE(hold_.StepOf(b).has_value());
  EXPECT_EQ(hold_.StepOf(b)->meta.timestamp(), 17);
  EXPECT_FALSE(hold_.StepOf(Push(kWorker0, 5)).has_value());
  Message ma = AnswerTo(a), mb = AnswerTo(b);
  EXPECT_TRUE(hold_.Hold(a, &ma));
  EXPECT_TRUE(hold_.Hold(b, &mb));
  // The replica's answer to another ticket, or as a worker's: nothing.
  EXPECT_TRUE(hold_.OnReplicaAnswer(kServer0, 0, 18).duplicate);
  EXPECT_TRUE(hold_.OnReplicaAnswer(kWorker0, 0, 17).duplicate);
  ReplicaHold::ReplicaAnswer r = hold_.OnReplicaAnswer(kServer0, 0, 17);
  EXPECT_FALSE(r.duplicate);
  ASSERT_EQ(r.release.size(), 2u);  // in request order
  EXPECT_EQ(r.release[0].meta.recver(), kWorker0);
  EXPECT_EQ(r.release[1].meta.recver(), kWorker1);
  EXPECT_FALSE(hold_.Awaits(a));
  EXPECT_FALSE(hold_.StepOf(b).has_value());
  EXPECT_TRUE(hold_.OnReplicaAnswer(kServer0, 0, 17).duplicate);
}

TEST_F(ReplicaTakeover, HoldAStepAnsweredFirstLetsItsPushesAnswersGo) {
  KVMeta a = Push(kWorker0, 4);
  Message forward;
  forward.meta.set_timestamp(2);
  hold_.ForwardedStep(forward, {a});
  EXPECT_TRUE(hold_.OnReplicaAnswer(kServer0, 0, 2).release.empty());
  Message msg = AnswerTo(a);
  EXPECT_FALSE(hold_.Hold(a, &msg));  // the caller sends it now
  EXPECT_FALSE(hold_.Awaits(a));
}

TEST_F(ReplicaTakeover, HoldTheReplicasDeathReleasesTheStepsPushes) {
  KVMeta a = Push(kWorker0, 4);
  Message forward;
  forward.meta.set_timestamp(2);
  hold_.ForwardedStep(forward, {a});
  Message msg = AnswerTo(a);
  EXPECT_TRUE(hold_.Hold(a, &msg));
  EXPECT_EQ(ReplicaDies(kServer1).size(), 1u);
  EXPECT_FALSE(hold_.StepOf(a).has_value());
  EXPECT_TRUE(hold_.OnReplicaAnswer(kServer0, 0, 2).duplicate);
}

}  // namespace
}  // namespace detail
}  // namespace ps
