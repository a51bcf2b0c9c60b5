// A worker's checkpoint payload and when it is written (worker_checkpoint.h).
#include "worker_checkpoint.h"

#include <cstdint>
#include <string>

#include "ps/ps.h"

namespace mnist {

namespace {

// A worker's checkpoint payload: its position, dropout generator and what
// its compression's error feedback holds (empty without).
std::string WorkerPayload(const TrainOptions& options, const Position& at,
                          const ps::model::Net& net) {
  Packer out;
  out.Put<int32_t>(at.epoch);
  out.Put<int32_t>(at.batches_in_epoch);
  out.PutString(net.DropoutState());
  out.PutString(options.compressor ? options.compressor->SaveState() : "");
  return out.data();
}

}  // namespace

Position LoadWorker(const TrainOptions& options, int rank, int step,
                    ps::model::Net* net) {
  const CheckpointJob job = CheckpointJobOf(options);
  auto payload = ReadCheckpoint(job, step, CheckpointRole::kWorker, rank);
  if (!payload.ok()) Die("--restore: " + payload.status().message());
  Unpacker in(*payload);
  Position at;
  at.steps = step;
  std::string dropout, feedback;
  if (!in.Get(&at.epoch) || !in.Get(&at.batches_in_epoch) ||
      !in.GetString(&dropout) ||
      // The compression state (files written before it had none).
      (!in.done() && !in.GetString(&feedback)) || !in.done() || at.epoch < 0 ||
      at.batches_in_epoch < 0 || !net->SetDropoutState(dropout)) {
    Die("--restore: '" +
        CheckpointPath(job, step, CheckpointRole::kWorker, rank) +
        "': not a worker position (epoch, batch, dropout state, "
        "compression state)");
  }
  if (options.compressor != nullptr) {
    ps::Status st = options.compressor->RestoreState(feedback);
    if (!st.ok()) {
      Die("--restore: '" +
          CheckpointPath(job, step, CheckpointRole::kWorker, rank) +
          "': " + st.message());
    }
  }
  RemoveCheckpointsAfter(job, step, CheckpointRole::kWorker, rank);
  return at;
}

void MaybeCheckpoint(const TrainOptions& options, int rank, const Position& at,
                     const ps::model::Net& net) {
  const int every = options.checkpoint_every_steps;
  const bool due =
      (every > 0 && at.steps % every == 0) ||
      (options.clock != nullptr && options.clock->Announced(at.steps));
  if (options.checkpoint_dir.empty() || !due || WorkerLost()) return;
  ps::Status st = WriteCheckpoint(
      CheckpointJobOf(options), CheckpointRole::kWorker, rank, at.steps,
      WorkerPayload(options, at, net), ps::DefaultNode());
  if (!st.ok()) {  // as a server's (dist_server.cc): the job goes on
    LOG(ERROR) << "worker " << rank << ": checkpoint of step " << at.steps
               << " not written: " << st.message()
               << "; training goes on (--restore resumes from the last "
                  "complete checkpoint)";
  }
}

}  // namespace mnist
