// mnist_dist: data-parallel training of the reference ConvNet on a ps job.
// One program, three roles (DMLC_ROLE, set by tracker/launch.py): the
// scheduler introduces the nodes; each server holds ~1/S of the weights and
// their optimizer state (a DenseShard); each worker trains on its shard of
// the training set, pushing gradients and pulling weights every step. With
// --local it trains in this one process, without a parameter server.
//
//   python3 tracker/launch.py -s 2 -w 2 -- build/examples/mnist/mnist_dist
//       --epochs 1 --batch_size 32 --optimizer adam --lr 1e-3   (one line)
//
// Every flag is checked before ps::Start, and workers load their data before
// it too, so a bad flag or a missing file fails fast in every role.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "dist_common.h"
#include "model/dataset.h"
#include "ps/ps.h"

DEFINE_string(dataset, "mnist", "mnist or fashion");
DEFINE_string(data_dir, "",
              "folder with the IDX files (default: data/mnist for mnist, "
              "/usr/share/datasets/fashion-mnist for fashion)");
DEFINE_int32(epochs, 3,
             "passes over the training set (the one-cycle schedule spans "
             "them all)");
DEFINE_int32(batch_size, 16, "examples per step and worker");
DEFINE_string(optimizer, "adam", "sgd or adam");
DEFINE_double(lr, 3e-3,
              "learning rate (one-cycle: its peak) for a global batch of "
              "--lr_ref_batch");
DEFINE_string(lr_schedule, "onecycle",
              "onecycle: linear warmup from lr/25 to lr over --warmup of the "
              "planned steps (epochs x steps per epoch), then linear decay "
              "to 0 at the last; step: StepLR (--lr_step, --lr_gamma, "
              "--lr_every_steps)");
DEFINE_double(warmup, 0.1, "onecycle: fraction of the planned steps");
DEFINE_int32(lr_ref_batch, 32,
             "the lr used is --lr x sqrt(workers x batch_size / this) (0: "
             "--lr as given)");
DEFINE_int32(max_shift, 1,
             "augmentation: shift each training image by up to this many "
             "pixels in x and y, at random (0: none)");
DEFINE_double(label_smoothing, 0.05,
              "the training loss's target is (1 - e) one-hot + e / 10, as "
              "torch.nn.CrossEntropyLoss(label_smoothing=e)");
DEFINE_bool(label_smoothing_decay, true,
            "e (--label_smoothing) falls linearly from its value at step 0 "
            "to 0 at the last planned step (false: constant)");
DEFINE_double(ema_decay, 0.999,
              "worker 0 evaluates an exponential moving average of the "
              "weights with this decay per step (0: the weights)");
DEFINE_double(target_accuracy, 0,
              "stop once worker 0's test accuracy reaches this many percent, "
              "evaluating every --eval_every epochs, and print the samples "
              "and training seconds it took (0: train every epoch)");
DEFINE_double(eval_every, 0.25,
              "with --target_accuracy: epochs between evaluations");
DEFINE_double(momentum, 0.0, "sgd momentum");
DEFINE_double(weight_decay, 0.0, "L2 weight decay");
DEFINE_double(adam_beta2, 0.999,
              "adam: decay of the squared-gradient average (torch's betas[1])");
DEFINE_int32(lr_step, 1, "StepLR: periods between learning-rate decays");
DEFINE_double(lr_gamma, 1.0, "StepLR: factor applied every --lr_step periods");
DEFINE_int32(lr_every_steps, 0,
             "StepLR period: 0 = an epoch, N = every N steps (at most 255 "
             "periods)");
DEFINE_string(consistency, "bsp", "bsp, bounded or async");
DEFINE_int32(max_delay, 2,
             "bounded: a worker computes on weights missing at most this "
             "many updates");
DEFINE_string(device, "cpu", "cpu or cuda");
DEFINE_uint64(seed, 1, "seed of initialisation, shuffling and dropout");
DEFINE_uint64(train_limit, 0, "use the first N training images (0: all)");
DEFINE_uint64(test_limit, 0, "use the first N test images (0: all)");
DEFINE_bool(dropout, true, "apply the reference network's dropout");
DEFINE_int32(threads, 0, "CPU threads per process (0: all cores)");
DEFINE_string(overlap, "auto",
              "on, off or auto: workers exchange the fc layers' keys during "
              "the conv backward pass (auto: when --threads leaves a core "
              "free)");
DEFINE_uint64(chunk, 8192, "floats per key of the flat parameter vector");
DEFINE_string(placement, "bytes",
              "bytes: each server holds 1/S of the bytes; tensor: whole "
              "tensors per server, as one key per tensor would (comparison)");
DEFINE_double(log_every_s, 2.0, "seconds between progress lines");
DEFINE_string(metrics_file, "", "JSON-lines metrics of worker 0 go here");
DEFINE_string(metrics_dir, "",
              "or: each worker writes DIR/worker<rank>.jsonl (DIR must exist)");
DEFINE_string(dump_weights, "",
              "worker 0 (or --local) writes its final weights here as raw "
              "float32");
DEFINE_string(checkpoint_dir, "",
              "write checkpoints here (an existing folder; empty unless "
              "--restore): one file per server and worker every "
              "--checkpoint_every_steps steps");
DEFINE_int32(checkpoint_every_steps, 0,
             "steps between checkpoints (needs --checkpoint_dir)");
DEFINE_double(checkpoint_every_s, 0,
              "or (and) about every this many seconds, at a step worker 0 "
              "picks");
DEFINE_bool(restore, false,
            "resume from the newest complete checkpoint in --checkpoint_dir "
            "(same -s, -w, --chunk and training flags)");
DEFINE_string(on_worker_failure, "stop",
              "stop: a dead worker stops the job; continue: the others go on "
              "without it (launch with --tolerate worker); restart: the job "
              "waits for it to be restarted and rejoin (launch with "
              "--max-restarts N, which makes restart the default)");
DEFINE_bool(local, false, "train in this process, without a parameter server");
DEFINE_int32(die_after_steps, 0, "test: --die_node kills itself after N steps");
DEFINE_string(die_node, "", "test: worker:R or server:R");
DEFINE_string(die_signal, "kill",
              "test: the --die_node kills itself (kill) or freezes itself "
              "(stop: SIGSTOP), at --die_point");
DEFINE_string(die_point, "update",
              "test: where the --die_node dies or freezes. A server: update "
              "(in its optimizer step, once the step's sum went to its "
              "replica, before it answers the workers) or push (as the "
              "first worker's push of the step after --die_after_steps "
              "updates arrives, before it is summed or goes to the "
              "replica). A worker: update (after --die_after_steps steps) "
              "or push (in the step after them, once the first server "
              "answered its push, before it pushes to the others)");
DEFINE_int32(slow_worker_ms, 0, "test: the last worker sleeps this per step");
DEFINE_bool(allow_non_finite, false,
            "servers accept gradients that hold a NaN or an infinity (by "
            "default such a push is refused and its worker stops, naming "
            "it)");
DEFINE_string(compress, "",
              "values on the wire: CODEC[,pull=CODEC], CODEC one of none, "
              "fp16, bf16, onebit, topk:R, randomk:R (pulls in onebit, topk "
              "or randomk send the change since the last pull); not to "
              "peers of this host, whose values go by reference (empty: "
              "PS_COMPRESS, else none; docs/compression.md)");
DEFINE_int32(replicas, -1,
             "1: every server's keys are also held by the next server, which "
             "takes them over if it dies (PS_REPLICAS; -1: as the "
             "environment says)");

namespace {

using mnist::Die;

std::string FlagValue(const char* flag) {
  return gflags::GetCommandLineFlagInfoOrDie(flag).current_value;
}

void CheckFlag(bool ok, const char* flag, const std::string& rule) {
  if (!ok)
    Die("--" + std::string(flag) + " " + rule + ", got " + FlagValue(flag));
}

template <typename T>
T OrDie(const char* flag, ps::StatusOr<T> v) {
  if (!v.ok()) Die("--" + std::string(flag) + ": " + v.status().message());
  return std::move(v).value();
}

mnist::TrainOptions OptionsFromFlags() {
  CheckFlag(FLAGS_epochs > 0, "epochs", "must be > 0");
  CheckFlag(FLAGS_batch_size > 0, "batch_size", "must be > 0");
  CheckFlag(FLAGS_lr > 0, "lr", "must be > 0");
  CheckFlag(FLAGS_momentum >= 0 && FLAGS_momentum < 1, "momentum",
            "must be in [0, 1)");
  CheckFlag(FLAGS_weight_decay >= 0, "weight_decay", "must be >= 0");
  CheckFlag(FLAGS_adam_beta2 >= 0 && FLAGS_adam_beta2 < 1, "adam_beta2",
            "must be in [0, 1)");
  CheckFlag(FLAGS_lr_step > 0, "lr_step", "must be > 0");
  CheckFlag(FLAGS_lr_gamma > 0, "lr_gamma", "must be > 0");
  CheckFlag(FLAGS_lr_every_steps >= 0, "lr_every_steps", "must be >= 0");
  CheckFlag(FLAGS_warmup >= 0 && FLAGS_warmup < 1, "warmup",
            "must be in [0, 1)");
  CheckFlag(FLAGS_lr_ref_batch >= 0, "lr_ref_batch", "must be >= 0");
  CheckFlag(FLAGS_max_shift >= 0 && FLAGS_max_shift <= 8, "max_shift",
            "must be in [0, 8]");
  CheckFlag(FLAGS_label_smoothing >= 0 && FLAGS_label_smoothing < 1,
            "label_smoothing", "must be in [0, 1)");
  CheckFlag(FLAGS_ema_decay >= 0 && FLAGS_ema_decay < 1, "ema_decay",
            "must be in [0, 1)");
  CheckFlag(FLAGS_target_accuracy >= 0 && FLAGS_target_accuracy <= 100,
            "target_accuracy", "must be in [0, 100]");
  CheckFlag(FLAGS_eval_every > 0 && FLAGS_eval_every <= 1, "eval_every",
            "must be in (0, 1]");
  CheckFlag(FLAGS_max_delay >= 0, "max_delay", "must be >= 0");
  CheckFlag(FLAGS_threads >= 0, "threads", "must be >= 0");
  CheckFlag(FLAGS_log_every_s > 0, "log_every_s", "must be > 0");
  CheckFlag(FLAGS_die_after_steps >= 0, "die_after_steps", "must be >= 0");
  CheckFlag(FLAGS_slow_worker_ms >= 0, "slow_worker_ms", "must be >= 0");
  CheckFlag(FLAGS_replicas >= -1 && FLAGS_replicas <= 1, "replicas",
            "must be 0 or 1");
  // The library's setting (ps::Config::replicas): every role must agree.
  if (FLAGS_replicas >= 0) {
    gflags::SetCommandLineOption("ps_replicas",
                                 std::to_string(FLAGS_replicas).c_str());
  }
  CheckFlag(FLAGS_die_node.empty() || FLAGS_die_node.rfind("worker:", 0) == 0 ||
                FLAGS_die_node.rfind("server:", 0) == 0,
            "die_node", "must be worker:R or server:R");
  CheckFlag(FLAGS_die_signal == "kill" || FLAGS_die_signal == "stop",
            "die_signal", "must be kill or stop");
  CheckFlag(FLAGS_die_point == "update" || FLAGS_die_point == "push",
            "die_point", "must be update or push");
  mnist::TrainOptions o;
  o.dataset = OrDie("dataset", ps::model::ParseDatasetKind(FLAGS_dataset));
  o.data_dir = FLAGS_data_dir.empty() ? ps::model::DefaultDataDir(o.dataset)
                                      : FLAGS_data_dir;
  o.epochs = FLAGS_epochs;
  o.batch_size = FLAGS_batch_size;
  o.optimizer.name = FLAGS_optimizer;
  o.optimizer.lr = static_cast<float>(FLAGS_lr);
  o.optimizer.momentum = static_cast<float>(FLAGS_momentum);
  o.optimizer.weight_decay = static_cast<float>(FLAGS_weight_decay);
  o.optimizer.beta2 = static_cast<float>(FLAGS_adam_beta2);
  OrDie("optimizer", ps::model::MakeOptimizer(o.optimizer, 1));
  o.lr_schedule =
      OrDie("lr_schedule", ps::model::ParseLrSchedule(FLAGS_lr_schedule));
  const bool step_lr =
      o.lr_schedule == ps::model::LrScheduleConfig::Kind::kStep;
  CheckFlag(step_lr || (FLAGS_lr_gamma == 1 && FLAGS_lr_every_steps == 0 &&
                        FLAGS_lr_step == 1),
            "lr_schedule",
            "is onecycle: --lr_gamma, --lr_step and --lr_every_steps need "
            "--lr_schedule step");
  o.warmup = FLAGS_warmup;
  o.lr_ref_batch = FLAGS_lr_ref_batch;
  o.max_shift = FLAGS_max_shift;
  o.ema_decay = FLAGS_ema_decay;
  o.label_smoothing = static_cast<float>(FLAGS_label_smoothing);
  o.label_smoothing_decay = FLAGS_label_smoothing_decay;
  o.target_accuracy = FLAGS_target_accuracy;
  o.eval_every = FLAGS_eval_every;
  o.lr_step = FLAGS_lr_step;
  o.lr_every_steps = FLAGS_lr_every_steps;
  o.lr_gamma = static_cast<float>(FLAGS_lr_gamma);
  o.consistency = OrDie("consistency", ps::ParseConsistency(FLAGS_consistency));
  o.max_delay = FLAGS_max_delay;
  o.device = OrDie("device", ps::model::ParseDevice(FLAGS_device));
  o.seed = FLAGS_seed;
  o.train_limit = FLAGS_train_limit;
  o.test_limit = FLAGS_test_limit;
  o.dropout = FLAGS_dropout;
  o.threads = FLAGS_threads;
  CheckFlag(FLAGS_overlap == "auto" || FLAGS_overlap == "on" ||
                FLAGS_overlap == "off",
            "overlap", "must be on, off or auto");
  o.overlap = FLAGS_overlap == "on"    ? mnist::TrainOptions::Overlap::kOn
              : FLAGS_overlap == "off" ? mnist::TrainOptions::Overlap::kOff
                                       : mnist::TrainOptions::Overlap::kAuto;
  o.chunk = FLAGS_chunk;
  const size_t total = mnist::ModelLayout(o).total;
  CheckFlag(o.chunk > 0 && o.chunk <= total, "chunk",
            "must be in [1, " + std::to_string(total) + "]");
  // A short last chunk must not make the keys look uniform to a pull.
  const size_t keys = mnist::ModelLayout(o).num_keys();
  CheckFlag(total % o.chunk == 0 || total % keys != 0, "chunk",
            "leaves a short last chunk while " + std::to_string(keys) +
                " keys divide " + std::to_string(total) + "; pick another");
  CheckFlag(FLAGS_placement == "bytes" || FLAGS_placement == "tensor",
            "placement", "must be bytes or tensor");
  o.placement = FLAGS_placement == "tensor"
                    ? mnist::TrainOptions::PlacementKind::kTensor
                    : mnist::TrainOptions::PlacementKind::kBytes;
  o.log_every_s = FLAGS_log_every_s;
  o.metrics_file = FLAGS_metrics_file;
  o.metrics_dir = FLAGS_metrics_dir;
  struct stat st;
  CheckFlag(o.metrics_dir.empty() ||
                (stat(o.metrics_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)),
            "metrics_dir", "must be an existing folder");
  o.dump_weights = FLAGS_dump_weights;
  o.allow_non_finite = FLAGS_allow_non_finite;
  o.on_worker_failure = OrDie("on_worker_failure",
                              ps::ParseWorkerFailure(FLAGS_on_worker_failure));
  o.checkpoint_dir = FLAGS_checkpoint_dir;
  o.checkpoint_every_steps = FLAGS_checkpoint_every_steps;
  CheckFlag(FLAGS_checkpoint_every_steps >= 0, "checkpoint_every_steps",
            "must be >= 0");
  o.checkpoint_every_s = FLAGS_checkpoint_every_s;
  CheckFlag(FLAGS_checkpoint_every_s >= 0, "checkpoint_every_s",
            "must be >= 0");
  CheckFlag(o.checkpoint_dir.empty() || FLAGS_checkpoint_every_steps > 0 ||
                FLAGS_checkpoint_every_s > 0,
            "checkpoint_every_steps",
            "(or --checkpoint_every_s) must be > 0 with --checkpoint_dir");
  CheckFlag(!o.checkpoint_dir.empty() || (FLAGS_checkpoint_every_steps == 0 &&
                                          FLAGS_checkpoint_every_s == 0),
            "checkpoint_every_steps",
            "(and --checkpoint_every_s) needs --checkpoint_dir");
  CheckFlag(!FLAGS_restore || !o.checkpoint_dir.empty(), "restore",
            "needs --checkpoint_dir");
  CheckFlag(
      o.checkpoint_dir.empty() ||
          (stat(o.checkpoint_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)),
      "checkpoint_dir", "must be an existing folder");
  CheckFlag(o.checkpoint_dir.empty() || o.consistency == ps::Consistency::kBsp,
            "checkpoint_dir",
            "needs --consistency bsp (checkpoints are taken at step "
            "boundaries every node agrees on)");
  CheckFlag(o.checkpoint_dir.empty() || !FLAGS_local, "checkpoint_dir",
            "is for a ps job, not --local");
  if (FLAGS_compress.empty()) {
    auto env = ps::CompressOptions::FromEnv();
    if (!env.ok()) Die(env.status().message());
    o.compress = *env;
  } else {
    o.compress = OrDie("compress", ps::CompressOptions::Parse(FLAGS_compress));
  }
  CheckFlag(!o.compress.any() || !FLAGS_local, "compress",
            "is for a ps job, not --local");
  if (o.compress.any()) {
    o.compressor = OrDie("compress", ps::Compressor::Make(o.compress));
  }
  CheckFlag(
      o.target_accuracy == 0 || o.on_worker_failure == ps::WorkerFailure::kStop,
      "target_accuracy",
      "needs --on_worker_failure stop (worker 0 decides when all "
      "stop)");
  o.die_after_steps = FLAGS_die_after_steps;
  o.die_node = FLAGS_die_node;
  o.die_freezes = FLAGS_die_signal == "stop";
  o.die_at_push = FLAGS_die_point == "push";
  o.slow_worker_ms = FLAGS_slow_worker_ms;
  return o;
}

// The step to resume from (--restore), or -1; fails unless the folder is
// usable as this job's: before ps::Start, so that every role fails fast.
int PickCheckpoint(const mnist::TrainOptions& o) {
  if (o.checkpoint_dir.empty()) return -1;
  const mnist::CheckpointJob job = mnist::CheckpointJobOf(o);
  ps::Status ready = mnist::PrepareCheckpointDir(job);
  if (!ready.ok()) Die("--checkpoint_dir: " + ready.message());
  // A process the launcher started again (--max-restarts) rejoins its job,
  // which wrote these checkpoints: it learns its step from the servers.
  if (std::getenv("PS_RESTART_COUNT") != nullptr) return -1;
  if (!FLAGS_restore) {
    ps::Status st = mnist::CheckEmptyCheckpointDir(job);
    if (!st.ok()) Die("--checkpoint_dir: " + st.message());
    return -1;
  }
  std::string skipped;
  ps::StatusOr<int> step = mnist::FindCheckpoint(job, &skipped);
  if (!step.ok()) Die("--restore: " + step.status().message());
  if (!skipped.empty()) {
    std::printf("restore: skipping unusable checkpoints: %s\n",
                skipped.c_str());
  }
  std::printf("restore: resuming from the checkpoint of step %d in %s\n", *step,
              o.checkpoint_dir.c_str());
  std::fflush(stdout);
  return *step;
}

ps::model::Dataset LoadOrDie(const mnist::TrainOptions& o, bool train) {
  size_t limit = train ? o.train_limit : o.test_limit;
  auto data = ps::model::LoadSplit(o.data_dir, train, limit);
  if (!data.ok()) Die(data.status().ToString());
  return std::move(data).value();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "distributed MNIST ConvNet trainer; run it through tracker/launch.py "
      "(its role comes from DMLC_ROLE or --ps_role) or with --local. Its "
      "node's options are the DMLC_*/PS_* variables and the --ps_* flags "
      "(docs/environment.md); the other flags are the trainer's own");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (argc > 1) Die(std::string("unexpected argument '") + argv[1] + "'");
  mnist::TrainOptions options = OptionsFromFlags();
  if (FLAGS_local) {
    ps::model::Dataset train = LoadOrDie(options, true);
    ps::model::Dataset test = LoadOrDie(options, false);
    options.train_size = train.size;
    return mnist::RunLocal(options, train, test);
  }
  if (std::getenv("DMLC_ROLE") == nullptr &&
      gflags::GetCommandLineFlagInfoOrDie("ps_role").is_default) {
    Die("DMLC_ROLE is not set: launch through tracker/launch.py, or pass "
        "--local");
  }
  // The node's role (DMLC_ROLE, or --ps_role over it), as the node has it.
  const std::string role = ps::RoleName(ps::DefaultNode()->config().role);
  // Restarts (launch.py --max-restarts sets PS_MAX_RESTARTS) need the
  // restart policy on every node, and it needs them.
  const int max_restarts = ps::DefaultNode()->config().max_restarts;
  if (max_restarts > 0 &&
      gflags::GetCommandLineFlagInfoOrDie("on_worker_failure").is_default) {
    options.on_worker_failure = ps::WorkerFailure::kRestart;
  }
  const bool restart = options.on_worker_failure == ps::WorkerFailure::kRestart;
  if (restart && max_restarts == 0) {
    Die("--on_worker_failure restart: nobody restarts dead workers "
        "(PS_MAX_RESTARTS is 0); launch with tracker/launch.py "
        "--max-restarts N");
  }
  if (!restart && max_restarts > 0) {
    Die("--on_worker_failure " + FLAGS_on_worker_failure +
        " contradicts PS_MAX_RESTARTS=" + std::to_string(max_restarts) +
        " (launch.py --max-restarts), which restarts dead workers: use "
        "--on_worker_failure restart, or leave it out");
  }
  const bool go_on = options.on_worker_failure == ps::WorkerFailure::kContinue;
  // Made before ps::Start (its handle must be set before requests come);
  // lives until the process ends.
  std::unique_ptr<mnist::ClockCheckpoints> clock;
  if (options.checkpoint_every_s > 0 && role != "scheduler") {
    clock =
        std::make_unique<mnist::ClockCheckpoints>(options.checkpoint_every_s);
    options.clock = clock.get();
  }
  std::unique_ptr<mnist::StopVotes> votes;
  if (options.target_accuracy > 0 && role != "scheduler") {
    votes = std::make_unique<mnist::StopVotes>();
    options.votes = votes.get();
  }
  if (role == "worker") {
    // Every worker loads the test split too so a bad file fails in all;
    // worker 0 evaluates it.
    ps::model::Dataset train = LoadOrDie(options, true);
    ps::model::Dataset test = LoadOrDie(options, false);
    options.train_size = train.size;
    options.restore_step = PickCheckpoint(options);
    ps::Start(0, argv[0]);
    if (go_on) mnist::GoOnWithoutDeadWorkers();
    if (ps::MyRank() != 0) test = ps::model::Dataset();
    return mnist::RunWorker(options, train, test);
  }
  if (role == "server") {
    // The learning-rate schedule is planned over the training set's steps.
    options.train_size = OrDie(
        "data_dir",
        ps::model::CountSplit(options.data_dir, true, options.train_limit));
    options.restore_step = PickCheckpoint(options);
  }
  ps::Start(0, argv[0]);
  if (go_on) mnist::GoOnWithoutDeadWorkers();
  if (ps::IsServer()) return mnist::RunServer(options);
  mnist::FinalizeNode(options);
  return 0;
}
