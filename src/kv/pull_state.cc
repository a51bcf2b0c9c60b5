// PullState: a pull's answers, stored and assembled (pull_state.h).
#include "kv/pull_state.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

namespace ps {
namespace detail {

std::vector<size_t> PullState::DirectPlaces(const std::vector<size_t>& cut,
                                            size_t num_touched, size_t bytes,
                                            size_t val_size) {
  const size_t n = cut.back();
  std::vector<size_t> place(cut.size());
  if (n > 0 && bytes % (n * val_size) == 0) {
    for (size_t s = 0; s < cut.size(); ++s) place[s] = cut[s] * (bytes / n);
  } else if (num_touched == 1) {
    for (size_t s = 0; s < cut.size(); ++s) place[s] = cut[s] == n ? bytes : 0;
  } else {
    place.clear();
  }
  return place;
}

Status PullState::AskedOf(int rank, SArray<Key>* want) const {
  if (by_key) {
    if (rank < 0 || static_cast<size_t>(rank) >= asked.size()) {
      return Status::Corruption("no such server rank " + std::to_string(rank));
    }
    *want = asked[rank];
  } else {
    if (rank < 0 || static_cast<size_t>(rank) + 1 >= cut.size()) {
      return Status::Corruption("no such server rank " + std::to_string(rank));
    }
    *want = keys.segment(cut[rank], cut[rank + 1]);
  }
  return Status::OK();
}

Status PullState::Store(int rank, RawKVPairs answer) {
  SArray<Key> want;
  Status st = AskedOf(rank, &want);
  if (!st.ok()) return st;
  // The very keys asked (Meta.keys_asked, or shared memory of this
  // process echoed back) need no comparison.
  const bool same = answer.keys.data() == want.data();
  if (answer.keys.size() != want.size() ||
      (!same && std::memcmp(answer.keys.data(), want.data(),
                            want.size() * sizeof(Key)) != 0)) {
    return Status::Corruption("answered " + std::to_string(answer.keys.size()) +
                              " keys that differ from the " +
                              std::to_string(want.size()) + " asked");
  }
  MutexLock lock(&mu);
  if (abandoned) return Status::OK();
  if (!place.empty() && !misplaced) {
    size_t bytes = place[rank + 1] - place[rank];
    char* dst = sink.direct + place[rank];
    if (answer.vals.size() == bytes) {
      // A co-located server may have written it in place (reply_into).
      if (answer.vals.data() != dst)
        std::memcpy(dst, answer.vals.data(), bytes);
    } else {
      misplaced = true;  // e.g. lens that happen to divide evenly
    }
  }
  answers[rank] = std::move(answer);
  return Status::OK();
}

void PullState::Fail(const Status& why) {
  MutexLock lock(&mu);
  if (error.ok()) error = why;
}

void PullState::Abandon() {
  MutexLock lock(&mu);  // waits out a running copy
  abandoned = true;
}

Status PullState::Assemble() {
  MutexLock lock(&mu);
  if (abandoned || !error.ok()) return error;
  if (!place.empty() && !misplaced) {
    answers.clear();
    return Status::OK();
  }
  if (by_key) return AssembleByKey();
  if (Adopt()) return Status::OK();
  // A co-located server may have written its answer into the destination at
  // a place guessed from the sizes (reply_into), where another answer
  // belongs: take such answers out of the way first.
  const char* begin = sink.direct;
  const char* end = begin + sink.direct_bytes;
  for (auto& [rank, a] : answers) {
    if (begin != nullptr && a.vals.data() < end &&
        a.vals.data() + a.vals.size() > begin) {
      SArray<char> copy;
      copy.CopyFrom(a.vals);
      a.vals = copy;
    }
  }
  size_t total = 0, num_keys = 0;
  for (const auto& [rank, a] : answers) {
    total += a.vals.size();
    num_keys += a.keys.size();
  }
  char* dst = nullptr;
  if (sink.assign_vals && sink.direct == nullptr && answers.size() == 1) {
    const SArray<char>& v = answers.begin()->second.vals;
    sink.assign_vals(v.data(), v.size());  // made and filled in one pass
  } else {
    dst = sink.alloc_vals(total);
  }
  int* lens = sink.alloc_lens ? sink.alloc_lens(num_keys) : nullptr;
  for (const auto& [rank, a] : answers) {
    if (dst != nullptr) {
      if (!a.vals.empty()) std::memcpy(dst, a.vals.data(), a.vals.size());
      dst += a.vals.size();
    }
    if (lens == nullptr) continue;
    size_t n = a.keys.size();
    for (size_t i = 0; i < n; ++i) {
      *lens++ = !a.lens.empty()
                    ? a.lens[i]
                    : static_cast<int>(a.vals.size() / val_size / n);
    }
  }
  answers.clear();
  return Status::OK();
}

Status PullState::AssembleByKey() {
  struct Part {
    const char* vals;
    size_t bytes;
  };
  std::unordered_map<Key, Part> parts;
  for (const auto& [rank, a] : answers) {  // ascending rank
    size_t n = a.keys.size();
    size_t uniform = n == 0 ? 0 : a.vals.size() / n;
    const char* at = a.vals.data();
    for (size_t i = 0; i < n; ++i) {
      size_t bytes =
          a.lens.empty() ? uniform : static_cast<size_t>(a.lens[i]) * val_size;
      parts.emplace(a.keys[i], Part{at, bytes});
      at += bytes;
    }
  }
  size_t total = 0;
  for (Key key : keys) {
    auto it = parts.find(key);
    if (it == parts.end()) {
      return Status::Corruption("no server answered pulled key " +
                                std::to_string(key));
    }
    total += it->second.bytes;
  }
  // The destination may be presized: `parts` points into the answers only.
  char* dst = sink.alloc_vals(total);
  int* lens = sink.alloc_lens ? sink.alloc_lens(keys.size()) : nullptr;
  for (Key key : keys) {
    const Part& part = parts[key];
    if (part.bytes > 0) std::memcpy(dst, part.vals, part.bytes);
    dst += part.bytes;
    if (lens != nullptr) *lens++ = static_cast<int>(part.bytes / val_size);
  }
  answers.clear();
  return Status::OK();
}

bool PullState::Adopt() {
  if (!sink.adopt || answers.size() != 1) return false;
  const RawKVPairs& a = answers.begin()->second;
  // Frames arrive aligned for their element type (the codec realigns the
  // rare one ZeroMQ left at an odd offset), so they can be handed over.
  if (sink.alloc_lens && a.lens.empty()) return false;
  sink.adopt(a.vals, a.lens);
  answers.clear();
  return true;
}

}  // namespace detail
}  // namespace ps
