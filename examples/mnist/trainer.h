// The training loop of mnist_dist's workers and of its single process
// (--local): Train runs epochs of ForwardBackward on a worker's shard of the
// training set and hands each step's gradients to an Exchange, which either
// pushes them to the servers and pulls fresh weights or applies the
// optimizer locally (both in dist_worker.cc). It prints the progress,
// evaluation and target lines and writes the metrics file; a worker's
// checkpoints are worker_checkpoint.h's.
//
// Not thread-safe: one thread runs a Train (the Exchange may use others).
#ifndef PS_EXAMPLES_MNIST_TRAINER_H_
#define PS_EXAMPLES_MNIST_TRAINER_H_

#include <cstddef>

#include "dist_common.h"
#include "model/net.h"
#include "ps/ps.h"

namespace mnist {

// One step's communication: StartEarly from within ForwardBackward once
// grads()[first_float..] are final (model::GradsReady), Start after all of
// grads() are ready, Finish before the next ForwardBackward reads params().
// Between Start and Finish the trainer prepares the next batch, overlapping
// it with the network round trip.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // lr_period: the StepLR period of this step (the epoch, or step /
  // --lr_every_steps); it travels to the servers as the cmd tag.
  virtual void StartEarly(int /*step*/, int /*lr_period*/,
                          size_t /*first_float*/) {}
  virtual void Start(int step, int lr_period) = 0;
  virtual ps::Status Finish() = 0;
};

// Where a worker is: steps done in all, and within its epoch (a
// checkpoint's position; the batcher's order follows from the epoch).
struct Position {
  int steps = 0;
  int epoch = 0;
  int batches_in_epoch = 0;
};

struct Summary {
  ps::model::EvalResult eval;
  int steps = 0;
  double wall_s = 0, train_s = 0;  // train_s: without evaluations
  size_t samples = 0;
  bool reached = false;  // --target_accuracy reached (then training stopped)
};

// Runs every epoch from `from` (restored: the dropout generator too);
// evaluates after each when `test` is not empty. `node`: where the step,
// loss and samples/s go as metrics (PS_METRICS_PORT); null: nowhere.
// `who` and `rank` name the trainer in its lines ("worker 1").
Summary Train(const TrainOptions& options, const char* who, int rank,
              int num_workers, ps::model::Net* net, Exchange* exchange,
              const ps::model::Dataset& train, const ps::model::Dataset& test,
              ps::Node* node, const Position* from = nullptr);

}  // namespace mnist

#endif  // PS_EXAMPLES_MNIST_TRAINER_H_
