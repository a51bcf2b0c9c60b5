// The transport on its own: Vans in one process, over loopback TCP. Sends
// from several threads while the routing table changes under them (peers
// connected, renamed and disconnected; references allowed and forgotten),
// which the van reads without a lock (van/snapshot.h).
#include "van/van.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/sarray.h"
#include "van/codec.h"
#include "van/seal.h"
#include "van/shm.h"
#include "van/snapshot.h"

namespace ps {
namespace {

constexpr int kThreads = 4;
constexpr int kPerThread = 200;
constexpr size_t kMaxBody = 400;
constexpr size_t kSlot = 512;  // of a thread's shared region, per message

// Message (thread t, number i): a tag frame (t, i) and a body whose length
// (0 to kMaxBody - 1 bytes: inline, zero-copy and shared-memory frames all
// occur; one message in 25 of several seal::kChunkBytes, which a sealed
// van streams) and bytes follow from (t, i).
size_t BodySize(int t, int i) {
  if (i % 25 == 11) return 3 * seal::kChunkBytes + 1000 * t + i;
  return (static_cast<size_t>(t) * 131 + static_cast<size_t>(i) * 37) %
         kMaxBody;
}
char BodyByte(int t, int i, size_t k) {
  return static_cast<char>((t * 31 + i * 7 + static_cast<int>(k) * 13) & 0xff);
}

// What a receiver saw: each (t, i) counted, and every mismatch described.
struct Inbox {
  std::mutex mu;
  std::condition_variable arrived;
  std::map<std::pair<int, int>, int> count;
  std::vector<std::string> errors;
  int total = 0;

  void Take(Message&& msg) {
    std::string error;
    std::pair<int, int> tag(-1, -1);
    if (msg.data.size() != 2 || msg.data[0].size() != 2 * sizeof(int32_t)) {
      error = "unexpected frames";
    } else {
      int32_t ti[2];
      std::memcpy(ti, msg.data[0].data(), sizeof(ti));
      tag = {ti[0], ti[1]};
      const SArray<char>& body = msg.data[1];
      if (body.size() != BodySize(ti[0], ti[1])) {
        error = "body of " + std::to_string(body.size()) + " bytes";
      }
      for (size_t k = 0; error.empty() && k < body.size(); ++k) {
        if (body[k] != BodyByte(ti[0], ti[1], k)) {
          error = "byte " + std::to_string(k) + " differs";
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!error.empty()) {
      errors.push_back("message (" + std::to_string(tag.first) + ", " +
                       std::to_string(tag.second) + "): " + error);
    }
    ++count[tag];
    ++total;
    arrived.notify_all();
  }
};

TEST(Snapshot, ReadersKeepTheValueTheyLoaded) {
  Snapshot<std::map<int, int>> table;
  std::shared_ptr<const std::map<int, int>> before = table.Load();
  table.Update([](std::map<int, int>& m) { m[1] = 10; });
  EXPECT_TRUE(before->empty());
  EXPECT_EQ(table.Load()->at(1), 10);
  EXPECT_EQ(table.Update([](std::map<int, int>& m) { return m.erase(1); }), 1u);
  EXPECT_TRUE(table.Load()->empty());
}

// Two receivers (node ids 1 and 2 to the sender; references allowed to and
// from node 1 only), kThreads sending threads, and one thread that churns
// the routing tables of the sender and of receiver 1 (connects to a third
// van, renames, disconnects; allows and forgets references) until the
// senders are done. Every message arrives once, with its bytes; with a job
// key, sealed (each connection its own key, every frame in order).
void ExpectConcurrentSendsArriveOnce(const VanOptions& options) {
  Inbox inbox1, inbox2;  // outlive the vans that fill them
  const std::string kSenderIdentity = "van-test-sender";
  Van receiver1(options), receiver2(options), sink(options);
  ASSERT_TRUE(receiver1.Bind("127.0.0.1", 0, 0, 0).ok());
  ASSERT_TRUE(receiver2.Bind("127.0.0.1", 0, 0, 0).ok());
  ASSERT_TRUE(sink.Bind("127.0.0.1", 0, 0, 0).ok());  // never started
  receiver1.AcceptReferencesFrom(0, kSenderIdentity, getpid());
  receiver1.Start([&inbox1](Message&& msg) { inbox1.Take(std::move(msg)); });
  receiver2.Start([&inbox2](Message&& msg) { inbox2.Take(std::move(msg)); });

  Van sender(options);
  sender.set_identity(kSenderIdentity);
  ASSERT_TRUE(
      sender.Connect(1, "127.0.0.1", receiver1.port(), receiver1.wire_key())
          .ok());
  ASSERT_TRUE(
      sender.Connect(2, "127.0.0.1", receiver2.port(), receiver2.wire_key())
          .ok());
  sender.SendReferencesTo(1);

  std::atomic<bool> senders_done{false};
  std::atomic<int> churns{0};
  std::thread churn([&] {
    for (int k = 0; k < 100000 && !senders_done.load(); ++k) {
      const int id = 100 + k % 8;
      EXPECT_TRUE(
          sender.Connect(id, "127.0.0.1", sink.port(), sink.wire_key()).ok());
      sender.SendReferencesTo(id);
      sender.Rekey(id, id + 50);
      EXPECT_TRUE(sender.IsConnected(id + 50));
      sender.Disconnect(id + 50);
      receiver1.AcceptReferencesFrom(id, "other-" + std::to_string(k), 1);
      receiver1.Disconnect(id);
      churns.fetch_add(1);
    }
  });

  // Kept until the end: a reference is resolved on arrival.
  std::vector<SArray<char>> shared(kThreads);
  for (auto& region : shared) {
    region = SharedMemory::Get().Allocate(kPerThread * kSlot).value();
  }
  std::vector<std::thread> senders;
  std::vector<int> send_errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const size_t n = BodySize(t, i);
        SArray<char> body;
        if (i % 3 == 0 && n <= kSlot) {
          body = shared[t].segment(i * kSlot, i * kSlot + n);
        } else {
          body = SArray<char>(n);
        }
        for (size_t k = 0; k < n; ++k) body[k] = BodyByte(t, i, k);
        const int32_t ti[2] = {t, i};
        SArray<char> tag(sizeof(ti));
        std::memcpy(tag.data(), ti, sizeof(ti));
        Message msg;
        msg.meta.set_recver(1 + (t + i) % 2);
        msg.AddData(tag, pb::CHAR);
        msg.AddData(body, pb::CHAR);
        if (!sender.Send(&msg).ok()) ++send_errors[t];
      }
    });
  }
  for (auto& s : senders) s.join();
  senders_done.store(true);
  churn.join();

  const int want = kThreads * kPerThread;
  for (Inbox* inbox : {&inbox1, &inbox2}) {
    std::unique_lock<std::mutex> lock(inbox->mu);
    inbox->arrived.wait_for(lock, std::chrono::seconds(20),
                            [&] { return inbox->total >= want / 2; });
  }
  // Room for a duplicate to show up.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(send_errors[t], 0) << t;
  std::map<std::pair<int, int>, int> all;
  for (Inbox* inbox : {&inbox1, &inbox2}) {
    std::lock_guard<std::mutex> lock(inbox->mu);
    EXPECT_TRUE(inbox->errors.empty()) << inbox->errors.front();
    for (const auto& [tag, n] : inbox->count) all[tag] += n;
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(want));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      EXPECT_EQ(all[std::make_pair(t, i)], 1)
          << "message (" << t << ", " << i << ")";
    }
  }
  EXPECT_GT(churns.load(), 0);
  // Bodies in shared memory, over the inline size, sent to node 1 go as
  // references; to node 2 as bytes.
  EXPECT_GT(sender.num_shared_sent(), 0u);
  EXPECT_EQ(receiver1.num_shared_received(), sender.num_shared_sent());
  EXPECT_EQ(receiver2.num_shared_received(), 0u);
  EXPECT_EQ(receiver1.num_dropped() + receiver2.num_dropped(), 0u);
}

TEST(Van, ConcurrentSendsArriveOnceWhilePeersComeAndGo) {
  ExpectConcurrentSendsArriveOnce(VanOptions());
}

// Message (t, i) of Inbox's shape.
Message TestMessage(int t, int i) {
  Message msg;
  const int32_t ti[2] = {t, i};
  SArray<char> tag(sizeof(ti));
  std::memcpy(tag.data(), ti, sizeof(ti));
  msg.AddData(tag, pb::CHAR);
  msg.AddData(SArray<char>(BodySize(t, i)), pb::CHAR);
  for (size_t k = 0; k < msg.data[1].size(); ++k) {
    msg.data[1][k] = BodyByte(t, i, k);
  }
  return msg;
}

// The ZeroMQ messages (each a list of parts) that a van with a job key
// sends for `msg` on the connection `sealer` seals: one of all its frames,
// or, `streamed`, the header alone and then each chunk of each data frame
// as a record of its own (seal.h).
std::vector<std::vector<std::string>> SealLikeAVan(seal::Sealer* sealer,
                                                   Message* msg,
                                                   bool streamed) {
  std::vector<std::string> plain = {EncodeHeader(msg)};
  for (const SArray<char>& f : msg->data)
    plain.emplace_back(f.data(), f.size());
  const auto frames = static_cast<uint32_t>(plain.size());
  size_t chunks = 0;
  for (const std::string& p : plain) chunks += seal::Chunks(p.size());
  uint64_t seq = sealer->Begin(chunks);
  std::vector<std::vector<std::string>> out(1);
  for (uint32_t i = 0; i < frames; ++i) {
    const std::string& p = plain[i];
    if (!streamed || i == 0) {
      std::string sealed(seal::SealedBytes(p.size()), '\0');
      sealer->Seal(seq, i, streamed ? 1 : frames, p.data(), p.size(),
                   &sealed[0]);
      out[0].push_back(sealed);
      seq += seal::Chunks(p.size());
      continue;
    }
    const auto n = static_cast<uint32_t>(seal::Chunks(p.size()));
    for (uint32_t c = 0; c < n; ++c) {
      const size_t bytes = seal::ChunkBytes(p.size(), c);
      std::string record(seal::kSeqBytes + bytes + seal::kTagBytes, '\0');
      sealer->SealChunk(seq++, i, frames, c, n,
                        p.data() + c * seal::kChunkBytes, bytes, &record[0]);
      out.push_back({record});
    }
  }
  return out;
}

// A DEALER connected to `port` that presents `token_hex` as a sealing
// sender does, with routing id `id`.
void* ConnectAs(void* context, int port, const std::string& token_hex,
                const std::string& id) {
  void* s = zmq_socket(context, ZMQ_DEALER);
  int linger = 2000;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
  zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, seal::kUserName,
                 std::strlen(seal::kUserName));
  zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, token_hex.data(), token_hex.size());
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  zmq_connect(s, endpoint.c_str());
  return s;
}

void SendParts(void* s, const std::vector<std::string>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    zmq_send(s, parts[i].data(), parts[i].size(),
             i + 1 < parts.size() ? ZMQ_SNDMORE : 0);
  }
}

bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 400 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return done();
}

// The job's secret as a Van with options.secret_key derives it.
std::string JobSecret(const char* z85) {
  std::string secret(seal::kKeyBytes, '\0');
  CHECK(zmq_z85_decode(reinterpret_cast<uint8_t*>(&secret[0]), z85) != nullptr);
  return secret;
}

// A van with a fresh job key, started, filling `inbox`; and a sealing
// hello for it made with that key, as a member makes one.
struct KeyedReceiver {
  static VanOptions Keyed() {
    char pub[41], secret[41];
    CHECK_EQ(zmq_curve_keypair(pub, secret), 0);
    VanOptions options;
    options.secret_key = secret;
    return options;
  }
  KeyedReceiver() {
    CHECK(receiver.Bind("127.0.0.1", 0, 0, 0).ok());
    receiver.Start([this](Message&& msg) { inbox.Take(std::move(msg)); });
    hello = seal::JobKey(JobSecret(options.secret_key.c_str()))
                .MakeHello(receiver.wire_key())
                .value();
  }
  const VanOptions options = Keyed();
  Inbox inbox;  // outlives the van that fills it
  Van receiver{options};
  seal::JobKey::Hello hello;
};

// An eavesdropper who recorded a member's handshake token and sealed
// message (made here with the job key, as the member made them) presents
// them again, as recorded and with the token's hex in upper case: the
// connection with the token as recorded is admitted, but its message is
// refused as a replay; the other spelling is refused at connect. The
// message opens exactly once.
TEST(Van, ReplayedTokenAndFramesOpenNothingTwice) {
  KeyedReceiver keyed;
  Inbox& inbox = keyed.inbox;
  Van& receiver = keyed.receiver;
  const seal::JobKey::Hello& hello = keyed.hello;
  // The recorded message, whole.
  Message msg = TestMessage(7, 7);
  seal::Sealer sealer(hello.key);
  const std::vector<std::string> sealed =
      SealLikeAVan(&sealer, &msg, /*streamed=*/false).at(0);

  void* context = zmq_ctx_new();
  auto send_as = [&](const std::string& token_hex, const std::string& id) {
    void* s = ConnectAs(context, receiver.port(), token_hex, id);
    SendParts(s, sealed);
    return s;
  };
  auto wait_for = WaitFor;
  const std::string token = seal::ToHex(hello.token);
  void* member = send_as(token, "member:1");
  ASSERT_TRUE(wait_for([&] {
    std::lock_guard<std::mutex> lock(inbox.mu);
    return inbox.total == 1;
  }));
  void* replay = send_as(token, "eavesdropper:1");
  EXPECT_TRUE(wait_for([&] { return receiver.num_dropped() == 1; }))
      << receiver.num_dropped();
  std::string upper = token;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  ASSERT_NE(upper, token);
  void* respelled = send_as(upper, "eavesdropper:2");
  EXPECT_TRUE(wait_for([&] { return receiver.num_refused() >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(inbox.mu);
    EXPECT_EQ(inbox.total, 1);
    EXPECT_TRUE(inbox.errors.empty());
  }
  EXPECT_EQ(receiver.num_dropped(), 1u);
  int zero = 0;
  for (void* s : {member, replay, respelled}) {
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(s);
  }
  receiver.Stop(0);
  zmq_ctx_term(context);
}

// A member's streamed messages on one connection: one cut short (its
// header and two of its five records), one with a record tampered, one with
// two records swapped, then one whole and a small one. Only the last two
// arrive, with their bytes; the receiver drops the rest and keeps serving.
// Then an eavesdropper who replays the member's token (so its connection
// shares the member's key) sends junk in the middle of a streamed message:
// a byte, two parts, and the next record with a byte changed. Each is
// dropped alone, and the member's message still arrives whole.
TEST(Van, StreamedMessageCutShortTamperedOrReorderedIsDropped) {
  KeyedReceiver keyed;
  Inbox& inbox = keyed.inbox;
  Van& receiver = keyed.receiver;
  const seal::JobKey::Hello& hello = keyed.hello;
  seal::Sealer sealer(hello.key);
  void* context = zmq_ctx_new();
  void* member =
      ConnectAs(context, receiver.port(), seal::ToHex(hello.token), "member:1");

  auto streamed = [&](int i) {
    Message msg = TestMessage(0, i);
    EXPECT_GE(msg.data[1].size(), seal::kStreamBytes);
    std::vector<std::vector<std::string>> parts =
        SealLikeAVan(&sealer, &msg, /*streamed=*/true);
    EXPECT_EQ(parts.size(), 1u + 1u + 4u);  // header; tag; body of 4 chunks
    return parts;
  };
  std::vector<std::vector<std::string>> cut = streamed(11);
  cut.resize(3);
  std::vector<std::vector<std::string>> tampered = streamed(36);
  tampered[3][0][seal::kSeqBytes + 5] ^= 1;
  std::vector<std::vector<std::string>> swapped = streamed(61);
  std::swap(swapped[3], swapped[4]);
  std::vector<std::vector<std::string>> whole = streamed(86);
  Message small = TestMessage(1, 1);
  for (const auto* m : {&cut, &tampered, &swapped, &whole}) {
    for (const std::vector<std::string>& parts : *m) SendParts(member, parts);
  }
  SendParts(member, SealLikeAVan(&sealer, &small, false).at(0));

  auto arrived = [&](int n) {
    return WaitFor([&] {
      std::lock_guard<std::mutex> lock(inbox.mu);
      return inbox.total == n;
    });
  };
  EXPECT_TRUE(arrived(2));
  // Dropped: the cut message (when the next header comes); the tampered
  // record, the two after it (each out of place, failing alone) and its
  // message (when the next header comes); the record out of place, the one
  // after it that is then out of place too, and its message.
  EXPECT_TRUE(WaitFor([&] { return receiver.num_dropped() == 8; }))
      << receiver.num_dropped();
  {
    std::lock_guard<std::mutex> lock(inbox.mu);
    EXPECT_TRUE(inbox.errors.empty()) << inbox.errors.front();
    EXPECT_EQ(inbox.total, 2);
    EXPECT_EQ((inbox.count[{0, 86}]), 1);
    EXPECT_EQ((inbox.count[{1, 1}]), 1);
  }

  std::vector<std::vector<std::string>> spoiled = streamed(111);
  void* eavesdropper = ConnectAs(context, receiver.port(),
                                 seal::ToHex(hello.token), "eavesdropper:1");
  for (size_t i = 0; i < 3; ++i) SendParts(member, spoiled[i]);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::string forged = spoiled[3][0];
  forged[seal::kSeqBytes + 1] ^= 1;
  for (const std::vector<std::string>& junk :
       std::vector<std::vector<std::string>>{{"x"}, {"a", "b"}, {forged}}) {
    SendParts(eavesdropper, junk);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (size_t i = 3; i < spoiled.size(); ++i) SendParts(member, spoiled[i]);
  EXPECT_TRUE(arrived(3));
  EXPECT_TRUE(WaitFor([&] { return receiver.num_dropped() == 11; }))
      << receiver.num_dropped();
  {
    std::lock_guard<std::mutex> lock(inbox.mu);
    EXPECT_TRUE(inbox.errors.empty()) << inbox.errors.front();
    EXPECT_EQ((inbox.count[{0, 111}]), 1);
  }
  int zero = 0;
  for (void* s : {member, eavesdropper}) {
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(s);
  }
  receiver.Stop(0);
  zmq_ctx_term(context);
}

// A peer that refused this van's handshake (another job's key) leaves it
// no connection, and ZeroMQ makes none again: a send then fails, naming
// why, instead of waiting forever for a connection. (On a loaded host the
// refusal sometimes ends the connection before ZeroMQ reads the peer's
// error; ZeroMQ then reconnects, is refused again, and keeps the queue:
// every send is taken and none arrives. Either way, no send waits.)
TEST(Van, SendAfterTheHandshakeWasRefusedFailsNamingIt) {
  KeyedReceiver keyed;
  Van stranger(KeyedReceiver::Keyed());  // another job's key
  stranger.set_identity("stranger:1");
  ASSERT_TRUE(stranger
                  .Connect(1, "127.0.0.1", keyed.receiver.port(),
                           keyed.receiver.wire_key())
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return keyed.receiver.num_refused() >= 1; }));
  // Sends queue until ZeroMQ has dropped the refused connection; each one
  // after that fails. At most 400 tries, 25 ms apart.
  auto sending = std::async(std::launch::async, [&] {
    Status last;
    for (int i = 0; i < 400 && last.ok(); ++i) {
      Message msg = TestMessage(0, i);
      msg.meta.set_recver(1);
      last = stranger.Send(&msg);
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return last;
  });
  ASSERT_EQ(sending.wait_for(std::chrono::seconds(60)),
            std::future_status::ready)
      << "a send to the refusing peer never returned";
  const Status st = sending.get();
  if (!st.ok()) {
    EXPECT_EQ(st.code(), Status::kUnavailable) << st;
    EXPECT_NE(st.message().find("refused this node's handshake"),
              std::string::npos)
        << st;
  }
  std::lock_guard<std::mutex> lock(keyed.inbox.mu);
  EXPECT_EQ(keyed.inbox.total, 0);
}

TEST(Van, SealedConcurrentSendsArriveOnceWhilePeersComeAndGo) {
  VanOptions keyed;
  char pub[41], secret[41];
  ASSERT_EQ(zmq_curve_keypair(pub, secret), 0);  // 32 random bytes in Z85
  keyed.secret_key = secret;
  ExpectConcurrentSendsArriveOnce(keyed);
}

}  // namespace
}  // namespace ps
