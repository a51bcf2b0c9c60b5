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

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace ps {

template <typename V>
class SArray {
  static_assert(std::is_trivially_copyable<V>::value,
                "SArray holds trivially copyable elements only");

 public:
  SArray() = default;

  // A new buffer of `size` elements, each set to `value`.
  explicit SArray(size_t size, V value = V()) { resize(size, value); }

  // Adopts `data`: `deleter(data)` runs when the last copy goes away.
  SArray(V* data, size_t size, std::function<void(V*)> deleter)
      : ptr_(data, std::move(deleter)), size_(size), capacity_(size) {}

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
    resize(size);
    if (size > 0) std::memcpy(this->data(), data, size * sizeof(V));
  }
  void CopyFrom(const SArray<V>& other) {
    if (this != &other) CopyFrom(other.data(), other.size());
  }

  // Elements [begin, end) of this array, sharing its buffer.
  SArray<V> segment(size_t begin, size_t end) const {
    CHECK_LE(begin, end);
    CHECK_LE(end, size_);
    SArray<V> a;
    a.ptr_ = std::shared_ptr<V>(ptr_, data() + begin);
    a.size_ = a.capacity_ = end - begin;
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
    return a;
  }

  // Grows into a fresh buffer when capacity is short; keeps the elements.
  void reserve(size_t n) {
    if (n <= capacity_) return;
    std::unique_ptr<V[]> fresh(new V[n]);
    if (size_ > 0) std::memcpy(fresh.get(), data(), size_ * sizeof(V));
    ptr_ = std::shared_ptr<V>(fresh.release(), std::default_delete<V[]>());
    capacity_ = n;
  }
  void resize(size_t n) {
    reserve(n);
    size_ = n;
  }
  void resize(size_t n, V value) {
    size_t old = size_;
    resize(n);
    for (size_t i = old; i < n; ++i) data()[i] = value;
  }
  void push_back(const V& v) {
    if (size_ == capacity_) reserve(capacity_ == 0 ? 8 : capacity_ * 2);
    data()[size_++] = v;
  }
  void clear() { *this = SArray<V>(); }

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  V* data() const { return ptr_.get(); }
  V* begin() const { return data(); }
  V* end() const { return data() + size_; }
  V& operator[](size_t i) const { return data()[i]; }
  V& front() const { return data()[0]; }
  V& back() const { return data()[size_ - 1]; }
  const std::shared_ptr<V>& ptr() const { return ptr_; }

 private:
  template <typename W>
  friend class SArray;

  std::shared_ptr<V> ptr_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace ps

#endif  // PS_SARRAY_H_
