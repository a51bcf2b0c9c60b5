#include "postoffice/key_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

namespace ps {

namespace {

const char kOneLine[] = "one line of 40 Z85 characters";

Status CannotRead(const std::string& name) {
  return Status::InvalidArgument(
      name + ": cannot read the key file: " + std::strerror(errno));
}

// Reads at most kMaxKeyFileBytes + 1 bytes of an open regular file from its
// start (pread: the file offset, which other processes may share, stays).
Status ReadSmallFile(const std::string& name, int fd, std::string* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return CannotRead(name);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        name + " is not a regular file (a key file is " + kOneLine + ")");
  }
  if (st.st_size > kMaxKeyFileBytes) {
    return Status::InvalidArgument(name + " is " + std::to_string(st.st_size) +
                                   " bytes, more than a key file's " +
                                   std::to_string(kMaxKeyFileBytes));
  }
  char buf[kMaxKeyFileBytes + 1];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = pread(fd, buf + got, sizeof(buf) - got, got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return CannotRead(name);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > static_cast<size_t>(kMaxKeyFileBytes)) {  // it grew meanwhile
    return Status::InvalidArgument(name + " is more than a key file's " +
                                   std::to_string(kMaxKeyFileBytes) + " bytes");
  }
  out->assign(buf, got);
  return Status::OK();
}

// Reads a pipe up to its first newline or its end, within kKeyPipeTimeoutMs:
// the line must come within kMaxKeyFileBytes + 1 bytes.
Status ReadPipeLine(const std::string& name, int fd, std::string* out) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(kKeyPipeTimeoutMs);
  char buf[kMaxKeyFileBytes + 1];
  size_t got = 0;
  while (got < sizeof(buf) && std::memchr(buf, '\n', got) == nullptr) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - Clock::now())
                    .count();
    if (left <= 0) {
      return Status::InvalidArgument(
          name + " is a pipe that gave no key line within " +
          std::to_string(kKeyPipeTimeoutMs) + " ms");
    }
    pollfd p = {fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) return CannotRead(name);
    if (ready <= 0) continue;
    ssize_t n = read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return CannotRead(name);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (std::memchr(buf, '\n', got) == nullptr &&
      got > static_cast<size_t>(kMaxKeyFileBytes)) {
    return Status::InvalidArgument(name + " gave more than a key file's " +
                                   std::to_string(kMaxKeyFileBytes) +
                                   " bytes without a newline");
  }
  out->assign(buf, got);
  return Status::OK();
}

// The key of a key file's text: its first line, 40 Z85 characters.
StatusOr<std::string> KeyOf(const std::string& name, const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  uint8_t key[32];
  if (line.size() != 40 || zmq_z85_decode(key, line.c_str()) == nullptr) {
    return Status::InvalidArgument(
        name +
        " does not hold a job key (its first line must be "
        "40 Z85 characters; make one with tracker/launch.py "
        "--make-key FILE)");
  }
  return line;
}

}  // namespace

StatusOr<std::string> ReadSecretKey(const std::string& name,
                                    const std::string& path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused
  // below as not a regular file).
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return CannotRead(name);
  std::string text;
  Status st = ReadSmallFile(name, fd, &text);
  close(fd);
  PS_RETURN_IF_ERROR(st);
  return KeyOf(name, text);
}

StatusOr<std::string> ReadSecretKeyFromFd(const std::string& name, int fd) {
  struct stat st;
  if (fcntl(fd, F_GETFD) < 0 || fstat(fd, &st) != 0) {
    return Status::InvalidArgument(
        name + " is not an open file descriptor (" + std::strerror(errno) +
        "; the key's descriptor is read once, then closed)");
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return Status::InvalidArgument(
        name + " is not a regular file or a pipe (a key descriptor holds " +
        kOneLine + ")");
  }
  std::string text;
  Status read = S_ISREG(st.st_mode) ? ReadSmallFile(name, fd, &text)
                                    : ReadPipeLine(name, fd, &text);
  close(fd);
  PS_RETURN_IF_ERROR(read);
  return KeyOf(name, text);
}

}  // namespace ps
