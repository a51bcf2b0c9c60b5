// Two threads of each worker process, one customer each, push and pull
// their own keys through their own KVWorker, as ps-lite's multi-worker
// test does.
#include <cmath>

#include "ps/ps.h"
using namespace ps;

void StartServer() {
  if (!IsServer()) return;
  auto server = new KVServer<float>(0);
  server->set_request_handle(KVServerDefaultHandle<float>());
  RegisterExitCallback([server]() { delete server; });
}

void RunWorker(int customer_id) {
  if (!IsWorker()) return;
  Start(customer_id);
  KVWorker<float> kv(0, customer_id);
  const int num = 500;
  std::vector<Key> keys(num);
  std::vector<float> vals(num);
  for (int i = 0; i < num; ++i) {
    keys[i] = kMaxKey / num * i + customer_id + 2 * MyRank();
    vals[i] = static_cast<float>((i * 7 + customer_id) % 1000);
  }
  const int repeat = 10;
  std::vector<int> ts;
  for (int i = 0; i < repeat; ++i) ts.push_back(kv.Push(keys, vals));
  for (int t : ts) kv.Wait(t);
  std::vector<float> rets;
  kv.Wait(kv.Pull(keys, &rets));
  float err = 0;
  for (int i = 0; i < num; ++i) err += std::fabs(rets[i] - vals[i] * repeat);
  CHECK_EQ(err, 0.0f);
  // One write per line: the two customers' threads print at once.
  std::cout << ("worker " + std::to_string(MyRank()) + " customer " +
                std::to_string(customer_id) + " ok\n")
            << std::flush;
  Finalize(customer_id, true);
}

int main(int argc, char* argv[]) {
  StartServer();
  if (!IsWorker()) {
    Start(0);
    Finalize(0, true);
  }
  std::thread t0(RunWorker, 0);
  std::thread t1(RunWorker, 1);
  t0.join();
  t1.join();
  return 0;
}
