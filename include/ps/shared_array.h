// SharedArray<V>(n): an SArray of n zero-filled elements in memory that
// other processes on this host can map. A push's values or a pull's
// destination allocated here goes between co-located nodes (the same user
// on the same host, PS_SHM=1) as a reference instead of through the socket:
// the server reads pushed values where the worker wrote them and writes a
// pulled answer straight into the worker's array, one memcpy instead of
// two copies through loopback TCP and the kernel (docs/architecture.md).
// To anyone else it is an ordinary SArray. Meant for a few large, long-lived
// buffers (each is a memfd and a mapping, and a server keeps its mapping of
// a worker's array until it exits); where shared memory cannot be had it is
// an ordinary array, with one warning. A pull is written in place when each
// server's share of the destination is known: one server per pull, or the
// same number of values per key. A pull whose Wait gave up (a timeout, a
// failed peer) may still be written by a late answer: do not reuse its
// destination for other data.
#ifndef PS_SHARED_ARRAY_H_
#define PS_SHARED_ARRAY_H_

#include <cstddef>

#include "ps/sarray.h"

namespace ps {

namespace detail {
SArray<char> AllocateSharedBytes(size_t bytes);  // zero-filled, 8-aligned
}  // namespace detail

template <typename V>
SArray<V> SharedArray(size_t n) {
  static_assert(alignof(V) <= 8, "SharedArray aligns to 8 bytes");
  return SArray<V>(detail::AllocateSharedBytes(n * sizeof(V)));
}

}  // namespace ps

#endif  // PS_SHARED_ARRAY_H_
