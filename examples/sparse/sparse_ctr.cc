// sparse_ctr: click-through prediction on a ps job with sparse tables.
// Logistic regression (or a factorization machine, --model fm) over 64-bit
// feature ids: workers pull the rows of each batch's unique ids and push
// their gradients; servers hold the rows (SparseShard, ps/sparse.h) and
// apply FTRL-Proximal (or adagrad, sgd) row by row. The data is drawn from
// a planted model of Criteo's shape (ctr_data.h), so the best possible test
// AUC is known and printed, or read from Criteo's text format (--data).
//
//   python3 tracker/launch.py -s 2 -w 2 -- build/examples/sparse/sparse_ctr
//
// Every flag is checked before ps::Start, in every role, so a bad one
// fails fast naming itself and its value.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <string>

#include "ctr_checkpoint.h"
#include "ctr_job.h"
#include "ps/ps.h"

DEFINE_string(model, "lr",
              "lr (logistic regression) or fm (factorization "
              "machine: lr plus pairwise factor interactions)");
DEFINE_int32(fm_dim, 8, "fm: floats per id's factor row");
DEFINE_string(optimizer, "ftrl", "ftrl, adagrad or sgd (the linear rows)");
DEFINE_double(lr, 0.1, "ftrl: alpha; adagrad, sgd: the learning rate");
DEFINE_double(ftrl_beta, 1.0, "ftrl: beta");
DEFINE_double(l1, 1.0, "ftrl: L1 strength (in units of summed gradients)");
DEFINE_double(l2, 1.0, "ftrl: L2 strength");
DEFINE_double(fm_lr, 0.02, "fm: adagrad learning rate of the factor rows");
DEFINE_double(fm_init, 0.01, "fm: stddev of the factor rows' start");
DEFINE_int32(batch, 1000, "samples per step and worker");
DEFINE_uint64(samples, 2000000,
              "generated data: training samples per worker and epoch");
DEFINE_int32(epochs, 1, "passes over each worker's samples");
DEFINE_uint64(test_samples, 100000,
              "test samples (generated; with --data and no --test_data, the "
              "data file's last this many lines)");
DEFINE_uint64(seed, 1, "seed of the generated data and the model's rows");
DEFINE_double(zipf, 1.05,
              "generated data: Zipf exponent of the categorical "
              "values");
DEFINE_double(vocab_scale, 1.0,
              "generated data: multiplies Criteo's "
              "vocabulary of each categorical field");
DEFINE_int32(head, 100,
             "generated data: most frequent values per "
             "categorical field that have a non-zero planted weight");
DEFINE_double(weight_scale, 0.5,
              "generated data: stddev of a planted "
              "weight");
DEFINE_string(data, "",
              "train on this Criteo text file (label<TAB>I1..I13"
              "<TAB>C1..C26) instead of generated data");
DEFINE_string(test_data, "",
              "with --data: the test set's file (default: "
              "--data's last --test_samples lines)");
DEFINE_double(log_every_s, 5.0, "seconds between a worker's progress lines");
DEFINE_double(server_wait_s, 3600,
              "servers give up (naming the sync point) "
              "when the workers did not finish within this");
DEFINE_int32(replicas, -1,
             "1: every server's rows are also held by the "
             "next server, which takes them over if it dies (PS_REPLICAS; "
             "-1: as the environment says)");
DEFINE_string(checkpoint_dir, "",
              "write a checkpoint set here at the end of every epoch (an "
              "empty or new folder, unless --restore)");
DEFINE_bool(restore, false,
            "resume after the newest complete checkpoint in "
            "--checkpoint_dir (same -s, -w, data and model flags)");
DEFINE_string(die_node, "",
              "test: server:R kills itself after "
              "--die_after_pushes pushes applied");
DEFINE_int64(die_after_pushes, 0, "test: see --die_node");

namespace {

using ctr::Die;

std::string FlagValue(const char* flag) {
  return gflags::GetCommandLineFlagInfoOrDie(flag).current_value;
}

void CheckFlag(bool ok, const char* flag, const std::string& rule) {
  if (!ok) {
    Die("--" + std::string(flag) + " " + rule + ", got " + FlagValue(flag));
  }
}

// The tables from the flags, validated.
std::vector<ps::SparseTableConfig> Tables() {
  ps::SparseTableConfig linear;
  linear.id = ctr::kLinearTable;
  linear.width = 1;
  linear.seed = FLAGS_seed;
  auto optimizer = ps::ParseSparseOptimizer(FLAGS_optimizer);
  if (!optimizer.ok()) Die("--optimizer: " + optimizer.status().message());
  linear.optimizer = *optimizer;
  linear.lr = static_cast<float>(FLAGS_lr);
  linear.ftrl_alpha = static_cast<float>(FLAGS_lr);
  linear.ftrl_beta = static_cast<float>(FLAGS_ftrl_beta);
  linear.ftrl_l1 = static_cast<float>(FLAGS_l1);
  linear.ftrl_l2 = static_cast<float>(FLAGS_l2);
  std::vector<ps::SparseTableConfig> tables = {linear};
  if (FLAGS_model == "fm") {
    ps::SparseTableConfig factors;
    factors.id = ctr::kFactorTable;
    factors.width = FLAGS_fm_dim;
    factors.init = ps::SparseInit::kNormal;
    factors.init_scale = static_cast<float>(FLAGS_fm_init);
    factors.seed = FLAGS_seed;
    factors.optimizer = ps::SparseOptimizer::kAdagrad;
    factors.lr = static_cast<float>(FLAGS_fm_lr);
    tables.push_back(factors);
  }
  for (const auto& t : tables) {
    ps::Status st = t.Validate();
    if (!st.ok())
      Die(st.message() +
          " (from --lr, --l1, --l2, --ftrl_beta, "
          "--fm_dim, --fm_lr, --fm_init)");
  }
  return tables;
}

ctr::Options OptionsFromFlags() {
  CheckFlag(FLAGS_model == "lr" || FLAGS_model == "fm", "model",
            "must be lr or fm");
  CheckFlag(FLAGS_fm_dim >= 1 && FLAGS_fm_dim <= 256, "fm_dim",
            "must be in [1, 256]");
  CheckFlag(FLAGS_lr > 0, "lr", "must be > 0");
  CheckFlag(FLAGS_l1 >= 0, "l1", "must be >= 0");
  CheckFlag(FLAGS_l2 >= 0, "l2", "must be >= 0");
  CheckFlag(FLAGS_batch >= 1 && FLAGS_batch <= 1000000, "batch",
            "must be in [1, 1000000]");
  CheckFlag(FLAGS_samples >= 1, "samples", "must be >= 1");
  CheckFlag(FLAGS_epochs >= 1 && FLAGS_epochs <= ps::kMaxSparsePoint, "epochs",
            "must be in [1, " + std::to_string(ps::kMaxSparsePoint) + "]");
  CheckFlag(FLAGS_test_samples >= 1 && FLAGS_test_samples <= 100000000,
            "test_samples", "must be in [1, 100000000]");
  CheckFlag(FLAGS_zipf >= 0.5 && FLAGS_zipf <= 3, "zipf",
            "must be in [0.5, 3]");
  CheckFlag(FLAGS_vocab_scale > 0 && FLAGS_vocab_scale <= 100, "vocab_scale",
            "must be in (0, 100]");
  CheckFlag(FLAGS_head >= 0, "head", "must be >= 0");
  CheckFlag(FLAGS_weight_scale >= 0 && FLAGS_weight_scale <= 10, "weight_scale",
            "must be in [0, 10]");
  CheckFlag(FLAGS_log_every_s > 0, "log_every_s", "must be > 0");
  CheckFlag(FLAGS_server_wait_s > 0, "server_wait_s", "must be > 0");
  CheckFlag(FLAGS_replicas >= -1 && FLAGS_replicas <= 1, "replicas",
            "must be 0 or 1");
  if (FLAGS_replicas >= 0) {
    gflags::SetCommandLineOption("ps_replicas",
                                 std::to_string(FLAGS_replicas).c_str());
  }
  CheckFlag(FLAGS_die_node.empty() || FLAGS_die_node.rfind("server:", 0) == 0,
            "die_node", "must be server:R");
  CheckFlag(FLAGS_die_after_pushes >= 0, "die_after_pushes", "must be >= 0");
  CheckFlag(FLAGS_test_data.empty() || !FLAGS_data.empty(), "test_data",
            "needs --data");
  CheckFlag(!FLAGS_restore || !FLAGS_checkpoint_dir.empty(), "restore",
            "needs --checkpoint_dir");

  ctr::Options o;
  o.fm = FLAGS_model == "fm";
  o.fm_dim = FLAGS_fm_dim;
  o.tables = Tables();
  o.batch = FLAGS_batch;
  o.samples = FLAGS_samples;
  o.epochs = FLAGS_epochs;
  o.test_samples = FLAGS_test_samples;
  o.generator.seed = FLAGS_seed;
  o.generator.zipf = FLAGS_zipf;
  o.generator.vocab_scale = FLAGS_vocab_scale;
  o.generator.head = FLAGS_head;
  o.generator.weight_scale = FLAGS_weight_scale;
  o.data = FLAGS_data;
  o.test_data = FLAGS_test_data;
  o.log_every_s = FLAGS_log_every_s;
  o.server_wait_s = FLAGS_server_wait_s;
  o.checkpoint_dir = FLAGS_checkpoint_dir;
  o.restore = FLAGS_restore;
  o.die_node = FLAGS_die_node;
  o.die_after_pushes = FLAGS_die_after_pushes;
  return o;
}

// --data: which lines train and which test; a bad file fails here, in
// every role, naming it (the workers read it all again as they train).
void PlanData(ctr::Options* o) {
  if (o->data.empty()) return;
  auto lines = ctr::CountLines(o->data);
  if (!lines.ok()) Die("--data: " + lines.status().message());
  if (o->test_data.empty()) {
    if (*lines <= o->test_samples) {
      Die("--data '" + o->data + "' has " + std::to_string(*lines) +
          " lines; --test_samples " + std::to_string(o->test_samples) +
          " of them for testing leave none to train on");
    }
    o->data_lines = *lines - o->test_samples;
    o->test_lines = o->test_samples;
  } else {
    auto test = ctr::CountLines(o->test_data);
    if (!test.ok()) Die("--test_data: " + test.status().message());
    o->data_lines = *lines;
    o->test_lines = std::min<uint64_t>(*test, o->test_samples);
  }
  if (!ps::IsWorker()) return;
  // Every line parses (the workers would stop at the first bad one).
  for (const std::string* path : {&o->data, &o->test_data}) {
    if (path->empty()) continue;
    ctr::CriteoReader reader;
    ps::Status st = reader.Open(*path);
    ctr::Samples chunk;
    size_t got = 1;
    while (st.ok() && got > 0) {
      chunk.clear();
      st = reader.Read(100000, &chunk, &got);
    }
    if (!st.ok()) {
      Die(std::string(path == &o->data ? "--data" : "--test_data") + ": " +
          st.message());
    }
  }
}

}  // namespace

namespace ctr {

void Die(const std::string& message) {
  std::fprintf(stderr, "sparse_ctr: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace ctr

int main(int argc, char* argv[]) {
  gflags::SetUsageMessage(
      "click-through logistic regression on sparse tables; run it with "
      "tracker/launch.py -s S -w W -- sparse_ctr [flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (argc > 1) Die(std::string("unexpected argument '") + argv[1] + "'");
  ctr::Options options = OptionsFromFlags();
  PlanData(&options);
  if (!ps::IsScheduler()) options.restore_epoch = ctr::PickCheckpoint(options);
  ps::Start(0, argv[0]);
  if (ps::IsServer()) return ctr::RunServer(options);
  if (ps::IsWorker()) return ctr::RunWorker(options);
  return ctr::RunScheduler(options);
}
