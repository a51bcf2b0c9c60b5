// BarrierWaits: this node's own side of barriers: the barriers its threads
// wait in, the releases seen (and their status), and, when a restarted
// scheduler took the job over, which barriers to send it again (those not
// released since they were entered: an arrival counts once at the
// scheduler, so a copy is harmless). The scheduler's side is
// BarrierCoordinator.
//
//   Enter(group) ─> waiting ─(Release(group, status))─> released: Leave
//                          ─(the scheduler is back)─> ToResend() has it
//
// No I/O: the Postoffice sends BARRIER and waits on its condition variable
// (barrier_monitor.cc). Thread-compatible: its owner serializes the calls
// (the Postoffice holds its mu_).
#ifndef PS_SRC_POSTOFFICE_BARRIER_WAITS_H_
#define PS_SRC_POSTOFFICE_BARRIER_WAITS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "ps/status.h"

namespace ps {
namespace core {

class BarrierWaits {
 public:
  // One thread's wait in a barrier.
  struct Ticket {
    int group;
    uint64_t seen;  // releases of its group when it entered
    std::multimap<int, uint64_t>::iterator entry;
  };

  Ticket Enter(int group) {
    const uint64_t seen = released_[group].count;
    return Ticket{group, seen, waiting_.emplace(group, seen)};
  }
  // Whether the barrier `ticket` waits in was released since it entered.
  bool Released(const Ticket& ticket) const {
    auto it = released_.find(ticket.group);
    return it != released_.end() && it->second.count > ticket.seen;
  }
  // The status of its group's last release (OK or why it failed).
  Status StatusOf(const Ticket& ticket) const {
    auto it = released_.find(ticket.group);
    return it == released_.end() ? Status::OK() : it->second.status;
  }
  void Leave(const Ticket& ticket) { waiting_.erase(ticket.entry); }
  // The scheduler released `group`'s barrier with `status`.
  void Release(int group, const Status& status) {
    Releases& r = released_[group];
    ++r.count;
    r.status = status;
  }
  // The groups to send again to a restarted scheduler: entered and not
  // released since (a group once per waiting thread).
  std::vector<int> ToResend() const {
    std::vector<int> groups;
    for (const auto& [group, seen] : waiting_) {
      auto it = released_.find(group);
      // Released meanwhile: its waiter just has not woken yet.
      if (it != released_.end() && it->second.count > seen) continue;
      groups.push_back(group);
    }
    return groups;
  }

 private:
  struct Releases {
    uint64_t count = 0;
    Status status;
  };
  std::multimap<int, uint64_t> waiting_;  // group -> releases seen at entry
  std::map<int, Releases> released_;
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_BARRIER_WAITS_H_
