// The sealed wire's receiving side (see sealed_wire.h), on the receive
// thread: each message is opened with its connection's session, taken only
// as the next of that session's stream, and handed up; a streamed message's
// records are opened one by one into its frames.
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "van/codec.h"
#include "van/sealed_wire.h"
#include "van/van_internal.h"

namespace ps {
namespace van_internal {

namespace {

// A streamed message none of whose records came for this long is let go
// when another stream starts (its sender went away mid-way).
constexpr auto kStreamIdle = std::chrono::seconds(30);

}  // namespace

void SealedWire::Receive(const RecvParts& parts, const std::string& from,
                         const std::string& address) {
  // The User-Id is the token the ZAP handler admitted (lower-case hex); with
  // the routing id it names the connection, however ZeroMQ connects again.
  const char* user_id = zmq_msg_gets(&parts[1]->msg, "User-Id");
  const std::string key = from + '\0' + (user_id == nullptr ? "" : user_id);
  char* data = parts[1]->data();
  const size_t size = parts[1]->size();
  if (parts.size() == 2 && size == seal::kHelloBytes &&
      std::memcmp(data, seal::kHelloMagic, 8) == 0) {
    OnHello(key, std::string(data, size), from, address);
    return;
  }
  auto it = inbound_.find(key);
  Inbound* in = it == inbound_.end() ? nullptr : &it->second;
  const uint64_t seq = seal::Opener::SeqOf(data, size);
  std::vector<seal::Opener::Frame> frames;
  if (in != nullptr && in->pending && seq == 1) {
    // The first message of the session offered last: if it opens, that
    // session is confirmed, and the one before it is let go.
    if (!OpenParts(in->pending->opener.get(), parts, &frames, from, address)) {
      return;
    }
    in->open = std::move(in->pending);
    in->pending.reset();
    in->frozen = false;
    in->stream.reset();
    DeliverOpened(in, parts, frames, from, address);
    return;
  }
  if (in == nullptr || !in->open || in->frozen) {
    // Frozen: the sender's next session lost its first message, or a
    // replayed HELLO stopped this one: either way the sender offers a new
    // session, which the WELCOME's quote decides.
    Drop(from, address,
         in == nullptr || !in->open
             ? "sealed frames on a connection without a session (no HELLO)"
             : "sealed frames of a session replaced by a new HELLO");
    host_->Answer(from, "?");
    return;
  }
  Inbound::Session& session = *in->open;
  if (in->stream && parts.size() == 2 && session.opener->IsNext(data, size)) {
    ReceiveRecord(in, data, size, from, address);
    return;
  }
  if (seq != session.opener->last() + 1) {
    RefuseOutOfOrder(&session, seq, from, address);
    return;
  }
  if (!OpenParts(session.opener.get(), parts, &frames, from, address)) return;
  DeliverOpened(in, parts, frames, from, address);
}

void SealedWire::RefuseOutOfOrder(Inbound::Session* session, uint64_t seq,
                                  const std::string& from,
                                  const std::string& address) {
  // A message missing (a gap), or one taken already (a repeat or a
  // reorder): refused, and the sender told to start a new session, in
  // which it sends again what this one did not take.
  const uint64_t last = session->opener->last();
  Drop(from, address,
       std::string(seq <= last ? "a repeat or reorder" : "a gap") +
           " in the sealed stream: message numbered " + std::to_string(seq) +
           ", expected " + std::to_string(last + 1) +
           " (the last taken whole: " + std::to_string(session->taken) +
           "); the sender is told to reset");
  AnswerSession(from, session, 'R');
}

bool SealedWire::OpenParts(seal::Opener* opener, const RecvParts& parts,
                           std::vector<seal::Opener::Frame>* frames,
                           const std::string& from,
                           const std::string& address) {
  for (size_t i = 1; i < parts.size(); ++i) {
    frames->push_back({parts[i]->data(), parts[i]->size()});
  }
  Status opened = opener->Open(frames->data(), frames->size());
  if (!opened.ok()) {
    Drop(from, address, "sealed frames refused: " + opened.message());
    return false;
  }
  return true;
}

void SealedWire::ReceiveRecord(Inbound* in, char* data, size_t size,
                               const std::string& from,
                               const std::string& address) {
  // The next record of the streamed message this connection is sending;
  // one that does not open is dropped alone, and the stream waits on.
  Status took = TakeRecord(in, data, size);
  if (!took.ok()) {
    Drop(from, address, "a record refused: " + took.message());
    return;
  }
  if (in->stream->frame < in->stream->bytes.size()) return;
  Inbound::Stream done = std::move(*in->stream);
  in->stream.reset();
  uint64_t bytes = 0;
  for (size_t b : done.bytes) bytes += b;
  Took(from, &*in->open, bytes);
  host_->Deliver(Decode(std::move(done.meta), std::move(done.frames),
                        host_->SharedPid(from)),
                 from, address);
}

void SealedWire::DeliverOpened(Inbound* in, const RecvParts& parts,
                               const std::vector<seal::Opener::Frame>& frames,
                               const std::string& from,
                               const std::string& address) {
  Inbound::Session& session = *in->open;
  if (parts.size() == 2 && frames[0].bytes == 0) {
    // A probe: the sender asks what was taken.
    session.taken = session.opener->last();
    AnswerSession(from, &session, 'A');
    return;
  }
  if (parts.size() == 2) {
    DeliverHeader(in, frames[0], from, address);
    return;
  }
  std::vector<SArray<char>> data;
  uint64_t bytes = frames[0].bytes;
  for (size_t i = 2; i < parts.size(); ++i) {
    data.push_back(Adopt(parts[i], frames[i - 1].data, frames[i - 1].bytes));
    bytes += frames[i - 1].bytes;
  }
  Took(from, &session, bytes);
  host_->Deliver(Decode(frames[0].data, frames[0].bytes, std::move(data),
                        host_->SharedPid(from)),
                 from, address);
}

void SealedWire::DeliverHeader(Inbound* in, const seal::Opener::Frame& header,
                               const std::string& from,
                               const std::string& address) {
  Inbound::Session& session = *in->open;
  pb::Meta meta;
  if (header.bytes > static_cast<size_t>(INT32_MAX) ||
      !meta.ParseFromArray(header.data, static_cast<int>(header.bytes))) {
    Took(from, &session, header.bytes);
    Drop(from, address,
         "header of " + std::to_string(header.bytes) + " bytes does not parse");
    return;
  }
  StatusOr<bool> streamed = StartStream(in, &meta);
  if (!streamed.ok()) {
    Took(from, &session, header.bytes);
    Drop(from, address, streamed.status().message());
    return;
  }
  if (*streamed) return;
  Took(from, &session, header.bytes);
  host_->Deliver(Decode(std::move(meta), {}, host_->SharedPid(from)), from,
                 address);
}

StatusOr<bool> SealedWire::StartStream(Inbound* in, pb::Meta* meta) {
  StatusOr<std::vector<size_t>> wire =
      StreamedFrames(*meta, seal::kStreamBytes, kMaxParts - 1,
                     static_cast<uint64_t>(max_message_bytes_));
  if (!wire.ok()) return wire.status();
  if (wire->empty()) return false;
  // A stream whose sender went away mid-way (a crash, a lost connection
  // that came back under a new key) would keep its frames: let them go.
  const auto now = std::chrono::steady_clock::now();
  for (auto& [key, other] : inbound_) {
    if (other.stream && now - other.stream->last > kStreamIdle) {
      other.stream.reset();
      host_->CountDropped("a connection that went quiet",
                          "a streamed message abandoned mid-way");
    }
  }
  Inbound::Stream stream;
  stream.bytes = std::move(wire).value();
  stream.meta = std::move(*meta);
  stream.last = now;
  in->stream = std::move(stream);
  return true;
}

Status SealedWire::TakeRecord(Inbound* in, char* record, size_t bytes) {
  Inbound::Stream& stream = *in->stream;
  const size_t size = stream.bytes[stream.frame];
  const auto chunks = static_cast<uint32_t>(seal::Chunks(size));
  const size_t chunk_bytes = seal::ChunkBytes(size, stream.chunk);
  // Opened in place, in the record's own buffer: no plaintext reaches the
  // frame before its tag is checked.
  PS_RETURN_IF_ERROR(in->open->opener->OpenChunk(
      record, bytes, stream.frame + 1,
      static_cast<uint32_t>(stream.bytes.size() + 1), stream.chunk, chunks,
      chunk_bytes));
  if (stream.frames.size() == stream.frame) {
    // Its first record opened: the frame's buffer, aligned for any element
    // type, made only now, so a header alone holds no memory.
    std::shared_ptr<uint64_t[]> buffer(new (std::nothrow)
                                           uint64_t[(size + 7) / 8]);
    if (buffer == nullptr) {
      return Status::Unavailable("no memory for a streamed frame of " +
                                 std::to_string(size) + " bytes");
    }
    stream.frames.emplace_back(reinterpret_cast<char*>(buffer.get()), size,
                               [buffer](char*) {});
  }
  SArray<char>& frame = stream.frames[stream.frame];
  if (chunk_bytes > 0) {
    std::memcpy(frame.data() + stream.chunk * seal::kChunkBytes,
                record + seal::kSeqBytes, chunk_bytes);
  }
  if (++stream.chunk == chunks) {
    stream.chunk = 0;
    ++stream.frame;
  }
  stream.last = std::chrono::steady_clock::now();
  return Status::OK();
}

}  // namespace van_internal
}  // namespace ps
