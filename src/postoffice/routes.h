// Routes: the one view of the job that the data path and the KV layer read
// on every message, without a lock: the node table, and each node that is
// down (awaited back, dead, or covered by its replica) with who covers it
// and why it went down. The Postoffice publishes it whole (a Snapshot)
// after every change of the node table or of a node's down state, before
// the change's events reach any customer, so that a customer reacting to
// an event reads a view that already holds it (Postoffice::routes()).
//
// The KV layer keeps no copy of who is down: where a slice goes, whether a
// replica still takes forwarded pushes, and why a request cannot be served
// are questions to this view.
#ifndef PS_SRC_POSTOFFICE_ROUTES_H_
#define PS_SRC_POSTOFFICE_ROUTES_H_

#include <algorithm>
#include <string>
#include <vector>

#include "postoffice/membership.h"
#include "postoffice/node_table.h"
#include "ps/status.h"

namespace ps {
namespace core {

struct Routes {
  NodeTable table;
  int my_id = 0;
  bool ready = false;  // a member with its node table
  // Ascending by id: every node Membership::IsDown holds for. A data
  // message of one takes the slow path, which drops it (fenced).
  std::vector<Membership::DownPeer> down;

  // Node `id`'s entry while it is down; null while it is not.
  const Membership::DownPeer* DownOf(int id) const {
    auto it = std::lower_bound(
        down.begin(), down.end(), id,
        [](const Membership::DownPeer& d, int key) { return d.id < key; });
    return it != down.end() && it->id == id ? &*it : nullptr;
  }
  bool IsDown(int id) const { return DownOf(id) != nullptr; }

  // The node that serves server `id`'s keys: itself, or its replica once
  // it was covered (also after that replica went down: Unserved says so).
  int ServerOf(int id) const {
    const Membership::DownPeer* d = DownOf(id);
    return d != nullptr && d->state == PeerState::kCovered ? d->covered_by : id;
  }

  // Why server `id`'s keys cannot be served: the reason it went down, or
  // the reason its replica did; OK while they are served.
  Status Unserved(int id) const {
    const Membership::DownPeer* d = DownOf(id);
    if (d == nullptr) return Status::OK();
    if (d->state != PeerState::kCovered) return d->why;
    const Membership::DownPeer* replica = DownOf(d->covered_by);
    return replica == nullptr ? Status::OK() : replica->why;
  }

  // The servers whose keys node `id` serves as their replica.
  std::vector<int> CoveredBy(int id) const {
    std::vector<int> ids;
    for (const Membership::DownPeer& d : down) {
      if (d.state == PeerState::kCovered && d.covered_by == id) {
        ids.push_back(d.id);
      }
    }
    return ids;
  }
};

}  // namespace core
}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_ROUTES_H_
