// HttpGet: the whole reply (status line, headers, body) to GET `path` from
// 127.0.0.1:port, for the tests of /metrics; "" when nobody listens.
#ifndef PS_TESTS_CORE_HTTP_GET_H_
#define PS_TESTS_CORE_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace ps {

inline std::string HttpGet(int port, const std::string& path = "/metrics") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) reply.append(buf, n);
    }
  }
  close(fd);
  return reply;
}

}  // namespace ps

#endif  // PS_TESTS_CORE_HTTP_GET_H_
