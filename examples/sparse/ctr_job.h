// What the roles of sparse_ctr share: the options from the flags, the
// tables, and the protocol between worker 0 and the servers at the end.
//
// The job: workers train on their own samples (generated: stream 1 + rank;
// --data: every W-th training line), pulling the rows of each batch's unique
// ids and pushing the summed gradients; after each epoch every worker
// reaches sync point `epoch` (SparseWorker::Sync), so after the last every
// push is applied. Worker 0 then asks each server for the rows it holds
// (kStatsApp), evaluates on the test set and tells every node (EndWord).
// Servers wait for the last sync point, and every node for worker 0's word
// (bounded by --server_wait_s), before they finalize, so no barrier waits
// while the workers train or worker 0 evaluates.
#ifndef PS_EXAMPLES_SPARSE_CTR_JOB_H_
#define PS_EXAMPLES_SPARSE_CTR_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ctr_data.h"
#include "ps/sparse.h"

namespace ctr {

// SimpleApp id of the rows question (worker 0 to the servers). The answer
// is "OWN REPLICA": the rows of the server's own shard (table 0) and of its
// replica shard (0 without replicas).
constexpr int kStatsApp = 1;
// SimpleApp id of worker 0's word that the job is over (ctr_end.h).
constexpr int kEndApp = 2;
constexpr int kLinearTable = 0;
constexpr int kFactorTable = 1;

struct Options {
  bool fm = false;
  int fm_dim = 8;
  std::vector<ps::SparseTableConfig> tables;  // linear, then factors (FM)
  int batch = 1000;
  uint64_t samples = 0;  // per worker and epoch (generated data)
  int epochs = 1;
  uint64_t test_samples = 0;
  GeneratorOptions generator;
  std::string data, test_data;
  uint64_t data_lines = 0, test_lines = 0;  // --data: lines [1, data_lines)
                                            // train, then test_lines test
  double log_every_s = 5;
  double server_wait_s = 3600;
  std::string checkpoint_dir;  // empty: no checkpoints
  bool restore = false;
  int restore_epoch = -1;  // resume after this epoch (-1: from the start)
  std::string die_node;    // test: "server:R"
  int64_t die_after_pushes = 0;
};

// Prints "sparse_ctr: <message>" to stderr and exits 1.
[[noreturn]] void Die(const std::string& message);

int RunWorker(const Options& options);
int RunServer(const Options& options);
int RunScheduler(const Options& options);

}  // namespace ctr

#endif  // PS_EXAMPLES_SPARSE_CTR_JOB_H_
