// Message codec: header serialisation and validating decode.
#include "van/codec.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "van/shm.h"

namespace ps {

size_t DataTypeSize(int type) {
  switch (type) {
    case pb::CHAR:
    case pb::INT8:
    case pb::UINT8:
      return 1;
    case pb::INT16:
    case pb::UINT16:
      return 2;
    case pb::INT32:
    case pb::UINT32:
    case pb::FLOAT:
      return 4;
    case pb::INT64:
    case pb::UINT64:
    case pb::DOUBLE:
      return 8;
    default:
      return 0;
  }
}

std::string EncodeHeader(Message* msg) {
  CHECK_EQ(static_cast<size_t>(msg->meta.data_type_size()), msg->data.size())
      << "every data frame needs a data type";
  msg->meta.clear_data_size();
  for (const auto& frame : msg->data) msg->meta.add_data_size(frame.size());
  std::string header;
  CHECK(msg->meta.SerializeToString(&header));
  return header;
}

SArray<char> Realign(const SArray<char>& frame, size_t align) {
  if (reinterpret_cast<uintptr_t>(frame.data()) % align == 0) return frame;
  SArray<uint64_t> aligned((frame.size() + 7) / 8);
  SArray<char> out = SArray<char>(aligned).segment(0, frame.size());
  std::memcpy(out.data(), frame.data(), frame.size());
  return out;
}

namespace {

Status CheckFrames(const pb::Meta& meta, std::vector<SArray<char>>* frames) {
  if (meta.data_type_size() != meta.data_size_size()) {
    return Status::Corruption(
        "header lists " + std::to_string(meta.data_type_size()) +
        " data types but " + std::to_string(meta.data_size_size()) + " sizes");
  }
  if (static_cast<size_t>(meta.data_size_size()) != frames->size()) {
    return Status::Corruption(
        "header announces " + std::to_string(meta.data_size_size()) +
        " data frames, got " + std::to_string(frames->size()));
  }
  for (size_t i = 0; i < frames->size(); ++i) {
    size_t type_size = DataTypeSize(meta.data_type(i));
    size_t bytes = (*frames)[i].size();
    if (type_size == 0) {
      return Status::Corruption("frame " + std::to_string(i) +
                                " has unknown data type " +
                                std::to_string(meta.data_type(i)));
    }
    if (bytes != meta.data_size(i)) {
      return Status::Corruption("frame " + std::to_string(i) + " is " +
                                std::to_string(bytes) + " bytes, header says " +
                                std::to_string(meta.data_size(i)));
    }
    if (bytes % type_size != 0) {
      return Status::Corruption("frame " + std::to_string(i) + " of " +
                                std::to_string(bytes) +
                                " bytes is not a whole number of " +
                                std::to_string(type_size) + "-byte elements");
    }
    (*frames)[i] = Realign((*frames)[i], type_size);
  }
  return Status::OK();
}

// Puts the bytes of every frame sent as a reference (Meta.shared) in place of
// its empty wire frame, after checking that the sender may name that memory
// (see Decode); checks Meta.reply_into the same way.
Status ResolveShared(const pb::Meta& meta, std::vector<SArray<char>>* frames,
                     const std::function<int(int)>& shared_pid) {
  if (meta.shared_size() == 0 && !meta.has_reply_into()) return Status::OK();
  const int peer = shared_pid ? shared_pid(meta.sender()) : 0;
  if (meta.has_reply_into() && (peer == 0 || meta.reply_into().pid() != peer)) {
    return Status::Corruption("a pull destination in memory of pid " +
                              std::to_string(meta.reply_into().pid()) +
                              " that the sender may not name");
  }
  std::vector<bool> seen(frames->size());
  for (const pb::SharedRef& ref : meta.shared()) {
    if (peer == 0 || (ref.pid() != peer && ref.pid() != getpid())) {
      return Status::Corruption("a shared reference to memory of pid " +
                                std::to_string(ref.pid()) +
                                " that the sender may not name");
    }
    const int i = ref.frame();
    if (i < 0 || static_cast<size_t>(i) >= frames->size() ||
        i >= meta.data_size_size() || seen[i] || !(*frames)[i].empty()) {
      return Status::Corruption(
          "shared reference to frame " + std::to_string(i) + " of " +
          std::to_string(frames->size()) + " (missing, repeated or not empty)");
    }
    seen[i] = true;
    StatusOr<SArray<char>> bytes =
        SharedMemory::Get().Resolve(ref, meta.data_size(i));
    if (!bytes.ok()) {
      return Status(bytes.status().code(), "frame " + std::to_string(i) + ": " +
                                               bytes.status().message());
    }
    (*frames)[i] = std::move(bytes).value();
  }
  return Status::OK();
}

}  // namespace

StatusOr<Message> Decode(const char* header, size_t header_size,
                         std::vector<SArray<char>> frames,
                         const std::function<int(int sender)>& shared_pid) {
  pb::Meta meta;
  if (header_size > static_cast<size_t>(INT32_MAX) ||
      !meta.ParseFromArray(header, static_cast<int>(header_size))) {
    return Status::Corruption("header of " + std::to_string(header_size) +
                              " bytes does not parse");
  }
  return Decode(std::move(meta), std::move(frames), shared_pid);
}

StatusOr<Message> Decode(pb::Meta meta, std::vector<SArray<char>> frames,
                         const std::function<int(int sender)>& shared_pid) {
  Message msg;
  msg.meta = std::move(meta);
  if (!pb::Command_IsValid(msg.meta.control().cmd())) {
    return Status::Corruption("unknown control command " +
                              std::to_string(msg.meta.control().cmd()));
  }
  PS_RETURN_IF_ERROR(ResolveShared(msg.meta, &frames, shared_pid));
  PS_RETURN_IF_ERROR(CheckFrames(msg.meta, &frames));
  msg.data = std::move(frames);
  return msg;
}

StatusOr<std::vector<size_t>> StreamedFrames(const pb::Meta& meta,
                                             size_t stream_bytes,
                                             size_t max_frames,
                                             uint64_t max_bytes) {
  const int n = meta.data_size_size();
  std::vector<uint64_t> wire(meta.data_size().begin(), meta.data_size().end());
  for (const pb::SharedRef& ref : meta.shared()) {
    if (ref.frame() >= 0 && ref.frame() < n) wire[ref.frame()] = 0;
  }
  uint64_t total = 0;
  bool over = static_cast<size_t>(n) > max_frames;
  for (uint64_t bytes : wire) {
    over = over || bytes > max_bytes - total;
    if (!over) total += bytes;
  }
  if (!over && (n == 0 || total < stream_bytes)) return std::vector<size_t>();
  if (over) {
    return Status::InvalidArgument(
        "a streamed message announces " + std::to_string(n) +
        " data frames of more than " + std::to_string(total) +
        " bytes (at most " + std::to_string(max_frames) + " frames and " +
        std::to_string(max_bytes) + " bytes, PS_MAX_MESSAGE_BYTES)");
  }
  return std::vector<size_t>(wire.begin(), wire.end());
}

std::string DebugString(const Message& msg) {
  const pb::Meta& m = msg.meta;
  std::string s = pb::Command_Name(m.control().cmd());
  s += m.request() ? " request" : " response";
  if (m.control().cmd() == pb::EMPTY) {
    s += std::string(m.push() ? " push" : "") + (m.pull() ? " pull" : "");
    s += " app " + std::to_string(m.app_id()) + " customer " +
         std::to_string(m.customer_id()) + " ts " +
         std::to_string(m.timestamp());
  }
  s += " from id " + std::to_string(m.sender()) + " to id " +
       std::to_string(m.recver()) + ", " + std::to_string(msg.data.size()) +
       " frames";
  if (m.ack()) s += ", an acknowledgement";
  if (m.acks_size() > 0) {
    s += ", acknowledging " + std::to_string(m.acks_size()) + " messages";
  }
  return s;
}

}  // namespace ps
