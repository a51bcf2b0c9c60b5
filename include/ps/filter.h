// Filters: stages of the KV data path that rewrite a message's frames on
// the way out and undo it on the way in (a compressor, for one). The path,
// one function per stage (docs/architecture.md, "One push"):
//   worker: slice -> encode -> filters -> send
//   server: receive -> dedup -> filters -> decode -> handle -> answer
// and a server's answer goes encode -> filters -> send, undone by the
// worker's filters before it decodes. Each side's chain runs its filters in
// the order they were added, and undoes them in the opposite order.
//
// A filter that rewrites a message names itself on it, with a note of its
// own (Filter::Encode); the receiver looks the name up in its own chain
// and refuses the message (the worker's Wait says why) if it has no such
// filter. A worker and the servers it talks to therefore add the same
// filters (KVWorker::AddFilter, KVServer::AddFilter). A filter that
// leaves a message as it is (Encode returns false) costs the wire nothing.
//
// Thread-safety: add filters before the first request (or before the
// server's handle is set); Encode and Decode may then be called from any
// thread, several at once, and must be safe so. Encode runs once per
// message: a resend, by the worker (PS_RESEND_TIMEOUT_MS) or the
// Postoffice, carries the bytes of the first encoding, so a filter may keep
// state across messages (ps/compress.h's error feedback does).
#ifndef PS_FILTER_H_
#define PS_FILTER_H_

#include <memory>
#include <string>
#include <vector>

#include "ps/sarray.h"
#include "ps/status.h"

namespace ps {

// The frames of one KV message, as the filters see them. Encode may replace
// any of them with bytes of its own (their element type on the wire is
// then bytes); Decode must give back what Encode was given.
struct KVFrames {
  SArray<char> keys;  // uint64 keys
  SArray<char> vals;  // values of type val_type, if has_vals
  SArray<char> lens;  // int32 per-key value counts, if has_lens
  bool has_vals = false;
  bool has_lens = false;
  int val_type = 0;  // the values' type code (ps/kv_core.h DataTypeCode)
};

// What a filter may know of the message it handles.
struct FilterContext {
  bool request = true;  // a worker's request, or a server's answer
  bool push = false;
  bool pull = false;
  int cmd = 0;  // the user command (KVMeta::cmd)
  int app_id = 0;
  int customer_id = 0;  // the worker's customer, and the request's
  int timestamp = 0;    // timestamp: an answer has its request's
  int peer = 0;         // the node id it goes to (Encode) or came from (Decode)
  // Whether values to this peer go by reference (the same host, PS_SHM):
  // they do not cross a wire.
  bool shared = false;
};

class Filter {
 public:
  virtual ~Filter() = default;
  // Its name on the wire: a receiver's filter of the same name undoes it.
  virtual std::string name() const = 0;
  // Rewrites *frames for the wire and returns true, with in *note what
  // Decode will need; or returns false and leaves them as they are. An
  // error fails the request (worker) or the answer (server).
  virtual StatusOr<bool> Encode(const FilterContext& ctx, KVFrames* frames,
                                std::string* note) = 0;
  // Undoes Encode. An error (e.g. corrupt bytes from the network) drops
  // the message as malformed and answers a request with the error.
  virtual Status Decode(const FilterContext& ctx, const std::string& note,
                        KVFrames* frames) = 0;
};

}  // namespace ps

#endif  // PS_FILTER_H_
