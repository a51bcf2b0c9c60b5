// The `ps._ps` extension: the process's node (made from the tracker's
// environment, as ps::Start does), a float KVWorker whose push, pull and
// pushpull take caller buffers without copying them, the placement and
// dense-layout helpers, a DenseShard server with a built-in optimizer, a
// KVServer whose request handler is a Python callable, and float32 arrays in
// shared memory (shared_array) that go to co-located nodes by reference.
// python/ps/__init__.py wraps it (torch tensors, docstrings);
// python/ps/_ps.pyi types it.
//
// Errors: a failed Status becomes ps.Error carrying its message; a wrong
// dtype TypeError, a wrong size or value ValueError, an index out of range
// IndexError; a call before ps.start() or after ps.finalize() ps.Error.
// Unlike ps::Start this node never ends the process: a dead peer shows up as
// the error of the next wait(), and no argument reaches a CHECK of the
// library (each is checked here first).
//
// GIL: every call that may block (start, finalize, barrier, wait,
// wait_all_done) releases it. A Python request handler runs on the node's
// receive thread and takes the GIL there, so the main thread must not hold
// it while blocking on the node (all blocking calls here release it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/config.h"
#include "ps/dense_server.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "ps/placement.h"
#include "ps/shared_array.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

struct Runtime {
  std::unique_ptr<Node> node;
  bool start_failed = false;  // a node starts once: no second try
  bool started = false;
  bool finalized = false;
  // (requests, app_id, customer_id) registered by live objects.
  std::set<std::tuple<bool, int, int>> claims;
};

Runtime& State() {
  static Runtime* runtime = new Runtime();  // outlives interpreter teardown
  return *runtime;
}

}  // namespace

Node* GetNode() {
  Runtime& rt = State();
  if (rt.node == nullptr) {
    StatusOr<Config> config = Config::FromEnv();
    if (!config.ok()) {
      throw PsError("bad configuration: " + config.status().message());
    }
    rt.node = std::make_unique<Node>(*config);
  }
  return rt.node.get();
}

Node* StartedNode(const char* what) {
  const Runtime& rt = State();
  if (rt.finalized) {
    throw PsError(std::string(what) + ": ps.finalize() has been called");
  }
  if (!rt.started) {
    throw PsError(std::string(what) + ": ps.start() has not been called" +
                  (rt.start_failed ? " successfully" : ""));
  }
  return GetNode();
}

bool Finalized() { return State().finalized; }

CustomerClaim::CustomerClaim(bool requests, int app_id, int customer_id)
    : requests_(requests),
      app_id_(app_id),
      customer_id_(requests ? -1 : customer_id) {
  if (!State().claims.emplace(requests_, app_id_, customer_id_).second) {
    throw py::value_error(
        requests ? "app_id " + std::to_string(app_id) +
                       " already has a server (KVServer or DenseServer) on "
                       "this node; close it first or use another app_id"
                 : "a KVWorker of app_id " + std::to_string(app_id) +
                       " and customer_id " + std::to_string(customer_id) +
                       " already exists on this node; use another "
                       "customer_id");
  }
}

CustomerClaim::~CustomerClaim() {
  State().claims.erase({requests_, app_id_, customer_id_});
}

void Check(const Status& st) {
  if (!st.ok()) throw PsError(st.ToString());
}

std::shared_ptr<Compressor> CompressorOf(const std::string& text,
                                         const char* who) {
  if (text.empty() || text == "none") return nullptr;
  StatusOr<CompressOptions> o = CompressOptions::Parse(text);
  if (!o.ok()) {
    throw pybind11::value_error(std::string(who) + ": compress='" + text +
                                "': " + o.status().message());
  }
  StatusOr<std::shared_ptr<Compressor>> c = Compressor::Make(*o);
  if (!c.ok()) {
    throw pybind11::value_error(std::string(who) + ": compress='" + text +
                                "': " + c.status().message());
  }
  return *c;
}

namespace {

void Start(bool barrier) {
  Node* node = GetNode();
  if (State().finalized) {
    throw PsError("ps.start(): ps.finalize() has been called");
  }
  if (State().started) throw PsError("ps.start() called twice");
  if (State().start_failed) {
    throw PsError(
        "ps.start(): an earlier ps.start() failed; a node starts "
        "once (run the process again)");
  }
  State().start_failed = true;  // until it succeeded
  Status st;
  {
    py::gil_scoped_release release;
    st = node->Start();
    // A restarted process that rejoined a running job skips the start
    // barrier, which the others passed long ago (as ps::Start does).
    if (st.ok() && barrier && !node->rejoined()) {
      st = node->Barrier(kAllGroups);
    }
  }
  if (!st.ok()) {
    throw PsError(std::string(RoleName(node->role())) +
                  " failed to start: " + st.ToString());
  }
  State().start_failed = false;
  State().started = true;
}

void Finalize(bool barrier) {
  Runtime& rt = State();
  if (!rt.started || rt.finalized) return;
  Status st;
  {
    py::gil_scoped_release release;
    st = rt.node->Finalize(barrier);
  }
  rt.finalized = true;
  Check(st);
}

// The group of this node's role (ps.SCHEDULER, SERVER_GROUP, WORKER_GROUP).
int OwnGroup(Role role) {
  switch (role) {
    case Role::kScheduler:
      return kScheduler;
    case Role::kServer:
      return kServerGroup;
    case Role::kWorker:
      return kWorkerGroup;
  }
  return 0;
}

void Barrier(int group) {
  if (group <= 0 || (group & ~kAllGroups) != 0) {
    throw py::value_error(
        "barrier: group " + std::to_string(group) +
        " is not a bit-or of ps.SCHEDULER (1), ps.SERVER_GROUP (2) and "
        "ps.WORKER_GROUP (4)");
  }
  Node* node = StartedNode("barrier");
  if ((group & OwnGroup(node->role())) == 0) {
    throw py::value_error("barrier: this " +
                          std::string(RoleName(node->role())) +
                          " is not in group " + std::to_string(group) + " (" +
                          GroupName(group) + ")");
  }
  Status st;
  {
    py::gil_scoped_release release;
    st = node->Barrier(group);
  }
  Check(st);
}

std::string Role() { return RoleName(GetNode()->role()); }

int Rank() {
  Node* node = GetNode();
  // Before start, the rank the tracker asked for (PS_RANK), if any.
  return State().started ? node->rank() : node->config().rank;
}

// A float32 NumPy array of n zeros in ps::SharedArray memory (memfd-backed,
// mappable by co-located nodes); the array owns the allocation through its
// base capsule, so any view of it (a torch.from_numpy tensor, a slice) keeps
// the memory alive. The worker finds a buffer's shared region by address:
// pushing it, or pulling into it, sends a reference to a co-located server
// instead of the bytes.
py::array_t<float> SharedFloatArray(size_t n) {
  constexpr size_t kMaxFloats =
      static_cast<size_t>(std::numeric_limits<py::ssize_t>::max()) /
      sizeof(float);
  if (n > kMaxFloats) {
    throw py::value_error("shared_array: n=" + std::to_string(n) +
                          " floats is more than an array can address (" +
                          std::to_string(kMaxFloats) + ")");
  }
  auto* kept = new SArray<float>(SharedArray<float>(n));
  py::capsule owner(kept,
                    [](void* p) { delete static_cast<SArray<float>*>(p); });
  return py::array_t<float>({static_cast<py::ssize_t>(n)},
                            {static_cast<py::ssize_t>(sizeof(float))},
                            kept->data(), owner);
}

}  // namespace

void BindNode(py::module_& m) {
  m.def("start", &Start, py::arg("barrier") = true);
  m.def("finalize", &Finalize, py::arg("barrier") = true);
  m.def("barrier", &Barrier, py::arg("group") = kAllGroups);
  m.def("role", &Role);
  m.def("rank", &Rank);
  m.def("num_workers", [] { return GetNode()->num_workers(); });
  m.def("num_servers", [] { return GetNode()->num_servers(); });
  m.def("is_started", [] { return State().started && !State().finalized; });
  // The job's failure settings, as every node has them (PS_REPLICAS,
  // PS_MAX_RESTARTS), and whether this worker is a restarted one that
  // rejoined a running job (it skipped the start barrier: it must ask the
  // servers where to resume, e.g. DenseWorker.rejoin).
  m.def("replicas", [] { return GetNode()->config().replicas; });
  m.def("max_restarts", [] { return GetNode()->config().max_restarts; });
  m.def("rejoined", [] { return State().started && GetNode()->rejoined(); });
  m.def("peer_failure", []() -> py::object {
    // Also after finalize: why the job ended, if a peer failed.
    if (!State().started) {
      throw PsError("peer_failure: ps.start() has not been called");
    }
    Status st = GetNode()->peer_failure();
    if (st.ok()) return py::none();
    return py::str(st.ToString());
  });
  m.def("num_shared_frames_sent",
        [] { return GetNode()->num_shared_frames_sent(); });
  m.def("num_shared_frames_received",
        [] { return GetNode()->num_shared_frames_received(); });
  m.def("shared_array", &SharedFloatArray, py::arg("n"));
  m.attr("SCHEDULER") = kScheduler;
  m.attr("SERVER_GROUP") = kServerGroup;
  m.attr("WORKER_GROUP") = kWorkerGroup;
  m.attr("ALL_GROUPS") = kAllGroups;
}

}  // namespace python
}  // namespace ps

PYBIND11_MODULE(_ps, m) {
  m.doc() =
      "ps: the parameter server's worker and server API (see ps/__init__.py)";
  static py::exception<ps::python::PsError> error(m, "Error",
                                                  PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ps::python::PsError& e) {
      error(e.what());
    }
  });
  ps::python::BindNode(m);
  ps::python::BindWorker(m);
  ps::python::BindPlacement(m);
  ps::python::BindDense(m);
  ps::python::BindServer(m);
  ps::python::BindCheckpoint(m);
  ps::python::BindSparse(m);
}
