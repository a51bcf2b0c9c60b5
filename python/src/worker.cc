// ps._ps.KVWorker: push, pull and pushpull of caller buffers (float32
// values, int64 keys, int32 lens) without copying them. Each call returns a
// timestamp; the buffers stay exported (BufferView) until wait(ts) returns,
// so that the caller can neither free nor resize them while the request may
// read them or write the pulled values into them (array.array's append
// raises BufferError meanwhile). A failed wait keeps them exported for
// good: a late answer may still write into the destination.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/kv_app.h"
#include "ps/placement.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

class PyWorker {
 public:
  PyWorker(int app_id, int customer_id)
      : node_(StartedNode("KVWorker")),
        claim_(std::make_unique<CustomerClaim>(false, app_id, customer_id)),
        kv_(std::make_unique<KVWorker<float>>(node_, app_id, customer_id)) {}

  // The worker goes first (no answer lands after it), then the buffers
  // (with the GIL), then the claim of its ids.
  ~PyWorker() {
    py::gil_scoped_release release;  // it waits for a running delivery
    kv_.reset();
  }

  int Push(const py::object& keys, const py::object& vals,
           const py::object& lens, int cmd) {
    Running("push");
    Request r = Prepare(keys, &vals, lens, nullptr);
    int ts = kv_->ZPush(r.keys, r.vals, r.lens, cmd);
    return Keep(ts, std::move(r));
  }

  int Pull(const py::object& keys, const py::object& out,
           const py::object& lens, int cmd) {
    Running("pull");
    Request r = Prepare(keys, nullptr, lens, &out);
    int ts = kv_->ZPull(r.keys, r.out.get(), nullptr, cmd);
    return Keep(ts, std::move(r));
  }

  int PushPull(const py::object& keys, const py::object& vals,
               const py::object& out, int cmd) {
    Running("pushpull");
    Request r = Prepare(keys, &vals, py::none(), &out);
    if (r.vals.size() != r.out->size()) {
      throw py::value_error(
          "pushpull: vals has " + std::to_string(r.vals.size()) +
          " floats but out has " + std::to_string(r.out->size()));
    }
    int ts = kv_->ZPushPull(r.keys, r.vals, r.out.get(), nullptr, cmd);
    return Keep(ts, std::move(r));
  }

  // `r` is released (its buffers unexported) on return, with the GIL held.
  void Wait(int ts) {
    auto it = pending_.find(ts);
    if (it == pending_.end()) {
      throw py::value_error("wait: unknown or already waited timestamp " +
                            std::to_string(ts));
    }
    Request r = std::move(it->second);
    pending_.erase(it);
    if (Finalized()) {
      failed_.push_back(std::move(r));
      throw PsError("wait: ps.finalize() has been called; request " +
                    std::to_string(ts) + " was not waited for");
    }
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_->Wait(ts);
    }
    if (!st.ok()) {
      failed_.push_back(std::move(r));  // a late answer may still land
      throw PsError(st.ToString());
    }
    if (r.out && (r.out->data() != r.out_data || r.out->size() != r.out_size)) {
      throw py::value_error(
          "pull: the servers answered " + std::to_string(r.out->size()) +
          " floats for a destination of " + std::to_string(r.out_size) +
          " (the destination was left unchanged)");
    }
  }

  void SetPlacement(const Placement& p) {
    Running("set_placement");
    if (p.num_servers() > node_->num_servers()) {
      throw py::value_error("set_placement: the placement has " +
                            std::to_string(p.num_servers()) +
                            " servers but the job has " +
                            std::to_string(node_->num_servers()));
    }
    kv_->SetPlacement(p);
  }
  size_t num_pending() const { return pending_.size(); }

  // Compression (ps/compress.h), before the first request; the servers
  // need it too (KVServer / DenseServer compress=).
  void Compress(const std::string& text) {
    Running("compress");
    if (compressor_ != nullptr) {
      throw py::value_error("compress: this worker compresses already (" +
                            compressor_->options().ToString() + ")");
    }
    compressor_ = CompressorOf(text, "KVWorker.compress");
    if (compressor_ != nullptr) Check(kv_->AddFilter(compressor_));
  }
  // What error feedback holds, for a checkpoint, and back.
  py::bytes CompressionState() const {
    return py::bytes(compressor_ ? compressor_->SaveState() : "");
  }
  void RestoreCompressionState(const std::string& state) {
    if (compressor_ == nullptr) {
      if (state.empty()) return;
      throw py::value_error(
          "restore_compression_state: this worker does not compress");
    }
    Check(compressor_->RestoreState(state));
  }

 private:
  struct Request {
    std::vector<BufferView> held;  // the caller's buffers, exported
    SArray<Key> keys;
    SArray<float> vals;
    SArray<int> lens;
    std::unique_ptr<SArray<float>> out;  // the pull's destination
    float* out_data = nullptr;
    size_t out_size = 0;
  };

  static void Running(const char* what) {
    if (Finalized()) {
      throw PsError(std::string(what) + ": ps.finalize() has been called");
    }
  }

  // Views the buffers (no copy) and checks what can be checked here: types,
  // key order, lens, and sizes against the keys (and lens).
  static Request Prepare(const py::object& keys, const py::object* vals,
                         const py::object& lens, const py::object* out) {
    Request r;
    BufferView k = ViewBuffer(keys, Elem::kInt64, false, "keys");
    if (k.size() == 0) throw py::value_error("keys is empty");
    r.keys = SArray<Key>(static_cast<Key*>(k.data()), k.size(), false);
    const int64_t* kp = static_cast<const int64_t*>(k.data());
    for (size_t i = 0; i < k.size(); ++i) {
      if (kp[i] < 0 || (i > 0 && kp[i] <= kp[i - 1])) {
        throw py::value_error(
            "keys must be non-negative, sorted ascending and unique (keys[" +
            std::to_string(i) + "] = " + std::to_string(kp[i]) + ")");
      }
    }
    const size_t num_keys = k.size();
    r.held.push_back(std::move(k));
    bool have_lens = !lens.is_none();
    size_t want = 0;  // floats the lens sum to
    if (have_lens) {
      BufferView l = ViewBuffer(lens, Elem::kInt32, false, "lens");
      if (l.size() != num_keys) {
        throw py::value_error("lens has " + std::to_string(l.size()) +
                              " entries for " + std::to_string(num_keys) +
                              " keys");
      }
      r.lens = SArray<int>(static_cast<int*>(l.data()), l.size(), false);
      for (size_t i = 0; i < l.size(); ++i) {
        if (r.lens[i] < 0) {
          throw py::value_error("lens[" + std::to_string(i) + "] = " +
                                std::to_string(r.lens[i]) + " is negative");
        }
        want += static_cast<size_t>(r.lens[i]);
      }
      r.held.push_back(std::move(l));
    }
    auto check_size = [&](size_t n, const char* what) {
      if (have_lens ? n != want : n % num_keys != 0) {
        throw py::value_error(
            std::string(what) + " has " + std::to_string(n) + " floats: " +
            (have_lens ? "lens sum to " + std::to_string(want)
                       : "not a multiple of its " + std::to_string(num_keys) +
                             " keys"));
      }
    };
    if (vals != nullptr) {
      BufferView v = ViewBuffer(*vals, Elem::kFloat32, false, "vals");
      check_size(v.size(), "vals");
      r.vals = SArray<float>(static_cast<float*>(v.data()), v.size(), false);
      r.held.push_back(std::move(v));
    }
    if (out != nullptr) {
      BufferView o = ViewBuffer(*out, Elem::kFloat32, true, "out");
      check_size(o.size(), "out");
      if (o.size() == 0) {
        throw py::value_error("out is empty: a pull needs room for values");
      }
      r.out_data = static_cast<float*>(o.data());
      r.out_size = o.size();
      r.out = std::make_unique<SArray<float>>(r.out_data, o.size(), false);
      r.held.push_back(std::move(o));
    }
    return r;
  }

  int Keep(int ts, Request r) {
    pending_[ts] = std::move(r);
    return ts;
  }

  Node* const node_;
  // Destroyed in reverse: failed_ and pending_ after kv_ (the destructor
  // resets it first), claim_ last.
  std::unique_ptr<CustomerClaim> claim_;
  // Guarded by the GIL: every method runs with it held.
  std::unordered_map<int, Request> pending_;
  std::vector<Request> failed_;
  std::unique_ptr<KVWorker<float>> kv_;
  std::shared_ptr<Compressor> compressor_;
};

}  // namespace

void BindWorker(py::module_& m) {
  py::class_<PyWorker>(m, "KVWorker")
      .def(py::init<int, int>(), py::arg("app_id") = 0,
           py::arg("customer_id") = 0)
      .def("push", &PyWorker::Push, py::arg("keys"), py::arg("vals"),
           py::arg("lens") = py::none(), py::arg("cmd") = 0)
      .def("pull", &PyWorker::Pull, py::arg("keys"), py::arg("out"),
           py::arg("lens") = py::none(), py::arg("cmd") = 0)
      .def("pushpull", &PyWorker::PushPull, py::arg("keys"), py::arg("vals"),
           py::arg("out"), py::arg("cmd") = 0)
      .def("wait", &PyWorker::Wait, py::arg("ts"))
      .def("set_placement", &PyWorker::SetPlacement, py::arg("placement"))
      .def("compress", &PyWorker::Compress, py::arg("codecs"))
      .def("compression_state", &PyWorker::CompressionState)
      .def("restore_compression_state", &PyWorker::RestoreCompressionState,
           py::arg("state"))
      .def_property_readonly("num_pending", &PyWorker::num_pending);
}

}  // namespace python
}  // namespace ps
