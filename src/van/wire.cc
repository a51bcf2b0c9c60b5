// What both wires share (van/wire.h): frames out (OutParts, zero copy) and
// in (Adopt), and the words for a failed send.
#include "van/wire.h"

#include <cerrno>
#include <utility>

#include "van/van_internal.h"

namespace ps {
namespace van_internal {

namespace {

// ZeroMQ's free function for a zero-copy frame: drops the SArray reference.
void ReleaseFrame(void* /*data*/, void* hint) {
  std::unique_ptr<SArray<char>> owner(static_cast<SArray<char>*>(hint));
}

}  // namespace

std::string SendError(const std::string& address) {
  if (errno == EAGAIN) {
    return "send to " + address +
           ": no connection (it refused this node's handshake)";
  }
  return "send to " + address + ": " + ZmqError();
}

SArray<char> Adopt(const std::shared_ptr<RecvFrame>& part, char* data,
                   size_t bytes) {
  std::shared_ptr<RecvFrame> holder = part;
  return SArray<char>(data, bytes, [holder](char*) {});
}

OutParts::~OutParts() {
  for (size_t i = sent_; i < parts_.size(); ++i) zmq_msg_close(&parts_[i]);
}

void* OutParts::Add(size_t bytes) {
  zmq_msg_t part;
  if (zmq_msg_init_size(&part, bytes) != 0) return nullptr;
  parts_.push_back(part);
  return zmq_msg_data(&parts_.back());
}

bool OutParts::AddFrame(const SArray<char>& frame) {
  auto owner = std::make_unique<SArray<char>>(frame);
  zmq_msg_t part;
  if (zmq_msg_init_data(&part, frame.data(), frame.size(), ReleaseFrame,
                        owner.get()) != 0) {
    return false;
  }
  owner.release();  // ZeroMQ's now: ReleaseFrame frees it
  parts_.push_back(part);
  return true;
}

bool OutParts::Send(void* socket, const std::string& header) {
  if (zmq_send(socket, header.data(), header.size(),
               kSendFlags | (parts_.empty() ? 0 : ZMQ_SNDMORE)) < 0) {
    return false;
  }
  for (; sent_ < parts_.size(); ++sent_) {
    const int more = sent_ + 1 < parts_.size() ? ZMQ_SNDMORE : 0;
    if (zmq_msg_send(&parts_[sent_], socket, kSendFlags | more) < 0) {
      return false;
    }
  }
  return true;
}

}  // namespace van_internal
}  // namespace ps
