// ps._ps.DenseServer: a DenseShard (ps/dense_server.h) owning this server's
// slice of a dense model, updated by a built-in optimizer (src/model:
// torch.optim.SGD / Adam semantics) on the averaged gradient, with an
// optional StepLR schedule driven by the push's tag. Also DenseLayout and
// the dense cmd encoding, for the worker side (ps/dense.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/optimizer.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

// One optimizer per pushed range (offset, n): SGD and Adam are elementwise,
// so this equals one optimizer over the slice. Runs on the receive thread.
class RangeOptimizers {
 public:
  RangeOptimizers(model::OptimizerConfig config, int lr_step, float lr_gamma)
      : config_(std::move(config)), schedule_(config_.lr, lr_step, lr_gamma) {}

  void Update(float* w, const float* grad_sum, size_t offset, size_t n,
              int num_grads, int tag) {
    auto& opt = optimizers_[{offset, n}];
    if (!opt) opt = std::move(model::MakeOptimizer(config_, n)).value();
    opt->set_grad_scale(1.0f / static_cast<float>(num_grads));
    opt->set_lr(schedule_.LrAt(tag));
    opt->Step(w, grad_sum, n);
  }

 private:
  const model::OptimizerConfig config_;
  model::StepLR schedule_;
  std::map<std::pair<size_t, size_t>, std::unique_ptr<model::Optimizer>>
      optimizers_;
};

class PyDenseServer {
 public:
  PyDenseServer(const DenseLayout& layout, Key first_key, Key end_key,
                const py::object& weights, const model::OptimizerConfig& opt,
                const std::string& consistency, int max_delay, int num_workers,
                int lr_step, float lr_gamma, int app_id) {
    StatusOr<Consistency> c = ParseConsistency(consistency);
    Check(c.status());
    // Fails here, before serving, on a bad optimizer setting.
    Check(model::MakeOptimizer(opt, 1).status());
    if (lr_step < 1) {
      throw py::value_error("DenseServer: lr_step=" + std::to_string(lr_step) +
                            " is not >= 1");
    }
    if (max_delay < 0) {
      throw py::value_error("DenseServer: max_delay=" +
                            std::to_string(max_delay) + " is negative");
    }
    if (num_workers < 0) {
      throw py::value_error(
          "DenseServer: num_workers=" + std::to_string(num_workers) +
          " is negative (0: the job's)");
    }
    if (first_key > end_key || end_key > layout.num_keys()) {
      throw py::value_error("DenseServer: keys [first_key, end_key) = [" +
                            std::to_string(first_key) + ", " +
                            std::to_string(end_key) +
                            ") outside the layout's " +
                            std::to_string(layout.num_keys()) + " keys");
    }
    BufferView w = ViewBuffer(weights, Elem::kFloat32, false, "weights");
    size_t lo = layout.offset(first_key);
    size_t hi = first_key == end_key
                    ? lo
                    : layout.offset(end_key - 1) + layout.length(end_key - 1);
    if (w.size() != hi - lo) {
      throw py::value_error("weights has " + std::to_string(w.size()) +
                            " floats; keys [" + std::to_string(first_key) +
                            ", " + std::to_string(end_key) + ") hold " +
                            std::to_string(hi - lo));
    }
    const float* wp = static_cast<const float*>(w.data());
    std::vector<float> slice(wp, wp + w.size());
    DenseShardOptions options;
    options.consistency = *c;
    options.max_delay = *c == Consistency::kBounded ? max_delay : 0;
    Node* node = StartedNode("DenseServer");
    options.num_workers = num_workers > 0 ? num_workers : node->num_workers();
    auto updater = std::make_shared<RangeOptimizers>(opt, lr_step, lr_gamma);
    claim_ = std::make_unique<CustomerClaim>(true, app_id, -1);
    server_ = std::make_unique<KVServer<float>>(node, app_id);
    shard_ = std::make_unique<DenseShard>(
        server_.get(), layout, first_key, end_key, std::move(slice), options,
        [updater](float* wt, const float* g, size_t offset, size_t n,
                  int num_grads, int /*step*/, int tag) {
          updater->Update(wt, g, offset, n, num_grads, tag);
        });
  }

  ~PyDenseServer() {
    py::gil_scoped_release release;  // the shard waits for a running request
    shard_.reset();
    server_.reset();
  }

  bool WaitAllDone(double timeout_s) {
    // A year: far beyond any job, and far from overflowing the deadline.
    constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;
    if (!(timeout_s >= 0)) {  // also NaN
      throw py::value_error("wait_all_done: timeout_s=" +
                            std::to_string(timeout_s) + " is not >= 0");
    }
    timeout_s = std::min(timeout_s, kMaxTimeoutS);
    py::gil_scoped_release release;
    return shard_->WaitAllDone(
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  }

  py::object Failure() const {
    Status st = shard_->failure();
    if (st.ok()) return py::none();
    return py::str(st.ToString());
  }

  // A copy: call only while no request is in flight (after wait_all_done).
  py::array_t<float> Weights() const {
    const SArray<float>& w = shard_->weights();
    py::array_t<float> out(w.size());
    std::memcpy(out.mutable_data(), w.data(), w.size() * sizeof(float));
    return out;
  }

  const DenseShard& shard() const { return *shard_; }

 private:
  std::unique_ptr<CustomerClaim> claim_;  // let go after the server
  std::unique_ptr<KVServer<float>> server_;
  std::unique_ptr<DenseShard> shard_;
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
        if (op < 0 || op > 1 || step < 0 || step > kMaxDenseStep || tag < 0 ||
            tag > kMaxDenseTag) {
          throw py::value_error(
              "encode_dense_cmd: op=" + std::to_string(op) +
              " step=" + std::to_string(step) + " tag=" + std::to_string(tag) +
              ": op 0|1, step [0, " + std::to_string(kMaxDenseStep) +
              "], tag [0, " + std::to_string(kMaxDenseTag) + "]");
        }
        return EncodeDenseCmd(static_cast<DenseOp>(op), step, tag);
      },
      py::arg("op"), py::arg("step"), py::arg("tag") = 0);
  m.attr("DENSE_STEP") = static_cast<int>(DenseOp::kStep);
  m.attr("DENSE_DONE") = static_cast<int>(DenseOp::kDone);
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
      .def(py::init<const DenseLayout&, Key, Key, const py::object&,
                    const model::OptimizerConfig&, const std::string&, int, int,
                    int, float, int>(),
           py::arg("layout"), py::arg("first_key"), py::arg("end_key"),
           py::arg("weights"), py::arg("optimizer"),
           py::arg("consistency") = "bsp", py::arg("max_delay") = 0,
           py::arg("num_workers") = 0, py::arg("lr_step") = 1,
           py::arg("lr_gamma") = 1.0f, py::arg("app_id") = 0)
      .def("wait_all_done", &PyDenseServer::WaitAllDone, py::arg("timeout_s"))
      .def_property_readonly("failure", &PyDenseServer::Failure)
      .def("weights", &PyDenseServer::Weights)
      .def_property_readonly(
          "updates_applied",
          [](const PyDenseServer& s) { return s.shard().updates_applied(); })
      .def_property_readonly(
          "max_staleness",
          [](const PyDenseServer& s) { return s.shard().max_staleness(); })
      .def_property_readonly("bad_requests", [](const PyDenseServer& s) {
        return s.shard().bad_requests();
      });
}

}  // namespace python
}  // namespace ps
