// RequestDedup's window at its edge (src/kv/dedup.h): a server remembers a
// worker customer's last kRecentPerCustomer (4096) request timestamps, so a
// repeat of the oldest of them is still a repeat, and a repeat of the one
// before it is taken for a new request (docs/architecture.md, "Lost
// messages: resend and apply once").
#include <gtest/gtest.h>

#include "kv/dedup.h"

namespace ps {
namespace detail {
namespace {

using Done = RequestDedup::Done;
constexpr int kWindow = static_cast<int>(RequestDedup::kRecentPerCustomer);

KVMeta Request(int ts, int sender = 9, int customer = 0) {
  KVMeta m;
  m.sender = sender;
  m.customer_id = customer;
  m.timestamp = ts;
  return m;
}

// Requests [0, count) of one customer seen and answered (the odd ones
// refused, so that both records are at the edge).
void SeeAndAnswer(RequestDedup* dedup, int count) {
  Status refusal;
  for (int ts = 0; ts < count; ++ts) {
    ASSERT_EQ(dedup->Seen(Request(ts), &refusal), Done::kNew) << ts;
    dedup->MarkAnswered(
        Request(ts),
        ts % 2 == 0 ? Status::OK()
                    : Status::InvalidArgument("refused " + std::to_string(ts)));
  }
}

TEST(DedupWindow, WindowIs4096Timestamps) {
  EXPECT_EQ(RequestDedup::kRecentPerCustomer, 4096u);
}

// After timestamps 0..4095, every one of them is a repeat: the oldest is
// answered again from its record, refused ones with their error.
TEST(DedupWindow, RepeatJustInsideTheWindowIsRecognized) {
  RequestDedup dedup;
  SeeAndAnswer(&dedup, kWindow);
  Status refusal;
  EXPECT_EQ(dedup.Seen(Request(0), &refusal), Done::kAnswered);
  EXPECT_EQ(dedup.Seen(Request(1), &refusal), Done::kRefused);
  EXPECT_EQ(refusal.message(), "refused 1");
  EXPECT_EQ(dedup.Seen(Request(kWindow - 1), &refusal), Done::kRefused);
  EXPECT_EQ(refusal.message(), "refused " + std::to_string(kWindow - 1));
  // Repeats change nothing: each is recognized again.
  int repeats = 0;
  for (int ts = 0; ts < kWindow; ++ts) {
    repeats += dedup.Seen(Request(ts), &refusal) != Done::kNew;
  }
  EXPECT_EQ(repeats, kWindow);
}

// One more request (4096) forgets timestamp 0 only: 1 is still a repeat,
// 0 is taken for new. Other customers and workers keep windows of their own.
TEST(DedupWindow, RepeatJustPastTheEdgeIsTakenForNew) {
  RequestDedup dedup;
  SeeAndAnswer(&dedup, kWindow);
  Status refusal;
  ASSERT_EQ(dedup.Seen(Request(kWindow), &refusal), Done::kNew);
  dedup.MarkAnswered(Request(kWindow), Status::OK());
  EXPECT_EQ(dedup.Seen(Request(1), &refusal), Done::kRefused);
  EXPECT_EQ(refusal.message(), "refused 1");
  EXPECT_EQ(dedup.Seen(Request(2), &refusal), Done::kAnswered);
  EXPECT_EQ(dedup.Seen(Request(kWindow), &refusal), Done::kAnswered);
  // Another customer's and another worker's timestamp 0 were never seen.
  EXPECT_EQ(dedup.Seen(Request(0, 9, 1), &refusal), Done::kNew);
  EXPECT_EQ(dedup.Seen(Request(0, 11, 0), &refusal), Done::kNew);
  // Past the edge: applied as new, and (sharing a slot) it forgets 4096.
  EXPECT_EQ(dedup.Seen(Request(0), &refusal), Done::kNew);
  EXPECT_EQ(dedup.Seen(Request(0), &refusal), Done::kPending);
  EXPECT_EQ(dedup.Seen(Request(kWindow), &refusal), Done::kNew);
}

// Pending (seen, not answered) requests are remembered the same way.
TEST(DedupWindow, PendingRequestsShareTheWindow) {
  RequestDedup dedup;
  Status refusal;
  for (int ts = 0; ts < kWindow; ++ts) {
    ASSERT_EQ(dedup.Seen(Request(ts), &refusal), Done::kNew) << ts;
  }
  int pending = 0;
  for (int ts = 0; ts < kWindow; ++ts) {
    pending += dedup.Seen(Request(ts), &refusal) == Done::kPending;
  }
  EXPECT_EQ(pending, kWindow);
  ASSERT_EQ(dedup.Seen(Request(kWindow), &refusal), Done::kNew);
  EXPECT_EQ(dedup.Seen(Request(0), &refusal), Done::kNew);
  EXPECT_EQ(dedup.Seen(Request(1), &refusal), Done::kPending);
}

}  // namespace
}  // namespace detail
}  // namespace ps
