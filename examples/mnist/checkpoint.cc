// Checkpoint files: atomic writes, checks, and the choice of the step to
// restore (checkpoint.h).
#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace mnist {

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
ps::StatusOr<std::set<int>> ListSteps(const std::string& dir,
                                      CheckpointRole role, int rank) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), &closedir);
  if (!d) return ps::Status::IOError(Errno("cannot list", dir));
  std::set<int> steps;
  while (dirent* e = readdir(d.get())) {
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
  return steps;
}

ps::Status FsyncPath(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags);
  if (fd < 0) return ps::Status::IOError(Errno("cannot open", path));
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return ps::Status::IOError(Errno("cannot fsync", path));
  return ps::Status::OK();
}

// The payload, or why the file is unusable: NotFound, IOError or Corruption
// (the step is skipped), or another job's shape as InvalidArgument (restore
// stops there).
ps::StatusOr<std::string> LoadChecked(const CheckpointJob& job, int step,
                                      CheckpointRole role, int rank) {
  const std::string path = CheckpointPath(job, step, role, rank);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"),
                                          &std::fclose);
  if (!f) {
    if (errno == ENOENT)
      return ps::Status::NotFound("'" + path + "' is missing");
    return ps::Status::IOError(Errno("cannot read", path));
  }
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0)
    bytes.append(buf, n);
  if (std::ferror(f.get()))
    return ps::Status::IOError(Errno("cannot read", path));
  Header h;
  if (bytes.size() < sizeof(h) + sizeof(uint32_t)) {
    return ps::Status::Corruption("'" + path + "' is truncated (" +
                                  std::to_string(bytes.size()) + " bytes)");
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return ps::Status::Corruption("'" + path + "' is no checkpoint file");
  }
  if (h.version != kVersion) {
    return ps::Status::Corruption(
        "'" + path + "' has version " + std::to_string(h.version) +
        " (this program reads " + std::to_string(kVersion) + ")");
  }
  const uint64_t want = sizeof(h) + h.payload_bytes + sizeof(uint32_t);
  if (bytes.size() != want) {
    return ps::Status::Corruption(
        "'" + path + "' is torn: " + std::to_string(bytes.size()) +
        " bytes where its header says " + std::to_string(want));
  }
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - sizeof(crc), sizeof(crc));
  if (crc != Crc(bytes, bytes.size() - sizeof(crc))) {
    return ps::Status::Corruption("'" + path +
                                  "' is corrupt: checksum mismatch");
  }
  if (h.role != static_cast<int>(role) || h.rank != rank || h.step != step) {
    return ps::Status::Corruption(
        "'" + path + "' holds " +
        RoleName(static_cast<CheckpointRole>(h.role)) + " " +
        std::to_string(h.rank) + "'s step " + std::to_string(h.step));
  }
  if (h.num_servers != job.num_servers || h.num_workers != job.num_workers ||
      h.model_floats != job.model_floats || h.chunk != job.chunk) {
    return ps::Status::InvalidArgument(
        "'" + path + "' was written by a job of " +
        Shape(h.num_servers, h.num_workers, h.model_floats, h.chunk) +
        "; this job has " +
        Shape(job.num_servers, job.num_workers, job.model_floats, job.chunk));
  }
  return bytes.substr(sizeof(h), h.payload_bytes);
}

}  // namespace

std::string CheckpointPath(const CheckpointJob& job, int step,
                           CheckpointRole role, int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08d.%s-%d.ckpt", step,
                RoleName(role), rank);
  return job.dir + "/" + name;
}

ps::Status CheckEmptyCheckpointDir(const CheckpointJob& job) {
  auto steps = ListSteps(job.dir, CheckpointRole::kServer, -1);
  if (!steps.ok()) return steps.status();
  if (!steps->empty()) {
    return ps::Status::InvalidArgument(
        "'" + job.dir + "' already holds checkpoints (steps " +
        std::to_string(*steps->begin()) + " to " +
        std::to_string(*steps->rbegin()) +
        "): pass --restore to resume from them, or name an empty folder");
  }
  return ps::Status::OK();
}

ps::Status WriteCheckpoint(const CheckpointJob& job, CheckpointRole role,
                           int rank, int step, const std::string& payload) {
  Header h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.role = static_cast<int32_t>(role);
  h.rank = rank;
  h.num_servers = job.num_servers;
  h.num_workers = job.num_workers;
  h.step = step;
  h.model_floats = job.model_floats;
  h.chunk = job.chunk;
  h.payload_bytes = payload.size();
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  bytes += payload;
  const uint32_t crc = Crc(bytes, bytes.size());
  bytes.append(reinterpret_cast<const char*>(&crc), sizeof(crc));

  const std::string path = CheckpointPath(job, step, role, rank);
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ps::Status::IOError(Errno("cannot create", tmp));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return ps::Status::IOError(Errno("cannot write", tmp));
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    close(fd);
    return ps::Status::IOError(Errno("cannot fsync", tmp));
  }
  if (close(fd) != 0) return ps::Status::IOError(Errno("cannot close", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ps::Status::IOError(Errno("cannot rename to", path));
  }
  PS_RETURN_IF_ERROR(FsyncPath(job.dir, O_RDONLY | O_DIRECTORY));

  // Keep ours from the newest complete step on (by the files' presence).
  auto all = ListSteps(job.dir, role, -1);
  auto mine = ListSteps(job.dir, role, rank);
  if (!all.ok() || !mine.ok()) return ps::Status::OK();  // keep everything
  int complete = -1;
  for (auto it = all->rbegin(); it != all->rend() && complete < 0; ++it) {
    bool whole = true;
    for (int s = 0; s < job.num_servers && whole; ++s) {
      whole =
          access(CheckpointPath(job, *it, CheckpointRole::kServer, s).c_str(),
                 F_OK) == 0;
    }
    for (int w = 0; w < job.num_workers && whole; ++w) {
      whole =
          access(CheckpointPath(job, *it, CheckpointRole::kWorker, w).c_str(),
                 F_OK) == 0;
    }
    if (whole) complete = *it;
  }
  for (int s : *mine) {
    if (s < complete) std::remove(CheckpointPath(job, s, role, rank).c_str());
  }
  return ps::Status::OK();
}

ps::StatusOr<int> FindCheckpoint(const CheckpointJob& job,
                                 std::string* skipped) {
  skipped->clear();
  auto steps = ListSteps(job.dir, CheckpointRole::kServer, -1);
  if (!steps.ok()) return steps.status();
  if (steps->empty()) {
    return ps::Status::NotFound("no checkpoint in '" + job.dir + "'");
  }
  std::vector<std::pair<CheckpointRole, int>> files;
  for (int s = 0; s < job.num_servers; ++s)
    files.push_back({CheckpointRole::kServer, s});
  for (int w = 0; w < job.num_workers; ++w)
    files.push_back({CheckpointRole::kWorker, w});
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    ps::Status bad;
    for (const auto& [role, rank] : files) {
      auto loaded = LoadChecked(job, *it, role, rank);
      if (loaded.ok()) continue;
      if (loaded.status().code() == ps::Status::kInvalidArgument) {
        return loaded.status();
      }
      bad = loaded.status();
      break;
    }
    if (bad.ok()) return *it;
    *skipped += (skipped->empty() ? "" : "; ") + std::string("step ") +
                std::to_string(*it) + ": " + bad.message();
  }
  return ps::Status::NotFound("no usable checkpoint in '" + job.dir +
                              "': " + *skipped);
}

ps::StatusOr<std::string> ReadCheckpoint(const CheckpointJob& job, int step,
                                         CheckpointRole role, int rank) {
  return LoadChecked(job, step, role, rank);
}

void RemoveCheckpointsAfter(const CheckpointJob& job, int step,
                            CheckpointRole role, int rank) {
  auto mine = ListSteps(job.dir, role, rank);
  if (!mine.ok()) return;
  for (int s : *mine) {
    if (s > step) std::remove(CheckpointPath(job, s, role, rank).c_str());
  }
}

}  // namespace mnist
