// Sealed frames (see seal.h): libsodium for X25519 and BLAKE2b, OpenSSL's
// EVP for AES-256-GCM.
#include "van/seal.h"

#include <glog/logging.h>
#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace ps {
namespace seal {

namespace {

// BLAKE2b-256 keyed with `key` over the concatenation of `parts`.
std::string Mac(const std::string& key,
                std::initializer_list<std::string_view> parts) {
  crypto_generichash_state state;
  crypto_generichash_init(&state,
                          reinterpret_cast<const unsigned char*>(key.data()),
                          key.size(), kKeyBytes);
  for (std::string_view part : parts) {
    crypto_generichash_update(
        &state, reinterpret_cast<const unsigned char*>(part.data()),
        part.size());
  }
  std::string out(kKeyBytes, '\0');
  crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(&out[0]),
                           out.size());
  return out;
}

// X25519(secret, pub); refuses a low-order public key (an all-zero secret).
StatusOr<std::string> SharedSecret(const std::string& secret,
                                   const std::string& pub) {
  if (secret.size() != kKeyBytes || pub.size() != kKeyBytes) {
    return Status::InvalidArgument("an X25519 key of " +
                                   std::to_string(pub.size()) + " bytes");
  }
  std::string shared(kKeyBytes, '\0');
  if (crypto_scalarmult(reinterpret_cast<unsigned char*>(&shared[0]),
                        reinterpret_cast<const unsigned char*>(secret.data()),
                        reinterpret_cast<const unsigned char*>(pub.data())) !=
      0) {
    return Status::InvalidArgument("a low-order X25519 public key");
  }
  return shared;
}

void InitSodium() { CHECK_GE(sodium_init(), 0) << "libsodium cannot start"; }

// Sequence numbers, nonces and associated data are written in the host's
// byte order, which the wire format fixes as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "sealed frames are laid out for little-endian hosts");

void Nonce(uint64_t seq, unsigned char iv[12]) {
  std::memset(iv, 0, 4);
  std::memcpy(iv + 4, &seq, sizeof(seq));  // little-endian hosts only
}

// A chunk's associated data: its frame's place in the message, its own in
// the frame.
void Aad(uint32_t index, uint32_t frames, uint32_t chunk, uint32_t chunks,
         unsigned char aad[16]) {
  const uint32_t words[4] = {index, frames, chunk, chunks};
  std::memcpy(aad, words, sizeof(words));
}

// One AES-256-GCM context with its key set once; each chunk sets its nonce.
EVP_CIPHER_CTX* NewCipher(const std::string& key, bool encrypt) {
  CHECK_EQ(key.size(), kKeyBytes);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  CHECK(ctx != nullptr);
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  CHECK_EQ(EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nullptr,
                             encrypt ? 1 : 0),
           1);
  return ctx;
}

struct CipherDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherPtr = std::unique_ptr<EVP_CIPHER_CTX, CipherDeleter>;

// Seals (encrypt) or opens one chunk of `n` bytes with `ctx`: its nonce is
// `seq`, its associated data `aad`; from `in` into `out` (the same place or
// another), its tag at `tag`. False if it fails authentication.
bool RunChunk(EVP_CIPHER_CTX* ctx, bool encrypt, uint64_t seq,
              const unsigned char aad[16], const unsigned char* in, size_t n,
              unsigned char* out, unsigned char* tag) {
  unsigned char iv[12];
  Nonce(seq, iv);
  const int bytes = static_cast<int>(n);
  int len = 0;
  if (encrypt) {
    CHECK_EQ(EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv), 1);
    CHECK_EQ(EVP_EncryptUpdate(ctx, nullptr, &len, aad, 16), 1);
    if (bytes > 0) CHECK_EQ(EVP_EncryptUpdate(ctx, out, &len, in, bytes), 1);
    CHECK_EQ(EVP_EncryptFinal_ex(ctx, out + bytes, &len), 1);
    CHECK_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag), 1);
    return true;
  }
  const bool ok =
      EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) == 1 &&
      EVP_DecryptUpdate(ctx, nullptr, &len, aad, 16) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
      (bytes == 0 || EVP_DecryptUpdate(ctx, out, &len, in, bytes) == 1) &&
      EVP_DecryptFinal_ex(ctx, out + bytes, &len) == 1;
  // GCM decrypts before the tag is known: what failed leaves no plaintext.
  if (!ok && bytes > 0) sodium_memzero(out, n);
  return ok;
}

// Seals or opens every chunk of a frame laid out as a sealed frame holds
// it: `bytes` bytes of text at `in` (into `out`), then the tags at `tags`;
// its first chunk numbered `seq`.
bool RunFrame(EVP_CIPHER_CTX* ctx, bool encrypt, uint64_t seq, uint32_t index,
              uint32_t frames, const unsigned char* in, unsigned char* out,
              size_t bytes, unsigned char* tags) {
  const auto chunks = static_cast<uint32_t>(Chunks(bytes));
  for (uint32_t c = 0; c < chunks; ++c) {
    unsigned char aad[16];
    Aad(index, frames, c, chunks, aad);
    const size_t at = c * kChunkBytes;
    if (!RunChunk(ctx, encrypt, seq + c, aad, in + at, ChunkBytes(bytes, c),
                  out + at, tags + c * kTagBytes)) {
      return false;
    }
  }
  return true;
}

}  // namespace

JobKey::JobKey(const std::string& secret) {
  InitSodium();
  CHECK_EQ(secret.size(), kKeyBytes);
  auth_ = Mac(secret, {"ps-seal-1 auth"});
}

KeyPair JobKey::NewKeyPair() {
  InitSodium();
  KeyPair pair{std::string(kKeyBytes, '\0'), std::string(kKeyBytes, '\0')};
  randombytes_buf(&pair.secret[0], kKeyBytes);
  crypto_scalarmult_base(reinterpret_cast<unsigned char*>(&pair.pub[0]),
                         reinterpret_cast<unsigned char*>(&pair.secret[0]));
  return pair;
}

KeyPair JobKey::SchedulerKeyPair() const {
  KeyPair pair{std::string(kKeyBytes, '\0'), Mac(auth_, {"scheduler"})};
  crypto_scalarmult_base(reinterpret_cast<unsigned char*>(&pair.pub[0]),
                         reinterpret_cast<unsigned char*>(&pair.secret[0]));
  return pair;
}

StatusOr<JobKey::Hello> JobKey::MakeHello(const std::string& peer_pub) const {
  KeyPair e = NewKeyPair();
  StatusOr<std::string> dh = SharedSecret(e.secret, peer_pub);
  if (!dh.ok()) return dh.status();
  Hello hello;
  hello.token = e.pub + Mac(auth_, {"ps-seal-1 hello", e.pub, peer_pub});
  hello.key = Mac(auth_, {"ps-seal-1 key", *dh, e.pub, peer_pub});
  sodium_memzero(&e.secret[0], e.secret.size());
  return hello;
}

StatusOr<std::string> JobKey::AcceptHello(const KeyPair& own,
                                          const std::string& token) const {
  if (token.size() != 2 * kKeyBytes) {
    return Status::InvalidArgument(
        "a token of " + std::to_string(token.size()) + " bytes, not " +
        std::to_string(2 * kKeyBytes));
  }
  std::string e_pub = token.substr(0, kKeyBytes);
  std::string mac = Mac(auth_, {"ps-seal-1 hello", e_pub, own.pub});
  if (sodium_memcmp(mac.data(), token.data() + kKeyBytes, kKeyBytes) != 0) {
    return Status::Corruption(
        "its token does not prove this job's key for this process");
  }
  StatusOr<std::string> dh = SharedSecret(own.secret, e_pub);
  if (!dh.ok()) return dh.status();
  return Mac(auth_, {"ps-seal-1 key", *dh, e_pub, own.pub});
}

StatusOr<JobKey::Offer> JobKey::MakeOffer(const std::string& peer_pub) const {
  if (peer_pub.size() != kKeyBytes) {
    return Status::InvalidArgument("an X25519 key of " +
                                   std::to_string(peer_pub.size()) + " bytes");
  }
  Offer offer{NewKeyPair(), kHelloMagic};
  offer.hello += offer.e.pub;
  offer.hello += Mac(auth_, {"ps-seal-2 offer", offer.e.pub, peer_pub});
  return offer;
}

JobKey::SessionKeys JobKey::Derive(const std::string& es, const std::string& ee,
                                   const std::string& offered,
                                   const std::string& e_pub,
                                   const std::string& peer_pub) const {
  // Both ephemeral keys, the receiver's static one and the job's secret
  // (auth), as Noise's NKpsk0 mixes them; each direction its own key.
  const std::string chain =
      Mac(auth_, {"ps-seal-2 session", es, ee, offered, e_pub, peer_pub});
  return {Mac(chain, {"forward"}), Mac(chain, {"reverse"})};
}

StatusOr<JobKey::Accepted> JobKey::AcceptOffer(const KeyPair& own,
                                               const std::string& hello) const {
  if (hello.size() != kHelloBytes || hello.compare(0, 8, kHelloMagic, 8) != 0) {
    return Status::InvalidArgument("a HELLO of " +
                                   std::to_string(hello.size()) + " bytes");
  }
  Accepted accepted;
  accepted.offered = hello.substr(8, kKeyBytes);
  const std::string mac =
      Mac(auth_, {"ps-seal-2 offer", accepted.offered, own.pub});
  if (sodium_memcmp(mac.data(), hello.data() + 8 + kKeyBytes, kKeyBytes) != 0) {
    return Status::Corruption(
        "its HELLO does not prove this job's key for this process");
  }
  KeyPair e = NewKeyPair();
  StatusOr<std::string> es = SharedSecret(own.secret, accepted.offered);
  StatusOr<std::string> ee = SharedSecret(e.secret, accepted.offered);
  sodium_memzero(&e.secret[0], e.secret.size());
  if (!es.ok()) return es.status();
  if (!ee.ok()) return ee.status();
  accepted.e_pub = e.pub;
  accepted.keys = Derive(*es, *ee, accepted.offered, e.pub, own.pub);
  return accepted;
}

StatusOr<JobKey::SessionKeys> JobKey::FinishOffer(
    const Offer& offer, const std::string& peer_pub,
    const std::string& e_pub) const {
  StatusOr<std::string> es = SharedSecret(offer.e.secret, peer_pub);
  if (!es.ok()) return es.status();
  StatusOr<std::string> ee = SharedSecret(offer.e.secret, e_pub);
  if (!ee.ok()) return ee.status();
  return Derive(*es, *ee, offer.e.pub, e_pub, peer_pub);
}

struct Sealer::Cipher {
  CipherPtr ctx;
};

Sealer::Sealer(const std::string& key)
    : cipher_(new Cipher{CipherPtr(NewCipher(key, true))}) {}
Sealer::~Sealer() = default;

void Sealer::Seal(uint64_t seq, uint32_t index, uint32_t frames, const void* in,
                  size_t bytes, void* out) {
  CHECK_GE(seq + Chunks(bytes), seq) << "sequence numbers exhausted";
  auto* o = static_cast<unsigned char*>(out);
  std::memcpy(o, &seq, kSeqBytes);
  RunFrame(cipher_->ctx.get(), true, seq, index, frames,
           static_cast<const unsigned char*>(in), o + kSeqBytes, bytes,
           o + kSeqBytes + bytes);
}

void Sealer::SealChunk(uint64_t seq, uint32_t index, uint32_t frames,
                       uint32_t chunk, uint32_t chunks, const void* in,
                       size_t bytes, void* out) {
  CHECK_LE(bytes, kChunkBytes);
  auto* o = static_cast<unsigned char*>(out);
  std::memcpy(o, &seq, kSeqBytes);
  unsigned char aad[16];
  Aad(index, frames, chunk, chunks, aad);
  RunChunk(cipher_->ctx.get(), true, seq, aad,
           static_cast<const unsigned char*>(in), bytes, o + kSeqBytes,
           o + kSeqBytes + bytes);
}

struct Opener::Cipher {
  CipherPtr ctx;
};

Opener::Opener(const std::string& key, bool contiguous)
    : cipher_(new Cipher{CipherPtr(NewCipher(key, false))}),
      contiguous_(contiguous) {}

uint64_t Opener::SeqOf(const char* frame, size_t bytes) {
  uint64_t seq = 0;
  if (bytes >= kSeqBytes) std::memcpy(&seq, frame, kSeqBytes);
  return seq;
}
Opener::~Opener() = default;

Status Opener::Open(Frame* frames, size_t count) {
  if (count == 0) return Status::InvalidArgument("a message of no frames");
  // The plaintext size of each frame, from its sealed size.
  std::vector<size_t> bytes(count);
  uint64_t first = 0, next = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t sealed = frames[i].bytes;
    size_t body = sealed < kSeqBytes ? 0 : sealed - kSeqBytes;
    size_t chunks =
        (body + kChunkBytes + kTagBytes - 1) / (kChunkBytes + kTagBytes);
    if (sealed < kSeqBytes + kTagBytes ||
        SealedBytes(body - kTagBytes * chunks) != sealed) {
      return Status::InvalidArgument("frame " + std::to_string(i) + " of " +
                                     std::to_string(sealed) +
                                     " bytes is no sealed frame");
    }
    bytes[i] = body - kTagBytes * chunks;
    uint64_t seq;
    std::memcpy(&seq, frames[i].data, kSeqBytes);
    if (i == 0) {
      first = seq;
      if (contiguous_ ? first != last_ + 1 : first <= last_) {
        return Status::Corruption(std::string(first <= last_
                                                  ? "repeated or out of order"
                                                  : "a gap before it") +
                                  ": sequence number " + std::to_string(first) +
                                  ", expected " + std::to_string(last_ + 1));
      }
    } else if (seq != next) {
      return Status::Corruption("frame " + std::to_string(i) +
                                " out of place: sequence number " +
                                std::to_string(seq));
    }
    next = seq + chunks;
    if (next < seq) return Status::Corruption("sequence numbers wrap");
  }
  uint64_t seq = first;
  for (size_t i = 0; i < count; ++i) {
    auto* p = reinterpret_cast<unsigned char*>(frames[i].data) + kSeqBytes;
    if (!RunFrame(cipher_->ctx.get(), false, seq, static_cast<uint32_t>(i),
                  static_cast<uint32_t>(count), p, p, bytes[i], p + bytes[i])) {
      return Status::Corruption("frame " + std::to_string(i) +
                                " fails authentication (tampered, or "
                                "sealed with another key)");
    }
    seq += Chunks(bytes[i]);
  }
  for (size_t i = 0; i < count; ++i) {
    frames[i].data += kSeqBytes;
    frames[i].bytes = bytes[i];
  }
  last_ = next - 1;
  return Status::OK();
}

bool Opener::IsNext(const char* record, size_t record_bytes) const {
  uint64_t seq = 0;
  if (record_bytes < kSeqBytes + kTagBytes) return false;
  std::memcpy(&seq, record, kSeqBytes);
  return seq == last_ + 1;
}

Status Opener::OpenChunk(char* record, size_t record_bytes, uint32_t index,
                         uint32_t frames, uint32_t chunk, uint32_t chunks,
                         size_t bytes) {
  if (record_bytes != kSeqBytes + bytes + kTagBytes) {
    return Status::InvalidArgument(
        "a record of " + std::to_string(record_bytes) + " bytes for chunk " +
        std::to_string(chunk) + " of frame " + std::to_string(index) +
        ", which holds " + std::to_string(bytes));
  }
  if (!IsNext(record, record_bytes)) {
    return Status::Corruption("chunk " + std::to_string(chunk) + " of frame " +
                              std::to_string(index) +
                              " out of place: not the next sequence number");
  }
  const uint64_t seq = last_ + 1;
  unsigned char aad[16];
  Aad(index, frames, chunk, chunks, aad);
  auto* in = reinterpret_cast<unsigned char*>(record) + kSeqBytes;
  if (!RunChunk(cipher_->ctx.get(), false, seq, aad, in, bytes, in,
                in + bytes)) {
    return Status::Corruption("chunk " + std::to_string(chunk) + " of frame " +
                              std::to_string(index) +
                              " fails authentication (tampered, or sealed "
                              "with another key)");
  }
  last_ = seq;
  return Status::OK();
}

std::string ToHex(const std::string& bytes) {
  std::string hex(2 * bytes.size() + 1, '\0');
  sodium_bin2hex(&hex[0], hex.size(),
                 reinterpret_cast<const unsigned char*>(bytes.data()),
                 bytes.size());
  hex.pop_back();
  return hex;
}

StatusOr<std::string> FromHex(const std::string& hex) {
  std::string bytes(hex.size() / 2, '\0');
  size_t len = 0;
  const char* end = nullptr;
  if (hex.size() % 2 != 0 ||
      sodium_hex2bin(reinterpret_cast<unsigned char*>(&bytes[0]), bytes.size(),
                     hex.data(), hex.size(), nullptr, &len, &end) != 0 ||
      end != hex.data() + hex.size()) {
    return Status::InvalidArgument("not hex: " + hex.substr(0, 80));
  }
  bytes.resize(len);
  return bytes;
}

}  // namespace seal
}  // namespace ps
