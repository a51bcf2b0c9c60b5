// Placement: which server holds which key. Each server owns one contiguous
// key range; ranges tile [0, kMaxKey] in server order. Immutable once built,
// so a Placement may be read from any number of threads.
//
// EvenKeys(S, max_key) is ps-lite's split of [0, max_key) (the last server
// also takes every key >= its begin). ByBytes(keys, bytes, S) cuts a sorted
// key list so each server holds about 1/S of the bytes: ps-lite's even split
// of the whole 64-bit space would put every small key on server 0.
#ifndef PS_PLACEMENT_H_
#define PS_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ps/base.h"
#include "ps/sarray.h"
#include "ps/status.h"

namespace ps {

class Placement {
 public:
  Placement() = default;  // empty: no server; valid() is false

  static Placement EvenKeys(int num_servers, Key max_key);
  // keys: sorted ascending, unique; bytes[i]: size of key i's value (any
  // unit, e.g. float count or bytes). Fewer keys than servers leaves the
  // last servers empty.
  static StatusOr<Placement> ByBytes(const std::vector<Key>& keys,
                                     const std::vector<uint64_t>& bytes,
                                     int num_servers);

  bool valid() const { return !begins_.empty(); }
  int num_servers() const { return static_cast<int>(begins_.size()); }
  // Server s owns [begin(s), end(s)); end of the last server is kMaxKey
  // (which it also owns).
  Key begin(int s) const { return begins_[s]; }
  Key end(int s) const {
    return s + 1 < num_servers() ? begins_[s + 1] : kMaxKey;
  }
  // The server rank owning `key`.
  int ServerOf(Key key) const;

  // Index boundaries of sorted `keys` per server: keys[cut[s], cut[s+1])
  // go to server s; cut has num_servers()+1 entries. Pure; O(S log n).
  std::vector<size_t> Slice(const Key* keys, size_t n) const;

  // Per server: key range, and where known (ByBytes) key count, bytes and
  // share of the bytes; one line per server.
  std::string Describe() const;

 private:
  std::vector<Key> begins_;
  std::vector<uint64_t> key_counts_;  // empty when unknown
  std::vector<uint64_t> bytes_;       // empty when unknown
};

}  // namespace ps

#endif  // PS_PLACEMENT_H_
