// Shared pieces of the ps._ps extension: the error type, the process's node
// and the ids its apps claim, and the view of a Python buffer (zero-copy,
// held exported while in use, or a clear TypeError naming the argument).
//
// Bad input never reaches a CHECK of the library: the bindings check
// arguments first and raise ValueError / IndexError / TypeError naming the
// argument and its value, ps.Error for a state the call cannot run in
// (before start, after finalize).
#ifndef PS_PYTHON_PY_COMMON_H_
#define PS_PYTHON_PY_COMMON_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "ps/compress.h"
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
// bad environment). StartedNode() also requires ps.start() to have
// succeeded and ps.finalize() not to have been called (PsError naming
// `what`, the caller).
Node* GetNode();
Node* StartedNode(const char* what);
bool Finalized();
void Check(const Status& st);
// The compression filter `text` names (ps/compress.h: "topk:0.01",
// "bf16,pull=bf16"); null for "" or "none". ValueError naming `who`.
std::shared_ptr<Compressor> CompressorOf(const std::string& text,
                                         const char* who);

// One (app_id, customer_id) registration with the node, claimed for as long
// as this lives: a second KVWorker of the same ids (or a second server of
// one app_id) would abort in the library, so it raises ValueError here.
// Destroy it after the C++ object that registered. Guarded by the GIL.
class CustomerClaim {
 public:
  // requests: a server's (customer_id unused), else a worker's.
  CustomerClaim(bool requests, int app_id, int customer_id);
  ~CustomerClaim();
  CustomerClaim(const CustomerClaim&) = delete;
  CustomerClaim& operator=(const CustomerClaim&) = delete;

 private:
  const bool requests_;
  const int app_id_;
  const int customer_id_;
};

// kId64: 64-bit ids, signed or unsigned (the same bits).
enum class Elem { kFloat32, kInt64, kInt32, kId64 };

// A C-contiguous buffer of one element type, flattened: a PEP 3118 export
// of a Python object, kept exported for as long as this lives, so that the
// exporter can neither resize nor free the memory meanwhile (array.array's
// append, bytearray's resize raise BufferError). Move-only; it must be
// destroyed with the GIL held.
class BufferView {
 public:
  BufferView() = default;
  BufferView(BufferView&&) noexcept = default;
  BufferView& operator=(BufferView&&) noexcept = default;
  ~BufferView() = default;

  void* data() const { return view_ ? view_->buf : nullptr; }
  size_t size() const { return size_; }  // elements

 private:
  friend BufferView ViewBuffer(const pybind11::handle& obj, Elem elem,
                               bool writable, const char* what);
  struct Release {
    void operator()(Py_buffer* view) const;
  };
  std::unique_ptr<Py_buffer, Release> view_;  // the address stays put
  size_t size_ = 0;
};

// TypeError naming `what` for another element type, a non-contiguous or a
// read-only (when `writable`) buffer.
BufferView ViewBuffer(const pybind11::handle& obj, Elem elem, bool writable,
                      const char* what);

void BindNode(pybind11::module_& m);
void BindWorker(pybind11::module_& m);
void BindPlacement(pybind11::module_& m);
void BindDense(pybind11::module_& m);
void BindServer(pybind11::module_& m);
void BindCheckpoint(pybind11::module_& m);
void BindSparse(pybind11::module_& m);

}  // namespace python
}  // namespace ps

#endif  // PS_PYTHON_PY_COMMON_H_
