// Van: ZeroMQ ROUTER/DEALER transport with zero-copy frames.
#include "van/van.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "van/codec.h"
#include "van/shm.h"

namespace ps {

namespace {

// ZeroMQ's "very small message" capacity (ZMQ_MAX_VSM_SIZE, 33 on 64-bit).
constexpr size_t kInlineFrameBytes = 32;

std::string ZmqError() { return zmq_strerror(zmq_errno()); }

bool IsNumericIPv4(const std::string& host) {
  in_addr addr;
  return inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

// A received frame, kept alive by every SArray pointing into it.
struct RecvFrame {
  zmq_msg_t msg;
  RecvFrame() { zmq_msg_init(&msg); }
  ~RecvFrame() { zmq_msg_close(&msg); }
  RecvFrame(const RecvFrame&) = delete;
  RecvFrame& operator=(const RecvFrame&) = delete;
};

// ZeroMQ's free function for a zero-copy frame: drops the SArray reference.
void ReleaseFrame(void* /*data*/, void* hint) {
  std::unique_ptr<SArray<char>> owner(static_cast<SArray<char>*>(hint));
}

void SetIntOption(void* socket, int option, int value) {
  CHECK_EQ(zmq_setsockopt(socket, option, &value, sizeof(value)), 0)
      << ZmqError();
}

void SetStringOption(void* socket, int option, const std::string& value) {
  CHECK_EQ(zmq_setsockopt(socket, option, value.data(), value.size()), 0)
      << ZmqError();
}

// ZeroMQ's ZAP endpoint (RFC 27): one per context, so one per Van.
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapDomain[] = "ps";
constexpr int kHandshakeFailures = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
// Drop reports: at most this many lines per window; the rest are counted.
constexpr int kReportsPerWindow = 5;
constexpr auto kReportWindow = std::chrono::seconds(10);
// A message has a header and at most a few data frames (keys, values,
// lens); anything with more parts is malformed, and its extra parts are
// read and discarded rather than kept.
constexpr size_t kMaxParts = 16;

std::string FrameString(zmq_msg_t* msg) {
  return std::string(static_cast<const char*>(zmq_msg_data(msg)),
                     zmq_msg_size(msg));
}

}  // namespace

struct Van::Peer {
  Mutex mu;  // serialises use of `socket` across threads
  void* socket GUARDED_BY(mu) = nullptr;
  std::string address;
  ~Peer() {
    if (socket != nullptr) zmq_close(socket);
  }
};

Van::Van(const VanOptions& options)
    : options_(options), context_(zmq_ctx_new()) {
  CHECK(context_ != nullptr);
  if (!options_.secret_key.empty()) {
    char pub[41];
    CHECK_EQ(zmq_curve_public(pub, options_.secret_key.c_str()), 0)
        << "not a CurveZMQ secret key: " << ZmqError();
    public_key_ = pub;
  }
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
  SetHeartbeats(router_);
  int64_t max_bytes = options_.max_message_bytes;
  CHECK_EQ(
      zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes)), 0)
      << ZmqError();
  if (!options_.secret_key.empty()) {
    // The ZAP handler must exist before the first handshake.
    if (!auth_.joinable()) StartAuth();
    SetIntOption(router_, ZMQ_CURVE_SERVER, 1);
    SetStringOption(router_, ZMQ_CURVE_SECRETKEY, options_.secret_key);
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
  {
    MutexLock lock(&peers_mu_);
    for (auto& [id, peer] : peers_) {
      MutexLock peer_lock(&peer->mu);
      SetIntOption(peer->socket, ZMQ_LINGER, linger_ms);
    }
    peers_.clear();  // sockets close once in-flight sends drop their refs
  }
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

Status Van::Connect(int id, const std::string& host, int port) {
  auto peer = std::make_shared<Peer>();
  peer->address = "tcp://" + host + ":" + std::to_string(port);
  // Not shared yet; the lock only tells the analysis who owns `socket`.
  MutexLock peer_lock(&peer->mu);
  peer->socket = zmq_socket(context_, ZMQ_DEALER);
  void* socket = peer->socket;
  if (socket == nullptr) return Status::Internal(ZmqError());
  SetIntOption(socket, ZMQ_SNDHWM, 0);  // see VanOptions::water_mark
  SetIntOption(socket, ZMQ_LINGER, 0);
  SetHeartbeats(socket);
  if (!options_.secret_key.empty()) {
    // Every node holds the job's key pair: the server key is the job's
    // public key, and the ZAP handler there admits only that client key.
    SetStringOption(socket, ZMQ_CURVE_SERVERKEY, public_key_);
    SetStringOption(socket, ZMQ_CURVE_PUBLICKEY, public_key_);
    SetStringOption(socket, ZMQ_CURVE_SECRETKEY, options_.secret_key);
  }
  if (!identity_.empty()) {
    zmq_setsockopt(socket, ZMQ_ROUTING_ID, identity_.data(), identity_.size());
  }
  if (zmq_connect(socket, peer->address.c_str()) != 0) {
    return Status::Unavailable("cannot connect to " + peer->address + ": " +
                               ZmqError());
  }
  if (watch_grace_ms_ > 0 && (watch_only_id_ < 0 || id == watch_only_id_)) {
    Watch(peer, socket);
  }
  peer_lock.Unlock();
  MutexLock lock(&peers_mu_);
  peers_[id] = std::move(peer);
  return Status::OK();
}

void Van::WatchConnections(int grace_ms, LostHandler lost, int only_id,
                           RegainedHandler regained) {
  CHECK(!watcher_.joinable()) << "WatchConnections() twice";
  CHECK_GT(grace_ms, 0);
  watch_grace_ms_ = grace_ms;
  watch_only_id_ = only_id;
  lost_ = std::move(lost);
  regained_ = std::move(regained);
  watcher_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ps-van-watch");
    WatchLoop();
  });
}

void Van::Watch(const std::shared_ptr<Peer>& peer, void* socket) {
  MutexLock lock(&watch_mu_);
  std::string endpoint = "inproc://ps-watch-" +
                         std::to_string(reinterpret_cast<uintptr_t>(this)) +
                         "-" + std::to_string(num_watches_++);
  CHECK_EQ(zmq_socket_monitor(socket, endpoint.c_str(),
                              ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED),
           0)
      << ZmqError();
  void* monitor = zmq_socket(context_, ZMQ_PAIR);
  CHECK(monitor != nullptr) << ZmqError();
  CHECK_EQ(zmq_connect(monitor, endpoint.c_str()), 0) << ZmqError();
  Watched w;
  w.peer = peer;
  w.monitor = monitor;
  new_watches_.push_back(w);
}

void Van::WatchLoop() {
  constexpr int kPollMs = 50;
  std::vector<Watched> watched;
  std::vector<zmq_pollitem_t> items;
  while (true) {
    {
      MutexLock lock(&watch_mu_);
      for (Watched& w : new_watches_) watched.push_back(w);
      new_watches_.clear();
    }
    items.clear();
    for (const Watched& w : watched) {
      items.push_back({w.monitor, 0, ZMQ_POLLIN, 0});
    }
    // Without connections to watch, the poll only waits out kPollMs.
    if (zmq_poll(items.data(), static_cast<int>(items.size()), kPollMs) < 0) {
      if (zmq_errno() == EINTR) continue;
      CHECK_EQ(zmq_errno(), ETERM) << "watch thread: " << ZmqError();
      break;
    }
    if (stopped_watch_.load()) break;
    auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<std::shared_ptr<Peer>, std::string>> lost;
    std::vector<std::shared_ptr<Peer>> regained;
    for (size_t i = 0; i < watched.size(); ++i) {
      Watched& w = watched[i];
      if (items[i].revents & ZMQ_POLLIN) {
        // Frame 1: (uint16 event, uint32 value); frame 2: the endpoint.
        zmq_msg_t part;
        zmq_msg_init(&part);
        uint16_t event = 0;
        if (zmq_msg_recv(&part, w.monitor, ZMQ_DONTWAIT) >= 6) {
          std::memcpy(&event, zmq_msg_data(&part), sizeof(event));
        }
        while (zmq_msg_more(&part)) {
          if (zmq_msg_recv(&part, w.monitor, 0) < 0) break;
        }
        zmq_msg_close(&part);
        if (event == ZMQ_EVENT_DISCONNECTED && !w.down) {
          w.down = true;
          w.down_since = now;
        } else if (event == ZMQ_EVENT_CONNECTED) {
          // Made again (a restarted peer at the same address): a later
          // loss is a new one.
          if (w.down || w.reported) {
            if (std::shared_ptr<Peer> p = w.peer.lock()) regained.push_back(p);
          }
          w.down = false;
          w.reported = false;
        }
      }
      std::shared_ptr<Peer> peer = w.peer.lock();
      if (peer && w.down && !w.reported &&
          now - w.down_since > std::chrono::milliseconds(watch_grace_ms_)) {
        w.reported = true;
        lost.emplace_back(peer, peer->address);
      }
    }
    // Forget the monitors of closed DEALERs (replaced or disconnected).
    for (size_t i = watched.size(); i-- > 0;) {
      if (!watched[i].peer.expired()) continue;
      zmq_close(watched[i].monitor);
      watched.erase(watched.begin() + static_cast<long>(i));
    }
    auto id_of = [this](const std::shared_ptr<Peer>& peer) {
      MutexLock lock(&peers_mu_);
      for (const auto& [peer_id, p] : peers_) {
        if (p == peer) return peer_id;
      }
      return -1;  // no longer a peer
    };
    for (const auto& peer : regained) {
      const int id = id_of(peer);
      if (id >= 0 && regained_) regained_(id);
    }
    for (const auto& [peer, address] : lost) {
      const int id = id_of(peer);
      if (id < 0) continue;  // no longer a peer
      lost_(id, "its connection (" + address +
                    ") closed and could not be "
                    "made again within " +
                    std::to_string(watch_grace_ms_) +
                    " ms: its process is gone");
    }
  }
  for (Watched& w : watched) zmq_close(w.monitor);
  MutexLock lock(&watch_mu_);
  for (Watched& w : new_watches_) zmq_close(w.monitor);
  new_watches_.clear();
}

void Van::Rekey(int old_id, int new_id) {
  MutexLock lock(&peers_mu_);
  auto it = peers_.find(old_id);
  if (it == peers_.end()) return;
  peers_[new_id] = std::move(it->second);
  peers_.erase(old_id);
}

void Van::Disconnect(int id) {
  MutexLock lock(&peers_mu_);
  peers_.erase(id);
  send_references_.erase(id);
  auto identity = accept_identity_.find(id);
  if (identity != accept_identity_.end()) {
    accept_pid_.erase(identity->second);
    accept_identity_.erase(identity);
  }
}

void Van::SendReferencesTo(int id) {
  MutexLock lock(&peers_mu_);
  send_references_.insert(id);
}

void Van::AcceptReferencesFrom(int id, const std::string& identity, int pid) {
  MutexLock lock(&peers_mu_);
  accept_pid_[identity] = pid;
  accept_identity_[id] = identity;
}

bool Van::IsConnected(int id) const { return FindPeer(id) != nullptr; }

std::shared_ptr<Van::Peer> Van::FindPeer(int id) const {
  MutexLock lock(&peers_mu_);
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second;
}

Status Van::Send(Message* msg) {
  std::shared_ptr<Peer> peer;
  bool references = false;
  {
    MutexLock lock(&peers_mu_);
    auto it = peers_.find(msg->meta.recver());
    if (it != peers_.end()) peer = it->second;
    references = send_references_.count(msg->meta.recver()) > 0;
  }
  if (peer == nullptr) {
    return Status::Unavailable("no connection to node id " +
                               std::to_string(msg->meta.recver()));
  }
  size_t n = msg->data.size();
  std::vector<bool> by_ref(n);
  msg->meta.clear_shared();
  if (references) {
    for (size_t i = 0; i < n; ++i) {
      const SArray<char>& frame = msg->data[i];
      pb::SharedRef ref;
      if (frame.size() <= kInlineFrameBytes ||
          !SharedMemory::Get().Find(frame.data(), frame.size(), &ref)) {
        continue;
      }
      ref.set_frame(static_cast<int>(i));
      *msg->meta.add_shared() = ref;
      by_ref[i] = true;
    }
  } else {
    msg->meta.clear_reply_into();
  }
  std::string header = EncodeHeader(msg);
  // The receiver refuses (and disconnects) what exceeds the limit: say so
  // here, where the caller can still be told.
  int64_t total = static_cast<int64_t>(header.size());
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
  int flags = n > 0 ? ZMQ_SNDMORE : 0;
  if (zmq_send(peer->socket, header.data(), header.size(), flags) < 0) {
    return Status::Unavailable("send to " + peer->address + ": " + ZmqError());
  }
  for (size_t i = 0; i < n; ++i) {
    const SArray<char>& frame = msg->data[i];
    zmq_msg_t part;
    if (by_ref[i]) {
      zmq_msg_init(&part);  // the bytes stay where the header says
      num_shared_sent_.fetch_add(1);
    } else if (frame.size() <= kInlineFrameBytes) {
      // ZeroMQ stores frames this small inside zmq_msg_t itself; handing
      // them over by reference would cost a heap block instead of a copy
      // of a few bytes. Anything larger goes without a copy.
      zmq_msg_init_size(&part, frame.size());
      if (!frame.empty())
        std::memcpy(zmq_msg_data(&part), frame.data(), frame.size());
    } else {
      auto owner = std::make_unique<SArray<char>>(frame);
      zmq_msg_init_data(&part, frame.data(), frame.size(), ReleaseFrame,
                        owner.release());
    }
    if (zmq_msg_send(&part, peer->socket, i + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
      zmq_msg_close(&part);
      return Status::Unavailable("send to " + peer->address + ": " +
                                 ZmqError());
    }
  }
  return Status::OK();
}

void Van::CountDropped(const std::string& from, const std::string& why) {
  num_dropped_.fetch_add(1);
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

void Van::StartAuth() {
  void* zap = zmq_socket(context_, ZMQ_REP);
  CHECK(zap != nullptr) << ZmqError();
  CHECK_EQ(zmq_bind(zap, kZapEndpoint), 0) << ZmqError();
  std::string monitor_endpoint =
      "inproc://ps-monitor-" +
      std::to_string(reinterpret_cast<uintptr_t>(this));
  CHECK_EQ(
      zmq_socket_monitor(router_, monitor_endpoint.c_str(), kHandshakeFailures),
      0)
      << ZmqError();
  void* monitor = zmq_socket(context_, ZMQ_PAIR);
  CHECK(monitor != nullptr) << ZmqError();
  CHECK_EQ(zmq_connect(monitor, monitor_endpoint.c_str()), 0) << ZmqError();
  auth_ = std::thread([this, zap, monitor] {
    pthread_setname_np(pthread_self(), "ps-van-auth");
    AuthLoop(zap, monitor);
  });
}

void Van::AuthLoop(void* zap, void* monitor) {
  zmq_pollitem_t items[] = {{zap, 0, ZMQ_POLLIN, 0},
                            {monitor, 0, ZMQ_POLLIN, 0}};
  while (true) {
    if (zmq_poll(items, 2, -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      // Without this thread CURVE would admit any client: only the van's
      // own shutdown may end it.
      CHECK_EQ(zmq_errno(), ETERM) << "auth thread: " << ZmqError();
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) AnswerZap(zap);
    if (items[1].revents & ZMQ_POLLIN) {
      // A monitor event: frame 1 is (uint16 event, uint32 value), frame 2
      // the endpoint.
      zmq_msg_t part;
      zmq_msg_init(&part);
      bool failed = false;
      if (zmq_msg_recv(&part, monitor, 0) >= 6) {
        uint16_t event;
        std::memcpy(&event, zmq_msg_data(&part), sizeof(event));
        failed = (event & kHandshakeFailures) != 0;
      }
      while (zmq_msg_more(&part)) {
        if (zmq_msg_recv(&part, monitor, 0) < 0) break;
      }
      zmq_msg_close(&part);
      if (failed) num_refused_.fetch_add(1);
    }
  }
  zmq_close(zap);
  zmq_close(monitor);
}

void Van::AnswerZap(void* zap) {
  // Request (RFC 27): version, request id, domain, address, routing id,
  // mechanism, credentials...
  std::vector<std::string> req;
  zmq_msg_t part;
  zmq_msg_init(&part);
  do {
    if (zmq_msg_recv(&part, zap, 0) < 0) {
      zmq_msg_close(&part);
      return;
    }
    if (req.size() < 8) req.push_back(FrameString(&part));
  } while (zmq_msg_more(&part));
  zmq_msg_close(&part);
  bool ok = req.size() >= 7 && req[0] == "1.0" && req[5] == "CURVE" &&
            req[6].size() == 32;
  if (ok) {
    char key[41];
    zmq_z85_encode(key, reinterpret_cast<const uint8_t*>(req[6].data()), 32);
    ok = public_key_ == key;
  }
  if (!ok) {
    Report("refused a " +
           DescribeConnection(req.size() > 4 ? req[4] : "",
                              req.size() > 3 ? req[3] : "") +
           ": it does not hold this job's key (PS_KEY_FILE)");
  }
  const std::string reply[] = {"1.0",
                               req.size() > 1 ? req[1] : "",
                               ok ? "200" : "400",
                               ok ? "OK" : "not this job's key",
                               "",
                               ""};
  for (size_t i = 0; i < 6; ++i) {
    zmq_send(zap, reply[i].data(), reply[i].size(),
             i + 1 < 6 ? ZMQ_SNDMORE : 0);
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
    if (parts.size() < kMaxParts && bytes <= options_.max_message_bytes) {
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
  std::vector<SArray<char>> frames;
  for (size_t i = 2; i < parts.size(); ++i) {
    std::shared_ptr<RecvFrame> holder = parts[i];
    char* data = static_cast<char*>(zmq_msg_data(&holder->msg));
    size_t size = zmq_msg_size(&holder->msg);
    frames.emplace_back(data, size, [holder](char*) {});
  }
  zmq_msg_t* header = &parts[1]->msg;
  StatusOr<Message> msg =
      Decode(static_cast<const char*>(zmq_msg_data(header)),
             zmq_msg_size(header), std::move(frames), [this, &from](int) {
               MutexLock lock(&peers_mu_);
               // By the connection, not by the sender the header claims.
               auto it = accept_pid_.find(from);
               return it == accept_pid_.end() ? 0 : it->second;
             });
  if (!msg.ok()) {
    CountDropped(DescribeConnection(from, address), msg.status().message());
    return true;
  }
  msg->from = std::move(from);
  msg->peer_address = std::move(address);
  num_shared_received_.fetch_add(msg->meta.shared_size());
  handler_(std::move(msg).value());
  return true;
}

}  // namespace ps
