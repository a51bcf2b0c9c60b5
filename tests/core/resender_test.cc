// The adaptive resend timer (src/postoffice/resender.h): RttEstimator's
// numbers are RFC 6298's formulas worked by hand; Resender is fed
// messages, acknowledgements and answers, with a send function that
// records instead of a socket.
#include "postoffice/resender.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace ps {
namespace {

TEST(RttEstimator, FollowsRfc6298) {
  RttEstimator e(/*initial_ms=*/1000, /*floor_ms=*/5, /*ceiling_ms=*/16000);
  EXPECT_FALSE(e.sampled());
  EXPECT_EQ(e.rto_ms(), 1000);  // before a sample: the initial value
  e.OnSample(100);              // SRTT = R, RTTVAR = R / 2
  EXPECT_EQ(e.srtt_ms(), 100);
  EXPECT_EQ(e.rttvar_ms(), 50);
  EXPECT_EQ(e.rto_ms(), 300);  // 100 + 4 x 50
  e.OnSample(60);
  // RTTVAR = 3/4 x 50 + 1/4 x |100 - 60| = 47.5; SRTT = 7/8 x 100 + 1/8 x 60
  EXPECT_DOUBLE_EQ(e.rttvar_ms(), 47.5);
  EXPECT_DOUBLE_EQ(e.srtt_ms(), 95);
  EXPECT_DOUBLE_EQ(e.rto_ms(), 285);  // 95 + 4 x 47.5
}

TEST(RttEstimator, BacksOffOnTimeoutAndResetsOnASample) {
  RttEstimator e(1000, 5, 16000);
  e.OnTimeout();  // no sample yet: the initial value backs off
  EXPECT_EQ(e.rto_ms(), 2000);
  e.OnSample(100);
  EXPECT_EQ(e.backoff(), 1);
  EXPECT_EQ(e.rto_ms(), 300);
  e.OnTimeout();
  EXPECT_EQ(e.rto_ms(), 600);
  e.OnTimeout();
  EXPECT_EQ(e.rto_ms(), 1200);
  e.OnSample(100);  // RTTVAR = 3/4 x 50 + 0 = 37.5, SRTT = 100
  EXPECT_EQ(e.backoff(), 1);
  EXPECT_DOUBLE_EQ(e.rto_ms(), 250);
  for (int i = 0; i < 20; ++i) e.OnTimeout();
  EXPECT_EQ(e.rto_ms(), 16000);  // the ceiling
  EXPECT_LE(e.backoff(), 64);    // and no more doubling past it
}

// A burst of slow round trips (a busy host) is remembered for a window or
// two, however many fast ones follow, then forgotten.
TEST(RttEstimator, KeepsTheLongestRecentRoundTripForTwoWindows) {
  RttEstimator e(1000, 5, 16000);
  const double w = RttEstimator::kWindowMs;
  e.OnSample(1, 0);
  e.OnSample(40, 10);  // the burst
  for (int i = 0; i < 100; ++i) e.OnSample(1, 20 + i);
  // SRTT + 4 RTTVAR has forgotten it (about 1 ms), the window has not.
  EXPECT_LT(e.srtt_ms() + 4 * e.rttvar_ms(), 5);
  EXPECT_DOUBLE_EQ(e.rto_ms(), 1.25 * 40);
  e.OnSample(1, w + 1);  // the next window: the one before still counts
  EXPECT_DOUBLE_EQ(e.rto_ms(), 1.25 * 40);
  e.OnSample(1, 2 * w + 2);  // two windows on: forgotten
  EXPECT_DOUBLE_EQ(e.rto_ms(), 5);
  e.OnSample(30, 2 * w + 3);
  e.OnSample(1, 5 * w);  // a window with no samples between: forgotten too
  EXPECT_LT(e.rto_ms(), 1.25 * 30);
}

TEST(RttEstimator, FloorAndCeiling) {
  RttEstimator fast(1000, 5, 16000);
  fast.OnSample(0.2);  // 0.2 + 4 x 0.1 = 0.6 ms: the floor
  EXPECT_EQ(fast.rto_ms(), 5);
  RttEstimator slow(1000, 5, 16000);
  slow.OnSample(10000);  // 10000 + 4 x 5000: the ceiling
  EXPECT_EQ(slow.rto_ms(), 16000);
}

// A worker's request to server id 8 (app 0, customer 0, timestamp ts).
Message Request(int ts, int server = 8) {
  Message msg;
  msg.meta.set_request(true);
  msg.meta.set_push(true);
  msg.meta.set_timestamp(ts);
  msg.meta.set_sender(9);
  msg.meta.set_recver(server);
  return msg;
}

TEST(Resender, KeepsAWorkersRequestsAndAServersAnswers) {
  Message req = Request(1);
  EXPECT_TRUE(Resender::Wants(req.meta, Role::kWorker));
  EXPECT_FALSE(Resender::Wants(req.meta, Role::kServer));
  Message answer;
  answer.meta.set_recver(9);
  EXPECT_TRUE(Resender::Wants(answer.meta, Role::kServer));
  answer.meta.set_origin(11);  // to a primary, for a worker: not kept
  EXPECT_FALSE(Resender::Wants(answer.meta, Role::kServer));
  Message simple = Request(1);
  simple.meta.set_simple_app(true);
  EXPECT_FALSE(Resender::Wants(simple.meta, Role::kWorker));
  Message control = Request(1);
  control.meta.mutable_control()->set_cmd(pb::BARRIER);
  EXPECT_FALSE(Resender::Wants(control.meta, Role::kWorker));
}

TEST(Resender, AckSamplesTheRoundTripOfTheAttemptItNames) {
  Resender r(1000, [](Message*) { return Status::OK(); });
  const auto t0 = Resender::Clock::now();
  Message req = Request(1);
  r.Keep(&req, t0);
  EXPECT_EQ(req.meta.attempt(), 1);
  EXPECT_EQ(r.num_kept(), 1u);
  EXPECT_EQ(r.RtoMs(8), 1000);
  Message ack = Resender::AckOf(req.meta);
  EXPECT_TRUE(ack.meta.ack());
  EXPECT_EQ(ack.meta.recver(), 9);
  EXPECT_EQ(ack.meta.timestamp(), 1);
  EXPECT_EQ(ack.meta.attempt(), 1);
  r.OnAck(/*peer=*/10, ack.meta, t0);  // another peer's: nothing
  EXPECT_EQ(r.num_kept(), 1u);
  r.OnAck(8, ack.meta, t0 + std::chrono::milliseconds(10));
  EXPECT_EQ(r.num_kept(), 0u);
  EXPECT_DOUBLE_EQ(r.RtoMs(8), 30);  // 10 + 4 x 5
  // Sent twice (t0, t0 + 100 ms): an acknowledgement of the first send
  // at t0 + 150 ms is a sample of 150 ms, not 50 (no ambiguity to skip,
  // Karn's problem): RTTVAR = 3/4 x 5 + 1/4 x 140 = 38.75, SRTT = 7/8 x 10
  // + 1/8 x 150 = 27.5; SRTT + 4 RTTVAR = 182.5, below 1.25 x 150, the
  // longest recent round trip's margin.
  Message again = Request(2);
  r.Keep(&again, t0);
  r.Keep(&again, t0 + std::chrono::milliseconds(100));
  EXPECT_EQ(again.meta.attempt(), 2);
  Message first_ack = Resender::AckOf(again.meta);
  first_ack.meta.set_attempt(1);
  r.OnAck(8, first_ack.meta, t0 + std::chrono::milliseconds(150));
  EXPECT_EQ(r.num_kept(), 0u);
  EXPECT_DOUBLE_EQ(r.RtoMs(8), 1.25 * 150);
  // One naming no attempt of ours settles the message, without a sample.
  Message odd = Request(4);
  r.Keep(&odd, t0);
  Message odd_ack = Resender::AckOf(odd.meta);
  odd_ack.meta.set_attempt(7);
  r.OnAck(8, odd_ack.meta, t0 + std::chrono::seconds(9));
  EXPECT_EQ(r.num_kept(), 0u);
  EXPECT_DOUBLE_EQ(r.RtoMs(8), 1.25 * 150);
  // An answer settles its request, without a sample.
  Message third = Request(3);
  r.Keep(&third, t0);
  Message answer;
  answer.meta.set_timestamp(3);
  r.OnAnswer(8, answer.meta);
  EXPECT_EQ(r.num_kept(), 0u);
}

// A send function that records what the resend thread sends, and waits
// (at most 30 s) until it sent `n`.
class Recorder {
 public:
  Resender::SendFn fn() {
    return [this](Message* msg) {
      MutexLock lock(&mu_);
      sent_.push_back(*msg);
      cv_.SignalAll();
      return Status::OK();
    };
  }
  // What was sent since the last Take, once at least n (or 30 s passed).
  std::vector<Message> Take(size_t n) {
    MutexLock lock(&mu_);
    auto deadline = CondVar::Clock::now() + std::chrono::seconds(30);
    while (sent_.size() < n && cv_.WaitUntil(deadline)) {
    }
    std::vector<Message> sent;
    sent.swap(sent_);
    return sent;
  }

 private:
  Mutex mu_;
  CondVar cv_{&mu_};
  std::vector<Message> sent_ GUARDED_BY(mu_);
};

// Delayed acknowledgements: the server (id 8) owes the worker (id 9) the
// acknowledgement of its request; the answer it sends within kAckDelayMs
// carries it, and the worker's Resender takes it as an acknowledgement
// with a sample (the answer alone would settle it without one).
TEST(Resender, AnAnswerSentSoonCarriesItsRequestsAcknowledgement) {
  Resender worker(1000, [](Message*) { return Status::OK(); });
  Resender server(1000, [](Message*) { return Status::OK(); });
  const auto t0 = Resender::Clock::now();
  Message req = Request(1);
  worker.Keep(&req, t0);
  server.Owe(/*peer=*/9, req.meta, t0);
  EXPECT_EQ(server.num_owed(), 1u);
  Message answer;
  answer.meta.set_timestamp(1);
  answer.meta.set_sender(8);
  answer.meta.set_recver(9);
  server.Keep(&answer, t0);
  EXPECT_EQ(server.num_owed(), 0u);
  ASSERT_EQ(answer.meta.acks_size(), 1);
  EXPECT_TRUE(answer.meta.acks(0).request());
  EXPECT_EQ(answer.meta.acks(0).timestamp(), 1);
  EXPECT_EQ(answer.meta.acks(0).attempt(), 1);
  worker.OnAck(8, answer.meta, t0 + std::chrono::milliseconds(20));
  EXPECT_EQ(worker.num_kept(), 0u);
  EXPECT_DOUBLE_EQ(worker.RtoMs(8), 60);  // 20 + 4 x 10: a sample
  // What the server keeps to send again carries none: acknowledgements
  // lost with it are the worker's resend to recover.
  server.OnAck(9, answer.meta, t0);  // the worker's own: not the server's
  EXPECT_EQ(server.num_kept(), 1u);
  // Another peer's messages carry nothing owed to 9.
  server.Owe(9, req.meta, t0);
  Message to_other = answer;
  to_other.meta.set_recver(10);
  server.Keep(&to_other, t0);
  EXPECT_EQ(to_other.meta.acks_size(), 0);
  EXPECT_EQ(server.num_owed(), 1u);
}

// With nothing to ride on, what is owed a peer goes in one message of its
// own, kAckDelayMs after the first was owed; at kMaxOwed it goes at once.
TEST(Resender, OwedAcknowledgementsGoAloneAfterTheDelay) {
  Recorder recorder;
  Resender r(1000, recorder.fn());
  r.Start();
  const auto t0 = Resender::Clock::now();
  r.Owe(9, Request(1).meta, t0);
  r.Owe(9, Request(2).meta, t0);
  r.Owe(10, Request(3).meta, t0);
  std::vector<Message> sent = recorder.Take(2);
  ASSERT_EQ(sent.size(), 2u) << "not acknowledged within 30 s";
  for (const Message& ack : sent) {
    EXPECT_TRUE(ack.meta.ack());
    EXPECT_TRUE(ack.data.empty());
    EXPECT_EQ(ack.meta.acks_size(), ack.meta.recver() == 9 ? 2 : 1);
  }
  EXPECT_EQ(r.num_owed(), 0u);
  // A resender settling from such a message: both of its entries.
  Resender w(1000, [](Message*) { return Status::OK(); });
  Message a = Request(1), b = Request(2);
  w.Keep(&a, t0);
  w.Keep(&b, t0);
  Message both;
  both.meta.set_ack(true);
  *both.meta.add_acks() = Resender::AckedOf(a.meta);
  *both.meta.add_acks() = Resender::AckedOf(b.meta);
  w.OnAck(8, both.meta, t0 + std::chrono::milliseconds(2));
  EXPECT_EQ(w.num_kept(), 0u);
  // kMaxOwed at once, however long the delay.
  for (size_t i = 0; i < Resender::kMaxOwed; ++i) {
    r.Owe(11, Request(static_cast<int>(i)).meta, Resender::Clock::now());
  }
  sent = recorder.Take(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].meta.acks_size(), static_cast<int>(Resender::kMaxOwed));
  r.Stop();
}

TEST(Resender, SendsAgainAfterTheRtoUntilAcknowledged) {
  Recorder recorder;
  Resender r(1000, recorder.fn());
  r.Start();
  // One sample of 1 ms: the RTO is the floor, 5 ms.
  const auto t0 = Resender::Clock::now();
  Message first = Request(1);
  r.Keep(&first, t0);
  r.OnAck(8, Resender::AckOf(first.meta).meta,
          t0 + std::chrono::milliseconds(1));
  ASSERT_EQ(r.RtoMs(8), Resender::kFloorMs);
  Message lost = Request(2);
  r.Keep(&lost, Resender::Clock::now());
  std::vector<Message> sent = recorder.Take(1);
  ASSERT_FALSE(sent.empty()) << "not resent within 30 s";
  EXPECT_EQ(sent[0].meta.timestamp(), 2);
  EXPECT_EQ(sent[0].meta.attempt(), 2);
  EXPECT_GT(r.RtoMs(8), Resender::kFloorMs);  // backed off
  r.OnAck(8, Resender::AckOf(lost.meta).meta, Resender::Clock::now());
  EXPECT_EQ(r.num_kept(), 0u);
  r.Stop();
}

TEST(Resender, GivesUpAfterMaxSends) {
  std::atomic<int> sends{0};
  Resender r(1, [&](Message*) {
    ++sends;
    return Status::OK();
  });
  r.Start();
  Message lost = Request(1);
  r.Keep(&lost, Resender::Clock::now());
  // 5, 10, 20, 40, ... capped at 16 x 5 ms: gone well within 30 s.
  for (int i = 0; i < 3000 && r.num_kept() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(r.num_kept(), 0u);
  EXPECT_EQ(sends.load(), Resender::kMaxSends - 1);
  r.Stop();
}

}  // namespace
}  // namespace ps
