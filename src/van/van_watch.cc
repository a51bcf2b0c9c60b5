// Van: watching the DEALERs' connections (Van::WatchConnections, thread
// "ps-van-watch"); see van.h, "Watching".
#include <pthread.h>
#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "van/van.h"
#include "van/van_internal.h"

namespace ps {

using van_internal::ZmqError;

namespace {

// One monitor event's type (0 when malformed). Frame 1: (uint16 event,
// uint32 value); frame 2: the endpoint.
uint16_t ReadEvent(void* monitor) {
  zmq_msg_t part;
  zmq_msg_init(&part);
  uint16_t event = 0;
  if (zmq_msg_recv(&part, monitor, ZMQ_DONTWAIT) >= 6) {
    std::memcpy(&event, zmq_msg_data(&part), sizeof(event));
  }
  while (zmq_msg_more(&part)) {
    if (zmq_msg_recv(&part, monitor, 0) < 0) break;
  }
  zmq_msg_close(&part);
  return event;
}

}  // namespace

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

void Van::Tell(
    const std::vector<std::pair<std::shared_ptr<Peer>, std::string>>& lost,
    const std::vector<std::shared_ptr<Peer>>& regained) {
  auto id_of = [this](const std::shared_ptr<Peer>& peer) {
    std::shared_ptr<const Routes> routes = routes_.Load();
    for (const auto& [peer_id, p] : routes->peers) {
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
                  std::to_string(watch_grace_ms_) + " ms: its process is gone");
  }
}

void Van::TakeNewWatches(std::vector<Watched>* watched) {
  MutexLock lock(&watch_mu_);
  for (Watched& w : new_watches_) watched->push_back(w);
  new_watches_.clear();
}

void Van::WatchLoop() {
  constexpr int kPollMs = 50;
  std::vector<Watched> watched;
  std::vector<zmq_pollitem_t> items;
  while (true) {
    TakeNewWatches(&watched);
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
        const uint16_t event = ReadEvent(w.monitor);
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
    Tell(lost, regained);
  }
  for (Watched& w : watched) zmq_close(w.monitor);
  MutexLock lock(&watch_mu_);
  for (Watched& w : new_watches_) zmq_close(w.monitor);
  new_watches_.clear();
}

}  // namespace ps
