// The IDX reader on good, truncated, wrong-magic and gzipped files written by
// the test, and on the real MNIST files.
#include "model/idx_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "model/dataset.h"

namespace ps {
namespace model {
namespace {

std::vector<uint8_t> IdxBytes(uint32_t magic, std::vector<uint32_t> dims,
                              size_t payload) {
  std::vector<uint8_t> b;
  auto put = [&b](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  for (size_t i = 0; i < payload; ++i)
    b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ps_idx_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& p : written_) std::remove(p.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::vector<uint8_t>& b) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()),
               static_cast<std::streamsize>(b.size()));
    written_.push_back(path);
    return path;
  }
  std::string WriteGz(const std::string& name, const std::vector<uint8_t>& b) {
    const std::string path = dir_ + "/" + name;
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())),
              static_cast<int>(b.size()));
    gzclose(f);
    written_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> written_;
};

TEST_F(IdxReaderTest, ReadsGoodRawAndGzipFiles) {
  const auto bytes = IdxBytes(kIdxImagesMagic, {3, 2, 4}, 24);
  for (const std::string& path :
       {Write("img", bytes), WriteGz("img.gz", bytes)}) {
    auto a = ReadIdx(path, kIdxImagesMagic);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dims, (std::vector<uint32_t>{3, 2, 4}));
    ASSERT_EQ(a->data.size(), 24u);
    EXPECT_EQ(a->data[13], 3);
  }
}

TEST_F(IdxReaderTest, TruncatedFileNamesFileAndSizes) {
  const std::string path =
      Write("train-images-idx3-ubyte",
            IdxBytes(kIdxImagesMagic, {60000, 28, 28}, 1000));
  auto a = ReadIdx(path, kIdxImagesMagic);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Status::kCorruption);
  EXPECT_EQ(a.status().message(),
            path +
                ": truncated: header says 60000x28x28 = 47040000 bytes of "
                "pixels, file has 1000");
}

TEST_F(IdxReaderTest, TrailingBytesAreAnError) {
  const std::string path = Write("labels", IdxBytes(kIdxLabelsMagic, {5}, 6));
  auto a = ReadIdx(path, kIdxLabelsMagic);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            path +
                ": trailing bytes: header says 5 = 5 bytes of labels, file "
                "has 6");
}

TEST_F(IdxReaderTest, WrongMagicIsNamed) {
  const std::string path =
      WriteGz("labels.gz", IdxBytes(kIdxLabelsMagic, {5}, 5));
  auto a = ReadIdx(path, kIdxImagesMagic);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            path + ": bad magic 0x00000801, expected 0x00000803");
}

TEST_F(IdxReaderTest, MissingAndTinyFiles) {
  auto missing = ReadIdx(dir_ + "/nope", kIdxLabelsMagic);
  EXPECT_EQ(missing.status().code(), Status::kNotFound);
  EXPECT_NE(missing.status().message().find(dir_ + "/nope: cannot open"),
            std::string::npos);
  const std::string tiny = Write("tiny", {0, 0});
  EXPECT_EQ(ReadIdx(tiny, kIdxLabelsMagic).status().code(),
            Status::kCorruption);
  const std::string short_header = Write("short", {0, 0, 8, 3, 0, 0});
  EXPECT_NE(ReadIdx(short_header, kIdxImagesMagic)
                .status()
                .message()
                .find("header needs 16 bytes, file has 6"),
            std::string::npos);
}

TEST_F(IdxReaderTest, CorruptGzipIsAnError) {
  auto bytes = IdxBytes(kIdxLabelsMagic, {5000}, 5000);
  std::mt19937 rng(1);
  for (size_t i = 8; i < bytes.size(); ++i) bytes[i] = rng() & 0xff;
  const std::string path = WriteGz("bad.gz", bytes);
  // Keep the gzip header and half the stream.
  std::vector<uint8_t> gz(2500);
  std::ifstream(path, std::ios::binary)
      .read(reinterpret_cast<char*>(gz.data()), 2500);
  const std::string cut = Write("cut.gz", gz);
  auto a = ReadIdx(cut, kIdxLabelsMagic);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Status::kIOError);
  EXPECT_EQ(a.status().message().rfind(cut + ": gzip: ", 0), 0u) << a.status();
}

TEST(MnistFilesTest, RealMnistCountsAndFirstLabels) {
  const std::string dir = PS_MNIST_DIR;
  auto train = LoadSplit(dir, true);
  ASSERT_TRUE(train.ok()) << train.status() << "\nrun scripts/fetch_mnist.sh "
                          << dir;
  EXPECT_EQ(train->size, 60000u);
  EXPECT_EQ(train->rows, 28);
  EXPECT_EQ(train->labels[0], 5);
  auto test = LoadSplit(dir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 10000u);
  EXPECT_EQ(test->labels[0], 7);
  // Pixel 0 is background: (0 - mean) / std.
  EXPECT_FLOAT_EQ(test->images[0], -kPixelMean / kPixelStd);
}

TEST(MnistFilesTest, FashionMnistGzipWhenInstalled) {
  const std::string dir = DefaultDataDir(DatasetKind::kFashion);
  auto test = LoadSplit(dir, false, 100);
  if (!test.ok() && test.status().code() == Status::kNotFound) {
    GTEST_SKIP() << "no Fashion-MNIST: " << test.status();
  }
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 100u);
  EXPECT_EQ(test->labels[0], 9);  // ankle boot
}

}  // namespace
}  // namespace model
}  // namespace ps
