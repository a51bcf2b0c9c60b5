// A worker-side slicer, as ps-lite allows: key k goes to server k % S,
// whatever the servers' key ranges (which would put every small key on
// server 0). Each worker pushes 1000 small keys 10 times and pulls the sums
// back in key order; each server reports how many keys it holds and checks
// that they are all its residue. Written in older ps-lite's forms (Start(),
// KVWorker(app_id), Finalize()), with the key space set from code through
// Environment::Init.
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

// One value per key; slices keep the keys' order.
void ResidueSlicer(const KVPairs<float>& send, const std::vector<Range>& ranges,
                   KVWorker<float>::SlicedKVs* sliced) {
  sliced->resize(ranges.size());
  for (size_t i = 0; i < send.keys.size(); ++i) {
    auto& part = (*sliced)[send.keys[i] % ranges.size()];
    part.first = true;
    part.second.keys.push_back(send.keys[i]);
    if (!send.vals.empty()) part.second.vals.push_back(send.vals[i]);
  }
}

void RunWorker() {
  if (!IsWorker()) return;
  KVWorker<float> kv(0);
  kv.set_slicer(ResidueSlicer);
  const int num = 1000;
  std::vector<Key> keys(num);
  std::vector<float> vals(num);
  for (int i = 0; i < num; ++i) {
    keys[i] = i;
    vals[i] = static_cast<float>(i % 89);
  }
  const int repeat = 10;
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
  for (int i = 0; i < num; ++i) CHECK_EQ(svals[i], rets[i]) << "key " << i;
  std::cout << "worker " << MyRank() << " ok" << std::endl;
}

int main(int argc, char* argv[]) {
  Environment::Init({{"PS_MAX_KEY", "1000"}});
  CHECK_EQ(std::string(Environment::Get()->find("PS_MAX_KEY")), "1000");
  StartServer();
  Start();
  const std::vector<Range>& ranges = Postoffice::Get()->GetServerKeyRanges();
  CHECK_EQ(ranges[0].end(), 1000u / NumServers());
  RunWorker();
  Finalize();
  if (handle != nullptr) {
    size_t held = handle->store.size();
    for (const auto& kv : handle->store) {
      CHECK_EQ(kv.first % NumServers(), static_cast<Key>(MyRank()));
    }
    std::cout << "server " << MyRank() << " holds " << held << " keys"
              << std::endl;
    CHECK_EQ(held, static_cast<size_t>(1000 / NumServers()));
  }
  return 0;
}
