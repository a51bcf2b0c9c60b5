// A worker's checkpoints in mnist_dist (checkpoint.h: the library's
// checkpoint sets under the trainer's names): its Position in the data, its
// dropout generator and what its compression's error feedback holds,
// written every --checkpoint_every_steps steps or at worker 0's announced
// steps, and read back for --restore.
//
// Not thread-safe: called by the worker's training thread.
#ifndef PS_EXAMPLES_MNIST_WORKER_CHECKPOINT_H_
#define PS_EXAMPLES_MNIST_WORKER_CHECKPOINT_H_

#include "dist_common.h"
#include "model/net.h"
#include "trainer.h"

namespace mnist {

// The position and dropout generator of the checkpoint of `step` (also the
// compression state into options.compressor); removes this worker's later
// checkpoints. Dies naming the file.
Position LoadWorker(const TrainOptions& options, int rank, int step,
                    ps::model::Net* net);

// Writes this worker's checkpoint every --checkpoint_every_steps steps and
// at the steps worker 0 announced (--checkpoint_every_s), until a worker was
// lost (its files would never complete a step again). A failed write is
// logged; training goes on.
void MaybeCheckpoint(const TrainOptions& options, int rank, const Position& at,
                     const ps::model::Net& net);

}  // namespace mnist

#endif  // PS_EXAMPLES_MNIST_WORKER_CHECKPOINT_H_
