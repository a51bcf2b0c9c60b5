// Compression (ps/compress.h): each codec's round trip, exact where it
// should be (every finite half through fp16, bf16's upper halves), the
// error-feedback invariant (what was sent plus what is kept equals what was
// given), malformed messages refused without harm, the state through a
// checkpoint; and between nodes over sockets, with a fifth of the messages
// lost and resent, the servers' sums equal exactly what the workers' error
// feedback says was sent.
#include "ps/compress.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cluster.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

KVFrames Frames(const std::vector<uint64_t>& keys,
                const std::vector<float>& vals, const std::vector<int>& lens) {
  KVFrames f;
  f.keys = SArray<char>(SArray<uint64_t>(keys));
  f.vals = SArray<char>(SArray<float>(vals));
  f.has_vals = true;
  f.val_type = 9;  // float
  if (!lens.empty()) {
    f.lens = SArray<char>(SArray<int>(lens));
    f.has_lens = true;
  }
  return f;
}

std::vector<float> Floats(const SArray<char>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::shared_ptr<Compressor> Make(const std::string& text) {
  StatusOr<CompressOptions> o = CompressOptions::Parse(text);
  EXPECT_TRUE(o.ok()) << o.status();
  StatusOr<std::shared_ptr<Compressor>> c = Compressor::Make(*o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

FilterContext Push() {
  FilterContext ctx;
  ctx.push = true;
  return ctx;
}

// Encodes f as a push, decodes the result with `decoder`, returns the
// decoded values and the wire's bytes of values.
std::vector<float> RoundTrip(Compressor* encoder, Compressor* decoder,
                             KVFrames f, size_t* wire_bytes = nullptr) {
  std::string note;
  StatusOr<bool> applied = encoder->Encode(Push(), &f, &note);
  EXPECT_TRUE(applied.ok()) << applied.status();
  EXPECT_TRUE(*applied);
  if (wire_bytes != nullptr) *wire_bytes = f.vals.size();
  Status st = decoder->Decode(Push(), note, &f);
  EXPECT_TRUE(st.ok()) << st;
  return Floats(f.vals);
}

float FromBits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

// The value of IEEE half h, computed independently of the codec.
float HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float mag =
      e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), e - 25);
  return h & 0x8000 ? -mag : mag;
}

TEST(Compress, ParsesCodecsAndNamesWhatIsWrong) {
  for (const char* ok : {"none", "fp16", "bf16", "onebit", "topk:0.01",
                         "randomk:0.5", "topk:1"}) {
    StatusOr<Codec> c = Codec::Parse(ok);
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status();
    EXPECT_EQ(c->ToString(), ok);
  }
  for (const char* bad : {"top", "topk", "topk:0", "topk:1.5", "topk:x",
                          "randomk:-1", "fp32", "topk:0.1x"}) {
    StatusOr<Codec> c = Codec::Parse(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find(bad), std::string::npos) << c.status();
  }
  StatusOr<CompressOptions> o = CompressOptions::Parse("topk:0.01,pull=bf16");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->push.kind, Codec::kTopK);
  EXPECT_EQ(o->pull.kind, Codec::kBf16);
  EXPECT_EQ(o->ToString(), "topk:0.01,pull=bf16");
  StatusOr<CompressOptions> delta = CompressOptions::Parse("none,pull=onebit");
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_TRUE(delta->pull.feedback());
  EXPECT_FALSE(CompressOptions::Parse("bf16,fast").ok());
  setenv("PS_COMPRESS", "bogus", 1);
  StatusOr<CompressOptions> env = CompressOptions::FromEnv();
  unsetenv("PS_COMPRESS");
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("PS_COMPRESS='bogus'"),
            std::string::npos);
}

// Every finite half comes back bit for bit; rounding is to nearest-even,
// beyond the largest half to infinity.
TEST(Compress, Fp16IsExactForHalvesAndRoundsToNearestEven) {
  std::vector<float> vals;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1F) != 0x1F) vals.push_back(HalfValue(h));
  }
  auto c = Make("fp16");
  size_t wire = 0;
  std::vector<float> out =
      RoundTrip(c.get(), c.get(), Frames({7}, vals, {}), &wire);
  EXPECT_EQ(wire, 2 * vals.size());
  ASSERT_EQ(out.size(), vals.size());
  for (size_t i = 0; i < vals.size(); ++i) {
    ASSERT_EQ(Bits(out[i]), Bits(vals[i])) << "value " << vals[i];
  }
  const std::vector<float> in = {1.0f / 3,
                                 65504.0f,
                                 65519.0f,
                                 65520.0f,
                                 std::ldexp(1.0f, -25),         // tie: to 0
                                 std::ldexp(3.0f, -25),         // tie: to 2^-23
                                 1.0f + std::ldexp(1.0f, -11),  // tie: to 1
                                 -std::numeric_limits<float>::infinity()};
  const std::vector<float> want = {0.333251953125f,
                                   65504.0f,
                                   65504.0f,
                                   std::numeric_limits<float>::infinity(),
                                   0.0f,
                                   std::ldexp(1.0f, -23),
                                   1.0f,
                                   -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(RoundTrip(c.get(), c.get(), Frames({1}, in, {})), want);
  std::vector<float> nan =
      RoundTrip(c.get(), c.get(), Frames({1}, {std::nanf("")}, {}));
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(Compress, Bf16KeepsTheUpperHalfRoundedToNearestEven) {
  auto c = Make("bf16");
  std::mt19937 rng(5);
  std::vector<float> exact, in, want;
  for (int i = 0; i < 1000; ++i) {
    exact.push_back(FromBits(rng() & 0xFFFF0000u & ~0x7F800000u));
  }
  EXPECT_EQ(RoundTrip(c.get(), c.get(), Frames({1}, exact, {})), exact);
  // Halfway between 1 and the next bf16 (1 + 2^-7): to even, 1; above it up.
  in = {FromBits(0x3F808000u), FromBits(0x3F808001u), FromBits(0x3F818000u)};
  want = {1.0f, FromBits(0x3F810000u), FromBits(0x3F820000u)};
  EXPECT_EQ(RoundTrip(c.get(), c.get(), Frames({1}, in, {})), want);
  EXPECT_TRUE(std::isnan(
      RoundTrip(c.get(), c.get(), Frames({1}, {std::nanf("")}, {}))[0]));
}

// topk sends the k largest magnitudes of (gradient + residual) per key and
// keeps the rest: sent + kept == given, exactly; nothing is lost over many
// pushes, only delayed.
TEST(Compress, TopKSendsTheLargestAndKeepsTheRestExactly) {
  auto worker = Make("topk:0.25");
  auto server = Make("none");  // decodes whatever the note names
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> d(-50, 50);
  const std::vector<uint64_t> keys = {4, 9};
  const std::vector<int> lens = {8, 12};
  std::vector<float> total(20, 0), sent(20, 0);
  for (int step = 0; step < 30; ++step) {
    std::vector<float> g(20);
    for (float& x : g) x = static_cast<float>(d(rng));
    std::vector<float> before = worker->Residual(4);
    std::vector<float> before9 = worker->Residual(9);
    before.resize(8, 0);
    before9.resize(12, 0);
    before.insert(before.end(), before9.begin(), before9.end());
    size_t wire = 0;
    std::vector<float> out =
        RoundTrip(worker.get(), server.get(), Frames(keys, g, lens), &wire);
    EXPECT_EQ(wire, (4 + 8 * 2) + (4 + 8 * 3));  // k = 2 and 3
    std::vector<float> after = worker->Residual(4);
    std::vector<float> after9 = worker->Residual(9);
    after.insert(after.end(), after9.begin(), after9.end());
    ASSERT_EQ(out.size(), 20u);
    int nonzero = 0;
    for (size_t j = 0; j < 20; ++j) {
      EXPECT_EQ(out[j] + after[j], g[j] + before[j]) << "step " << step;
      // A sent value is at least as large as any kept of its key.
      const size_t b = j < 8 ? 0 : 8, e = j < 8 ? 8 : 20;
      if (out[j] != 0) {
        ++nonzero;
        for (size_t i = b; i < e; ++i) {
          EXPECT_GE(std::fabs(out[j]), std::fabs(after[i]));
        }
      }
      total[j] += g[j];
      sent[j] += out[j];
    }
    EXPECT_LE(nonzero, 5);
  }
  std::vector<float> r = worker->Residual(4), r9 = worker->Residual(9);
  r.insert(r.end(), r9.begin(), r9.end());
  for (size_t j = 0; j < 20; ++j) EXPECT_EQ(sent[j] + r[j], total[j]);
}

TEST(Compress, RandomKSendsKValuesAndKeepsTheRestExactly) {
  auto c = Make("randomk:0.1");
  std::vector<float> g(100);
  for (size_t j = 0; j < g.size(); ++j) g[j] = float(j + 1);
  size_t wire = 0;
  std::vector<float> out =
      RoundTrip(c.get(), c.get(), Frames({1}, g, {}), &wire);
  EXPECT_EQ(wire, 4u + 8 * 10);
  std::vector<float> r = c->Residual(1);
  int sent = 0;
  for (size_t j = 0; j < g.size(); ++j) {
    EXPECT_EQ(out[j] + r[j], g[j]);
    EXPECT_TRUE(out[j] == 0 || r[j] == 0);
    sent += out[j] != 0;
  }
  EXPECT_EQ(sent, 10);
}

// onebit: each value becomes +-scale, the scale its chunk's mean magnitude;
// sent + kept equals given to a float's rounding.
TEST(Compress, OneBitSendsSignsAndAScalePerChunk) {
  auto c = Make("onebit");
  const size_t n = 2 * kOneBitChunk + 100;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> g(n);
  for (float& x : g) x = d(rng);
  size_t wire = 0;
  std::vector<float> out =
      RoundTrip(c.get(), c.get(), Frames({2}, g, {}), &wire);
  EXPECT_EQ(wire, 4 * 3 + (n + 7) / 8);
  std::vector<float> r = c->Residual(2);
  for (size_t c0 = 0; c0 < n; c0 += kOneBitChunk) {
    const size_t c1 = std::min(n, c0 + kOneBitChunk);
    double mean = 0;
    for (size_t j = c0; j < c1; ++j) mean += std::fabs(g[j]);
    mean /= double(c1 - c0);
    for (size_t j = c0; j < c1; ++j) {
      EXPECT_FLOAT_EQ(std::fabs(out[j]), float(mean));
      EXPECT_EQ(out[j] > 0, g[j] >= 0);
      EXPECT_NEAR(out[j] + r[j], g[j], 1e-6f * (1 + std::fabs(g[j])));
    }
  }
  // The second push carries the residual: the sum of both pushes' values
  // and what is kept is the sum of the gradients.
  std::vector<float> out2 =
      RoundTrip(c.get(), c.get(), Frames({2}, g, {}), &wire);
  std::vector<float> r2 = c->Residual(2);
  for (size_t j = 0; j < n; ++j) {
    EXPECT_NEAR(out[j] + out2[j] + r2[j], 2 * g[j], 1e-5f);
  }
}

// Per key range: keys in the range use its codec, others the default; a
// peer in shared memory gets the values as they are.
TEST(Compress, ChoosesPerKeyRangeAndLeavesSharedPeersAlone) {
  CompressOptions o = *CompressOptions::Parse("bf16");
  o.push_ranges.push_back({Range(100, 200), *Codec::Parse("topk:0.5")});
  auto c = *Compressor::Make(o);
  EXPECT_EQ(c->PushCodecOf(99).kind, Codec::kBf16);
  EXPECT_EQ(c->PushCodecOf(100).kind, Codec::kTopK);
  EXPECT_EQ(c->PushCodecOf(200).kind, Codec::kBf16);
  size_t wire = 0;
  std::vector<float> out =
      RoundTrip(c.get(), c.get(),
                Frames({5, 150}, {1, 2, 3, 4, 5, 6, 7, 8}, {4, 4}), &wire);
  EXPECT_EQ(wire, 2 * 4 + (4 + 8 * 2));
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 0, 0, 7, 8}));

  KVFrames f = Frames({5}, {1, 2}, {});
  FilterContext shared = Push();
  shared.shared = true;
  std::string note;
  EXPECT_FALSE(*c->Encode(shared, &f, &note));
  o.compress_shared = true;
  EXPECT_TRUE(*(*Compressor::Make(o))->Encode(shared, &f, &note));
  // Not floats, or no values: left alone.
  KVFrames ints = Frames({5}, {1, 2}, {});
  ints.val_type = 5;
  EXPECT_FALSE(*c->Encode(Push(), &ints, &note));
  KVFrames keys_only = Frames({5}, {}, {});
  keys_only.has_vals = false;
  EXPECT_FALSE(*c->Encode(Push(), &keys_only, &note));
}

// Pull answers take the pull codec, and no feedback.
TEST(Compress, AnswersUseThePullCodec) {
  auto server = Make("topk:0.01,pull=bf16");
  auto worker = Make("topk:0.01");
  KVFrames f = Frames({3, 4}, {1.5f, -2.25f, 3.0f, 1.0f / 3}, {2, 2});
  FilterContext answer;
  answer.request = false;
  answer.pull = true;
  std::string note;
  ASSERT_TRUE(*server->Encode(answer, &f, &note));
  EXPECT_EQ(f.vals.size(), 8u);
  ASSERT_TRUE(worker->Decode(answer, note, &f).ok());
  EXPECT_EQ(Floats(f.vals),
            (std::vector<float>{1.5f, -2.25f, 3.0f, 0.333984375f}));
  EXPECT_TRUE(server->Residual(3).empty());
}

// One pull's round trip between a worker's and a server's compressor: the
// request (keys and, for delta pulls, the versions the worker holds), the
// server's answer with `weights`, the worker's decode. `deliver` false: the
// answer is lost. Returns what the worker's pull gives.
std::vector<float> Pull(Compressor* worker, Compressor* server,
                        const std::vector<uint64_t>& keys,
                        const std::vector<float>& weights,
                        const std::vector<int>& lens, bool deliver = true,
                        int customer = 0) {
  FilterContext req;
  req.pull = true;
  req.customer_id = customer;
  req.peer = 8;  // the server
  KVFrames ask = Frames(keys, {}, lens);
  ask.has_vals = false;
  std::string note;
  if (*worker->Encode(req, &ask, &note)) {
    req.peer = 9;  // the worker, as the server sees it
    EXPECT_TRUE(server->Decode(req, note, &ask).ok());
  }
  FilterContext answer;
  answer.request = false;
  answer.pull = true;
  answer.customer_id = customer;
  answer.peer = 9;
  KVFrames f = Frames(keys, weights, lens);
  note.clear();
  const bool rewritten = *server->Encode(answer, &f, &note);
  if (!deliver) return {};
  answer.peer = 8;
  if (rewritten) {
    Status st = worker->Decode(answer, note, &f);
    EXPECT_TRUE(st.ok()) << st;
  }
  return Floats(f.vals);
}

// Delta pulls: the first pull is whole; then deltas of what changed, with
// the server's error feedback (topk:0.5 sends half a key at a time, the
// rest the pull after); a lost answer makes the next one whole again.
TEST(Compress, DeltaPullsTrackTheWeightsAndRecoverFromALostAnswer) {
  auto worker = Make("none,pull=topk:0.5");
  auto server = Make("none,pull=topk:0.5");
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<int> lens = {4, 4};
  std::vector<float> w = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(Pull(worker.get(), server.get(), keys, w, lens), w);
  EXPECT_EQ(server->pull_counts().whole_keys, 2u);
  std::vector<float> w2 = {1, 2, 3, 4, 15, 6, 9, 10};
  // Key 1 unchanged; key 2: +10, 0, +2, +2: the two largest go first.
  EXPECT_EQ(Pull(worker.get(), server.get(), keys, w2, lens),
            (std::vector<float>{1, 2, 3, 4, 15, 6, 9, 8}));
  EXPECT_EQ(server->pull_counts().delta_keys, 2u);
  EXPECT_EQ(Pull(worker.get(), server.get(), keys, w2, lens), w2);
  // Lost: the worker still holds the old version; the server's view moved.
  std::vector<float> w3 = {0, 0, 0, 1, 15, 6, 9, 10};
  Pull(worker.get(), server.get(), keys, w3, lens, false);
  std::vector<float> w4 = {0, 0, 0, 2, 15, 6, 9, 10};
  const uint64_t whole = server->pull_counts().whole_keys;
  EXPECT_EQ(Pull(worker.get(), server.get(), keys, w4, lens), w4);
  EXPECT_EQ(server->pull_counts().whole_keys, whole + 2);
  // A worker that forgot (restarted): whole again.
  auto fresh = Make("none,pull=topk:0.5");
  EXPECT_EQ(Pull(fresh.get(), server.get(), keys, w4, lens), w4);
  EXPECT_EQ(server->pull_counts().whole_keys, whole + 4);
}

// Two workers' customers on one node pull the same keys from one server:
// each has views of its own (deltas for both). A worker that does not pull
// deltas gets whole values from a server that sends them. A view that met
// an infinity is never built on.
TEST(Compress, DeltaPullsPerCustomerAndForWorkersWithout) {
  auto server = Make("none,pull=topk:1");
  auto a = Make("none,pull=topk:1"), b = Make("none,pull=topk:1");
  std::vector<float> w = {1, 2, 3, 4};
  for (int round = 0; round < 3; ++round) {
    w[round] += 1;
    EXPECT_EQ(Pull(a.get(), server.get(), {1}, w, {}, true, 0), w);
    EXPECT_EQ(Pull(b.get(), server.get(), {1}, w, {}, true, 1), w);
  }
  EXPECT_EQ(server->pull_counts().whole_keys, 2u);
  EXPECT_EQ(server->pull_counts().delta_keys, 4u);
  auto plain = Make("onebit");
  EXPECT_EQ(Pull(plain.get(), server.get(), {1}, w, {}, true, 2), w);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> bad = {1, inf, 3, 4};
  EXPECT_EQ(Pull(a.get(), server.get(), {1}, bad, {}, true, 0), bad);
  const uint64_t whole = server->pull_counts().whole_keys;
  EXPECT_EQ(Pull(a.get(), server.get(), {1}, w, {}, true, 0), w);
  EXPECT_EQ(server->pull_counts().whole_keys, whole + 1);
}

// A push holding an infinity goes whole and starts its residual afresh.
TEST(Compress, NonFinitePushesGoWhole) {
  auto c = Make("onebit");
  const float inf = std::numeric_limits<float>::infinity();
  RoundTrip(c.get(), c.get(), Frames({1}, {1, -2, 3, 4}, {}));
  EXPECT_FALSE(c->Residual(1).empty());
  // Left as it is (nothing else to compress in it).
  KVFrames f = Frames({1}, {1, inf, 3, 4}, {});
  std::string note;
  EXPECT_FALSE(*c->Encode(Push(), &f, &note));
  EXPECT_EQ(Floats(f.vals), (std::vector<float>{1, inf, 3, 4}));
  EXPECT_TRUE(c->Residual(1).empty());
  std::vector<float> out =
      RoundTrip(c.get(), c.get(), Frames({1}, {1, -1, 1, -1}, {}));
  EXPECT_EQ(out, (std::vector<float>{1, -1, 1, -1}));
}

// onebit deltas on slowly moving weights: the worker's copy stays within a
// step's change of the server's, and converges on weights that stop.
TEST(Compress, OneBitDeltaPullsFollowTheWeights) {
  auto worker = Make("none,pull=onebit");
  auto server = Make("none,pull=onebit");
  const size_t n = 3000;
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  std::vector<float> got = Pull(worker.get(), server.get(), {5}, w, {});
  EXPECT_EQ(got, w);
  double worst = 0;
  for (int step = 0; step < 50; ++step) {
    for (float& x : w) x += 1e-3f * (d(rng) > 0 ? 1 : -1);  // Adam-like
    got = Pull(worker.get(), server.get(), {5}, w, {});
    if (step >= 10) {
      for (size_t j = 0; j < n; ++j) {
        worst = std::max(worst, double(std::fabs(got[j] - w[j])));
      }
    }
  }
  EXPECT_LT(worst, 0.01);
  EXPECT_EQ(server->pull_counts().delta_keys, 50u);
}

// Any damage to a message is refused with a reason, never read past its
// bytes (ASan runs this), and never decodes to more than max_values.
TEST(Compress, MalformedMessagesAreRefused) {
  auto c = Make("topk:0.5");
  KVFrames good = Frames({1, 2}, {1, -2, 3, -4, 5, -6}, {2, 4});
  std::string note;
  ASSERT_TRUE(*c->Encode(Push(), &good, &note));
  auto refused = [&](KVFrames f, const std::string& n, const char* why) {
    Status st = c->Decode(Push(), n, &f);
    EXPECT_FALSE(st.ok()) << why;
    EXPECT_NE(st.message().find(why), std::string::npos) << st;
  };
  KVFrames cut = good;
  cut.vals = cut.vals.segment(0, cut.vals.size() - 1);
  refused(cut, note, "cut short");
  KVFrames extra = good;
  extra.vals = SArray<char>(good.vals.size() + 4);
  std::memcpy(extra.vals.data(), good.vals.data(), good.vals.size());
  refused(extra, note, "bytes after");
  refused(good, note.substr(0, 4), "note too short");
  // The note: parts (1 byte), values (8), runs (4), then (4 + 1) a run.
  std::string no_runs = note.substr(0, 13);
  std::memset(&no_runs[9], 0, 4);
  refused(good, no_runs, "names codecs of 0 keys of 2");
  refused(good, std::string(1, '\x40') + note.substr(1), "unknown parts");
  refused(good, note + "x", "bytes after the note's parts");
  std::string huge = note;
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(&huge[1], &big, 8);
  refused(good, huge, "at most");
  KVFrames lens = good;
  lens.lens = SArray<char>(SArray<int>(std::vector<int>{2, 5}));
  refused(lens, note, "lens add up to 7");
  // The second index of key 1 (k = 1) is its first: swap key 2's indices.
  KVFrames order = good;
  order.vals = SArray<char>(good.vals.size());
  std::memcpy(order.vals.data(), good.vals.data(), good.vals.size());
  // key 1: u32 k=1, idx, val (12 bytes); key 2: u32 k=2, idx0, idx1, ...
  uint32_t i0, i1;
  std::memcpy(&i0, order.vals.data() + 16, 4);
  std::memcpy(&i1, order.vals.data() + 20, 4);
  std::memcpy(order.vals.data() + 16, &i1, 4);
  std::memcpy(order.vals.data() + 20, &i0, 4);
  refused(order, note, "out of order or range");
  // Random damage: refused or decoded, never more.
  std::mt19937 rng(9);
  for (int i = 0; i < 2000; ++i) {
    KVFrames f = good;
    f.vals = SArray<char>(good.vals.size());
    std::memcpy(f.vals.data(), good.vals.data(), good.vals.size());
    std::string n = note;
    if (rng() % 2) {
      f.vals[rng() % f.vals.size()] = static_cast<char>(rng());
    } else {
      n[rng() % n.size()] = static_cast<char>(rng());
    }
    Status st = c->Decode(Push(), n, &f);
    if (st.ok()) {
      EXPECT_EQ(f.vals.size(), 24u);
    }
  }
}

TEST(Compress, FeedbackStateSurvivesACheckpoint) {
  auto a = Make("topk:0.25");
  std::vector<float> g = {1, -7, 3, 2, 9, -4, 5, 6};
  RoundTrip(a.get(), a.get(), Frames({1, 2}, g, {4, 4}));
  const std::string state = a->SaveState();
  auto b = Make("topk:0.25");
  ASSERT_TRUE(b->RestoreState(state).ok());
  EXPECT_EQ(b->SaveState(), state);
  EXPECT_EQ(b->Residual(2), a->Residual(2));
  // Both send the same next push.
  EXPECT_EQ(RoundTrip(a.get(), a.get(), Frames({1, 2}, g, {4, 4})),
            RoundTrip(b.get(), b.get(), Frames({1, 2}, g, {4, 4})));
  Status bad = b->RestoreState(state.substr(0, state.size() - 2));
  EXPECT_EQ(bad.code(), Status::kCorruption) << bad;
  EXPECT_EQ(b->SaveState(), a->SaveState());  // left as it was
}

// Values through the sockets, a fifth of the messages lost, resent at 20 ms.
void LossySockets(Config* cfg) {
  cfg->drop_percent = 20;
  cfg->resend_timeout_ms = 20;
  cfg->shm = false;
}

// Over sockets, with a fifth of the messages lost and resent: each
// worker's pushes are compressed once (a resend carries the first bytes),
// so the servers' sums are exactly what was given less what the workers
// kept; pulls come back through bf16.
TEST(Compress, ExactSumsThroughSocketsWithLossAndResend) {
  const int kW = 2, kRounds = 15;
  const std::vector<Key> keys = {3, 40000};  // one per server
  const std::vector<int> lens = {8, 8};
  DefaultJob c(2, kW, LossySockets);
  c.before_handle = [](KVServer<float>* s) {
    ASSERT_TRUE(s->AddFilter(Make("none,pull=bf16")).ok());
  };
  ASSERT_TRUE(c.Start());
  std::vector<std::vector<float>> given(kW, std::vector<float>(16, 0));
  std::vector<std::vector<float>> kept(kW);
  std::vector<std::vector<float>> pulled(kW);
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    auto compressor = Make("topk:0.25");
    PS_RETURN_IF_ERROR(kv.AddFilter(compressor));
    std::mt19937 rng(n->rank() + 1);
    for (int i = 0; i < kRounds; ++i) {
      std::vector<float> g(16);
      for (size_t j = 0; j < g.size(); ++j) {
        g[j] = static_cast<float>(static_cast<int>(rng() % 17) - 8);
        given[n->rank()][j] += g[j];
      }
      PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, g, lens)));
    }
    kept[n->rank()] = compressor->Residual(3);
    std::vector<float> r = compressor->Residual(40000);
    kept[n->rank()].insert(kept[n->rank()].end(), r.begin(), r.end());
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &pulled[n->rank()])));
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  std::vector<float> want(16, 0);
  for (int w = 0; w < kW; ++w) {
    ASSERT_EQ(kept[w].size(), 16u);
    for (size_t j = 0; j < 16; ++j) want[j] += given[w][j] - kept[w][j];
  }
  std::vector<float> stored = c.StoreOf(0).at(3);
  const std::vector<float>& s1 = c.StoreOf(1).at(40000);
  stored.insert(stored.end(), s1.begin(), s1.end());
  EXPECT_EQ(stored, want);
  // Small integers are exact in bf16.
  for (int w = 0; w < kW; ++w) EXPECT_EQ(pulled[w], want);
  uint64_t resent = 0;
  for (auto& w : c.workers) resent += w->num_resent_messages();
  EXPECT_GT(resent, 0u);
  EXPECT_TRUE(c.Finalize());
}

// Delta pulls over sockets, a fifth of the messages lost and resent: every
// worker pulls after each push (deltas of what changed, or whole after a
// loss), and its last pulls are the exact sums (topk:1 sends whole deltas).
TEST(Compress, DeltaPullsThroughSocketsWithLossAndResend) {
  const int kW = 2, kRounds = 10;
  const std::vector<Key> keys = {3, 40000};  // one per server
  const std::vector<int> lens = {8, 8};
  DefaultJob c(2, kW, LossySockets);
  std::vector<std::shared_ptr<Compressor>> servers;
  c.before_handle = [&](KVServer<float>* s) {
    servers.push_back(Make("none,pull=topk:1"));
    ASSERT_TRUE(s->AddFilter(servers.back()).ok());
  };
  ASSERT_TRUE(c.Start());
  std::vector<std::vector<float>> last(kW);
  std::vector<Status> st = c.RunAll([&](Node* n) -> Status {
    if (n->role() != Role::kWorker) return n->Barrier(kAllGroups);
    KVWorker<float> kv(n, 0, 0);
    PS_RETURN_IF_ERROR(kv.AddFilter(Make("none,pull=topk:1")));
    std::vector<float> g(16, float(n->rank() + 1)), out;
    for (int i = 0; i < kRounds; ++i) {
      PS_RETURN_IF_ERROR(kv.Wait(kv.Push(keys, g, lens)));
      PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &out)));
    }
    PS_RETURN_IF_ERROR(n->Barrier(kWorkerGroup));
    for (int i = 0; i < 3; ++i) {
      PS_RETURN_IF_ERROR(kv.Wait(kv.Pull(keys, &last[n->rank()])));
    }
    return n->Barrier(kAllGroups);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s;
  const std::vector<float> want(16, float(kRounds * kW * (kW + 1) / 2));
  for (int w = 0; w < kW; ++w) EXPECT_EQ(last[w], want);
  uint64_t delta = 0, whole = 0;
  for (const auto& s : servers) {
    delta += s->pull_counts().delta_keys;
    whole += s->pull_counts().whole_keys;
  }
  EXPECT_GT(delta, 0u);
  EXPECT_GE(whole, uint64_t{2 * kW});  // each worker's first pull per server
  EXPECT_TRUE(c.Finalize());
}

}  // namespace
}  // namespace ps
