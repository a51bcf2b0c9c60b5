// Van: binding, starting and stopping, the routing table, sending and
// receiving (see van.h). The watch thread is in van_watch.cc,
// admission of sealing connections in van_auth.cc.
#include "van/van.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "van/codec.h"
#include "van/shm.h"
#include "van/van_internal.h"

namespace ps {

namespace {

using van_internal::FrameString;
using van_internal::kZapDomain;
using van_internal::SetIntOption;
using van_internal::SetStringOption;
using van_internal::ZmqError;

// ZeroMQ's "very small message" capacity (ZMQ_MAX_VSM_SIZE, 33 on 64-bit).
constexpr size_t kInlineFrameBytes = 32;
// Drop reports: at most this many lines per window; the rest are counted.
constexpr int kReportsPerWindow = 5;
constexpr auto kReportWindow = std::chrono::seconds(10);
// A message has a header and at most a few data frames (keys, values,
// lens); anything with more parts is malformed, and its extra parts are
// read and discarded rather than kept.
constexpr size_t kMaxParts = 16;
// A streamed message none of whose records came for this long is let go
// when another stream starts (its sender went away mid-way).
constexpr auto kStreamIdle = std::chrono::seconds(30);

bool IsNumericIPv4(const std::string& host) {
  in_addr addr;
  return inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

// ZeroMQ's free function for a zero-copy frame: drops the SArray reference.
void ReleaseFrame(void* /*data*/, void* hint) {
  std::unique_ptr<SArray<char>> owner(static_cast<SArray<char>*>(hint));
}

// Every send: a peer's queue has no limit (ZMQ_SNDHWM 0), so a send waits
// only where the socket has no connection at all, which is for good once
// the peer refused its handshake (ZeroMQ does not reconnect after that).
// Such a send fails at once (EAGAIN) instead of waiting forever.
constexpr int kSendFlags = ZMQ_DONTWAIT;

// Why a send to `address` failed, in words.
std::string SendError(const std::string& address) {
  if (errno == EAGAIN) {
    return "send to " + address +
           ": no connection (it refused this node's handshake)";
  }
  return "send to " + address + ": " + ZmqError();
}

// The data parts of one multipart message, each made (allocated, filled,
// sealed) before its header is sent, so that running out of memory leaves
// nothing half-sent on the socket; the parts not sent are closed.
class OutParts {
 public:
  explicit OutParts(size_t n) { parts_.reserve(n); }  // never moved after
  ~OutParts() {
    for (size_t i = sent_; i < parts_.size(); ++i) zmq_msg_close(&parts_[i]);
  }
  OutParts(const OutParts&) = delete;
  OutParts& operator=(const OutParts&) = delete;

  // A new part of `bytes` bytes to fill, or nullptr without memory.
  void* Add(size_t bytes) {
    zmq_msg_t part;
    if (zmq_msg_init_size(&part, bytes) != 0) return nullptr;
    parts_.push_back(part);
    return zmq_msg_data(&parts_.back());
  }
  // A new part that is `frame` itself, no copy; false without memory.
  bool AddFrame(const SArray<char>& frame) {
    auto owner = std::make_unique<SArray<char>>(frame);
    zmq_msg_t part;
    if (zmq_msg_init_data(&part, frame.data(), frame.size(), ReleaseFrame,
                          owner.get()) != 0) {
      return false;
    }
    owner.release();  // ZeroMQ's now: ReleaseFrame frees it
    parts_.push_back(part);
    return true;
  }
  // Sends `header` (by zmq_send, as the ThreadSanitizer build's shim of
  // ZeroMQ expects: tests/core/tsan_zmq_sync.cc), then every part; false
  // when ZeroMQ refuses one (no connection, or its context ends).
  bool Send(void* socket, const std::string& header) {
    if (zmq_send(socket, header.data(), header.size(),
                 kSendFlags | (parts_.empty() ? 0 : ZMQ_SNDMORE)) < 0) {
      return false;
    }
    for (; sent_ < parts_.size(); ++sent_) {
      const int more = sent_ + 1 < parts_.size() ? ZMQ_SNDMORE : 0;
      if (zmq_msg_send(&parts_[sent_], socket, kSendFlags | more) < 0) {
        return false;
      }
    }
    return true;
  }

 private:
  std::vector<zmq_msg_t> parts_;
  size_t sent_ = 0;
};

}  // namespace

// A received frame, kept alive by every SArray pointing into it.
struct Van::RecvFrame {
  zmq_msg_t msg;
  RecvFrame() { zmq_msg_init(&msg); }
  ~RecvFrame() { zmq_msg_close(&msg); }
  RecvFrame(const RecvFrame&) = delete;
  RecvFrame& operator=(const RecvFrame&) = delete;
};

Van::Van(const VanOptions& options)
    : options_(options),
      shared_memory_(&SharedMemory::Get()),
      context_(zmq_ctx_new()) {
  CHECK(context_ != nullptr);
  if (!options_.secret_key.empty()) {
    std::string secret(seal::kKeyBytes, '\0');
    CHECK(options_.secret_key.size() == 40 &&
          zmq_z85_decode(reinterpret_cast<uint8_t*>(&secret[0]),
                         options_.secret_key.c_str()) != nullptr)
        << "not a job key (40 Z85 characters)";
    job_key_ = std::make_unique<seal::JobKey>(secret);
    static_key_ = options_.scheduler ? job_key_->SchedulerKeyPair()
                                     : seal::JobKey::NewKeyPair();
    // Sessions run on every sealed DEALER, whether or not this van
    // receives.
    session_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "ps-van-session");
      SessionLoop();
    });
  }
}

std::string Van::scheduler_wire_key() const {
  return job_key_ == nullptr ? std::string() : job_key_->SchedulerKeyPair().pub;
}

std::string Van::DescribeConnection(const std::string& routing_id,
                                    const std::string& address) {
  bool printable = !routing_id.empty() && routing_id.size() <= 64 &&
                   std::all_of(routing_id.begin(), routing_id.end(),
                               [](char c) { return c >= 0x21 && c < 0x7f; });
  std::string name;
  if (printable) {
    name = "'" + routing_id + "'";
  } else {
    static const char kHex[] = "0123456789abcdef";
    name = "0x";
    for (size_t i = 0; i < routing_id.size() && i < 16; ++i) {
      unsigned char c = static_cast<unsigned char>(routing_id[i]);
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
    if (routing_id.size() > 16) name += "...";
  }
  if (routing_id.empty()) name = "(no routing id)";
  return "connection " + name + (address.empty() ? "" : " from " + address);
}

Van::~Van() {
  Stop(0);
  zmq_ctx_term(context_);
}

Status Van::Bind(const std::string& host, int port, int range_lo,
                 int range_hi) {
  CHECK(router_ == nullptr) << "Bind() twice";
  router_ = zmq_socket(context_, ZMQ_ROUTER);
  CHECK(router_ != nullptr) << ZmqError();
  SetIntOption(router_, ZMQ_RCVHWM, options_.water_mark);
  SetIntOption(router_, ZMQ_LINGER, 0);
  SetIntOption(router_, ZMQ_HANDSHAKE_IVL, options_.handshake_timeout_ms);
  SetHeartbeats(router_);
  // A sealed frame is larger than its plaintext (seal::SealedBytes).
  int64_t max_bytes = options_.max_message_bytes;
  if (!options_.secret_key.empty()) {
    max_bytes =
        static_cast<int64_t>(seal::SealedBytes(static_cast<size_t>(max_bytes)));
  }
  // What a message may hold in all: sealed, each frame adds a sequence
  // number and at most one tag more than the limit's own chunks.
  max_received_bytes_ =
      options_.secret_key.empty()
          ? options_.max_message_bytes
          : max_bytes + static_cast<int64_t>(
                            kMaxParts * (seal::kSeqBytes + seal::kTagBytes));
  CHECK_EQ(
      zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes)), 0)
      << ZmqError();
  // The ZAP handler and the guard of idle connections (van_auth.cc) must
  // exist before the first connection.
  if (!auth_.joinable()) StartAuth();
  if (!options_.secret_key.empty()) {
    SetIntOption(router_, ZMQ_PLAIN_SERVER, 1);
    SetStringOption(router_, ZMQ_ZAP_DOMAIN, kZapDomain);
  }
  std::string iface = IsNumericIPv4(host) ? host : "*";
  std::vector<int> candidates;
  if (port != 0 || range_lo == 0) {
    candidates.push_back(port);
  } else {
    for (int p = range_lo; p <= range_hi; ++p) candidates.push_back(p);
  }
  std::string last_error;
  for (int p : candidates) {
    std::string endpoint = "tcp://" + iface + ":" +
                           (p == 0 ? std::string("*") : std::to_string(p));
    if (zmq_bind(router_, endpoint.c_str()) == 0) {
      char buf[256];
      size_t len = sizeof(buf);
      CHECK_EQ(zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, buf, &len), 0);
      std::string bound(buf);
      port_ = std::stoi(bound.substr(bound.rfind(':') + 1));
      return Status::OK();
    }
    last_error = ZmqError();
  }
  zmq_close(router_);
  router_ = nullptr;
  if (candidates.size() == 1) {
    return Status::Unavailable("cannot bind port " +
                               std::to_string(candidates[0]) + " on " + iface +
                               ": " + last_error);
  }
  return Status::Unavailable("no free port in PS_PORT_RANGE " +
                             std::to_string(range_lo) + "-" +
                             std::to_string(range_hi) + " on " + iface +
                             " (last error: " + last_error + ")");
}

void Van::Start(Handler handler) {
  CHECK(router_ != nullptr) << "Start() before a successful Bind()";
  handler_ = std::move(handler);
  receiver_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ps-van-recv");
    ReceiveLoop();
  });
}

void Van::Stop(int linger_ms) {
  if (stopped_) return;
  stopped_ = true;
  stop_session_.store(true);
  if (session_.joinable()) session_.join();
  routes_.Update([linger_ms](Routes& routes) {
    for (auto& [id, peer] : routes.peers) {
      MutexLock peer_lock(&peer->mu);
      SetIntOption(peer->socket, ZMQ_LINGER, linger_ms);
    }
    routes.peers.clear();  // sockets close once in-flight sends drop theirs
  });
  zmq_ctx_shutdown(context_);  // wakes the receive thread with ETERM
  if (auth_.joinable()) auth_.join();
  stopped_watch_.store(true);
  if (watcher_.joinable()) {
    // A lost handler that ends the process may stop the van from there.
    if (watcher_.get_id() == std::this_thread::get_id()) {
      watcher_.detach();
    } else {
      watcher_.join();
    }
  }
  if (receiver_.joinable() &&
      receiver_.get_id() == std::this_thread::get_id()) {
    // Stopped from a handler on the receive thread (e.g. exit() there runs
    // the node's destructor): this thread owns the ROUTER, so it closes it,
    // and never returns to the loop.
    receiver_.detach();
    zmq_close(router_);
  } else if (receiver_.joinable()) {
    receiver_.join();
  } else if (router_ != nullptr) {
    zmq_close(router_);
  }
  router_ = nullptr;
}

void Van::SetHeartbeats(void* socket) const {
  if (options_.heartbeat_interval_ms <= 0) return;
  SetIntOption(socket, ZMQ_HEARTBEAT_IVL, options_.heartbeat_interval_ms);
  SetIntOption(socket, ZMQ_HEARTBEAT_TIMEOUT, options_.heartbeat_timeout_ms);
}

Status Van::Connect(int id, const std::string& host, int port,
                    const std::string& wire_key, bool watch) {
  std::optional<seal::JobKey::Hello> hello;
  if (job_key_ != nullptr) {
    StatusOr<seal::JobKey::Hello> made = job_key_->MakeHello(wire_key);
    if (!made.ok()) {
      return Status::InvalidArgument(
          "node " + std::to_string(id) + " at " + host + ":" +
          std::to_string(port) +
          " gave no usable key: " + made.status().message());
    }
    hello = std::move(made).value();
  }
  auto peer = std::make_shared<Peer>();
  peer->address = "tcp://" + host + ":" + std::to_string(port);
  peer->sealed = hello.has_value();
  peer->peer_key = wire_key;
  // Not shared yet; the lock only tells the analysis who owns `socket`.
  MutexLock peer_lock(&peer->mu);
  peer->socket = zmq_socket(context_, ZMQ_DEALER);
  void* socket = peer->socket;
  if (socket == nullptr) return Status::Internal(ZmqError());
  SetIntOption(socket, ZMQ_SNDHWM, 0);  // see VanOptions::water_mark
  SetIntOption(socket, ZMQ_LINGER, 0);
  SetIntOption(socket, ZMQ_HANDSHAKE_IVL, options_.handshake_timeout_ms);
  SetHeartbeats(socket);
  if (hello) {
    // The token proves the job's key to the peer's ZAP handler before any
    // message is read; the session's HELLO then agrees the keys.
    SetStringOption(socket, ZMQ_PLAIN_USERNAME, seal::kUserName);
    SetStringOption(socket, ZMQ_PLAIN_PASSWORD, seal::ToHex(hello->token));
    size_t len = sizeof(peer->fd);
    CHECK_EQ(zmq_getsockopt(socket, ZMQ_FD, &peer->fd, &len), 0) << ZmqError();
  }
  if (!identity_.empty()) {
    zmq_setsockopt(socket, ZMQ_ROUTING_ID, identity_.data(), identity_.size());
  }
  if (zmq_connect(socket, peer->address.c_str()) != 0) {
    return Status::Unavailable("cannot connect to " + peer->address + ": " +
                               ZmqError());
  }
  if (hello) PS_RETURN_IF_ERROR(OfferLocked(peer.get(), /*again=*/false));
  if (watch && watch_grace_ms_ > 0 &&
      (watch_only_id_ < 0 || id == watch_only_id_)) {
    Watch(peer, socket);
  }
  peer_lock.Unlock();
  routes_.Update([id, &peer](Routes& routes) { routes.peers[id] = peer; });
  return Status::OK();
}

void Van::Rekey(int old_id, int new_id) {
  routes_.Update([old_id, new_id](Routes& routes) {
    auto it = routes.peers.find(old_id);
    if (it == routes.peers.end()) return;
    std::shared_ptr<Peer> peer = std::move(it->second);
    routes.peers.erase(it);
    routes.peers[new_id] = std::move(peer);
  });
}

void Van::Disconnect(int id) {
  routes_.Update([id](Routes& routes) {
    routes.peers.erase(id);
    routes.send_references.erase(id);
    auto identity = routes.accept_identity.find(id);
    if (identity != routes.accept_identity.end()) {
      routes.accept_pid.erase(identity->second);
      routes.accept_identity.erase(identity);
    }
  });
}

void Van::SendReferencesTo(int id) {
  routes_.Update([id](Routes& routes) { routes.send_references.insert(id); });
}

void Van::AcceptReferencesFrom(int id, const std::string& identity, int pid) {
  routes_.Update([&](Routes& routes) {
    routes.accept_pid[identity] = pid;
    routes.accept_identity[id] = identity;
  });
}

bool Van::IsConnected(int id) const {
  std::shared_ptr<const Routes> routes = routes_.Load();
  return routes->peers.count(id) > 0;
}

bool Van::SharesMemoryWith(int id) const {
  std::shared_ptr<const Routes> routes = routes_.Load();
  return routes->send_references.count(id) > 0;
}

bool Van::FindShared(const void* data, size_t bytes, pb::SharedRef* ref) const {
  return shared_memory_->Find(data, bytes, ref);
}

StatusOr<SArray<char>> Van::ResolveShared(const pb::SharedRef& ref,
                                          size_t bytes) const {
  return shared_memory_->Resolve(ref, bytes);
}

Status Van::Send(Message* msg) {
  std::shared_ptr<Peer> peer;
  bool references = false;
  {
    // Lock-free: the routing table as it is now (see Routes).
    std::shared_ptr<const Routes> routes = routes_.Load();
    auto it = routes->peers.find(msg->meta.recver());
    if (it != routes->peers.end()) peer = it->second;
    references = routes->send_references.count(msg->meta.recver()) > 0;
  }
  if (peer == nullptr) {
    return Status::Unavailable("no connection to node id " +
                               std::to_string(msg->meta.recver()));
  }
  size_t n = msg->data.size();
  std::vector<bool> by_ref(n);
  // Bytes in regions made for this message alone (SharedRef.once): copies
  // of the caller's, counted against the limit as if they were sent.
  int64_t once_bytes = 0;
  msg->meta.clear_shared();
  if (references) {
    for (size_t i = 0; i < n; ++i) {
      const SArray<char>& frame = msg->data[i];
      pb::SharedRef ref;
      if (frame.size() <= kInlineFrameBytes ||
          !FindShared(frame.data(), frame.size(), &ref)) {
        continue;
      }
      ref.set_frame(static_cast<int>(i));
      if (ref.once()) once_bytes += static_cast<int64_t>(frame.size());
      *msg->meta.add_shared() = ref;
      by_ref[i] = true;
    }
  } else {
    msg->meta.clear_reply_into();
  }
  std::string header = EncodeHeader(msg);
  // The receiver refuses (and disconnects) what exceeds the limit: say so
  // here, where the caller can still be told.
  int64_t total = static_cast<int64_t>(header.size()) + once_bytes;
  for (size_t i = 0; i < n; ++i) {
    if (!by_ref[i]) total += static_cast<int64_t>(msg->data[i].size());
  }
  if (total > options_.max_message_bytes) {
    return Status::InvalidArgument(
        "a message of " + std::to_string(total) + " bytes to " + peer->address +
        " is larger than PS_MAX_MESSAGE_BYTES (" +
        std::to_string(options_.max_message_bytes) +
        "): raise it on every node, or send less per request");
  }
  MutexLock lock(&peer->mu);
  if (peer->sealed) {
    // Kept until the receiver took it; sent now if the session is open,
    // else when it opens.
    OutStream::Item kept{std::move(header), {}, std::move(by_ref), {}};
    kept.msg.data = msg->data;  // shared, not copied
    OutStream::Item* item = peer->out.Add(std::move(kept));
    if (peer->out.state() == OutStream::State::kOpen) {
      Status st = TransmitLocked(peer.get(), item);
      if (!st.ok()) peer->out.Unadd();
      return st;
    }
    int events = 0;
    size_t len = sizeof(events);
    zmq_getsockopt(peer->socket, ZMQ_EVENTS, &events, &len);
    if ((events & ZMQ_POLLOUT) == 0) {
      // No connection at all: the peer refused our handshake for good.
      peer->out.Unadd();
      errno = EAGAIN;
      return Status::Unavailable(SendError(peer->address));
    }
    if ((events & ZMQ_POLLIN) != 0) DrainLocked(peer.get());
    return Status::OK();
  }
  OutParts parts(n);
  for (size_t i = 0; i < n; ++i) {
    const SArray<char>& frame = msg->data[i];
    const size_t size = by_ref[i] ? 0 : frame.size();  // a reference: none
    if (by_ref[i]) num_shared_sent_.fetch_add(1);
    // ZeroMQ stores frames this small inside zmq_msg_t itself; handing them
    // over by reference would cost a heap block instead of a copy of a few
    // bytes. Anything larger goes without a copy.
    void* small = size <= kInlineFrameBytes ? parts.Add(size) : nullptr;
    if (small != nullptr) {
      if (size > 0) std::memcpy(small, frame.data(), size);
    } else if (size <= kInlineFrameBytes || !parts.AddFrame(frame)) {
      return Status::Unavailable("send to " + peer->address +
                                 ": no memory for a frame of " +
                                 std::to_string(size) + " bytes");
    }
  }
  if (!parts.Send(peer->socket, header)) {
    return Status::Unavailable(SendError(peer->address));
  }
  return Status::OK();
}

Status Van::SendSealed(seal::Sealer* sealer, void* socket,
                       const std::string& address, const std::string& header,
                       const Message& msg, const std::vector<bool>& by_ref,
                       uint64_t* last) {
  const size_t n = msg.data.size();
  const auto frames = static_cast<uint32_t>(n + 1);
  auto size_of = [&](uint32_t i) -> size_t {
    if (i == 0) return header.size();
    return by_ref[i - 1] ? 0 : msg.data[i - 1].size();  // a reference: none
  };
  size_t chunks = 0, data_bytes = 0;
  for (uint32_t i = 0; i < frames; ++i) {
    chunks += seal::Chunks(size_of(i));
    if (i > 0) data_bytes += size_of(i);
  }
  const bool streamed = n > 0 && data_bytes >= seal::kStreamBytes;
  auto no_memory = [&](size_t bytes) {
    return Status::Unavailable("send to " + address + ": no memory to seal " +
                               std::to_string(bytes) + " bytes");
  };
  auto refused = [&] { return Status::Unavailable(SendError(address)); };
  // Every frame, the header's too, is sealed in the order of its sequence
  // numbers (hence under the peer's lock). A streamed message's header is
  // sealed as a message of one frame.
  uint64_t seq = sealer->Begin(chunks);
  *last = seq + chunks - 1;
  std::string sealed(seal::SealedBytes(header.size()), '\0');
  sealer->Seal(seq, 0, streamed ? 1 : frames, header.data(), header.size(),
               &sealed[0]);
  seq += seal::Chunks(header.size());
  for (size_t i = 0; i < n; ++i) {
    if (by_ref[i]) num_shared_sent_.fetch_add(1);
  }
  if (!streamed) {
    // Each frame sealed whole, a part of one message.
    OutParts parts(n);
    for (uint32_t i = 1; i < frames; ++i) {
      const size_t size = size_of(i);
      void* out = parts.Add(seal::SealedBytes(size));
      if (out == nullptr) return no_memory(size);
      sealer->Seal(seq, i, frames, msg.data[i - 1].data(), size, out);
      seq += seal::Chunks(size);
    }
    return parts.Send(socket, sealed) ? Status::OK() : refused();
  }
  // Streamed: the header alone, then each chunk of each data frame a record,
  // a ZeroMQ message of its own, which ZeroMQ's I/O thread sends while this
  // thread seals the next. One that is not sent ends the message: the
  // receiver drops it as cut short.
  if (!OutParts(0).Send(socket, sealed)) return refused();
  for (uint32_t i = 1; i < frames; ++i) {
    const char* data = msg.data[i - 1].data();
    const size_t size = size_of(i);
    const auto records = static_cast<uint32_t>(seal::Chunks(size));
    for (uint32_t c = 0; c < records; ++c) {
      const size_t bytes = seal::ChunkBytes(size, c);
      zmq_msg_t record;
      if (zmq_msg_init_size(&record,
                            seal::kSeqBytes + bytes + seal::kTagBytes) != 0) {
        return no_memory(bytes);
      }
      sealer->SealChunk(seq++, i, frames, c, records,
                        data + c * seal::kChunkBytes, bytes,
                        zmq_msg_data(&record));
      if (zmq_msg_send(&record, socket, kSendFlags) < 0) {
        Status st = refused();  // reads errno: before the close
        zmq_msg_close(&record);
        return st;
      }
    }
  }
  return Status::OK();
}

void Van::CountDropped(const std::string& from, const std::string& why) {
  num_dropped_.fetch_add(1);
  if (options_.metrics) options_.metrics->Refused(ClassifyRefusal(why));
  Report("dropped a message from " + from + ": " + why);
}

void Van::Report(const std::string& line) {
  std::string text;
  {
    MutexLock lock(&report_mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - report_window_ >= kReportWindow) {
      if (suppressed_ > 0) {
        text = "(" + std::to_string(suppressed_) +
               " more such reports in the last window were not shown) ";
      }
      report_window_ = now;
      reported_in_window_ = 0;
      suppressed_ = 0;
    }
    if (reported_in_window_ >= kReportsPerWindow) {
      ++suppressed_;
      return;
    }
    ++reported_in_window_;
  }
  text += line;
  // A peer's bytes must not reach a terminal as they are.
  for (char& c : text) {
    if (c < 0x20 || c == 0x7f) c = '?';
  }
  LOG(WARNING) << text;
  // Where glog would put warnings only in its files, say it on stderr too:
  // that is where the person running the job looks.
  if (!FLAGS_logtostderr && !FLAGS_alsologtostderr &&
      FLAGS_stderrthreshold > google::GLOG_WARNING) {
    std::fprintf(stderr, "ps: %s\n", text.c_str());
  }
}

void Van::ReceiveLoop() {
  // router_ is gone when a handler stopped the van from this thread.
  while (router_ != nullptr && ReceiveOne()) {
  }
  if (router_ != nullptr) zmq_close(router_);
}

bool Van::ReceiveOne() {
  // Frame 0: the sender's routing id (ROUTER), then the header, then data.
  // Each frame is at most max_message_bytes (ZeroMQ refuses larger ones);
  // parts beyond kMaxParts and bytes beyond max_message_bytes are read and
  // let go at once, never kept.
  std::vector<std::shared_ptr<RecvFrame>> parts;
  size_t extra_parts = 0;
  int64_t bytes = 0;
  while (true) {
    auto part = std::make_shared<RecvFrame>();
    if (zmq_msg_recv(&part->msg, router_, 0) < 0) {
      if (zmq_errno() == ETERM) return false;
      if (zmq_errno() == EINTR) continue;
      LOG(WARNING) << "receive failed: " << ZmqError();
      return true;
    }
    bool more = zmq_msg_more(&part->msg) != 0;
    bytes += static_cast<int64_t>(zmq_msg_size(&part->msg));
    if (parts.size() < kMaxParts && bytes <= max_received_bytes_) {
      parts.push_back(std::move(part));
    } else {
      ++extra_parts;
    }
    if (!more) break;
  }
  std::string from = FrameString(&parts[0]->msg);
  std::string address;
  if (parts.size() >= 2) {
    const char* a = zmq_msg_gets(&parts[1]->msg, "Peer-Address");
    if (a != nullptr) address = a;
  }
  if (extra_parts > 0) {
    CountDropped(DescribeConnection(from, address),
                 "more than " + std::to_string(kMaxParts - 1) + " frames or " +
                     std::to_string(options_.max_message_bytes) +
                     " bytes (PS_MAX_MESSAGE_BYTES) in one message");
    return true;
  }
  if (parts.size() < 2) {
    CountDropped(DescribeConnection(from, address), "no header frame");
    return true;
  }
  if (job_key_ != nullptr) {
    ReceiveSealed(parts, from, address);
    return true;
  }
  std::vector<SArray<char>> frames;
  for (size_t i = 2; i < parts.size(); ++i) {
    frames.push_back(Adopt(parts[i],
                           static_cast<char*>(zmq_msg_data(&parts[i]->msg)),
                           zmq_msg_size(&parts[i]->msg)));
  }
  StatusOr<Message> msg =
      Decode(static_cast<const char*>(zmq_msg_data(&parts[1]->msg)),
             zmq_msg_size(&parts[1]->msg), std::move(frames), SharedPid(from));
  Deliver(std::move(msg), std::move(from), std::move(address));
  return true;
}

SArray<char> Van::Adopt(const std::shared_ptr<RecvFrame>& part, char* data,
                        size_t bytes) {
  std::shared_ptr<RecvFrame> holder = part;
  return SArray<char>(data, bytes, [holder](char*) {});
}

std::function<int(int)> Van::SharedPid(const std::string& from) const {
  return [this, from](int) {
    // By the connection, not by the sender the header claims.
    std::shared_ptr<const Routes> routes = routes_.Load();
    auto it = routes->accept_pid.find(from);
    return it == routes->accept_pid.end() ? 0 : it->second;
  };
}

void Van::Deliver(StatusOr<Message> msg, std::string from,
                  std::string address) {
  if (!msg.ok()) {
    CountDropped(DescribeConnection(from, address), msg.status().message());
    return;
  }
  msg->from = std::move(from);
  msg->peer_address = std::move(address);
  num_shared_received_.fetch_add(msg->meta.shared_size());
  handler_(std::move(msg).value());
}

void Van::ReceiveSealed(const std::vector<std::shared_ptr<RecvFrame>>& parts,
                        const std::string& from, const std::string& address) {
  // The User-Id is the token the ZAP handler admitted (lower-case hex); with
  // the routing id it names the connection, however ZeroMQ connects again.
  const char* user_id = zmq_msg_gets(&parts[1]->msg, "User-Id");
  const std::string key = from + '\0' + (user_id == nullptr ? "" : user_id);
  auto drop = [&](const std::string& why) {
    CountDropped(DescribeConnection(from, address), why);
  };
  zmq_msg_t* first = &parts[1]->msg;
  char* data = static_cast<char*>(zmq_msg_data(first));
  const size_t size = zmq_msg_size(first);
  if (parts.size() == 2 && size == seal::kHelloBytes &&
      std::memcmp(data, seal::kHelloMagic, 8) == 0) {
    OnHello(key, std::string(data, size), from, address);
    return;
  }
  auto it = inbound_.find(key);
  Inbound* in = it == inbound_.end() ? nullptr : &it->second;
  const uint64_t seq = seal::Opener::SeqOf(data, size);
  if (in != nullptr && in->pending && seq == 1) {
    // The first message of the session offered last: if it opens, that
    // session is confirmed, and the one before it is let go.
    std::vector<seal::Opener::Frame> frames;
    for (size_t i = 1; i < parts.size(); ++i) {
      frames.push_back({static_cast<char*>(zmq_msg_data(&parts[i]->msg)),
                        zmq_msg_size(&parts[i]->msg)});
    }
    Status opened = in->pending->opener->Open(frames.data(), frames.size());
    if (!opened.ok()) {
      drop("sealed frames refused: " + opened.message());
      return;
    }
    in->open = std::move(in->pending);
    in->pending.reset();
    in->frozen = false;
    in->stream.reset();
    DeliverOpened(in, parts, frames, from, address);
    return;
  }
  if (in == nullptr || !in->open) {
    drop("sealed frames on a connection without a session (no HELLO)");
    Answer(from, "?");
    return;
  }
  Inbound::Session& session = *in->open;
  if (in->frozen) {
    // The sender's next session lost its first message, or a replayed HELLO
    // stopped this one: either way the sender offers a new session, which
    // the WELCOME's quote decides.
    drop("sealed frames of a session replaced by a new HELLO");
    Answer(from, "?");
    return;
  }
  if (in->stream && parts.size() == 2 && session.opener->IsNext(data, size)) {
    // The next record of the streamed message this connection is sending;
    // one that does not open is dropped alone, and the stream waits on.
    Status took = TakeRecord(in, data, size);
    if (!took.ok()) {
      drop("a record refused: " + took.message());
    } else if (in->stream->frame == in->stream->bytes.size()) {
      Inbound::Stream done = std::move(*in->stream);
      in->stream.reset();
      uint64_t bytes = 0;
      for (size_t b : done.bytes) bytes += b;
      Took(from, &session, bytes);
      Deliver(
          Decode(std::move(done.meta), std::move(done.frames), SharedPid(from)),
          from, address);
    }
    return;
  }
  if (seq != session.opener->last() + 1) {
    // A message missing (a gap), or one taken already (a repeat or a
    // reorder): refused, and the sender told to start a new session, in
    // which it sends again what this one did not take.
    drop(std::string(seq <= session.opener->last() ? "a repeat or reorder"
                                                   : "a gap") +
         " in the sealed stream: message numbered " + std::to_string(seq) +
         ", expected " + std::to_string(session.opener->last() + 1) +
         " (the last taken whole: " + std::to_string(session.taken) +
         "); the sender is told to reset");
    AnswerSession(from, &session, 'R');
    return;
  }
  std::vector<seal::Opener::Frame> frames;
  for (size_t i = 1; i < parts.size(); ++i) {
    frames.push_back({static_cast<char*>(zmq_msg_data(&parts[i]->msg)),
                      zmq_msg_size(&parts[i]->msg)});
  }
  Status opened = session.opener->Open(frames.data(), frames.size());
  if (!opened.ok()) {
    drop("sealed frames refused: " + opened.message());
    return;
  }
  DeliverOpened(in, parts, frames, from, address);
}

void Van::DeliverOpened(Inbound* in,
                        const std::vector<std::shared_ptr<RecvFrame>>& parts,
                        const std::vector<seal::Opener::Frame>& frames,
                        const std::string& from, const std::string& address) {
  Inbound::Session& session = *in->open;
  auto drop = [&](const std::string& why) {
    CountDropped(DescribeConnection(from, address), why);
  };
  if (parts.size() == 2 && frames[0].bytes == 0) {
    // A probe: the sender asks what was taken.
    session.taken = session.opener->last();
    AnswerSession(from, &session, 'A');
    return;
  }
  if (parts.size() == 2) {
    // The header alone: a message without data frames, or a streamed one.
    pb::Meta meta;
    if (frames[0].bytes > static_cast<size_t>(INT32_MAX) ||
        !meta.ParseFromArray(frames[0].data,
                             static_cast<int>(frames[0].bytes))) {
      Took(from, &session, frames[0].bytes);
      drop("header of " + std::to_string(frames[0].bytes) +
           " bytes does not parse");
      return;
    }
    StatusOr<bool> streamed = StartStream(in, &meta);
    if (!streamed.ok()) {
      Took(from, &session, frames[0].bytes);
      drop(streamed.status().message());
      return;
    }
    if (*streamed) return;
    Took(from, &session, frames[0].bytes);
    Deliver(Decode(std::move(meta), {}, SharedPid(from)), from, address);
    return;
  }
  std::vector<SArray<char>> data;
  uint64_t bytes = frames[0].bytes;
  for (size_t i = 2; i < parts.size(); ++i) {
    data.push_back(Adopt(parts[i], frames[i - 1].data, frames[i - 1].bytes));
    bytes += frames[i - 1].bytes;
  }
  Took(from, &session, bytes);
  Deliver(
      Decode(frames[0].data, frames[0].bytes, std::move(data), SharedPid(from)),
      from, address);
}

StatusOr<bool> Van::StartStream(Inbound* in, pb::Meta* meta) {
  StatusOr<std::vector<size_t>> wire =
      StreamedFrames(*meta, seal::kStreamBytes, kMaxParts - 1,
                     static_cast<uint64_t>(options_.max_message_bytes));
  if (!wire.ok()) return wire.status();
  if (wire->empty()) return false;
  // A stream whose sender went away mid-way (a crash, a lost connection
  // that came back under a new key) would keep its frames: let them go.
  const auto now = std::chrono::steady_clock::now();
  for (auto& [key, other] : inbound_) {
    if (other.stream && now - other.stream->last > kStreamIdle) {
      other.stream.reset();
      CountDropped("a connection that went quiet",
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

Status Van::TakeRecord(Inbound* in, char* record, size_t bytes) {
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

}  // namespace ps
