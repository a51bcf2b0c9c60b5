// The plain wire (van/wire.h): an --insecure job's frames go as they are,
// one ZeroMQ part each, zero copy above ZeroMQ's inline size; received
// frames are adopted where they lie.
#include <cstring>
#include <utility>
#include <vector>

#include "van/codec.h"
#include "van/van.h"
#include "van/van_internal.h"
#include "van/wire.h"

namespace ps {
namespace van_internal {

namespace {

class PlainWire : public Wire {
 public:
  PlainWire(WireHost* host, const VanOptions& options)
      : host_(host), max_bytes_(options.max_message_bytes) {}

  const std::string& wire_key() const override { return none_; }
  std::string scheduler_wire_key() const override { return none_; }
  int64_t max_frame_bytes() const override { return max_bytes_; }
  int64_t max_received_bytes() const override { return max_bytes_; }

  bool SetUpRouter(void* /*router*/) override { return false; }
  bool Admit(const std::string& /*user*/, const std::string& /*password*/,
             std::string* why) override {
    *why = "this job has no key: no handshake is admitted by token";
    return false;
  }

  Status Prepare(Peer* /*peer*/, const std::string& /*wire_key*/) override {
    return Status::OK();
  }
  Status Connected(Peer* /*peer*/) override { return Status::OK(); }

  Status Send(Peer* peer, std::string header, const Message& msg,
              std::vector<bool> by_ref) REQUIRES(peer->mu) override;
  void Receive(const RecvParts& parts, const std::string& from,
               const std::string& address) override;
  bool Settled(Peer* /*peer*/) override { return true; }
  void Stop() override {}

 private:
  WireHost* const host_;  // the van; outlives the wire
  const int64_t max_bytes_;
  const std::string none_;
};

Status PlainWire::Send(Peer* peer, std::string header, const Message& msg,
                       std::vector<bool> by_ref) {
  const size_t n = msg.data.size();
  OutParts parts(n);
  for (size_t i = 0; i < n; ++i) {
    const SArray<char>& frame = msg.data[i];
    const size_t size = by_ref[i] ? 0 : frame.size();  // a reference: none
    // ZeroMQ stores frames this small inside zmq_msg_t itself; handing them
    // over by reference would cost a heap block instead of a copy of a few
    // bytes. Anything larger goes without a copy.
    void* small = size <= kInlineFrameBytes ? parts.Add(size) : nullptr;
    if (small != nullptr) {
      if (size > 0) std::memcpy(small, frame.data(), size);
    } else if (size <= kInlineFrameBytes || !parts.AddFrame(frame)) {
      return Status::Unavailable("send to " + peer->address +
                                 ": no memory for a frame of " +
                                 std::to_string(size) + " bytes");
    }
  }
  if (!parts.Send(peer->socket, header)) {
    return Status::Unavailable(SendError(peer->address));
  }
  return Status::OK();
}

void PlainWire::Receive(const RecvParts& parts, const std::string& from,
                        const std::string& address) {
  std::vector<SArray<char>> frames;
  for (size_t i = 2; i < parts.size(); ++i) {
    frames.push_back(Adopt(parts[i], parts[i]->data(), parts[i]->size()));
  }
  host_->Deliver(Decode(parts[1]->data(), parts[1]->size(), std::move(frames),
                        host_->SharedPid(from)),
                 from, address);
}

}  // namespace

std::unique_ptr<Wire> MakePlainWire(WireHost* host, const VanOptions& options) {
  return std::make_unique<PlainWire>(host, options);
}

}  // namespace van_internal
}  // namespace ps
