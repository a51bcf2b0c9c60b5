// HttpGet: the whole reply (status line, headers, body) to GET `path` from
// host:port (127.0.0.1 unless named), for the tests of /metrics; "" when
// nobody listens. `headers`: extra header lines, each ending in "\r\n".
// Connects: whether a TCP connection to host:port is accepted.
#ifndef PS_TESTS_CORE_HTTP_GET_H_
#define PS_TESTS_CORE_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace ps {

// A connected socket to host:port (a numeric IPv4 address), or -1.
inline int DialIPv4(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool Connects(const std::string& host, int port) {
  int fd = DialIPv4(host, port);
  if (fd < 0) return false;
  close(fd);
  return true;
}

inline std::string HttpGetFrom(const std::string& host, int port,
                               const std::string& path = "/metrics",
                               const std::string& headers = "") {
  int fd = DialIPv4(host, port);
  if (fd < 0) return "";
  std::string reply;
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n" + headers + "\r\n";
  if (write(fd, request.data(), request.size()) ==
      static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) reply.append(buf, n);
  }
  close(fd);
  return reply;
}

inline std::string HttpGet(int port, const std::string& path = "/metrics") {
  return HttpGetFrom("127.0.0.1", port, path);
}

}  // namespace ps

#endif  // PS_TESTS_CORE_HTTP_GET_H_
