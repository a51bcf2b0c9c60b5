// ps._ps.Checkpointer: the library's checkpoint sets (src/kv/checkpointer.h,
// the files mnist_dist writes) from Python: a DenseServer writes its
// slice's files itself (dense.cc); a Python worker writes and reads its own
// file's payload (its place in the data, its random state) through this.
// Roles are "server" and "worker"; a failed call raises ps.Error naming the
// file or the folder. The file I/O runs without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "kv/checkpointer.h"
#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

CheckpointRole RoleOf(const std::string& role) {
  if (role == "server") return CheckpointRole::kServer;
  if (role == "worker") return CheckpointRole::kWorker;
  throw py::value_error("Checkpointer: role='" + role +
                        "' is not 'server' or 'worker'");
}

void CheckStep(int step) {
  if (step < 0) {
    throw py::value_error("Checkpointer: step=" + std::to_string(step) +
                          " is negative");
  }
}

Checkpointer Make(const std::string& dir, int num_servers, int num_workers,
                  uint64_t model_floats, uint64_t chunk) {
  if (dir.empty()) throw py::value_error("Checkpointer: dir is empty");
  if (num_servers < 1 || num_workers < 1 || model_floats == 0 || chunk == 0) {
    throw py::value_error(
        "Checkpointer: num_servers=" + std::to_string(num_servers) +
        " num_workers=" + std::to_string(num_workers) +
        " model_floats=" + std::to_string(model_floats) +
        " chunk=" + std::to_string(chunk) + ": each must be >= 1");
  }
  CheckpointJob job;
  job.dir = dir;
  job.num_servers = num_servers;
  job.num_workers = num_workers;
  job.model_floats = model_floats;
  job.chunk = chunk;
  return Checkpointer(std::move(job));
}

}  // namespace

void BindCheckpoint(py::module_& m) {
  py::class_<Checkpointer>(m, "Checkpointer")
      .def(py::init(&Make), py::arg("dir"), py::arg("num_servers"),
           py::arg("num_workers"), py::arg("model_floats"), py::arg("chunk"))
      .def_property_readonly("dir",
                             [](const Checkpointer& c) { return c.job().dir; })
      .def(
          "path",
          [](const Checkpointer& c, int step, const std::string& role,
             int rank) { return c.Path(step, RoleOf(role), rank); },
          py::arg("step"), py::arg("role"), py::arg("rank"))
      .def("prepare_dir",
           [](const Checkpointer& c) {
             Status st;
             {
               py::gil_scoped_release release;
               st = c.PrepareDir();
             }
             Check(st);
           })
      .def("check_empty",
           [](const Checkpointer& c) {
             Status st;
             {
               py::gil_scoped_release release;
               st = c.CheckEmpty();
             }
             Check(st);
           })
      .def("find_newest",
           [](const Checkpointer& c) {
             std::string skipped;
             StatusOr<int> step = [&] {
               py::gil_scoped_release release;
               return c.FindNewest(&skipped);
             }();
             Check(step.status());
             return std::make_pair(*step, skipped);
           })
      .def(
          "write",
          [](const Checkpointer& c, const std::string& role, int rank, int step,
             const py::bytes& payload) {
            CheckStep(step);
            const CheckpointRole r = RoleOf(role);
            std::string data = payload;
            Status st;
            {
              py::gil_scoped_release release;
              st = c.Write(r, rank, step, data);
            }
            Check(st);
          },
          py::arg("role"), py::arg("rank"), py::arg("step"), py::arg("payload"))
      .def(
          "read",
          [](const Checkpointer& c, int step, const std::string& role,
             int rank) {
            CheckStep(step);
            const CheckpointRole r = RoleOf(role);
            StatusOr<std::string> data = [&] {
              py::gil_scoped_release release;
              return c.Read(step, r, rank);
            }();
            Check(data.status());
            return py::bytes(*data);
          },
          py::arg("step"), py::arg("role"), py::arg("rank"))
      .def(
          "remove_after",
          [](const Checkpointer& c, int step, const std::string& role,
             int rank) {
            CheckStep(step);
            const CheckpointRole r = RoleOf(role);
            py::gil_scoped_release release;
            c.RemoveAfter(step, r, rank);
          },
          py::arg("step"), py::arg("role"), py::arg("rank"));
}

}  // namespace python
}  // namespace ps
