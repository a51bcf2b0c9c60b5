// mnist_dist's checkpoint calls on the library's checkpoint sets
// (checkpoint.h).
#include "checkpoint.h"

namespace mnist {

std::string CheckpointPath(const CheckpointJob& job, int step,
                           CheckpointRole role, int rank) {
  return ps::Checkpointer(job).Path(step, role, rank);
}

ps::Status PrepareCheckpointDir(const CheckpointJob& job) {
  return ps::Checkpointer(job).PrepareDir();
}

ps::Status CheckEmptyCheckpointDir(const CheckpointJob& job) {
  return ps::Checkpointer(job).CheckEmpty();
}

ps::Status WriteCheckpoint(const CheckpointJob& job, CheckpointRole role,
                           int rank, int step, const std::string& payload) {
  return ps::Checkpointer(job).Write(role, rank, step, payload);
}

ps::StatusOr<int> FindCheckpoint(const CheckpointJob& job,
                                 std::string* skipped) {
  return ps::Checkpointer(job).FindNewest(skipped);
}

ps::StatusOr<std::string> ReadCheckpoint(const CheckpointJob& job, int step,
                                         CheckpointRole role, int rank) {
  return ps::Checkpointer(job).Read(step, role, rank);
}

void RemoveCheckpointsAfter(const CheckpointJob& job, int step,
                            CheckpointRole role, int rank) {
  ps::Checkpointer(job).RemoveAfter(step, role, rank);
}

}  // namespace mnist
