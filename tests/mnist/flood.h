// A stranger's flood of idle TCP connections (no key, no byte sent) to
// 127.0.0.1 ports [lo, hi], for the tests that a job survives it: a thread
// opens `per_second` connections a second, round robin over the ports, and
// holds each up to `hold_s` seconds unless the other side closes it first.
// It reads what arrives (a node's greeting) and counts the connections a
// node accepted (bytes came), those it closed (EOF or reset after that) and
// those still open when held in full. Raises this process's descriptor
// limit to the hard one; every loop is bounded by Stop().
#ifndef PS_TESTS_MNIST_FLOOD_H_
#define PS_TESTS_MNIST_FLOOD_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

namespace mnist_test {

class Flood {
 public:
  Flood(int lo, int hi, int per_second, int hold_s)
      : lo_(lo), hi_(hi), per_second_(per_second), hold_(hold_s) {
    rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
      r.rlim_cur = r.rlim_max;
      setrlimit(RLIMIT_NOFILE, &r);
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Flood() { Stop(); }
  Flood(const Flood&) = delete;
  Flood& operator=(const Flood&) = delete;

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int accepted() const { return accepted_; }
  int closed_by_node() const { return closed_; }
  int held_in_full() const { return held_in_full_; }
  // The most accepted connections open at once.
  int peak_open() const { return peak_open_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd;
    Clock::time_point opened;
    bool greeted = false;
  };

  void Run() {
    std::vector<Conn> conns;
    int port = lo_;
    auto next_read = Clock::now();
    while (!stop_) {
      for (int i = 0; i < per_second_ / 10; ++i) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) break;  // our own limit: try again later
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        port = port == hi_ ? lo_ : port + 1;
        if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
                0 &&
            errno != EINPROGRESS) {
          close(fd);
          continue;
        }
        conns.push_back({fd, Clock::now()});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (Clock::now() < next_read) continue;
      next_read = Clock::now() + std::chrono::milliseconds(500);
      Sweep(&conns, false);
    }
    Sweep(&conns, true);
  }

  // Reads each connection; drops those closed, refused or held in full
  // (all of them when `all`).
  void Sweep(std::vector<Conn>* conns, bool all) {
    std::vector<Conn> still;
    int open = 0;
    for (Conn& c : *conns) {
      char buf[256];
      ssize_t n;
      while ((n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
        if (!c.greeted) ++accepted_;
        c.greeted = true;
      }
      const bool gone = n == 0 || (n < 0 && errno != EAGAIN);
      if (gone && c.greeted) ++closed_;
      const bool full = Clock::now() - c.opened >= std::chrono::seconds(hold_);
      if (!gone && c.greeted && full) ++held_in_full_;
      if (gone || full || all) {
        close(c.fd);
      } else {
        still.push_back(c);
        open += c.greeted;
      }
    }
    if (open > peak_open_) peak_open_ = open;
    *conns = std::move(still);
  }

  const int lo_, hi_, per_second_, hold_;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0}, closed_{0}, held_in_full_{0}, peak_open_{0};
  std::thread thread_;
};

}  // namespace mnist_test

#endif  // PS_TESTS_MNIST_FLOOD_H_
