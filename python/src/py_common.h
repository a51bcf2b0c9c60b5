// Shared pieces of the ps._ps extension: the error type, the process's node,
// and checks that turn a Python buffer into a zero-copy view (or a clear
// TypeError / ValueError naming the argument).
#ifndef PS_PYTHON_PY_COMMON_H_
#define PS_PYTHON_PY_COMMON_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "ps/node.h"
#include "ps/status.h"

namespace ps {
namespace python {

// Raised in Python as ps.Error (a RuntimeError) with the Status's message.
class PsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The process's node, made from the environment on first use (PsError on a
// bad environment); StartedNode() also requires ps.start().
Node* GetNode();
Node* StartedNode();
void Check(const Status& st);

// A C-contiguous buffer of one element type, flattened. `obj` keeps the
// exporter alive as long as the view is used.
struct FlatBuffer {
  void* data = nullptr;
  size_t size = 0;  // elements
  bool readonly = false;
};

enum class Elem { kFloat32, kInt64, kInt32 };

// TypeError naming `what` for another element type, a non-contiguous or a
// read-only (when `writable`) buffer.
FlatBuffer ViewBuffer(const pybind11::handle& obj, Elem elem, bool writable,
                      const char* what);

void BindNode(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
void BindDense(pybind11::module_& m);
void BindServer(pybind11::module_& m);

}  // namespace python
}  // namespace ps

#endif  // PS_PYTHON_PY_COMMON_H_
