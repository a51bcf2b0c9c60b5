// A stranger's flood of idle TCP connections (no key, no byte sent) to
// 127.0.0.1 ports [lo, hi], for the tests that a job survives it: a thread
// opens `per_second` connections a second, round robin over the ports (at
// most `max_open` open to one port at once, 0: no limit, so that each one
// the other side closed is replaced), and holds each up to `hold_s` seconds
// unless the other side closes it first. It reads what arrives (a node's
// greeting) and counts the connections a node accepted (bytes came), those
// it closed (EOF or reset after that) and those still open when held in
// full. Raises this process's descriptor limit to the hard one; every loop
// is bounded by Stop().
//
// RenameWatch: the names renamed into a folder (inotify IN_MOVED_TO), so a
// test sees every checkpoint file a job completed, even those pruned later.
#ifndef PS_TESTS_MNIST_FLOOD_H_
#define PS_TESTS_MNIST_FLOOD_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mnist_test {

class Flood {
 public:
  Flood(int lo, int hi, int per_second, int hold_s, int max_open = 0)
      : lo_(lo),
        hi_(hi),
        per_second_(per_second),
        hold_(hold_s),
        max_open_(max_open),
        open_(hi - lo + 1, 0),
        accepted_at_(hi - lo + 1) {
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
  // Those accepted on each port, from lo.
  std::vector<int> accepted_by_port() const {
    std::vector<int> v;
    for (const auto& n : accepted_at_) v.push_back(n);
    return v;
  }
  int closed_by_node() const { return closed_; }
  int held_in_full() const { return held_in_full_; }
  // The most accepted connections open at once (seen at a sweep).
  int peak_open() const { return peak_open_; }
  // The most connections this side held open at once, accepted or not.
  int peak_held() const { return peak_held_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd;
    int port;
    Clock::time_point opened;
    bool greeted = false;
  };

  void Run() {
    std::vector<Conn> conns;
    int port = lo_;
    auto next_read = Clock::now();
    while (!stop_) {
      for (int i = 0; i < per_second_ / 10; ++i) {
        // The next port below max_open, at most one round over them.
        for (int n = 0;
             n <= hi_ - lo_ && max_open_ > 0 && open_[port - lo_] >= max_open_;
             ++n) {
          port = port == hi_ ? lo_ : port + 1;
        }
        if (max_open_ > 0 && open_[port - lo_] >= max_open_) break;
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) break;  // our own limit: try again later
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const int to = port;
        port = port == hi_ ? lo_ : port + 1;
        if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
                0 &&
            errno != EINPROGRESS) {
          close(fd);
          continue;
        }
        conns.push_back({fd, to, Clock::now()});
        ++open_[to - lo_];
      }
      if (static_cast<int>(conns.size()) > peak_held_) {
        peak_held_ = static_cast<int>(conns.size());
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
        if (!c.greeted) {
          ++accepted_;
          ++accepted_at_[c.port - lo_];
        }
        c.greeted = true;
      }
      const bool gone = n == 0 || (n < 0 && errno != EAGAIN);
      if (gone && c.greeted) ++closed_;
      const bool full = Clock::now() - c.opened >= std::chrono::seconds(hold_);
      if (!gone && c.greeted && full) ++held_in_full_;
      if (gone || full || all) {
        close(c.fd);
        --open_[c.port - lo_];
      } else {
        still.push_back(c);
        open += c.greeted;
      }
    }
    if (open > peak_open_) peak_open_ = open;
    *conns = std::move(still);
  }

  const int lo_, hi_, per_second_, hold_, max_open_;
  std::vector<int> open_;  // by port - lo_; the flood thread's
  std::vector<std::atomic<int>> accepted_at_;  // by port - lo_
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0}, closed_{0}, held_in_full_{0}, peak_open_{0},
      peak_held_{0};
  std::thread thread_;
};

class RenameWatch {
 public:
  explicit RenameWatch(const std::string& dir)
      : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    ok_ = fd_ >= 0 && inotify_add_watch(fd_, dir.c_str(), IN_MOVED_TO) >= 0;
    thread_ = std::thread([this] { Run(); });
  }
  ~RenameWatch() {
    Stop();
    if (fd_ >= 0) close(fd_);
  }
  RenameWatch(const RenameWatch&) = delete;
  RenameWatch& operator=(const RenameWatch&) = delete;

  bool ok() const { return ok_; }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::set<std::string> names() {
    std::lock_guard<std::mutex> lock(mu_);
    return names_;
  }

 private:
  void Run() {
    alignas(inotify_event) char buf[16384];
    // Bounded by Stop(); what came before it is read in the last pass.
    for (bool last = false; ok_ && !last;) {
      last = stop_;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, last ? 0 : 100) <= 0) continue;
      ssize_t n;
      while ((n = read(fd_, buf, sizeof(buf))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        for (ssize_t at = 0; at < n;) {
          const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
          if (e->len > 0) names_.insert(e->name);
          at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
        }
      }
    }
  }

  const int fd_;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::set<std::string> names_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace mnist_test

#endif  // PS_TESTS_MNIST_FLOOD_H_
