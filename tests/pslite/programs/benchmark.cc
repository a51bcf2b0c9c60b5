// ps-lite's 10M-key benchmark (its test_kv_app_benchmark) with exact
// checks: each worker pushes 10,000,000 keys spread over the key space once
// and pulls them back. The servers' handle checks every pushed value and
// answers a pull with values made from the keys, which the worker checks
// one by one. Prints each step's time (a figure, not a test).
#include <chrono>
#include <cstdint>

#include "ps/ps.h"
using namespace ps;

const int kNum = 10000000;
const Key kStride = kMaxKey / kNum;

// The value a worker pushes for a key, and what a pull of it returns.
float Pushed(Key key) { return static_cast<float>((key / kStride) % 1000); }
float Pulled(Key key) { return Pushed(key) + 0.5f; }

void Handle(const KVMeta& meta, const KVPairs<float>& data,
            KVServer<float>* server) {
  KVPairs<float> res;
  if (meta.push) {
    CHECK_EQ(data.keys.size(), data.vals.size());
    for (size_t i = 0; i < data.keys.size(); ++i) {
      CHECK_EQ(data.vals[i], Pushed(data.keys[i])) << "key " << data.keys[i];
    }
  } else {
    res.keys = data.keys;
    res.vals.resize(data.keys.size());
    for (size_t i = 0; i < data.keys.size(); ++i) {
      res.vals[i] = Pulled(data.keys[i]);
    }
  }
  server->Response(meta, res);
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

int main(int argc, char* argv[]) {
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(Handle);
    RegisterExitCallback([server]() { delete server; });
  }
  Start(0);
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    std::vector<Key> keys(kNum);
    std::vector<float> vals(kNum);
    for (int i = 0; i < kNum; ++i) {
      keys[i] = kStride * i + MyRank();
      vals[i] = Pushed(keys[i]);
    }
    auto start = std::chrono::steady_clock::now();
    kv.Wait(kv.Push(keys, vals));
    double push_ms = MsSince(start);
    std::vector<float> rets;
    start = std::chrono::steady_clock::now();
    kv.Wait(kv.Pull(keys, &rets));
    double pull_ms = MsSince(start);
    CHECK_EQ(rets.size(), keys.size());
    for (int i = 0; i < kNum; ++i) {
      CHECK_EQ(rets[i], Pulled(keys[i])) << "key " << keys[i];
    }
    std::cout << "worker " << MyRank() << " pushed and pulled " << kNum
              << " keys exactly (push " << push_ms << " ms, pull " << pull_ms
              << " ms)" << std::endl;
  }
  Finalize(0, true);
  return 0;
}
