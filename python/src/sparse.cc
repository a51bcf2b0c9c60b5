// ps._ps sparse tables (ps/sparse.h): SparseTableConfig, SparseBatch (a
// batch's unique ids and where each id went), SparseWorker (rows pulled
// and gradients pushed by 64-bit id, sync points) and SparseServer (a
// KVServer<float> with this server's SparseShard and, under PS_REPLICAS=1,
// the replica shard of the server before it). ps/sparse.py wraps them
// (torch tensors, EmbeddingBag).
//
// Every argument is checked here before it reaches a CHECK of the library
// (a table id or width out of range, a table the worker was not given,
// sizes that do not fit); every call that may block releases the GIL.
#include "ps/sparse.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/kv_app.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

// ValueError naming the field and value of a bad config, or two tables of
// one id.
void CheckTables(const std::vector<SparseTableConfig>& tables,
                 const char* who) {
  if (tables.empty()) {
    throw py::value_error(std::string(who) + ": no sparse tables given");
  }
  std::set<int> ids;
  for (const SparseTableConfig& t : tables) {
    Status st = t.Validate();
    if (!st.ok()) throw py::value_error(std::string(who) + ": " + st.message());
    if (!ids.insert(t.id).second) {
      throw py::value_error(std::string(who) + ": two tables of id " +
                            std::to_string(t.id));
    }
  }
}

// A float32 array of rows x width, C-contiguous.
py::array_t<float> Rows(size_t rows, int width) {
  return py::array_t<float>(
      {static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)});
}

// A batch's ids as uint64 (int64 ids are taken as their bits).
struct Ids {
  BufferView view;
  const uint64_t* data() const {
    return static_cast<const uint64_t*>(view.data());
  }
  size_t size() const { return view.size(); }
};

Ids ViewIds(const py::object& ids) {
  return Ids{ViewBuffer(ids, Elem::kId64, false, "ids")};
}

// A batch's unique ids (SparseBatch): len() unique rows, and inverse[i]
// the row of the batch's id i.
struct PyBatch {
  SparseBatch batch;
  // slot as int64 (torch's index type), a new array each call.
  py::array_t<int64_t> Inverse() const {
    py::array_t<int64_t> out(static_cast<py::ssize_t>(batch.slot.size()));
    int64_t* p = out.mutable_data();
    for (size_t i = 0; i < batch.slot.size(); ++i) p[i] = batch.slot[i];
    return out;
  }
};

class PySparseWorker {
 public:
  PySparseWorker(const std::vector<SparseTableConfig>& tables, int app_id,
                 int customer_id)
      : node_(StartedNode("SparseWorker")) {
    CheckTables(tables, "SparseWorker");
    widths_.assign(kMaxSparseTables, 0);
    for (const SparseTableConfig& t : tables) widths_[t.id] = t.width;
    claim_ = std::make_unique<CustomerClaim>(false, app_id, customer_id);
    kv_ = std::make_unique<SparseWorker>(node_, tables, app_id, customer_id);
  }

  ~PySparseWorker() {
    py::gil_scoped_release release;  // it waits for a running delivery
    kv_.reset();
  }

  int Width(int table) const {
    if (table < 0 || table >= kMaxSparseTables || widths_[table] == 0) {
      throw py::index_error("SparseWorker: no sparse table " +
                            std::to_string(table) + " on this worker");
    }
    return widths_[table];
  }

  py::array_t<float> Pull(int table, const py::object& ids) {
    const int w = Width(table);
    Running("pull");
    Ids v = ViewIds(ids);
    py::array_t<float> out = Rows(v.size(), w);
    float* dst = out.mutable_data();
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Pull(table, v.data(), v.size(), dst);
    }
    Check(st);
    return out;
  }

  void Push(int table, const py::object& ids, const py::object& grads) {
    const int w = Width(table);
    Running("push");
    Ids v = ViewIds(ids);
    BufferView g = ViewBuffer(grads, Elem::kFloat32, false, "grads");
    if (g.size() != v.size() * static_cast<size_t>(w)) {
      throw py::value_error("push: grads has " + std::to_string(g.size()) +
                            " floats for " + std::to_string(v.size()) +
                            " ids of width " + std::to_string(w));
    }
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Push(table, v.data(), v.size(),
                     static_cast<const float*>(g.data()));
    }
    Check(st);
  }

  // The rows of the batch's unique ids, in its order (inverse maps each id
  // of the batch to its row).
  py::array_t<float> PullRows(int table, const PyBatch& b) {
    const int w = Width(table);
    Running("pull_rows");
    py::array_t<float> out = Rows(b.batch.size(), w);
    if (b.batch.size() == 0) return out;
    SArray<float> rows(out.mutable_data(), b.batch.size() * w, false);
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Wait(kv_->PullRows(table, b.batch, &rows));
    }
    if (!st.ok()) {
      failed_.push_back(out);  // a late answer may still land in it
      throw PsError(st.ToString());
    }
    return out;
  }

  // Gradients of the batch's unique ids (rows in the batch's order), sent
  // without waiting: Wait(ts) waits. -1: nothing to send (an empty batch).
  // The grads stay exported until then (for good if the wait failed: a
  // resend may still read them).
  int PushRowsAsync(int table, const py::object& batch,
                    const py::object& grads) {
    if (!py::isinstance<PyBatch>(batch)) {
      throw py::type_error("push_rows: batch must be a SparseBatch, got " +
                           std::string(py::str(py::type::of(batch))));
    }
    const PyBatch& b = batch.cast<const PyBatch&>();
    const int w = Width(table);
    Running("push_rows");
    BufferView g = ViewBuffer(grads, Elem::kFloat32, false, "grads");
    if (g.size() != b.batch.size() * static_cast<size_t>(w)) {
      throw py::value_error("push_rows: grads has " + std::to_string(g.size()) +
                            " floats for a batch of " +
                            std::to_string(b.batch.size()) +
                            " unique ids of width " + std::to_string(w));
    }
    if (b.batch.size() == 0) return -1;
    SArray<float> sent(static_cast<float*>(g.data()), g.size(), false);
    const int ts = kv_->PushRows(table, b.batch, sent);
    pending_[ts] = Pending{std::move(g), batch};
    return ts;
  }

  void Wait(int ts) {
    if (ts == -1) return;
    auto it = pending_.find(ts);
    if (it == pending_.end()) {
      throw py::value_error("wait: unknown or already waited timestamp " +
                            std::to_string(ts));
    }
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (Finalized()) {
      failed_pushes_.push_back(std::move(p));
      throw PsError("wait: ps.finalize() has been called; request " +
                    std::to_string(ts) + " was not waited for");
    }
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Wait(ts);
    }
    if (!st.ok()) {
      failed_pushes_.push_back(std::move(p));
      throw PsError(st.ToString());
    }
  }

  void PushRows(int table, const py::object& batch, const py::object& grads) {
    Wait(PushRowsAsync(table, batch, grads));
  }

  size_t num_pending() const { return pending_.size(); }

  void Sync(int point) {
    if (point < 0 || point > kMaxSparsePoint) {
      throw py::value_error("sync: point " + std::to_string(point) +
                            " outside [0, " + std::to_string(kMaxSparsePoint) +
                            "]");
    }
    Running("sync");
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Sync(point);
    }
    Check(st);
  }

 private:
  static void Running(const char* what) {
    if (Finalized()) {
      throw PsError(std::string(what) + ": ps.finalize() has been called");
    }
  }

  // A push not yet waited for: its gradient buffer and batch.
  struct Pending {
    BufferView grads;
    py::object batch;
  };

  Node* const node_;
  std::vector<int> widths_;  // by table id; 0: not given
  // Destroyed in reverse: the buffers of requests after kv_ (the
  // destructor resets it first), claim_ last. Guarded by the GIL.
  std::unique_ptr<CustomerClaim> claim_;
  std::vector<py::object> failed_;  // destinations of failed pulls
  std::unordered_map<int, Pending> pending_;
  std::vector<Pending> failed_pushes_;
  std::unique_ptr<SparseWorker> kv_;
};

class PySparseServer {
 public:
  PySparseServer(const std::vector<SparseTableConfig>& tables, int num_workers,
                 int app_id, bool allow_non_finite) {
    CheckTables(tables, "SparseServer");
    if (num_workers < 0) {
      throw py::value_error(
          "SparseServer: num_workers=" + std::to_string(num_workers) +
          " is negative (0: the job's)");
    }
    Node* node = StartedNode("SparseServer");
    SparseShardOptions options;
    options.num_workers = num_workers > 0 ? num_workers : node->num_workers();
    options.allow_non_finite = allow_non_finite;
    options.max_pull_bytes = node->config().max_message_bytes;
    claim_ = std::make_unique<CustomerClaim>(true, app_id, -1);
    server_ = std::make_unique<KVServer<float>>(node, app_id);
    if (node->config().replicas > 0) {  // made first (sparse.h)
      SparseShardOptions replica = options;
      replica.replica = true;
      replica_ = std::make_unique<SparseShard>(server_.get(), tables, replica);
    }
    shard_ = std::make_unique<SparseShard>(server_.get(), tables, options);
  }

  ~PySparseServer() {
    py::gil_scoped_release release;  // a shard waits for a running request
    shard_.reset();
    replica_.reset();
    server_.reset();
  }

  // Who this server's oldest sync point waits for ("" when none waits).
  std::string WaitingFor() const {
    py::gil_scoped_release release;
    return shard_->SyncWaitingFor();
  }

  bool WaitSync(int point, double timeout_s) const {
    if (point < 0 || point > kMaxSparsePoint) {
      throw py::value_error("wait_sync: point " + std::to_string(point) +
                            " outside [0, " + std::to_string(kMaxSparsePoint) +
                            "]");
    }
    if (!(timeout_s >= 0)) {  // also NaN
      throw py::value_error(
          "wait_sync: timeout_s=" + std::to_string(timeout_s) + " is not >= 0");
    }
    timeout_s = std::min(timeout_s, 365.0 * 24 * 3600);
    py::gil_scoped_release release;
    return shard_->WaitSync(point, std::chrono::milliseconds(
                                       static_cast<int64_t>(timeout_s * 1e3)));
  }

  const SparseShard& shard() const { return *shard_; }
  const SparseShard* replica() const { return replica_.get(); }

  py::object Row(int table, uint64_t id) const {
    std::vector<float> values;
    if (!shard_->Row(table, id, &values)) return py::none();
    py::array_t<float> out(static_cast<py::ssize_t>(values.size()));
    std::memcpy(out.mutable_data(), values.data(),
                values.size() * sizeof(float));
    return std::move(out);
  }

  py::bytes Save() const {
    std::string state;
    {
      py::gil_scoped_release release;
      state = shard_->Save();
    }
    return py::bytes(state);
  }

  void Load(const std::string& state) { Check(shard_->Load(state)); }

 private:
  std::unique_ptr<CustomerClaim> claim_;  // let go after the server
  std::unique_ptr<KVServer<float>> server_;
  std::unique_ptr<SparseShard> replica_;  // made before shard_
  std::unique_ptr<SparseShard> shard_;
};

SparseTableConfig MakeConfig(int id, int width, const std::string& init,
                             float init_scale, uint64_t seed,
                             const std::string& optimizer, float lr,
                             float adagrad_init, float adagrad_eps,
                             float ftrl_alpha, float ftrl_beta, float ftrl_l1,
                             float ftrl_l2) {
  SparseTableConfig c;
  c.id = id;
  c.width = width;
  StatusOr<SparseInit> i = ParseSparseInit(init);
  if (!i.ok()) throw py::value_error(i.status().message());
  c.init = *i;
  c.init_scale = init_scale;
  c.seed = seed;
  StatusOr<SparseOptimizer> o = ParseSparseOptimizer(optimizer);
  if (!o.ok()) throw py::value_error(o.status().message());
  c.optimizer = *o;
  c.lr = lr;
  c.adagrad_init = adagrad_init;
  c.adagrad_eps = adagrad_eps;
  c.ftrl_alpha = ftrl_alpha;
  c.ftrl_beta = ftrl_beta;
  c.ftrl_l1 = ftrl_l1;
  c.ftrl_l2 = ftrl_l2;
  Status st = c.Validate();
  if (!st.ok()) throw py::value_error(st.message());
  return c;
}

}  // namespace

void BindSparse(py::module_& m) {
  using C = SparseTableConfig;
  py::class_<C>(m, "SparseTableConfig")
      .def(py::init(&MakeConfig), py::arg("id"), py::arg("width"),
           py::arg("init") = "zero", py::arg("init_scale") = 0.01f,
           py::arg("seed") = 0, py::arg("optimizer") = "adagrad",
           py::arg("lr") = 0.05f, py::arg("adagrad_init") = 0.1f,
           py::arg("adagrad_eps") = 1e-8f, py::arg("ftrl_alpha") = 0.05f,
           py::arg("ftrl_beta") = 1.0f, py::arg("ftrl_l1") = 0.0f,
           py::arg("ftrl_l2") = 0.0f)
      .def_readonly("id", &C::id)
      .def_readonly("width", &C::width)
      .def_property_readonly("init",
                             [](const C& c) { return SparseInitName(c.init); })
      .def_readonly("init_scale", &C::init_scale)
      .def_readonly("seed", &C::seed)
      .def_property_readonly(
          "optimizer",
          [](const C& c) { return SparseOptimizerName(c.optimizer); })
      .def_readonly("lr", &C::lr)
      .def_readonly("adagrad_init", &C::adagrad_init)
      .def_readonly("adagrad_eps", &C::adagrad_eps)
      .def_readonly("ftrl_alpha", &C::ftrl_alpha)
      .def_readonly("ftrl_beta", &C::ftrl_beta)
      .def_readonly("ftrl_l1", &C::ftrl_l1)
      .def_readonly("ftrl_l2", &C::ftrl_l2)
      .def("__repr__", [](const C& c) {
        return "SparseTableConfig(id=" + std::to_string(c.id) +
               ", width=" + std::to_string(c.width) + ", init='" +
               SparseInitName(c.init) + "', optimizer='" +
               SparseOptimizerName(c.optimizer) +
               "', lr=" + std::to_string(c.lr) + ")";
      });

  py::class_<PyBatch>(m, "SparseBatch")
      .def(py::init([](const py::object& ids) {
             Ids v = ViewIds(ids);
             auto b = std::make_unique<PyBatch>();
             {
               py::gil_scoped_release release;  // O(n log n)
               b->batch = SparseBatch::Of(v.data(), v.size());
             }
             return b;
           }),
           py::arg("ids"))
      .def("__len__", [](const PyBatch& b) { return b.batch.size(); })
      .def_property_readonly(
          "num_ids", [](const PyBatch& b) { return b.batch.slot.size(); })
      .def_property_readonly("inverse", &PyBatch::Inverse);

  py::class_<PySparseWorker>(m, "SparseWorker")
      .def(py::init<std::vector<SparseTableConfig>, int, int>(),
           py::arg("tables"), py::arg("app_id") = 0, py::arg("customer_id") = 0)
      .def("width", &PySparseWorker::Width, py::arg("table"))
      .def("pull", &PySparseWorker::Pull, py::arg("table"), py::arg("ids"))
      .def("push", &PySparseWorker::Push, py::arg("table"), py::arg("ids"),
           py::arg("grads"))
      .def("pull_rows", &PySparseWorker::PullRows, py::arg("table"),
           py::arg("batch"))
      .def("push_rows", &PySparseWorker::PushRows, py::arg("table"),
           py::arg("batch"), py::arg("grads"))
      .def("push_rows_async", &PySparseWorker::PushRowsAsync, py::arg("table"),
           py::arg("batch"), py::arg("grads"))
      .def("wait", &PySparseWorker::Wait, py::arg("ts"))
      .def_property_readonly("num_pending", &PySparseWorker::num_pending)
      .def("sync", &PySparseWorker::Sync, py::arg("point"));

  py::class_<PySparseServer>(m, "SparseServer")
      .def(py::init<std::vector<SparseTableConfig>, int, int, bool>(),
           py::arg("tables"), py::arg("num_workers") = 0, py::arg("app_id") = 0,
           py::arg("allow_non_finite") = false)
      .def("wait_sync", &PySparseServer::WaitSync, py::arg("point"),
           py::arg("timeout_s"))
      .def("waiting_for", &PySparseServer::WaitingFor)
      .def(
          "rows",
          [](const PySparseServer& s, int table) {
            return s.shard().rows(table);
          },
          py::arg("table"))
      .def(
          "replica_rows",
          [](const PySparseServer& s, int table) -> py::object {
            if (s.replica() == nullptr) return py::none();
            return py::int_(s.replica()->rows(table));
          },
          py::arg("table"))
      .def_property_readonly(
          "memory_bytes",
          [](const PySparseServer& s) {
            return s.shard().memory_bytes() +
                   (s.replica() ? s.replica()->memory_bytes() : 0);
          })
      .def_property_readonly(
          "pushes_applied",
          [](const PySparseServer& s) { return s.shard().pushes_applied(); })
      .def_property_readonly(
          "bad_requests",
          [](const PySparseServer& s) { return s.shard().bad_requests(); })
      .def("row", &PySparseServer::Row, py::arg("table"), py::arg("id"))
      .def("save", &PySparseServer::Save)
      .def("load", &PySparseServer::Load, py::arg("state"));
  m.attr("MAX_SPARSE_TABLES") = kMaxSparseTables;
  m.attr("MAX_SPARSE_WIDTH") = kMaxSparseWidth;
  m.attr("MAX_SPARSE_POINT") = kMaxSparsePoint;
}

}  // namespace python
}  // namespace ps
