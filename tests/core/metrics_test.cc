// Metrics (src/metrics): what the registry counts, how it names peers and
// refusals, and that /metrics is served over HTTP on the port it says.
#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "http_get.h"

namespace ps {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

std::string Scrape(int port, const std::string& path = "/metrics") {
  return HttpGet(port, path);
}

TEST(Metrics, CountsTrafficPerPeerWithRoleAndRank) {
  Metrics m(Role::kWorker);
  m.set_rank(1);
  m.Sent(ServerRankToId(0), 100);
  m.Sent(ServerRankToId(0), 20);
  m.Received(ServerRankToId(1), 7);
  m.Received(kSchedulerId, 3);
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text,
                  "ps_bytes_sent_total{role=\"worker\",rank=\"1\","
                  "peer=\"server0\"} 120"))
      << text;
  EXPECT_TRUE(Has(text,
                  "ps_messages_sent_total{role=\"worker\",rank=\"1\","
                  "peer=\"server0\"} 2"))
      << text;
  EXPECT_TRUE(Has(text,
                  "ps_bytes_received_total{role=\"worker\",rank=\"1\","
                  "peer=\"server1\"} 7"))
      << text;
  EXPECT_TRUE(Has(text, "peer=\"scheduler\"} 3")) << text;
}

TEST(Metrics, UnknownPeersShareOneSeries) {
  Metrics m(Role::kServer);
  m.Received(-5, 1);  // a registering node's temporary id
  m.Received(Metrics::kMaxPeerIds + 1, 1);
  m.Received(3, 1);  // no role has id 3
  EXPECT_TRUE(Has(m.Text(),
                  "ps_messages_received_total{role=\"server\",rank=\"\","
                  "peer=\"other\"} 3"))
      << m.Text();
}

TEST(Metrics, RefusalsHaveAFixedSetOfReasons) {
  EXPECT_EQ(ClassifyRefusal("it claims to be server 0 in ..."),
            RefusalReason::kNotAMember);
  EXPECT_EQ(ClassifyRefusal("unknown sender of DATA"),
            RefusalReason::kNotAMember);
  EXPECT_EQ(ClassifyRefusal("a malformed acknowledgement: x"),
            RefusalReason::kMalformed);
  EXPECT_EQ(ClassifyRefusal("frames that do not open with its key"),
            RefusalReason::kAuthentication);
  EXPECT_EQ(ClassifyRefusal("a message of 2000 bytes"), RefusalReason::kSize);
  EXPECT_EQ(ClassifyRefusal("more than 9 frames or 1024 bytes "
                            "(PS_MAX_MESSAGE_BYTES) in one message"),
            RefusalReason::kSize);
  EXPECT_EQ(ClassifyRefusal("no header frame"), RefusalReason::kMalformed);
  EXPECT_EQ(ClassifyRefusal("sealed frames refused: replayed"),
            RefusalReason::kAuthentication);
  EXPECT_EQ(ClassifyRefusal("\x01\x02whatever a peer wrote"),
            RefusalReason::kOther);
  Metrics m(Role::kServer);
  m.Refused(ClassifyRefusal("unknown sender of DATA"));
  m.Refused(RefusalReason::kAuthentication);
  m.Refused(RefusalReason::kAuthentication);
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text, "reason=\"authentication\"} 2")) << text;
  EXPECT_TRUE(Has(text, "reason=\"not_a_member\"} 1")) << text;
  EXPECT_TRUE(Has(text, "reason=\"size\"} 0")) << text;
}

TEST(Metrics, RequestsByOpInAHistogram) {
  Metrics m(Role::kWorker);
  m.RequestDone(/*push=*/true, /*pull=*/false, 0.002);
  m.RequestDone(false, true, 0.5);
  m.RequestDone(false, true, 0.5);
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text,
                  "ps_request_seconds_count{role=\"worker\",rank=\"\","
                  "op=\"push\"} 1"))
      << text;
  EXPECT_TRUE(Has(text,
                  "ps_request_seconds_count{role=\"worker\",rank=\"\","
                  "op=\"pull\"} 2"))
      << text;
  EXPECT_TRUE(Has(text,
                  "ps_request_seconds_sum{role=\"worker\",rank=\"\","
                  "op=\"pull\"} 1"))
      << text;
}

TEST(Metrics, PeerStateIsOneGaugeSetToOne) {
  Metrics m(Role::kScheduler);
  m.SetPeerState(WorkerRankToId(0), "joining");
  m.SetPeerState(WorkerRankToId(0), "live");
  m.SetHeartbeatAge(WorkerRankToId(0), 0.25);
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text, "peer=\"worker0\",state=\"live\"} 1")) << text;
  EXPECT_TRUE(Has(text, "peer=\"worker0\",state=\"joining\"} 0")) << text;
  EXPECT_TRUE(Has(text,
                  "ps_peer_heartbeat_age_seconds{role=\"scheduler\","
                  "rank=\"\",peer=\"worker0\"} 0.25"))
      << text;
}

TEST(Metrics, GaugesByNameRefuseBadNames) {
  Metrics m(Role::kWorker);
  EXPECT_TRUE(m.SetGauge("ps_samples_per_second", 1200.5));
  EXPECT_TRUE(m.SetGauge("ps_samples_per_second", 1300));
  EXPECT_FALSE(m.SetGauge("not a name", 1));
  EXPECT_FALSE(m.SetGauge("ps_bytes_sent_total", 1));  // a counter's
  EXPECT_TRUE(Has(m.Text(),
                  "ps_samples_per_second{role=\"worker\",rank=\"\"}"
                  " 1300"))
      << m.Text();
}

TEST(Metrics, ReplicaLagIsSentMinusAnswered) {
  Metrics m(Role::kServer);
  m.ReplicaForwarded();
  m.ReplicaForwarded();
  m.ReplicaAnswered();
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text,
                  "ps_replica_updates_sent_total{role=\"server\","
                  "rank=\"\"} 2"))
      << text;
  EXPECT_TRUE(Has(text,
                  "ps_replica_updates_answered_total{role=\"server\","
                  "rank=\"\"} 1"))
      << text;
}

TEST(Metrics, ServesOverHttpOnAnEphemeralPort) {
  Metrics m(Role::kServer);
  m.set_rank(0);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0).ok());
  ASSERT_GT(m.port(), 0);
  m.Sent(WorkerRankToId(0), 42);
  const std::string reply = Scrape(m.port());
  EXPECT_TRUE(Has(reply, "200 OK")) << reply;
  EXPECT_TRUE(Has(reply,
                  "ps_bytes_sent_total{role=\"server\",rank=\"0\","
                  "peer=\"worker0\"} 42"))
      << reply;
}

TEST(Metrics, OnlyMetricsIsServedAndServingStops) {
  Metrics m(Role::kWorker);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0).ok());
  const int port = m.port();
  EXPECT_TRUE(Has(Scrape(port, "/"), "404 Not Found"));
  EXPECT_TRUE(Has(Scrape(port, "/metrics"), "ps_resent_total"));
  m.StopServing();
  EXPECT_EQ(Scrape(port), "");  // refused: nobody listens
}

// A client that sends its request a byte at a time, never finishing,
// holds the endpoint for one connection's time at most: a scrape after it
// is answered, and StopServing returns while it still trickles.
TEST(Metrics, ATricklingClientHoldsNeitherScrapesNorStop) {
  Metrics m(Role::kServer);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0).ok());
  auto dial = [&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(m.port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0);
    return fd;
  };
  std::atomic<bool> trickle{true};
  auto trickler = [&](int fd) {
    for (int i = 0; i < 600 && trickle.load(); ++i) {  // 60 s at most
      if (send(fd, "G", 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    close(fd);
  };
  std::thread first(trickler, dial());
  EXPECT_TRUE(Has(Scrape(m.port()), "200 OK"));  // after its deadline
  std::thread second(trickler, dial());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    m.StopServing();
    stopped.store(true);
  });
  for (int i = 0; i < 200 && !stopped.load(); ++i) {  // 20 s at most
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(stopped.load()) << "StopServing waited on a trickling client";
  trickle.store(false);
  for (std::thread* t : {&first, &second, &stopper}) t->join();
}

TEST(Metrics, ABusyPortIsAnErrorNamingIt) {
  Metrics first(Role::kServer);
  ASSERT_TRUE(first.Serve("127.0.0.1", 0).ok());
  Metrics second(Role::kWorker);
  Status st = second.Serve("127.0.0.1", first.port());
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), "127.0.0.1:" + std::to_string(first.port())))
      << st;
  EXPECT_TRUE(Has(st.message(), "PS_METRICS_PORT")) << st;
}

}  // namespace
}  // namespace ps
