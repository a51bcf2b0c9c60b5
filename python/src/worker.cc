// ps._ps.KVWorker: push, pull and pushpull of caller buffers (float32
// values, int64 keys, int32 lens) without copying them. Each call returns a
// timestamp; the buffers are kept referenced until wait(ts) returns, and
// pulled values land in the caller's buffer. A failed wait keeps them
// referenced for good: a late answer may still write into the destination.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/kv_app.h"
#include "ps/placement.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

FlatBuffer ViewBuffer(const py::handle& obj, Elem elem, bool writable,
                      const char* what) {
  Py_buffer view;
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
  if (writable) flags |= PyBUF_WRITABLE;
  const char* want = elem == Elem::kFloat32 ? "float32"
                     : elem == Elem::kInt64 ? "int64"
                                            : "int32";
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": expected a C-contiguous" +
                         (writable ? ", writable " : " ") + want +
                         " array or CPU tensor, got " +
                         std::string(py::str(py::type::of(obj))));
  }
  std::string format = view.format ? view.format : "B";
  char code = format.empty() ? 'B' : format.back();
  bool ok = false;
  switch (elem) {
    case Elem::kFloat32:
      ok = code == 'f' && view.itemsize == 4;
      break;
    case Elem::kInt64:
      ok = (code == 'l' || code == 'q') && view.itemsize == 8;
      break;
    case Elem::kInt32:
      ok = (code == 'i' || code == 'l') && view.itemsize == 4;
      break;
  }
  FlatBuffer out;
  out.data = view.buf;
  out.size = view.itemsize > 0 ? view.len / view.itemsize : 0;
  out.readonly = view.readonly != 0;
  PyBuffer_Release(&view);
  if (!ok) {
    throw py::type_error(std::string(what) + ": expected " + want +
                         ", got format '" + format + "' (" +
                         std::to_string(view.itemsize) + " bytes per item)");
  }
  return out;
}

namespace {

class PyWorker {
 public:
  PyWorker(int app_id, int customer_id)
      : kv_(StartedNode(), app_id, customer_id) {}

  int Push(const py::object& keys, const py::object& vals,
           const py::object& lens, int cmd) {
    Request r = Prepare(keys, &vals, lens, nullptr);
    int ts = kv_.ZPush(r.keys, r.vals, r.lens, cmd);
    return Keep(ts, std::move(r));
  }

  int Pull(const py::object& keys, const py::object& out,
           const py::object& lens, int cmd) {
    Request r = Prepare(keys, nullptr, lens, &out);
    int ts = kv_.ZPull(r.keys, r.out.get(), nullptr, cmd);
    return Keep(ts, std::move(r));
  }

  int PushPull(const py::object& keys, const py::object& vals,
               const py::object& out, int cmd) {
    Request r = Prepare(keys, &vals, py::none(), &out);
    if (r.vals.size() != r.out->size()) {
      throw py::value_error(
          "pushpull: vals has " + std::to_string(r.vals.size()) +
          " floats but out has " + std::to_string(r.out->size()));
    }
    int ts = kv_.ZPushPull(r.keys, r.vals, r.out.get(), nullptr, cmd);
    return Keep(ts, std::move(r));
  }

  void Wait(int ts) {
    auto it = pending_.find(ts);
    if (it == pending_.end()) {
      throw py::value_error("wait: unknown or already waited timestamp " +
                            std::to_string(ts));
    }
    Request r = std::move(it->second);
    pending_.erase(it);
    Status st;
    {
      py::gil_scoped_release release;
      st = kv_.Wait(ts);
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

  void SetPlacement(const Placement& p) { kv_.SetPlacement(p); }
  size_t num_pending() const { return pending_.size(); }

 private:
  struct Request {
    std::vector<py::object> keep;  // the caller's buffers
    SArray<Key> keys;
    SArray<float> vals;
    SArray<int> lens;
    std::unique_ptr<SArray<float>> out;  // the pull's destination
    float* out_data = nullptr;
    size_t out_size = 0;
  };

  // Views the buffers (no copy) and checks what can be checked here: types,
  // key order, and sizes against the keys (and lens).
  static Request Prepare(const py::object& keys, const py::object* vals,
                         const py::object& lens, const py::object* out) {
    Request r;
    FlatBuffer k = ViewBuffer(keys, Elem::kInt64, false, "keys");
    r.keys = SArray<Key>(static_cast<Key*>(k.data), k.size, false);
    r.keep.push_back(keys);
    const int64_t* kp = static_cast<const int64_t*>(k.data);
    for (size_t i = 0; i < k.size; ++i) {
      if (kp[i] < 0 || (i > 0 && kp[i] <= kp[i - 1])) {
        throw py::value_error(
            "keys must be non-negative, sorted ascending and unique (keys[" +
            std::to_string(i) + "] = " + std::to_string(kp[i]) + ")");
      }
    }
    size_t want = 0;  // floats implied by lens, 0 if no lens
    if (!lens.is_none()) {
      FlatBuffer l = ViewBuffer(lens, Elem::kInt32, false, "lens");
      if (l.size != k.size) {
        throw py::value_error("lens has " + std::to_string(l.size) +
                              " entries for " + std::to_string(k.size) +
                              " keys");
      }
      r.lens = SArray<int>(static_cast<int*>(l.data), l.size, false);
      for (size_t i = 0; i < l.size; ++i) want += r.lens[i];
      r.keep.push_back(lens);
    }
    auto check_size = [&](size_t n, const char* what) {
      if (k.size == 0) throw py::value_error("keys is empty");
      if (want != 0 ? n != want : n % k.size != 0) {
        throw py::value_error(
            std::string(what) + " has " + std::to_string(n) + " floats: " +
            (want != 0 ? "lens sum to " + std::to_string(want)
                       : "not a multiple of its " + std::to_string(k.size) +
                             " keys"));
      }
    };
    if (vals != nullptr) {
      FlatBuffer v = ViewBuffer(*vals, Elem::kFloat32, false, "vals");
      check_size(v.size, "vals");
      r.vals = SArray<float>(static_cast<float*>(v.data), v.size, false);
      r.keep.push_back(*vals);
    }
    if (out != nullptr) {
      FlatBuffer o = ViewBuffer(*out, Elem::kFloat32, true, "out");
      check_size(o.size, "out");
      r.out_data = static_cast<float*>(o.data);
      r.out_size = o.size;
      r.out = std::make_unique<SArray<float>>(r.out_data, o.size, false);
      r.keep.push_back(*out);
    }
    return r;
  }

  int Keep(int ts, Request r) {
    pending_[ts] = std::move(r);
    return ts;
  }

  KVWorker<float> kv_;
  // Guarded by the GIL: every method runs with it held.
  std::unordered_map<int, Request> pending_;
  std::vector<Request> failed_;
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
      .def_property_readonly("num_pending", &PyWorker::num_pending);

  py::class_<Placement>(m, "Placement")
      .def_static("even_keys", &Placement::EvenKeys, py::arg("num_servers"),
                  py::arg("max_key"))
      .def_static(
          "by_bytes",
          [](const std::vector<Key>& keys, const std::vector<uint64_t>& bytes,
             int num_servers) {
            StatusOr<Placement> p =
                Placement::ByBytes(keys, bytes, num_servers);
            Check(p.status());
            return *p;
          },
          py::arg("keys"), py::arg("sizes"), py::arg("num_servers"))
      .def_property_readonly("num_servers", &Placement::num_servers)
      .def("begin", &Placement::begin, py::arg("server"))
      .def("end", &Placement::end, py::arg("server"))
      .def("server_of", &Placement::ServerOf, py::arg("key"))
      .def("describe", &Placement::Describe)
      .def("__repr__", &Placement::Describe);
}

}  // namespace python
}  // namespace ps
