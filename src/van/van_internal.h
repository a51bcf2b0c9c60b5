// What the Van's source files (van.cc, van_watch.cc, van_auth.cc) share: the
// peer record and small ZeroMQ helpers. Internal to src/van; include only
// from those files.
#ifndef PS_SRC_VAN_VAN_INTERNAL_H_
#define PS_SRC_VAN_VAN_INTERNAL_H_

#include <glog/logging.h>
#include <zmq.h>

#include <memory>
#include <optional>
#include <string>

#include "van/seal.h"
#include "van/stream.h"
#include "van/sync.h"
#include "van/van.h"

namespace ps {
namespace van_internal {

// The ZAP domain of the ROUTER (sealing admission, van_auth.cc).
constexpr char kZapDomain[] = "ps";

inline std::string ZmqError() { return zmq_strerror(zmq_errno()); }

inline void SetIntOption(void* socket, int option, int value) {
  CHECK_EQ(zmq_setsockopt(socket, option, &value, sizeof(value)), 0)
      << ZmqError();
}

inline void SetStringOption(void* socket, int option,
                            const std::string& value) {
  CHECK_EQ(zmq_setsockopt(socket, option, value.data(), value.size()), 0)
      << ZmqError();
}

inline std::string FrameString(zmq_msg_t* msg) {
  return std::string(static_cast<const char*>(zmq_msg_data(msg)),
                     zmq_msg_size(msg));
}

}  // namespace van_internal

// One DEALER to one node. Shared by the routing table's snapshots and the
// sends in flight; the socket closes with the last of them.
struct Van::Peer {
  Mutex mu;  // serialises use of `socket` across threads
  void* socket GUARDED_BY(mu) = nullptr;
  // With a job key (docs/security.md, "Sessions"): the peer's static key,
  // the session offered (its HELLO), the open session's keys (frames sealed
  // with `sealer`, answers opened with `answers`), and every message not yet
  // known to be taken.
  bool sealed = false;  // set before the peer is shared
  std::string peer_key;
  int fd = -1;  // the socket's ZMQ_FD, polled by the session thread
  std::optional<seal::JobKey::Offer> offer GUARDED_BY(mu);
  std::unique_ptr<seal::Sealer> sealer GUARDED_BY(mu);
  std::unique_ptr<seal::Opener> answers GUARDED_BY(mu);
  OutStream out GUARDED_BY(mu);
  std::string address;  // "tcp://host:port"; set before the peer is shared
  ~Peer() {
    if (socket != nullptr) zmq_close(socket);
  }
};

}  // namespace ps

#endif  // PS_SRC_VAN_VAN_INTERNAL_H_
