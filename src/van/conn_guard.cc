// ConnGuard: caps on the idle connections a node holds (conn_guard.h).
#include "van/conn_guard.h"

#include <glog/logging.h>

#include <algorithm>

namespace ps {

namespace {

constexpr rlim_t kUnlimitedAs = rlim_t{1} << 22;
constexpr rlim_t kMinCap = 8, kMaxCap = rlim_t{1} << 20;

int CapOf(rlim_t nofile, rlim_t divisor) {
  if (nofile == RLIM_INFINITY) nofile = kUnlimitedAs;
  return static_cast<int>(std::clamp(nofile / divisor, kMinCap, kMaxCap));
}

}  // namespace

ConnGuard::ConnGuard(int per_source, int total)
    : per_source_(per_source), total_(total) {
  CHECK_GE(per_source_, 1) << "per-source cap of idle connections";
  CHECK_GE(total_, 1) << "total cap of idle connections";
}

int ConnGuard::DefaultTotal(rlim_t nofile) { return CapOf(nofile, 4); }

int ConnGuard::DefaultPerSource(rlim_t nofile) { return CapOf(nofile, 16); }

std::vector<ConnGuard::Victim> ConnGuard::Accepted(
    int fd, const std::string& source, const std::string& name,
    Clock::time_point now, const IdleCheck& still_idle) {
  Closed(fd);
  const uint64_t seq = next_seq_++;
  by_age_[seq] = Conn{fd, source, name, now};
  by_fd_[fd] = seq;
  by_source_[source].insert(seq);
  std::vector<Victim> out;
  // Each pass removes one connection at least, so each loop ends.
  while (held_from(source) > static_cast<size_t>(per_source_) &&
         TakeOldestIdle(&source, now, still_idle, &out)) {
  }
  while (held() > static_cast<size_t>(total_) &&
         TakeOldestIdle(nullptr, now, still_idle, &out)) {
  }
  num_shut_ += out.size();
  return out;
}

bool ConnGuard::TakeOldestIdle(const std::string* source, Clock::time_point now,
                               const IdleCheck& still_idle,
                               std::vector<Victim>* out) {
  while (true) {
    uint64_t seq;
    if (source != nullptr) {
      auto it = by_source_.find(*source);
      if (it == by_source_.end() || it->second.empty()) return false;
      seq = *it->second.begin();
    } else {
      if (by_age_.empty()) return false;
      seq = by_age_.begin()->first;
    }
    const Conn conn = by_age_.at(seq);
    const size_t from_source = held_from(conn.source);
    Remove(seq);
    if (!still_idle(conn.fd, conn.name)) continue;  // forgotten, not shut
    out->push_back(Victim{conn.fd, conn.source, conn.name, now - conn.accepted,
                          from_source, source == nullptr});
    return true;
  }
}

void ConnGuard::Closed(int fd) {
  auto it = by_fd_.find(fd);
  if (it != by_fd_.end()) Remove(it->second);
}

size_t ConnGuard::held_from(const std::string& source) const {
  auto it = by_source_.find(source);
  return it == by_source_.end() ? 0 : it->second.size();
}

void ConnGuard::Remove(uint64_t seq) {
  auto it = by_age_.find(seq);
  if (it == by_age_.end()) return;
  by_fd_.erase(it->second.fd);
  auto src = by_source_.find(it->second.source);
  src->second.erase(seq);
  if (src->second.empty()) by_source_.erase(src);
  by_age_.erase(it);
}

}  // namespace ps
