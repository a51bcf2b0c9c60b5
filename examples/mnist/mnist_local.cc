// mnist_local: trains the reference ConvNet on MNIST or Fashion-MNIST in one
// process (no parameter server), printing progress, test accuracy per epoch
// and a final summary line. The baseline the distributed trainer is held to.
//
//   mnist_local --data_dir data/mnist --epochs 2
//
// The defaults are mnist_dist's recipe (Adam on a one-cycle schedule over
// the run, peak lr 2e-3 x sqrt(batch / 32); it keeps no average of the
// weights). --lr_schedule step --lr_gamma 0.1 --lr 1e-3 --lr_ref_batch 0 is
// the former baseline (lr 1e-3 then 1e-4, batch 64: 98.9% in 2 epochs).
// With --device cuda the parameters, optimizer state and dropout masks stay
// on the GPU between steps (model/resident_trainer.h) unless
// --resident=false.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "model/dataset.h"
#include "model/net.h"
#include "model/optimizer.h"
#include "model/resident_trainer.h"

DEFINE_string(data_dir, "",
              "folder with the IDX files (default: data/mnist for mnist, "
              "/usr/share/datasets/fashion-mnist for fashion)");
DEFINE_string(dataset, "mnist", "mnist or fashion");
DEFINE_int32(epochs, 2, "passes over the training set");
DEFINE_int32(batch_size, 64, "examples per step");
DEFINE_double(lr, 2e-3,
              "learning rate (onecycle: its peak) for a batch of "
              "--lr_ref_batch");
DEFINE_string(lr_schedule, "onecycle",
              "onecycle: linear warmup over --warmup of the steps, then "
              "linear decay to 0 at the last (as mnist_dist); step: StepLR "
              "by epoch (--lr_gamma)");
DEFINE_double(warmup, 0.1, "onecycle: fraction of the run's steps");
DEFINE_int32(lr_ref_batch, 32,
             "the lr used is --lr x sqrt(batch_size / this) (0: --lr as "
             "given)");
DEFINE_double(lr_gamma, 1.0,
              "--lr_schedule step: lr multiplied by this after every epoch "
              "(1: constant)");
DEFINE_int32(max_shift, 0,
             "augmentation: shift each training image by up to this many "
             "pixels in x and y, at random (0: none)");
DEFINE_double(label_smoothing, 0.0,
              "the training loss's target is (1 - e) one-hot + e / 10, as "
              "torch.nn.CrossEntropyLoss(label_smoothing=e)");
DEFINE_string(optimizer, "adam", "sgd or adam");
DEFINE_double(momentum, 0.0, "sgd momentum");
DEFINE_double(weight_decay, 0.0, "L2 weight decay");
DEFINE_uint64(seed, 1, "seed of initialisation, shuffling and dropout");
DEFINE_string(device, "cpu", "cpu or cuda");
DEFINE_int32(threads, 0, "CPU threads (0: all cores)");
DEFINE_uint64(train_limit, 0, "use only the first N training images (0: all)");
DEFINE_uint64(test_limit, 0, "use only the first N test images (0: all)");
DEFINE_double(log_every_s, 2.0, "seconds between progress lines");
DEFINE_bool(resident, true,
            "--device cuda: keep parameters, optimizer state and dropout "
            "masks on the GPU between steps (false: upload the parameters "
            "and download the gradients every step, as a worker does)");

namespace {

using Clock = std::chrono::steady_clock;
using ps::model::Dataset;
using ps::model::ResidentTrainer;

// The host's step (CPU, or --resident=false): the Net's pass on host
// buffers, then the optimizer on the host.
class HostTrainer : public ResidentTrainer {
 public:
  HostTrainer(ps::model::Net* net, std::unique_ptr<ps::model::Optimizer> opt)
      : net_(net), opt_(std::move(opt)) {}
  void Step(const float* images, const int32_t* labels, int n) override {
    loss_sum_ += net_->ForwardBackward(images, labels, n);
    ++steps_;
    opt_->Step(net_->params(), net_->grads(), net_->num_params());
  }
  float TakeMeanLoss() override {
    const float mean = steps_ == 0 ? 0.0f : loss_sum_ / steps_;
    loss_sum_ = 0.0;
    steps_ = 0;
    return mean;
  }
  void set_lr(float lr) override { opt_->set_lr(lr); }
  void CopyParams(float* params) override {}  // they are the Net's already

 private:
  ps::model::Net* net_;
  std::unique_ptr<ps::model::Optimizer> opt_;
  double loss_sum_ = 0.0;
  int64_t steps_ = 0;
};

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

// Totals over the run, for the final line.
struct Progress {
  int64_t step = 0;
  size_t samples = 0;
  double train_s = 0.0;  // time in training steps, without evaluation
};

// One pass over the batcher's epoch, printing the mean loss and samples/s
// every --log_every_s seconds.
void TrainEpoch(int epoch, ResidentTrainer* trainer,
                ps::model::Batcher* batcher,
                const ps::model::LrSchedule& schedule, Progress* progress) {
  ps::model::Batch batch;
  const auto epoch_start = Clock::now();
  auto last_log = epoch_start;
  size_t logged_samples = 0;
  while (batcher->Next(&batch)) {
    trainer->set_lr(schedule.LrAt(progress->step, epoch));
    trainer->Step(batch.images.data(), batch.labels.data(), batch.size);
    ++progress->step;
    logged_samples += batch.size;
    progress->samples += batch.size;
    if (Seconds(last_log) >= FLAGS_log_every_s) {
      const float loss = trainer->TakeMeanLoss();  // waits for the device
      std::printf("epoch %d step %lld  loss %.4f  %.0f samples/s\n", epoch,
                  static_cast<long long>(progress->step), loss,
                  logged_samples / Seconds(last_log));
      std::fflush(stdout);
      last_log = Clock::now();
      logged_samples = 0;
    }
  }
  trainer->TakeMeanLoss();  // the epoch's time includes its last step
  progress->train_s += Seconds(epoch_start);
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
  if (FLAGS_warmup < 0 || FLAGS_warmup >= 1)
    Die("--warmup must be in [0, 1), got " + std::to_string(FLAGS_warmup));
  if (FLAGS_lr_ref_batch < 0)
    Die("--lr_ref_batch must be >= 0, got " +
        std::to_string(FLAGS_lr_ref_batch));
  if (FLAGS_max_shift < 0 || FLAGS_max_shift > 8)
    Die("--max_shift must be in [0, 8], got " +
        std::to_string(FLAGS_max_shift));
  if (FLAGS_threads < 0)
    Die("--threads must be >= 0, got " + std::to_string(FLAGS_threads));
  if (FLAGS_label_smoothing < 0 || FLAGS_label_smoothing >= 1)
    Die("--label_smoothing must be in [0, 1), got " +
        std::to_string(FLAGS_label_smoothing));
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
  net->set_label_smoothing(static_cast<float>(FLAGS_label_smoothing));
  std::unique_ptr<ResidentTrainer> trainer;
  const bool resident = device == ps::model::Device::kCuda && FLAGS_resident;
  if (resident) {
    ps::model::ResidentConfig rc;
    rc.optimizer = oc;
    rc.dropout_seed = FLAGS_seed;
    rc.label_smoothing = static_cast<float>(FLAGS_label_smoothing);
    trainer = OrDie("device",
                    ps::model::MakeResidentTrainer(device, net->params(), rc));
  } else {
    trainer = std::make_unique<HostTrainer>(
        net.get(),
        OrDie("optimizer", ps::model::MakeOptimizer(oc, net->num_params())));
  }
  const std::string dir =
      FLAGS_data_dir.empty() ? ps::model::DefaultDataDir(kind) : FLAGS_data_dir;
  auto train_or = ps::model::LoadSplit(dir, true, FLAGS_train_limit);
  if (!train_or.ok()) Die(train_or.status().ToString());
  auto test_or = ps::model::LoadSplit(dir, false, FLAGS_test_limit);
  if (!test_or.ok()) Die(test_or.status().ToString());
  const Dataset& train = *train_or;
  const Dataset& test = *test_or;
  ps::model::Batcher batcher(&train, FLAGS_batch_size, FLAGS_seed);
  batcher.set_max_shift(FLAGS_max_shift);
  ps::model::LrScheduleConfig sc;
  sc.kind = OrDie("lr_schedule", ps::model::ParseLrSchedule(FLAGS_lr_schedule));
  sc.base_lr = oc.lr;
  if (FLAGS_lr_ref_batch > 0) {
    sc.base_lr *= static_cast<float>(
        std::sqrt(static_cast<double>(FLAGS_batch_size) / FLAGS_lr_ref_batch));
  }
  sc.gamma = static_cast<float>(FLAGS_lr_gamma);
  sc.total_steps = std::max<int64_t>(
      1, static_cast<int64_t>(FLAGS_epochs) * batcher.batches_per_epoch());
  sc.warmup_steps = std::min<int64_t>(
      sc.total_steps - 1, std::llround(FLAGS_warmup * sc.total_steps));
  const ps::model::LrSchedule schedule(sc);
  std::printf(
      "mnist_local: %s %zu train / %zu test images from %s, %s, %zu "
      "parameters, %s lr %g, batch %d%s\n",
      ps::model::DatasetKindName(kind), train.size, test.size, dir.c_str(),
      ps::model::DeviceName(device), net->num_params(), oc.name.c_str(), oc.lr,
      FLAGS_batch_size, resident ? ", resident on the device" : "");
  std::printf("mnist_local: lr schedule %s, peak lr %g, max shift %d\n",
              FLAGS_lr_schedule.c_str(), sc.base_lr, FLAGS_max_shift);

  ps::model::EvalResult eval;
  const auto start = Clock::now();
  Progress progress;
  for (int epoch = 0; epoch < FLAGS_epochs; ++epoch) {
    batcher.StartEpoch(epoch);
    const size_t samples_before = progress.samples;
    const double train_s_before = progress.train_s;
    net->set_training(true);
    TrainEpoch(epoch, trainer.get(), &batcher, schedule, &progress);
    trainer->CopyParams(net->params());
    eval = ps::model::Evaluate(net.get(), test);
    std::printf(
        "epoch %d done: test accuracy %.2f%%  test loss %.4f  (%zu "
        "images)  %.0f epoch samples/s\n",
        epoch, 100.0 * eval.accuracy, eval.loss, eval.count,
        (progress.samples - samples_before) /
            (progress.train_s - train_s_before));
    std::fflush(stdout);
  }
  std::printf(
      "final: test accuracy %.2f%%  wall %.1f s  %.0f train "
      "samples/s\n",
      100.0 * eval.accuracy, Seconds(start),
      progress.samples / progress.train_s);
  return 0;
}
