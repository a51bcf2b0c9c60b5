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
#include <system_error>
#include <thread>
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

// The chunks of one frame, laid out as a sealed frame holds them: the
// text at `text` (plaintext to seal, ciphertext to open, in place or into
// `out`), the tags at `tags`.
struct FrameChunks {
  uint64_t seq;
  uint32_t index, frames;
  const unsigned char* text;
  unsigned char* out;
  size_t bytes;
  unsigned char* tags;
};

// Seals (encrypt) or opens chunks [begin, end) of `f` with `ctx`; false if
// a chunk fails authentication.
bool RunChunks(EVP_CIPHER_CTX* ctx, bool encrypt, const FrameChunks& f,
               size_t begin, size_t end) {
  const auto chunks = static_cast<uint32_t>(Chunks(f.bytes));
  for (size_t c = begin; c < end; ++c) {
    unsigned char iv[12], aad[16];
    Nonce(f.seq + c, iv);
    Aad(f.index, f.frames, static_cast<uint32_t>(c), chunks, aad);
    size_t at = c * kChunkBytes;
    int n = static_cast<int>(
        std::min(kChunkBytes, f.bytes - std::min(at, f.bytes)));
    unsigned char* tag = f.tags + c * kTagBytes;
    int len = 0;
    if (encrypt) {
      CHECK_EQ(EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv), 1);
      CHECK_EQ(EVP_EncryptUpdate(ctx, nullptr, &len, aad, sizeof(aad)), 1);
      if (n > 0) {
        CHECK_EQ(EVP_EncryptUpdate(ctx, f.out + at, &len, f.text + at, n), 1);
      }
      CHECK_EQ(EVP_EncryptFinal_ex(ctx, f.out + at + n, &len), 1);
      CHECK_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag),
               1);
      continue;
    }
    bool ok =
        EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) == 1 &&
        EVP_DecryptUpdate(ctx, nullptr, &len, aad, sizeof(aad)) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
        (n == 0 ||
         EVP_DecryptUpdate(ctx, f.out + at, &len, f.text + at, n) == 1) &&
        EVP_DecryptFinal_ex(ctx, f.out + at + n, &len) == 1;
    if (!ok) return false;
  }
  return true;
}

// RunChunks over all of `f`'s chunks: a frame of kParallelBytes or more by
// this thread and one started for it, each on half of the chunks, the
// second half with a context of its own.
bool RunFrame(EVP_CIPHER_CTX* ctx, const std::string& key, bool encrypt,
              const FrameChunks& f) {
  const size_t chunks = Chunks(f.bytes);
  if (f.bytes < kParallelBytes) return RunChunks(ctx, encrypt, f, 0, chunks);
  const size_t half = chunks / 2;
  bool other_ok = true;
  std::thread other;
  try {
    other = std::thread([&] {
      CipherPtr own(NewCipher(key, encrypt));
      other_ok = RunChunks(own.get(), encrypt, f, half, chunks);
    });
  } catch (const std::system_error&) {
    // No thread to be had (a process or thread limit): all on this one.
    return RunChunks(ctx, encrypt, f, 0, chunks);
  }
  bool ok = RunChunks(ctx, encrypt, f, 0, half);
  other.join();
  return ok && other_ok;
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

struct Sealer::Cipher {
  CipherPtr ctx;
};

Sealer::Sealer(const std::string& key)
    : key_(key), cipher_(new Cipher{CipherPtr(NewCipher(key, true))}) {}
Sealer::~Sealer() = default;

void Sealer::Seal(uint64_t seq, uint32_t index, uint32_t frames, const void* in,
                  size_t bytes, void* out) {
  CHECK_GE(seq + Chunks(bytes), seq) << "sequence numbers exhausted";
  auto* o = static_cast<unsigned char*>(out);
  std::memcpy(o, &seq, kSeqBytes);
  FrameChunks f{seq,
                index,
                frames,
                static_cast<const unsigned char*>(in),
                o + kSeqBytes,
                bytes,
                o + kSeqBytes + bytes};
  RunFrame(cipher_->ctx.get(), key_, true, f);
}

struct Opener::Cipher {
  CipherPtr ctx;
};

Opener::Opener(const std::string& key)
    : key_(key), cipher_(new Cipher{CipherPtr(NewCipher(key, false))}) {}
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
      if (first <= last_) {
        return Status::Corruption("replayed or out of order: sequence number " +
                                  std::to_string(first) + ", already took " +
                                  std::to_string(last_));
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
    FrameChunks f{seq,
                  static_cast<uint32_t>(i),
                  static_cast<uint32_t>(count),
                  p,
                  p,
                  bytes[i],
                  p + bytes[i]};
    if (!RunFrame(cipher_->ctx.get(), key_, false, f)) {
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
