// mnist_dist's checkpoint calls on the library's checkpoint sets
// (checkpoint.h).
#include "checkpoint.h"

#include <chrono>
#include <filesystem>
#include <system_error>

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
                           int rank, int step, const std::string& payload,
                           ps::Node* node) {
  const auto start = std::chrono::steady_clock::now();
  ps::Checkpointer checkpointer(job);
  ps::Status st = checkpointer.Write(role, rank, step, payload);
  if (!st.ok() || node == nullptr) return st;
  std::error_code error;
  const auto bytes =
      std::filesystem::file_size(checkpointer.Path(step, role, rank), error);
  node->RecordCheckpoint(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      error ? payload.size() : bytes);
  return st;
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
