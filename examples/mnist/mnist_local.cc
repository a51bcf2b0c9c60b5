// mnist_local: trains the reference ConvNet on MNIST or Fashion-MNIST in one
// process (no parameter server), printing progress, test accuracy per epoch
// and a final summary line. The baseline the distributed trainer is held to.
//
//   mnist_local --data_dir data/mnist --epochs 2 --optimizer adam --lr 1e-3
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "model/dataset.h"
#include "model/net.h"
#include "model/optimizer.h"

DEFINE_string(data_dir, "",
              "folder with the IDX files (default: data/mnist for mnist, "
              "/usr/share/datasets/fashion-mnist for fashion)");
DEFINE_string(dataset, "mnist", "mnist or fashion");
DEFINE_int32(epochs, 2, "passes over the training set");
DEFINE_int32(batch_size, 64, "examples per step");
DEFINE_double(lr, 1e-3, "learning rate");
DEFINE_double(lr_gamma, 1.0, "StepLR: lr multiplied by this every epoch");
DEFINE_string(optimizer, "adam", "sgd or adam");
DEFINE_double(momentum, 0.0, "sgd momentum");
DEFINE_double(weight_decay, 0.0, "L2 weight decay");
DEFINE_uint64(seed, 1, "seed of initialisation, shuffling and dropout");
DEFINE_string(device, "cpu", "cpu or cuda");
DEFINE_int32(threads, 0, "CPU threads (0: all cores)");
DEFINE_uint64(train_limit, 0, "use only the first N training images (0: all)");
DEFINE_uint64(test_limit, 0, "use only the first N test images (0: all)");
DEFINE_double(log_every_s, 2.0, "seconds between progress lines");

namespace {

using Clock = std::chrono::steady_clock;
using ps::model::Dataset;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "mnist_local: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
void CheckPositive(const char* flag, T value) {
  if (!(value > 0)) {
    Die(std::string("--") + flag + " must be > 0, got " +
        gflags::GetCommandLineFlagInfoOrDie(flag).current_value);
  }
}

template <typename T>
T OrDie(const char* flag, ps::StatusOr<T> v) {
  if (!v.ok()) Die(std::string("--") + flag + ": " + v.status().message());
  return std::move(*v);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("single-process MNIST ConvNet trainer");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  CheckPositive("epochs", FLAGS_epochs);
  CheckPositive("batch_size", FLAGS_batch_size);
  CheckPositive("log_every_s", FLAGS_log_every_s);
  CheckPositive("lr_gamma", FLAGS_lr_gamma);
  if (FLAGS_threads < 0)
    Die("--threads must be >= 0, got " + std::to_string(FLAGS_threads));
  const auto kind =
      OrDie("dataset", ps::model::ParseDatasetKind(FLAGS_dataset));
  const auto device = OrDie("device", ps::model::ParseDevice(FLAGS_device));
  ps::model::OptimizerConfig oc;
  oc.name = FLAGS_optimizer;
  oc.lr = static_cast<float>(FLAGS_lr);
  oc.momentum = static_cast<float>(FLAGS_momentum);
  oc.weight_decay = static_cast<float>(FLAGS_weight_decay);
  ps::model::SetCpuThreads(FLAGS_threads);

  auto net = OrDie("device", ps::model::Net::Create(device, FLAGS_seed));
  auto opt =
      OrDie("optimizer", ps::model::MakeOptimizer(oc, net->num_params()));
  const std::string dir =
      FLAGS_data_dir.empty() ? ps::model::DefaultDataDir(kind) : FLAGS_data_dir;
  auto train_or = ps::model::LoadSplit(dir, true, FLAGS_train_limit);
  if (!train_or.ok()) Die(train_or.status().ToString());
  auto test_or = ps::model::LoadSplit(dir, false, FLAGS_test_limit);
  if (!test_or.ok()) Die(test_or.status().ToString());
  const Dataset& train = *train_or;
  const Dataset& test = *test_or;
  const ps::model::StepLR schedule(oc.lr, 1,
                                   static_cast<float>(FLAGS_lr_gamma));
  std::printf(
      "mnist_local: %s %zu train / %zu test images from %s, %s, %zu "
      "parameters, %s lr %g, batch %d\n",
      ps::model::DatasetKindName(kind), train.size, test.size, dir.c_str(),
      ps::model::DeviceName(device), net->num_params(), oc.name.c_str(), oc.lr,
      FLAGS_batch_size);

  ps::model::Batcher batcher(&train, FLAGS_batch_size, FLAGS_seed);
  ps::model::Batch batch;
  ps::model::EvalResult eval;
  const auto start = Clock::now();
  double train_s = 0.0;
  size_t samples = 0;
  int64_t step = 0;
  for (int epoch = 0; epoch < FLAGS_epochs; ++epoch) {
    opt->set_lr(schedule.LrAt(epoch));
    batcher.StartEpoch(epoch);
    net->set_training(true);
    const auto epoch_start = Clock::now();
    auto last_log = Clock::now();
    double loss_sum = 0.0;
    int loss_count = 0;
    size_t logged_samples = 0;
    while (batcher.Next(&batch)) {
      loss_sum += net->ForwardBackward(batch.images.data(), batch.labels.data(),
                                       batch.size);
      opt->Step(net->params(), net->grads(), net->num_params());
      ++loss_count;
      ++step;
      logged_samples += batch.size;
      samples += batch.size;
      if (Seconds(last_log) >= FLAGS_log_every_s) {
        std::printf("epoch %d step %lld  loss %.4f  %.0f samples/s\n", epoch,
                    static_cast<long long>(step), loss_sum / loss_count,
                    logged_samples / Seconds(last_log));
        std::fflush(stdout);
        last_log = Clock::now();
        loss_sum = 0.0;
        loss_count = 0;
        logged_samples = 0;
      }
    }
    train_s += Seconds(epoch_start);
    eval = ps::model::Evaluate(net.get(), test);
    std::printf(
        "epoch %d done: test accuracy %.2f%%  test loss %.4f  (%zu "
        "images)\n",
        epoch, 100.0 * eval.accuracy, eval.loss, eval.count);
    std::fflush(stdout);
  }
  std::printf(
      "final: test accuracy %.2f%%  wall %.1f s  %.0f train "
      "samples/s\n",
      100.0 * eval.accuracy, Seconds(start), samples / train_s);
  return 0;
}
