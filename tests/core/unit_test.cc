// Unit tests: Status, SArray, Config, Placement, slicer, codec, tracker.
#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "kv/request_tracker.h"
#include "kv/slicer.h"
#include "ps/config.h"
#include "ps/internal/env.h"
#include "ps/internal/utils.h"
#include "ps/placement.h"
#include "ps/sarray.h"
#include "ps/status.h"
#include "van/codec.h"
#include "van/shm.h"

namespace ps {
namespace {

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status().ok());
  Status t = Status::Timeout("x took too long");
  EXPECT_FALSE(t.ok());
  EXPECT_EQ(t.code(), Status::kTimeout);
  EXPECT_EQ(t.ToString(), "Timeout: x took too long");
  StatusOr<int> v = 7;
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v.value(), 7);
  StatusOr<int> e = Status::NotFound("no 7");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "no 7");
}

TEST(SArray, SharesSegmentsAndReinterprets) {
  SArray<float> a(std::vector<float>{1, 2, 3, 4});
  SArray<float> seg = a.segment(1, 3);
  EXPECT_EQ(seg.data(), a.data() + 1);
  seg[0] = 20;
  EXPECT_EQ(a[1], 20);
  SArray<char> bytes(a);
  EXPECT_EQ(bytes.size(), 16u);
  EXPECT_EQ(static_cast<void*>(bytes.data()), static_cast<void*>(a.data()));
  SArray<float> back(bytes);
  EXPECT_EQ(back[3], 4);
  std::vector<float> v{5, 6};
  SArray<float> copy(v);
  EXPECT_NE(copy.data(), v.data());
  EXPECT_EQ(copy[1], 6);
}

TEST(SArray, AdoptsWithDeleter) {
  int deleted = 0;
  {
    static float buffer[3] = {1, 2, 3};
    SArray<float> a(buffer, 3, [&](float*) { ++deleted; });
    SArray<float> b = a.segment(0, 1);
    a = SArray<float>();
    EXPECT_EQ(deleted, 0);  // b still holds it
  }
  EXPECT_EQ(deleted, 1);
}

TEST(Config, ReadsEnvironment) {
  StatusOr<Config> c = Config::FromEnv({{"DMLC_ROLE", "worker"},
                                        {"DMLC_PS_ROOT_URI", "10.0.0.1"},
                                        {"DMLC_PS_ROOT_PORT", "9000"},
                                        {"DMLC_NUM_SERVER", "2"},
                                        {"DMLC_NUM_WORKER", "3"},
                                        {"PS_PORT_RANGE", "7000-7010"},
                                        {"PS_RANK", "2"},
                                        {"DMLC_INTERFACE", "lo"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, Role::kWorker);
  EXPECT_EQ(c->SchedulerAddress(), "tcp://10.0.0.1:9000");
  EXPECT_EQ(c->num_servers, 2);
  EXPECT_EQ(c->num_workers, 3);
  EXPECT_EQ(c->port_range_lo, 7000);
  EXPECT_EQ(c->port_range_hi, 7010);
  EXPECT_EQ(c->rank, 2);
  EXPECT_EQ(c->node_host, "127.0.0.1");
}

TEST(Config, BadValuesNameVariableAndValue) {
  std::map<std::string, std::string> base = {{"DMLC_ROLE", "server"},
                                             {"DMLC_PS_ROOT_PORT", "9000"},
                                             {"DMLC_NUM_SERVER", "1"},
                                             {"DMLC_NUM_WORKER", "1"}};
  auto err = [&](const std::string& name, const std::string& value) {
    auto env = base;
    env[name] = value;
    return Config::FromEnv(env).status().message();
  };
  EXPECT_EQ(err("DMLC_NUM_SERVER", "abc"),
            "DMLC_NUM_SERVER='abc' is not a positive integer");
  EXPECT_EQ(err("DMLC_NUM_WORKER", "0"),
            "DMLC_NUM_WORKER='0' is not a positive integer");
  EXPECT_EQ(err("DMLC_ROLE", "boss"),
            "DMLC_ROLE='boss' is not scheduler, server or worker");
  EXPECT_EQ(err("DMLC_PS_ROOT_PORT", "70000"),
            "DMLC_PS_ROOT_PORT='70000' is not a port number (1-65535)");
  EXPECT_EQ(err("PS_PORT_RANGE", "9-3"),
            "PS_PORT_RANGE='9-3' is not a port range lo-hi");
  EXPECT_EQ(err("PS_RANK", "1"), "PS_RANK='1' is out of range for 1 servers");
  EXPECT_EQ(
      err("DMLC_INTERFACE", "nosuch0"),
      "DMLC_INTERFACE='nosuch0' is not an interface with an IPv4 address");
  EXPECT_EQ(err("PS_SHM", "2"), "PS_SHM='2' is not 0 or 1");
  auto env = base;
  env.erase("DMLC_NUM_SERVER");
  EXPECT_EQ(Config::FromEnv(env).status().message(),
            "DMLC_NUM_SERVER is not set (expected a positive integer)");
}

// Resending is on by default, its timer following the measured round trip;
// PS_RESEND_TIMEOUT_MS sets a fixed one, ps-lite's names work too, and the
// drop switch is a percentage.
TEST(Config, ResendSettings) {
  std::map<std::string, std::string> base = {{"DMLC_ROLE", "worker"},
                                             {"DMLC_PS_ROOT_PORT", "9000"},
                                             {"DMLC_NUM_SERVER", "1"},
                                             {"DMLC_NUM_WORKER", "1"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    auto env = base;
    for (auto& [k, v] : extra) env[k] = v;
    return Config::FromEnv(env);
  };
  EXPECT_EQ(with({})->resend_timeout_ms, 1000);
  EXPECT_TRUE(with({})->resend_adaptive);
  EXPECT_TRUE(with({{"PS_RESEND", "1"}})->resend_adaptive);
  EXPECT_FALSE(with({{"PS_RESEND_TIMEOUT_MS", "1000"}})->resend_adaptive);
  EXPECT_FALSE(with({{"PS_RESEND_TIMEOUT", "1000"}})->resend_adaptive);
  EXPECT_EQ(with({})->drop_percent, 0);
  EXPECT_EQ(with({{"PS_RESEND_TIMEOUT_MS", "250"}})->resend_timeout_ms, 250);
  EXPECT_EQ(with({{"PS_RESEND_TIMEOUT", "300"}})->resend_timeout_ms, 300);
  EXPECT_EQ(with({{"PS_RESEND_TIMEOUT", "300"}, {"PS_RESEND_TIMEOUT_MS", "7"}})
                ->resend_timeout_ms,
            7);
  EXPECT_EQ(with({{"PS_RESEND", "0"}})->resend_timeout_ms, 0);
  EXPECT_EQ(with({{"PS_RESEND", "1"}})->resend_timeout_ms, 1000);
  EXPECT_EQ(with({{"PS_DROP_MSG", "5"}})->drop_percent, 5);
  EXPECT_EQ(with({{"PS_DROP_MSG", "100"}}).status().message(),
            "PS_DROP_MSG='100' is not a percentage in [0, 99]");
  EXPECT_EQ(with({{"PS_RESEND_TIMEOUT_MS", "-1"}}).status().message(),
            "PS_RESEND_TIMEOUT_MS='-1' is not a non-negative integer");
  EXPECT_EQ(with({{"PS_RESEND", "2"}}).status().message(),
            "PS_RESEND='2' is not 0 or 1");
}

// Restarts are off by default (PS_MAX_RESTARTS 0) and a dead worker is
// awaited 60 s when they are on; bad values name the variable and value.
TEST(Config, RestartSettings) {
  std::map<std::string, std::string> base = {{"DMLC_ROLE", "worker"},
                                             {"DMLC_PS_ROOT_PORT", "9000"},
                                             {"DMLC_NUM_SERVER", "1"},
                                             {"DMLC_NUM_WORKER", "2"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    auto env = base;
    for (auto& [k, v] : extra) env[k] = v;
    return Config::FromEnv(env);
  };
  StatusOr<Config> defaults = with({});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->max_restarts, 0);
  EXPECT_EQ(defaults->rejoin_timeout_ms, 60000);
  EXPECT_EQ(Config().max_restarts, 0);
  EXPECT_EQ(Config().rejoin_timeout_ms, 60000);

  StatusOr<Config> c =
      with({{"PS_MAX_RESTARTS", "3"}, {"PS_REJOIN_TIMEOUT_MS", "1500"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_restarts, 3);
  EXPECT_EQ(c->rejoin_timeout_ms, 1500);
  EXPECT_NE(c->ToString().find("max_restarts=3 rejoin_timeout_ms=1500"),
            std::string::npos)
      << c->ToString();
  EXPECT_EQ(with({{"PS_MAX_RESTARTS", "0"}})->max_restarts, 0);
  EXPECT_EQ(with({{"PS_REJOIN_TIMEOUT_MS", "1"}})->rejoin_timeout_ms, 1);
  // Each is read on its own: the timeout alone keeps restarts off.
  EXPECT_EQ(with({{"PS_REJOIN_TIMEOUT_MS", "250"}})->max_restarts, 0);
  EXPECT_EQ(with({{"PS_MAX_RESTARTS", "1"}})->rejoin_timeout_ms, 60000);

  auto err = [&](const std::string& name, const std::string& value) {
    return with({{name, value}}).status().message();
  };
  EXPECT_EQ(err("PS_MAX_RESTARTS", "-1"),
            "PS_MAX_RESTARTS='-1' is not a non-negative integer");
  EXPECT_EQ(err("PS_MAX_RESTARTS", "x"),
            "PS_MAX_RESTARTS='x' is not a non-negative integer");
  EXPECT_EQ(err("PS_MAX_RESTARTS", ""),
            "PS_MAX_RESTARTS='' is not a non-negative integer");
  EXPECT_EQ(err("PS_MAX_RESTARTS", "2147483648"),
            "PS_MAX_RESTARTS='2147483648' is not a non-negative integer");
  EXPECT_EQ(err("PS_REJOIN_TIMEOUT_MS", "0"),
            "PS_REJOIN_TIMEOUT_MS='0' is not a positive number of "
            "milliseconds");
  EXPECT_EQ(err("PS_REJOIN_TIMEOUT_MS", "-5"),
            "PS_REJOIN_TIMEOUT_MS='-5' is not a positive number of "
            "milliseconds");
  EXPECT_EQ(err("PS_REJOIN_TIMEOUT_MS", "x"),
            "PS_REJOIN_TIMEOUT_MS='x' is not a positive number of "
            "milliseconds");
  EXPECT_EQ(err("PS_REJOIN_TIMEOUT_MS", "1.5"),
            "PS_REJOIN_TIMEOUT_MS='1.5' is not a positive number of "
            "milliseconds");
  EXPECT_EQ(with({{"PS_REJOIN_TIMEOUT_MS", "0"}}).status().code(),
            Status::kInvalidArgument);
}

// A job's environment for one server of one server and one worker.
std::map<std::string, std::string> ServerEnv() {
  return {{"DMLC_ROLE", "server"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "1"},
          {"DMLC_NUM_WORKER", "1"}};
}

TEST(ConfigFlags, SetFlagsWinOverTheEnvironment) {
  gflags::FlagSaver restore_flags_at_exit;
  auto env = ServerEnv();
  env["DMLC_NUM_WORKER"] = "5";
  env["PS_CONNECT_TIMEOUT_MS"] = "1234";
  for (auto [flag, value] :
       std::map<std::string, std::string>{{"ps_role", "worker"},
                                          {"ps_root_uri", "10.0.0.2"},
                                          {"ps_root_port", "9100"},
                                          {"ps_num_servers", "3"},
                                          {"ps_port_range", "7000-7001"},
                                          {"ps_rank", "4"},
                                          {"ps_heartbeat_interval_ms", "0"},
                                          {"ps_request_timeout_ms", "250"},
                                          {"ps_wait_spin_us", "7"},
                                          {"ps_max_key", "8589934592"},
                                          {"ps_verbose", "2"}}) {
    ASSERT_FALSE(
        gflags::SetCommandLineOption(flag.c_str(), value.c_str()).empty())
        << flag;
  }
  StatusOr<Config> c = Config::FromEnvAndFlags(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, Role::kWorker);
  EXPECT_EQ(c->SchedulerAddress(), "tcp://10.0.0.2:9100");
  EXPECT_EQ(c->num_servers, 3);
  EXPECT_EQ(c->num_workers, 5);            // no flag: the variable
  EXPECT_EQ(c->connect_timeout_ms, 1234);  // no flag: the variable
  EXPECT_EQ(c->port_range_lo, 7000);
  EXPECT_EQ(c->port_range_hi, 7001);
  EXPECT_EQ(c->rank, 4);
  EXPECT_EQ(c->heartbeat_interval_ms, 0);
  EXPECT_EQ(c->request_timeout_ms, 250);
  EXPECT_EQ(c->wait_spin_us, 7);
  EXPECT_EQ(c->max_key, Key{8589934592});
  EXPECT_EQ(c->verbose, 2);
  // FromEnv reads no flags.
  EXPECT_EQ(Config::FromEnv(env)->num_servers, 1);
}

TEST(ConfigFlags, UnsetFlagsChangeNothing) {
  auto env = ServerEnv();
  env["PS_PORT_RANGE"] = "7000-7010";
  env["PS_HEARTBEAT_TIMEOUT_MS"] = "5000";
  StatusOr<Config> flags = Config::FromEnvAndFlags(env);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->ToString(), Config::FromEnv(env)->ToString());
}

TEST(ConfigFlags, FlagsAloneMakeAConfig) {
  gflags::FlagSaver restore_flags_at_exit;
  gflags::SetCommandLineOption("ps_role", "scheduler");
  gflags::SetCommandLineOption("ps_root_port", "9300");
  gflags::SetCommandLineOption("ps_num_servers", "2");
  gflags::SetCommandLineOption("ps_num_workers", "2");
  StatusOr<Config> c = Config::FromEnvAndFlags({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, Role::kScheduler);
  EXPECT_EQ(c->port, 9300);
}

TEST(ConfigFlags, NodeHostFlagsWinInOrder) {
  gflags::FlagSaver restore_flags_at_exit;
  auto env = ServerEnv();
  env["DMLC_NODE_HOST"] = "10.1.1.1";
  gflags::SetCommandLineOption("ps_interface", "lo");
  EXPECT_EQ(Config::FromEnvAndFlags(env)->node_host, "127.0.0.1");
  gflags::SetCommandLineOption("ps_node_host", "10.2.2.2");
  EXPECT_EQ(Config::FromEnvAndFlags(env)->node_host, "10.2.2.2");
}

TEST(ConfigFlags, BadValuesNameTheFlagAndValue) {
  auto err = [](const char* flag, const char* value) {
    gflags::FlagSaver restore_flags_at_exit;
    EXPECT_FALSE(gflags::SetCommandLineOption(flag, value).empty()) << flag;
    return Config::FromEnvAndFlags(ServerEnv()).status().message();
  };
  EXPECT_EQ(err("ps_num_servers", "0"),
            "--ps_num_servers='0' is not a positive integer");
  EXPECT_EQ(err("ps_role", "boss"),
            "--ps_role='boss' is not scheduler, server or worker");
  EXPECT_EQ(err("ps_root_port", "70000"),
            "--ps_root_port='70000' is not a port number (1-65535)");
  EXPECT_EQ(err("ps_port_range", "9-3"),
            "--ps_port_range='9-3' is not a port range lo-hi");
  EXPECT_EQ(err("ps_rank", "1"), "--ps_rank='1' is out of range for 1 servers");
  EXPECT_EQ(err("ps_heartbeat_timeout_ms", "500"),
            "--ps_heartbeat_timeout_ms='500' is not greater than "
            "PS_HEARTBEAT_INTERVAL_MS (1000)");
  EXPECT_EQ(err("ps_verbose", "3"), "--ps_verbose='3' is not 0, 1 or 2");
  EXPECT_EQ(err("ps_max_key", "-7"),
            "--ps_max_key='-7' is not a positive integer");
  EXPECT_EQ(
      err("ps_interface", "nosuch0"),
      "--ps_interface='nosuch0' is not an interface with an IPv4 address");
  // Not a number at all: gflags itself refuses it, naming flag and value.
  EXPECT_TRUE(gflags::SetCommandLineOption("ps_num_workers", "abc").empty());
}

// --ps_max_restarts and --ps_rejoin_timeout_ms win over their variables;
// at their default (-1) the variables decide.
TEST(ConfigFlags, RestartFlagsWinOverTheEnvironment) {
  auto env = ServerEnv();
  env["PS_MAX_RESTARTS"] = "1";
  env["PS_REJOIN_TIMEOUT_MS"] = "9000";
  {
    StatusOr<Config> c = Config::FromEnvAndFlags(env);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->max_restarts, 1);
    EXPECT_EQ(c->rejoin_timeout_ms, 9000);
  }
  gflags::FlagSaver restore_flags_at_exit;
  ASSERT_FALSE(gflags::SetCommandLineOption("ps_max_restarts", "4").empty());
  ASSERT_FALSE(
      gflags::SetCommandLineOption("ps_rejoin_timeout_ms", "700").empty());
  StatusOr<Config> c = Config::FromEnvAndFlags(env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_restarts, 4);
  EXPECT_EQ(c->rejoin_timeout_ms, 700);
  // Flags alone, without the variables.
  c = Config::FromEnvAndFlags(ServerEnv());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_restarts, 4);
  EXPECT_EQ(c->rejoin_timeout_ms, 700);
  // FromEnv reads no flags.
  EXPECT_EQ(Config::FromEnv(env)->max_restarts, 1);
  EXPECT_EQ(Config::FromEnv(env)->rejoin_timeout_ms, 9000);
  // Back at -1 the variables decide again.
  gflags::SetCommandLineOption("ps_max_restarts", "-1");
  gflags::SetCommandLineOption("ps_rejoin_timeout_ms", "-1");
  EXPECT_EQ(Config::FromEnvAndFlags(env)->max_restarts, 1);
  EXPECT_EQ(Config::FromEnvAndFlags(env)->rejoin_timeout_ms, 9000);
}

TEST(ConfigFlags, BadRestartFlagsNameTheFlagAndValue) {
  auto err = [](const char* flag, const char* value) {
    gflags::FlagSaver restore_flags_at_exit;
    EXPECT_FALSE(gflags::SetCommandLineOption(flag, value).empty()) << flag;
    return Config::FromEnvAndFlags(ServerEnv()).status().message();
  };
  EXPECT_EQ(err("ps_max_restarts", "-2"),
            "--ps_max_restarts='-2' is not a non-negative integer");
  EXPECT_EQ(err("ps_rejoin_timeout_ms", "0"),
            "--ps_rejoin_timeout_ms='0' is not a positive number of "
            "milliseconds");
  EXPECT_EQ(err("ps_rejoin_timeout_ms", "-3"),
            "--ps_rejoin_timeout_ms='-3' is not a positive number of "
            "milliseconds");
  // A bad flag is reported even where the variable is good.
  {
    gflags::FlagSaver restore_flags_at_exit;
    gflags::SetCommandLineOption("ps_max_restarts", "-2");
    auto env = ServerEnv();
    env["PS_MAX_RESTARTS"] = "1";
    EXPECT_EQ(Config::FromEnvAndFlags(env).status().message(),
              "--ps_max_restarts='-2' is not a non-negative integer");
  }
  EXPECT_TRUE(gflags::SetCommandLineOption("ps_max_restarts", "x").empty());
  EXPECT_TRUE(
      gflags::SetCommandLineOption("ps_rejoin_timeout_ms", "x").empty());
}

TEST(Placement, EvenKeysIsPsLiteSplit) {
  Placement p = Placement::EvenKeys(4, 100);
  EXPECT_EQ(p.begin(1), 25u);
  EXPECT_EQ(p.ServerOf(24), 0);
  EXPECT_EQ(p.ServerOf(75), 3);
  EXPECT_EQ(p.ServerOf(kMaxKey), 3);
}

TEST(Placement, ByBytesBalancesBytes) {
  // A dense model: 4 tensors, fc1 dominating as in the reference ConvNet.
  std::vector<Key> keys = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<uint64_t> bytes = {288, 32, 18432, 64, 1179648, 128, 1280, 10};
  StatusOr<Placement> p = Placement::ByBytes(keys, bytes, 2);
  ASSERT_TRUE(p.ok());
  // Half of fc1's bytes fall past the midpoint: it starts server 1.
  EXPECT_EQ(p->ServerOf(3), 0);
  EXPECT_EQ(p->ServerOf(4), 1);
  EXPECT_EQ(p->ServerOf(7), 1);
  // Even chunks: 1000 equal keys over 3 servers -> 334/333/333.
  std::vector<Key> many(1000);
  std::iota(many.begin(), many.end(), 0);
  StatusOr<Placement> q =
      Placement::ByBytes(many, std::vector<uint64_t>(1000, 4), 3);
  ASSERT_TRUE(q.ok());
  std::vector<size_t> cut = q->Slice(many.data(), many.size());
  EXPECT_EQ(cut, (std::vector<size_t>{0, 333, 667, 1000}));
  EXPECT_NE(q->Describe().find("33.3%"), std::string::npos) << q->Describe();
  EXPECT_FALSE(Placement::ByBytes({2, 1}, {1, 1}, 2).ok());
}

TEST(Slicer, SegmentsWithoutCopies) {
  detail::RawKVPairs kvs;
  kvs.keys = SArray<Key>(std::vector<Key>{1, 5, 10, 12});
  kvs.vals =
      SArray<char>(SArray<float>(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  Placement p = Placement::EvenKeys(3, 30);  // [0,10) [10,20) [20,max]
  ASSERT_TRUE(CheckKVPairs(kvs, 4, true).ok());
  std::vector<KVSlice> s = SliceKVPairs(kvs, 4, p);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_TRUE(s[0].touched);
  EXPECT_TRUE(s[1].touched);
  EXPECT_FALSE(s[2].touched);
  EXPECT_EQ(s[0].kvs.keys.data(), kvs.keys.data());
  EXPECT_EQ(s[1].kvs.keys[0], 10u);
  EXPECT_EQ(s[1].kvs.vals.data(), kvs.vals.data() + 16);
  EXPECT_EQ(s[1].kvs.vals.size(), 16u);
  // Variable lengths.
  kvs.lens = SArray<int>(std::vector<int>{3, 1, 0, 4});
  s = SliceKVPairs(kvs, 4, p);
  EXPECT_EQ(s[0].kvs.vals.size(), 16u);
  EXPECT_EQ(s[1].kvs.vals.data(), kvs.vals.data() + 16);
  EXPECT_EQ(s[1].kvs.lens.size(), 2u);
}

TEST(Slicer, RejectsBadLists) {
  detail::RawKVPairs kvs;
  kvs.keys = SArray<Key>(std::vector<Key>{1, 1});
  EXPECT_FALSE(CheckKVPairs(kvs, 4, false).ok());
  kvs.keys = SArray<Key>(std::vector<Key>{1, 2});
  kvs.vals = SArray<char>(12);
  EXPECT_EQ(CheckKVPairs(kvs, 4, true).message(),
            "3 values do not divide evenly over 2 keys");
  kvs.lens = SArray<int>(std::vector<int>{1, 1});
  EXPECT_EQ(CheckKVPairs(kvs, 4, true).message(),
            "lens sum to 2 but there are 3 values");
  kvs.vals = SArray<char>(7);
  EXPECT_FALSE(CheckKVPairs(kvs, 4, true).ok());
}

Message SampleMessage() {
  Message msg;
  msg.meta.set_app_id(3);
  msg.meta.set_push(true);
  msg.meta.set_request(true);
  detail::RawKVPairs kvs;
  kvs.keys = SArray<Key>(std::vector<Key>{1, 2});
  kvs.vals = SArray<char>(SArray<float>(std::vector<float>{1, 2, 3, 4}));
  AddKVFrames(kvs, true, pb::FLOAT, &msg);
  return msg;
}

TEST(Codec, RoundTripKeepsFramesWithoutCopy) {
  Message msg = SampleMessage();
  std::string header = EncodeHeader(&msg);
  StatusOr<Message> back = Decode(header.data(), header.size(), msg.data);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta.app_id(), 3);
  EXPECT_EQ(back->data[1].data(), msg.data[1].data());
  StatusOr<detail::RawKVPairs> kvs =
      DecodeKVPairs(*back, true, pb::FLOAT, sizeof(float));
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  EXPECT_EQ(SArray<float>(kvs->vals)[3], 4.0f);
}

// Replication (PS_REPLICAS): a primary forwards a worker's push to its
// replica and hands the same request to its handle, which owns the
// received frames: DenseShard adopts the first push of a step as the
// step's sum and adds the next worker's gradient into it, in place, maybe
// before ZeroMQ (on its own thread) has sent the copy. The copy carries
// the bytes the worker sent, whatever the handle writes.
TEST(Replication, ForwardedCopyKeepsTheWorkersBytesWhenTheFrameIsSummedInto) {
  const std::vector<float> grad = {1.5f, -2.0f, 3.25f, 8.0f};
  Message sent;  // worker 9's push of keys 4 (3 floats) and 5 (1 float)
  sent.meta.set_request(true);
  sent.meta.set_push(true);
  sent.meta.set_sender(9);
  sent.meta.set_timestamp(7);
  sent.meta.set_head(42);
  detail::RawKVPairs pushed;
  pushed.keys = SArray<Key>(std::vector<Key>{4, 5});
  pushed.vals = SArray<char>(SArray<float>(grad));
  pushed.lens = SArray<int>(std::vector<int>{3, 1});
  AddKVFrames(pushed, true, pb::FLOAT, &sent);
  std::string header = EncodeHeader(&sent);
  // Received: frames of the primary's own, as ZeroMQ's would be.
  std::vector<SArray<char>> frames(sent.data.size());
  for (size_t i = 0; i < frames.size(); ++i) frames[i].CopyFrom(sent.data[i]);
  StatusOr<Message> received = Decode(header.data(), header.size(), frames);
  ASSERT_TRUE(received.ok()) << received.status();
  StatusOr<detail::RawKVPairs> kvs =
      DecodeKVPairs(*received, true, pb::FLOAT, sizeof(float));
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  KVMeta req;
  req.push = true;
  req.sender = 9;
  req.timestamp = 7;
  req.cmd = 42;

  Message copy = ReplicaCopy(req, *kvs, pb::FLOAT, /*rank=*/1, /*replica=*/12);
  // The handle sums the other worker's gradient into the received frame.
  SArray<float> sum(kvs->vals);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += 100.0f;
  ASSERT_EQ(SArray<float>(received->data[1])[0], 101.5f);

  // What the replica decodes: worker 9's request, with worker 9's bytes.
  std::string copy_header = EncodeHeader(&copy);
  StatusOr<Message> at_replica =
      Decode(copy_header.data(), copy_header.size(), copy.data);
  ASSERT_TRUE(at_replica.ok()) << at_replica.status();
  EXPECT_EQ(at_replica->meta.origin(), 9);
  EXPECT_EQ(at_replica->meta.shard(), 1);
  EXPECT_EQ(at_replica->meta.recver(), 12);
  EXPECT_EQ(at_replica->meta.timestamp(), 7);
  EXPECT_EQ(at_replica->meta.head(), 42);
  EXPECT_TRUE(at_replica->meta.request() && at_replica->meta.push());
  StatusOr<detail::RawKVPairs> got =
      DecodeKVPairs(*at_replica, true, pb::FLOAT, sizeof(float));
  ASSERT_TRUE(got.ok()) << got.status();
  SArray<float> vals(got->vals);
  EXPECT_EQ(std::vector<float>(vals.begin(), vals.end()), grad);
  EXPECT_EQ(std::vector<Key>(got->keys.begin(), got->keys.end()),
            (std::vector<Key>{4, 5}));
  EXPECT_EQ(std::vector<int>(got->lens.begin(), got->lens.end()),
            (std::vector<int>{3, 1}));
  // No frame of the copy is one the handle got.
  for (const SArray<char>& mine : copy.data) {
    for (const SArray<char>& theirs : received->data) {
      EXPECT_NE(mine.data(), theirs.data());
    }
  }
}

TEST(Codec, MalformedInputIsAnErrorNotACrash) {
  Message msg = SampleMessage();
  std::string header = EncodeHeader(&msg);
  // Garbage header.
  EXPECT_FALSE(Decode("\xff\xff\xff", 3, {}).ok());
  // Truncated header.
  EXPECT_FALSE(Decode(header.data(), header.size() / 2, msg.data).ok());
  // Missing frame.
  auto frames = msg.data;
  frames.pop_back();
  EXPECT_EQ(Decode(header.data(), header.size(), frames).status().message(),
            "header announces 2 data frames, got 1");
  // Frame size differs from the header.
  frames = msg.data;
  frames[1] = frames[1].segment(0, 12);
  EXPECT_EQ(Decode(header.data(), header.size(), frames).status().message(),
            "frame 1 is 12 bytes, header says 16");
  // A value frame not a whole number of floats.
  Message odd = SampleMessage();
  odd.data[1] = odd.data[1].segment(0, 6);
  std::string h2 = EncodeHeader(&odd);
  EXPECT_EQ(Decode(h2.data(), h2.size(), odd.data).status().message(),
            "frame 1 of 6 bytes is not a whole number of 4-byte elements");
  // Lens not summing to the value count.
  Message bad_lens = SampleMessage();
  bad_lens.AddData(SArray<char>(SArray<int>(std::vector<int>{1, 1})),
                   pb::INT32);
  std::string h3 = EncodeHeader(&bad_lens);
  StatusOr<Message> m3 = Decode(h3.data(), h3.size(), bad_lens.data);
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(DecodeKVPairs(*m3, true, pb::FLOAT, 4).status().message(),
            "lens sum to 2 but there are 4 values");
  // Wrong value type for this server.
  EXPECT_FALSE(DecodeKVPairs(*m3, true, pb::DOUBLE, 8).ok());
}

TEST(SharedMemory, FindsAndResolvesItsOwnRegions) {
  SArray<char> region = SharedMemory::Get().Allocate(10000).value();
  ASSERT_EQ(region.size(), 10000u);
  EXPECT_EQ(region[9999], 0);  // zero-filled
  pb::SharedRef ref;
  ASSERT_TRUE(SharedMemory::Get().Find(region.data() + 100, 400, &ref));
  EXPECT_EQ(ref.pid(), getpid());
  EXPECT_EQ(ref.offset(), 100u);
  EXPECT_GE(ref.region_bytes(), 10000u);  // whole pages
  // Past the region's end, and memory that is no region.
  EXPECT_FALSE(
      SharedMemory::Get().Find(region.data() + 100, ref.region_bytes(), &ref));
  std::vector<char> heap(64);
  EXPECT_FALSE(SharedMemory::Get().Find(heap.data(), heap.size(), &ref));
  ASSERT_TRUE(SharedMemory::Get().Find(region.data() + 100, 400, &ref));
  StatusOr<SArray<char>> view = SharedMemory::Get().Resolve(ref, 400);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data(), region.data() + 100);
  // A reference beyond the region is refused before any memory is touched.
  EXPECT_FALSE(SharedMemory::Get().Resolve(ref, ref.region_bytes()).ok());
  // Once freed (the view still holds it, so drop both), a region is gone.
  view = Status::Internal("dropped");
  region = SArray<char>();
  StatusOr<SArray<char>> gone = SharedMemory::Get().Resolve(ref, 400);
  EXPECT_EQ(gone.status().code(), Status::kNotFound) << gone.status();
  EXPECT_FALSE(SharedMemory::Domain().empty());
}

// A child process allocates a region and writes a pattern; the parent maps
// it from the reference alone (as a server maps a worker's memory), checks
// the bytes and writes its answer, which the child checks. Every wait is
// bounded (poll with a timeout, a child that exits on its own).
TEST(SharedMemory, AnotherProcessMapsARegion) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const size_t kBytes = 1 << 20;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StatusOr<SArray<char>> r = SharedMemory::Get().Allocate(kBytes);
    if (!r.ok()) _exit(2);
    for (size_t i = 0; i < kBytes; ++i) (*r)[i] = static_cast<char>(i % 251);
    pb::SharedRef ref;
    SharedMemory::Get().Find(r->data(), kBytes, &ref);
    std::string wire = ref.SerializeAsString();
    if (write(to_parent[1], wire.data(), wire.size()) !=
        static_cast<ssize_t>(wire.size())) {
      _exit(3);
    }
    pollfd p{to_child[0], POLLIN, 0};
    char done = 0;
    if (poll(&p, 1, 10000) != 1 || read(to_child[0], &done, 1) != 1) _exit(4);
    _exit((*r)[0] == 'P' && (*r)[kBytes - 1] == 'Q' ? 0 : 5);
  }
  pollfd p{to_parent[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the child sent no reference";
  char buf[256];
  ssize_t n = read(to_parent[0], buf, sizeof(buf));
  pb::SharedRef ref;
  ASSERT_TRUE(ref.ParseFromArray(buf, static_cast<int>(n)));
  EXPECT_EQ(ref.pid(), child);
  StatusOr<SArray<char>> mapped = SharedMemory::Get().Resolve(ref, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes; ++i) {
    wrong += (*mapped)[i] != static_cast<char>(i % 251);
  }
  EXPECT_EQ(wrong, 0u);
  (*mapped)[0] = 'P';
  (*mapped)[kBytes - 1] = 'Q';
  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // A process that does not exist (pid 0 is never a process's).
  pb::SharedRef nobody = ref;
  nobody.set_pid(0);
  StatusOr<SArray<char>> none = SharedMemory::Get().Resolve(nobody, 16);
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cannot map shared region"),
            std::string::npos)
      << none.status();
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) {
    close(fd);
  }
}

// A region made for one message (Allocate with copy_of): another process
// maps it copy-on-write, so what it writes stays its own, and drops the
// mapping with its frame; a node of the same process gets a copy.
TEST(SharedMemory, ARegionForOneMessageIsTheReceiversOwn) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const size_t kBytes = (1 << 20) + 5;  // not whole pages
  std::vector<char> pattern(kBytes);
  for (size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<char>(i % 251);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StatusOr<SArray<char>> r =
        SharedMemory::Get().Allocate(kBytes, pattern.data());
    if (!r.ok()) _exit(2);
    pb::SharedRef ref;
    if (!SharedMemory::Get().Find(r->data(), kBytes, &ref) || !ref.once()) {
      _exit(3);
    }
    std::string wire = ref.SerializeAsString();
    if (write(to_parent[1], wire.data(), wire.size()) !=
        static_cast<ssize_t>(wire.size())) {
      _exit(4);
    }
    pollfd p{to_child[0], POLLIN, 0};
    char done = 0;
    if (poll(&p, 1, 10000) != 1 || read(to_child[0], &done, 1) != 1) _exit(5);
    _exit(std::memcmp(r->data(), pattern.data(), kBytes) == 0 ? 0 : 6);
  }
  pollfd p{to_parent[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the child sent no reference";
  char buf[256];
  ssize_t n = read(to_parent[0], buf, sizeof(buf));
  pb::SharedRef ref;
  ASSERT_TRUE(ref.ParseFromArray(buf, static_cast<int>(n)));
  StatusOr<SArray<char>> mapped = SharedMemory::Get().Resolve(ref, kBytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(std::memcmp(mapped->data(), pattern.data(), kBytes), 0);
  // Not kept as a mapping of the child's memory: no reference names it.
  pb::SharedRef found;
  EXPECT_FALSE(SharedMemory::Get().Find(mapped->data(), kBytes, &found));
  std::memset(mapped->data(), 'W', kBytes);  // the child must not see it
  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) {
    close(fd);
  }
  // Our own: resolved to a copy, not to the region.
  SArray<char> own = SharedMemory::Get().Allocate(100, pattern.data()).value();
  ASSERT_TRUE(SharedMemory::Get().Find(own.data(), 100, &ref));
  StatusOr<SArray<char>> copy = SharedMemory::Get().Resolve(ref, 100);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_NE(copy->data(), own.data());
  EXPECT_EQ(std::memcmp(copy->data(), pattern.data(), 100), 0);
}

// A pull's answer with the request's own keys leaves them out
// (Meta.keys_asked): decoded with the keys asked, refused without them,
// and its values still checked against them.
TEST(Codec, AnswerWithTheKeysAskedCarriesNoKeys) {
  detail::RawKVPairs kvs;
  kvs.keys = SArray<Key>(std::vector<Key>{1, 2});
  kvs.vals = SArray<char>(SArray<float>(std::vector<float>{1, 2, 3, 4}));
  Message msg;
  AddKVFrames(kvs, true, pb::FLOAT, &msg, /*keys_asked=*/true);
  ASSERT_EQ(msg.data.size(), 1u);
  EXPECT_TRUE(msg.meta.keys_asked());
  std::string header = EncodeHeader(&msg);
  StatusOr<Message> back = Decode(header.data(), header.size(), msg.data);
  ASSERT_TRUE(back.ok()) << back.status();
  StatusOr<detail::RawKVPairs> got =
      DecodeKVPairs(*back, true, pb::FLOAT, sizeof(float), &kvs.keys);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->keys.data(), kvs.keys.data());
  EXPECT_EQ(SArray<float>(got->vals)[3], 4.0f);
  EXPECT_FALSE(DecodeKVPairs(*back, true, pb::FLOAT, sizeof(float)).ok());
  SArray<Key> three(std::vector<Key>{1, 2, 3});  // 4 values do not divide
  EXPECT_FALSE(
      DecodeKVPairs(*back, true, pb::FLOAT, sizeof(float), &three).ok());
}

TEST(Codec, SharedReferencesAreResolvedOrRefused) {
  SArray<char> region = SharedMemory::Get().Allocate(4096).value();
  SArray<float> vals = SArray<float>(region).segment(0, 256);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<float>(i);
  auto message = [&](int frame, bool empty_wire) {
    Message msg = SampleMessage();
    msg.data[1] = SArray<char>(vals);
    std::string header = EncodeHeader(&msg);
    pb::SharedRef* ref = msg.meta.add_shared();
    SharedMemory::Get().Find(vals.data(), 1024, ref);
    ref->set_frame(frame);
    msg.meta.SerializeToString(&header);
    std::vector<SArray<char>> wire = msg.data;
    if (empty_wire) wire[1] = SArray<char>();
    return std::make_pair(header, wire);
  };
  // The sender (id 0 here) is a peer whose memory we accept: this process.
  auto accepted = [](int) { return static_cast<int>(getpid()); };
  auto [header, wire] = message(1, true);
  StatusOr<Message> ok = Decode(header.data(), header.size(), wire, accepted);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data[1].data(), reinterpret_cast<char*>(vals.data()));
  for (auto [frame, empty] : {std::make_pair(5, true), std::make_pair(1, false),
                              std::make_pair(-1, true)}) {
    auto [h, w] = message(frame, empty);
    StatusOr<Message> bad = Decode(h.data(), h.size(), w, accepted);
    EXPECT_EQ(bad.status().code(), Status::kCorruption) << bad.status();
    EXPECT_NE(bad.status().message().find("shared reference to frame"),
              std::string::npos)
        << bad.status();
  }
  // From a sender whose memory we do not accept (no probe mapped), or naming
  // a third process, a reference is refused before anything is mapped.
  for (const auto& policy : std::vector<std::function<int(int)>>{
           nullptr, [](int) { return 0; }, [](int) { return 1; }}) {
    pb::Meta meta;
    ASSERT_TRUE(meta.ParseFromString(header));
    meta.mutable_shared(0)->set_pid(policy ? 424242 : getpid());
    std::string h = meta.SerializeAsString();
    StatusOr<Message> bad = Decode(h.data(), h.size(), wire, policy);
    EXPECT_EQ(bad.status().code(), Status::kCorruption) << bad.status();
    EXPECT_NE(bad.status().message().find("may not name"), std::string::npos)
        << bad.status();
  }
  // A pull destination must be the sender's own memory.
  pb::Meta meta;
  ASSERT_TRUE(meta.ParseFromString(header));
  meta.clear_shared();
  meta.mutable_reply_into()->set_pid(getpid() + 1);
  std::string h = meta.SerializeAsString();
  std::vector<SArray<char>> plain = SampleMessage().data;
  StatusOr<Message> bad = Decode(h.data(), h.size(), plain, accepted);
  EXPECT_NE(bad.status().message().find("pull destination"), std::string::npos)
      << bad.status();
}

TEST(RequestTracker, DoneWhenEveryTouchedServerAnswered) {
  RequestTracker t;
  int calls = 0;
  int ts = t.Start({8, 10}, [&] { ++calls; });
  std::string why;
  EXPECT_FALSE(t.Answer(ts, 8, &why));
  EXPECT_FALSE(t.Answer(ts, 12, &why));  // never asked
  EXPECT_NE(why.find("does not wait on node id 12"), std::string::npos);
  EXPECT_FALSE(t.IsDone(ts));
  EXPECT_TRUE(t.Answer(ts, 10, &why));
  t.Finish(ts, Status::OK());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(t.Wait(ts, 0).ok());
  EXPECT_FALSE(t.Wait(ts, 0).ok());  // forgotten
}

TEST(RequestTracker, FailsRequestsOfDeadServerAndTimesOut) {
  RequestTracker t;
  int a = t.Start({8, 10}, nullptr);
  int b = t.Start({8}, nullptr);
  t.FailServer(10, Status::PeerFailed("server 1 died"));
  EXPECT_EQ(t.Wait(a, 0).message(), "server 1 died");
  EXPECT_FALSE(t.IsDone(b));
  EXPECT_EQ(t.Wait(b, 50).code(), Status::kTimeout);
  EXPECT_EQ(t.Wait(t.StartFailed(Status::InvalidArgument("bad")), 0).code(),
            Status::kInvalidArgument);
  std::string why;
  int c = t.Start({8}, nullptr);
  std::thread answer([&] {
    if (t.Answer(c, 8, &why)) t.Finish(c, Status::OK());
  });
  EXPECT_TRUE(t.Wait(c, 5000).ok());
  answer.join();
}

// With a spin, Wait returns an answer that comes during the spin, blocks
// for one that comes after it, and still times out.
TEST(RequestTracker, SpinningWaitSeesEarlyAndLateAnswers) {
  RequestTracker t(/*wait_spin_us=*/20000);
  for (int delay_ms : {0, 5, 60}) {
    int ts = t.Start({8}, nullptr);
    std::thread answer([&, ts, delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::string why;
      if (t.Answer(ts, 8, &why)) t.Finish(ts, Status::Aborted("answered"));
    });
    EXPECT_EQ(t.Wait(ts, 5000).message(), "answered") << delay_ms << " ms";
    answer.join();
  }
  EXPECT_EQ(t.Wait(t.Start({8}, nullptr), 30).code(), Status::kTimeout);
}

// Two threads waiting on one timestamp both return (the status, or
// "unknown" for one that came after the other forgot it); never a use of a
// forgotten entry (the ASan build shows one).
TEST(RequestTracker, ConcurrentWaitsOnOneTimestamp) {
  for (int spin : {0, 50}) {
    RequestTracker t(spin);
    for (int i = 0; i < 200; ++i) {
      int ts = t.Start({8}, nullptr);
      Status st[2];
      std::thread waiters[2];
      for (int k = 0; k < 2; ++k) {
        waiters[k] = std::thread([&, k] { st[k] = t.Wait(ts, 5000); });
      }
      std::string why;
      if (t.Answer(ts, 8, &why)) t.Finish(ts, Status::Aborted("answered"));
      for (auto& w : waiters) w.join();
      int answered = 0;
      for (const Status& s : st) {
        if (s.message() == "answered") {
          ++answered;
        } else {
          EXPECT_EQ(s.code(), Status::kInvalidArgument) << s;
        }
      }
      EXPECT_GE(answered, 1);
    }
    EXPECT_EQ(t.num_pending(), 0u);
  }
}

// A request with a callback needs no Wait: once done it is forgotten.
TEST(RequestTracker, CallbackRequestsWithoutWaitAreForgotten) {
  RequestTracker t;
  int calls = 0;
  for (int i = 0; i < 10000; ++i) {
    int ts = t.Start(
        {8, 10}, [&] { ++calls; }, /*forget_when_done=*/true);
    std::string why;
    t.Answer(ts, 8, &why);
    if (t.Answer(ts, 10, &why)) t.Finish(ts, Status::OK());
  }
  int failed = t.Start(
      {8}, [&] { ++calls; }, true);
  t.FailServer(8, Status::PeerFailed("server 0 died"));
  EXPECT_EQ(calls, 10001);
  EXPECT_EQ(t.num_pending(), 0u);
  // A Wait soon after still gets the status.
  EXPECT_EQ(t.Wait(failed, 0).code(), Status::kPeerFailed);
  // A Wait that came first gets it too.
  int ts = t.Start(
      {8}, [&] { ++calls; }, true);
  std::thread answer([&] {
    std::string why;
    if (t.Answer(ts, 8, &why)) t.Finish(ts, Status::Aborted("answered"));
  });
  EXPECT_EQ(t.Wait(ts, 5000).message(), "answered");
  answer.join();
  EXPECT_EQ(t.num_pending(), 0u);
}

// Timestamps are int32 on the wire: the counter wraps to 0 after INT_MAX,
// skipping timestamps still in use.
TEST(RequestTracker, TimestampsWrapSkippingThoseInUse) {
  RequestTracker t;
  int zero = t.Start({8}, nullptr);
  EXPECT_EQ(zero, 0);
  t.set_next_timestamp_for_test(INT_MAX - 1);
  int a = t.Start({8}, nullptr);
  int b = t.Start({8}, nullptr);
  int c = t.Start({8}, nullptr);
  EXPECT_EQ(a, INT_MAX - 1);
  EXPECT_EQ(b, INT_MAX);
  EXPECT_EQ(c, 1);  // 0 is still waiting
  for (int ts : {zero, a, b, c}) {
    EXPECT_GE(ts, 0);
    std::string why;
    if (t.Answer(ts, 8, &why)) t.Finish(ts, Status::OK());
    EXPECT_TRUE(t.Wait(ts, 1000).ok()) << ts;
  }
}

// A timeout names the servers it still waits on through the naming
// function.
TEST(RequestTracker, TimeoutNamesServers) {
  RequestTracker t(0, [](int id) { return "server " + std::to_string(id); });
  int ts = t.Start({8, 12}, nullptr);
  Status st = t.Wait(ts, 20);
  EXPECT_EQ(st.code(), Status::kTimeout);
  EXPECT_NE(st.message().find("from server 8, server 12"), std::string::npos)
      << st;
}

// ps-lite's Environment: values set from code first, then the process's.
TEST(Environment, InitValuesOverrideTheProcessEnvironment) {
  setenv("PS_TEST_ENV_A", "process", 1);
  setenv("PS_TEST_ENV_B", "process", 1);
  Environment* env = Environment::Init({{"PS_TEST_ENV_A", "code"}});
  EXPECT_EQ(env, Environment::Get());
  EXPECT_STREQ(env->find("PS_TEST_ENV_A"), "code");
  EXPECT_STREQ(env->find("PS_TEST_ENV_B"), "process");
  EXPECT_EQ(env->find("PS_TEST_ENV_NEVER_SET"), nullptr);
  EXPECT_EQ(Environment::_GetSharedRef().get(), env);
  Environment::Init({});
  EXPECT_STREQ(env->find("PS_TEST_ENV_A"), "process");
  EXPECT_TRUE(env->vars().empty());
  unsetenv("PS_TEST_ENV_A");
  unsetenv("PS_TEST_ENV_B");
}

// ps-lite's GetEnv: Environment::find's value converted, else the default.
TEST(Environment, GetEnvConvertsOrDefaults) {
  setenv("PS_TEST_ENV_C", "12", 1);
  Environment::Init({{"PS_TEST_ENV_D", "5"}, {"PS_TEST_ENV_E", "name"}});
  EXPECT_EQ(GetEnv("PS_TEST_ENV_C", 0), 12);
  EXPECT_EQ(GetEnv("PS_TEST_ENV_D", 0), 5);
  EXPECT_EQ(GetEnv("PS_TEST_ENV_E", 9), 0);  // atoi, as in ps-lite
  EXPECT_EQ(GetEnv("PS_TEST_ENV_NEVER_SET", 9), 9);
  EXPECT_EQ(GetEnv<std::string>("PS_TEST_ENV_E", "x"), "name");
  EXPECT_EQ(GetEnv<std::string>("PS_TEST_ENV_NEVER_SET", "x"), "x");
  Environment::Init({});
  unsetenv("PS_TEST_ENV_C");
}

}  // namespace
}  // namespace ps
