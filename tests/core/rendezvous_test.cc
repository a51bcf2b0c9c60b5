// Rendezvous as the scheduler sees it: a real scheduler Node and members
// played by raw ZeroMQ sockets, so that the order of registration and every
// message each member gets back can be asserted exactly.
#include <gtest/gtest.h>
#include <zmq.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "meta.pb.h"
#include "ps/node.h"

namespace ps {
namespace {

constexpr int kReceiveTimeoutMs = 5000;
// The job's shape, as every member registers it.
constexpr int kNumServers = 2;
constexpr int kNumWorkers = 1;
// A member that got everything it should waits this long for a stray extra.
constexpr int kQuietMs = 200;

// One member of the job without the library: a ROUTER it listens on and a
// DEALER to the scheduler. Used by the test thread only.
class FakeMember {
 public:
  FakeMember(void* context, int scheduler_port)
      : router_(zmq_socket(context, ZMQ_ROUTER)),
        dealer_(zmq_socket(context, ZMQ_DEALER)) {
    int zero = 0;
    zmq_setsockopt(router_, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(dealer_, ZMQ_LINGER, &zero, sizeof(zero));
    bound_ = zmq_bind(router_, "tcp://127.0.0.1:*") == 0;
    char endpoint[256];
    size_t len = sizeof(endpoint);
    bound_ = bound_ &&
             zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, endpoint, &len) == 0;
    if (bound_) {
      std::string ep(endpoint);
      port_ = std::stoi(ep.substr(ep.rfind(':') + 1));
      // A member's connections are named after its address.
      std::string identity = "127.0.0.1:" + std::to_string(port_);
      zmq_setsockopt(dealer_, ZMQ_ROUTING_ID, identity.data(), identity.size());
    }
    std::string scheduler = "tcp://127.0.0.1:" + std::to_string(scheduler_port);
    connected_ = zmq_connect(dealer_, scheduler.c_str()) == 0;
  }
  ~FakeMember() {
    zmq_close(router_);
    zmq_close(dealer_);
  }
  FakeMember(const FakeMember&) = delete;
  FakeMember& operator=(const FakeMember&) = delete;

  bool ok() const { return bound_ && connected_; }

  // Sends ADD_NODE as a member of `role` (PS_RANK `requested_rank`, or -1).
  bool Register(Role role, int requested_rank) {
    pb::Meta meta;
    meta.set_request(true);
    meta.mutable_control()->set_cmd(pb::ADD_NODE);
    pb::NodeInfo* me = meta.mutable_control()->add_node();
    me->set_role(static_cast<pb::NodeRole>(role));
    me->set_host("127.0.0.1");
    me->set_port(port_);
    me->set_requested_rank(requested_rank);
    meta.mutable_control()->set_num_servers(kNumServers);
    meta.mutable_control()->set_num_workers(kNumWorkers);
    std::string header = meta.SerializeAsString();
    return zmq_send(dealer_, header.data(), header.size(), 0) ==
           static_cast<int>(header.size());
  }

  // The header of the next message within `timeout_ms`, if any.
  std::optional<pb::Meta> Receive(int timeout_ms) {
    zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return std::nullopt;
    std::vector<std::string> parts;
    int more = 1;
    while (more) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, router_, 0) < 0) return std::nullopt;
      parts.emplace_back(static_cast<char*>(zmq_msg_data(&part)),
                         zmq_msg_size(&part));
      more = zmq_msg_more(&part);
      zmq_msg_close(&part);
    }
    pb::Meta meta;
    if (parts.size() != 2 || !meta.ParseFromString(parts[1])) {
      return std::nullopt;
    }
    return meta;
  }

 private:
  void* router_;
  void* dealer_;
  bool bound_ = false;
  bool connected_ = false;
  int port_ = 0;
};

// Expects an ACK as the next message.
void ExpectAck(FakeMember* m, const std::string& who) {
  std::optional<pb::Meta> got = m->Receive(kReceiveTimeoutMs);
  ASSERT_TRUE(got.has_value()) << who << " got no ACK";
  EXPECT_EQ(got->control().cmd(), pb::ACK) << who;
}

// Expects the node table, addressed to `id`, as the next message.
void ExpectTable(FakeMember* m, const std::string& who, int id) {
  std::optional<pb::Meta> got = m->Receive(kReceiveTimeoutMs);
  ASSERT_TRUE(got.has_value()) << who << " got no node table";
  EXPECT_EQ(got->control().cmd(), pb::ADD_NODE) << who;
  EXPECT_FALSE(got->request()) << who;
  EXPECT_EQ(got->recver(), id) << who;
  EXPECT_EQ(got->control().node_size(), 4) << who;  // scheduler + 3
  EXPECT_TRUE(got->control().error().empty()) << got->control().error();
}

// Registers a worker, server rank 1 and server rank 0, one at a time (each
// waits for its ACK before the next registers), then checks what each got.
void RegisterInOrderAndCheck(void* context, int scheduler_port) {
  FakeMember worker(context, scheduler_port);
  FakeMember server1(context, scheduler_port);
  FakeMember server0(context, scheduler_port);
  ASSERT_TRUE(worker.ok() && server1.ok() && server0.ok());
  ASSERT_TRUE(worker.Register(Role::kWorker, -1));
  ExpectAck(&worker, "worker");
  ASSERT_TRUE(server1.Register(Role::kServer, 1));
  ExpectAck(&server1, "server 1");
  ASSERT_TRUE(server0.Register(Role::kServer, 0));
  ExpectAck(&server0, "server 0");

  ExpectTable(&server0, "server 0", ServerRankToId(0));
  ExpectTable(&worker, "worker 0", WorkerRankToId(0));
  ExpectTable(&server1, "server 1", ServerRankToId(1));
  for (FakeMember* m : {&worker, &server1, &server0}) {
    std::optional<pb::Meta> extra = m->Receive(kQuietMs);
    EXPECT_FALSE(extra.has_value())
        << "unexpected " << pb::Command_Name(extra->control().cmd());
  }
}

// The last node to register is neither the last in the node table (by id)
// nor the last by rank: server rank 0 (id 8) registers after worker 0 (id 9)
// and server 1 (id 10). Each member must get exactly one ACK, its own, before
// its node table; an ACK sent to whichever node ends the table would reach
// server 1 twice and server 0 never.
TEST(Rendezvous, EachRegistrationIsAcknowledgedToItsOwnNode) {
  Config sc = TestConfig(Role::kScheduler, kNumServers, kNumWorkers);
  sc.heartbeat_interval_ms = 0;  // the fake members send none
  Node scheduler(sc);
  ASSERT_TRUE(scheduler.Bind().ok());
  Status started;
  std::thread start([&] { started = scheduler.Start(); });
  void* context = zmq_ctx_new();
  RegisterInOrderAndCheck(context, scheduler.port());
  start.join();  // the scheduler gives up by its rendezvous timeout at most
  zmq_ctx_term(context);
  EXPECT_TRUE(started.ok()) << started;
  EXPECT_EQ(scheduler.GetNodeIds(kServerGroup | kWorkerGroup),
            (std::vector<int>{ServerRankToId(0), WorkerRankToId(0),
                              ServerRankToId(1)}));
  scheduler.Stop();
}

}  // namespace
}  // namespace ps
