// The pure codecs (src/kv/codecs.h) on their own: the roundings at their
// edges, each segment's size, and bad bytes refused naming what is wrong
// without a read past them. The round-trip properties over arbitrary
// values are fuzz_codecs' (tests/fuzz).
#include "kv/codecs.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

Codec Of(Codec::Kind kind, double ratio = 0) {
  Codec c;
  c.kind = kind;
  c.ratio = ratio;
  return c;
}

TEST(Codecs, HalfAndBf16RoundToNearestEvenAtTheirEdges) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);  // the largest half
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);  // below the midpoint
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // the midpoint: infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // least subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie: even, zero
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie: even, 2
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(0x3555), 0x1.554p-2f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3F80);  // tie: even (down)
  EXPECT_EQ(FloatToBf16(1.0f + 0x3p-8f), 0x3F82);  // tie: even (up)
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

TEST(Codecs, SegmentSizes) {
  EXPECT_EQ(SegmentBytes(Of(Codec::kNone), 1000), 4000u);
  EXPECT_EQ(SegmentBytes(Of(Codec::kBf16), 1000), 2000u);
  EXPECT_EQ(SegmentBytes(Of(Codec::kTopK, 0.01), 1000), 4u + 8 * 10);
  EXPECT_EQ(SegmentBytes(Of(Codec::kRandomK, 0.0001), 1000), 4u + 8);  // >= 1
  EXPECT_EQ(SegmentBytes(Of(Codec::kTopK, 0.5), 0), 4u);
  // 2 scales (1025 values), 129 bytes of signs.
  EXPECT_EQ(SegmentBytes(Of(Codec::kOneBit), kOneBitChunk + 1), 8u + 129);
}

// Every codec's segment of 7 values, cut one byte short, is refused with
// its reason; one unknown kind too.
TEST(Codecs, BadBytesAreRefusedNamingWhatIsWrong) {
  const std::vector<float> v = {1, -2, 3, -4, 5, -6, 7};
  struct Case {
    Codec codec;
    const char* why;
  };
  for (const Case& c : {Case{Of(Codec::kNone), "values cut short"},
                        Case{Of(Codec::kFp16), "values cut short"},
                        Case{Of(Codec::kTopK, 0.5), "sparse values cut short"},
                        Case{Of(Codec::kOneBit), "signs cut short"}}) {
    std::vector<float> r = v;
    std::vector<char> seg(SegmentBytes(c.codec, v.size()));
    char* p = seg.data();
    std::mt19937_64 rng(1);
    SegmentScratch scratch;
    PutSegment(c.codec, v.data(), r.data(), v.size(), &rng, &scratch, &p);
    ASSERT_EQ(p, seg.data() + seg.size());
    std::vector<float> out(v.size());
    Reader cut(seg.data(), seg.size() - 1);
    Status st = GetSegment(c.codec.kind, v.size(), &cut, out.data());
    EXPECT_EQ(st.message(), c.why) << c.codec.ToString();
    Reader whole(seg.data(), seg.size());
    EXPECT_TRUE(GetSegment(c.codec.kind, v.size(), &whole, out.data()).ok());
    EXPECT_EQ(whole.left(), 0u);
  }
  // topk of 7 at 0.5: k = 4, the four largest magnitudes, ascending.
  std::vector<float> r = v, out(v.size());
  std::vector<char> seg(SegmentBytes(Of(Codec::kTopK, 0.5), v.size()));
  char* p = seg.data();
  SegmentScratch scratch;
  PutSegment(Of(Codec::kTopK, 0.5), v.data(), r.data(), v.size(), nullptr,
             &scratch, &p);
  Reader in(seg.data(), seg.size());
  ASSERT_TRUE(GetSegment(Codec::kTopK, v.size(), &in, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, -4, 5, -6, 7}));
  EXPECT_EQ(r, (std::vector<float>{1, -2, 3, 0, 0, 0, 0}));
  std::swap(seg[4], seg[8]);  // indices 3 and 4 now out of order
  Reader swapped(seg.data(), seg.size());
  EXPECT_EQ(GetSegment(Codec::kTopK, v.size(), &swapped, out.data()).message(),
            "sparse index 3 out of order or range");
  Reader none(seg.data(), seg.size());
  EXPECT_EQ(
      GetSegment(static_cast<Codec::Kind>(6), 1, &none, out.data()).message(),
      "unknown codec 6");
}

}  // namespace
}  // namespace ps
