// Small ZeroMQ helpers that the Van's source files and its wires share
// (van.cc, van_watch.cc, van_auth.cc, wire.cc, plain_wire.cc, sealed_*.cc).
// Internal to src/van; include only from those files.
#ifndef PS_SRC_VAN_VAN_INTERNAL_H_
#define PS_SRC_VAN_VAN_INTERNAL_H_

#include <glog/logging.h>
#include <zmq.h>

#include <string>

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
}  // namespace ps

#endif  // PS_SRC_VAN_VAN_INTERNAL_H_
