// ReadBearerToken: open without blocking, refuse what is not a small
// regular file, take the first line.
#include "metrics/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ps {

namespace {

const char kWhat[] =
    "a token file's first line is 16 to 256 printable characters without "
    "spaces";

Status CannotRead(const std::string& name) {
  return Status::InvalidArgument(
      name + ": cannot read the token file: " + std::strerror(errno));
}

// The whole of the open regular file `fd`, at most kMaxTokenFileBytes.
Status ReadSmall(const std::string& name, int fd, std::string* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return CannotRead(name);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(name + " is not a regular file (" + kWhat +
                                   ")");
  }
  if (st.st_size > kMaxTokenFileBytes) {
    return Status::InvalidArgument(name + " is " + std::to_string(st.st_size) +
                                   " bytes, more than a token file's " +
                                   std::to_string(kMaxTokenFileBytes));
  }
  char buf[kMaxTokenFileBytes + 1];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return CannotRead(name);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > static_cast<size_t>(kMaxTokenFileBytes)) {  // it grew meanwhile
    return Status::InvalidArgument(name + " is more than a token file's " +
                                   std::to_string(kMaxTokenFileBytes) +
                                   " bytes");
  }
  out->assign(buf, got);
  return Status::OK();
}

}  // namespace

StatusOr<std::string> ReadBearerToken(const std::string& name,
                                      const std::string& path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused
  // as not a regular file).
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return CannotRead(name);
  std::string text;
  Status st = ReadSmall(name, fd, &text);
  close(fd);
  PS_RETURN_IF_ERROR(st);
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  bool valid = line.size() >= 16 && line.size() <= 256;
  for (unsigned char ch : line) valid = valid && ch > 32 && ch < 127;
  if (!valid) {
    return Status::InvalidArgument(
        name + " does not hold a token (" + kWhat + "; its first line has " +
        std::to_string(line.size()) + " characters, not shown)");
  }
  return line;
}

}  // namespace ps
