// Checkpoint sets: atomic writes, checks, pruning of whole sets and the
// choice of the set to restore (checkpointer.h).
#include "kv/checkpointer.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "kv/spare_descriptors.h"

namespace ps {

namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\n', '\0'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  int32_t role, rank, num_servers, num_workers, step;
  uint64_t model_floats, chunk, payload_bytes;
};
static_assert(std::is_trivially_copyable<Header>::value, "written as bytes");

const char* RoleName(CheckpointRole role) {
  return role == CheckpointRole::kServer ? "server" : "worker";
}

std::string Errno(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

uint32_t Crc(const std::string& bytes, size_t n) {
  return static_cast<uint32_t>(crc32(
      0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n)));
}

std::string Shape(int servers, int workers, uint64_t floats, uint64_t chunk) {
  return std::to_string(servers) + " servers, " + std::to_string(workers) +
         " workers, a model of " + std::to_string(floats) +
         " floats in keys of " + std::to_string(chunk);
}

// The steps of the checkpoint files in the folder (any role and rank), or
// of (role, rank)'s files only when `rank` >= 0.
// (The entries are read with getdents64 on a descriptor of the reserve's,
// which opendir would not let it take back.)
StatusOr<std::set<int>> ListSteps(const std::string& dir, CheckpointRole role,
                                  int rank) {
  const int fd = SpareDescriptors::Get().Open(
      dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Errno("cannot list", dir));
  std::unique_ptr<const int, SpareDescriptors::Closer> closer(new int(fd));
  std::set<int> steps;
  alignas(dirent64) char buf[16384];
  ssize_t n;
  while ((n = getdents64(fd, buf, sizeof(buf))) > 0) {
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const dirent64*>(buf + at);
      at += e->d_reclen;
      int step, r, end = 0;
      char who[8] = {0};
      if (std::sscanf(e->d_name, "step-%d.%6[a-z]-%d.ckpt%n", &step, who, &r,
                      &end) != 3 ||
          e->d_name[end] != '\0') {
        continue;
      }
      if (rank < 0 || (std::string(who) == RoleName(role) && r == rank)) {
        steps.insert(step);
      }
    }
  }
  if (n < 0) return Status::IOError(Errno("cannot list", dir));
  return steps;
}

Status FsyncPath(const std::string& path, int flags) {
  int fd = SpareDescriptors::Get().Open(path.c_str(), flags);
  if (fd < 0) return Status::IOError(Errno("cannot open", path));
  int rc = fsync(fd);
  SpareDescriptors::Get().Close(fd);
  if (rc != 0) return Status::IOError(Errno("cannot fsync", path));
  return Status::OK();
}

// The bytes of the regular file at path, read without following a link and
// without blocking (a FIFO planted there is refused, not waited on).
// NotFound when missing; Corruption for a link, a non-regular file or one
// over max_bytes; IOError otherwise.
StatusOr<std::string> ReadRegularFile(const std::string& path,
                                      uint64_t max_bytes) {
  const int fd = SpareDescriptors::Get().Open(
      path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("'" + path + "' is missing");
    if (errno == ELOOP) {
      return Status::Corruption("'" + path + "' is a symbolic link");
    }
    return Status::IOError(Errno("cannot read", path));
  }
  std::unique_ptr<const int, SpareDescriptors::Closer> closer(new int(fd));
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::IOError(Errno("cannot stat", path));
  if (!S_ISREG(st.st_mode)) {
    return Status::Corruption("'" + path + "' is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Status::Corruption(
        "'" + path + "' is " + std::to_string(size) +
        " bytes, more than a checkpoint of this job can be (" +
        std::to_string(max_bytes) + ")");
  }
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(Errno("cannot read", path));
    if (n == 0) break;  // shrunk meanwhile: the size check names it
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// Creates path exclusively (a file or link already there, left by a crash
// or planted, is removed first: unlink removes a link, never its target),
// without following links, readable by its owner only: a model is as
// private as the job's key.
// *at_limit: whether it failed for want of a descriptor.

StatusOr<int> CreatePrivate(const std::string& path, bool* at_limit) {
  int fd = open(path.c_str(), kCreateFlags, 0600);
  if (fd < 0 && errno == EEXIST) {
    if (unlink(path.c_str()) != 0) {
      return Status::IOError(Errno("cannot remove the stale", path));
    }
    fd = open(path.c_str(), kCreateFlags, 0600);
  }
  *at_limit = fd < 0 && errno == EMFILE;
  if (fd < 0) return Status::IOError(Errno("cannot create", path));
  return fd;
}

// Writes all of bytes to fd, fsyncs and closes it; on failure removes path
// (so a full disk is not kept full by a partial file).
Status WriteAndClose(int fd, const std::string& bytes,
                     const std::string& path) {
  size_t done = 0;
  Status st;
  while (done < bytes.size() && st.ok()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st = Status::IOError(Errno("cannot write", path));
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (st.ok() && fsync(fd) != 0) {
    st = Status::IOError(Errno("cannot fsync", path));
  }
  if (SpareDescriptors::Get().Close(fd) != 0 && st.ok()) {
    st = Status::IOError(Errno("cannot close", path));
  }
  if (!st.ok()) unlink(path.c_str());
  return st;
}

// The payload of `bytes`, the file at `path` that should hold (role,
// rank)'s step `step` of `job`, or why it does not: Corruption (the set is
// unusable), or another job's shape as InvalidArgument (restore stops).
StatusOr<std::string> Verify(const CheckpointJob& job, const std::string& path,
                             const std::string& bytes, int step,
                             CheckpointRole role, int rank) {
  Header h;
  if (bytes.size() < sizeof(h) + sizeof(uint32_t)) {
    return Status::Corruption("'" + path + "' is truncated (" +
                              std::to_string(bytes.size()) + " bytes)");
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return Status::Corruption("'" + path + "' is no checkpoint file");
  }
  if (h.version != kVersion) {
    return Status::Corruption(
        "'" + path + "' has version " + std::to_string(h.version) +
        " (this program reads " + std::to_string(kVersion) + ")");
  }
  const uint64_t want = sizeof(h) + h.payload_bytes + sizeof(uint32_t);
  if (bytes.size() != want) {
    return Status::Corruption(
        "'" + path + "' is torn: " + std::to_string(bytes.size()) +
        " bytes where its header says " + std::to_string(want));
  }
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - sizeof(crc), sizeof(crc));
  if (crc != Crc(bytes, bytes.size() - sizeof(crc))) {
    return Status::Corruption("'" + path + "' is corrupt: checksum mismatch");
  }
  if (h.role != static_cast<int>(role) || h.rank != rank || h.step != step) {
    return Status::Corruption("'" + path + "' holds " +
                              RoleName(static_cast<CheckpointRole>(h.role)) +
                              " " + std::to_string(h.rank) + "'s step " +
                              std::to_string(h.step));
  }
  if (h.num_servers != job.num_servers || h.num_workers != job.num_workers ||
      h.model_floats != job.model_floats || h.chunk != job.chunk) {
    return Status::InvalidArgument(
        "'" + path + "' was written by a job of " +
        Shape(h.num_servers, h.num_workers, h.model_floats, h.chunk) +
        "; this job has " +
        Shape(job.num_servers, job.num_workers, job.model_floats, job.chunk));
  }
  return bytes.substr(sizeof(h), h.payload_bytes);
}

}  // namespace

int OldestKeptStep(const std::set<int>& steps,
                   const std::function<bool(int step)>& complete, int keep) {
  int complete_sets = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (!complete(*it)) continue;
    if (++complete_sets == keep) return *it;
  }
  return -1;
}

StatusOr<int> NewestUsableStep(const std::set<int>& steps,
                               const std::function<Status(int step)>& verify,
                               std::string* skipped) {
  skipped->clear();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const Status bad = verify(*it);
    if (bad.ok()) return *it;
    if (bad.code() == Status::kInvalidArgument) return bad;
    *skipped += (skipped->empty() ? "" : "; ") + std::string("step ") +
                std::to_string(*it) + ": " + bad.message();
  }
  return Status::NotFound(*skipped);
}

Checkpointer::Checkpointer(CheckpointJob job) : job_(std::move(job)) {
  SpareDescriptors::Get();
}

std::string Checkpointer::Path(int step, CheckpointRole role, int rank) const {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08d.%s-%d.ckpt", step,
                RoleName(role), rank);
  return job_.dir + "/" + name;
}

Status Checkpointer::PrepareDir() const {
  if (mkdir(job_.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::IOError(Errno("cannot create the folder", job_.dir));
  }
  struct stat st;
  if (stat(job_.dir.c_str(), &st) != 0) {
    return Status::IOError(Errno("cannot stat", job_.dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::IOError("'" + job_.dir + "' is not a folder");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
    LOG(WARNING) << "checkpoint folder '" << job_.dir << "' is writable by "
                 << ((st.st_mode & S_IWOTH) ? "everyone" : "its group")
                 << " (mode " << mode
                 << "): others can plant files there; chmod 700 it";
  }
  return Status::OK();
}

Status Checkpointer::CheckEmpty() const {
  auto steps = ListSteps(job_.dir, CheckpointRole::kServer, -1);
  if (!steps.ok()) return steps.status();
  if (!steps->empty()) {
    return Status::InvalidArgument(
        "'" + job_.dir + "' already holds checkpoints (steps " +
        std::to_string(*steps->begin()) + " to " +
        std::to_string(*steps->rbegin()) +
        "): pass --restore to resume from them, or name an empty folder");
  }
  return Status::OK();
}

Status Checkpointer::Write(CheckpointRole role, int rank, int step,
                           const std::string& payload) const {
  Header h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.role = static_cast<int32_t>(role);
  h.rank = rank;
  h.num_servers = job_.num_servers;
  h.num_workers = job_.num_workers;
  h.step = step;
  h.model_floats = job_.model_floats;
  h.chunk = job_.chunk;
  h.payload_bytes = payload.size();
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  bytes += payload;
  const uint32_t crc = Crc(bytes, bytes.size());
  bytes.append(reinterpret_cast<const char*>(&crc), sizeof(crc));

  const std::string path = Path(step, role, rank);
  const std::string tmp = path + ".tmp";
  bool at_limit = false;
  auto fd = CreatePrivate(tmp, &at_limit);
  const int spare = at_limit ? SpareDescriptors::Get().spare() : -1;
  if (spare >= 0) {
    PS_RETURN_IF_ERROR(WriteInChild(spare, tmp, path, job_.dir, bytes));
    return Prune(role, rank);
  }
  if (!fd.ok()) return fd.status();
  PS_RETURN_IF_ERROR(WriteAndClose(*fd, bytes, tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const Status st = Status::IOError(Errno("cannot rename to", path));
    unlink(tmp.c_str());
    return st;
  }
  PS_RETURN_IF_ERROR(FsyncPath(job_.dir, O_RDONLY | O_DIRECTORY));
  return Prune(role, rank);
}

Status Checkpointer::Prune(CheckpointRole role, int rank) const {
  // Keep ours from the kCheckpointSetsKept-th newest complete step on, so
  // that one bad file of the newest set leaves a whole one.
  auto all = ListSteps(job_.dir, role, -1);
  auto mine = ListSteps(job_.dir, role, rank);
  if (!all.ok() || !mine.ok()) return Status::OK();  // keep everything
  const int oldest_kept = OldestKeptStep(
      *all, [this](int s) { return SetComplete(s); }, kCheckpointSetsKept);
  if (oldest_kept < 0) return Status::OK();
  for (int s : *mine) {
    if (s < oldest_kept) unlink(Path(s, role, rank).c_str());
  }
  return Status::OK();
}

StatusOr<int> Checkpointer::FindNewest(std::string* skipped) const {
  skipped->clear();
  auto steps = ListSteps(job_.dir, CheckpointRole::kServer, -1);
  if (!steps.ok()) return steps.status();
  if (steps->empty()) {
    return Status::NotFound("no checkpoint in '" + job_.dir + "'");
  }
  StatusOr<int> step = NewestUsableStep(
      *steps, [this](int s) { return VerifySet(s); }, skipped);
  if (step.ok() || step.status().code() != Status::kNotFound) return step;
  return Status::NotFound("no usable checkpoint in '" + job_.dir +
                          "': " + *skipped);
}

StatusOr<std::string> Checkpointer::Read(int step, CheckpointRole role,
                                         int rank) const {
  const std::string path = Path(step, role, rank);
  auto bytes = ReadRegularFile(path, MaxFileBytes());
  if (!bytes.ok()) return bytes.status();
  return Verify(job_, path, *bytes, step, role, rank);
}

void Checkpointer::RemoveAfter(int step, CheckpointRole role, int rank) const {
  auto mine = ListSteps(job_.dir, role, rank);
  if (!mine.ok()) return;
  for (int s : *mine) {
    if (s > step) std::remove(Path(s, role, rank).c_str());
  }
}

bool Checkpointer::SetComplete(int step) const {
  for (int s = 0; s < job_.num_servers; ++s) {
    if (access(Path(step, CheckpointRole::kServer, s).c_str(), F_OK) != 0) {
      return false;
    }
  }
  for (int w = 0; w < job_.num_workers; ++w) {
    if (access(Path(step, CheckpointRole::kWorker, w).c_str(), F_OK) != 0) {
      return false;
    }
  }
  return true;
}

Status Checkpointer::VerifySet(int step) const {
  std::vector<std::pair<CheckpointRole, int>> files;
  for (int s = 0; s < job_.num_servers; ++s) {
    files.push_back({CheckpointRole::kServer, s});
  }
  for (int w = 0; w < job_.num_workers; ++w) {
    files.push_back({CheckpointRole::kWorker, w});
  }
  for (const auto& [role, rank] : files) {
    auto loaded = Read(step, role, rank);
    if (!loaded.ok()) return loaded.status();
  }
  return Status::OK();
}

// A server's slice with two optimizer states and a worker's small payload
// both fit four times the model, plus a megabyte. A larger file is refused
// before it is read.
uint64_t Checkpointer::MaxFileBytes() const {
  return sizeof(Header) + sizeof(uint32_t) + 4 * job_.model_floats * 4 +
         (1u << 20);
}

Status CheckFinite(const float* values, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      return Status::Corruption(what + " holds a non-finite value (" +
                                std::to_string(values[i]) + ") at index " +
                                std::to_string(i));
    }
  }
  return Status::OK();
}

}  // namespace ps
