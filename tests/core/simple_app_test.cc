// SimpleApp (ps/simple_app.h) between the nodes of an in-process cluster:
// requests that come before the receiver's app, the requester's customer
// id, and requests for an app never made.
#include "ps/simple_app.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr int kRequests = 20;

// Waits for app->Wait(ts) on another thread, up to `seconds`; false if it
// did not return (the thread is left to finish with the process).
bool WaitBounded(SimpleApp* app, int ts, int seconds) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread([app, ts, done] {
    app->Wait(ts);
    done->set_value();
  }).detach();
  return f.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready;
}

// ps-lite's order: the scheduler asks everyone at once, and the others make
// their app, then set its handle, after that. No request may reach the
// default handle, none may be lost.
TEST(SimpleApp, RequestsBeforeTheAppWaitForItsRequestHandle) {
  Cluster c(2, 2);
  ASSERT_TRUE(c.Start());
  SimpleApp asker(c.scheduler.get(), 0, 0);
  std::mutex mu;
  std::map<int, int> answers;  // sender id: answers with its id as body
  asker.set_response_handle([&](const SimpleData& res, SimpleApp*) {
    std::lock_guard<std::mutex> lock(mu);
    if (res.body == std::to_string(res.sender)) ++answers[res.sender];
  });
  std::vector<int> ts;
  for (int i = 0; i < kRequests; ++i) {
    ts.push_back(asker.Request(1, "test", kServerGroup + kWorkerGroup));
  }
  // Let the requests arrive first (no assertion on time: if they come
  // later, they take the ordinary path, and the counts still hold).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<Node*> others;
  for (auto& s : c.servers) others.push_back(s.get());
  for (auto& w : c.workers) others.push_back(w.get());
  std::vector<std::unique_ptr<SimpleApp>> apps;
  std::vector<std::unique_ptr<std::atomic<int>>> got;
  for (Node* n : others) {
    apps.push_back(std::make_unique<SimpleApp>(n, 0, 0));
    got.push_back(std::make_unique<std::atomic<int>>(0));
    std::atomic<int>* count = got.back().get();
    const int id = n->id();
    apps.back()->set_request_handle(
        [count, id](const SimpleData& req, SimpleApp* app) {
          EXPECT_EQ(req.head, 1);
          EXPECT_EQ(req.body, "test");
          ++*count;
          app->Response(req, std::to_string(id));
        });
  }
  for (int t : ts) ASSERT_TRUE(WaitBounded(&asker, t, 60)) << "request " << t;
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_EQ(got[i]->load(), kRequests)
        << others[i]->DescribeNode(others[i]->id());
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(answers[others[i]->id()], kRequests);
  }
  apps.clear();
  EXPECT_TRUE(c.Finalize());
}

// ps-lite's routing: a server's app is the app's (customer app_id), whatever
// customer asks; the asker's customer id reaches the handle, and the answer
// goes back to that customer's app.
TEST(SimpleApp, TheAnswerGoesToTheAskingCustomer) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.Start());
  Node* worker = c.workers[0].get();
  Node* server = c.servers[0].get();
  SimpleApp server_app(server, 0, 0);
  std::atomic<int> seen_customer{-1};
  server_app.set_request_handle([&](const SimpleData& req, SimpleApp* app) {
    seen_customer = req.customer_id;
    app->Response(req, "for " + std::to_string(req.customer_id));
  });
  SimpleApp other(worker, 0, 0);  // same app, another customer: gets nothing
  std::atomic<int> wrong{0};
  other.set_response_handle([&](const SimpleData&, SimpleApp*) { ++wrong; });
  SimpleApp asker(worker, 0, 3);
  std::mutex mu;
  std::string body;
  asker.set_response_handle([&](const SimpleData& res, SimpleApp*) {
    std::lock_guard<std::mutex> lock(mu);
    body = res.body;
  });
  int ts = asker.Request(7, "hi", server->id());
  ASSERT_TRUE(WaitBounded(&asker, ts, 60));
  EXPECT_EQ(seen_customer.load(), 3);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(body, "for 3");
  }
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(c.Finalize());
}

// An app that never sets a request handle answers what waited for it with
// the default handle (an empty body), a second after it was made.
TEST(SimpleApp, WithoutARequestHandleTheDefaultOneAnswers) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.Start());
  SimpleApp asker(c.scheduler.get(), 0, 0);
  std::atomic<int> empty{0};
  asker.set_response_handle([&](const SimpleData& res, SimpleApp*) {
    if (res.body.empty()) ++empty;
  });
  Node* worker = c.workers[0].get();
  SimpleApp silent(worker, 0, 0);  // made before: the requests wait in it
  std::vector<int> ts;
  for (int i = 0; i < kRequests; ++i) {
    ts.push_back(asker.Request(1, "x", worker->id()));
  }
  for (int t : ts) ASSERT_TRUE(WaitBounded(&asker, t, 60));
  EXPECT_EQ(empty.load(), kRequests);
  EXPECT_TRUE(c.Finalize());
}

// Requests waiting for an app that is destroyed before it took them are
// refused: the asker's Wait returns, with no answer.
TEST(SimpleApp, RequestsWaitingForADestroyedAppAreRefused) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.Start());
  SimpleApp asker(c.scheduler.get(), 0, 0);
  std::atomic<int> answered{0};
  asker.set_response_handle([&](const SimpleData&, SimpleApp*) { ++answered; });
  Node* worker = c.workers[0].get();
  const uint64_t dropped = worker->num_dropped_messages();
  int ts;
  {
    SimpleApp gone(worker, 0, 0);
    ts = asker.Request(1, "x", worker->id());
    // Let it reach the app, paused for a second (should it come after the
    // app is gone, it is refused as for an app never made: the same end).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(WaitBounded(&asker, ts, 60));
  EXPECT_EQ(answered.load(), 0) << "a refusal is no answer";
  EXPECT_EQ(worker->num_dropped_messages(), dropped + 1);
  EXPECT_TRUE(c.Finalize());
}

// A request for an app the receiver never makes is refused once it has
// waited PS_CONNECT_TIMEOUT_MS: the asker's Wait returns, nothing hangs.
TEST(SimpleApp, ARequestForAnAppNeverMadeIsRefused) {
  Cluster c(1, 1, [](Config* cfg) { cfg->connect_timeout_ms = 1000; });
  ASSERT_TRUE(c.Start());
  Node* worker = c.workers[0].get();
  SimpleApp asker(c.scheduler.get(), 5, 0);
  std::atomic<int> answered{0};
  asker.set_response_handle([&](const SimpleData&, SimpleApp*) { ++answered; });
  const uint64_t dropped = worker->num_dropped_messages();
  int ts = asker.Request(1, "anyone?", worker->id());
  ASSERT_TRUE(WaitBounded(&asker, ts, 60));
  EXPECT_EQ(answered.load(), 0) << "a refusal is no answer";
  EXPECT_EQ(worker->num_dropped_messages(), dropped + 1);
  EXPECT_TRUE(c.Finalize());
}

}  // namespace
}  // namespace ps
