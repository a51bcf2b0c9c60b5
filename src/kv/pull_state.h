// PullState: one pull in flight at a worker (KVWorkerCore), from its
// request to the values in the caller's destination. Each server's answer
// is checked against the keys it was asked for and stored (Store): copied
// straight to its place in a direct destination when that place is known,
// else kept as received (zero-copy); once every server answered, Assemble
// hands a lone answer over as it is (the sink's adopt), or copies the
// answers into buffers from the sink, in key order (key by key when a user
// slicer cut the request).
//
// Thread-safety: the fields above `mu` are set before the request's tracker
// entry exists and stay as they are; mu guards the rest, and the sink's
// destination, against Wait() (which abandons it: nothing touches the sink
// afterwards). Store may run on any thread, Assemble on the one that saw
// the last answer.
#ifndef PS_SRC_KV_PULL_STATE_H_
#define PS_SRC_KV_PULL_STATE_H_

#include <cstddef>
#include <map>
#include <vector>

#include "ps/kv_core.h"
#include "van/sync.h"

namespace ps {
namespace detail {

struct PullState {
  PullSink sink;
  SArray<Key> keys;         // the request's keys
  std::vector<size_t> cut;  // keys[cut[s], cut[s+1]) went to server s
  // Non-empty: server s's answer goes to sink.direct + place[s], as it
  // comes, while it is place[s + 1] - place[s] bytes. Certain when one
  // server holds every key; otherwise guessed from the sizes (the values per
  // key taken as uniform when they divide evenly), and an answer of another
  // size sets `misplaced`.
  std::vector<size_t> place;
  // Set by a user slicer: the keys sent to server s are asked[s] (cut is
  // then empty), and answers are assembled key by key.
  bool by_key = false;
  std::vector<SArray<Key>> asked;
  size_t val_size = 0;

  Mutex mu;
  bool abandoned GUARDED_BY(mu) = false;  // done; never touch the sink again
  // An answer broke `place`: assemble at the end.
  bool misplaced GUARDED_BY(mu) = false;
  // By server rank (all kept, zero-copy).
  std::map<int, RawKVPairs> answers GUARDED_BY(mu);
  Status error GUARDED_BY(mu);

  // Where each server's answer goes in a direct destination of `bytes`
  // (`place`); empty when that is not known in advance.
  static std::vector<size_t> DirectPlaces(const std::vector<size_t>& cut,
                                          size_t num_touched, size_t bytes,
                                          size_t val_size);
  // The keys server `rank` was asked for.
  Status AskedOf(int rank, SArray<Key>* want) const;
  // Server `rank`'s answer: its keys must be those it was asked for.
  Status Store(int rank, RawKVPairs answer) EXCLUDES(mu);
  // The first error of the request (a refusal, a bad answer).
  void Fail(const Status& why) EXCLUDES(mu);
  // Every server answered: the values go to the sink.
  Status Assemble() EXCLUDES(mu);
  // The caller stopped waiting (or was told): the sink is not touched again.
  void Abandon() EXCLUDES(mu);

 private:
  // The values of `keys`, in their order, from answers holding them in any
  // order (the lowest rank's answer for a key sent to several).
  Status AssembleByKey() REQUIRES(mu);
  // Hands a lone answer's frames to the sink as they are (no copy); false
  // when the sink or the answer does not allow it.
  bool Adopt() REQUIRES(mu);
};

}  // namespace detail
}  // namespace ps

#endif  // PS_SRC_KV_PULL_STATE_H_
