// Checkpoints of sparse_ctr (ctr_checkpoint.h).
#include "ctr_checkpoint.h"

#include <glog/logging.h>

#include <cstdio>
#include <string>

#include "kv/checkpointer.h"
#include "ps/ps.h"

namespace ctr {

namespace {

// A server file holds a shard's whole state: bound its size at 4 GiB
// (Checkpointer reads no file over 16 bytes a float). `chunk` names the
// tables' widths, so a job of another model refuses the files.
constexpr uint64_t kMaxStateFloats = uint64_t{1} << 28;

ps::Checkpointer CheckpointerOf(const Options& o) {
  ps::CheckpointJob job;
  job.dir = o.checkpoint_dir;
  job.num_servers = ps::NumServers();
  job.num_workers = ps::NumWorkers();
  job.model_floats = kMaxStateFloats;
  job.chunk = 0;
  for (const auto& t : o.tables) {
    job.chunk = job.chunk * (ps::kMaxSparseWidth + 1) + t.width;
  }
  return ps::Checkpointer(job);
}

std::string Read(const Options& o, ps::CheckpointRole role, int rank) {
  auto payload = CheckpointerOf(o).Read(o.restore_epoch, role, rank);
  if (!payload.ok()) Die("--restore: " + payload.status().message());
  return *payload;
}

}  // namespace

int PickCheckpoint(const Options& o) {
  if (o.checkpoint_dir.empty()) return -1;
  const ps::Checkpointer checkpointer = CheckpointerOf(o);
  ps::Status st = checkpointer.PrepareDir();
  if (!st.ok()) Die("--checkpoint_dir: " + st.message());
  if (!o.restore) {
    st = checkpointer.CheckEmpty();
    if (!st.ok())
      Die("--checkpoint_dir: " + st.message() + " (--restore resumes from it)");
    return -1;
  }
  std::string skipped;
  ps::StatusOr<int> epoch = checkpointer.FindNewest(&skipped);
  if (!epoch.ok()) Die("--restore: " + epoch.status().message());
  if (!skipped.empty()) {
    std::printf("restore: skipping unusable checkpoints: %s\n",
                skipped.c_str());
  }
  if (*epoch >= o.epochs) {
    Die("--restore: the newest checkpoint in '" + o.checkpoint_dir +
        "' is of epoch " + std::to_string(*epoch) + "; --epochs " +
        std::to_string(o.epochs) + " leaves nothing to train");
  }
  std::printf("restore: resuming after epoch %d from %s\n", *epoch,
              o.checkpoint_dir.c_str());
  std::fflush(stdout);
  return *epoch;
}

ps::SparseSnapshot ServerSnapshot(const Options& o, int rank) {
  if (o.checkpoint_dir.empty()) return nullptr;
  return [&o, rank](int epoch, const std::string& state) {
    ps::Status st = CheckpointerOf(o).Write(ps::CheckpointRole::kServer, rank,
                                            epoch, state);
    // A full disk must not end a job that trains: the sets written stay
    // whole, and the next epoch's is tried again.
    if (!st.ok()) {
      LOG(ERROR) << "server " << ps::MyRank() << ": checkpoint of epoch "
                 << epoch << " not written: " << st.message();
      return;
    }
    std::printf(
        "server %d: checkpoint of epoch %d%s, %.1f MB\n", ps::MyRank(), epoch,
        rank == ps::MyRank() ? ""
                             : (" for server " + std::to_string(rank)).c_str(),
        state.size() / 1e6);
    std::fflush(stdout);
  };
}

void LoadServer(const Options& o, int rank, ps::SparseShard* shard) {
  const std::string state = Read(o, ps::CheckpointRole::kServer, rank);
  ps::Status st = shard->Load(state);
  if (!st.ok()) {
    Die("--restore: '" +
        CheckpointerOf(o).Path(o.restore_epoch, ps::CheckpointRole::kServer,
                               rank) +
        "': " + st.message());
  }
  if (rank == ps::MyRank()) {
    CheckpointerOf(o).RemoveAfter(o.restore_epoch, ps::CheckpointRole::kServer,
                                  rank);
  }
}

void WriteWorker(const Options& o, int epoch, uint64_t samples) {
  if (o.checkpoint_dir.empty()) return;
  ps::Packer out;
  out.Put<int32_t>(epoch);
  out.Put<uint64_t>(samples);
  ps::Status st = CheckpointerOf(o).Write(ps::CheckpointRole::kWorker,
                                          ps::MyRank(), epoch, out.data());
  if (!st.ok()) {
    LOG(ERROR) << "worker " << ps::MyRank() << ": checkpoint of epoch " << epoch
               << " not written: " << st.message();
  }
}

uint64_t LoadWorker(const Options& o) {
  const std::string payload =
      Read(o, ps::CheckpointRole::kWorker, ps::MyRank());
  ps::Unpacker in(payload);
  int32_t epoch = -1;
  uint64_t samples = 0;
  if (!in.Get(&epoch) || !in.Get(&samples) || !in.done() ||
      epoch != o.restore_epoch) {
    Die("--restore: '" +
        CheckpointerOf(o).Path(o.restore_epoch, ps::CheckpointRole::kWorker,
                               ps::MyRank()) +
        "' is not a worker's place of epoch " +
        std::to_string(o.restore_epoch));
  }
  CheckpointerOf(o).RemoveAfter(o.restore_epoch, ps::CheckpointRole::kWorker,
                                ps::MyRank());
  return samples;
}

}  // namespace ctr
