// Sealed frames (src/van/seal.h) on their own: the handshake's token and
// keys, and what the opener refuses. Through sockets, hostile_test.cc.
#include "van/seal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace ps {
namespace seal {
namespace {

std::string Secret(char fill) { return std::string(kKeyBytes, fill); }

// A message of frames sealed by `sealer`, as the receiver gets it.
std::vector<std::string> SealMessage(Sealer* sealer,
                                     const std::vector<std::string>& plain) {
  const auto frames = static_cast<uint32_t>(plain.size());
  size_t chunks = 0;
  for (const std::string& p : plain) chunks += Chunks(p.size());
  uint64_t seq = sealer->Begin(chunks);
  std::vector<std::string> sealed;
  for (uint32_t i = 0; i < frames; ++i) {
    std::string out(SealedBytes(plain[i].size()), '\0');
    sealer->Seal(seq, i, frames, plain[i].data(), plain[i].size(), &out[0]);
    seq += Chunks(plain[i].size());
    sealed.push_back(out);
  }
  return sealed;
}

// Opens `sealed` (copied) with `opener`; on success the plaintexts.
Status OpenMessage(Opener* opener, std::vector<std::string> sealed,
                   std::vector<std::string>* plain) {
  std::vector<Opener::Frame> frames;
  for (std::string& s : sealed) frames.push_back({&s[0], s.size()});
  Status st = opener->Open(frames.data(), frames.size());
  if (st.ok()) {
    plain->clear();
    for (const Opener::Frame& f : frames) plain->emplace_back(f.data, f.bytes);
  }
  return st;
}

struct Pair {
  JobKey job{Secret('k')};
  KeyPair receiver = JobKey::NewKeyPair();
  JobKey::Hello hello = job.MakeHello(receiver.pub).value();
  std::string key = job.AcceptHello(receiver, hello.token).value();
};

TEST(Seal, TokenAgreesOneKeyForTheReceiverOnly) {
  Pair p;
  EXPECT_EQ(p.key, p.hello.key);
  EXPECT_EQ(p.key.size(), kKeyBytes);
  // Another connection to the same receiver: another key.
  EXPECT_NE(p.job.MakeHello(p.receiver.pub).value().key, p.key);
  // Another process at the same address (another static key), another job,
  // a token with one byte changed: refused.
  EXPECT_FALSE(p.job.AcceptHello(JobKey::NewKeyPair(), p.hello.token).ok());
  EXPECT_FALSE(JobKey(Secret('x')).AcceptHello(p.receiver, p.hello.token).ok());
  for (size_t i = 0; i < p.hello.token.size(); i += 7) {
    std::string token = p.hello.token;
    token[i] ^= 1;
    EXPECT_FALSE(p.job.AcceptHello(p.receiver, token).ok()) << "byte " << i;
  }
  EXPECT_FALSE(p.job.AcceptHello(p.receiver, p.hello.token.substr(1)).ok());
  // The scheduler's pair is the job's, the same wherever it is derived.
  EXPECT_EQ(p.job.SchedulerKeyPair().pub,
            JobKey(Secret('k')).SchedulerKeyPair().pub);
  EXPECT_NE(p.job.SchedulerKeyPair().pub,
            JobKey(Secret('x')).SchedulerKeyPair().pub);
}

TEST(Seal, FramesOpenToTheirBytesAndHideThem) {
  Pair p;
  Sealer sealer(p.hello.key);
  Opener opener(p.key);
  std::vector<std::string> plain = {"header", std::string(100000, 'v'), ""};
  std::vector<std::string> sealed = SealMessage(&sealer, plain);
  EXPECT_EQ(sealed[1].find(std::string(64, 'v')), std::string::npos);
  std::vector<std::string> opened;
  ASSERT_TRUE(OpenMessage(&opener, sealed, &opened).ok());
  EXPECT_EQ(opened, plain);
  // The next message opens too; the same one again does not.
  std::vector<std::string> next = SealMessage(&sealer, {"second"});
  ASSERT_TRUE(OpenMessage(&opener, next, &opened).ok());
  EXPECT_EQ(opened, std::vector<std::string>{"second"});
  Status replay = OpenMessage(&opener, sealed, &opened);
  EXPECT_FALSE(replay.ok());
  EXPECT_NE(replay.message().find("repeated or out of order"),
            std::string::npos)
      << replay;
}

TEST(Seal, EveryTamperedByteIsRefusedAndLeavesTheOpenerAsItWas) {
  Pair p;
  Sealer sealer(p.hello.key);
  Opener opener(p.key);
  std::vector<std::string> sealed =
      SealMessage(&sealer, {"head", std::string(40, 'x')});
  std::vector<std::string> opened;
  for (size_t f = 0; f < sealed.size(); ++f) {
    for (size_t i = 0; i < sealed[f].size(); ++i) {
      std::vector<std::string> bad = sealed;
      bad[f][i] ^= 0x40;
      EXPECT_FALSE(OpenMessage(&opener, bad, &opened).ok())
          << "frame " << f << " byte " << i;
    }
  }
  EXPECT_EQ(opener.last(), 0u);
  ASSERT_TRUE(OpenMessage(&opener, sealed, &opened).ok());
  EXPECT_EQ(opened[1], std::string(40, 'x'));
}

TEST(Seal, FramesCannotBeDroppedMovedOrSwappedBetweenMessages) {
  Pair p;
  Sealer sealer(p.hello.key);
  Opener opener(p.key);
  std::vector<std::string> a = SealMessage(&sealer, {"a0", "a1", "a2"});
  std::vector<std::string> b = SealMessage(&sealer, {"b0", "b1"});
  std::vector<std::string> opened;
  EXPECT_FALSE(OpenMessage(&opener, {a[0], a[1]}, &opened).ok());  // dropped
  EXPECT_FALSE(OpenMessage(&opener, {a[0], a[2], a[1]}, &opened).ok());
  EXPECT_FALSE(OpenMessage(&opener, {a[1], a[2]}, &opened).ok());
  EXPECT_FALSE(OpenMessage(&opener, {b[0], a[1]}, &opened).ok());
  EXPECT_FALSE(OpenMessage(&opener, {std::string(5, 's')}, &opened).ok());
  // Another connection's key opens nothing of this one.
  Opener other(p.job.MakeHello(p.receiver.pub).value().key);
  EXPECT_FALSE(OpenMessage(&other, a, &opened).ok());
  // Reordered whole messages: the later one first is a gap, refused; the
  // earlier then opens, the later after it, and the earlier again is a
  // repeat. A stream takes exactly the next number.
  Status gap = OpenMessage(&opener, b, &opened);
  EXPECT_NE(gap.message().find("a gap before it"), std::string::npos) << gap;
  ASSERT_TRUE(OpenMessage(&opener, a, &opened).ok());
  ASSERT_TRUE(OpenMessage(&opener, b, &opened).ok());
  EXPECT_FALSE(OpenMessage(&opener, a, &opened).ok());
  // Answers (not contiguous) take any higher number: one may be lost.
  Sealer answers_sealer(p.hello.key);
  Opener answers(p.key, /*contiguous=*/false);
  std::vector<std::string> first = SealMessage(&answers_sealer, {"1"});
  std::vector<std::string> third = SealMessage(&answers_sealer, {"3"});
  (void)first;
  EXPECT_TRUE(OpenMessage(&answers, third, &opened).ok());
}

// The session's handshake: both sides derive the same keys, which differ
// in each direction and in every session, even for one sender's HELLO
// answered twice (a replay gets a fresh receiver key); a HELLO for another
// process, or changed in any byte, is refused.
TEST(Seal, SessionKeysComeFromBothSidesRandomness) {
  Pair p;
  JobKey::Offer offer = p.job.MakeOffer(p.receiver.pub).value();
  ASSERT_EQ(offer.hello.size(), kHelloBytes);
  JobKey::Accepted one = p.job.AcceptOffer(p.receiver, offer.hello).value();
  JobKey::Accepted two = p.job.AcceptOffer(p.receiver, offer.hello).value();
  EXPECT_EQ(one.offered, offer.e.pub);
  JobKey::SessionKeys mine =
      p.job.FinishOffer(offer, p.receiver.pub, one.e_pub).value();
  EXPECT_EQ(mine.forward, one.keys.forward);
  EXPECT_EQ(mine.reverse, one.keys.reverse);
  EXPECT_NE(one.keys.forward, one.keys.reverse);
  EXPECT_NE(one.keys.forward, two.keys.forward);  // the replay's session
  EXPECT_NE(one.e_pub, two.e_pub);
  // Frames of one session open in no other.
  Sealer sealer(one.keys.forward);
  Opener replayed(two.keys.forward);
  std::vector<std::string> opened;
  EXPECT_FALSE(
      OpenMessage(&replayed, SealMessage(&sealer, {"x"}), &opened).ok());
  KeyPair other = JobKey::NewKeyPair();
  EXPECT_FALSE(p.job.AcceptOffer(other, offer.hello).ok());
  for (size_t i = 0; i < offer.hello.size(); ++i) {
    std::string bad = offer.hello;
    bad[i] ^= 1;
    EXPECT_FALSE(p.job.AcceptOffer(p.receiver, bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(p.job.AcceptOffer(p.receiver, offer.hello + "x").ok());
  // Another job's key: refused.
  std::string secret(kKeyBytes, '\x5a');
  EXPECT_FALSE(JobKey(secret).AcceptOffer(p.receiver, offer.hello).ok());
}

TEST(Seal, LargeFramesGoInChunksThatCannotBeChangedOrMoved) {
  Pair p;
  Sealer sealer(p.hello.key);
  Opener opener(p.key);
  // Sizes around a chunk, and one of several chunks.
  std::string big(7 * kChunkBytes + 5, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::vector<std::string> plain = {"h", std::string(kChunkBytes, 'c'),
                                    std::string(kChunkBytes + 1, 'd'), big};
  std::vector<std::string> sealed = SealMessage(&sealer, plain);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(sealed[i].size(), SealedBytes(plain[i].size()));
  }
  EXPECT_EQ(Chunks(big.size()), 8u);
  std::vector<std::string> opened;
  // A byte changed in the last chunk, or in its tag; two chunks of the big
  // frame swapped; the big frame cut short.
  std::vector<std::string> bad = sealed;
  bad[3][kSeqBytes + big.size() - 1] ^= 1;
  EXPECT_FALSE(OpenMessage(&opener, bad, &opened).ok());
  bad = sealed;
  bad[3][bad[3].size() - 1] ^= 1;
  EXPECT_FALSE(OpenMessage(&opener, bad, &opened).ok());
  bad = sealed;
  std::swap_ranges(bad[3].begin() + kSeqBytes,
                   bad[3].begin() + kSeqBytes + kChunkBytes,
                   bad[3].begin() + kSeqBytes + kChunkBytes);
  EXPECT_FALSE(OpenMessage(&opener, bad, &opened).ok());
  bad = sealed;
  bad[3].resize(bad[3].size() - kChunkBytes);
  EXPECT_FALSE(OpenMessage(&opener, bad, &opened).ok());
  EXPECT_EQ(opener.last(), 0u);
  ASSERT_TRUE(OpenMessage(&opener, sealed, &opened).ok());
  EXPECT_EQ(opened, plain);
  // 1 + 1 + 2 + 8 chunks: one sequence number each.
  EXPECT_EQ(opener.last(), 12u);
}

TEST(Seal, HexRoundTripsAndRefusesOtherText) {
  std::string bytes("\x00\xff\x10", 3);
  EXPECT_EQ(ToHex(bytes), "00ff10");
  EXPECT_EQ(FromHex("00ff10").value(), bytes);
  EXPECT_FALSE(FromHex("0g").ok());
  EXPECT_FALSE(FromHex("abc").ok());
}

}  // namespace
}  // namespace seal
}  // namespace ps
