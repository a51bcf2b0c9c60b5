// TensorView: a named, shaped window onto a flat float buffer. The model keeps
// every parameter (and every gradient) in one contiguous buffer so that a
// distributed trainer can push or pull any key range of it without a copy.
#ifndef PS_MODEL_TENSOR_VIEW_H_
#define PS_MODEL_TENSOR_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ps {
namespace model {

// One tensor inside a flat buffer: elements [offset, offset + count) in
// row-major order of `shape` (PyTorch's layout: conv weights are
// [out_channels, in_channels, kh, kw], linear weights [out, in]).
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats from the start of the buffer
  size_t count = 0;   // product of shape
};

// Lays tensors out back to back in the given order; returns their views.
// The total size is views.back().offset + views.back().count.
std::vector<TensorView> LayOut(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs);

// Sum of counts of `views` (the flat buffer's length in floats).
size_t TotalCount(const std::vector<TensorView>& views);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_TENSOR_VIEW_H_
