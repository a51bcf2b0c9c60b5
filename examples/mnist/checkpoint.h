// mnist_dist's checkpoints: the library's checkpoint sets (src/kv/
// checkpointer.h: one file per server shard and per worker for each
// checkpointed step, written atomically, kept and pruned as whole sets, a
// restore from the newest complete set whose files all verify) under the
// names the trainer uses. What goes into the files is the trainer's:
// dist_server.cc packs a server's slice of the weights and its optimizer
// states, worker_checkpoint.cc a worker's place in the data and its dropout
// generator; dist_common.cc says what the job is (CheckpointJobOf).
//
// Not thread-safe (each function is called by one thread of a process; the
// processes of a job share the folder without locks: each writes only its
// own files).
#ifndef PS_EXAMPLES_MNIST_CHECKPOINT_H_
#define PS_EXAMPLES_MNIST_CHECKPOINT_H_

#include <string>

#include "kv/checkpointer.h"
#include "ps/node.h"
#include "ps/status.h"

namespace mnist {

using CheckpointRole = ps::CheckpointRole;
using CheckpointJob = ps::CheckpointJob;
using Packer = ps::Packer;
using Unpacker = ps::Unpacker;
// Corruption naming `what`, the value and its index for a NaN or infinity.
using ps::CheckFinite;

// "DIR/step-00000010.server-0.ckpt".
std::string CheckpointPath(const CheckpointJob& job, int step,
                           CheckpointRole role, int rank);

// The folder, made with mode 0700 when missing (Checkpointer::PrepareDir).
ps::Status PrepareCheckpointDir(const CheckpointJob& job);

// IOError naming the folder when it holds any checkpoint file.
ps::Status CheckEmptyCheckpointDir(const CheckpointJob& job);

// Writes (role, rank)'s file of `step`, then prunes this process's files of
// sets older than the two newest complete ones (Checkpointer::Write).
// With a `node`, its time and bytes go to the node's metrics.
ps::Status WriteCheckpoint(const CheckpointJob& job, CheckpointRole role,
                           int rank, int step, const std::string& payload,
                           ps::Node* node = nullptr);

// The newest step whose S + W files all exist and verify; the newer ones
// skipped and why in *skipped (Checkpointer::FindNewest).
ps::StatusOr<int> FindCheckpoint(const CheckpointJob& job,
                                 std::string* skipped);

// The payload of (role, rank)'s file of `step`, verified again.
ps::StatusOr<std::string> ReadCheckpoint(const CheckpointJob& job, int step,
                                         CheckpointRole role, int rank);

// Removes (role, rank)'s files of steps after `step` (left by the run that
// was killed), so they never mix with the resumed run's.
void RemoveCheckpointsAfter(const CheckpointJob& job, int step,
                            CheckpointRole role, int rank);

}  // namespace mnist

#endif  // PS_EXAMPLES_MNIST_CHECKPOINT_H_
