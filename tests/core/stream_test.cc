// OutStream (src/van/stream.h): what the sending side of a sealed
// connection keeps, fed WELCOMEs, ACKs and ticks without sockets.
#include "van/stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace ps {
namespace {

using Clock = OutStream::Clock;

OutStream::Item Named(const std::string& header) {
  return OutStream::Item{header, Message(), {}, {}};
}

std::vector<std::string> Headers(const std::vector<OutStream::Item*>& items) {
  std::vector<std::string> out;
  for (const OutStream::Item* item : items) out.push_back(item->header);
  return out;
}

// Sends every item in the session now, numbering each as one chunk from
// `first`; returns the last number.
uint64_t SendAll(OutStream* out, const std::vector<OutStream::Item*>& items,
                 uint64_t first, Clock::time_point now) {
  uint64_t seq = first;
  for (OutStream::Item* item : items) out->Sent(item, seq++, now);
  return seq - 1;
}

TEST(OutStream, MessagesQueueUntilTheWelcomeThenGoInOrder) {
  OutStream out;
  const Clock::time_point t0 = Clock::now();
  out.Offer("s1", t0);
  EXPECT_EQ(out.state(), OutStream::State::kOffering);
  out.Add(Named("a"));
  out.Add(Named("b"));
  size_t lost = 0;
  std::vector<OutStream::Item*> now = out.Welcome("", 0, t0, &lost);
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(out.state(), OutStream::State::kOpen);
  EXPECT_EQ(Headers(now), (std::vector<std::string>{"a", "b"}));
  SendAll(&out, now, 1, t0);
  out.Ack(1, t0);  // "a" taken
  EXPECT_EQ(out.size(), 1u);
}

// A new session after a gap: what the quote says was taken is let go, the
// rest sent again in order, the message deleted on the way among them.
TEST(OutStream, ANewSessionSendsAgainExactlyWhatWasNotTaken) {
  OutStream out;
  const Clock::time_point t0 = Clock::now();
  out.Offer("s1", t0);
  size_t lost = 0;
  out.Welcome("", 0, t0, &lost);
  std::vector<OutStream::Item*> sent;
  for (const char* h : {"a", "b", "c", "d"}) {
    OutStream::Item* item = out.Add(Named(h));
    out.Sent(item, sent.size() + 1, t0);
    sent.push_back(item);
  }
  // "b" (2) was deleted: the receiver took 1 and refused 3 and 4.
  out.Offer("s2", t0);
  std::vector<OutStream::Item*> again = out.Welcome("s1", 1, t0, &lost);
  EXPECT_EQ(Headers(again), (std::vector<std::string>{"b", "c", "d"}));
  EXPECT_EQ(lost, 0u);
  // Sent again in s2 (1 to 3), but s2 is never confirmed (its first message
  // deleted too): the receiver quotes s1 again, so nothing more is settled.
  SendAll(&out, again, 1, t0);
  out.Offer("s3", t0);
  again = out.Welcome("s1", 1, t0, &lost);
  EXPECT_EQ(Headers(again), (std::vector<std::string>{"b", "c", "d"}));
  // Sent in s3 and two taken there.
  SendAll(&out, again, 1, t0);
  out.Offer("s4", t0);
  again = out.Welcome("s3", 2, t0, &lost);
  EXPECT_EQ(Headers(again), (std::vector<std::string>{"d"}));
}

// A receiver that knows no earlier session (it restarted): what was sent
// before is let go and counted, what was never sent goes.
TEST(OutStream, AReceiverWithoutTheSessionLetsGoWhatWasSentBefore) {
  OutStream out;
  const Clock::time_point t0 = Clock::now();
  out.Offer("s1", t0);
  size_t lost = 0;
  out.Welcome("", 0, t0, &lost);
  out.Sent(out.Add(Named("a")), 1, t0);
  out.Offer("s2", t0);
  out.Add(Named("b"));  // queued while offering
  std::vector<OutStream::Item*> again = out.Welcome("", 0, t0, &lost);
  EXPECT_EQ(lost, 1u);
  EXPECT_EQ(Headers(again), (std::vector<std::string>{"b"}));
}

// The timer: an offer unanswered is sent again, backing off; a message
// unacknowledged is probed for, backing off, and after kProbesPerSession
// probes the session is given up for a new one; an ACK resets it all.
TEST(OutStream, TheTimerOffersAgainProbesAndGivesUp) {
  OutStream out;
  const Clock::time_point t0 = Clock::now();
  out.Offer("s1", t0);
  EXPECT_EQ(out.Tick(t0 + std::chrono::milliseconds(100)),
            OutStream::Due::kNothing);
  EXPECT_EQ(out.Tick(t0 + OutStream::kFirstWait), OutStream::Due::kOfferAgain);
  EXPECT_EQ(
      out.Tick(t0 + OutStream::kFirstWait + std::chrono::milliseconds(300)),
      OutStream::Due::kNothing);  // now 400 ms
  size_t lost = 0;
  out.Welcome("", 0, t0, &lost);
  EXPECT_EQ(out.Tick(t0 + std::chrono::seconds(10)), OutStream::Due::kNothing);
  out.Sent(out.Add(Named("a")), 1, t0);
  Clock::time_point t = t0;
  for (int i = 0; i < OutStream::kProbesPerSession; ++i) {
    t += OutStream::kMostWait;
    EXPECT_EQ(out.Tick(t), OutStream::Due::kProbe) << i;
  }
  t += OutStream::kMostWait;
  EXPECT_EQ(out.Tick(t), OutStream::Due::kNewSession);
  out.Ack(1, t);
  EXPECT_EQ(out.size(), 0u);
  EXPECT_EQ(out.Tick(t + std::chrono::seconds(10)), OutStream::Due::kNothing);
}

}  // namespace
}  // namespace ps
