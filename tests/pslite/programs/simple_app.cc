// The scheduler asks every node (itself included) 20 times; each node
// checks and answers each request, and counts them.
#include "ps/ps.h"
using namespace ps;

int received = 0;

int main(int argc, char* argv[]) {
  const int n = 20;
  SimpleApp app(0);
  app.set_request_handle([](const SimpleData& req, SimpleApp* a) {
    CHECK_EQ(req.head, 7);
    CHECK_EQ(req.body, "ping");
    CHECK_EQ(req.sender, kScheduler);
    ++received;
    a->Response(req, "pong");
  });
  int answers = 0;
  app.set_response_handle([&answers](const SimpleData& res, SimpleApp*) {
    CHECK_EQ(res.head, 7);
    CHECK_EQ(res.body, "pong");
    ++answers;
  });
  Start(0);
  if (IsScheduler()) {
    std::vector<int> ts;
    for (int i = 0; i < n; ++i) {
      ts.push_back(
          app.Request(7, "ping", kScheduler + kServerGroup + kWorkerGroup));
    }
    for (int t : ts) app.Wait(t);
    int nodes = 1 + NumServers() + NumWorkers();
    CHECK_EQ(answers, n * nodes);
    LL << "answers " << answers;
  }
  Finalize(0, true);
  CHECK_EQ(received, n);
  std::cout << "simple_app ok " << received << std::endl;
  return 0;
}
