// The filters stage of the data path (ps/filter.h), between nodes over
// sockets: what the chain writes on the wire is undone on the other side,
// in the right order, also for resent requests; a receiver without the
// filter, or a note it cannot read, refuses the message naming the filter;
// a filter that declines costs nothing.
#include "ps/filter.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "cluster.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// XORs the values with a byte named in its note (a new one per message), so
// that the bytes on the wire are not the values; counts its calls.
class XorFilter : public Filter {
 public:
  std::string name() const override { return "xor"; }
  StatusOr<bool> Encode(const FilterContext&, KVFrames* f,
                        std::string* note) override {
    if (!f->has_vals || f->vals.empty()) return false;
    const char mask = static_cast<char>(1 + next_.fetch_add(1) % 250);
    SArray<char> out(f->vals.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = f->vals[i] ^ mask;
    f->vals = out;
    *note = std::string(1, mask);
    encoded.fetch_add(1);
    return true;
  }
  Status Decode(const FilterContext&, const std::string& note,
                KVFrames* f) override {
    if (note.size() != 1) return Status::Corruption("note of " + note);
    SArray<char> out(f->vals.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = f->vals[i] ^ note[0];
    f->vals = out;
    decoded.fetch_add(1);
    return Status::OK();
  }
  std::atomic<int> encoded{0}, decoded{0};

 private:
  std::atomic<int> next_{0};
};

// Puts `prefix` (3 bytes) before the values: their size on the wire is no
// whole number of floats, and a receiver with another prefix refuses it.
class PrefixFilter : public Filter {
 public:
  explicit PrefixFilter(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string name() const override { return "prefix"; }
  StatusOr<bool> Encode(const FilterContext&, KVFrames* f,
                        std::string*) override {
    if (!f->has_vals) return false;
    SArray<char> out(prefix_.size() + f->vals.size());
    std::memcpy(out.data(), prefix_.data(), prefix_.size());
    if (!f->vals.empty()) {
      std::memcpy(out.data() + prefix_.size(), f->vals.data(), f->vals.size());
    }
    f->vals = out;
    return true;
  }
  Status Decode(const FilterContext&, const std::string&,
                KVFrames* f) override {
    if (f->vals.size() < prefix_.size() ||
        std::memcmp(f->vals.data(), prefix_.data(), prefix_.size()) != 0) {
      return Status::Corruption("values do not start with " + prefix_);
    }
    f->vals = f->vals.segment(prefix_.size(), f->vals.size());
    return Status::OK();
  }

 private:
  const std::string prefix_;
};

// Never applies.
class DecliningFilter : public Filter {
 public:
  std::string name() const override { return "declining"; }
  StatusOr<bool> Encode(const FilterContext&, KVFrames*,
                        std::string*) override {
    return false;
  }
  Status Decode(const FilterContext&, const std::string&, KVFrames*) override {
    return Status::Internal("never asked");
  }
};

const std::vector<Key> kKeys = {3, 40000};  // one per server

// Every worker pushes kRounds times and pulls the exact sums back.
Status PushAndPullSums(Node* n, KVWorker<float>* kv, int rounds, int workers) {
  for (int i = 1; i <= rounds; ++i) {
    std::vector<float> vals = {float(i), float(n->rank() + 1)};
    PS_RETURN_IF_ERROR(kv->Wait(kv->Push(kKeys, vals)));
  }
  PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
  std::vector<float> out;
  PS_RETURN_IF_ERROR(kv->Wait(kv->Pull(kKeys, &out)));
  const std::vector<float> want = {float(workers * rounds * (rounds + 1) / 2),
                                   float(rounds * workers * (workers + 1) / 2)};
  if (out != want) {
    return Status::Internal("pulled " + std::to_string(out.size()) +
                            " values, not the sums " + std::to_string(want[0]) +
                            ", " + std::to_string(want[1]));
  }
  return Status::OK();
}

// Two filters on every node, with a fifth of the messages lost (resent):
// the sums are exact, and each side ran both ways.
TEST(Filters, RewriteTheWireAndAreUndoneInOrder) {
  const int kS = 2, kW = 2, kRounds = 20;
  DefaultJob c(kS, kW, [](Config* cfg) {
    cfg->drop_percent = 20;
    cfg->resend_timeout_ms = 20;
  });
  std::vector<std::shared_ptr<XorFilter>> server_xor;
  c.before_handle = [&](KVServer<float>* s) {
    server_xor.push_back(std::make_shared<XorFilter>());
    ASSERT_TRUE(s->AddFilter(server_xor.back()).ok());
    ASSERT_TRUE(s->AddFilter(std::make_shared<PrefixFilter>("abc")).ok());
    Status twice = s->AddFilter(std::make_shared<XorFilter>());
    EXPECT_EQ(twice.code(), Status::kInvalidArgument) << twice;
  };
  ASSERT_TRUE(c.Start());
  std::vector<std::shared_ptr<XorFilter>> worker_xor(kW);
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    auto x = std::make_shared<XorFilter>();
    worker_xor[n->rank()] = x;
    PS_RETURN_IF_ERROR(kv.AddFilter(x));
    PS_RETURN_IF_ERROR(kv.AddFilter(std::make_shared<PrefixFilter>("abc")));
    PS_RETURN_IF_ERROR(PushAndPullSums(n, &kv, kRounds, kW));
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.StoreOf(0).at(3),
            std::vector<float>{float(kW * kRounds * (kRounds + 1) / 2)});
  for (const auto& x : worker_xor) {
    ASSERT_NE(x, nullptr);
    EXPECT_GE(x->encoded.load(), kRounds * kS);  // pushes (and resends)
    EXPECT_GE(x->decoded.load(), kS);            // the pull's answers
  }
  for (const auto& x : server_xor) {
    EXPECT_GE(x->decoded.load(), kRounds * kW);
    EXPECT_GE(x->encoded.load(), kW);
  }
  EXPECT_TRUE(c.Finalize());
}

// A worker's filter that the servers lack: the request is refused, naming
// it, and the server goes on serving.
TEST(Filters, AServerWithoutTheFilterRefusesNamingIt) {
  DefaultJob c(2, 1);
  ASSERT_TRUE(c.Start());
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    {
      KVWorker<float> kv(n, 0, 0);
      PS_RETURN_IF_ERROR(kv.AddFilter(std::make_shared<XorFilter>()));
      Status refused = kv.Wait(kv.Push(kKeys, std::vector<float>{1, 2}));
      if (refused.ok() ||
          refused.message().find("filter 'xor'") == std::string::npos ||
          refused.message().find("KVServer") == std::string::npos) {
        return Status::Internal("want a refusal naming filter 'xor', got " +
                                refused.ToString());
      }
    }
    KVWorker<float> plain(n, 0, 1);
    PS_RETURN_IF_ERROR(plain.Wait(plain.Push(kKeys, std::vector<float>{1, 2})));
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.StoreOf(0).at(3), std::vector<float>{1});
  EXPECT_TRUE(c.Finalize());
}

// A note the receiver cannot read (another prefix): refused with the
// filter's error; a declining filter needs no peer that has it.
TEST(Filters, AnUnreadableNoteIsRefusedAndADecliningFilterCostsNothing) {
  DefaultJob c(2, 1);
  c.before_handle = [](KVServer<float>* s) {
    ASSERT_TRUE(s->AddFilter(std::make_shared<PrefixFilter>("xyz")).ok());
  };
  ASSERT_TRUE(c.Start());
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    {
      KVWorker<float> kv(n, 0, 0);
      PS_RETURN_IF_ERROR(kv.AddFilter(std::make_shared<PrefixFilter>("abc")));
      Status refused = kv.Wait(kv.Push(kKeys, std::vector<float>{1, 2}));
      if (refused.ok() || refused.message().find("filter 'prefix': values "
                                                 "do not start with xyz") ==
                              std::string::npos) {
        return Status::Internal("want the prefix filter's error, got " +
                                refused.ToString());
      }
    }
    KVWorker<float> kv(n, 0, 1);
    PS_RETURN_IF_ERROR(kv.AddFilter(std::make_shared<DecliningFilter>()));
    PS_RETURN_IF_ERROR(kv.Wait(kv.Push(kKeys, std::vector<float>{5, 6})));
    // The servers' prefix filter rewrites the answer; this worker lacks it.
    std::vector<float> out;
    Status pulled = kv.Wait(kv.Pull(kKeys, &out));
    if (pulled.ok() ||
        pulled.message().find("filter 'prefix'") == std::string::npos) {
      return Status::Internal(
          "want an answer refused for filter 'prefix', "
          "got " +
          pulled.ToString());
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.StoreOf(0).at(3), std::vector<float>{5});
  EXPECT_GE(c.servers[0]->num_dropped_messages() +
                c.servers[1]->num_dropped_messages(),
            2u);
  EXPECT_TRUE(c.Finalize());
}

}  // namespace
}  // namespace ps
