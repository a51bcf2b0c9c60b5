// RendezvousCoordinator (src/postoffice/rendezvous_coordinator.h) fed
// registrations, without sockets.
#include "postoffice/rendezvous_coordinator.h"

#include <gtest/gtest.h>

namespace ps {
namespace core {
namespace {

NodeInfo Arrival(Role role, int port, int requested_rank = -1) {
  NodeInfo n;
  n.role = role;
  n.host = "127.0.0.1";
  n.port = port;
  n.requested_rank = requested_rank;
  return n;
}

TEST(RendezvousCoordinator, AssignsRanksOnceAllArrived) {
  RendezvousCoordinator desk(1, 2);
  NodeInfo w = Arrival(Role::kWorker, 4001, 1);
  w.id = desk.NextTempId();
  ASSERT_TRUE(desk.CheckShape(w, 1, 2).ok());
  ASSERT_TRUE(desk.CheckArrival(w).ok());
  EXPECT_FALSE(desk.Arrive(w));
  NodeInfo s = Arrival(Role::kServer, 4002);
  s.id = desk.NextTempId();
  EXPECT_NE(s.id, w.id);
  EXPECT_LT(s.id, 0);
  EXPECT_FALSE(desk.Arrive(s));
  EXPECT_EQ(desk.Shortfall(),
            "1 of 1 servers and 1 of 2 workers arrived (worker at "
            "tcp://127.0.0.1:4001, server at tcp://127.0.0.1:4002); missing: "
            "worker 0");
  NodeInfo w2 = Arrival(Role::kWorker, 4003);
  w2.id = desk.NextTempId();
  ASSERT_TRUE(desk.CheckArrival(w2).ok());
  EXPECT_TRUE(desk.Arrive(w2));
  std::vector<NodeInfo> assigned = desk.Assign();
  ASSERT_EQ(assigned.size(), 3u);
  EXPECT_EQ(assigned[0].rank, 1);  // as it asked
  EXPECT_EQ(assigned[0].id, WorkerRankToId(1));
  EXPECT_EQ(assigned[1].id, ServerRankToId(0));
  EXPECT_EQ(assigned[2].id, WorkerRankToId(0));
}

TEST(RendezvousCoordinator, RefusesOtherShapesTooManyAndTakenRanks) {
  RendezvousCoordinator desk(1, 1);
  NodeInfo s = Arrival(Role::kServer, 4001, 0);
  Status st = desk.CheckShape(s, 2, 1);
  EXPECT_EQ(st.code(), Status::kInvalidArgument);
  EXPECT_NE(st.message().find("DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=1, the "
                              "scheduler for DMLC_NUM_SERVER=1"),
            std::string::npos)
      << st;
  desk.Arrive(s);
  st = desk.CheckArrival(Arrival(Role::kServer, 4002));
  EXPECT_NE(st.message().find("one server too many"), std::string::npos) << st;
  st = desk.CheckArrival(Arrival(Role::kWorker, 4003, 1));
  EXPECT_FALSE(st.ok());  // rank 1 of 1 worker is out of range
  EXPECT_EQ(desk.Shortfall(),
            "1 of 1 servers and 0 of 1 workers arrived (server at "
            "tcp://127.0.0.1:4001); missing: worker 0");
}

TEST(RendezvousCoordinator, AnswersOnlySoManyRefusals) {
  RendezvousCoordinator desk(1, 1);
  int answered = 0;
  for (int i = 0; i < 100; ++i) answered += desk.AnswerRefusal() ? 1 : 0;
  EXPECT_EQ(answered, 2 + 16);
}

}  // namespace
}  // namespace core
}  // namespace ps
