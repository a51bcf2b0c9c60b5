// ps._ps.Placement: which server holds which key (ps/placement.h), with
// every argument checked here: a bad one raises ValueError or IndexError
// naming it and its value instead of reaching the library's CHECKs or
// reading past the server list.
#include "ps/placement.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

namespace {

// Far beyond any job; it bounds the memory a placement takes (a few words
// a server) and keeps server ids (8 + 2 * rank) within an int.
constexpr int kMaxServers = 1 << 20;

void CheckNumServers(const char* what, int64_t num_servers) {
  if (num_servers < 1 || num_servers > kMaxServers) {
    throw py::value_error(
        std::string(what) + ": num_servers=" + std::to_string(num_servers) +
        " is not in [1, " + std::to_string(kMaxServers) + "]");
  }
}

void CheckServer(const char* what, const Placement& p, int64_t server) {
  if (server < 0 || server >= p.num_servers()) {
    throw py::index_error(std::string(what) + ": server " +
                          std::to_string(server) + " is out of range for " +
                          std::to_string(p.num_servers()) + " servers");
  }
}

Placement EvenKeys(int64_t num_servers, Key max_key) {
  CheckNumServers("Placement.even_keys", num_servers);
  if (max_key < static_cast<Key>(num_servers)) {
    throw py::value_error(
        "Placement.even_keys: max_key=" + std::to_string(max_key) +
        " is less than num_servers=" + std::to_string(num_servers) +
        " (every server needs at least one key)");
  }
  return Placement::EvenKeys(static_cast<int>(num_servers), max_key);
}

Placement ByBytes(const std::vector<Key>& keys,
                  const std::vector<uint64_t>& sizes, int64_t num_servers) {
  CheckNumServers("Placement.by_bytes", num_servers);
  StatusOr<Placement> p =
      Placement::ByBytes(keys, sizes, static_cast<int>(num_servers));
  if (!p.ok()) {
    throw py::value_error("Placement.by_bytes: " + p.status().message());
  }
  return *p;
}

}  // namespace

void BindPlacement(py::module_& m) {
  py::class_<Placement>(m, "Placement")
      .def_static("even_keys", &EvenKeys, py::arg("num_servers"),
                  py::arg("max_key"))
      .def_static("by_bytes", &ByBytes, py::arg("keys"), py::arg("sizes"),
                  py::arg("num_servers"))
      .def_property_readonly("num_servers", &Placement::num_servers)
      .def(
          "begin",
          [](const Placement& p, int64_t server) {
            CheckServer("Placement.begin", p, server);
            return p.begin(static_cast<int>(server));
          },
          py::arg("server"))
      .def(
          "end",
          [](const Placement& p, int64_t server) {
            CheckServer("Placement.end", p, server);
            return p.end(static_cast<int>(server));
          },
          py::arg("server"))
      .def("server_of", &Placement::ServerOf, py::arg("key"))
      .def("describe", &Placement::Describe)
      .def("__repr__", &Placement::Describe);
}

}  // namespace python
}  // namespace ps
