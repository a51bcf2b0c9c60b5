// Checkpoint files of mnist_dist: one per server shard (its weights and
// optimizer state) and one per worker (its place in the data and its dropout
// generator) for each checkpointed step, in one folder:
//
//   DIR/step-00000010.server-0.ckpt   DIR/step-00000010.worker-1.ckpt
//
// A file is a header (magic, version, role, rank, S, W, step, the model's
// floats and chunk, the payload's size), the payload, and a zlib crc32 of
// all that before it (host byte order: a checkpoint is read back on the
// machines of the job that wrote it). It is written as a temporary file,
// fsynced, renamed over its name and the folder fsynced, so a crash leaves
// either the whole new file or none; a write that fails (a full disk)
// removes its temporary file. A step can be restored only when the files of
// every server and worker of the job exist and check: the newest such step
// is the job's checkpoint.
//
// Steps are kept and pruned as whole sets: after writing, each process
// removes its own files of steps older than the second-newest complete step
// (by the files' presence), so every role keeps the same two sets, and one
// torn or lost file of the newest set leaves the one before it whole.
//
// Files are private and read warily: a file is created with O_EXCL and
// O_NOFOLLOW, mode 0600 (a link planted under its temporary name is
// removed, never followed); a file is read only if it is a regular file (no
// link, no FIFO) no larger than a checkpoint of the job can be.
//
// Not thread-safe (each function is called by one thread of a process; the
// processes of a job share the folder without locks: each writes only its
// own files).
#ifndef PS_EXAMPLES_MNIST_CHECKPOINT_H_
#define PS_EXAMPLES_MNIST_CHECKPOINT_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "ps/status.h"

namespace mnist {

enum class CheckpointRole { kServer = 0, kWorker = 1 };

// What must match between the job that wrote a checkpoint and the one that
// restores it.
struct CheckpointJob {
  std::string dir;
  int num_servers = 0, num_workers = 0;
  uint64_t model_floats = 0, chunk = 0;
};

// "DIR/step-00000010.server-0.ckpt".
std::string CheckpointPath(const CheckpointJob& job, int step,
                           CheckpointRole role, int rank);

// Creates the folder with mode 0700 when it is missing. One that its group
// or everyone can write draws a warning (others could plant files there).
// IOError naming the folder when it cannot be made or is no folder.
ps::Status PrepareCheckpointDir(const CheckpointJob& job);

// Corruption naming `what`, the value and its index when values[0, n) holds
// a NaN or an infinity (restored weights must be finite).
ps::Status CheckFinite(const float* values, size_t n, const std::string& what);

// IOError naming the folder when it holds any checkpoint file (a new job
// must not mix its files with an old job's), or cannot be read.
ps::Status CheckEmptyCheckpointDir(const CheckpointJob& job);

// Writes (role, rank)'s file of `step` atomically (see above), then removes
// this process's files of steps older than the newest complete one. Error
// names the path and the call that failed.
ps::Status WriteCheckpoint(const CheckpointJob& job, CheckpointRole role,
                           int rank, int step, const std::string& payload);

// The newest step whose S + W files all exist and check. Newer steps that
// do not are described in *skipped ("" when none), e.g. "step 10: 'DIR/
// step-00000010.worker-1.ckpt' is missing". Errors: no usable step (each
// step's first bad file and why), or a file of another job shape (naming
// the file, its S, W, floats and chunk, and this job's).
ps::StatusOr<int> FindCheckpoint(const CheckpointJob& job,
                                 std::string* skipped);

// The payload of (role, rank)'s file of `step`, checked again.
ps::StatusOr<std::string> ReadCheckpoint(const CheckpointJob& job, int step,
                                         CheckpointRole role, int rank);

// Removes (role, rank)'s files of steps after `step` (left by the run that
// was killed), so they never mix with the resumed run's.
void RemoveCheckpointsAfter(const CheckpointJob& job, int step,
                            CheckpointRole role, int rank);

// Payloads: trivially copyable values and length-prefixed byte strings.
class Packer {
 public:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    data_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutBytes(const void* p, size_t n) {
    Put<uint64_t>(n);
    data_.append(static_cast<const char*>(p), n);
  }
  void PutString(const std::string& s) { PutBytes(s.data(), s.size()); }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

// Reads what a Packer wrote; every Get is false (and reads nothing) past the
// end.
class Unpacker {
 public:
  explicit Unpacker(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint64_t n;
    if (!Get(&n) || data_.size() - at_ < n) return false;
    s->assign(data_, at_, n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == data_.size(); }

 private:
  const std::string& data_;
  size_t at_ = 0;
};

}  // namespace mnist

#endif  // PS_EXAMPLES_MNIST_CHECKPOINT_H_
