// Shared pieces of the distributed MNIST trainer (mnist_dist): its options
// (filled from flags and validated before ps::Start), how the flat parameter
// vector is cut into keys and placed on servers, and the metrics file.
#ifndef PS_EXAMPLES_MNIST_DIST_COMMON_H_
#define PS_EXAMPLES_MNIST_DIST_COMMON_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "model/backend.h"
#include "model/dataset.h"
#include "model/optimizer.h"
#include "ps/compress.h"
#include "ps/dense_server.h"
#include "ps/placement.h"
#include "ps/simple_app.h"
#include "ps/status.h"

namespace mnist {

class ClockCheckpoints;
class StopVotes;

struct TrainOptions {
  ps::model::DatasetKind dataset = ps::model::DatasetKind::kMnist;
  std::string data_dir;
  int epochs = 1;
  int batch_size = 32;  // per worker
  ps::model::OptimizerConfig optimizer;
  // The learning rate: one-cycle over the planned steps (ScheduleOf), or
  // StepLR by periods (lr_step, lr_every_steps, lr_gamma).
  ps::model::LrScheduleConfig::Kind lr_schedule =
      ps::model::LrScheduleConfig::Kind::kOneCycle;
  double warmup = 0.1;  // one-cycle: the fraction of planned steps
  // The peak lr is optimizer.lr * sqrt(W * batch_size / lr_ref_batch) (0:
  // optimizer.lr as given).
  int lr_ref_batch = 32;
  int lr_step = 1;         // StepLR: periods between decays
  int lr_every_steps = 0;  // a StepLR period: 0 = an epoch, else N steps
  float lr_gamma = 1.0f;
  size_t train_size = 0;  // examples in the training split, as loaded
  int max_shift = 1;      // augmentation: random shifts of up to N pixels
  float label_smoothing = 0.0f;  // of the training loss (NllFromLogProbs)
  // Label smoothing falls linearly from label_smoothing at step 0 to 0 at
  // the last planned step (as the one-cycle rate does).
  bool label_smoothing_decay = true;
  // Worker 0 evaluates an exponential moving average of the weights it
  // pulls, with this decay per step (0: the weights themselves).
  double ema_decay = 0.999;
  // Stop once worker 0's test accuracy reaches this (in %, 0: never),
  // evaluating every eval_every epochs; see StopVotes.
  double target_accuracy = 0.0;
  double eval_every = 0.25;
  ps::Consistency consistency = ps::Consistency::kBsp;
  int max_delay = 0;
  ps::model::Device device = ps::model::Device::kCpu;
  uint64_t seed = 1;
  size_t train_limit = 0, test_limit = 0;
  bool dropout = true;
  int threads = 0;
  // Workers push the fc layers' gradients (and pull their weights) while
  // the conv layers' backward pass still runs. That hides the exchange when
  // communication has a core to itself, but where the compute threads take
  // every core it only slows the backward pass by as much (CPU-bound
  // transfers and server updates), hence kAuto: on when --threads leaves a
  // core of this host free.
  enum class Overlap { kAuto, kOn, kOff };
  Overlap overlap = Overlap::kAuto;
  size_t chunk = 8192;  // floats per key
  // kBytes: servers hold equal shares of the bytes (fc1 split among them);
  // kTensor: whole tensors, as ps-lite's one key per tensor would place
  // them, so the server holding fc1.weight carries 98% of the bytes.
  enum class PlacementKind { kBytes, kTensor };
  PlacementKind placement = PlacementKind::kBytes;
  double log_every_s = 2.0;
  std::string metrics_file, metrics_dir, dump_weights;
  // Checkpoints (checkpoint.h) every checkpoint_every_steps steps into
  // checkpoint_dir (none when empty); restore_step >= 0: the step main()
  // chose to resume from (--restore).
  std::string checkpoint_dir;
  int checkpoint_every_steps = 0;
  double checkpoint_every_s = 0;
  ClockCheckpoints* clock = nullptr;  // with checkpoint_every_s; not owned
  StopVotes* votes = nullptr;         // with target_accuracy; not owned
  int restore_step = -1;
  // A worker's death: stop the job, or go on with the others.
  ps::WorkerFailure on_worker_failure = ps::WorkerFailure::kStop;
  bool allow_non_finite = false;  // servers sum NaN/inf gradients too
  // Values on the wire (ps/compress.h): the workers' and servers' filter,
  // made once per process (a worker's holds its error feedback, which goes
  // into its checkpoints); null without compression.
  ps::CompressOptions compress;
  std::shared_ptr<ps::Compressor> compressor;
  // Test hooks: the node named by die_node ("worker:R" or "server:R") kills
  // itself after die_after_steps steps (a server counts updates); the last
  // worker sleeps slow_worker_ms per step.
  int die_after_steps = 0;
  std::string die_node;
  bool die_freezes = false;  // SIGSTOP instead of SIGKILL
  // A server: as the first push of step die_after_steps arrives, before it
  // is summed (nothing of that step went to the replica), instead of in
  // the optimizer step of update die_after_steps (its sum went already).
  // A worker: in step die_after_steps, once the first server answered its
  // push, before it pushes to the others, instead of after the step.
  bool die_at_push = false;
  int slow_worker_ms = 0;
};

// Prints "mnist_dist: <message>" to stderr and exits 1.
[[noreturn]] void Die(const std::string& message);

// The checkpoint folder and job shape of this job (S and W of ps::).
CheckpointJob CheckpointJobOf(const TrainOptions& options);

// --checkpoint_every_s: worker 0 picks the checkpoint steps by its clock.
// At a step boundary (t steps done, step t not pushed yet) when T seconds
// passed since the last, it announces step t + 1 to every server (a
// SimpleApp request, app 1) and waits for their answers before it pushes
// step t; server 0 forwards it to every worker before it answers. No server
// can apply step t before worker 0 pushed it, and no worker can finish step
// t before server 0 answered its pull for step t + 1, which server 0 sends
// after the forward on the same connection, so every node knows of step
// t + 1 before it gets there: the servers snapshot when they have applied
// t + 1 updates, the workers write their files when they have done t + 1
// steps.
class ClockCheckpoints {
 public:
  // Before ps::Start, in every server and worker of the job.
  explicit ClockCheckpoints(double every_s);
  // Servers: `sink` gets each announced step (those before this call too).
  void SetSink(std::function<void(int step)> sink);
  // Worker 0, at the boundary with `steps` done (see above).
  void MaybeAnnounce(int steps);
  // Workers: whether a checkpoint was announced at `steps`.
  bool Announced(int steps);

 private:
  using Clock = std::chrono::steady_clock;
  const double every_s_;
  Clock::time_point last_ = Clock::now();  // worker 0's last announcement
  std::mutex mu_;  // the receive thread's handle vs. the training thread
  std::set<int> steps_;
  std::function<void(int)> sink_;
  ps::SimpleApp app_;  // last: its handle uses the members above
};

// --target_accuracy: at every evaluation step (a multiple of the evaluation
// interval, which every worker knows), worker 0 evaluates and sends its
// verdict, go on or stop, to every server (a SimpleApp request, app 2);
// server 0 forwards it to every worker before it answers. Every worker waits
// for the verdict of that step before it pushes the next, so all of them stop
// at the same step, with the weights worker 0 evaluated.
class StopVotes {
 public:
  // Before ps::Start, in every server and worker of the job.
  StopVotes();
  // Worker 0: sends the verdict of `steps` and waits for the servers.
  void Publish(int steps, bool stop);
  // Any worker: waits for the verdict of `steps`; true: stop.
  bool Await(int steps);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, bool> verdicts_;  // by step
  ps::SimpleApp app_;             // last: its handle uses the members above
};

// The learning-rate schedule of this job with W = num_workers: the planned
// steps follow from options.train_size, epochs, W and batch_size.
ps::model::LrScheduleConfig ScheduleOf(const TrainOptions& options,
                                       int num_workers);
// Steps each worker runs in one epoch (Batcher::batches_per_epoch).
int StepsPerEpoch(const TrainOptions& options, int num_workers);

// --on_worker_failure continue: after ps::Start, a worker's death is noted
// (WorkerLost) instead of ending this process; any other node's still ends
// it. Any thread.
void GoOnWithoutDeadWorkers();
bool WorkerLost();
// Ends this node: a barrier of everyone and ps::Finalize, or under
// `continue` (the dead worker cannot join a barrier) a barrier of the
// scheduler and servers only, while workers leave without one (they are
// done once every server answered their kDone).
void FinalizeNode(const TrainOptions& options);

// The flat parameter vector cut into keys of options.chunk floats.
ps::DenseLayout ModelLayout(const TrainOptions& options);
// Keys [0, K) balanced by bytes over num_servers servers; with kTensor the
// cuts fall only where a key's first float starts a new tensor.
ps::StatusOr<ps::Placement> ModelPlacement(
    const ps::DenseLayout& layout, int num_servers,
    TrainOptions::PlacementKind kind = TrainOptions::PlacementKind::kBytes);
// Server `rank`'s keys: [*begin, *end) (clipped to the layout's keys).
void ServerKeys(const ps::Placement& placement, const ps::DenseLayout& layout,
                int rank, ps::Key* begin, ps::Key* end);
// "conv1.weight[0:288) ... fc1.weight[0:331776)": the tensors (and float
// ranges within each) that floats [lo, hi) of the flat vector cover.
std::string DescribeFloats(size_t lo, size_t hi);

// JSON lines: {"time":..,"epoch":..,"step":..,"loss":..,"samples_per_s":..}
// and {"time":..,"epoch":..,"step":..,"accuracy":..,"test_loss":..}. A
// closed (no path) log ignores writes. Not thread-safe.
class MetricsLog {
 public:
  // "" opens nothing; `append` (a restored run) keeps what the file holds.
  // Error names the path.
  ps::Status Open(const std::string& path, bool append = false);
  void Progress(double time, int epoch, int64_t step, double loss,
                double samples_per_s);
  void Accuracy(double time, int epoch, int64_t step, double accuracy,
                double test_loss);

 private:
  struct Closer {
    void operator()(FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<FILE, Closer> file_;
};

// The metrics path of worker `rank` (or of the single-process run, rank 0):
// --metrics_file for rank 0, else --metrics_dir/worker<rank>.jsonl, else "".
std::string MetricsPath(const TrainOptions& options, int rank);

// Writes n floats to `path` (raw little-endian float32). Error names it.
ps::Status DumpFloats(const std::string& path, const float* data, size_t n);

int RunServer(const TrainOptions& options);
// Loads nothing: the caller passes the loaded splits (test may be empty for
// workers that do not evaluate).
int RunWorker(const TrainOptions& options, const ps::model::Dataset& train,
              const ps::model::Dataset& test);
// The same training loop in one process with no parameter server.
int RunLocal(const TrainOptions& options, const ps::model::Dataset& train,
             const ps::model::Dataset& test);

}  // namespace mnist

#endif  // PS_EXAMPLES_MNIST_DIST_COMMON_H_
