// Each worker pushes keys spread over the whole key space (as ps-lite's
// test does) 20 times and pulls the sums back, then push-pulls keys of its
// own 20 times, each answer the sum so far; each server reports how many
// keys it holds, which must be about 1/S of them.
#include <cmath>

#include "ps/ps.h"
using namespace ps;

KVServerDefaultHandle<float>* handle = nullptr;

void StartServer() {
  if (!IsServer()) return;
  auto server = new KVServer<float>(0);
  static KVServerDefaultHandle<float> h;
  handle = &h;
  server->set_request_handle(
      [](const KVMeta& meta, const KVPairs<float>& data, KVServer<float>* s) {
        (*handle)(meta, data, s);
      });
  RegisterExitCallback([server]() { delete server; });
}

void RunWorker() {
  if (!IsWorker()) return;
  KVWorker<float> kv(0, 0);
  const int num = 1000;
  std::vector<Key> keys(num);
  std::vector<float> vals(num);
  for (int i = 0; i < num; ++i) {
    keys[i] = kMaxKey / num * i;
    vals[i] = static_cast<float>(i % 97);
  }
  const int repeat = 20;
  std::vector<int> ts;
  for (int i = 0; i < repeat; ++i) ts.push_back(kv.Push(keys, vals));
  for (int t : ts) kv.Wait(t);
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  std::vector<float> rets;
  kv.Wait(kv.Pull(keys, &rets));
  CHECK_EQ(rets.size(), keys.size());
  for (int i = 0; i < num; ++i) {
    CHECK_EQ(rets[i], vals[i] * repeat * NumWorkers()) << "key " << keys[i];
  }
  SArray<Key> skeys(keys);
  SArray<float> svals;
  kv.Wait(kv.ZPull(skeys, &svals));
  CHECK_EQ(svals.size(), keys.size());
  CHECK_EQ(svals[5], vals[5] * repeat * NumWorkers());
  // PushPull on keys of its own (next to the shared ones): each answer is
  // the sum after this push.
  std::vector<Key> own(num);
  for (int i = 0; i < num; ++i) own[i] = keys[i] + 1 + MyRank();
  std::vector<float> outs;
  for (int i = 0; i < repeat; ++i) {
    kv.Wait(kv.PushPull(own, vals, &outs));
    CHECK_EQ(outs.size(), own.size());
    CHECK_EQ(outs[7], vals[7] * (i + 1));
  }
  for (int i = 0; i < num; ++i) CHECK_EQ(outs[i], vals[i] * repeat);
  SArray<float> zouts;
  kv.Wait(kv.ZPushPull(SArray<Key>(own), SArray<float>(vals), &zouts));
  CHECK_EQ(zouts[9], vals[9] * (repeat + 1));
  std::cout << "worker " << MyRank() << " ok" << std::endl;
}

int main(int argc, char* argv[]) {
  StartServer();
  Start(0);
  const std::vector<Range>& ranges = Postoffice::Get()->GetServerKeyRanges();
  CHECK_EQ(ranges.size(), static_cast<size_t>(NumServers()));
  CHECK_EQ(ranges[0].begin(), 0u);
  CHECK(!Postoffice::Get()->is_recovery());
  RunWorker();
  Finalize(0, true);
  if (handle != nullptr) {
    // 1000 shared keys and 1000 of each worker's own, beside them.
    size_t held = handle->store.size();
    size_t group = 1 + NumWorkers();
    size_t expect = 1000 * group / NumServers();
    std::cout << "server " << MyRank() << " holds " << held << " keys"
              << std::endl;
    CHECK_LE(held, expect + group);
    CHECK_GE(held + group, expect);
  }
  return 0;
}
