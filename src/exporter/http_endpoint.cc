// HttpEndpoint: listen, accept one connection at a time, read the request,
// check its token, answer /metrics (or 401, or 404), close.
#include "exporter/http_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <strings.h>
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

std::string Reply(const char* status, const char* type, const std::string& body,
                  const char* extra_header = "") {
  return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         extra_header + "Connection: close\r\n\r\n" + body;
}

using Digest = std::array<uint8_t, crypto_generichash_BYTES>;

Digest DigestOf(const std::string& text) {
  Digest d;
  crypto_generichash(d.data(), d.size(),
                     reinterpret_cast<const unsigned char*>(text.data()),
                     text.size(), nullptr, 0);
  return d;
}

std::string Trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

// The credentials of the request's first "Authorization: Bearer X" header
// (names and the scheme in any case, RFC 9110); false when it has none.
bool BearerOf(const std::string& request, std::string* token) {
  size_t at = request.find('\n');
  while (at != std::string::npos && at + 1 < request.size()) {
    const size_t end = request.find('\n', at + 1);
    const std::string line = request.substr(
        at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
    at = end;
    if (Trimmed(line).empty()) return false;  // the headers' end
    const size_t colon = line.find(':');
    if (colon != std::strlen("authorization") ||
        strncasecmp(line.c_str(), "authorization", colon) != 0) {
      continue;
    }
    const std::string value = Trimmed(line.substr(colon + 1));
    if (value.size() <= 7 || strncasecmp(value.c_str(), "bearer ", 7) != 0) {
      return false;
    }
    *token = Trimmed(value.substr(7));
    return true;
  }
  return false;
}

}  // namespace

StatusOr<std::string> ResolveIPv4(const std::string& host) {
  in_addr numeric{};
  if (inet_pton(AF_INET, host.c_str(), &numeric) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = host.empty()
                     ? EAI_NONAME
                     : getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::InvalidArgument("'" + host +
                                   "' is neither an IPv4 address nor a name "
                                   "that resolves to one (" +
                                   gai_strerror(rc) + ")");
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr,
            text, sizeof(text));
  freeaddrinfo(found);
  return std::string(text);
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

Status HttpEndpoint::Start(const std::string& address, int port,
                           const std::string& token, Render render) {
  const std::string where = address + ":" + std::to_string(port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("cannot serve /metrics on " + where +
                                   ": not a numeric IPv4 address");
  }
  has_token_ = !token.empty();
  if (has_token_) {
    if (sodium_init() < 0) {
      return Status::Internal("cannot serve /metrics: sodium_init failed");
    }
    token_digest_ = DigestOf(token);
  }
  auto fail = [&](const char* call) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    return Status::Unavailable("cannot serve /metrics on " + where + ": " +
                               call + ": " + why);
  };
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return fail("socket");
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return fail("bind");
  if (listen(listen_fd_, 16) != 0) return fail("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return fail("getsockname");
  port_ = ntohs(addr.sin_port);
  address_ = address;
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
  if (!Authorized(request)) {
    WriteAll(fd,
             Reply("401 Unauthorized", "text/plain",
                   "a bearer token is required (PS_METRICS_TOKEN_FILE)\n",
                   "WWW-Authenticate: Bearer realm=\"ps\"\r\n"),
             wake_fd_, deadline);
    return;
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

bool HttpEndpoint::Authorized(const std::string& request) const {
  if (!has_token_) return true;
  std::string given;
  if (!BearerOf(request, &given)) return false;
  const Digest digest = DigestOf(given);
  return sodium_memcmp(digest.data(), token_digest_.data(), digest.size()) == 0;
}

}  // namespace ps
