#include "postoffice/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace ps {

namespace {

// Reads at most kMaxKeyFileBytes + 1 bytes of an open regular file.
Status ReadSmallFile(const std::string& name, int fd, std::string* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return Status::InvalidArgument(
        name + ": cannot read the key file: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        name +
        " is not a regular file (a key file is one line of 40 Z85 "
        "characters)");
  }
  if (st.st_size > kMaxKeyFileBytes) {
    return Status::InvalidArgument(name + " is " + std::to_string(st.st_size) +
                                   " bytes, more than a key file's " +
                                   std::to_string(kMaxKeyFileBytes));
  }
  char buf[kMaxKeyFileBytes + 1];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::InvalidArgument(
          name + ": cannot read the key file: " + std::strerror(errno));
    }
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

}  // namespace

StatusOr<std::string> ReadSecretKey(const std::string& name,
                                    const std::string& path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused
  // below as not a regular file).
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return Status::InvalidArgument(
        name + ": cannot read the key file: " + std::strerror(errno));
  }
  std::string text;
  Status st = ReadSmallFile(name, fd, &text);
  close(fd);
  PS_RETURN_IF_ERROR(st);
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  uint8_t key[32];
  if (line.size() != 40 || zmq_z85_decode(key, line.c_str()) == nullptr) {
    return Status::InvalidArgument(
        name +
        " does not hold a CurveZMQ secret key (its first line must be "
        "40 Z85 characters; make one with tracker/launch.py "
        "--make-key FILE)");
  }
  return line;
}

}  // namespace ps
