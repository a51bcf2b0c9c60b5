// Worker 0's word that the job is over (it counted the rows and evaluated),
// to every other node of the job. Each waits for it before its Finalize
// barrier: that barrier's timeout (PS_BARRIER_TIMEOUT_MS) runs from the
// first arrival, and must span neither the training nor the evaluation.
//
// Thread-safety: Announce and Wait from one thread; the word arrives on the
// node's receive thread.
#ifndef PS_EXAMPLES_SPARSE_CTR_END_H_
#define PS_EXAMPLES_SPARSE_CTR_END_H_

#include <condition_variable>
#include <mutex>

#include "ps/ps.h"

namespace ctr {

class EndWord {
 public:
  // After ps::Start, in every role (before worker 0 can announce).
  EndWord();
  // Worker 0: tells every node, and waits for their answers (a dead node's
  // counts as answered).
  void Announce();
  // The others: false when no word came within `seconds`.
  bool Wait(double seconds);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool said_ = false;  // guarded by mu_
  ps::SimpleApp app_;
};

}  // namespace ctr

#endif  // PS_EXAMPLES_SPARSE_CTR_END_H_
