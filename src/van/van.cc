// Van: binding, starting and stopping, the routing table, sending and
// receiving (see van.h), the same for every wire; what a wire does
// differently is in plain_wire.cc and sealed_*.cc (van/wire.h). The watch
// thread is in van_watch.cc, the auth thread in van_auth.cc.
#include "van/van.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "van/codec.h"
#include "van/shm.h"
#include "van/van_internal.h"

namespace ps {

namespace {

using van_internal::FrameString;
using van_internal::kInlineFrameBytes;
using van_internal::kMaxParts;
using van_internal::RecvFrame;
using van_internal::SetIntOption;
using van_internal::ZmqError;

// Drop reports: at most this many lines per window; the rest are counted.
constexpr int kReportsPerWindow = 5;
constexpr auto kReportWindow = std::chrono::seconds(10);

bool IsNumericIPv4(const std::string& host) {
  in_addr addr;
  return inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

}  // namespace

Van::Van(const VanOptions& options)
    : options_(options),
      shared_memory_(&SharedMemory::Get()),
      context_(zmq_ctx_new()) {
  CHECK(context_ != nullptr);
  wire_ = options_.secret_key.empty()
              ? van_internal::MakePlainWire(this, options_)
              : van_internal::MakeSealedWire(this, options_);
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
  // A peer's connection made again (its old one timed out while this
  // process was stopped) takes its routing id over: without it ZeroMQ
  // ignores the new connection for as long as the old pipe lingers, and
  // never reads it after (everything that peer sends is lost, silently).
  SetIntOption(router_, ZMQ_ROUTER_HANDOVER, 1);
  SetHeartbeats(router_);
  const int64_t max_bytes = wire_->max_frame_bytes();
  CHECK_EQ(
      zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes)), 0)
      << ZmqError();
  const bool zap = wire_->SetUpRouter(router_);
  // The ZAP handler and the guard of idle connections (van_auth.cc) must
  // exist before the first connection.
  if (!auth_.joinable()) StartAuth(zap);
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

bool Van::Flush(int id, int timeout_ms) {
  std::shared_ptr<Peer> peer;
  {
    std::shared_ptr<const Routes> routes = routes_.Load();
    auto it = routes->peers.find(id);
    if (it == routes->peers.end()) return true;
    peer = it->second;
  }
  constexpr auto kEvery = std::chrono::milliseconds(20);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    {
      MutexLock lock(&peer->mu);
      if (wire_->Settled(peer.get())) return true;
    }
    if (std::chrono::steady_clock::now() + kEvery > deadline) return false;
    std::this_thread::sleep_for(kEvery);
  }
}

void Van::Stop(int linger_ms) {
  if (stopped_) return;
  stopped_ = true;
  wire_->Stop();
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
  const std::string where =
      "node " + std::to_string(id) + " at " + host + ":" + std::to_string(port);
  auto peer = std::make_shared<Peer>();
  peer->address = "tcp://" + host + ":" + std::to_string(port);
  // Not shared yet; the lock only tells the analysis who owns `socket`.
  MutexLock peer_lock(&peer->mu);
  peer->socket = zmq_socket(context_, ZMQ_DEALER);
  void* socket = peer->socket;
  if (socket == nullptr) return Status::Internal(ZmqError());
  SetIntOption(socket, ZMQ_SNDHWM, 0);  // see VanOptions::water_mark
  SetIntOption(socket, ZMQ_LINGER, 0);
  SetIntOption(socket, ZMQ_HANDSHAKE_IVL, options_.handshake_timeout_ms);
  SetHeartbeats(socket);
  Status prepared = wire_->Prepare(peer.get(), wire_key);
  if (!prepared.ok()) {
    return Status(prepared.code(), where + " " + prepared.message());
  }
  if (!identity_.empty()) {
    zmq_setsockopt(socket, ZMQ_ROUTING_ID, identity_.data(), identity_.size());
  }
  if (zmq_connect(socket, peer->address.c_str()) != 0) {
    return Status::Unavailable("cannot connect to " + peer->address + ": " +
                               ZmqError());
  }
  PS_RETURN_IF_ERROR(wire_->Connected(peer.get()));
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

int64_t Van::MarkReferences(Message* msg, bool references,
                            std::vector<bool>* by_ref) const {
  int64_t once_bytes = 0;
  msg->meta.clear_shared();
  if (!references) {
    msg->meta.clear_reply_into();
    return 0;
  }
  for (size_t i = 0; i < msg->data.size(); ++i) {
    const SArray<char>& frame = msg->data[i];
    pb::SharedRef ref;
    if (frame.size() <= kInlineFrameBytes ||
        !FindShared(frame.data(), frame.size(), &ref)) {
      continue;
    }
    ref.set_frame(static_cast<int>(i));
    if (ref.once()) once_bytes += static_cast<int64_t>(frame.size());
    *msg->meta.add_shared() = ref;
    (*by_ref)[i] = true;
  }
  return once_bytes;
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
  const size_t n = msg->data.size();
  std::vector<bool> by_ref(n);
  const int64_t once_bytes = MarkReferences(msg, references, &by_ref);
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
  const auto shared = static_cast<uint64_t>(msg->meta.shared_size());
  MutexLock lock(&peer->mu);
  Status st =
      wire_->Send(peer.get(), std::move(header), *msg, std::move(by_ref));
  if (st.ok()) num_shared_sent_.fetch_add(shared);
  return st;
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
  RecvParts parts;
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
    if (parts.size() < kMaxParts && bytes <= wire_->max_received_bytes()) {
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
  wire_->Receive(parts, from, address);
  return true;
}

std::function<int(int)> Van::SharedPid(const std::string& from) const {
  // Two pointers: the function keeps them in place (no allocation per
  // message). Called, if at all, within the Decode it is given to, while
  // the caller's `from` lives.
  return [this, &from](int) {
    // By the connection, not by the sender the header claims.
    std::shared_ptr<const Routes> routes = routes_.Load();
    auto it = routes->accept_pid.find(from);
    return it == routes->accept_pid.end() ? 0 : it->second;
  };
}

void Van::Deliver(StatusOr<Message> msg, const std::string& from,
                  const std::string& address) {
  if (!msg.ok()) {
    CountDropped(DescribeConnection(from, address), msg.status().message());
    return;
  }
  msg->from = from;
  msg->peer_address = address;
  num_shared_received_.fetch_add(msg->meta.shared_size());
  handler_(std::move(msg).value());
}

void Van::Answer(const std::string& to, const std::string& frame) {
  if (zmq_send(router_, to.data(), to.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) >=
      0) {
    zmq_send(router_, frame.data(), frame.size(), ZMQ_DONTWAIT);
  }
}

std::vector<std::shared_ptr<Van::Peer>> Van::Peers() const {
  std::shared_ptr<const Routes> routes = routes_.Load();
  std::vector<std::shared_ptr<Peer>> peers;
  peers.reserve(routes->peers.size());
  for (const auto& [id, peer] : routes->peers) peers.push_back(peer);
  return peers;
}

}  // namespace ps
