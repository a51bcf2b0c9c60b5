// custom_trainer: the smallest data-parallel trainer on ps, shown in docs/api.md.
// Your own loop computes the gradient of a float vector (here of
// |w - 1|^2 / 2); KVWorker pushes it and pulls the weights back; on each
// server a DenseShard averages the workers' gradients and applies SGD (BSP).
//   python3 tracker/launch.py -s 2 -w 2 -- build/examples/mnist/custom_trainer
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "ps/dense_server.h"
#include "ps/ps.h"

int main(int, char** argv) {
  const ps::DenseLayout layout{1000, 250};  // 1000 floats in 4 keys
  const std::vector<ps::Key> keys{0, 1, 2, 3};
  ps::Start(0, argv[0]);
  auto placement =
      ps::Placement::ByBytes(keys, {250, 250, 250, 250}, ps::NumServers());
  if (ps::IsServer()) {
    ps::Key begin = placement->begin(ps::MyRank());
    ps::Key end = std::min<ps::Key>(placement->end(ps::MyRank()), keys.size());
    ps::KVServer<float> server(0);
    ps::DenseShard shard(&server, layout, begin, end,
                         std::vector<float>((end - begin) * 250),
                         {ps::Consistency::kBsp, 0, ps::NumWorkers()},
                         [](float* w, const float* g, size_t, size_t n,
                            int num_grads, int, int) {
                           for (size_t i = 0; i < n; ++i)
                             w[i] -= 0.1f * g[i] / num_grads;
                         });
    shard.WaitAllDone(std::chrono::hours(1));
  } else if (ps::IsWorker()) {
    ps::KVWorker<float> kv(0, 0);
    kv.SetPlacement(*placement);
    std::vector<float> w(layout.total), g(layout.total);
    const int steps = 50;
    auto check = [](const ps::Status& st) {
      if (!st.ok()) LOG(FATAL) << st;  // a dead server, a refused push...
    };
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < w.size(); ++i) g[i] = w[i] - 1.0f;  // your model
      using ps::DenseOp;
      check(kv.Wait(
          kv.Push(keys, g, {}, ps::EncodeDenseCmd(DenseOp::kStep, step))));
      check(kv.Wait(kv.Pull(keys, &w, nullptr,
                            ps::EncodeDenseCmd(DenseOp::kStep, step + 1))));
    }
    check(kv.Wait(kv.Push(keys, {0, 0, 0, 0}, {},
                          ps::EncodeDenseCmd(ps::DenseOp::kDone, steps))));
    std::printf("worker %d: w[0] = %.4f after %d steps (target 1)\n",
                ps::MyRank(), w[0], steps);
  }
  ps::Finalize(0, true);
  return 0;
}
