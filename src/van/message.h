// Message: the protobuf header (proto/meta.proto) plus the data frames that
// travel beside it (keys, values, lens), each a zero-copy SArray. Internal.
#ifndef PS_SRC_VAN_MESSAGE_H_
#define PS_SRC_VAN_MESSAGE_H_

#include <string>
#include <vector>

#include "meta.pb.h"
#include "ps/sarray.h"

namespace ps {

struct Message {
  pb::Meta meta;
  // data[i] has element type meta.data_type(i); the codec fills data_size.
  std::vector<SArray<char>> data;
  // Set by the van on receipt: the routing id of the connection the message
  // came on (the peer's "host:port", fixed at rendezvous; see van.h) and
  // the peer's IP address. What a peer claims in meta.sender is checked
  // against `from`, never believed on its own.
  std::string from;
  std::string peer_address;

  // Appends a frame of element type `type` (pb::DataType).
  void AddData(const SArray<char>& frame, pb::DataType type) {
    data.push_back(frame);
    meta.add_data_type(type);
  }
};

// "ADD_NODE request from worker 3 to scheduler" style summary for logs.
std::string DebugString(const Message& msg);

}  // namespace ps

#endif  // PS_SRC_VAN_MESSAGE_H_
