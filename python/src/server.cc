// ps._ps.KVServer: a float KVServer whose requests go to a Python callable,
// for custom server logic. Slower than DenseServer: every request takes the
// GIL on the node's receive thread and an answer is copied once. The handler
// gets (meta, keys, vals, lens) -- keys/vals/lens are NumPy views of the
// received frames, valid during the call only -- and returns None (a push's
// answer), vals, or (vals, lens) for a pull; an exception it raises is
// sent to the worker as the error of its wait().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "ps/kv_app.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

// A read-only NumPy view of `a` (no copy), valid while `a`'s frame lives:
// the handler must copy what it keeps.
template <typename T>
py::array View(const SArray<T>& a) {
  py::array_t<T> view({static_cast<py::ssize_t>(a.size())}, {sizeof(T)},
                      a.size() == 0 ? nullptr : a.data(),
                      py::capsule(new SArray<T>(a), [](void* p) {
                        delete static_cast<SArray<T>*>(p);
                      }));
  py::detail::array_proxy(view.ptr())->flags &=
      ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return std::move(view);
}

class PyServer {
 public:
  PyServer(py::object handler, int app_id, const std::string& compress)
      : node_(CheckedNode()),
        handler_(CheckHandler(std::move(handler))),
        claim_(std::make_unique<CustomerClaim>(true, app_id, -1)),
        server_(std::make_unique<KVServer<float>>(node_, app_id)) {
    if (auto c = CompressorOf(compress, "KVServer")) {
      Check(server_->AddFilter(c));
    }
    server_->set_request_handle(
        [this](const KVMeta& meta, const KVPairs<float>& req,
               KVServer<float>* server) { Handle(meta, req, server); });
  }

  ~PyServer() { Close(); }

  // Unregisters the handler (waiting for a running one, without the GIL).
  void Close() {
    if (!server_) return;
    {
      py::gil_scoped_release release;
      server_->clear_request_handle();
      server_.reset();
    }
    claim_.reset();
    handler_ = py::none();
  }

 private:
  // A Python handler has no replica handle: under PS_REPLICAS=1 the
  // server before this one would forward its pushes here in vain.
  static Node* CheckedNode() {
    Node* node = StartedNode("KVServer");
    if (node->config().replicas > 0) {
      throw py::value_error(
          "KVServer: PS_REPLICAS=" + std::to_string(node->config().replicas) +
          " is not supported by a Python handler server (it has no replica "
          "handle); ps.dense.serve_dense serves replicas");
    }
    return node;
  }

  static py::object CheckHandler(py::object handler) {
    if (!PyCallable_Check(handler.ptr())) {
      throw py::type_error("KVServer: handler must be callable, got " +
                           std::string(py::str(py::type::of(handler))));
    }
    return handler;
  }

  void Handle(const KVMeta& meta, const KVPairs<float>& req,
              KVServer<float>* server) {
    if (!Py_IsInitialized()) {
      server->ResponseError(meta, Status::Aborted("python exited"));
      return;
    }
    py::gil_scoped_acquire gil;
    try {
      py::dict m;
      m["push"] = meta.push;
      m["pull"] = meta.pull;
      m["cmd"] = meta.cmd;
      m["sender"] = meta.sender;
      m["timestamp"] = meta.timestamp;
      py::object lens = req.lens.empty() ? py::object(py::none())
                                         : py::object(View(req.lens));
      py::object result = handler_(m, View(req.keys), View(req.vals), lens);
      KVPairs<float> res;
      if (meta.pull) {
        py::object vals = result, out_lens = py::none();
        if (py::isinstance<py::tuple>(result)) {
          py::tuple t = result;
          if (t.size() != 2) throw py::value_error("handler: (vals, lens)");
          vals = t[0];
          out_lens = t[1];
        }
        if (vals.is_none()) throw py::value_error("handler: a pull needs vals");
        BufferView v = ViewBuffer(vals, Elem::kFloat32, false, "handler vals");
        res.keys = req.keys;
        res.vals.resize(v.size());
        if (v.size()) std::memcpy(res.vals.data(), v.data(), v.size() * 4);
        if (!out_lens.is_none()) {
          BufferView l =
              ViewBuffer(out_lens, Elem::kInt32, false, "handler lens");
          res.lens.resize(l.size());
          if (l.size()) std::memcpy(res.lens.data(), l.data(), l.size() * 4);
        }
      }
      server->Response(meta, res);
    } catch (py::error_already_set& e) {
      std::string what = e.what();
      server->ResponseError(meta, Status::InvalidArgument(what));
    } catch (const std::exception& e) {
      server->ResponseError(meta, Status::InvalidArgument(e.what()));
    }
  }

  Node* const node_;
  py::object handler_;
  std::unique_ptr<CustomerClaim> claim_;  // let go after the server
  std::unique_ptr<KVServer<float>> server_;
};

}  // namespace

void BindServer(py::module_& m) {
  py::class_<PyServer>(m, "KVServer")
      .def(py::init<py::object, int, std::string>(), py::arg("handler"),
           py::arg("app_id") = 0, py::arg("compress") = "")
      .def("close", &PyServer::Close);
}

}  // namespace python
}  // namespace ps
