// BufferView: a caller's buffer (a NumPy array, a CPU tensor's NumPy view,
// an array.array, ...) exported for as long as a request may read or write
// it, so that the exporter cannot move or free the memory under it.
#include <string>

#include "py_common.h"

namespace py = pybind11;

namespace ps {
namespace python {

void BufferView::Release::operator()(Py_buffer* view) const {
  PyBuffer_Release(view);
  delete view;
}

BufferView ViewBuffer(const py::handle& obj, Elem elem, bool writable,
                      const char* what) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
  if (writable) flags |= PyBUF_WRITABLE;
  const char* want = elem == Elem::kFloat32 ? "float32"
                     : elem == Elem::kInt64 ? "int64"
                     : elem == Elem::kId64  ? "int64 or uint64"
                                            : "int32";
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": expected a C-contiguous" +
                         (writable ? ", writable " : " ") + want +
                         " array or CPU tensor, got " +
                         std::string(py::str(py::type::of(obj))));
  }
  BufferView out;
  out.view_.reset(view.release());  // released from here on
  const Py_buffer& v = *out.view_;
  std::string format = v.format ? v.format : "B";
  char code = format.empty() ? 'B' : format.back();
  bool ok = false;
  switch (elem) {
    case Elem::kFloat32:
      ok = code == 'f' && v.itemsize == 4;
      break;
    case Elem::kInt64:
      ok = (code == 'l' || code == 'q') && v.itemsize == 8;
      break;
    case Elem::kInt32:
      ok = (code == 'i' || code == 'l') && v.itemsize == 4;
      break;
    case Elem::kId64:
      ok = (code == 'l' || code == 'q' || code == 'L' || code == 'Q') &&
           v.itemsize == 8;
      break;
  }
  if (!ok) {
    throw py::type_error(std::string(what) + ": expected " + want +
                         ", got format '" + format + "' (" +
                         std::to_string(v.itemsize) + " bytes per item)");
  }
  out.size_ = static_cast<size_t>(v.len / v.itemsize);
  return out;
}

}  // namespace python
}  // namespace ps
