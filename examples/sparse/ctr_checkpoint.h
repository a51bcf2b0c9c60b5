// sparse_ctr's checkpoints (--checkpoint_dir, --restore) on the library's
// checkpoint sets (src/kv/checkpointer.h): at the sync point that ends an
// epoch every server writes its shard's state (SparseShard::Save, from its
// snapshot callback; a replica that took over its primary's rows writes the
// primary's file), and every worker its place (the epoch, its samples so
// far), so the set of epoch E is whole once every file of it exists. A
// restore loads the newest usable set and goes on with the next epoch.
//
// Not thread-safe: each process writes only its own files.
#ifndef PS_EXAMPLES_SPARSE_CTR_CHECKPOINT_H_
#define PS_EXAMPLES_SPARSE_CTR_CHECKPOINT_H_

#include <cstdint>

#include "ctr_job.h"
#include "ps/sparse.h"

namespace ctr {

// Before ps::Start, in servers and workers: the epoch to resume after
// (--restore), or -1 (also without --checkpoint_dir). Dies naming the
// folder when it cannot be used (not empty without --restore, no usable
// set with it).
int PickCheckpoint(const Options& options);

// The snapshot callback of the shard holding server `rank`'s rows; null
// without --checkpoint_dir.
ps::SparseSnapshot ServerSnapshot(const Options& options, int rank);
// Loads server `rank`'s rows of epoch options.restore_epoch into `shard`;
// dies naming the file when it is unusable.
void LoadServer(const Options& options, int rank, ps::SparseShard* shard);

// A worker's file of `epoch`; its samples trained so far.
void WriteWorker(const Options& options, int epoch, uint64_t samples);
// Its samples of epoch options.restore_epoch.
uint64_t LoadWorker(const Options& options);

}  // namespace ctr

#endif  // PS_EXAMPLES_SPARSE_CTR_CHECKPOINT_H_
