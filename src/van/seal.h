// Sealed frames: how a job with a key encrypts and authenticates every frame
// it sends (docs/security.md, "The construction").
//
// Each connection carries one direction (a node's DEALER to a peer's
// ROUTER), so each has one key of its own. It comes out of a one-way
// handshake in the pattern Npsk0 of the Noise Protocol Framework (sections
// 7.4 and 9): the receiver's static X25519 key pair belongs to its process
// (the scheduler's is derived from the job's secret, since nodes must reach
// it before any table exists), the sender makes an ephemeral pair per
// connection, and the job's secret is the pre-shared key:
//
//   auth  = BLAKE2b-256(key = job secret, "ps-seal-1 auth")
//   token = e.pub || BLAKE2b-256(key = auth, "ps-seal-1 hello" || e.pub ||
//                                            s.pub)
//   key   = BLAKE2b-256(key = auth, "ps-seal-1 key" || X25519(e, s) ||
//                                   e.pub || s.pub)
//
// The sender presents the token as its ZMTP PLAIN password: the receiver's
// ZAP handler admits the connection only if the token proves the job's
// secret and names this process's static key, so a stranger is refused in
// the handshake, before any of its bytes are read, and a connection made
// for an earlier process at the same address is refused too.
//
// Frames are sealed with AES-256-GCM (RFC 5116; OpenSSL's EVP, which uses
// AES-NI and carry-less multiply) in chunks of kChunkBytes, each an AEAD
// record of its own: a sealed frame is the 64-bit sequence number of its
// first chunk, the ciphertext (as long as the plaintext, so it is opened in
// place) and one 16-byte tag per chunk. A chunk's nonce is its sequence
// number (as TLS 1.3's per-record nonce, RFC 8446 section 5.3), which the
// sender increments per chunk and never reuses under one key; its
// associated data is its place (frame index and count, chunk index and
// count), so chunks and frames cannot be moved, dropped or appended within
// a message. The receiver takes a message only if its first sequence
// number is above every one it took under that key and the rest follow it
// one by one: replayed and reordered frames are refused.
//
// A message whose data frames hold kStreamBytes or more is streamed: its
// header is sealed as a message of one frame and goes alone, and each chunk
// of its data frames follows as a record of its own (SealChunk: the chunk's
// sequence number, ciphertext and tag), sealed while ZeroMQ sends the one
// before and opened (OpenChunk) while it receives the one after, so that
// sealing, sending, receiving and opening overlap. The header says how many
// records follow; each must carry the next sequence number.
//
// Thread-safety: a Sealer is used under its peer's lock; an Opener on the
// receive thread only. Internal to src/van.
#ifndef PS_SRC_VAN_SEAL_H_
#define PS_SRC_VAN_SEAL_H_

#include <glog/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ps/status.h"

namespace ps {
namespace seal {

constexpr size_t kKeyBytes = 32;
constexpr size_t kSeqBytes = 8;
constexpr size_t kTagBytes = 16;
constexpr size_t kChunkBytes = size_t{128} << 10;
constexpr size_t kStreamBytes = 2 * kChunkBytes;
// The PLAIN user name a sealing sender presents.
constexpr char kUserName[] = "ps-seal-1";
// The first bytes of a HELLO message, where a sealed frame has its
// sequence number: numbers never come near their value (Sealer::Begin).
constexpr char kHelloMagic[] = "ps-hello";
constexpr size_t kHelloBytes = 8 + 2 * kKeyBytes;

// The chunks, hence sequence numbers, of a frame of `bytes` plaintext bytes
// (one for an empty frame), and the size of the frame sealed.
inline size_t Chunks(size_t bytes) {
  return bytes == 0 ? 1 : (bytes + kChunkBytes - 1) / kChunkBytes;
}
inline size_t SealedBytes(size_t bytes) {
  return kSeqBytes + bytes + kTagBytes * Chunks(bytes);
}
// The plaintext bytes of chunk `chunk` of a frame of `bytes` bytes.
inline size_t ChunkBytes(size_t bytes, size_t chunk) {
  size_t at = chunk * kChunkBytes;
  return at >= bytes ? 0 : std::min(kChunkBytes, bytes - at);
}

// An X25519 key pair: 32 bytes each.
struct KeyPair {
  std::string pub;
  std::string secret;
};

// The job's secret (32 bytes) and what is derived from it.
class JobKey {
 public:
  // `secret`: the job key's 32 bytes (the decoded Z85 key).
  explicit JobKey(const std::string& secret);
  // A fresh static key pair for this process.
  static KeyPair NewKeyPair();
  // The scheduler's static key pair, the same in every process of the job.
  KeyPair SchedulerKeyPair() const;

  // The sender's side of a new connection to the holder of `peer_pub`:
  // its token (the PLAIN password) and the key it seals with.
  struct Hello {
    std::string token;  // e.pub || mac: 64 bytes
    std::string key;    // 32 bytes
  };
  StatusOr<Hello> MakeHello(const std::string& peer_pub) const;
  // The receiver's side: whether `token` proves the job's secret and names
  // `own.pub`; if so, the key that the token's sender seals with.
  StatusOr<std::string> AcceptHello(const KeyPair& own,
                                    const std::string& token) const;

  // The session on an admitted connection (docs/security.md, "Sessions"):
  // the sender offers a fresh ephemeral key in a HELLO message, the
  // receiver answers with one of its own, and both derive the session's
  // keys from both, so that nothing recorded from an earlier session, an
  // earlier process or an earlier job with the same key opens in this one.
  struct SessionKeys {
    std::string forward;  // the sender's frames to the receiver
    std::string reverse;  // the receiver's answers (WELCOME, ACK, RESET)
  };
  // The sender's offer to the holder of `peer_pub`: `hello` is the HELLO
  // message's one frame (kHelloMagic || e.pub || MAC), `e` its pair.
  struct Offer {
    KeyPair e;
    std::string hello;
  };
  StatusOr<Offer> MakeOffer(const std::string& peer_pub) const;
  // The receiver's side: whether `hello` is an offer of this job for
  // `own.pub`; if so, a fresh ephemeral key of its own (`e_pub`, to send
  // back), the sender's (`offered`) and the session's keys.
  struct Accepted {
    std::string offered;  // the sender's e.pub: names the session
    std::string e_pub;
    SessionKeys keys;
  };
  StatusOr<Accepted> AcceptOffer(const KeyPair& own,
                                 const std::string& hello) const;
  // The sender's side again: the keys, from the receiver's `e_pub`.
  StatusOr<SessionKeys> FinishOffer(const Offer& offer,
                                    const std::string& peer_pub,
                                    const std::string& e_pub) const;

 private:
  SessionKeys Derive(const std::string& es, const std::string& ee,
                     const std::string& offered, const std::string& e_pub,
                     const std::string& peer_pub) const;

  std::string auth_;  // 32 bytes
};

// Seals the frames of the messages on one connection.
class Sealer {
 public:
  explicit Sealer(const std::string& key);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // Reserves `chunks` sequence numbers (the Chunks() of every frame of a
  // message); returns the first.
  uint64_t Begin(size_t chunks) {
    CHECK_LT(next_, uint64_t{1} << 62) << "sequence numbers exhausted";
    uint64_t first = next_;
    next_ += chunks;
    return first;
  }
  // Seals the `bytes` bytes at `in` as frame `index` of `frames`, its first
  // chunk numbered `seq` (the next frame's is seq + Chunks(bytes)), into
  // `out`, which holds SealedBytes(bytes).
  void Seal(uint64_t seq, uint32_t index, uint32_t frames, const void* in,
            size_t bytes, void* out);
  // Seals chunk `chunk` of `chunks` of frame `index` of `frames`, numbered
  // `seq`, from the `bytes` bytes at `in` into the record at `out`, which
  // holds kSeqBytes + bytes + kTagBytes: a streamed message's record.
  void SealChunk(uint64_t seq, uint32_t index, uint32_t frames, uint32_t chunk,
                 uint32_t chunks, const void* in, size_t bytes, void* out);

 private:
  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  uint64_t next_ = 1;
};

// Opens the messages of one sender's key.
class Opener {
 public:
  // `contiguous`: a message is taken only if its first sequence number is
  // the one after the last taken (a stream: nothing missing, repeated or
  // reordered); else any higher number is (answers, which may be lost).
  explicit Opener(const std::string& key, bool contiguous = true);
  ~Opener();
  Opener(const Opener&) = delete;
  Opener& operator=(const Opener&) = delete;

  // One received frame, opened in place: on success `data` (size `bytes`)
  // is its plaintext.
  struct Frame {
    char* data;
    size_t bytes;
  };
  // Opens the frames of one message in place, or refuses it whole, saying
  // why (a size no sealed frame has, replayed or out of order, tampered).
  // Nothing is changed by a refused message but the bytes of its frames.
  Status Open(Frame* frames, size_t count);
  // Opens the record of `record_bytes` bytes at `record`, in place, as chunk
  // `chunk` of `chunks` of frame `index` of `frames`, which holds `bytes`
  // bytes: on success they are at record + kSeqBytes. It must carry the
  // sequence number after the last one taken. Refused: nothing is changed
  // but the record's bytes, and no plaintext is left in them.
  Status OpenChunk(char* record, size_t record_bytes, uint32_t index,
                   uint32_t frames, uint32_t chunk, uint32_t chunks,
                   size_t bytes);
  // Whether the record at `record` carries the next sequence number.
  bool IsNext(const char* record, size_t record_bytes) const;
  uint64_t last() const { return last_; }
  // The sequence number of the message whose first frame is `frame`
  // (0 when it is too short to hold one): for naming a refusal.
  static uint64_t SeqOf(const char* frame, size_t bytes);

 private:
  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  const bool contiguous_;
  uint64_t last_ = 0;  // the highest sequence number taken
};

// Hex, for names and PLAIN passwords.
std::string ToHex(const std::string& bytes);
StatusOr<std::string> FromHex(const std::string& hex);

}  // namespace seal
}  // namespace ps

#endif  // PS_SRC_VAN_SEAL_H_
