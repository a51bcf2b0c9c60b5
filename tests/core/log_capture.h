// LogCapture: the lines glog logs while one lives (every severity, whatever
// the destination), for tests that check what a node said. Thread-safe:
// glog calls send() from whichever thread logs.
#ifndef PS_TESTS_CORE_LOG_CAPTURE_H_
#define PS_TESTS_CORE_LOG_CAPTURE_H_

#include <glog/logging.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace ps {

class LogCapture : public google::LogSink {
 public:
  LogCapture() { google::AddLogSink(this); }
  ~LogCapture() override { google::RemoveLogSink(this); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  void send(google::LogSeverity, const char*, const char*, int,
            const google::LogMessageTime&, const char* message,
            size_t message_len) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(message, message_len);
    cv_.notify_all();
  }

  // The first line logged that contains every one of `parts`, waiting up
  // to `timeout` for it; "" if none came.
  std::string WaitFor(const std::vector<std::string>& parts,
                      std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    std::string found;
    size_t seen = 0;
    cv_.wait_for(lock, timeout, [&] {
      for (; seen < lines_.size() && found.empty(); ++seen) {
        bool all = true;
        for (const std::string& p : parts) {
          all = all && lines_[seen].find(p) != std::string::npos;
        }
        if (all) found = lines_[seen];
      }
      return !found.empty();
    });
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

}  // namespace ps

#endif  // PS_TESTS_CORE_LOG_CAPTURE_H_
