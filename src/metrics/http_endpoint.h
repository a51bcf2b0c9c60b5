// HttpEndpoint: the smallest HTTP/1.0 server that answers GET /metrics
// with a page that a function renders (Prometheus's text format), one
// connection at a time, on one thread of its own ("ps-metrics").
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
#ifndef PS_SRC_METRICS_HTTP_ENDPOINT_H_
#define PS_SRC_METRICS_HTTP_ENDPOINT_H_

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

  // Listens on host:port (host a numeric IPv4, else every interface; port
  // 0: an ephemeral one) and starts the thread. Error names the address and
  // the reason (e.g. "Address already in use").
  Status Start(const std::string& host, int port, Render render);
  // Closes the socket and joins the thread. Idempotent.
  void Stop();
  int port() const { return port_; }

 private:
  void Loop();
  void Answer(int fd) const;

  Render render_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: written by Stop
  int port_ = 0;
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SRC_METRICS_HTTP_ENDPOINT_H_
