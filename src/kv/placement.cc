// Placement: contiguous key ranges per server, even or balanced by bytes.
#include "ps/placement.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace ps {

Placement Placement::EvenKeys(int num_servers, Key max_key) {
  CHECK_GT(num_servers, 0);
  Placement p;
  for (int s = 0; s < num_servers; ++s) {
    // ps-lite's split: server s gets [max_key / S * s, ...).
    p.begins_.push_back(max_key / static_cast<Key>(num_servers) *
                        static_cast<Key>(s));
  }
  return p;
}

StatusOr<Placement> Placement::ByBytes(const std::vector<Key>& keys,
                                       const std::vector<uint64_t>& bytes,
                                       int num_servers) {
  if (num_servers <= 0) {
    return Status::InvalidArgument(
        "num_servers=" + std::to_string(num_servers) + " is not positive");
  }
  if (keys.size() != bytes.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " +
                                   std::to_string(bytes.size()) + " sizes");
  }
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i] <= keys[i - 1]) {
      return Status::InvalidArgument(
          "keys are not sorted and unique at index " + std::to_string(i));
    }
  }
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  Placement p;
  p.begins_.assign(num_servers, 0);
  p.key_counts_.assign(num_servers, 0);
  p.bytes_.assign(num_servers, 0);
  // Key i goes to the server whose 1/S share holds the middle of its bytes,
  // so a large key is not pushed wholesale to one side of a cut.
  uint64_t before = 0;
  int server = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    long double mid = before + bytes[i] / 2.0L;
    int s = total == 0 ? 0 : static_cast<int>(mid * num_servers / total);
    s = std::min(std::max(s, server), num_servers - 1);
    while (server < s) {
      ++server;
      p.begins_[server] = keys[i];
    }
    p.key_counts_[server]++;
    p.bytes_[server] += bytes[i];
    before += bytes[i];
  }
  // Servers past the last key own empty ranges at the top of the key space.
  Key last = keys.empty() ? 0 : keys.back();
  for (int s = server + 1; s < num_servers; ++s) {
    p.begins_[s] = last == kMaxKey ? kMaxKey : last + 1 + (s - server - 1);
  }
  return p;
}

int Placement::ServerOf(Key key) const {
  CHECK(valid());
  auto it = std::upper_bound(begins_.begin(), begins_.end(), key);
  return static_cast<int>(it - begins_.begin()) - 1;
}

std::vector<size_t> Placement::Slice(const Key* keys, size_t n) const {
  CHECK(valid());
  std::vector<size_t> cut(begins_.size() + 1, n);
  cut[0] = 0;
  for (size_t s = 1; s < begins_.size(); ++s) {
    cut[s] = static_cast<size_t>(
        std::lower_bound(keys + cut[s - 1], keys + n, begins_[s]) - keys);
  }
  return cut;
}

std::string Placement::Describe() const {
  std::ostringstream os;
  uint64_t total = 0;
  for (uint64_t b : bytes_) total += b;
  for (int s = 0; s < num_servers(); ++s) {
    os << "server " << s << ": keys [" << begin(s) << ", ";
    if (s + 1 < num_servers()) {
      os << end(s) << ")";
    } else {
      os << "max]";
    }
    if (!bytes_.empty()) {
      char share[32];
      std::snprintf(share, sizeof(share), "%.1f%%",
                    total == 0 ? 0.0 : 100.0 * bytes_[s] / total);
      os << " " << key_counts_[s] << " keys, " << bytes_[s] << " bytes, "
         << share;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace ps
