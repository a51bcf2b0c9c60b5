// Van: ZeroMQ ROUTER/DEALER transport with zero-copy frames.
#include "van/van.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <zmq.h>

#include <cerrno>
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

}  // namespace

struct Van::Peer {
  std::mutex mu;  // serialises use of `socket` across threads
  void* socket = nullptr;
  std::string address;
  ~Peer() {
    if (socket != nullptr) zmq_close(socket);
  }
};

Van::Van() : context_(zmq_ctx_new()) { CHECK(context_ != nullptr); }

Van::~Van() {
  Stop(0);
  zmq_ctx_term(context_);
}

Status Van::Bind(const std::string& host, int port, int range_lo,
                 int range_hi) {
  CHECK(router_ == nullptr) << "Bind() twice";
  router_ = zmq_socket(context_, ZMQ_ROUTER);
  CHECK(router_ != nullptr) << ZmqError();
  SetIntOption(router_, ZMQ_RCVHWM, 0);
  SetIntOption(router_, ZMQ_LINGER, 0);
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
    std::lock_guard<std::mutex> lock(peers_mu_);
    for (auto& [id, peer] : peers_) {
      std::lock_guard<std::mutex> peer_lock(peer->mu);
      SetIntOption(peer->socket, ZMQ_LINGER, linger_ms);
    }
    peers_.clear();  // sockets close once in-flight sends drop their refs
  }
  zmq_ctx_shutdown(context_);  // wakes the receive thread with ETERM
  if (receiver_.joinable()) {
    receiver_.join();
  } else if (router_ != nullptr) {
    zmq_close(router_);
  }
  router_ = nullptr;
}

Status Van::Connect(int id, const std::string& host, int port) {
  auto peer = std::make_shared<Peer>();
  peer->address = "tcp://" + host + ":" + std::to_string(port);
  peer->socket = zmq_socket(context_, ZMQ_DEALER);
  if (peer->socket == nullptr) return Status::Internal(ZmqError());
  SetIntOption(peer->socket, ZMQ_SNDHWM, 0);
  SetIntOption(peer->socket, ZMQ_LINGER, 0);
  if (!identity_.empty()) {
    zmq_setsockopt(peer->socket, ZMQ_ROUTING_ID, identity_.data(),
                   identity_.size());
  }
  if (zmq_connect(peer->socket, peer->address.c_str()) != 0) {
    return Status::Unavailable("cannot connect to " + peer->address + ": " +
                               ZmqError());
  }
  std::lock_guard<std::mutex> lock(peers_mu_);
  peers_[id] = std::move(peer);
  return Status::OK();
}

void Van::Rekey(int old_id, int new_id) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = peers_.find(old_id);
  if (it == peers_.end()) return;
  peers_[new_id] = std::move(it->second);
  peers_.erase(old_id);
}

void Van::Disconnect(int id) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  peers_.erase(id);
  send_references_.erase(id);
  accept_pid_.erase(id);
}

void Van::SendReferencesTo(int id) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  send_references_.insert(id);
}

void Van::AcceptReferencesFrom(int id, int pid) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  accept_pid_[id] = pid;
}

bool Van::IsConnected(int id) const { return FindPeer(id) != nullptr; }

std::shared_ptr<Van::Peer> Van::FindPeer(int id) const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second;
}

Status Van::Send(Message* msg) {
  std::shared_ptr<Peer> peer;
  bool references = false;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
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
  std::lock_guard<std::mutex> lock(peer->mu);
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
  LOG(WARNING) << "dropped a message from " << from << ": " << why;
}

void Van::ReceiveLoop() {
  while (ReceiveOne()) {
  }
  zmq_close(router_);
}

bool Van::ReceiveOne() {
  // Frame 0: the sender's routing id (ROUTER), then the header, then data.
  std::vector<std::shared_ptr<RecvFrame>> parts;
  while (true) {
    auto part = std::make_shared<RecvFrame>();
    if (zmq_msg_recv(&part->msg, router_, 0) < 0) {
      if (zmq_errno() == ETERM) return false;
      if (zmq_errno() == EINTR) continue;
      LOG(WARNING) << "receive failed: " << ZmqError();
      return true;
    }
    bool more = zmq_msg_more(&part->msg) != 0;
    parts.push_back(std::move(part));
    if (!more) break;
  }
  const zmq_msg_t* id_msg = &parts[0]->msg;
  std::string from(
      static_cast<const char*>(zmq_msg_data(const_cast<zmq_msg_t*>(id_msg))),
      zmq_msg_size(const_cast<zmq_msg_t*>(id_msg)));
  if (from.empty() || from[0] == '\0') from = "an unnamed peer";
  if (parts.size() < 2) {
    CountDropped(from, "no header frame");
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
             zmq_msg_size(header), std::move(frames), [this](int sender) {
               std::lock_guard<std::mutex> lock(peers_mu_);
               auto it = accept_pid_.find(sender);
               return it == accept_pid_.end() ? 0 : it->second;
             });
  if (!msg.ok()) {
    CountDropped(from, msg.status().message());
    return true;
  }
  num_shared_received_.fetch_add(msg->meta.shared_size());
  handler_(std::move(msg).value());
  return true;
}

}  // namespace ps
