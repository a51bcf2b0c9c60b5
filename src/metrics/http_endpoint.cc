// HttpEndpoint: listen, accept one connection at a time, read the request
// line, answer /metrics (or 404), close.
#include "metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

namespace ps {

namespace {

constexpr size_t kMaxRequestBytes = 8192;

using Clock = std::chrono::steady_clock;

// Waits until `fd` is ready for `events`, the connection's deadline passes
// or `wake_fd` (Stop) fires; true only for the first.
bool WaitReady(int fd, short events, int wake_fd, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || fds[1].revents != 0) return false;
    return true;
  }
}

// Writes `text` to the non-blocking `fd` by the deadline, or gives up.
void WriteAll(int fd, const std::string& text, int wake_fd,
              Clock::time_point deadline) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = send(fd, text.data() + done, text.size() - done,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitReady(fd, POLLOUT, wake_fd, deadline)) return;
      continue;
    }
    if (n <= 0) return;  // the client left: nothing to do
    done += static_cast<size_t>(n);
  }
}

std::string Reply(const char* status, const char* type,
                  const std::string& body) {
  return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

HttpEndpoint::~HttpEndpoint() { Stop(); }

Status HttpEndpoint::Start(const std::string& host, int port, Render render) {
  const std::string address = host + ":" + std::to_string(port);
  auto fail = [&](const char* call) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    return Status::Unavailable("cannot serve /metrics on " + address + ": " +
                               call + ": " + why);
  };
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return fail("socket");
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return fail("bind");
  if (listen(listen_fd_, 16) != 0) return fail("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return fail("getsockname");
  port_ = ntohs(addr.sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return fail("eventfd");
  render_ = std::move(render);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ps-metrics");
    Loop();
  });
  return Status::OK();
}

void HttpEndpoint::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // An eventfd write fails only on overflow: the thread wakes anyway.
    }
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void HttpEndpoint::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // Stop
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void HttpEndpoint::Answer(int fd) const {
  // One deadline for the whole connection, however slowly it trickles;
  // Stop ends it at once.
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos &&
         request.size() < kMaxRequestBytes) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitReady(fd, POLLIN, wake_fd_, deadline)) return;
      continue;
    }
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  // "GET /metrics HTTP/1.1" (a query string is allowed and ignored).
  const bool metrics = line.rfind("GET /metrics ", 0) == 0 ||
                       line.rfind("GET /metrics?", 0) == 0;
  if (!metrics) {
    WriteAll(
        fd,
        Reply("404 Not Found", "text/plain", "only /metrics is served here\n"),
        wake_fd_, deadline);
    return;
  }
  WriteAll(
      fd,
      Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()),
      wake_fd_, deadline);
}

}  // namespace ps
