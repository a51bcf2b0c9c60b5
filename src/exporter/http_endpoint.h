// HttpEndpoint: the smallest HTTP/1.0 server that answers GET /metrics
// with a page that a function renders (Prometheus's text format), one
// connection at a time, on one thread of its own ("ps-metrics"). It
// listens on one IPv4 address, never every interface unless that address
// is 0.0.0.0; with a token, a request without "Authorization: Bearer
// <token>" gets 401 and nothing rendered.
//
// Why not prometheus-cpp's Exposer: its HTTP server (civetweb) starts its
// threads with a fixed 100 KB stack, which glibc refuses (EINVAL) in a
// process whose static TLS is larger, as a program linked with cuBLAS is.
// A scrape is one short request every few seconds: no pool is needed.
//
// Thread-safety: Start and Stop from one thread; `render` runs on the
// endpoint's thread. Each connection gets kIoTimeoutMs in all to send its
// request and take the answer, however slowly it trickles, so a client
// that stalls holds the thread no longer; Stop ends a connection at once.
#ifndef PS_SRC_EXPORTER_HTTP_ENDPOINT_H_
#define PS_SRC_EXPORTER_HTTP_ENDPOINT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "ps/status.h"

namespace ps {

class HttpEndpoint {
 public:
  using Render = std::function<std::string()>;
  static constexpr int kIoTimeoutMs = 5000;

  HttpEndpoint() = default;
  ~HttpEndpoint();  // Stop()s
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Listens on address:port (a numeric IPv4 address, 0.0.0.0 for every
  // interface; port 0: an ephemeral one) and starts the thread. A non-empty
  // `token` must come with every request (compared in constant time).
  // Error names the address and the reason (e.g. "Address already in
  // use").
  Status Start(const std::string& address, int port, const std::string& token,
               Render render);
  // Closes the socket and joins the thread. Idempotent.
  void Stop();
  int port() const { return port_; }
  // The address listened on ("" before Start).
  const std::string& address() const { return address_; }

 private:
  void Loop();
  void Answer(int fd) const;
  bool Authorized(const std::string& request) const;

  Render render_;
  std::string address_;
  // The token's BLAKE2b-256 digest: compared with a request's, both of one
  // length, by sodium_memcmp. Unused while has_token_ is false.
  bool has_token_ = false;
  std::array<uint8_t, 32> token_digest_{};
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: written by Stop
  int port_ = 0;
  std::thread thread_;
};

// `host` as a numeric IPv4 address: itself when it is one, else the first
// IPv4 address the name resolves to (getaddrinfo). Error names the host.
StatusOr<std::string> ResolveIPv4(const std::string& host);

}  // namespace ps

#endif  // PS_SRC_EXPORTER_HTTP_ENDPOINT_H_
