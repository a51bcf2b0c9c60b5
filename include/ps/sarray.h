// SArray<V>: a shared, zero-copy array. Copies of an SArray share one buffer
// (a std::shared_ptr with a custom deleter); segment() and reinterpretation
// as another element type never copy. This is the one buffer type that
// travels from a user's vector to a ZeroMQ frame and back.
//
// Thread-safety: like std::shared_ptr. Distinct SArray objects sharing a
// buffer may be used from distinct threads; writes to the shared elements
// must be synchronised by the user.
#ifndef PS_SARRAY_H_
#define PS_SARRAY_H_

#include <glog/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ps/range.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ps {

namespace detail {

// Buffers of at least this many bytes that are written in full at once
// (resize, CopyFrom) are mapped straight from the kernel (Linux),
// zero-filled and populated in one call: first touching a 10M-key array
// page by page would cost 20000 page faults, about as long as copying it
// twice. (Transparent huge pages would be cheaper still, but where free
// ones are short the kernel compacts memory first, which can take longer
// than the faults it saves.) Smaller ones stay with malloc, which reuses
// freed blocks up to 32 MiB (glibc's largest mmap threshold) without new
// faults: a buffer of a dense model's size, allocated every step, costs
// less there.
constexpr size_t kLargeBufferBytes = size_t{32} << 20;

// Frees the buffers SArray allocates itself (AllocateBuffer): `mapped`
// bytes mapped from the kernel, or (0) one operator new[] block.
struct BufferDeleter {
  size_t mapped = 0;
  void operator()(void* p) const {
#if defined(__linux__)
    if (mapped > 0) {
      munmap(p, mapped);
      return;
    }
#endif
    ::operator delete[](p);
  }
};

// A fresh buffer of `bytes` bytes, aligned for any element type; `filled`:
// the caller writes every byte at once. *zeroed says whether its bytes are
// known to be zero.
inline std::shared_ptr<void> AllocateBuffer(size_t bytes, bool filled,
                                            bool* zeroed) {
#if defined(__linux__)
  if (filled && bytes >= kLargeBufferBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p != MAP_FAILED) {
      *zeroed = true;
      return std::shared_ptr<void>(p, BufferDeleter{bytes});
    }
  }
#endif
  *zeroed = false;
  return std::shared_ptr<void>(::operator new[](bytes), BufferDeleter{});
}

}  // namespace detail

// Where an array's memory lives (ps-lite's device tags). The transport
// moves CPU memory only; the tags travel with an SArray for programs that
// set them, and nothing here reads them.
enum DeviceType { UNK, CPU, GPU };

template <typename V>
class SArray {
  static_assert(std::is_trivially_copyable<V>::value,
                "SArray holds trivially copyable elements only");

 public:
  SArray() = default;

  // A new buffer of `size` elements, each set to `value`.
  explicit SArray(size_t size, V value = V()) { resize(size, value); }

  // Adopts `data`: `deleter(data)` runs when the last copy goes away.
  template <typename Deleter,
            typename = std::enable_if_t<!std::is_arithmetic_v<Deleter>>>
  SArray(V* data, size_t size, Deleter deleter) {
    reset(data, size, std::move(deleter));
  }
  // ps-lite's form: shares `data` (no copy); `deletable` means delete[] it
  // when the last copy goes away, else the caller keeps it alive.
  SArray(V* data, size_t size, bool deletable = false) {
    if (deletable) {
      reset(data, size, std::default_delete<V[]>());
    } else {
      reset(data, size, [](V*) {});
    }
  }
  SArray(V* data, size_t size, DeviceType src_device_type, int src_device_id,
         DeviceType dst_device_type, int dst_device_id, bool deletable = false)
      : SArray(data, size, deletable) {
    src_device_type_ = src_device_type;
    src_device_id_ = src_device_id;
    dst_device_type_ = dst_device_type;
    dst_device_id_ = dst_device_id;
  }

  // Shares the vector's buffer (no copy); the vector lives as long as any
  // copy of this array.
  explicit SArray(const std::shared_ptr<std::vector<V>>& vec)
      : ptr_(vec, vec->data()), size_(vec->size()), capacity_(vec->size()) {}

  // Copies the list's elements (converted to V).
  template <typename W>
  SArray(const std::initializer_list<W>& list) {
    CopyFrom(list.begin(), list.end());
  }
  template <typename W>
  void operator=(const std::initializer_list<W>& list) {
    CopyFrom(list.begin(), list.end());
  }

  // Shares the buffer of `other` seen as elements of V (as the constructor).
  template <typename W, typename = std::enable_if_t<!std::is_same_v<W, V>>>
  void operator=(const SArray<W>& other) {
    *this = other.template Reinterpret<V>();
  }

  // Adopts `data` (as the deleter constructor), replacing this array's
  // buffer; the device tags are set too.
  template <typename Deleter>
  void reset(V* data, size_t size, Deleter deleter,
             DeviceType src_device_type = CPU, int src_device_id = 0,
             DeviceType dst_device_type = CPU, int dst_device_id = 0) {
    ptr_.reset(data, std::move(deleter));
    size_ = capacity_ = size;
    src_device_type_ = src_device_type;
    src_device_id_ = src_device_id;
    dst_device_type_ = dst_device_type;
    dst_device_id_ = dst_device_id;
  }

  // Copies `vec` into a new buffer.
  explicit SArray(const std::vector<V>& vec) {
    CopyFrom(vec.data(), vec.size());
  }

  // Shares the buffer of `other`, seen as elements of V (no copy). The byte
  // size of `other` must be a multiple of sizeof(V).
  template <typename W>
  explicit SArray(const SArray<W>& other) {
    *this = other.template Reinterpret<V>();
  }

  // A view of memory this array does not own; the caller keeps it alive (and
  // unmoved) for as long as any copy of the view exists.
  static SArray<V> Borrow(V* data, size_t size) {
    SArray<V> a;
    a.ptr_ = std::shared_ptr<V>(std::shared_ptr<V>(), data);
    a.size_ = a.capacity_ = size;
    return a;
  }

  void CopyFrom(const V* data, size_t size) {
    Grow(size, true);
    size_ = size;
    if (size > 0) std::memcpy(this->data(), data, size * sizeof(V));
  }
  void CopyFrom(const SArray<V>& other) {
    if (this != &other) CopyFrom(other.data(), other.size());
  }
  // Copies [first, last) into a new buffer.
  template <typename ForwardIt>
  void CopyFrom(const ForwardIt& first, const ForwardIt& last) {
    size_t n = static_cast<size_t>(std::distance(first, last));
    SArray<V> fresh;
    fresh.Grow(n, true);
    std::copy(first, last, fresh.data());
    fresh.size_ = n;
    *this = fresh;
  }

  // Elements [begin, end) of this array, sharing its buffer.
  SArray<V> segment(size_t begin, size_t end) const {
    CHECK_LE(begin, end);
    CHECK_LE(end, size_);
    SArray<V> a;
    a.ptr_ = std::shared_ptr<V>(ptr_, data() + begin);
    a.size_ = a.capacity_ = end - begin;
    a.CopyDeviceTags(*this);
    return a;
  }

  // The same bytes seen as elements of W; the byte size must divide evenly.
  template <typename W>
  SArray<W> Reinterpret() const {
    SArray<W> a;
    size_t bytes = size_ * sizeof(V);
    CHECK_EQ(bytes % sizeof(W), 0u)
        << bytes << " bytes are not a whole number of " << sizeof(W)
        << "-byte elements";
    a.ptr_ = std::shared_ptr<W>(ptr_, reinterpret_cast<W*>(data()));
    a.size_ = bytes / sizeof(W);
    a.capacity_ = capacity_ * sizeof(V) / sizeof(W);
    a.CopyDeviceTags(*this);
    return a;
  }

  // Grows into a fresh buffer when capacity is short; keeps the elements.
  void reserve(size_t n) { Grow(n, false); }
  // Elements past the old size are set to `value` (zero by default).
  void resize(size_t n, V value = V()) {
    size_t old = size_;
    const bool zeroed = Grow(n, true);
    size_ = n;
    // A fresh buffer the kernel zeroed needs no second pass for zeros.
    static const V kZero{};
    if (zeroed && std::memcmp(&value, &kZero, sizeof(V)) == 0) return;
    for (size_t i = old; i < n; ++i) data()[i] = value;
  }
  void push_back(const V& v) {
    if (size_ == capacity_) reserve(capacity_ == 0 ? 8 : capacity_ * 2);
    data()[size_++] = v;
  }
  void pop_back() {
    if (size_ > 0) --size_;
  }
  // Copies `other`'s elements to the end of this array.
  void append(const SArray<V>& other) {
    if (other.empty()) return;
    size_t old = size_;
    reserve(std::max(size_ + other.size(), capacity_ * 2));
    size_ = old + other.size();
    std::memcpy(data() + old, other.data(), other.size() * sizeof(V));
  }
  void clear() { *this = SArray<V>(); }

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  V* data() const { return ptr_.get(); }
  V* begin() const { return data(); }
  V* end() const { return data() + size_; }
  V& operator[](size_t i) const { return data()[i]; }
  V& front() const {
    CHECK(!empty());
    return data()[0];
  }
  V& back() const {
    CHECK(!empty());
    return data()[size_ - 1];
  }
  const std::shared_ptr<V>& ptr() const { return ptr_; }
  std::shared_ptr<V>& ptr() { return ptr_; }

  std::string DebugString() const {
    static const char* const kNames[] = {"UNK", "CPU", "GPU"};
    std::ostringstream os;
    os << "[data_size=" << size_ << " " << kNames[src_device_type_] << "["
       << src_device_id_ << "]->" << kNames[dst_device_type_] << "["
       << dst_device_id_ << "]]";
    return os.str();
  }

  // ps-lite's device tags (see DeviceType).
  DeviceType src_device_type_ = CPU;
  int src_device_id_ = 0;
  DeviceType dst_device_type_ = CPU;
  int dst_device_id_ = 0;

 private:
  template <typename W>
  friend class SArray;

  template <typename W>
  void CopyDeviceTags(const SArray<W>& other) {
    src_device_type_ = other.src_device_type_;
    src_device_id_ = other.src_device_id_;
    dst_device_type_ = other.dst_device_type_;
    dst_device_id_ = other.dst_device_id_;
  }

  // reserve(n), for `n` elements all written at once when `filled`; true
  // when it moved the elements to a fresh buffer whose bytes past them are
  // zero.
  bool Grow(size_t n, bool filled) {
    if (n <= capacity_) return false;
    bool zeroed = false;
    std::shared_ptr<void> fresh =
        detail::AllocateBuffer(n * sizeof(V), filled, &zeroed);
    if (size_ > 0) std::memcpy(fresh.get(), data(), size_ * sizeof(V));
    ptr_ = std::shared_ptr<V>(fresh, static_cast<V*>(fresh.get()));
    capacity_ = n;
    return zeroed;
  }

  std::shared_ptr<V> ptr_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// The index range of the elements of sorted `arr` within [lower, upper).
template <typename V>
Range FindRange(const SArray<V>& arr, V lower, V upper) {
  if (upper <= lower) return Range(0, 0);
  auto lb = std::lower_bound(arr.begin(), arr.end(), lower);
  auto ub = std::lower_bound(arr.begin(), arr.end(), upper);
  return Range(lb - arr.begin(), ub - arr.begin());
}

// "[n]: a b c ... x y z": the first and last m of n elements.
template <typename V>
std::string DebugStr(const V* data, int n, int m = 5) {
  std::ostringstream os;
  os << "[" << n << "]: ";
  if (n < 2 * m) {
    for (int i = 0; i < n; ++i) os << data[i] << " ";
  } else {
    for (int i = 0; i < m; ++i) os << data[i] << " ";
    os << "... ";
    for (int i = n - m; i < n; ++i) os << data[i] << " ";
  }
  return os.str();
}

template <typename V>
std::ostream& operator<<(std::ostream& os, const SArray<V>& arr) {
  return os << DebugStr(arr.data(), static_cast<int>(arr.size()));
}

}  // namespace ps

#endif  // PS_SARRAY_H_
