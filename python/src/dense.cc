// ps._ps.DenseServer: a DenseShard (ps/dense_server.h) owning this server's
// slice of a dense model, updated by a built-in optimizer (src/model:
// torch.optim.SGD / Adam semantics) on the averaged gradient, with a
// learning-rate schedule (model::LrSchedule: StepLR driven by the push's tag,
// or one-cycle driven by its step); with PS_REPLICAS=1 a
// replica shard of the previous server's keys too, and checkpoints and
// restore in mnist_dist's files (dense_state.h). Also DenseLayout and the
// dense cmd encoding, for the worker side (ps/dense.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dense_state.h"
#include "kv/checkpointer.h"
#include "model/optimizer.h"
#include "ps/base.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

// The floats of keys [first_key, end_key) of `layout` taken from `weights`
// (a buffer of exactly that many floats; ValueError naming `what` else).
std::vector<float> SliceOf(const DenseLayout& layout, Key first_key,
                           Key end_key, const py::object& weights,
                           const std::string& what) {
  if (first_key > end_key || end_key > layout.num_keys()) {
    throw py::value_error("DenseServer: " + what + " keys [" +
                          std::to_string(first_key) + ", " +
                          std::to_string(end_key) + ") outside the layout's " +
                          std::to_string(layout.num_keys()) + " keys");
  }
  BufferView w = ViewBuffer(weights, Elem::kFloat32, false, what.c_str());
  size_t lo = layout.offset(first_key);
  size_t hi = first_key == end_key
                  ? lo
                  : layout.offset(end_key - 1) + layout.length(end_key - 1);
  if (w.size() != hi - lo) {
    throw py::value_error(what + " has " + std::to_string(w.size()) +
                          " floats; keys [" + std::to_string(first_key) + ", " +
                          std::to_string(end_key) + ") hold " +
                          std::to_string(hi - lo));
  }
  const float* wp = static_cast<const float*>(w.data());
  return std::vector<float>(wp, wp + w.size());
}

// Writes server `rank`'s checkpoint file of each snapshot: this server's
// own slice, or (a replica that took them over) the keys of the server it
// stands in for, so the sets stay whole after a failover. A failed write
// is one ERROR line: the job goes on and the next checkpoint is tried.
DenseSnapshot SnapshotOf(std::shared_ptr<const Checkpointer> checkpointer,
                         int rank, int my_rank,
                         std::shared_ptr<RangeOptimizers> optimizers) {
  if (!checkpointer) return nullptr;
  return [checkpointer, rank, my_rank, optimizers](int step, const float* w,
                                                   size_t n) {
    const std::string what =
        "server " + std::to_string(my_rank) + ": checkpoint of step " +
        std::to_string(step) +
        (rank == my_rank ? "" : " for server " + std::to_string(rank));
    Status st = checkpointer->Write(CheckpointRole::kServer, rank, step,
                                    SlicePayload(w, n, *optimizers));
    if (st.ok()) {
      LOG(INFO) << what << " written";
    } else {
      LOG(ERROR) << what << " not written: " << st.message()
                 << "; training goes on (a restore takes the last complete "
                    "checkpoint)";
    }
  };
}

// The learning-rate schedule of the Python keyword arguments (see
// BindDense), checked here so that model::LrSchedule's checks hold;
// ValueError naming the argument and its value.
model::LrScheduleConfig ScheduleOf(const model::OptimizerConfig& opt,
                                   const std::string& name, int lr_step,
                                   float lr_gamma, int64_t total_steps,
                                   int64_t warmup_steps) {
  StatusOr<model::LrScheduleConfig::Kind> kind = model::ParseLrSchedule(name);
  if (!kind.ok()) {
    throw py::value_error("DenseServer: lr_schedule='" + name +
                          "' is not 'step' or 'onecycle'");
  }
  if (lr_step < 1) {
    throw py::value_error("DenseServer: lr_step=" + std::to_string(lr_step) +
                          " is not >= 1");
  }
  model::LrScheduleConfig c;
  c.kind = *kind;
  c.base_lr = opt.lr;
  c.step_size = lr_step;
  c.gamma = lr_gamma;
  c.total_steps = total_steps;
  c.warmup_steps = warmup_steps;
  if (c.kind == model::LrScheduleConfig::Kind::kStep) {
    if (total_steps != 0 || warmup_steps != 0) {
      throw py::value_error(
          "DenseServer: total_steps=" + std::to_string(total_steps) +
          " warmup_steps=" + std::to_string(warmup_steps) +
          " are for lr_schedule='onecycle', not 'step'");
    }
    return c;
  }
  if (lr_step != 1 || lr_gamma != 1.0f) {
    throw py::value_error("DenseServer: lr_step=" + std::to_string(lr_step) +
                          " lr_gamma=" + std::to_string(lr_gamma) +
                          " are for lr_schedule='step', not 'onecycle'");
  }
  if (total_steps < 1) {
    throw py::value_error(
        "DenseServer: total_steps=" + std::to_string(total_steps) +
        " is not >= 1 (lr_schedule='onecycle' spans them)");
  }
  if (warmup_steps < 0 || warmup_steps >= total_steps) {
    throw py::value_error(
        "DenseServer: warmup_steps=" + std::to_string(warmup_steps) +
        " is not in [0, total_steps=" + std::to_string(total_steps) + ")");
  }
  return c;
}

// What a DenseServer does beyond serving its slice (the Python keyword
// arguments; see BindDense).
struct ServeOptions {
  std::string on_worker_failure = "stop";
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  int restore_step = -1;
  std::string compress;  // ps/compress.h's text; "" none
};

// Refuses what this node's configuration and the options contradict, by
// name; returns the worker-failure policy.
WorkerFailure CheckServeOptions(const Node& node, Consistency consistency,
                                const ServeOptions& o, bool has_replica) {
  StatusOr<WorkerFailure> failure = ParseWorkerFailure(o.on_worker_failure);
  if (!failure.ok()) throw py::value_error(failure.status().message());
  const int max_restarts = node.config().max_restarts;
  const std::string restarts =
      "PS_MAX_RESTARTS=" + std::to_string(max_restarts);
  if (*failure == WorkerFailure::kContinue) {
    throw py::value_error(
        "DenseServer: on_worker_failure='continue' is not supported from "
        "Python (ps.finalize()'s barrier would wait for the dead worker); use "
        "'stop' or 'restart'");
  }
  if (*failure == WorkerFailure::kRestart && max_restarts == 0) {
    throw py::value_error(
        "DenseServer: on_worker_failure='restart': nobody restarts dead "
        "workers (PS_MAX_RESTARTS is 0; launch with tracker/launch.py "
        "--max-restarts N)");
  }
  if (*failure == WorkerFailure::kStop && max_restarts > 0) {
    throw py::value_error("DenseServer: on_worker_failure='stop' contradicts " +
                          restarts +
                          " (launch.py --max-restarts), which restarts dead "
                          "workers: use 'restart'");
  }
  const int replicas = node.config().replicas;
  if (replicas > 0 && !has_replica) {
    throw py::value_error(
        "DenseServer: PS_REPLICAS=" + std::to_string(replicas) +
        ": this server also holds server " +
        std::to_string(PrimaryOf(node.rank(), node.num_servers())) +
        "'s keys: pass replica_first_key, replica_end_key and "
        "replica_weights (ps.dense.serve_dense does)");
  }
  if (replicas == 0 && has_replica) {
    throw py::value_error(
        "DenseServer: replica_weights given but PS_REPLICAS is 0");
  }
  if (o.checkpoint_every < 0) {
    throw py::value_error("DenseServer: checkpoint_every=" +
                          std::to_string(o.checkpoint_every) + " is negative");
  }
  if (o.checkpoint_dir.empty() &&
      (o.checkpoint_every > 0 || o.restore_step >= 0)) {
    throw py::value_error(
        "DenseServer: checkpoint_every=" + std::to_string(o.checkpoint_every) +
        " restore_step=" + std::to_string(o.restore_step) +
        " need checkpoint_dir");
  }
  if (!o.checkpoint_dir.empty() && consistency != Consistency::kBsp) {
    throw py::value_error(
        "DenseServer: checkpoint_dir needs consistency='bsp' (checkpoints "
        "are taken at step boundaries every node agrees on), got '" +
        std::string(ConsistencyName(consistency)) + "'");
  }
  return *failure;
}

// A DenseServer: this server's DenseShard and, under PS_REPLICAS=1, the
// replica shard of server PrimaryOf(rank)'s keys (made first, as
// dense_server.h asks), each with its own optimizers and checkpoint files.
class PyDenseServer {
 public:
  PyDenseServer(const DenseLayout& layout, Key first_key, Key end_key,
                const py::object& weights, const model::OptimizerConfig& opt,
                const std::string& consistency, int max_delay, int num_workers,
                const model::LrScheduleConfig& schedule, int app_id,
                Key replica_first_key, Key replica_end_key,
                const py::object& replica_weights, const ServeOptions& serve) {
    StatusOr<Consistency> c = ParseConsistency(consistency);
    Check(c.status());
    // Fails here, before serving, on a bad optimizer setting.
    Check(model::MakeOptimizer(opt, 1).status());
    if (max_delay < 0) {
      throw py::value_error("DenseServer: max_delay=" +
                            std::to_string(max_delay) + " is negative");
    }
    if (num_workers < 0) {
      throw py::value_error(
          "DenseServer: num_workers=" + std::to_string(num_workers) +
          " is negative (0: the job's)");
    }
    std::vector<float> slice =
        SliceOf(layout, first_key, end_key, weights, "weights");
    Node* node = StartedNode("DenseServer");
    const bool has_replica = !replica_weights.is_none();
    DenseShardOptions options;
    options.on_worker_failure =
        CheckServeOptions(*node, *c, serve, has_replica);
    std::vector<float> rslice;
    if (has_replica) {
      rslice = SliceOf(layout, replica_first_key, replica_end_key,
                       replica_weights, "replica_weights");
    }
    options.consistency = *c;
    options.max_delay = *c == Consistency::kBounded ? max_delay : 0;
    options.num_workers = num_workers > 0 ? num_workers : node->num_workers();
    options.snapshot_every = serve.checkpoint_every;
    const int rank = node->rank();
    const int primary = PrimaryOf(rank, node->num_servers());
    std::shared_ptr<const Checkpointer> checkpointer;
    if (!serve.checkpoint_dir.empty()) {
      CheckpointJob job;
      job.dir = serve.checkpoint_dir;
      job.num_servers = node->num_servers();
      job.num_workers = node->num_workers();
      job.model_floats = layout.total;
      job.chunk = layout.chunk;
      checkpointer = std::make_shared<const Checkpointer>(std::move(job));
    }
    own_.optimizers =
        std::make_shared<RangeOptimizers>(opt, schedule, slice.size());
    replica_.optimizers =
        std::make_shared<RangeOptimizers>(opt, schedule, rslice.size());
    if (serve.restore_step >= 0) {
      options.first_step = serve.restore_step;
      Restore(*checkpointer, serve.restore_step, rank, &slice,
              own_.optimizers.get());
      if (has_replica) {
        Restore(*checkpointer, serve.restore_step, primary, &rslice,
                replica_.optimizers.get());
      }
    }
    claim_ = std::make_unique<CustomerClaim>(true, app_id, -1);
    server_ = std::make_unique<KVServer<float>>(node, app_id);
    if (auto compressor = CompressorOf(serve.compress, "DenseServer")) {
      Check(server_->AddFilter(compressor));
    }
    if (has_replica) {
      DenseShardOptions replica_options = options;
      replica_options.replica = true;
      replica_.has_keys = replica_first_key < replica_end_key;
      replica_.shard = MakeShard(
          layout, replica_first_key, replica_end_key, std::move(rslice),
          replica_options, replica_.optimizers,
          SnapshotOf(checkpointer, primary, rank, replica_.optimizers));
    }
    own_.has_keys = first_key < end_key;
    own_.shard = MakeShard(
        layout, first_key, end_key, std::move(slice), options, own_.optimizers,
        SnapshotOf(checkpointer, rank, rank, own_.optimizers));
  }

  ~PyDenseServer() {
    py::gil_scoped_release release;  // the shard waits for a running request
    own_.shard.reset();
    replica_.shard.reset();
    server_.reset();
  }

  // Every worker sent kDone to both shards (those with keys).
  bool WaitAllDone(double timeout_s) {
    // A year: far beyond any job, and far from overflowing the deadline.
    constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;
    if (!(timeout_s >= 0)) {  // also NaN
      throw py::value_error("wait_all_done: timeout_s=" +
                            std::to_string(timeout_s) + " is not >= 0");
    }
    timeout_s = std::min(timeout_s, kMaxTimeoutS);
    py::gil_scoped_release release;
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    for (const Part* p : {&own_, &replica_}) {
      if (!p->shard || !p->has_keys) continue;
      const auto left = std::max(std::chrono::steady_clock::duration::zero(),
                                 deadline - std::chrono::steady_clock::now());
      if (!p->shard->WaitAllDone(
              std::chrono::duration_cast<std::chrono::milliseconds>(left))) {
        return false;
      }
    }
    return true;
  }

  py::object Failure() const {
    for (const Part* p : {&own_, &replica_}) {
      if (!p->shard) continue;
      Status st = p->shard->failure();
      if (!st.ok()) return py::str(st.ToString());
    }
    return py::none();
  }

  // A copy: call only while no request is in flight (after wait_all_done).
  py::array_t<float> Weights() const {
    const SArray<float>& w = own_.shard->weights();
    py::array_t<float> out(w.size());
    std::memcpy(out.mutable_data(), w.data(), w.size() * sizeof(float));
    return out;
  }

  const DenseShard& shard() const { return *own_.shard; }
  // The replica's updates applied; None without a replica.
  py::object ReplicaUpdates() const {
    if (!replica_.shard) return py::none();
    return py::int_(replica_.shard->updates_applied());
  }

 private:
  struct Part {
    std::shared_ptr<RangeOptimizers> optimizers;
    std::unique_ptr<DenseShard> shard;
    bool has_keys = false;
  };

  std::unique_ptr<DenseShard> MakeShard(
      const DenseLayout& layout, Key first_key, Key end_key,
      std::vector<float> slice, const DenseShardOptions& options,
      std::shared_ptr<RangeOptimizers> optimizers, DenseSnapshot snapshot) {
    return std::make_unique<DenseShard>(
        server_.get(), layout, first_key, end_key, std::move(slice), options,
        [optimizers](float* wt, const float* g, size_t offset, size_t n,
                     int num_grads, int step, int tag) {
          optimizers->Update(wt, g, offset, n, num_grads, step, tag);
        },
        std::move(snapshot));
  }

  // Loads server `rank`'s file of `step` into *slice and *optimizers, then
  // removes that server's files of later steps (the killed run's); ps.Error
  // naming the file.
  static void Restore(const Checkpointer& checkpointer, int step, int rank,
                      std::vector<float>* slice, RangeOptimizers* optimizers) {
    StatusOr<std::string> payload =
        checkpointer.Read(step, CheckpointRole::kServer, rank);
    if (!payload.ok()) throw PsError("restore: " + payload.status().message());
    Status st = LoadSlicePayload(*payload, slice, optimizers);
    if (!st.ok()) {
      throw PsError("restore: '" +
                    checkpointer.Path(step, CheckpointRole::kServer, rank) +
                    "': " + st.message());
    }
    checkpointer.RemoveAfter(step, CheckpointRole::kServer, rank);
  }

  std::unique_ptr<CustomerClaim> claim_;  // let go after the server
  std::unique_ptr<KVServer<float>> server_;
  Part replica_;  // made before own_ (dense_server.h), destroyed after it
  Part own_;
};

// The float count an array can hold, bounding a layout's total.
constexpr size_t kMaxFloats =
    static_cast<size_t>(std::numeric_limits<py::ssize_t>::max()) /
    sizeof(float);

void CheckKey(const char* what, const DenseLayout& l, Key key, Key end) {
  if (key >= end) {
    throw py::index_error(std::string(what) + ": key " + std::to_string(key) +
                          " is out of range for the layout's " +
                          std::to_string(l.num_keys()) + " keys");
  }
}

}  // namespace

void BindDense(py::module_& m) {
  py::class_<DenseLayout>(m, "DenseLayout")
      .def(py::init([](size_t total, size_t chunk) {
             if (chunk == 0) {
               throw py::value_error("DenseLayout: chunk must be > 0");
             }
             if (total > kMaxFloats) {
               throw py::value_error(
                   "DenseLayout: total=" + std::to_string(total) +
                   " floats is more than an array can "
                   "address (" +
                   std::to_string(kMaxFloats) + ")");
             }
             DenseLayout l;
             l.total = total;
             l.chunk = chunk;
             return l;
           }),
           py::arg("total"), py::arg("chunk"))
      .def_readonly("total", &DenseLayout::total)
      .def_readonly("chunk", &DenseLayout::chunk)
      .def_property_readonly("num_keys", &DenseLayout::num_keys)
      // offset: keys [0, num_keys], num_keys giving the end of the last.
      .def(
          "offset",
          [](const DenseLayout& l, Key key) {
            CheckKey("DenseLayout.offset", l, key, l.num_keys() + 1);
            return l.offset(key);
          },
          py::arg("key"))
      .def(
          "length",
          [](const DenseLayout& l, Key key) {
            CheckKey("DenseLayout.length", l, key, l.num_keys());
            return l.length(key);
          },
          py::arg("key"));

  m.def(
      "encode_dense_cmd",
      [](int op, int step, int tag) {
        if (op < 0 || op > 2 || step < 0 || step > kMaxDenseStep || tag < 0 ||
            tag > kMaxDenseTag) {
          throw py::value_error(
              "encode_dense_cmd: op=" + std::to_string(op) +
              " step=" + std::to_string(step) + " tag=" + std::to_string(tag) +
              ": op 0|1|2, step [0, " + std::to_string(kMaxDenseStep) +
              "], tag [0, " + std::to_string(kMaxDenseTag) + "]");
        }
        return EncodeDenseCmd(static_cast<DenseOp>(op), step, tag);
      },
      py::arg("op"), py::arg("step"), py::arg("tag") = 0);
  m.attr("DENSE_STEP") = static_cast<int>(DenseOp::kStep);
  m.attr("DENSE_DONE") = static_cast<int>(DenseOp::kDone);
  m.attr("DENSE_JOIN") = static_cast<int>(DenseOp::kJoin);
  m.attr("MAX_DENSE_STEP") = kMaxDenseStep;

  py::class_<model::OptimizerConfig>(m, "OptimizerConfig")
      .def(py::init([](const std::string& name, float lr, float momentum,
                       bool nesterov, float beta1, float beta2, float eps,
                       float weight_decay) {
             model::OptimizerConfig c;
             c.name = name;
             c.lr = lr;
             c.momentum = momentum;
             c.nesterov = nesterov;
             c.beta1 = beta1;
             c.beta2 = beta2;
             c.eps = eps;
             c.weight_decay = weight_decay;
             Check(model::MakeOptimizer(c, 1).status());
             return c;
           }),
           py::arg("name") = "sgd", py::arg("lr") = 0.01f,
           py::arg("momentum") = 0.0f, py::arg("nesterov") = false,
           py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
           py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.0f)
      .def_readonly("name", &model::OptimizerConfig::name)
      .def_readonly("lr", &model::OptimizerConfig::lr)
      .def_readonly("momentum", &model::OptimizerConfig::momentum);

  py::class_<PyDenseServer>(m, "DenseServer")
      .def(
          py::init(
              [](const DenseLayout& layout, Key first_key, Key end_key,
                 const py::object& weights, const model::OptimizerConfig& opt,
                 const std::string& consistency, int max_delay, int num_workers,
                 int lr_step, float lr_gamma, int app_id, Key replica_first_key,
                 Key replica_end_key, const py::object& replica_weights,
                 const std::string& on_worker_failure,
                 const std::string& checkpoint_dir, int checkpoint_every,
                 int restore_step, const std::string& compress,
                 const std::string& lr_schedule, int64_t total_steps,
                 int64_t warmup_steps) {
                // Before the node is asked for: a bad schedule fails
                // anywhere, started or not.
                const model::LrScheduleConfig schedule =
                    ScheduleOf(opt, lr_schedule, lr_step, lr_gamma, total_steps,
                               warmup_steps);
                ServeOptions serve;
                serve.compress = compress;
                serve.on_worker_failure = on_worker_failure;
                serve.checkpoint_dir = checkpoint_dir;
                serve.checkpoint_every = checkpoint_every;
                serve.restore_step = restore_step;
                return std::make_unique<PyDenseServer>(
                    layout, first_key, end_key, weights, opt, consistency,
                    max_delay, num_workers, schedule, app_id, replica_first_key,
                    replica_end_key, replica_weights, serve);
              }),
          py::arg("layout"), py::arg("first_key"), py::arg("end_key"),
          py::arg("weights"), py::arg("optimizer"),
          py::arg("consistency") = "bsp", py::arg("max_delay") = 0,
          py::arg("num_workers") = 0, py::arg("lr_step") = 1,
          py::arg("lr_gamma") = 1.0f, py::arg("app_id") = 0, py::kw_only(),
          py::arg("replica_first_key") = 0, py::arg("replica_end_key") = 0,
          py::arg("replica_weights") = py::none(),
          py::arg("on_worker_failure") = "stop", py::arg("checkpoint_dir") = "",
          py::arg("checkpoint_every") = 0, py::arg("restore_step") = -1,
          py::arg("compress") = "", py::arg("lr_schedule") = "step",
          py::arg("total_steps") = 0, py::arg("warmup_steps") = 0)
      .def("wait_all_done", &PyDenseServer::WaitAllDone, py::arg("timeout_s"))
      .def_property_readonly("failure", &PyDenseServer::Failure)
      .def("weights", &PyDenseServer::Weights)
      .def_property_readonly(
          "updates_applied",
          [](const PyDenseServer& s) { return s.shard().updates_applied(); })
      .def_property_readonly(
          "max_staleness",
          [](const PyDenseServer& s) { return s.shard().max_staleness(); })
      .def_property_readonly("replica_updates_applied",
                             &PyDenseServer::ReplicaUpdates)
      .def_property_readonly(
          "workers_rejoined",
          [](const PyDenseServer& s) { return s.shard().workers_rejoined(); })
      .def_property_readonly("bad_requests", [](const PyDenseServer& s) {
        return s.shard().bad_requests();
      });
}

}  // namespace python
}  // namespace ps
