// Status and StatusOr<T>: expected failures (bind, connect, timeout, lost
// peer, bad config, bad input) as cheap values, in the style of leveldb.
//
// Both are [[nodiscard]]: a Status returned and dropped is a failure ignored,
// which the compiler reports; ignore one on purpose with IgnoreError().
//
// Thread-safety: a Status is an immutable value once built; distinct objects
// may be used from distinct threads, a shared one only for reading.
#ifndef PS_STATUS_H_
#define PS_STATUS_H_

#include <glog/logging.h>

#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace ps {

class [[nodiscard]] Status {
 public:
  enum Code {
    kOk = 0,
    kInvalidArgument = 1,  // bad config, bad input from a caller
    kNotFound = 2,         // a file, key or node that is not there
    kTimeout = 3,          // a deadline passed (connect, rendezvous, Wait)
    kUnavailable = 4,      // bind/connect failed, a peer is unreachable
    kPeerFailed = 5,       // a node we depend on was declared dead
    kInternal = 6,         // an unexpected failure of a library we call
    kAborted = 7,          // the operation was cancelled by a shutdown
    kIOError = 8,          // reading or writing a file failed
    kCorruption = 9,       // malformed data (a message, a file)
  };

  Status() = default;  // OK
  Status(Code code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return Status(kInvalidArgument, std::move(m));
  }
  static Status NotFound(std::string m) {
    return Status(kNotFound, std::move(m));
  }
  static Status Timeout(std::string m) {
    return Status(kTimeout, std::move(m));
  }
  static Status Unavailable(std::string m) {
    return Status(kUnavailable, std::move(m));
  }
  static Status PeerFailed(std::string m) {
    return Status(kPeerFailed, std::move(m));
  }
  static Status Internal(std::string m) {
    return Status(kInternal, std::move(m));
  }
  static Status Aborted(std::string m) {
    return Status(kAborted, std::move(m));
  }
  static Status IOError(std::string m) {
    return Status(kIOError, std::move(m));
  }
  static Status Corruption(std::string m) {
    return Status(kCorruption, std::move(m));
  }

  bool ok() const { return code_ == kOk; }
  // Drops this status on purpose (where a failure needs no action).
  void IgnoreError() const {}
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK", or "<code name>: <message>".
  std::string ToString() const {
    if (ok()) return "OK";
    return std::string(CodeName(code_)) + ": " + message_;
  }

  static const char* CodeName(Code code) {
    switch (code) {
      case kOk:
        return "OK";
      case kInvalidArgument:
        return "Invalid argument";
      case kNotFound:
        return "Not found";
      case kTimeout:
        return "Timeout";
      case kUnavailable:
        return "Unavailable";
      case kPeerFailed:
        return "Peer failed";
      case kInternal:
        return "Internal";
      case kAborted:
        return "Aborted";
      case kIOError:
        return "IO error";
      case kCorruption:
        return "Corruption";
    }
    return "Unknown";
  }

 private:
  Code code_ = kOk;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) {
  return os << s.ToString();
}

// Either a value of T or a non-OK Status. value() on an error is a bug and
// aborts (CHECK) naming the status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // Implicit on purpose, so a function returning StatusOr<T> can
  // `return value;` or `return Status::Timeout(...);`.
  StatusOr(const Status& status) : status_(status) {  // NOLINT
    CHECK(!status_.ok()) << "StatusOr built from an OK Status without value";
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    CHECK(!status_.ok()) << "StatusOr built from an OK Status without value";
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T& value() & {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace ps

// Returns the Status of `expr` from the enclosing function when not OK.
#define PS_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::ps::Status ps_status_tmp_ = (expr);            \
    if (!ps_status_tmp_.ok()) return ps_status_tmp_; \
  } while (0)

#endif  // PS_STATUS_H_
