// The sealed wire (see sealed_wire.h): the job's keys, admission by token,
// connecting a DEALER, and sealing what is sent.
#include "van/sealed_wire.h"

#include <pthread.h>
#include <zmq.h>

#include <cerrno>
#include <utility>

#include "van/van_internal.h"

namespace ps {
namespace van_internal {

namespace {

// The job key's 32 bytes from its Z85 text.
std::string DecodeJobKey(const std::string& z85) {
  std::string secret(seal::kKeyBytes, '\0');
  CHECK(z85.size() == 40 &&
        zmq_z85_decode(reinterpret_cast<uint8_t*>(&secret[0]), z85.c_str()) !=
            nullptr)
      << "not a job key (40 Z85 characters)";
  return secret;
}

// The bytes data frame `i` of `msg` puts on the wire: none for a reference.
size_t FrameBytes(const Message& msg, const std::vector<bool>& by_ref,
                  size_t i) {
  return by_ref[i] ? 0 : msg.data[i].size();
}

}  // namespace

SealedWire::SealedWire(WireHost* host, const VanOptions& options)
    : host_(host),
      max_message_bytes_(options.max_message_bytes),
      job_key_(DecodeJobKey(options.secret_key)) {
  static_key_ = options.scheduler ? job_key_.SchedulerKeyPair()
                                  : seal::JobKey::NewKeyPair();
  // A sealed frame is larger than its plaintext (seal::SealedBytes); a
  // message's frames in all add, each, a sequence number and at most one
  // tag more than the limit's own chunks.
  max_frame_bytes_ = static_cast<int64_t>(
      seal::SealedBytes(static_cast<size_t>(max_message_bytes_)));
  max_received_bytes_ =
      max_frame_bytes_ +
      static_cast<int64_t>(kMaxParts * (seal::kSeqBytes + seal::kTagBytes));
  // Sessions run on every DEALER, whether or not this van receives.
  session_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ps-van-session");
    SessionLoop();
  });
}

SealedWire::~SealedWire() { Stop(); }

void SealedWire::Stop() {
  stop_session_.store(true);
  if (session_.joinable()) session_.join();
}

bool SealedWire::SetUpRouter(void* router) {
  SetIntOption(router, ZMQ_PLAIN_SERVER, 1);
  SetStringOption(router, ZMQ_ZAP_DOMAIN, kZapDomain);
  return true;
}

bool SealedWire::Admit(const std::string& user, const std::string& password,
                       std::string* why) {
  if (user != seal::kUserName) {
    *why = "it does not hold this job's key (PS_KEY_FILE)";
    return false;
  }
  // Only the token's one spelling (lower-case hex): the receive thread
  // keys each connection's opener on it, so another spelling of a recorded
  // token must not find a fresh one.
  StatusOr<std::string> token = seal::FromHex(password);
  StatusOr<std::string> key =
      token.ok() && seal::ToHex(*token) == password
          ? job_key_.AcceptHello(static_key_, *token)
          : StatusOr<std::string>(
                Status::InvalidArgument("its token is not lower-case hex"));
  if (!key.ok()) *why = key.status().message();
  return key.ok();
}

Status SealedWire::Prepare(Peer* peer, const std::string& wire_key) {
  StatusOr<seal::JobKey::Hello> hello = job_key_.MakeHello(wire_key);
  if (!hello.ok()) {
    return Status::InvalidArgument("gave no usable key: " +
                                   hello.status().message());
  }
  auto state = std::make_unique<SealedPeer>();
  state->peer_key = wire_key;
  peer->state = std::move(state);
  // The token proves the job's key to the peer's ZAP handler before any
  // message is read; the session's HELLO then agrees the keys.
  SetStringOption(peer->socket, ZMQ_PLAIN_USERNAME, seal::kUserName);
  SetStringOption(peer->socket, ZMQ_PLAIN_PASSWORD, seal::ToHex(hello->token));
  size_t len = sizeof(peer->fd);
  CHECK_EQ(zmq_getsockopt(peer->socket, ZMQ_FD, &peer->fd, &len), 0)
      << ZmqError();
  return Status::OK();
}

Status SealedWire::Connected(Peer* peer) {
  return OfferLocked(peer, /*again=*/false);
}

Status SealedWire::Send(Peer* peer, std::string header, const Message& msg,
                        std::vector<bool> by_ref) {
  OutStream& out = StateOf(peer).out;
  // Kept until the receiver took it; sent now if the session is open, else
  // when it opens.
  OutStream::Item kept{std::move(header), {}, std::move(by_ref), {}};
  kept.msg.data = msg.data;  // shared, not copied
  OutStream::Item* item = out.Add(std::move(kept));
  if (out.state() == OutStream::State::kOpen) {
    Status st = TransmitLocked(peer, item);
    if (!st.ok()) out.Unadd();
    return st;
  }
  int events = 0;
  size_t len = sizeof(events);
  zmq_getsockopt(peer->socket, ZMQ_EVENTS, &events, &len);
  if ((events & ZMQ_POLLOUT) == 0) {
    // No connection at all: the peer refused our handshake for good.
    out.Unadd();
    errno = EAGAIN;
    return Status::Unavailable(SendError(peer->address));
  }
  if ((events & ZMQ_POLLIN) != 0) DrainLocked(peer);
  return Status::OK();
}

Status SealedWire::SendSealed(seal::Sealer* sealer, void* socket,
                              const std::string& address,
                              const std::string& header, const Message& msg,
                              const std::vector<bool>& by_ref, uint64_t* last) {
  const size_t n = msg.data.size();
  const auto frames = static_cast<uint32_t>(n + 1);
  size_t chunks = seal::Chunks(header.size()), data_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    chunks += seal::Chunks(FrameBytes(msg, by_ref, i));
    data_bytes += FrameBytes(msg, by_ref, i);
  }
  const bool streamed = n > 0 && data_bytes >= seal::kStreamBytes;
  // Every frame, the header's too, is sealed in the order of its sequence
  // numbers (hence under the peer's lock). A streamed message's header is
  // sealed as a message of one frame.
  uint64_t seq = sealer->Begin(chunks);
  *last = seq + chunks - 1;
  std::string sealed(seal::SealedBytes(header.size()), '\0');
  sealer->Seal(seq, 0, streamed ? 1 : frames, header.data(), header.size(),
               &sealed[0]);
  seq += seal::Chunks(header.size());
  if (streamed) {
    if (!OutParts(0).Send(socket, sealed)) {
      return Status::Unavailable(SendError(address));
    }
    return SendRecords(sealer, socket, address, msg, by_ref, seq);
  }
  // Each frame sealed whole, a part of one message.
  OutParts parts(n);
  for (uint32_t i = 1; i < frames; ++i) {
    const size_t size = FrameBytes(msg, by_ref, i - 1);
    void* out = parts.Add(seal::SealedBytes(size));
    if (out == nullptr) {
      return Status::Unavailable("send to " + address + ": no memory to seal " +
                                 std::to_string(size) + " bytes");
    }
    sealer->Seal(seq, i, frames, msg.data[i - 1].data(), size, out);
    seq += seal::Chunks(size);
  }
  if (!parts.Send(socket, sealed)) {
    return Status::Unavailable(SendError(address));
  }
  return Status::OK();
}

Status SealedWire::SendRecords(seal::Sealer* sealer, void* socket,
                               const std::string& address, const Message& msg,
                               const std::vector<bool>& by_ref, uint64_t seq) {
  // Each chunk of each data frame a record, a ZeroMQ message of its own,
  // which ZeroMQ's I/O thread sends while this thread seals the next. One
  // that is not sent ends the message: the receiver drops it as cut short.
  const auto frames = static_cast<uint32_t>(msg.data.size() + 1);
  for (uint32_t i = 1; i < frames; ++i) {
    const char* data = msg.data[i - 1].data();
    const size_t size = FrameBytes(msg, by_ref, i - 1);
    const auto records = static_cast<uint32_t>(seal::Chunks(size));
    for (uint32_t c = 0; c < records; ++c) {
      const size_t bytes = seal::ChunkBytes(size, c);
      zmq_msg_t record;
      if (zmq_msg_init_size(&record,
                            seal::kSeqBytes + bytes + seal::kTagBytes) != 0) {
        return Status::Unavailable("send to " + address +
                                   ": no memory to seal " +
                                   std::to_string(bytes) + " bytes");
      }
      sealer->SealChunk(seq++, i, frames, c, records,
                        data + c * seal::kChunkBytes, bytes,
                        zmq_msg_data(&record));
      if (zmq_msg_send(&record, socket, kSendFlags) < 0) {
        Status st = Status::Unavailable(SendError(address));  // reads errno
        zmq_msg_close(&record);
        return st;
      }
    }
  }
  return Status::OK();
}

std::unique_ptr<Wire> MakeSealedWire(WireHost* host,
                                     const VanOptions& options) {
  return std::make_unique<SealedWire>(host, options);
}

}  // namespace van_internal
}  // namespace ps
