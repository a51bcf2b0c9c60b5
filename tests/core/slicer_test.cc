// KVWorker::set_slicer (ps-lite's user slicer) on an in-process cluster:
// what each server receives, pulls assembled in key order whatever the
// slicing pattern, and slicers that break the rules failing the request.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "cluster.h"
#include "ps/kv_app.h"

namespace ps {
namespace {

// Even keys to server 0, odd keys to server 1 (values per key taken from
// lens, or uniform); each slice keeps the request's key order.
void ParitySlicer(const KVPairs<float>& send, const std::vector<Range>& ranges,
                  KVWorker<float>::SlicedKVs* sliced) {
  sliced->resize(ranges.size());
  size_t n = send.keys.size();
  size_t k = (n == 0 || !send.lens.empty()) ? 0 : send.vals.size() / n;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    auto& part = (*sliced)[send.keys[i] % 2];
    part.first = true;
    part.second.keys.push_back(send.keys[i]);
    size_t len = send.lens.empty() ? k : send.lens[i];
    if (!send.lens.empty()) part.second.lens.push_back(send.lens[i]);
    for (size_t j = 0; j < len && !send.vals.empty(); ++j) {
      part.second.vals.push_back(send.vals[at + j]);
    }
    at += len;
  }
}

TEST(Slicer, ParitySlicingPushesAndPullsInKeyOrder) {
  const int kW = 2;
  DefaultJob c(2, kW);
  ASSERT_TRUE(c.Start());
  std::vector<Key> keys = {1, 2, 3, 10, 11, 40000, 40001};
  std::vector<int> lens = {1, 3, 2, 1, 4, 2, 1};  // 14 values
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    kv.set_slicer(ParitySlicer);
    std::vector<float> vals(14);
    std::iota(vals.begin(), vals.end(), 1.0f);
    PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, vals, lens)));
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    std::vector<float> out;
    std::vector<int> out_lens;
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out, &out_lens)));
    if (out_lens != lens) return Status::Internal("lens differ");
    for (size_t i = 0; i < vals.size(); ++i) {
      if (out[i] != kW * vals[i]) {
        return Status::Internal("value " + std::to_string(i) + " is " +
                                std::to_string(out[i]));
      }
    }
    // Presized, without lens: filled in place, in key order.
    std::vector<float> presized(14, -1.0f);
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &presized)));
    if (presized != out) return Status::Internal("presized pull differs");
    // Zero-copy pull into an empty SArray.
    SArray<float> zout;
    PS_RETURN_IF_ERROR(kv.Wait(kv.ZPull(SArray<Key>(keys), &zout)));
    if (std::vector<float>(zout.begin(), zout.end()) != out) {
      return Status::Internal("zero-copy pull differs");
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& store = c.StoreOf(rank);
    EXPECT_EQ(store.size(), rank == 0 ? 3u : 4u);
    for (const auto& [key, v] : store) EXPECT_EQ(key % 2, Key(rank)) << key;
  }
  EXPECT_TRUE(c.Finalize());
}

TEST(Slicer, EveryKeyToServerZeroWithThePlacementsRanges) {
  DefaultJob c(3, 1);
  ASSERT_TRUE(c.Start());
  std::vector<Key> keys = {5, 30000, 60000};
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  std::vector<Range> seen;
  kv.set_slicer([&seen](const KVPairs<float>& send,
                        const std::vector<Range>& ranges,
                        KVWorker<float>::SlicedKVs* sliced) {
    seen = ranges;
    sliced->resize(ranges.size());
    (*sliced)[0] = {true, send};
  });
  std::vector<float> vals = {1, 2, 3, 4, 5, 6};  // 2 per key
  ASSERT_TRUE(kv.Wait(kv.Push(keys, vals)).ok());
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.PushPull(keys, vals, &out)).ok());
  EXPECT_EQ(out, std::vector<float>({2, 4, 6, 8, 10, 12}));
  ASSERT_EQ(seen.size(), 3u);
  const Placement& p = kv.placement();
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(seen[s].begin(), p.begin(s));
    EXPECT_EQ(seen[s].end(), p.end(s));
  }
  EXPECT_EQ(c.StoreOf(0).size(), 3u);
  EXPECT_TRUE(c.StoreOf(1).empty());
  EXPECT_TRUE(c.StoreOf(2).empty());
  EXPECT_TRUE(c.Finalize());
}

TEST(Slicer, KeySentToSeveralServersIsPulledOnce) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  kv.set_slicer([](const KVPairs<float>& send, const std::vector<Range>& ranges,
                   KVWorker<float>::SlicedKVs* sliced) {
    sliced->assign(ranges.size(), {true, send});  // replicated everywhere
  });
  std::vector<Key> keys = {7, 8};
  ASSERT_TRUE(kv.Wait(kv.Push(keys, {1.5f, 2.5f})).ok());
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
  EXPECT_EQ(out, std::vector<float>({1.5f, 2.5f}));
  EXPECT_EQ(c.StoreOf(0).size(), 2u);
  EXPECT_EQ(c.StoreOf(1).size(), 2u);
  EXPECT_TRUE(c.Finalize());
}

TEST(Slicer, SlicersBreakingTheRulesFailTheRequest) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  std::vector<Key> keys = {1, 2};
  // Too few slices.
  kv.set_slicer([](const KVPairs<float>& send, const std::vector<Range>&,
                   KVWorker<float>::SlicedKVs* sliced) {
    sliced->push_back({true, send});
  });
  Status st = kv.Wait(kv.Push(keys, {1, 2}));
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("1 slices for 2 servers"), std::string::npos)
      << st;
  // A pulled key sent nowhere.
  kv.set_slicer([](const KVPairs<float>& send, const std::vector<Range>& ranges,
                   KVWorker<float>::SlicedKVs* sliced) {
    sliced->resize(ranges.size());
    (*sliced)[1].first = true;
    (*sliced)[1].second.keys = send.keys.segment(0, 1);
  });
  std::vector<float> out;
  st = kv.Wait(kv.Pull(keys, &out));
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("pulled key 2 to no server"), std::string::npos)
      << st;
  // Values that do not match the slice's keys.
  kv.set_slicer([](const KVPairs<float>& send, const std::vector<Range>& ranges,
                   KVWorker<float>::SlicedKVs* sliced) {
    sliced->resize(ranges.size());
    (*sliced)[0] = {true, send};
    (*sliced)[0].second.vals = send.vals.segment(0, 1);
  });
  st = kv.Wait(kv.Push(keys, {1, 2}));
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("slice for server 0"), std::string::npos) << st;
  EXPECT_EQ(kv.num_pending(), 0u);
  EXPECT_TRUE(c.Finalize());
}

}  // namespace
}  // namespace ps
