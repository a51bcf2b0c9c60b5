// In-process multi-node tests: scheduler + servers + workers as threads.
#include <gtest/gtest.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "cluster.h"
#include "log_capture.h"
#include "postoffice/postoffice.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "ps/shared_array.h"

namespace ps {
namespace {

TEST(InProc, RanksIdsAndGroups) {
  Cluster c(2, 3);
  ASSERT_TRUE(c.Start());
  EXPECT_EQ(c.scheduler->id(), kSchedulerId);
  std::set<int> server_ranks, worker_ranks;
  for (auto& s : c.servers) {
    EXPECT_EQ(s->id(), ServerRankToId(s->rank()));
    server_ranks.insert(s->rank());
  }
  for (auto& w : c.workers) {
    EXPECT_EQ(w->id(), WorkerRankToId(w->rank()));
    worker_ranks.insert(w->rank());
  }
  EXPECT_EQ(server_ranks, (std::set<int>{0, 1}));
  EXPECT_EQ(worker_ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(c.workers[0]->GetNodeIds(kServerGroup), (std::vector<int>{8, 10}));
  EXPECT_EQ(c.workers[0]->GetNodeIds(kWorkerGroup | kScheduler),
            (std::vector<int>{1, 9, 11, 13}));
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, HonoursRequestedRanks) {
  Cluster c(2, 2);
  c.servers[0] = std::make_unique<Node>([&] {
    Config cfg = c.servers[0]->config();
    cfg.rank = 1;
    return cfg;
  }());
  ASSERT_TRUE(c.Start());
  EXPECT_EQ(c.servers[0]->rank(), 1);
  EXPECT_EQ(c.servers[1]->rank(), 0);
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, DuplicateRequestedRankIsAnError) {
  Cluster c(2, 1, [](Config* cfg) {
    cfg->rendezvous_timeout_ms = 1500;
    if (cfg->role == Role::kServer) cfg->rank = 0;
  });
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  int rank_errors = 0;
  for (size_t i = 1; i <= 2; ++i) {
    if (st[i].message().find("PS_RANK=0 of server") != std::string::npos &&
        st[i].message().find("already taken") != std::string::npos) {
      ++rank_errors;
    }
  }
  EXPECT_EQ(rank_errors, 1);
  EXPECT_EQ(st[0].code(), Status::kTimeout) << st[0];
  EXPECT_NE(st[0].message().find("1 of 2 servers"), std::string::npos) << st[0];
}

TEST(InProc, BarrierOfEveryGroup) {
  Cluster c(2, 2);
  ASSERT_TRUE(c.Start());
  for (int group : {kWorkerGroup, kServerGroup, kServerGroup | kWorkerGroup,
                    kScheduler | kWorkerGroup, kAllGroups}) {
    std::atomic<int> inside{0};
    std::vector<Status> st = c.RunAll([&](Node* n) {
      if (!(group & (n->role() == Role::kScheduler ? kScheduler
                     : n->role() == Role::kServer  ? kServerGroup
                                                   : kWorkerGroup))) {
        return Status::OK();
      }
      inside++;
      Status s = n->Barrier(group);
      // Nobody leaves before everybody in the group entered.
      if (s.ok() &&
          inside.load() != static_cast<int>(n->GetNodeIds(group).size())) {
        return Status::Internal("left the barrier early");
      }
      return s;
    });
    for (const Status& s : st) EXPECT_TRUE(s.ok()) << GroupName(group) << s;
  }
  EXPECT_TRUE(c.Finalize());
}

// A worker that enters a barrier late (busy, say, evaluating) is named by
// the scheduler at each report interval (4 heartbeat timeouts: 2 s here)
// while the others say they wait for the scheduler's release; then the
// barrier completes as ever.
TEST(InProc, ALateBarrierMemberIsNamedWhileTheOthersWait) {
  LogCapture log;
  Cluster c(1, 2, [](Config* cfg) { cfg->heartbeat_timeout_ms = 500; });
  ASSERT_TRUE(c.Start());
  Node* late = c.workers[1].get();
  const std::string who = "worker " + std::to_string(late->rank());
  std::string named, waiting;
  std::vector<Status> st = c.RunAll([&](Node* n) {
    if (n != late) return n->Barrier(kAllGroups);
    // Enters once the scheduler named it alone, 3 of the 4 in.
    named = log.WaitFor({"barrier of workers+servers+scheduler: waiting",
                         "s for " + who + " (tcp://", ") (3 of 4 arrived"},
                        std::chrono::seconds(20));
    waiting =
        log.WaitFor({"barrier of workers+servers+scheduler: ", " has waited ",
                     "s for the scheduler's release"},
                    std::chrono::seconds(20));
    return n->Barrier(kAllGroups);
  });
  EXPECT_NE(named, "") << "the scheduler never named " << who;
  EXPECT_NE(waiting, "") << "no member said it waits for the scheduler";
  EXPECT_EQ(waiting.find(who), std::string::npos) << waiting;
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(c.Finalize());
}

// Every worker pushes rank-dependent values; each server holds the exact sum
// of its keys, and each worker pulls exactly the total.
TEST(InProc, PushSumsAndPullReturnsThem) {
  const int kS = 3, kW = 4;
  DefaultJob c(kS, kW);
  ASSERT_TRUE(c.Start());
  std::vector<Key> keys = {1, 7, 300, 20000, 40000, 65535, 1000000};
  const int k = 3;
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    std::vector<float> vals(keys.size() * k);
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = (n->rank() + 1) * i;
    PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, vals)));
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    std::vector<float> out;
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out)));
    // sum over ranks r of (r+1) = W(W+1)/2
    for (size_t i = 0; i < vals.size(); ++i) {
      if (out.size() != vals.size() || out[i] != (kW * (kW + 1) / 2) * i) {
        return Status::Internal("pulled value " + std::to_string(i) + " wrong");
      }
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  // Default placement: EvenKeys over [0, max_key) -> per-server key sets.
  Placement p = Placement::EvenKeys(kS, c.servers[0]->config().max_key);
  size_t held = 0;
  for (int s = 0; s < kS; ++s) {
    int rank = c.servers[s]->rank();
    for (auto& [key, v] : c.handles[s].store) {
      EXPECT_EQ(p.ServerOf(key), rank);
      size_t i = std::find(keys.begin(), keys.end(), key) - keys.begin();
      ASSERT_EQ(v.size(), static_cast<size_t>(k));
      for (int j = 0; j < k; ++j) EXPECT_EQ(v[j], 10.0f * (i * k + j));
      ++held;
    }
  }
  EXPECT_EQ(held, keys.size());
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, VariableLengthValuesAndByBytesPlacement) {
  DefaultJob c(2, 2);
  ASSERT_TRUE(c.Start());
  std::vector<Key> keys = {0, 1, 2, 3};
  std::vector<int> lens = {1, 5, 2, 4};
  StatusOr<Placement> p =
      Placement::ByBytes(keys, {1, 5, 2, 4}, c.servers.size());
  ASSERT_TRUE(p.ok());
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    kv.SetPlacement(*p);
    std::vector<float> vals(12);
    std::iota(vals.begin(), vals.end(), 1.0f);
    PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, vals, lens)));
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    std::vector<float> out;
    std::vector<int> out_lens;
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out, &out_lens)));
    if (out_lens != lens) return Status::Internal("lens differ");
    for (size_t i = 0; i < vals.size(); ++i) {
      if (out[i] != 2 * vals[i]) return Status::Internal("value differs");
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, ConcurrentThreadsOfOneWorker) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  const int kThreads = 4, kRounds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread owns its keys: t, t + 40000 (one per server).
      std::vector<Key> keys = {static_cast<Key>(t),
                               40000 + static_cast<Key>(t)};
      for (int r = 0; r < kRounds; ++r) {
        if (!kv.Wait(kv.Push(keys, {1.0f, 2.0f})).ok()) errors++;
        std::vector<float> out;
        if (!kv.Wait(kv.Pull(keys, &out)).ok()) errors++;
        if (out != std::vector<float>{r + 1.0f, 2.0f * (r + 1)}) errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, ZeroCopyPullIntoPreallocatedArray) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  SArray<Key> keys(std::vector<Key>{5, 50000});
  SArray<float> vals(std::vector<float>{1, 2, 3, 4});
  ASSERT_TRUE(kv.Wait(kv.ZPush(keys, vals)).ok());
  SArray<float> out(4, -1.0f);
  float* before = out.data();
  ASSERT_TRUE(kv.Wait(kv.ZPull(keys, &out)).ok());
  EXPECT_EQ(out.data(), before);
  EXPECT_EQ(std::vector<float>(out.begin(), out.end()),
            (std::vector<float>{1, 2, 3, 4}));
  // A pull touching only server 0 sends nothing to server 1.
  SArray<Key> low(std::vector<Key>{5});
  SArray<float> one;
  ASSERT_TRUE(kv.Wait(kv.ZPull(low, &one)).ok());
  EXPECT_EQ(std::vector<float>(one.begin(), one.end()),
            (std::vector<float>{1, 2}));
  EXPECT_TRUE(c.Finalize());
}

// Values pushed from a ps::SharedArray and pulled into one travel as
// shared-memory references (same process here: the same domain), and the
// servers' answers are written straight into the worker's array: sums
// exact, the destination not moved, and the counters show the path taken.
// With PS_SHM off on either side the same job goes through the socket.
void SharedArrayRoundTrip(bool server_shm, bool worker_shm) {
  SCOPED_TRACE("servers PS_SHM=" + std::to_string(server_shm) +
               ", workers PS_SHM=" + std::to_string(worker_shm));
  const bool shm = server_shm && worker_shm;
  DefaultJob c(2, 2, [=](Config* cfg) {
    if (cfg->role == Role::kServer) cfg->shm = server_shm;
    if (cfg->role == Role::kWorker) cfg->shm = worker_shm;
  });
  ASSERT_TRUE(c.Start());
  const size_t kPerKey = 1000;  // 4000-byte values: beyond inline frames
  SArray<Key> keys(std::vector<Key>{3, 9, 40000, 65000});
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    SArray<float> vals = SharedArray<float>(keys.size() * kPerKey);
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = (n->rank() + 1) * i;
    PS_RETURN_IF_ERROR(kv.Wait(kv.ZPush(keys, vals)));
    // The push is answered: the worker may overwrite its values.
    std::fill(vals.begin(), vals.end(), -7.0f);
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    SArray<float> out = SharedArray<float>(keys.size() * kPerKey);
    float* before = out.data();
    PS_RETURN_IF_ERROR(kv.Wait(kv.ZPull(keys, &out)));
    if (out.data() != before) return Status::Internal("pull moved the array");
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != 3.0f * i) {  // ranks 0 and 1: (1 + 2) * i
        return Status::Internal("pulled value " + std::to_string(i) + " is " +
                                std::to_string(out[i]));
      }
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  // Two pushes' values and two pulls' answers (one per server each), and
  // again each one its sender resent (the resend timer follows the round
  // trip, which a slow, sanitized run may exceed); all arrived.
  uint64_t sent[2] = {0, 0}, received[2] = {0, 0};  // by workers, servers
  for (int side = 0; side < 2; ++side) {
    for (auto& node : side == 0 ? c.workers : c.servers) {
      uint64_t out = node->num_shared_frames_sent();
      EXPECT_GE(out, shm ? 2u : 0u);
      EXPECT_LE(out, shm ? 2u + node->num_resent_messages() : 0u);
      sent[side] += out;
      received[side] += node->num_shared_frames_received();
    }
  }
  EXPECT_EQ(received[1], sent[0]);
  EXPECT_EQ(received[0], sent[1]);
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, SharedArraysTravelByReference) {
  SharedArrayRoundTrip(true, true);
}
TEST(InProc, SharedArraysGoThroughTheSocketWithShmOff) {
  SharedArrayRoundTrip(false, false);
  SharedArrayRoundTrip(true, false);
  SharedArrayRoundTrip(false, true);
}

// True when `a` owns a buffer SArray allocated itself (resize), false when
// it adopted a received frame (whose deleter releases the ZeroMQ message).
bool OwnsAllocatedBuffer(const SArray<float>& a) {
  return std::get_deleter<detail::BufferDeleter>(a.ptr()) != nullptr;
}

// ZPull into an empty SArray: one server's answer is adopted as received
// (no copy); several servers' answers are assembled; a presized SArray is
// filled in place. Answers of 16 KiB or more arrive in frames of their own.
TEST(InProc, ZeroCopyPullAdoptsALoneServersAnswer) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  const size_t k = 4096;                            // floats per key
  SArray<Key> keys(std::vector<Key>{5, 6, 50000});  // servers 0, 0, 1
  SArray<float> vals(keys.size() * k);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.5f * i;
  ASSERT_TRUE(kv.Wait(kv.ZPush(keys, vals)).ok());

  SArray<Key> low = keys.segment(0, 2);  // server 0 only
  SArray<float> adopted;
  SArray<int> adopted_lens;
  ASSERT_TRUE(kv.Wait(kv.ZPull(low, &adopted, &adopted_lens)).ok());
  EXPECT_FALSE(OwnsAllocatedBuffer(adopted));
  ASSERT_EQ(adopted.size(), 2 * k);
  for (size_t i = 0; i < adopted.size(); ++i) ASSERT_EQ(adopted[i], 0.5f * i);
  EXPECT_EQ(std::vector<int>(adopted_lens.begin(), adopted_lens.end()),
            std::vector<int>(2, static_cast<int>(k)));
  // A second pull adopts a buffer of its own; the first stays intact.
  SArray<float> again;
  ASSERT_TRUE(kv.Wait(kv.ZPull(low, &again)).ok());
  EXPECT_NE(again.data(), adopted.data());
  again[0] = -1.0f;
  EXPECT_EQ(adopted[0], 0.0f);

  SArray<float> assembled;
  SArray<int> assembled_lens;
  ASSERT_TRUE(kv.Wait(kv.ZPull(keys, &assembled, &assembled_lens)).ok());
  EXPECT_TRUE(OwnsAllocatedBuffer(assembled));
  ASSERT_EQ(assembled.size(), vals.size());
  for (size_t i = 0; i < vals.size(); ++i) ASSERT_EQ(assembled[i], vals[i]);
  EXPECT_EQ(std::vector<int>(assembled_lens.begin(), assembled_lens.end()),
            std::vector<int>(3, static_cast<int>(k)));

  SArray<float> presized(2 * k, -1.0f);
  float* before = presized.data();
  ASSERT_TRUE(kv.Wait(kv.ZPull(low, &presized)).ok());
  EXPECT_EQ(presized.data(), before);
  for (size_t i = 0; i < presized.size(); ++i) ASSERT_EQ(presized[i], 0.5f * i);
  EXPECT_TRUE(c.Finalize());
}

// A presized destination whose size divides evenly by the key count,
// while the values per key are not uniform: assembled, not misplaced.
TEST(InProc, PresizedPullWithUnevenLens) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  std::vector<Key> keys = {0, 1, 40000, 40001};  // servers 0, 0, 1, 1
  std::vector<float> vals = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(kv.Wait(kv.Push(keys, vals, {1, 1, 1, 5})).ok());
  std::vector<float> out(8, -1.0f);  // 2 floats a key, if it were uniform
  ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
  EXPECT_EQ(out, vals);
  EXPECT_TRUE(c.Finalize());
}

// The same into shared memory, with values large enough to go by reference:
// server 1's answer (200 floats) fits the place guessed from the sizes (200
// a key) and is written there in place, though it belongs after server 0's
// 300; the worker must move it out of the way before assembling.
TEST(InProc, PresizedSharedPullWithUnevenLens) {
  DefaultJob c(3, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  SArray<Key> keys(std::vector<Key>{0, 30000, 60000});  // servers 0, 1, 2
  SArray<int> lens(std::vector<int>{300, 200, 100});
  SArray<float> vals = SharedArray<float>(600);
  std::iota(vals.begin(), vals.end(), 1.0f);
  ASSERT_TRUE(kv.Wait(kv.ZPush(keys, vals, lens)).ok());
  SArray<float> out = SharedArray<float>(600);
  ASSERT_TRUE(kv.Wait(kv.ZPull(keys, &out)).ok());
  EXPECT_EQ(std::vector<float>(out.begin(), out.end()),
            std::vector<float>(vals.begin(), vals.end()));
  EXPECT_EQ(c.workers[0]->num_shared_frames_received(), 1u)
      << "server 1 wrote its answer in place";
  EXPECT_TRUE(c.Finalize());
}

// A push's values sent by reference stay alive until the servers answered,
// though the caller kept no copy of the array.
TEST(InProc, SharedPushOfATemporaryArray) {
  DefaultJob c(1, 1, [](Config* cfg) { cfg->request_timeout_ms = 10000; });
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  SArray<Key> keys(std::vector<Key>{7});
  int ts = kv.ZPush(keys, SharedArray<float>(1000));
  ASSERT_TRUE(kv.Wait(ts).ok());
  EXPECT_EQ(c.workers[0]->num_shared_frames_sent(), 1u);
  ASSERT_EQ(c.handles[0].store[7].size(), 1000u);
  EXPECT_EQ(c.handles[0].store[7][999], 0.0f);
  EXPECT_TRUE(c.Finalize());
}

// Push and Pull on std::vectors of 1 MiB and up: their copies go in shared
// memory of their own (and the answer too), which the server may write
// into without the worker seeing it; the values are as through the socket.
TEST(InProc, LargeVectorPushAndPull) {
  for (int mode = 0; mode < 3; ++mode) {
    // Shared memory with resends, without them (then through the socket:
    // nothing keeps a one-message region until it is mapped), no shm.
    const bool shm = mode < 2, resend = mode != 1;
    DefaultJob c(1, 1, [=](Config* cfg) {
      cfg->shm = shm;
      if (!resend) cfg->resend_timeout_ms = 0;
    });
    ASSERT_TRUE(c.Start());
    KVWorker<float> kv(c.workers[0].get(), 0, 0);
    const size_t n = 300000;  // 2.4 MB of keys, 1.2 MB of values
    std::vector<Key> keys(n);
    std::vector<float> vals(n);
    for (size_t i = 0; i < n; ++i) {
      keys[i] = 3 * i;
      vals[i] = 0.25f * i;
    }
    ASSERT_TRUE(kv.Wait(kv.Push(keys, vals)).ok());
    std::vector<float> out;
    ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
    EXPECT_EQ(out, vals);
    std::vector<float> twice;
    ASSERT_TRUE(kv.Wait(kv.PushPull(keys, vals, &twice)).ok());
    for (float& v : vals) v *= 2;
    EXPECT_EQ(twice, vals);
    EXPECT_EQ(c.workers[0]->num_shared_frames_sent() > 0, shm && resend)
        << mode;
    EXPECT_TRUE(c.Finalize());
  }
}

// A large key list asked again is the kept copy (KVWorkerCore::CopyKeys),
// and only while it is equal: a list changed anywhere, in its last key or
// its length, is copied afresh, and the servers see the keys as they are.
TEST(InProc, KeptKeysOnlyWhileUnchanged) {
  DefaultJob c(1, 1);
  ASSERT_TRUE(c.Start());
  const size_t n = detail::KVWorkerCore::kKeptKeysBytes / sizeof(Key) + 5;
  std::vector<Key> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = 2 * i;
  {
    detail::KVWorkerCore core(c.workers[0].get(), 1, 0,
                              detail::DataTypeOf<float>(), sizeof(float));
    SArray<Key> first = core.CopyKeys(keys.data(), n);
    SArray<Key> again = core.CopyKeys(keys.data(), n);
    EXPECT_EQ(again.data(), first.data());
    keys.back() += 1;
    SArray<Key> changed = core.CopyKeys(keys.data(), n);
    EXPECT_NE(changed.data(), first.data());
    EXPECT_EQ(changed.back(), keys.back());
    EXPECT_EQ(first.back(), keys.back() - 1);  // the first copy is untouched
    SArray<Key> shorter = core.CopyKeys(keys.data(), n - 1);
    EXPECT_EQ(shorter.size(), n - 1);
    EXPECT_NE(shorter.data(), changed.data());
    // Small lists are not kept.
    SArray<Key> small = core.CopyKeys(keys.data(), 3);
    EXPECT_NE(core.CopyKeys(keys.data(), 3).data(), small.data());
    // Nor any under a user slicer, which may write the keys it is given.
    core.SetSlicer([](const detail::RawKVPairs&, const std::vector<Range>&,
                      detail::RawSliced*) {});
    SArray<Key> sliced = core.CopyKeys(keys.data(), n);
    EXPECT_NE(core.CopyKeys(keys.data(), n).data(), sliced.data());
  }
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  std::vector<float> ones(n, 1.0f);
  ASSERT_TRUE(kv.Wait(kv.Push(keys, ones)).ok());
  const Key old_last = keys.back();
  keys.back() += 1;  // still sorted
  ASSERT_TRUE(kv.Wait(kv.Push(keys, ones)).ok());
  auto& store = c.handles[0].store;
  EXPECT_EQ(store[old_last][0], 1.0f);
  EXPECT_EQ(store[keys.back()][0], 1.0f);
  EXPECT_EQ(store[keys[n / 2]][0], 2.0f);
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull(keys, &out)).ok());
  ASSERT_EQ(out.size(), n);
  EXPECT_EQ(out[n / 2], 2.0f);
  EXPECT_EQ(out.back(), 1.0f);
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, UnsortedKeysAreAnError) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  Status st = kv.Wait(kv.Push({3, 1}, {1.0f, 2.0f}));
  EXPECT_EQ(st.code(), Status::kInvalidArgument);
  EXPECT_NE(st.message().find("sorted"), std::string::npos) << st;
  EXPECT_TRUE(c.Finalize());
}

// Garbage from a raw DEALER is counted and dropped; the server keeps serving.
TEST(InProc, MalformedMessagesAreCountedAndDropped) {
  DefaultJob c(1, 1);
  ASSERT_TRUE(c.Start());
  Node* server = c.servers[0].get();
  void* ctx = zmq_ctx_new();
  void* raw = zmq_socket(ctx, ZMQ_DEALER);
  std::string addr = "tcp://127.0.0.1:" + std::to_string(server->port());
  ASSERT_EQ(zmq_connect(raw, addr.c_str()), 0);
  zmq_send(raw, "not a protobuf \xff\xff\xff", 18, 0);  // bad header
  zmq_send(raw, "", 0, 0);                              // empty header
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  // Wait until both were seen (bounded).
  for (int i = 0; i < 200 && server->num_dropped_messages() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(server->num_dropped_messages(), 1u);
  ASSERT_TRUE(kv.Wait(kv.Push({1}, {4.0f})).ok());
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull({1}, &out)).ok());
  EXPECT_EQ(out, std::vector<float>{4.0f});
  zmq_close(raw);
  zmq_ctx_term(ctx);
  EXPECT_TRUE(c.Finalize());
}

TEST(InProc, BusyPortIsNamed) {
  Config a = TestConfig(Role::kScheduler, 1, 1);
  Node first(a);
  ASSERT_TRUE(first.Bind().ok());
  a.port = first.port();
  Node second(a);
  Status st = second.Bind();
  EXPECT_EQ(st.code(), Status::kUnavailable);
  EXPECT_NE(st.message().find("port " + std::to_string(first.port())),
            std::string::npos)
      << st;
  // With a range, the next free port is taken.
  Config r = TestConfig(Role::kWorker, 1, 1);
  r.port_range_lo = first.port();
  r.port_range_hi = first.port() + 20;
  Node third(r);
  ASSERT_TRUE(third.Bind().ok());
  EXPECT_GT(third.port(), first.port());
}

TEST(InProc, UnreachableSchedulerIsNamed) {
  Node probe(TestConfig(Role::kScheduler, 1, 1));
  ASSERT_TRUE(probe.Bind().ok());
  int dead_port = probe.port();
  probe.Stop();  // nothing listens there any more
  Config c = TestConfig(Role::kWorker, 1, 1);
  c.root_port = dead_port;
  c.connect_timeout_ms = 300;
  Node worker(c);
  Status st = worker.Start();
  EXPECT_EQ(st.code(), Status::kUnavailable);
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(dead_port)),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("300 ms"), std::string::npos) << st;
}

TEST(InProc, RendezvousTimeoutNamesWhoIsMissing) {
  Cluster c(2, 1, [](Config* cfg) { cfg->rendezvous_timeout_ms = 800; });
  c.servers.pop_back();  // one server never comes
  std::vector<Status> st = c.RunAll([](Node* n) { return n->Start(); });
  EXPECT_EQ(st[0].code(), Status::kTimeout);
  EXPECT_NE(st[0].message().find("1 of 2 servers and 1 of 1 workers"),
            std::string::npos)
      << st[0];
  for (size_t i = 1; i < st.size(); ++i) {
    EXPECT_EQ(st[i].code(), Status::kTimeout) << st[i];
    EXPECT_NE(st[i].message().find("1 of 2 servers"), std::string::npos)
        << st[i];
  }
}

TEST(InProc, DeadServerFailsWaitAndBarrier) {
  DefaultJob c(2, 1, [](Config* cfg) { cfg->heartbeat_timeout_ms = 600; });
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  ASSERT_TRUE(kv.Wait(kv.Push({1, 50000}, {1.0f, 1.0f})).ok());
  Node* victim = c.servers[1].get();
  int dead_rank = victim->rank();
  c.kv_servers.pop_back();
  victim->postoffice()->Abandon();  // gone without a word, like a crash
  Key key = dead_rank == 0 ? 1 : 50000;
  std::vector<float> out;
  Status st = kv.Wait(kv.Pull({key}, &out));
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_NE(st.message().find("server " + std::to_string(dead_rank)),
            std::string::npos)
      << st;
  EXPECT_EQ(c.workers[0]->peer_failure().code(), Status::kPeerFailed);
  // The survivors' final barrier fails at once, naming the dead server.
  std::vector<Status> fin(3);
  std::thread t0([&] { fin[0] = c.scheduler->Finalize(); });
  std::thread t1([&] { fin[1] = c.servers[0]->Finalize(); });
  fin[2] = c.workers[0]->Finalize();
  t0.join();
  t1.join();
  for (const Status& s : fin) {
    EXPECT_EQ(s.code(), Status::kPeerFailed) << s;
    EXPECT_NE(s.message().find("server " + std::to_string(dead_rank)),
              std::string::npos)
        << s;
  }
}

// A request whose values are of another type than the server's is answered
// with an error naming both (not dropped), and the server keeps serving.
TEST(InProc, WrongValueTypeIsAnErrorNamingBothTypes) {
  DefaultJob c(1, 1, [](Config* cfg) { cfg->request_timeout_ms = 5000; });
  ASSERT_TRUE(c.Start());
  {
    KVWorker<double> wrong(c.workers[0].get(), 0, 0);
    Status st = wrong.Wait(wrong.Push({1, 2}, {1.0, 2.0}));
    EXPECT_EQ(st.code(), Status::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("server 0 (tcp://"), std::string::npos) << st;
    EXPECT_NE(st.message().find("float"), std::string::npos) << st;
    EXPECT_NE(st.message().find("double"), std::string::npos) << st;
  }
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  ASSERT_TRUE(kv.Wait(kv.Push({1, 2}, {1.0f, 2.0f})).ok());
  std::vector<float> out;
  ASSERT_TRUE(kv.Wait(kv.Pull({1, 2}, &out)).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_GE(c.servers[0]->num_dropped_messages(), 1u);
  EXPECT_TRUE(c.Finalize());
}

// A request for an app no KVServer of that server registers is held for a
// while (the server may set its handle late), then refused.
TEST(InProc, UnknownAppIsNotFoundAfterTheConnectTimeout) {
  DefaultJob c(1, 1, [](Config* cfg) {
    cfg->connect_timeout_ms = 300;
    cfg->request_timeout_ms = 15000;
  });
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 7, 0);
  Status st = kv.Wait(kv.Push({1}, {1.0f}));
  EXPECT_EQ(st.code(), Status::kNotFound) << st;
  EXPECT_NE(st.message().find("no KVServer for app 7 on server 0"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("server 0 (tcp://"), std::string::npos) << st;
  // A server that registers late still gets the requests held till then.
  KVWorker<float> late(c.workers[0].get(), 8, 0);
  int ts = late.Push({1}, {2.0f});
  KVServer<float> server(c.servers[0].get(), 8);
  KVServerDefaultHandle<float> handle;
  server.set_request_handle([&](const KVMeta& m, const KVPairs<float>& d,
                                KVServer<float>* s) { handle(m, d, s); });
  EXPECT_TRUE(late.Wait(ts).ok());
  EXPECT_TRUE(c.Finalize());
}

// A server may refuse a request (ResponseError); the worker's Wait returns
// that error prefixed with the server's name.
TEST(InProc, ServerRefusesARequest) {
  Cluster c(2, 1);
  ASSERT_TRUE(c.Start());
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  for (auto& n : c.servers) {
    servers.push_back(std::make_unique<KVServer<float>>(n.get(), 0));
    servers.back()->set_request_handle(
        [](const KVMeta& m, const KVPairs<float>& d, KVServer<float>* s) {
          if (m.cmd == 1 && d.keys[0] < 1000) {
            s->ResponseError(m, Status::Aborted("not today"));
          } else {
            KVPairs<float> res;
            if (m.pull) {
              res.keys = d.keys;
              res.vals = SArray<float>(d.keys.size(), 1.0f);
            }
            s->Response(m, res);
          }
        });
  }
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  std::vector<float> out;
  Status st = kv.Wait(kv.Pull({1, 50000}, &out, nullptr, 1));
  EXPECT_EQ(st.code(), Status::kAborted) << st;
  EXPECT_NE(st.message().find("refused the request: not today"),
            std::string::npos)
      << st;
  EXPECT_TRUE(kv.Wait(kv.Pull({1, 50000}, &out, nullptr, 0)).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 1.0f}));
  EXPECT_TRUE(c.Finalize());
}

// A request timeout names the silent servers by role and rank.
TEST(InProc, RequestTimeoutNamesTheSilentServers) {
  Cluster c(2, 1, [](Config* cfg) { cfg->request_timeout_ms = 300; });
  ASSERT_TRUE(c.Start());
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  for (auto& n : c.servers) {
    servers.push_back(std::make_unique<KVServer<float>>(n.get(), 0));
    servers.back()->set_request_handle(
        [](const KVMeta&, const KVPairs<float>&, KVServer<float>*) {});
  }
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  Status st = kv.Wait(kv.Push({1, 50000}, {1.0f, 1.0f}));
  EXPECT_EQ(st.code(), Status::kTimeout) << st;
  EXPECT_NE(st.message().find("from server 0 (tcp://"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find(", server 1 (tcp://"), std::string::npos) << st;
  EXPECT_TRUE(c.Finalize());
}

// Requests with a callback and no Wait leave nothing behind (neither the
// tracker entry nor the pull state); Wait still works where it is called.
TEST(InProc, CallbackRequestsWithoutWaitLeaveNothingBehind) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  KVWorker<float> kv(c.workers[0].get(), 0, 0);
  const int kRequests = 2000;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  };
  std::vector<std::vector<float>> outs(kRequests / 2);
  for (int i = 0; i < kRequests / 2; ++i) {
    kv.Push({1, 50000}, {1.0f, 1.0f}, {}, 0, count);
    kv.Pull({1, 50000}, &outs[i], nullptr, 0, count);
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                            [&] { return done == kRequests; }));
  }
  EXPECT_EQ(kv.num_pending(), 0u);
  std::vector<float> out;
  int ts = kv.Pull({1, 50000}, &out, nullptr, 0, count);
  EXPECT_TRUE(kv.Wait(ts).ok());
  EXPECT_EQ(out, (std::vector<float>{1000.0f, 1000.0f}));
  EXPECT_EQ(kv.num_pending(), 0u);
  EXPECT_TRUE(c.Finalize());
}

// A worker destroyed while a peer failure is being delivered to the
// workers of its node: its failure callback must not run on it. Worker A's
// request callback (run by A's failure handling) holds the delivery until
// worker B, next in line, is gone (the ASan build shows a use after free).
TEST(InProc, WorkerDestroyedWhileAPeerFailureIsDelivered) {
  Cluster c(2, 1, [](Config* cfg) { cfg->heartbeat_timeout_ms = 600; });
  ASSERT_TRUE(c.Start());
  std::vector<std::unique_ptr<KVServer<float>>> servers;
  for (auto& n : c.servers) {
    servers.push_back(std::make_unique<KVServer<float>>(n.get(), 0));
    servers.back()->set_request_handle(
        [](const KVMeta&, const KVPairs<float>&, KVServer<float>*) {});
  }
  Node* w = c.workers[0].get();
  std::mutex mu;
  std::condition_variable cv;
  bool in_callback = false, b_gone = false;
  KVWorker<float> a(w, 0, 0);
  auto b = std::make_unique<KVWorker<float>>(w, 0, 1);
  const Key dead_key = c.servers[1]->rank() == 0 ? 1 : 60000;
  int ts = a.Push({dead_key}, {1.0f}, {}, 0, [&] {
    std::unique_lock<std::mutex> lock(mu);
    in_callback = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return b_gone; });
  });
  servers.pop_back();
  c.servers[1]->postoffice()->Abandon();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return in_callback; }));
  }
  b.reset();
  {
    std::lock_guard<std::mutex> lock(mu);
    b_gone = true;
  }
  cv.notify_all();
  EXPECT_EQ(a.Wait(ts).code(), Status::kPeerFailed);
}

// Under ps::Node a worker that dies mid-job (BSP) must not hang the others:
// the shard fails the surviving worker's pending pull with PeerFailed naming
// the dead worker, and WaitAllDone gives up.
TEST(InProc, DeadWorkerFailsDenseShardBspStepsInsteadOfHanging) {
  Cluster cluster(1, 2, [](Config* cfg) {
    cfg->heartbeat_interval_ms = 50;
    cfg->heartbeat_timeout_ms = 600;
    cfg->request_timeout_ms = 20000;
  });
  ASSERT_TRUE(cluster.Start());
  KVServer<float> server(cluster.servers[0].get(), 0);
  DenseShard shard(
      &server, DenseLayout{10, 4}, 0, 3, std::vector<float>(10, 0.0f),
      DenseShardOptions{Consistency::kBsp, 0, 2},
      [](float* w, const float* g, size_t, size_t len, int n, int, int) {
        for (size_t i = 0; i < len; ++i) w[i] -= g[i] / n;
      });
  std::unique_ptr<KVWorker<float>> kv[2];
  for (int r = 0; r < 2; ++r) {
    kv[r] = std::make_unique<KVWorker<float>>(cluster.workers[r].get(), 0, 0);
  }
  const std::vector<Key> keys = {0, 1, 2};
  const std::vector<int> lens = {4, 4, 2};
  const int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> w[2];
    int ts[2][2];
    for (int r = 0; r < 2; ++r) {
      ts[r][0] = kv[r]->Push(keys, std::vector<float>(10, 1.0f), lens,
                             EncodeDenseCmd(DenseOp::kStep, step));
      ts[r][1] = kv[r]->Pull(keys, &w[r], nullptr,
                             EncodeDenseCmd(DenseOp::kStep, step + 1));
    }
    for (int r = 0; r < 2; ++r) {
      for (int t : ts[r]) ASSERT_TRUE(kv[r]->Wait(t).ok());
    }
  }
  Node* victim = cluster.workers[1].get();
  const int dead_rank = victim->rank();
  kv[1].reset();
  victim->postoffice()->Abandon();
  std::vector<float> w;
  EXPECT_TRUE(kv[0]
                  ->Wait(kv[0]->Push(keys, std::vector<float>(10, 1.0f), lens,
                                     EncodeDenseCmd(DenseOp::kStep, kSteps)))
                  .ok());
  Status st = kv[0]->Wait(kv[0]->Pull(
      keys, &w, nullptr, EncodeDenseCmd(DenseOp::kStep, kSteps + 1)));
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_NE(st.message().find("worker " + std::to_string(dead_rank)),
            std::string::npos)
      << st;
  // Later steps fail at once.
  st = kv[0]->Wait(kv[0]->Push(keys, std::vector<float>(10, 1.0f), lens,
                               EncodeDenseCmd(DenseOp::kStep, kSteps + 1)));
  EXPECT_EQ(st.code(), Status::kPeerFailed) << st;
  EXPECT_FALSE(shard.WaitAllDone(std::chrono::seconds(20)));
  EXPECT_EQ(shard.failure().code(), Status::kPeerFailed);
  EXPECT_EQ(shard.updates_applied(), kSteps);
}

}  // namespace
}  // namespace ps
