// Several worker customers in one worker process, each a worker of the job
// (ps-lite's multi-worker form: DMLC_NUM_WORKER counts customers). Each
// thread starts its customer, pushes its own keys through its own
// KVWorker, and every customer of the job pushes one shared key; after a
// barrier of the worker group, which ends only once every customer entered
// it, each checks its keys and that the shared key holds exactly one push
// per worker customer.
#include <cmath>
#include <thread>
#include <vector>

#include "ps/ps.h"
using namespace ps;

const int kCustomers = 2;  // worker customers per worker process
const Key kShared = kMaxKey - 1;

void StartServer() {
  if (!IsServer()) return;
  auto server = new KVServer<float>(0);
  server->set_request_handle(KVServerDefaultHandle<float>());
  RegisterExitCallback([server]() { delete server; });
}

void RunWorker(int customer_id) {
  Start(customer_id);
  KVWorker<float> kv(0, customer_id);
  const int num = 500;
  std::vector<Key> keys(num);
  std::vector<float> vals(num);
  for (int i = 0; i < num; ++i) {
    keys[i] = kMaxKey / 2 / num * i + kCustomers * MyRank() + customer_id;
    vals[i] = static_cast<float>((i * 7 + customer_id) % 1000);
  }
  const int repeat = 10;
  std::vector<int> ts;
  for (int i = 0; i < repeat; ++i) ts.push_back(kv.Push(keys, vals));
  ts.push_back(kv.Push({kShared}, {1.0f}));
  for (int t : ts) kv.Wait(t);
  Barrier(customer_id, kWorkerGroup);  // every worker customer pushed
  std::vector<float> rets, shared;
  kv.Wait(kv.Pull(keys, &rets));
  kv.Wait(kv.Pull({kShared}, &shared));
  float err = 0;
  for (int i = 0; i < num; ++i) err += std::fabs(rets[i] - vals[i] * repeat);
  CHECK_EQ(err, 0.0f);
  CHECK_EQ(shared.size(), 1u);
  CHECK_EQ(shared[0], static_cast<float>(NumWorkers()))
      << "the shared key holds one push per worker customer";
  // One write per line: the customers' threads print at once.
  std::cout << ("worker " + std::to_string(MyRank()) + " customer " +
                std::to_string(customer_id) + " ok, shared " +
                std::to_string(static_cast<int>(shared[0])) + "\n")
            << std::flush;
  Finalize(customer_id, true);
}

int main(int argc, char* argv[]) {
  if (!IsWorker()) {
    StartServer();
    Start(0);
    Finalize(0, true);
    return 0;
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < kCustomers; ++c) threads.emplace_back(RunWorker, c);
  for (std::thread& t : threads) t.join();
  return 0;
}
