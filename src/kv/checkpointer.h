// Checkpointer: checkpoint SETS of a parameter-server job in one folder. A
// set is every file of one step: one per server shard and one per worker,
//
//   DIR/step-00000010.server-0.ckpt   DIR/step-00000010.worker-1.ckpt
//
// and it is usable only when it is complete and every file of it verifies.
// What a file holds is its writer's (an opaque payload: a dense shard's
// weights and optimizer state, a worker's place in the data; Packer and
// Unpacker below help), so a dense and a sparse shard share the sets.
//
// A file is a header (magic, version, role, rank, S, W, step, the model's
// floats and chunk, the payload's size), the payload, and a zlib crc32 of
// all that before it (host byte order: a checkpoint is read back on the
// machines of the job that wrote it). It is written as a temporary file,
// fsynced, renamed over its name and the folder fsynced, so a crash leaves
// either the whole new file or none; a write that fails (a full disk)
// removes its temporary file.
//
// Sets are kept and pruned whole: after writing, each process removes its
// own files of steps older than the second-newest complete step (by the
// files' presence; OldestKeptStep), so every role keeps the same two sets,
// and one torn or lost file of the newest set leaves the one before it
// whole. A restore takes the newest set whose files all verify
// (NewestUsableStep).
//
// Files are private and read warily: a file is created with O_EXCL and
// O_NOFOLLOW, mode 0600 (a link planted under its temporary name is
// removed, never followed), the folder with mode 0700; a file is read only
// if it is a regular file (no link, no FIFO) no larger than a checkpoint of
// the job can be, and its size must be the one its header says.
//
// When a shard's state belongs to a set is CheckpointSchedule's (below).
//
// Descriptors: a checkpoint must not fail for want of one (a flood of
// connections can bring the process to its RLIMIT_NOFILE). The first
// Checkpointer made (at a job's start) sets a few descriptors of /dev/null
// aside for the process. A write that finds the process at its limit is
// done by a child (vfork: the same memory, its own copy of the descriptor
// table) that closes its copy of one and so has a number no thread of
// this process can take first (ZeroMQ retries a failed accept at once).
// Any other open (a read, a listing, the folder's fsync) that fails with
// EMFILE is retried in the number of a spare freed just before (another
// thread may take it first: then the next of 4), taken back when done.
//
// Thread-safety: a Checkpointer is immutable; its methods may run on any
// thread, but two processes (or threads) must not write the same (role,
// rank)'s files. The processes of a job share the folder without locks:
// each writes and prunes only its own files. Packer, Unpacker and
// CheckpointSchedule are not thread-safe (one owner each).
#ifndef PS_SRC_KV_CHECKPOINTER_H_
#define PS_SRC_KV_CHECKPOINTER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "ps/status.h"

namespace ps {

enum class CheckpointRole { kServer = 0, kWorker = 1 };

// What must match between the job that wrote a checkpoint and the one that
// restores it, and where its files are.
struct CheckpointJob {
  std::string dir;
  int num_servers = 0, num_workers = 0;
  uint64_t model_floats = 0, chunk = 0;
};

// Complete sets kept: the newest and the one before it.
constexpr int kCheckpointSetsKept = 2;

// Set selection, as pure functions of the steps found (ascending):
//
// The step from which a process keeps its files: the `keep`-th newest step
// that `complete` says is complete; -1 when fewer are (nothing is pruned).
int OldestKeptStep(const std::set<int>& steps,
                   const std::function<bool(int step)>& complete, int keep);
// The newest step whose set `verify` finds usable (OK). Newer steps it
// finds unusable are described in *skipped ("step 10: why; step 5: why",
// "" when none). An InvalidArgument from verify (another job's file) ends
// the search and is returned; NotFound(*skipped) when no step is usable.
StatusOr<int> NewestUsableStep(const std::set<int>& steps,
                               const std::function<Status(int step)>& verify,
                               std::string* skipped);

class Checkpointer {
 public:
  // Sets the process's spare descriptors aside when none are yet.
  explicit Checkpointer(CheckpointJob job);

  const CheckpointJob& job() const { return job_; }

  // "DIR/step-00000010.server-0.ckpt".
  std::string Path(int step, CheckpointRole role, int rank) const;

  // Creates the folder with mode 0700 when it is missing. One that its
  // group or everyone can write draws a warning (others could plant files
  // there). IOError naming the folder when it cannot be made or is none.
  Status PrepareDir() const;

  // IOError naming the folder when it holds any checkpoint file (a new job
  // must not mix its files with an old job's), or cannot be read.
  Status CheckEmpty() const;

  // Writes (role, rank)'s file of `step` atomically, then removes this
  // process's files of steps older than the kCheckpointSetsKept-th newest
  // complete set. Error names the path and the call that failed.
  Status Write(CheckpointRole role, int rank, int step,
               const std::string& payload) const;

  // The newest step whose S + W files all exist and verify. Newer steps
  // that do not are described in *skipped ("" when none), e.g. "step 10:
  // 'DIR/step-00000010.worker-1.ckpt' is missing". Errors: no usable step
  // (each step's first bad file and why), or a file of another job shape
  // (naming the file, its S, W, floats and chunk, and this job's).
  StatusOr<int> FindNewest(std::string* skipped) const;

  // The payload of (role, rank)'s file of `step`, verified again.
  StatusOr<std::string> Read(int step, CheckpointRole role, int rank) const;

  // Removes (role, rank)'s files of steps after `step` (left by the run
  // that was killed), so they never mix with the resumed run's.
  void RemoveAfter(int step, CheckpointRole role, int rank) const;

 private:
  // Removes (role, rank)'s files of steps older than the
  // kCheckpointSetsKept-th newest complete set; OK (a failed listing keeps
  // everything).
  Status Prune(CheckpointRole role, int rank) const;
  // Whether every server's and worker's file of `step` exists.
  bool SetComplete(int step) const;
  // OK, or the first file of `step`'s set that is unusable and why.
  Status VerifySet(int step) const;
  // The largest file a checkpoint of this job can be.
  uint64_t MaxFileBytes() const;

  const CheckpointJob job_;
};

// Corruption naming `what`, the value and its index when values[0, n) holds
// a NaN or an infinity (restored weights must be finite).
Status CheckFinite(const float* values, size_t n, const std::string& what);

// When a shard's state belongs to a checkpoint set: each time every key has
// had exactly t updates applied, t past the last one taken and a multiple
// of `every` (0: none) or a step asked for by At before it was reached.
class CheckpointSchedule {
 public:
  // A shard restored at `first_step` has that state already.
  CheckpointSchedule(int every, int first_step)
      : every_(every), last_(first_step) {}

  // Also take the state at `step`.
  void At(int step) { at_.insert(step); }

  // Whether the state where every key has `steps` updates is due; it counts
  // as taken when it is.
  bool Due(int steps) {
    if (steps <= last_) return false;
    const bool asked = at_.erase(steps) > 0;
    if (!asked && (every_ == 0 || steps % every_ != 0)) return false;
    last_ = steps;
    return true;
  }

 private:
  const int every_;
  int last_;
  std::set<int> at_;
};

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
  // n bytes as they are (the reader knows n).
  void PutRaw(const void* p, size_t n) {
    data_.append(static_cast<const char*>(p), n);
  }
  void Reserve(size_t n) { data_.reserve(n); }
  const std::string& data() const { return data_; }
  std::string Take() { return std::move(data_); }

 private:
  std::string data_;
};

// Reads what a Packer wrote; every Get is false (and reads nothing) past the
// end. `data` must outlive it.
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
  // n bytes that PutRaw wrote.
  bool GetRaw(void* p, size_t n) {
    if (data_.size() - at_ < n) return false;
    std::memcpy(p, data_.data() + at_, n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == data_.size(); }

 private:
  const std::string& data_;
  size_t at_ = 0;
};

}  // namespace ps

#endif  // PS_SRC_KV_CHECKPOINTER_H_
