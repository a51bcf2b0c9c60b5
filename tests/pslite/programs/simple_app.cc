// Every node asks every node (itself and the scheduler included) 20 times,
// as ps-lite's test_simple_app does from the scheduler; each checks and
// answers each request and counts them. The app is made after Start, as in
// ps-lite's test: requests that come first wait for its request handle.
#include <atomic>
#include <string>

#include "ps/ps.h"
using namespace ps;

int main(int argc, char* argv[]) {
  const int n = 20;
  Start(0);
  SimpleApp app(0, 0);
  // A request to this node itself runs its handle on the asking thread.
  std::atomic<int> received{0};
  app.set_request_handle([&received](const SimpleData& req, SimpleApp* a) {
    CHECK_EQ(req.head, 7);
    CHECK_EQ(req.body, "ping " + std::to_string(req.sender));
    CHECK_EQ(req.customer_id, 0);
    ++received;
    a->Response(req, "pong " + std::to_string(req.sender));
  });
  const int nodes = 1 + NumServers() + NumWorkers();
  const int me = IsScheduler() ? kScheduler
                 : IsServer()  ? Postoffice::ServerRankToID(MyRank())
                               : Postoffice::WorkerRankToID(MyRank());
  std::atomic<int> answers{0};
  app.set_response_handle([&answers, me](const SimpleData& res, SimpleApp*) {
    CHECK_EQ(res.head, 7);
    CHECK_EQ(res.body, "pong " + std::to_string(me));
    ++answers;
  });
  std::vector<int> ts;
  for (int i = 0; i < n; ++i) {
    ts.push_back(app.Request(7, "ping " + std::to_string(me),
                             kScheduler + kServerGroup + kWorkerGroup));
  }
  for (int t : ts) app.Wait(t);
  CHECK_EQ(answers, n * nodes);
  // Every node waited for all its answers before this barrier: each has
  // taken every request by its end.
  Finalize(0, true);
  CHECK_EQ(received, n * nodes);
  std::cout << "simple_app ok " << received << " of " << n * nodes << std::endl;
  return 0;
}
