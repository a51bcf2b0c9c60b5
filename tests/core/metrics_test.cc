// PrometheusMetrics (src/exporter): what the registry counts, how it names
// peers and refusals, that /metrics is served over HTTP on the port and only
// the address it says, that a token keeps it from whoever lacks it, and the
// options that choose both (PS_METRICS_HOST, PS_METRICS_TOKEN_FILE).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "exporter/prometheus_metrics.h"
#include "http_get.h"
#include "ps/config.h"

namespace ps {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

std::string Scrape(int port, const std::string& path = "/metrics") {
  return HttpGet(port, path);
}

TEST(Metrics, CountsTrafficPerPeerWithRoleAndRank) {
  PrometheusMetrics m(Role::kWorker);
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
  PrometheusMetrics m(Role::kServer);
  m.Received(-5, 1);  // a registering node's temporary id
  m.Received(PrometheusMetrics::kMaxPeerIds + 1, 1);
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
  PrometheusMetrics m(Role::kServer);
  m.Refused(ClassifyRefusal("unknown sender of DATA"));
  m.Refused(RefusalReason::kAuthentication);
  m.Refused(RefusalReason::kAuthentication);
  const std::string text = m.Text();
  EXPECT_TRUE(Has(text, "reason=\"authentication\"} 2")) << text;
  EXPECT_TRUE(Has(text, "reason=\"not_a_member\"} 1")) << text;
  EXPECT_TRUE(Has(text, "reason=\"size\"} 0")) << text;
}

TEST(Metrics, RequestsByOpInAHistogram) {
  PrometheusMetrics m(Role::kWorker);
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
  PrometheusMetrics m(Role::kScheduler);
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
  PrometheusMetrics m(Role::kWorker);
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
  PrometheusMetrics m(Role::kServer);
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
  PrometheusMetrics m(Role::kServer);
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
  PrometheusMetrics m(Role::kWorker);
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
  PrometheusMetrics m(Role::kServer);
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
  PrometheusMetrics first(Role::kServer);
  ASSERT_TRUE(first.Serve("127.0.0.1", 0).ok());
  PrometheusMetrics second(Role::kWorker);
  Status st = second.Serve("127.0.0.1", first.port());
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), "127.0.0.1:" + std::to_string(first.port())))
      << st;
  EXPECT_TRUE(Has(st.message(), "PS_METRICS_PORT")) << st;
}

constexpr char kToken[] = "s3cret-metrics-token-0123456789";

std::string Bearer(const std::string& token) {
  return "Authorization: Bearer " + token + "\r\n";
}

TEST(Metrics, WithATokenAScrapeWithoutItGets401AndNoMetrics) {
  PrometheusMetrics m(Role::kServer);
  m.Sent(WorkerRankToId(0), 42);
  ASSERT_TRUE(m.Serve("127.0.0.1", 0, kToken).ok());
  const std::string wrong_ones[] = {
      "",                                         // no header
      Bearer("s3cret-metrics-token-0123456788"),  // one character off
      Bearer("s3cret-metrics-token-012345678"),   // a prefix
      Bearer(std::string(kToken) + "9"),          // longer
      "Authorization: Basic " + std::string(kToken) + "\r\n",
      "Authorization: Bearer\r\n",
      "X-Authorization: Bearer " + std::string(kToken) + "\r\n",
  };
  for (const std::string& headers : wrong_ones) {
    SCOPED_TRACE(headers);
    const std::string reply =
        HttpGetFrom("127.0.0.1", m.port(), "/metrics", headers);
    EXPECT_EQ(reply.rfind("HTTP/1.0 401 Unauthorized\r\n", 0), 0u) << reply;
    EXPECT_TRUE(Has(reply, "WWW-Authenticate: Bearer")) << reply;
    EXPECT_FALSE(Has(reply, "ps_")) << reply;
  }
  // Other paths too: nothing but 401 without the token.
  EXPECT_TRUE(Has(HttpGetFrom("127.0.0.1", m.port(), "/"), "401"));
  const std::string right =
      HttpGetFrom("127.0.0.1", m.port(), "/metrics", Bearer(kToken));
  EXPECT_EQ(right.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << right;
  EXPECT_TRUE(Has(right,
                  "ps_bytes_sent_total{role=\"server\",rank=\"\","
                  "peer=\"worker0\"} 42"))
      << right;
  // Header name and scheme in any case (RFC 9110), spaces around.
  EXPECT_TRUE(Has(
      HttpGetFrom("127.0.0.1", m.port(), "/metrics",
                  "authorization:  bearer  " + std::string(kToken) + " \r\n"),
      "200 OK"));
}

// Loopback is a /8: a socket bound to 127.0.0.1 is not reached at
// 127.0.0.2, so a refused connect there shows the bind is not INADDR_ANY.
TEST(Metrics, ListensOnlyOnTheAddressItIsGiven) {
  PrometheusMetrics one(Role::kServer);
  ASSERT_TRUE(one.Serve("127.0.0.1", 0).ok());
  EXPECT_EQ(one.address(), "127.0.0.1");
  EXPECT_TRUE(Connects("127.0.0.1", one.port()));
  EXPECT_FALSE(Connects("127.0.0.2", one.port()));
  PrometheusMetrics two(Role::kServer);
  ASSERT_TRUE(two.Serve("127.0.0.2", 0).ok());
  EXPECT_TRUE(Has(HttpGetFrom("127.0.0.2", two.port()), "200 OK"));
  EXPECT_FALSE(Connects("127.0.0.1", two.port()));
  PrometheusMetrics every(Role::kServer);
  ASSERT_TRUE(every.Serve("0.0.0.0", 0).ok());
  EXPECT_EQ(every.address(), "0.0.0.0");
  EXPECT_TRUE(Connects("127.0.0.1", every.port()));
  EXPECT_TRUE(Connects("127.0.0.3", every.port()));
}

TEST(Metrics, ANameListensOnTheAddressItResolvesTo) {
  // A system without /etc/hosts (a bare root filesystem) resolves no name.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo("localhost", nullptr, &hints, &found) != 0) {
    GTEST_SKIP() << "'localhost' does not resolve here (no /etc/hosts?)";
  }
  freeaddrinfo(found);
  PrometheusMetrics m(Role::kWorker);
  ASSERT_TRUE(m.Serve("localhost", 0).ok());
  EXPECT_EQ(m.address(), "127.0.0.1");
  EXPECT_FALSE(Connects("127.0.0.2", m.port()));
  PrometheusMetrics none(Role::kWorker);
  Status st = none.Serve("", 0);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), "PS_METRICS_HOST")) << st;
  EXPECT_EQ(none.port(), 0);
}

// The options, as tests/core/options_test.cc reads them.
using Env = std::map<std::string, std::string>;

Env BaseEnv() {
  return {{"DMLC_ROLE", "worker"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "1"},
          {"DMLC_NUM_WORKER", "1"}};
}

std::string ErrorOf(const Env& extra) {
  Env env = BaseEnv();
  env.insert(extra.begin(), extra.end());
  StatusOr<Config> c = Config::FromEnv(env);
  return c.ok() ? "" : c.status().message();
}

TEST(MetricsOptions, TheHostIsANumericIPv4Address) {
  StatusOr<Config> c = Config::FromEnv(BaseEnv());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_host, "");  // the node's host
  Env env = BaseEnv();
  env["PS_METRICS_HOST"] = "0.0.0.0";
  c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_host, "0.0.0.0");
  for (const char* bad :
       {"localhost", "10.0.0", "10.0.0.256", " 10.0.0.1", "::1", "*"}) {
    EXPECT_EQ(ErrorOf({{"PS_METRICS_HOST", bad}}),
              std::string("PS_METRICS_HOST='") + bad +
                  "' is not an IPv4 address (0.0.0.0: every interface)");
  }
  EXPECT_EQ(ErrorOf({{"PS_METRICS_HOST", ""}}),
            "PS_METRICS_HOST='' is not an IPv4 address (0.0.0.0: every "
            "interface)");
}

class TokenFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) /
           ("metrics-token-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(TokenFileTest, TheFirstLineIsTheTokenAndIsNeverLogged) {
  Env env = BaseEnv();
  env["PS_METRICS_TOKEN_FILE"] = Write("token", std::string(kToken) + " \r\n");
  StatusOr<Config> c = Config::FromEnv(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_token, kToken);
  EXPECT_EQ(c->metrics_token_file, env["PS_METRICS_TOKEN_FILE"]);
  EXPECT_FALSE(Has(c->ToString(), kToken)) << c->ToString();
  EXPECT_TRUE(
      Has(c->ToString(), "metrics_token_file=" + c->metrics_token_file));
}

TEST_F(TokenFileTest, ABadFileIsRefusedNamingIt) {
  const std::string missing = (dir_ / "missing").string();
  EXPECT_EQ(ErrorOf({{"PS_METRICS_TOKEN_FILE", missing}}),
            "PS_METRICS_TOKEN_FILE='" + missing +
                "': cannot read the token file: No such file or directory");
  const std::string dir = dir_.string();
  EXPECT_EQ(ErrorOf({{"PS_METRICS_TOKEN_FILE", dir}}),
            "PS_METRICS_TOKEN_FILE='" + dir +
                "' is not a regular file (a token file's first line is 16 "
                "to 256 printable characters without spaces)");
  EXPECT_EQ(ErrorOf({{"PS_METRICS_TOKEN_FILE", "/dev/zero"}}),
            "PS_METRICS_TOKEN_FILE='/dev/zero' is not a regular file (a "
            "token file's first line is 16 to 256 printable characters "
            "without spaces)");
  const std::string big = Write("big", std::string(5000, 'a'));
  EXPECT_EQ(ErrorOf({{"PS_METRICS_TOKEN_FILE", big}}),
            "PS_METRICS_TOKEN_FILE='" + big +
                "' is 5000 bytes, more than a token file's 4096");
  const std::string cases[][2] = {{"short", "zq7\n"},
                                  {"spaced", "zq a token with spaces\n"},
                                  {"empty", ""},
                                  {"long", std::string(257, 'z') + "\n"}};
  for (const auto& [name, text] : cases) {
    const std::string path = Write(name, text);
    const std::string error = ErrorOf({{"PS_METRICS_TOKEN_FILE", path}});
    EXPECT_EQ(error.rfind("PS_METRICS_TOKEN_FILE='" + path +
                              "' does not hold a token (a token file's",
                          0),
              0u)
        << error;
    EXPECT_FALSE(Has(error, "zq") || Has(error, "zzz")) << error;  // unshown
  }
}

}  // namespace
}  // namespace ps
