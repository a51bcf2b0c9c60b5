// The message codec: Message <-> (header bytes, data frames). Pure functions,
// no sockets, so malformed input can be unit tested. Decode validates
// everything a peer could get wrong and never aborts on bad input.
#ifndef PS_SRC_VAN_CODEC_H_
#define PS_SRC_VAN_CODEC_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "ps/sarray.h"
#include "ps/status.h"
#include "van/message.h"

namespace ps {

// Bytes per element of a pb::DataType; 0 for an unknown type.
size_t DataTypeSize(int type);

// `frame`, or a copy of it in a buffer aligned for `align`-byte elements
// when it is not.
SArray<char> Realign(const SArray<char>& frame, size_t align);

// Serialises msg->meta after filling data_size from msg->data. The frames
// themselves are sent as they are (no copy). A data_type count that differs
// from the frame count is a bug (CHECK).
std::string EncodeHeader(Message* msg);

// Parses `header` and adopts `frames` (no copy unless a frame is misaligned
// for its element type, which ZeroMQ never does in practice); a frame the
// header lists in `shared` is replaced by the bytes its reference names
// (van/shm.h). Errors: unparsable header, unknown command or data type, frame
// count or size different from the header's, a size not a multiple of the
// element size, a shared reference that is malformed, not allowed or cannot
// be mapped. `shared_pid(sender)` says whose memory node `sender` may name:
// the pid of that process (its own memory) or, as well, of this one; 0 or no
// function: none (references and Meta.reply_into are refused).
StatusOr<Message> Decode(
    const char* header, size_t header_size, std::vector<SArray<char>> frames,
    const std::function<int(int sender)>& shared_pid = nullptr);
// The same for a header parsed already.
StatusOr<Message> Decode(
    pb::Meta meta, std::vector<SArray<char>> frames,
    const std::function<int(int sender)>& shared_pid = nullptr);

// With a job key, a header that came alone announces a streamed message
// (van/seal.h) when its data frames hold `stream_bytes` or more on the wire:
// then the list of each data frame's wire bytes (none for a shared-memory
// reference), whose records follow it; else an empty list. Errors: more
// than `max_frames` data frames or `max_bytes` bytes, which names both.
StatusOr<std::vector<size_t>> StreamedFrames(const pb::Meta& meta,
                                             size_t stream_bytes,
                                             size_t max_frames,
                                             uint64_t max_bytes);

}  // namespace ps

#endif  // PS_SRC_VAN_CODEC_H_
