// Names every public name of ps-lite's public headers (ps/ps.h,
// simple_app.h, kv_app.h, base.h, range.h, sarray.h, internal/postoffice.h,
// internal/env.h, internal/utils.h) that the package offers, through
// "ps/ps.h" only, as a ps-lite program would; docs/pslite.md lists the ones
// not offered. Building this file is the check that they all compile and
// link. Run with no job, it checks the names that need no node (Range,
// SArray, GetEnv, the id helpers...) and prints "api names ok"; the calls
// that need a running job are compiled and linked but not run.
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"
using namespace ps;

namespace {

// ps/internal/utils.h's DISALLOW_COPY_AND_ASSIGN.
class NoCopy {
 public:
  NoCopy() = default;

 private:
  DISALLOW_COPY_AND_ASSIGN(NoCopy);
};

}  // namespace

// NameKV and NameNodeCalls have external linkage, so they are emitted and
// every library call they make must resolve when this program links.

// ps/kv_app.h: KVPairs, KVWorker, KVMeta, KVServer, KVServerDefaultHandle.
template <typename Val>
void NameKV() {
  KVPairs<Val> pairs;
  pairs.keys = SArray<Key>(std::vector<Key>{1, 3});
  pairs.vals = SArray<Val>(std::vector<Val>{1, 2});
  pairs.lens = SArray<int>(std::vector<int>{1, 1});
  pairs.priority = 1;

  KVWorker<Val> w(0, 0);
  KVWorker<Val> older(0);  // older ps-lite's KVWorker(app_id)
  typename KVWorker<Val>::Callback cb = [] {};
  std::vector<Key> keys = {1, 3};
  std::vector<Val> vals = {1, 2};
  std::vector<Val> outs;
  std::vector<int> lens;
  CHECK(w.Wait(w.Push(keys, vals)).ok());
  CHECK(w.Wait(w.Push(keys, vals, {1, 1}, 0, cb, 1)).ok());
  CHECK(w.Wait(w.Pull(keys, &outs)).ok());
  CHECK(w.Wait(w.Pull(keys, &outs, &lens, 0, cb, 1)).ok());
  CHECK(w.Wait(w.PushPull(keys, vals, &outs)).ok());
  CHECK(w.Wait(w.PushPull(keys, vals, &outs, &lens, 0, cb, 1)).ok());
  SArray<Val> zouts;
  SArray<int> zlens;
  CHECK(w.Wait(w.ZPush(pairs.keys, pairs.vals)).ok());
  CHECK(w.Wait(w.ZPush(pairs.keys, pairs.vals, pairs.lens, 0, cb, 1)).ok());
  CHECK(w.Wait(w.ZPull(pairs.keys, &zouts)).ok());
  CHECK(w.Wait(w.ZPull(pairs.keys, &zouts, &zlens, 0, cb, 1)).ok());
  CHECK(w.Wait(w.ZPushPull(pairs.keys, pairs.vals, &zouts)).ok());
  CHECK(w.Wait(w.ZPushPull(pairs.keys, pairs.vals, &zouts, &zlens, 0, cb, 1))
            .ok());
  typename KVWorker<Val>::Slicer slicer =
      [](const KVPairs<Val>& send, const std::vector<Range>& ranges,
         typename KVWorker<Val>::SlicedKVs* sliced) {
        sliced->resize(ranges.size());
        (*sliced)[0] = std::make_pair(true, send);
      };
  w.set_slicer(slicer);
  older.set_slicer(slicer);

  KVMeta meta;
  meta.cmd = 0;
  meta.push = true;
  meta.pull = false;
  meta.sender = 9;
  meta.timestamp = 0;
  meta.customer_id = 0;

  KVServer<Val> server(0);
  typename KVServer<Val>::ReqHandle handle =
      [](const KVMeta& req, const KVPairs<Val>& data, KVServer<Val>* s) {
        s->Response(req);
        s->Response(req, data);
      };
  server.set_request_handle(handle);
  KVServerDefaultHandle<Val> default_handle;
  server.set_request_handle(default_handle);
  default_handle(meta, pairs, &server);
  CHECK_EQ(default_handle.store.count(1), 1u);
}

// The names that need a job: compiled and linked, never run here.
void NameNodeCalls();
void NameNodeCalls() {
  // ps/ps.h
  Start(0);
  Start(0, "api_names");
  StartAsync(0);
  StartAsync(0, "api_names");
  Start();  // older ps-lite's Start()/Finalize()
  RegisterExitCallback([] {});
  int n = NumWorkers() + NumServers() + MyRank();
  bool b = IsWorker() || IsServer() || IsScheduler();
  CHECK(n >= 0 || b);

  // ps/simple_app.h
  SimpleApp app(0);  // older ps-lite's SimpleApp(app_id)
  SimpleApp customer_app(0, 1);
  SimpleApp::Handle on_request = [](const SimpleData& req, SimpleApp* a) {
    int from = req.head + req.sender + req.timestamp;
    from += req.customer_id;
    a->Response(req, req.body + std::to_string(from));
    a->Response(req);
  };
  app.set_request_handle(on_request);
  app.set_response_handle([](const SimpleData&, SimpleApp*) {});
  app.Wait(app.Request(1, "body", kServerGroup + kWorkerGroup));
  std::unique_ptr<SimpleApp> owned(new SimpleApp(1));

  NameKV<float>();
  NameKV<double>();
  NameKV<int>();
  NameKV<int64_t>();

  // ps/internal/postoffice.h
  Postoffice* po = Postoffice::Get();
  po->Start(0, "api_names", true);
  Postoffice::Callback cb = [] {};
  po->RegisterExitCallback(cb);
  const std::vector<int>& ids = po->GetNodeIDs(kServerGroup);
  const std::vector<Range>& ranges = po->GetServerKeyRanges();
  CHECK_EQ(ids.size(), ranges.size());
  int v = po->num_workers() + po->num_servers() + po->my_rank() +
          po->is_worker() + po->is_server() + po->is_scheduler() +
          po->verbose() + po->is_recovery();
  PS_VLOG(1) << v;
  po->Barrier(0, kWorkerGroup);
  po->Barrier(0, kServerGroup + kScheduler);
  po->Finalize(0);
  po->Finalize(0, false);

  Finalize(0);
  Finalize(0, true);
  Finalize();
}

namespace {

// The names that need no node, checked.
void CheckPlainNames() {
  // ps/base.h
  static_assert(std::is_same<Key, uint64_t>::value, "64-bit keys");
  CHECK_EQ(kMaxKey, std::numeric_limits<uint64_t>::max());
  CHECK_EQ(kScheduler, 1);
  CHECK_EQ(kServerGroup, 2);
  CHECK_EQ(kWorkerGroup, 4);

  // ps/range.h
  Range empty;
  Range r(2, 5);
  CHECK_EQ(empty.size(), 0u);
  CHECK_EQ(r.begin(), 2u);
  CHECK_EQ(r.end(), 5u);
  CHECK_EQ(r.size(), 3u);

  // ps/sarray.h
  SArray<int> a;
  CHECK(a.empty());
  SArray<int> filled(3, 7);
  CHECK_EQ(filled.size(), 3u);
  CHECK_EQ(filled[2], 7);
  SArray<int> copied(std::vector<int>{1, 3, 5, 7, 9});
  auto shared = std::make_shared<std::vector<int>>(4, 2);
  SArray<int> adopted(shared);
  CHECK_EQ(adopted.data(), shared->data());
  int raw[3] = {4, 5, 6};
  SArray<int> borrowed(raw, 3);
  SArray<int> owned(new int[2]{8, 9}, 2, true);
  CHECK_EQ(borrowed.data(), raw);
  SArray<char> bytes(copied);  // zero-copy, as bytes
  CHECK_EQ(bytes.size(), copied.size() * sizeof(int));
  SArray<int> back_again;
  back_again = bytes;
  CHECK_EQ(back_again.data(), copied.data());
  SArray<float> listed = {1, 2, 3};
  listed = {4, 5};
  CHECK_EQ(listed.size(), 2u);
  a.CopyFrom(raw, 3);
  a.CopyFrom(copied);
  a.CopyFrom(copied.begin(), copied.begin() + 2);
  CHECK_EQ(a.size(), 2u);
  a.reset(new int[1]{1}, 1, [](int* p) { delete[] p; });
  a.resize(4);
  a.resize(6, 3);
  CHECK_EQ(a[3], 0);
  CHECK_EQ(a[5], 3);
  a.reserve(100);
  CHECK_GE(a.capacity(), 100u);
  a.push_back(42);
  CHECK_EQ(a.back(), 42);
  a.pop_back();
  a.append(copied);
  CHECK_EQ(a.size(), 11u);
  CHECK_EQ(a.front(), 1);
  CHECK_EQ(a.end() - a.begin(), 11);
  const SArray<int>& ca = a;
  CHECK_EQ(ca.end() - ca.begin(), 11);
  CHECK(ca.ptr() != nullptr);
  CHECK(a.ptr().get() == a.data());
  SArray<int> seg = copied.segment(1, 3);
  CHECK_EQ(seg.size(), 2u);
  CHECK_EQ(seg[0], 3);
  CHECK_EQ(seg.data(), copied.data() + 1);
  a.clear();
  CHECK(a.empty());
  Range found = FindRange(copied, 2, 8);
  CHECK_EQ(found.begin(), 1u);
  CHECK_EQ(found.end(), 4u);
  CHECK_EQ(DebugStr(copied.data(), 5), "[5]: 1 3 5 7 9 ");
  std::ostringstream os;
  os << copied;
  CHECK_EQ(os.str(), "[5]: 1 3 5 7 9 ");

  // ps/internal/env.h and GetEnv (ps/internal/utils.h)
  Environment::Init({{"PS_API_NAMES_SET", "3"}});
  std::shared_ptr<Environment> env = Environment::_GetSharedRef();
  CHECK_EQ(env.get(), Environment::Get());
  CHECK_STREQ(Environment::Get()->find("PS_API_NAMES_SET"), "3");
  CHECK(Environment::Get()->find("PS_API_NAMES_UNSET") == nullptr);
  CHECK_EQ(GetEnv("PS_API_NAMES_SET", 7), 3);
  CHECK_EQ(GetEnv("PS_API_NAMES_UNSET", 7), 7);
  CHECK_EQ(GetEnv<std::string>("PS_API_NAMES_SET", "x"), "3");
  CHECK_EQ(GetEnv<std::string>("PS_API_NAMES_UNSET", "x"), "x");

  // ps/internal/postoffice.h's id helpers
  CHECK_EQ(Postoffice::WorkerRankToID(1), 11);
  CHECK_EQ(Postoffice::ServerRankToID(1), 10);
  CHECK_EQ(Postoffice::IDtoRank(11), 1);
  CHECK_EQ(Postoffice::IDtoRank(kScheduler), 0);

  // ps/kv_app.h's plain structs
  KVPairs<float> pairs;
  CHECK_EQ(pairs.priority, 0);
  KVMeta meta;
  CHECK(!meta.push && !meta.pull);

  // ps/internal/utils.h: dmlc/logging.h's macros (glog's here), LL, LG
  NoCopy no_copy;
  CHECK_NOTNULL(&no_copy);
  CHECK_NE(1, 2);
  CHECK_LT(1, 2);
  CHECK_LE(1, 2);
  CHECK_GT(2, 1);
  CHECK_GE(2, 1);
  DCHECK(true);
  DCHECK_EQ(1, 1);
  DCHECK_NE(1, 2);
  DCHECK_LT(1, 2);
  DCHECK_LE(1, 2);
  DCHECK_GT(2, 1);
  DCHECK_GE(2, 1);
  LOG_IF(INFO, false) << "never";
  DLOG(INFO) << "debug";
  DLOG_IF(INFO, false) << "never";
  LOG_EVERY_N(INFO, 100) << "once";
  VLOG(1) << "verbose";
  LOG(WARNING) << "checked the plain names";
  LG << "info";
  if (false) LL << "never";
}

}  // namespace

int main(int argc, char** /*argv*/) {
  CheckPlainNames();
  if (argc < 0) NameNodeCalls();  // never: compiled and linked only
  std::cout << "api names ok" << std::endl;
  return 0;
}
