// Spare descriptors and the write by a child of its own descriptor table
// (spare_descriptors.h).
#include "kv/spare_descriptors.h"

#include <sys/syscall.h>
#include <sys/wait.h>

#include <cstring>
#include <memory>

namespace ps {

namespace {

std::string Errno(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// What a child of WriteInChild did: the call that failed (0: none) and
// its errno.
struct ChildResult {
  int failed = 0;  // 1 create, 2 write, 3 fsync, 4 close, 5 rename, 6 folder
  int error = 0;
};

// The child's part of WriteInChild: raw system calls only (it shares the
// parent's memory and runs on its stack: no allocation, no lock).
[[noreturn]] void WriteAsChild(int spare, const char* tmp, const char* path,
                               const char* dir, const char* bytes, size_t n,
                               ChildResult* result) {
  auto fail = [result](int call) {
    result->failed = call;
    result->error = errno;
    _exit(1);
  };
  syscall(SYS_close, spare);  // this child's copy only
  long fd = syscall(SYS_openat, AT_FDCWD, tmp, kCreateFlags, 0600);
  if (fd < 0 && errno == EEXIST &&
      syscall(SYS_unlinkat, AT_FDCWD, tmp, 0) == 0) {
    fd = syscall(SYS_openat, AT_FDCWD, tmp, kCreateFlags, 0600);
  }
  if (fd < 0) fail(1);
  for (size_t done = 0; done < n;) {
    const long w = syscall(SYS_write, fd, bytes + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      syscall(SYS_unlinkat, AT_FDCWD, tmp, 0);
      fail(2);
    }
    done += static_cast<size_t>(w);
  }
  if (syscall(SYS_fsync, fd) != 0) {
    syscall(SYS_unlinkat, AT_FDCWD, tmp, 0);
    fail(3);
  }
  if (syscall(SYS_close, fd) != 0) {
    syscall(SYS_unlinkat, AT_FDCWD, tmp, 0);
    fail(4);
  }
  if (syscall(SYS_renameat, AT_FDCWD, tmp, AT_FDCWD, path) != 0) {
    syscall(SYS_unlinkat, AT_FDCWD, tmp, 0);
    fail(5);
  }
  const long d =
      syscall(SYS_openat, AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0 || syscall(SYS_fsync, d) != 0) fail(6);
  _exit(0);
}

}  // namespace

Status WriteInChild(int spare, const std::string& tmp, const std::string& path,
                    const std::string& dir, const std::string& bytes) {
  auto result = std::make_unique<ChildResult>();
  ChildResult* r = result.get();
  const pid_t pid = vfork();
  if (pid == 0) {
    WriteAsChild(spare, tmp.c_str(), path.c_str(), dir.c_str(), bytes.data(),
                 bytes.size(), r);
  }
  if (pid < 0) return Status::IOError(Errno("cannot start the writer of", tmp));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
  static const char* const kCalls[] = {
      "cannot write", "cannot create",    "cannot write", "cannot fsync",
      "cannot close", "cannot rename to", "cannot fsync"};
  if (!WIFEXITED(status) || r->failed < 1 || r->failed > 6) {
    return Status::IOError("'" + tmp + "': its writer ended with status " +
                           std::to_string(status));
  }
  errno = r->error;
  const std::string& what = r->failed == 5 ? path : r->failed == 6 ? dir : tmp;
  return Status::IOError(Errno(kCalls[r->failed], what));
}

}  // namespace ps
