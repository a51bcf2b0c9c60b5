// ConnGuard (src/van/conn_guard.h) fed accepts and closes, without sockets:
// the caps per source and in all, the oldest shut first, a connection that
// is no longer idle forgotten instead of shut, and the default caps.
#include "van/conn_guard.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ps {
namespace {

using Clock = ConnGuard::Clock;
using std::chrono::milliseconds;

// Every connection idle.
bool Idle(int, const std::string&) { return true; }

std::vector<int> Fds(const std::vector<ConnGuard::Victim>& victims) {
  std::vector<int> fds;
  for (const auto& v : victims) fds.push_back(v.fd);
  return fds;
}

TEST(ConnGuard, PerSourceCapShutsTheOldestFromThatSource) {
  ConnGuard guard(3, 100);
  const Clock::time_point t0 = Clock::now();
  for (int fd = 10; fd < 13; ++fd) {
    EXPECT_TRUE(guard
                    .Accepted(fd, "10.0.0.1", "a" + std::to_string(fd),
                              t0 + milliseconds(fd), Idle)
                    .empty());
  }
  EXPECT_TRUE(guard.Accepted(20, "10.0.0.2", "b", t0, Idle).empty());
  const auto victims =
      guard.Accepted(13, "10.0.0.1", "a13", t0 + milliseconds(50), Idle);
  ASSERT_EQ(Fds(victims), std::vector<int>{10});
  EXPECT_EQ(victims[0].source, "10.0.0.1");
  EXPECT_EQ(victims[0].name, "a10");
  EXPECT_EQ(victims[0].held, milliseconds(40));
  EXPECT_EQ(victims[0].from_source, 4u);
  EXPECT_FALSE(victims[0].over_total);
  EXPECT_EQ(guard.held_from("10.0.0.1"), 3u);
  EXPECT_EQ(guard.held_from("10.0.0.2"), 1u);
  EXPECT_EQ(guard.num_shut(), 1u);
}

TEST(ConnGuard, TotalCapShutsTheOldestOfAnySource) {
  ConnGuard guard(100, 3);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(guard.Accepted(5, "10.0.0.9", "x", t0, Idle).empty());
  EXPECT_TRUE(guard.Accepted(6, "10.0.0.1", "y", t0, Idle).empty());
  EXPECT_TRUE(guard.Accepted(7, "10.0.0.2", "z", t0, Idle).empty());
  const auto victims = guard.Accepted(8, "10.0.0.3", "w", t0, Idle);
  ASSERT_EQ(Fds(victims), std::vector<int>{5});
  EXPECT_TRUE(victims[0].over_total);
  EXPECT_EQ(guard.held(), 3u);
  EXPECT_EQ(guard.held_from("10.0.0.9"), 0u);
}

TEST(ConnGuard, ClosedConnectionsNoLongerCount) {
  ConnGuard guard(2, 100);
  const Clock::time_point t0 = Clock::now();
  guard.Accepted(10, "h", "a", t0, Idle);
  guard.Accepted(11, "h", "b", t0, Idle);
  guard.Closed(10);
  guard.Closed(99);  // never accepted: ignored
  EXPECT_TRUE(guard.Accepted(12, "h", "c", t0, Idle).empty());
  EXPECT_EQ(guard.held(), 2u);
  EXPECT_EQ(guard.num_shut(), 0u);
}

// A descriptor accepted again while still held (its close was missed):
// the old connection is forgotten, not counted twice nor shut.
TEST(ConnGuard, AReusedDescriptorReplacesTheConnectionItHeld) {
  ConnGuard guard(2, 100);
  const Clock::time_point t0 = Clock::now();
  guard.Accepted(10, "h", "old", t0, Idle);
  guard.Accepted(10, "h", "new", t0, Idle);
  EXPECT_EQ(guard.held(), 1u);
  guard.Accepted(11, "h", "b", t0, Idle);
  const auto victims = guard.Accepted(12, "h", "c", t0, Idle);
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_EQ(victims[0].name, "new");
}

// A member's connection (its handshake went on) is never shut: when it is
// the oldest it is forgotten, and the next oldest idle one is shut.
TEST(ConnGuard, AConnectionThatIsNoLongerIdleIsForgottenNotShut) {
  ConnGuard guard(2, 100);
  const Clock::time_point t0 = Clock::now();
  std::set<int> asked;
  auto idle = [&asked](int fd, const std::string&) {
    asked.insert(fd);
    return fd != 10;
  };
  guard.Accepted(10, "h", "member", t0, idle);
  guard.Accepted(11, "h", "stranger", t0, idle);
  EXPECT_TRUE(asked.empty()) << "asked before a cap was passed";
  const auto victims = guard.Accepted(12, "h", "stranger2", t0, idle);
  EXPECT_EQ(Fds(victims), std::vector<int>{11});
  EXPECT_EQ(asked, (std::set<int>{10, 11}));
  EXPECT_EQ(guard.held(), 1u);  // 12 only: 10 forgotten, 11 shut
  EXPECT_EQ(guard.num_shut(), 1u);
}

// Nobody idle: nothing is shut, and every connection is forgotten.
TEST(ConnGuard, NothingIsShutWhenNoneIsIdle) {
  ConnGuard guard(1, 1);
  const Clock::time_point t0 = Clock::now();
  auto busy = [](int, const std::string&) { return false; };
  guard.Accepted(10, "h", "a", t0, busy);
  EXPECT_TRUE(guard.Accepted(11, "h", "b", t0, busy).empty());
  EXPECT_LE(guard.held(), 1u);
  EXPECT_EQ(guard.num_shut(), 0u);
}

// The goal's numbers: 1,500 idle connections from one address at a
// descriptor limit of 1,024: never more than the per-source cap held, the
// rest shut in the order they came.
TEST(ConnGuard, AFloodFromOneAddressIsHeldToTheCap) {
  ConnGuard guard(ConnGuard::DefaultPerSource(1024),
                  ConnGuard::DefaultTotal(1024));
  const Clock::time_point t0 = Clock::now();
  int next_victim = 0;
  for (int i = 0; i < 1500; ++i) {
    for (const auto& v :
         guard.Accepted(1000 + i, "127.0.0.1", std::to_string(i), t0, Idle)) {
      EXPECT_EQ(v.fd, 1000 + next_victim++);
    }
    ASSERT_LE(guard.held(), 64u);
  }
  EXPECT_EQ(guard.num_shut(), 1500u - 64u);
}

TEST(ConnGuard, DefaultCapsFollowTheDescriptorLimit) {
  EXPECT_EQ(ConnGuard::DefaultTotal(1024), 256);
  EXPECT_EQ(ConnGuard::DefaultPerSource(1024), 64);
  EXPECT_EQ(ConnGuard::DefaultTotal(20), 8);
  EXPECT_EQ(ConnGuard::DefaultPerSource(20), 8);
  EXPECT_EQ(ConnGuard::DefaultTotal(RLIM_INFINITY), 1 << 20);
  EXPECT_EQ(ConnGuard::DefaultPerSource(RLIM_INFINITY), 1 << 18);
}

}  // namespace
}  // namespace ps
