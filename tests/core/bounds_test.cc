// The bounds on what a node takes from the network, each proven with a
// stranger's real ZeroMQ socket against in-process nodes (cluster.h) or a
// Van: the inbound queue of a connection (DMLC_PS_WATER_MARK, the ROUTER's
// ZMQ_RCVHWM), messages from senders not in the node table (held up to
// Postoffice::kMaxEarlyMessages and PS_MAX_MESSAGE_BYTES until the table
// comes, dropped after), and messages of more parts (van/wire.h's kMaxParts) or
// bytes (PS_MAX_MESSAGE_BYTES) than allowed. Every drop is counted exactly
// (Node::num_dropped_messages) and the node then answers an honest request
// exactly. Every wait is bounded; nothing is timed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "ps/config.h"
#include "van/codec.h"
#include "van/van.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUnknownSender = 1001;  // no node of these jobs has this id

// A stranger's DEALER to tcp://127.0.0.1:port (no key: the jobs here have
// none). Sends block at most a few seconds; each returns whether ZeroMQ
// took the whole message.
class Stranger {
 public:
  explicit Stranger(int port, int send_hwm = 1000)
      : context_(zmq_ctx_new()), socket_(zmq_socket(context_, ZMQ_DEALER)) {
    int linger = 5000, timeout = 5000;
    zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(socket_, ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(socket_, ZMQ_SNDHWM, &send_hwm, sizeof(send_hwm));
    std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
    zmq_connect(socket_, endpoint.c_str());
  }
  ~Stranger() {
    zmq_close(socket_);
    zmq_ctx_term(context_);
  }
  Stranger(const Stranger&) = delete;
  Stranger& operator=(const Stranger&) = delete;

  // The message as the codec writes it: its header, then its frames.
  bool Send(Message msg) {
    std::vector<std::string> parts = {EncodeHeader(&msg)};
    for (const SArray<char>& f : msg.data)
      parts.emplace_back(f.begin(), f.end());
    return SendParts(parts, 0);
  }
  // parts as the frames of one message; flags e.g. ZMQ_DONTWAIT.
  bool SendParts(const std::vector<std::string>& parts, int flags) {
    for (size_t i = 0; i < parts.size(); ++i) {
      int more = i + 1 < parts.size() ? ZMQ_SNDMORE : 0;
      if (zmq_send(socket_, parts[i].data(), parts[i].size(), flags | more) <
          0) {
        return false;  // only the first part can fail (ZeroMQ's atomicity)
      }
    }
    return true;
  }
  // Whether the socket can take a message within `ms`.
  bool Writable(int ms) {
    zmq_pollitem_t item{socket_, 0, ZMQ_POLLOUT, 0};
    return zmq_poll(&item, 1, ms) > 0;
  }

 private:
  void* context_;
  void* socket_;
};

// A data request as a worker's, claiming to come from `sender`, with one
// frame of `bytes` bytes.
Message DataFrom(int sender, int recver, size_t bytes) {
  Message msg;
  msg.meta.set_sender(sender);
  msg.meta.set_recver(recver);
  msg.meta.set_request(true);
  msg.meta.set_push(true);
  if (bytes > 0) msg.AddData(SArray<char>(bytes, 'x'), pb::CHAR);
  return msg;
}

// Polls cond every 10 ms for at most 30 s; whether it held.
template <typename Cond>
bool Eventually(Cond cond) {
  for (int i = 0; i < 3000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// An honest round trip: the worker pushes v to key 1 and pulls it back.
void ExpectExactAnswer(Node* worker, float v) {
  KVWorker<float> kv(worker, 0, 0);
  ASSERT_TRUE(kv.Wait(kv.Push({1}, {v})).ok());
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull({1}, &out)).ok());
  EXPECT_EQ(out, std::vector<float>{v});
}

// A server handle that, while armed, holds its first request until
// released: the server's receive thread delivers to it and so reads no
// other message meanwhile.
class GatedHandle {
 public:
  void operator()(const KVMeta& m, const KVPairs<float>& d,
                  KVServer<float>* s) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (armed_) {
        armed_ = false;
        entered_ = true;
        cv_.notify_all();
        cv_.wait_for(lock, std::chrono::seconds(60), [&] { return released_; });
      }
    }
    store_(m, d, s);
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = true, entered_ = false, released_ = false;
  KVServerDefaultHandle<float> store_;
};

// DMLC_PS_WATER_MARK=4. While the server's receive thread is held, a
// stranger sends messages of 256 KiB as fast as its socket takes them
// (ZMQ_DONTWAIT, its own queue of 1): the server's ZeroMQ stops reading
// that connection after 4 messages, so the stranger stalls after what its
// own queue and the kernel's socket buffers hold (a few MiB), far short of
// all 400 (100 MiB). Nothing taken is lost: once released, the server reads
// and drops every one, exactly, and answers an honest request.
TEST(Bounds, InboundQueueStopsAtTheWaterMark) {
  constexpr int kMessages = 400;
  constexpr size_t kBytes = 256 << 10;
  // At most: the stranger's queue (1), the server's (4), what ZeroMQ reads
  // ahead of its queue, and the kernel's buffers both ways (Linux
  // autotunes loopback up to 4 MiB sending and 6 MiB receiving).
  constexpr int kAtMost = 80;
  StatusOr<Config> parsed = Config::FromEnv({{"DMLC_ROLE", "server"},
                                             {"DMLC_PS_ROOT_PORT", "9000"},
                                             {"DMLC_NUM_SERVER", "1"},
                                             {"DMLC_NUM_WORKER", "1"},
                                             {"DMLC_PS_WATER_MARK", "4"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->water_mark, 4);
  Cluster c(1, 1, [&](Config* cfg) { cfg->water_mark = parsed->water_mark; });
  ASSERT_TRUE(c.Start());
  Node* server = c.servers[0].get();
  auto gate = std::make_shared<GatedHandle>();
  KVServer<float> kv_server(server, 0);
  kv_server.set_request_handle(
      [gate](const KVMeta& m, const KVPairs<float>& d, KVServer<float>* s) {
        (*gate)(m, d, s);
      });
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  int held = kv.Push({1}, {2.0f});
  ASSERT_TRUE(gate->WaitEntered());

  const uint64_t dropped_before = server->num_dropped_messages();
  int taken = 0;
  {
    Stranger stranger(server->port(), 1);
    const std::vector<std::string> garbage = {
        std::string(kBytes, '\xff')};  // no header parses from it
    for (int tries = 0; taken < kMessages && tries < 10 * kMessages; ++tries) {
      if (stranger.SendParts(garbage, ZMQ_DONTWAIT)) {
        ++taken;
      } else if (!stranger.Writable(1000)) {
        break;  // the server's side is full
      }
    }
    std::printf("the stranger's socket took %d of %d messages\n", taken,
                kMessages);
    EXPECT_LE(taken, kAtMost) << "the inbound queue is not bounded";
    EXPECT_GE(taken, 4);
    gate->Release();
    EXPECT_TRUE(Eventually([&] {
      return server->num_dropped_messages() - dropped_before >=
             static_cast<uint64_t>(taken);
    }));
  }  // the stranger lingers until its queue left
  EXPECT_TRUE(kv.Wait(held).ok());
  EXPECT_EQ(server->num_dropped_messages() - dropped_before,
            static_cast<uint64_t>(taken));
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull({1}, &out)).ok());
  EXPECT_EQ(out, std::vector<float>{2.0f});
  EXPECT_TRUE(c.Finalize());
}

// Runs the scheduler and server 0 of c (one server, one worker) until the
// server waits for the node table, which needs the worker; the stranger's
// messages come meanwhile.
struct HalfStarted {
  explicit HalfStarted(Cluster* c) : c(c) {
    EXPECT_TRUE(c->servers[0]->Bind().ok());
    scheduler =
        std::thread([this] { scheduler_st = this->c->scheduler->Start(); });
    server = std::thread([this] { server_st = this->c->servers[0]->Start(); });
  }
  // Starts the worker; whether every node started.
  bool Finish() {
    Status worker_st = c->workers[0]->Start();
    scheduler.join();
    server.join();
    EXPECT_TRUE(scheduler_st.ok()) << scheduler_st;
    EXPECT_TRUE(server_st.ok()) << server_st;
    EXPECT_TRUE(worker_st.ok()) << worker_st;
    return scheduler_st.ok() && server_st.ok() && worker_st.ok();
  }
  Cluster* c;
  Status scheduler_st, server_st;
  std::thread scheduler, server;
};

void ServeDefault(Node* server, std::unique_ptr<KVServer<float>>* kv,
                  KVServerDefaultHandle<float>* handle) {
  *kv = std::make_unique<KVServer<float>>(server, 0);
  (*kv)->set_request_handle(
      [handle](const KVMeta& m, const KVPairs<float>& d, KVServer<float>* s) {
        (*handle)(m, d, s);
      });
}

// Before its node table a server holds data from senders it does not know
// yet (a peer may learn the table first), up to 10000 messages: of 10025
// from a stranger, exactly 25 are dropped and counted before the table
// comes, and the other 10000 once it came (their sender is in it not).
TEST(Bounds, UnknownSendersAreHeldUpToACountThenDropped) {
  constexpr int kHeld = 10000;  // Postoffice::kMaxEarlyMessages
  constexpr int kExtra = 25;
  Cluster c(1, 1, [](Config* cfg) { cfg->rendezvous_timeout_ms = 60000; });
  HalfStarted start(&c);
  Node* server = c.servers[0].get();
  {
    Stranger stranger(server->port());
    int sent = 0;
    for (int i = 0; i < kHeld + kExtra; ++i) {
      sent += stranger.Send(DataFrom(kUnknownSender, ServerRankToId(0), 0));
    }
    ASSERT_EQ(sent, kHeld + kExtra);
    // In order on one connection: the 25th drop comes after every message.
    EXPECT_TRUE(
        Eventually([&] { return server->num_dropped_messages() >= kExtra; }));
    EXPECT_EQ(server->num_dropped_messages(), static_cast<uint64_t>(kExtra));
  }
  ASSERT_TRUE(start.Finish());
  EXPECT_TRUE(Eventually(
      [&] { return server->num_dropped_messages() >= kHeld + kExtra; }));
  EXPECT_EQ(server->num_dropped_messages(),
            static_cast<uint64_t>(kHeld + kExtra));
  std::unique_ptr<KVServer<float>> kv;
  KVServerDefaultHandle<float> handle;
  ServeDefault(server, &kv, &handle);
  ExpectExactAnswer(c.workers[0].get(), 3.0f);
  EXPECT_TRUE(c.Finalize());
}

// The same hold is bounded in bytes by PS_MAX_MESSAGE_BYTES (64 KiB here):
// of 100 messages of 1000 data bytes, 65 are held and 35 dropped at once.
TEST(Bounds, UnknownSendersAreHeldUpToMaxMessageBytesThenDropped) {
  constexpr int64_t kBudget = 64 << 10;
  constexpr int kMessages = 100;
  constexpr size_t kBytes = 1000;
  constexpr int kHeld = static_cast<int>(kBudget / kBytes);  // 65
  Cluster c(1, 1, [](Config* cfg) {
    cfg->max_message_bytes = kBudget;
    cfg->rendezvous_timeout_ms = 60000;
  });
  HalfStarted start(&c);
  Node* server = c.servers[0].get();
  {
    Stranger stranger(server->port());
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(
          stranger.Send(DataFrom(kUnknownSender, ServerRankToId(0), kBytes)));
    }
    EXPECT_TRUE(Eventually(
        [&] { return server->num_dropped_messages() >= kMessages - kHeld; }));
    EXPECT_EQ(server->num_dropped_messages(),
              static_cast<uint64_t>(kMessages - kHeld));
  }
  ASSERT_TRUE(start.Finish());
  EXPECT_TRUE(
      Eventually([&] { return server->num_dropped_messages() >= kMessages; }));
  EXPECT_EQ(server->num_dropped_messages(), static_cast<uint64_t>(kMessages));
  std::unique_ptr<KVServer<float>> kv;
  KVServerDefaultHandle<float> handle;
  ServeDefault(server, &kv, &handle);
  ExpectExactAnswer(c.workers[0].get(), 4.0f);
  EXPECT_TRUE(c.Finalize());
}

// Once the node table is in, a sender outside it is dropped at once: every
// one of 500 messages is counted, none held.
TEST(Bounds, UnknownSendersAfterTheNodeTableAreDroppedAndCounted) {
  constexpr int kMessages = 500;
  DefaultJob job(1, 1);
  ASSERT_TRUE(job.Start());
  Node* server = job.servers[0].get();
  const uint64_t before = server->num_dropped_messages();
  {
    Stranger stranger(server->port());
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(
          stranger.Send(DataFrom(kUnknownSender, ServerRankToId(0), 16)));
    }
    EXPECT_TRUE(Eventually(
        [&] { return server->num_dropped_messages() - before >= kMessages; }));
  }
  EXPECT_EQ(server->num_dropped_messages() - before,
            static_cast<uint64_t>(kMessages));
  ExpectExactAnswer(job.workers[0].get(), 5.0f);
  EXPECT_TRUE(job.Finalize());
}

// What a Van hands up, with the bytes of each message's frames.
struct Inbox {
  std::mutex mu;
  std::vector<std::vector<size_t>> frames;  // by message: each frame's size
  std::vector<std::string> first_bytes;     // each message's first frame

  void Take(Message&& msg) {
    std::vector<size_t> sizes;
    for (const SArray<char>& f : msg.data) sizes.push_back(f.size());
    std::lock_guard<std::mutex> lock(mu);
    frames.push_back(sizes);
    first_bytes.emplace_back(
        msg.data.empty() ? std::string()
                         : std::string(msg.data[0].begin(), msg.data[0].end()));
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return frames.size();
  }
};

// A message of a header and `count` CHAR frames of `bytes` bytes each, the
// first one starting with `tag`.
std::vector<std::string> Parts(int count, size_t bytes,
                               const std::string& tag) {
  Message msg = DataFrom(kUnknownSender, 1, 0);
  for (int i = 0; i < count; ++i) {
    std::string f(bytes, 'y');
    if (i == 0) f.replace(0, tag.size(), tag);
    SArray<char> frame(f.size());
    std::memcpy(frame.data(), f.data(), f.size());
    msg.AddData(frame, pb::CHAR);
  }
  std::vector<std::string> parts = {EncodeHeader(&msg)};
  for (const SArray<char>& f : msg.data) parts.emplace_back(f.begin(), f.end());
  return parts;
}

// The van keeps at most 16 parts of a message (its routing id, the header
// and 14 data frames) and PS_MAX_MESSAGE_BYTES of them: a message just
// inside each bound is handed up whole; one part or 20000 bytes more and it
// is dropped and counted, its parts let go, and the next is handed up.
TEST(Bounds, MessagesOfTooManyPartsOrBytesAreDroppedAndCounted) {
  constexpr int64_t kLimit = 64 << 10;
  VanOptions options;
  options.max_message_bytes = kLimit;
  Inbox inbox;
  Van van(options);
  ASSERT_TRUE(van.Bind("127.0.0.1", 0, 0, 0).ok());
  van.Start([&inbox](Message&& msg) { inbox.Take(std::move(msg)); });
  {
    Stranger stranger(van.port());
    ASSERT_TRUE(stranger.SendParts(Parts(14, 100, "fourteen"), 0));
    ASSERT_TRUE(stranger.SendParts(Parts(15, 100, "fifteen"), 0));
    ASSERT_TRUE(stranger.SendParts(Parts(200, 10, "two hundred"), 0));
    ASSERT_TRUE(stranger.SendParts(Parts(2, 30000, "sixty thousand"), 0));
    ASSERT_TRUE(stranger.SendParts(Parts(3, 30000, "ninety thousand"), 0));
    ASSERT_TRUE(stranger.SendParts(Parts(1, 8, "last one"), 0));
    EXPECT_TRUE(Eventually([&] { return inbox.size() >= 3; }));
  }
  van.Stop(0);
  // In order on one connection: the last one came after the others.
  EXPECT_EQ(van.num_dropped(), 3u);
  ASSERT_EQ(inbox.size(), 3u);
  EXPECT_EQ(inbox.frames[0], std::vector<size_t>(14, 100));
  EXPECT_EQ(inbox.first_bytes[0].substr(0, 8), "fourteen");
  EXPECT_EQ(inbox.frames[1], std::vector<size_t>(2, 30000));
  EXPECT_EQ(inbox.first_bytes[1].substr(0, 14), "sixty thousand");
  EXPECT_EQ(inbox.frames[2], std::vector<size_t>{8});
  EXPECT_EQ(inbox.first_bytes[2], "last one");
}

// At a serving node: a message of 40 parts is dropped and counted, once,
// and the server answers the next honest request exactly.
TEST(Bounds, ServerKeepsServingAfterAMessageOfTooManyParts) {
  DefaultJob job(1, 1);
  ASSERT_TRUE(job.Start());
  Node* server = job.servers[0].get();
  const uint64_t before = server->num_dropped_messages();
  {
    Stranger stranger(server->port());
    ASSERT_TRUE(stranger.SendParts(Parts(39, 64, "many"), 0));
    EXPECT_TRUE(Eventually(
        [&] { return server->num_dropped_messages() - before >= 1; }));
  }
  EXPECT_EQ(server->num_dropped_messages() - before, 1u);
  ExpectExactAnswer(job.workers[0].get(), 6.0f);
  EXPECT_TRUE(job.Finalize());
}

// Anyone can open TCP connections to a node's port and send nothing. Each
// is closed once PS_HANDSHAKE_TIMEOUT_MS passed without a handshake (here
// 500 ms; ZeroMQ's own default is 30 s, longer than this test waits), so
// idle connections cannot pile up until the node runs out of descriptors;
// the server then answers an honest request exactly.
TEST(Bounds, IdleConnectionsAreClosedAfterTheHandshakeTimeout) {
  DefaultJob job(1, 1, [](Config* c) { c->handshake_timeout_ms = 500; });
  ASSERT_TRUE(job.Start());
  constexpr int kIdle = 50;
  std::vector<int> fds;
  for (int i = 0; i < kIdle; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(job.servers[0]->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    fds.push_back(fd);
  }
  // Each gets the node's greeting, then its end: EOF or a reset.
  int closed = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (int fd : fds) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
        break;
      char buf[256];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        ++closed;
        break;
      }
    }
    close(fd);
  }
  EXPECT_EQ(closed, kIdle);
  ExpectExactAnswer(job.workers[0].get(), 6.0f);
  EXPECT_TRUE(job.Finalize());
}

}  // namespace
}  // namespace ps
