// Descriptors for the opens a checkpoint must not fail for want of one
// (checkpointer.h, "Descriptors"): the process's spares, lent to an open
// that finds the process at its RLIMIT_NOFILE, and a file written by a
// child with its own copy of the descriptor table.
#ifndef PS_SRC_KV_SPARE_DESCRIPTORS_H_
#define PS_SRC_KV_SPARE_DESCRIPTORS_H_

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ps/status.h"

namespace ps {

// A checkpoint's temporary file: created, never followed through a link.
constexpr int kCreateFlags =
    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

// The process's descriptors set aside for checkpoints: copies of one
// /dev/null descriptor, which is never lent.
// Thread-safe; never destroyed (an open may run until the process ends).
class SpareDescriptors {
 public:
  static SpareDescriptors& Get() {
    static SpareDescriptors* reserve = new SpareDescriptors;
    return *reserve;
  }

  // open(path, flags, mode), retried in a spare's number when the process
  // is at its descriptor limit: -1 with errno when it still fails.
  int Open(const char* path, int flags, mode_t mode = 0) {
    int fd = open(path, flags, mode);
    if (fd >= 0 || errno != EMFILE) return fd;
    std::lock_guard<std::mutex> lock(mu_);
    while (!spares_.empty()) {
      close(spares_.back());
      spares_.pop_back();
      fd = open(path, flags, mode);
      if (fd >= 0) {
        lent_.insert(fd);
        return fd;
      }
      if (errno != EMFILE) {
        const int error = errno;
        Refill();  // the number freed is likely still free
        errno = error;
        return -1;
      }
    }
    errno = EMFILE;
    return -1;
  }

  // A descriptor of /dev/null this process holds for good (a child of its
  // own descriptors may close its copy); -1 when none could be opened.
  int spare() {
    std::lock_guard<std::mutex> lock(mu_);
    Refill();
    return null_;
  }

  // Closes fd (from Open): close()'s result; a lent one becomes a spare
  // again (close's own errors are then not seen: what is written is
  // fsynced before).
  int Close(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    int rc = 0;
    if (lent_.erase(fd) > 0 && null_ >= 0 && dup3(null_, fd, O_CLOEXEC) == fd) {
      spares_.push_back(fd);
    } else {
      rc = close(fd);
    }
    Refill();
    return rc;
  }

  // Closes a descriptor of Open (for a std::unique_ptr<const int, Closer>).
  struct Closer {
    void operator()(const int* fd) const {
      SpareDescriptors::Get().Close(*fd);
      delete fd;
    }
  };

 private:
  static constexpr size_t kSpares = 4;

  SpareDescriptors() {
    std::lock_guard<std::mutex> lock(mu_);
    Refill();
  }

  // Takes spares up to kSpares, as far as the limit lets it.
  void Refill() {
    if (null_ < 0) null_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    while (null_ >= 0 && spares_.size() < kSpares) {
      const int fd = fcntl(null_, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return;
      spares_.push_back(fd);
    }
  }

  std::mutex mu_;                 // guards the three below
  int null_ = -1;                 // /dev/null
  std::vector<int> spares_;       // copies of null_
  std::unordered_set<int> lent_;  // spares' numbers an Open holds
};

// For a process at its descriptor limit, where another thread may take any
// number it frees (e.g. ZeroMQ's, retrying an accept at once): writes
// `bytes` to `tmp` (created with kCreateFlags, mode 0600; one left there
// removed first), fsyncs it, renames it to `path` and fsyncs the folder
// `dir`, in a child (vfork: this process's memory, but a copy of its
// descriptor table) that first closes its copy of `spare`. Errors name the
// path and the call that failed; a failed write removes `tmp`.
Status WriteInChild(int spare, const std::string& tmp, const std::string& path,
                    const std::string& dir, const std::string& bytes);

}  // namespace ps

#endif  // PS_SRC_KV_SPARE_DESCRIPTORS_H_
