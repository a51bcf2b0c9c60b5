// Van: admission with a job key (thread "ps-van-auth"): the ZAP handler that
// admits only connections whose PLAIN password is a sealing token of this
// job for this process (van/seal.h), and the count of handshakes refused;
// see van.h, "Trust".
#include <pthread.h>
#include <zmq.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "van/van.h"
#include "van/van_internal.h"

namespace ps {

namespace {

using van_internal::FrameString;
using van_internal::ZmqError;

// ZeroMQ's ZAP endpoint (RFC 27): one per context, so one per Van.
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr int kHandshakeFailures = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

}  // namespace

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
      // Without this thread PLAIN would admit any client: only the van's
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
      if (failed && options_.metrics)
        options_.metrics->Refused(RefusalReason::kAuthentication);
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
  // PLAIN credentials: the user name, then the token in hex.
  std::string why = "it does not hold this job's key (PS_KEY_FILE)";
  bool ok = false;
  if (req.size() >= 8 && req[0] == "1.0" && req[5] == "PLAIN" &&
      req[6] == seal::kUserName) {
    // Only the token's one spelling (lower-case hex): the receive thread
    // keys each connection's opener on it, so another spelling of a
    // recorded token must not find a fresh one.
    StatusOr<std::string> token = seal::FromHex(req[7]);
    StatusOr<std::string> key =
        token.ok() && seal::ToHex(*token) == req[7]
            ? job_key_->AcceptHello(static_key_, *token)
            : StatusOr<std::string>(
                  Status::InvalidArgument("its token is not lower-case hex"));
    ok = key.ok();
    if (!ok) why = key.status().message();
  }
  if (!ok) {
    Report("refused a " +
           DescribeConnection(req.size() > 4 ? req[4] : "",
                              req.size() > 3 ? req[3] : "") +
           ": " + why);
  }
  const std::string reply[] = {"1.0", req.size() > 1 ? req[1] : "",
                               ok ? "200" : "400",
                               ok ? "OK" : "not this job's key",
                               // The User-Id of its messages: the token, by
                               // which the receive thread finds its key.
                               ok ? req[7] : "", ""};
  for (size_t i = 0; i < 6; ++i) {
    zmq_send(zap, reply[i].data(), reply[i].size(),
             i + 1 < 6 ? ZMQ_SNDMORE : 0);
  }
}

}  // namespace ps
