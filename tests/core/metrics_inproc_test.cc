// /metrics of a whole job in one process (cluster.h): what the postoffice
// and the KV worker report, as a scrape over HTTP sees it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cluster.h"
#include "http_get.h"
#include "ps/kv_app.h"

namespace ps {
namespace {

// The value of the series `series` (name and labels, as written) in a
// scrape, or -1 when absent.
double ValueOf(const std::string& scrape, const std::string& series) {
  const size_t at = scrape.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(scrape.substr(at + series.size() + 2));
}

TEST(MetricsInProc, AScrapeSeesTrafficRequestsAndPeers) {
  DefaultJob job(1, 1, [](Config* c) { c->metrics_port = 0; });
  ASSERT_TRUE(job.Start());
  for (Node* n : job.All()) ASSERT_GT(n->metrics_port(), 0);
  {
    KVWorker<float> kv(job.workers[0].get(), 0, 0);
    std::vector<Key> keys = {1, 2, 3};
    std::vector<float> vals = {1, 2, 3}, out;
    ASSERT_TRUE(kv.Wait(kv.Push(keys, vals)).ok());
    ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
    EXPECT_EQ(out, vals);
  }
  ASSERT_TRUE(job.workers[0]->SetMetric("ps_samples_per_second", 12.5));

  const std::string worker = HttpGet(job.workers[0]->metrics_port());
  const std::string w = "{role=\"worker\",rank=\"0\",";
  EXPECT_EQ(ValueOf(worker, "ps_request_seconds_count" + w + "op=\"push\"}"), 1)
      << worker;
  EXPECT_EQ(ValueOf(worker, "ps_request_seconds_count" + w + "op=\"pull\"}"),
            1);
  EXPECT_GT(ValueOf(worker, "ps_bytes_sent_total" + w + "peer=\"server0\"}"),
            3 * sizeof(float));
  EXPECT_GE(
      ValueOf(worker, "ps_messages_received_total" + w + "peer=\"server0\"}"),
      2);
  EXPECT_EQ(ValueOf(worker,
                    "ps_peer_state" + w + "peer=\"scheduler\",state=\"live\"}"),
            1);
  EXPECT_EQ(
      ValueOf(worker, "ps_samples_per_second{role=\"worker\",rank=\"0\"}"),
      12.5);

  const std::string scheduler = HttpGet(job.scheduler->metrics_port());
  EXPECT_GE(ValueOf(scheduler,
                    "ps_peer_heartbeat_age_seconds{role=\"scheduler\","
                    "rank=\"0\",peer=\"server0\"}"),
            0)
      << scheduler;
  EXPECT_EQ(ValueOf(scheduler,
                    "ps_peer_state{role=\"scheduler\",rank=\"0\","
                    "peer=\"worker0\",state=\"live\"}"),
            1);
  EXPECT_TRUE(job.Finalize());
  // Stopped: nothing listens any more.
  EXPECT_EQ(HttpGet(job.workers[0]->metrics_port()), "");
}

TEST(MetricsInProc, OffUnlessAsked) {
  DefaultJob job(1, 1);
  ASSERT_TRUE(job.Start());
  for (Node* n : job.All()) EXPECT_EQ(n->metrics_port(), 0);
  EXPECT_TRUE(job.Finalize());
}

TEST(MetricsInProc, ABusyMetricsPortFailsTheNodeNamingIt) {
  Config c = TestConfig(Role::kScheduler, 1, 1);
  c.metrics_port = 0;
  Node first(c);
  ASSERT_TRUE(first.Bind().ok());
  c.metrics_port = first.metrics_port();
  Node second(c);
  Status st = second.Bind();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(":" + std::to_string(first.metrics_port())),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("PS_METRICS_PORT"), std::string::npos) << st;
}

// Loopback is a /8: a node whose host is 127.0.0.2 is not scraped at
// 127.0.0.1, which shows /metrics did not listen on every interface.
TEST(MetricsInProc, ByDefaultItListensOnTheNodeHostOnly) {
  Config c = TestConfig(Role::kScheduler, 1, 1);
  c.node_host = "127.0.0.2";
  c.metrics_port = 0;
  Node node(c);
  ASSERT_TRUE(node.Bind().ok());
  const int port = node.metrics_port();
  EXPECT_NE(HttpGetFrom("127.0.0.2", port).find("ps_resent_total"),
            std::string::npos);
  EXPECT_FALSE(Connects("127.0.0.1", port));
  EXPECT_FALSE(Connects("127.0.0.3", port));
}

TEST(MetricsInProc, PsMetricsHostChoosesTheAddress) {
  Config c = TestConfig(Role::kScheduler, 1, 1);
  c.node_host = "127.0.0.2";
  c.metrics_host = "127.0.0.3";
  c.metrics_port = 0;
  Node node(c);
  ASSERT_TRUE(node.Bind().ok());
  EXPECT_TRUE(Connects("127.0.0.3", node.metrics_port()));
  EXPECT_FALSE(Connects("127.0.0.2", node.metrics_port()));
  c.metrics_host = "0.0.0.0";  // every interface, on purpose
  Node every(c);
  ASSERT_TRUE(every.Bind().ok());
  EXPECT_TRUE(Connects("127.0.0.1", every.metrics_port()));
  EXPECT_TRUE(Connects("127.0.0.2", every.metrics_port()));
}

TEST(MetricsInProc, TheConfigsTokenGuardsTheNodesMetrics) {
  Config c = TestConfig(Role::kScheduler, 1, 1);
  c.metrics_port = 0;
  c.metrics_token = "a-token-of-the-job-0123456789";
  Node node(c);
  ASSERT_TRUE(node.Bind().ok());
  const int port = node.metrics_port();
  for (const std::string& headers :
       {std::string(""),
        std::string(
            "Authorization: Bearer a-token-of-the-job-012345678\r\n")}) {
    const std::string reply =
        HttpGetFrom("127.0.0.1", port, "/metrics", headers);
    EXPECT_EQ(reply.rfind("HTTP/1.0 401 Unauthorized", 0), 0u) << reply;
    EXPECT_EQ(reply.find("ps_"), std::string::npos) << reply;
  }
  const std::string reply =
      HttpGetFrom("127.0.0.1", port, "/metrics",
                  "Authorization: Bearer a-token-of-the-job-0123456789\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.0 200 OK", 0), 0u) << reply;
  EXPECT_NE(reply.find("ps_resent_total{role=\"scheduler\""), std::string::npos)
      << reply;
}

}  // namespace
}  // namespace ps
