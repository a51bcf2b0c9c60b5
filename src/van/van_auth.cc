// Van: admission (thread "ps-van-auth"): with a job key, the ZAP handler
// that admits only connections whose PLAIN password is a sealing token of
// this job for this process (the sealed wire's Admit, van/sealed_wire.cc),
// and the count of handshakes refused; with or without one, the ROUTER's
// monitor, by which idle connections are capped per source address and in all
// (van/conn_guard.h); see van.h, "Trust".
#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "van/conn_guard.h"
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
// Each carries the connection's descriptor as its value.
constexpr int kConnectionEvents =
    ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED;
// A ZMTP 3 greeting: a connection that sent no more has not begun its
// mechanism's handshake (a member's sends its HELLO or READY at once).
constexpr uint64_t kGreetingBytes = 64;

// One monitor event: frame 1 is (uint16 event, uint32 value), frame 2 the
// endpoint. Event 0 when malformed.
struct MonitorEvent {
  uint16_t event = 0;
  uint32_t value = 0;
};

MonitorEvent ReceiveEvent(void* monitor) {
  MonitorEvent e;
  zmq_msg_t part;
  zmq_msg_init(&part);
  if (zmq_msg_recv(&part, monitor, 0) >= 6) {
    std::memcpy(&e.event, zmq_msg_data(&part), sizeof(e.event));
    std::memcpy(&e.value, static_cast<char*>(zmq_msg_data(&part)) + 2,
                sizeof(e.value));
  }
  while (zmq_msg_more(&part)) {
    if (zmq_msg_recv(&part, monitor, 0) < 0) break;
  }
  zmq_msg_close(&part);
  return e;
}

// The address of one end of socket `fd` ("127.0.0.1"), and with its port
// ("127.0.0.1:5000"); false when fd is no IP socket.
bool EndOf(int fd, bool peer, std::string* ip, std::string* ip_port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  sockaddr* a = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, a, &len) : getsockname(fd, a, &len)) != 0) {
    return false;
  }
  char text[INET6_ADDRSTRLEN] = {0};
  int port;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *ip = text;
  *ip_port = *ip + ":" + std::to_string(port);
  return true;
}

// "127.0.0.1:43210 to 127.0.0.1:5000", and the peer's address in *source;
// empty when fd is no connected IP socket.
std::string ConnectionName(int fd, std::string* source) {
  std::string local_ip, local, peer;
  if (!EndOf(fd, true, source, &peer) || !EndOf(fd, false, &local_ip, &local)) {
    return "";
  }
  return peer + " to " + local;
}

// Whether `fd` is still the connection `name` and has sent nothing past a
// ZMTP greeting (TCP_INFO's bytes received, Linux 4.1 on; an older kernel
// does not say, and nothing is shut).
bool StillIdle(int fd, const std::string& name) {
  std::string source;
  if (ConnectionName(fd, &source) != name) return false;
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  if (len < offsetof(tcp_info, tcpi_bytes_received) +
                sizeof(info.tcpi_bytes_received)) {
    return false;
  }
  return info.tcpi_bytes_received <= kGreetingBytes;
}

// The caps of `options`, those unset derived from the soft descriptor
// limit.
ConnGuard GuardOf(const VanOptions& options) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) r.rlim_cur = RLIM_INFINITY;
  return ConnGuard(options.max_idle_connections_per_source > 0
                       ? options.max_idle_connections_per_source
                       : ConnGuard::DefaultPerSource(r.rlim_cur),
                   options.max_idle_connections > 0
                       ? options.max_idle_connections
                       : ConnGuard::DefaultTotal(r.rlim_cur));
}

std::string CapsText(const ConnGuard& guard) {
  return "PS_MAX_IDLE_CONNECTIONS_PER_SOURCE=" +
         std::to_string(guard.per_source()) +
         ", PS_MAX_IDLE_CONNECTIONS=" + std::to_string(guard.total());
}

}  // namespace

void Van::StartAuth(bool with_zap) {
  void* zap = nullptr;
  if (with_zap) {
    zap = zmq_socket(context_, ZMQ_REP);
    CHECK(zap != nullptr) << ZmqError();
    CHECK_EQ(zmq_bind(zap, kZapEndpoint), 0) << ZmqError();
  }
  std::string monitor_endpoint =
      "inproc://ps-monitor-" +
      std::to_string(reinterpret_cast<uintptr_t>(this));
  CHECK_EQ(zmq_socket_monitor(router_, monitor_endpoint.c_str(),
                              kHandshakeFailures | kConnectionEvents),
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
  ConnGuard guard = GuardOf(options_);
  zmq_pollitem_t items[] = {{monitor, 0, ZMQ_POLLIN, 0},
                            {zap, 0, ZMQ_POLLIN, 0}};
  while (true) {
    if (zmq_poll(items, zap != nullptr ? 2 : 1, -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      // Without this thread PLAIN would admit any client: only the van's
      // own shutdown may end it.
      CHECK_EQ(zmq_errno(), ETERM) << "auth thread: " << ZmqError();
      break;
    }
    if (zap != nullptr && (items[1].revents & ZMQ_POLLIN)) AnswerZap(zap);
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    const MonitorEvent e = ReceiveEvent(monitor);
    const int fd = static_cast<int>(e.value);
    if (e.event & (ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED)) guard.Closed(fd);
    if (e.event & ZMQ_EVENT_ACCEPTED) {
      std::string source;
      const std::string name = ConnectionName(fd, &source);
      if (name.empty()) continue;  // gone already
      for (const ConnGuard::Victim& v : guard.Accepted(
               fd, source, name, ConnGuard::Clock::now(), StillIdle)) {
        // ZeroMQ owns the descriptor: it sees the connection end and
        // closes it itself.
        shutdown(v.fd, SHUT_RDWR);
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(v.held);
        Report("shut down the idle connection " + v.name + " after " +
               std::to_string(ms.count()) + " ms: " +
               (v.over_total ? std::to_string(guard.held() + 1) + " held"
                             : std::to_string(v.from_source) + " held from " +
                                   v.source) +
               " (" + CapsText(guard) + ")");
      }
    }
    if (e.event & kHandshakeFailures) {
      num_refused_.fetch_add(1);
      if (options_.metrics)
        options_.metrics->Refused(RefusalReason::kAuthentication);
    }
  }
  if (guard.num_shut() > 0) {
    LOG(WARNING) << "van: shut down " << guard.num_shut()
                 << " idle connections (" << CapsText(guard) << ")";
  }
  if (zap != nullptr) zmq_close(zap);
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
  // PLAIN credentials: the user name, then the password (the sealed wire's
  // token in hex).
  std::string why = "it does not hold this job's key (PS_KEY_FILE)";
  const bool ok = req.size() >= 8 && req[0] == "1.0" && req[5] == "PLAIN" &&
                  wire_->Admit(req[6], req[7], &why);
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
