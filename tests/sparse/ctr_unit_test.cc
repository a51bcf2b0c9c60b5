// sparse_ctr's parts without a job: the generator (a pure function of its
// stream and index, Criteo's shape, the planted click rate), the Criteo
// reader and its errors, the models' gradients against finite differences,
// and AUC with ties.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ctr_data.h"
#include "ctr_model.h"
#include "ps/sparse.h"

namespace ctr {
namespace {

TEST(CtrData, SamplesArePureFunctionsOfStreamAndIndex) {
  GeneratorOptions o;
  Generator a(o), b(o);
  Samples x, y, z;
  for (uint64_t i = 0; i < 100; ++i) {
    a.Draw(1, i, &x);
    b.Draw(1, i, &y);
    b.Draw(2, i, &z);
  }
  EXPECT_EQ(x.ids, y.ids);
  EXPECT_EQ(x.labels, y.labels);
  EXPECT_EQ(x.logit, y.logit);
  ASSERT_EQ(x.ids.size(), 100u * kFields);
  EXPECT_NE(x.ids, z.ids) << "streams 1 and 2 are the same samples";
  o.seed = 2;
  Generator c(o);
  Samples w;
  c.Draw(1, 0, &w);
  EXPECT_NE(std::vector<uint64_t>(x.ids.begin(), x.ids.begin() + kFields),
            w.ids);
}

TEST(CtrData, GeneratedDataHasCriteosShape) {
  Generator g{GeneratorOptions()};
  Samples s;
  constexpr int kSamples = 20000;
  for (uint64_t i = 0; i < kSamples; ++i) g.Draw(0, i, &s);
  double clicks = 0;
  for (float y : s.labels) clicks += y;
  EXPECT_GT(clicks / kSamples, 0.2);
  EXPECT_LT(clicks / kSamples, 0.35);
  // Per field: C9 (3 values) has at most 3 ids and its empty one; C3
  // (10 million, Zipf) has many, its most frequent far above the rest; no
  // id is shared between fields.
  std::vector<std::map<uint64_t, int>> counts(kFields);
  for (size_t i = 0; i < s.size(); ++i) {
    for (int f = 0; f < kFields; ++f) ++counts[f][s.ids[i * kFields + f]];
  }
  EXPECT_LE(counts[kCountFields + 8].size(), 4u);
  const auto& c3 = counts[kCountFields + 2];
  EXPECT_GT(c3.size(), 5000u);
  int top = 0;
  for (const auto& [id, n] : c3) top = std::max(top, n);
  EXPECT_GT(top, kSamples / 20);
  std::set<uint64_t> all;
  size_t total = 0;
  for (const auto& field : counts) {
    total += field.size();
    for (const auto& [id, n] : field) all.insert(id);
  }
  EXPECT_EQ(all.size(), total);
  EXPECT_EQ(g.vocabulary(2), 10131227u);
}

TEST(CtrData, CountsBucketByLog2) {
  EXPECT_EQ(CountBucket(0), 0u);
  EXPECT_EQ(CountBucket(1), 1u);
  EXPECT_EQ(CountBucket(2), 1u);
  EXPECT_EQ(CountBucket(3), 2u);
  EXPECT_EQ(CountBucket(1000), 9u);
  EXPECT_EQ(CountBucket(int64_t{1} << 62), 40u);
  EXPECT_EQ(CountBucket(-2), 41u);
}

class CriteoFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/ctr_unit_" + std::to_string(getpid());
  }
  std::string Write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  // The error of reading `text` whole ("" when none).
  std::string ErrorOf(const std::string& text, Samples* out = nullptr) {
    CriteoReader r;
    Samples local;
    ps::Status st = r.Open(Write(text));
    size_t got = 1;
    while (st.ok() && got > 0) st = r.Read(10, out ? out : &local, &got);
    return st.ok() ? "" : st.message();
  }
  std::string path_;
};

std::string Line(const std::string& label, const std::string& i3,
                 const std::string& c2) {
  std::string s = label + "\t5\t\t" + i3;
  for (int k = 3; k < 13; ++k) s += "\t1";
  s += "\t68fd1e64\t" + c2;
  for (int k = 2; k < 26; ++k) s += "\t";
  return s;
}

TEST_F(CriteoFile, ReadsLinesWithEmptyFields) {
  Samples s;
  ASSERT_EQ(
      ErrorOf(Line("1", "7", "80e26c9b") + "\r\n" + Line("0", "-1", "") + "\n",
              &s),
      "");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s.labels, (std::vector<float>{1, 0}));
  EXPECT_TRUE(s.logit.empty());
  EXPECT_EQ(s.ids[0], FeatureId(0, CountBucket(5)));
  EXPECT_EQ(s.ids[1], FeatureId(1, kMissing));
  EXPECT_EQ(s.ids[2], FeatureId(2, CountBucket(7)));
  EXPECT_EQ(s.ids[kFields + 2], FeatureId(2, CountBucket(-1)));
  EXPECT_EQ(s.ids[kCountFields + 1], FeatureId(kCountFields + 1, 0x80e26c9b));
  EXPECT_EQ(s.ids[kFields + kCountFields + 1],
            FeatureId(kCountFields + 1, kMissing));
  EXPECT_EQ(CountLines(path_).value(), 2u);
}

TEST_F(CriteoFile, ErrorsNameTheFileLineFieldAndValue) {
  const std::string good = Line("1", "7", "ab") + "\n";
  EXPECT_EQ(ErrorOf(good + Line("2", "7", "ab")),
            "'" + path_ + "' line 2: label '2' is not 0 or 1");
  EXPECT_EQ(ErrorOf(good + good + Line("0", "7x", "ab")),
            "'" + path_ + "' line 3: I3 '7x' is not an integer");
  EXPECT_EQ(ErrorOf(Line("0", "7", "zz")),
            "'" + path_ +
                "' line 1: C2 'zz' is not a hex string of at most 16 digits");
  EXPECT_NE(ErrorOf(Line("0", "7", "12345678123456789")).find("C2"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Line("0", " 7", "ab")).find("I3 ' 7'"), std::string::npos);
  EXPECT_EQ(ErrorOf("1\t2\t3\n"),
            "'" + path_ +
                "' line 1: 3 tab-separated fields, expected 40 (label, "
                "I1..I13, C1..C26)");
}

class GradientTest : public ::testing::TestWithParam<int> {};

// Two samples sharing some ids (slots repeat): the summed gradient of each
// unique row against central differences of the summed loss.
TEST_P(GradientTest, MatchesFiniteDifferences) {
  const int dim = GetParam();  // 0: LR
  constexpr size_t kUnique = 50;
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0, 0.3);
  std::vector<double> linear(kUnique), factors(kUnique * dim);
  for (auto& x : linear) x = normal(rng);
  for (auto& x : factors) x = normal(rng);
  std::vector<uint32_t> slot(2 * kIdsPerSample);
  std::uniform_int_distribution<uint32_t> pick(0, kUnique - 1);
  for (auto& s : slot) s = pick(rng);
  const float labels[2] = {1, 0};
  auto rows_of = [&](std::vector<float>* l, std::vector<float>* f) {
    l->assign(linear.begin(), linear.end());
    f->assign(factors.begin(), factors.end());
    return ModelRows{l->data(), dim > 0 ? f->data() : nullptr, dim};
  };
  auto total_loss = [&]() {
    std::vector<float> l, f;
    const ModelRows rows = rows_of(&l, &f);
    float z[2];
    Logits(rows, slot.data(), 2, z);
    return LogLoss(z[0], labels[0]) + LogLoss(z[1], labels[1]);
  };
  std::vector<float> l, f, gl(kUnique), gf(kUnique * dim);
  const ModelRows rows = rows_of(&l, &f);
  const double loss =
      Gradients(rows, slot.data(), 2, labels, gl.data(), gf.data(), kUnique);
  EXPECT_NEAR(loss, total_loss(), 1e-5);
  constexpr double kH = 1e-3;
  for (size_t j = 0; j < kUnique; ++j) {
    linear[j] += kH;
    const double up = total_loss();
    linear[j] -= 2 * kH;
    const double down = total_loss();
    linear[j] += kH;
    EXPECT_NEAR(gl[j], (up - down) / (2 * kH), 2e-3) << "linear row " << j;
  }
  for (size_t i = 0; i < factors.size(); ++i) {
    factors[i] += kH;
    const double up = total_loss();
    factors[i] -= 2 * kH;
    const double down = total_loss();
    factors[i] += kH;
    EXPECT_NEAR(gf[i], (up - down) / (2 * kH), 2e-3) << "factor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(LrAndFm, GradientTest, ::testing::Values(0, 4));

TEST(CtrModel, LogLossIsStable) {
  EXPECT_NEAR(LogLoss(0, 1), std::log(2.0), 1e-7);
  EXPECT_NEAR(LogLoss(100, 0), 100, 1e-5);
  EXPECT_NEAR(LogLoss(-100, 1), 100, 1e-5);
  EXPECT_LT(LogLoss(100, 1), 1e-40);
}

TEST(CtrModel, AucCountsTiesHalf) {
  EXPECT_EQ(Auc({0.1f, 0.2f, 0.3f, 0.4f}, {0, 0, 1, 1}), 1.0);
  EXPECT_EQ(Auc({0.4f, 0.3f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  EXPECT_EQ(Auc({1, 1, 1, 1}, {0, 1, 0, 1}), 0.5);
  // Pairs (pos, neg): (0.5, 0.1) 1, (0.5, 0.5) 0.5, (0.3, 0.1) 1,
  // (0.3, 0.5) 0: 2.5 of 4.
  EXPECT_EQ(Auc({0.1f, 0.5f, 0.5f, 0.3f}, {0, 0, 1, 1}), 2.5 / 4);
  EXPECT_EQ(Auc({0.1f, 0.2f}, {1, 1}), 0.5);
}

}  // namespace
}  // namespace ctr
