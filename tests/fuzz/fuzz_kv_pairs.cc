// libFuzzer target: ps::DecodeKVPairs (src/kv/slicer.h) on whatever
// ps::Decode accepts, read as a push (keys + values [+ lens]) and as a pull
// (keys [+ lens]) for several value types. Pairs it accepts must pass
// CheckKVPairs; accepted pushes must slice (SliceKVPairs) into pieces that
// add up (a pull's lens are not checked, and the library slices only
// requests that CheckKVPairs passed with their values).
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdlib>

#include "fuzz_input.h"
#include "kv/slicer.h"
#include "van/codec.h"

namespace {

// Slicing accepted pairs over a few servers must cover every key and value
// exactly once.
void CheckSlices(const ps::detail::RawKVPairs& kvs, size_t val_size) {
  ps::Placement placement = ps::Placement::EvenKeys(3, 1u << 16);
  size_t keys = 0, vals = 0;
  for (const ps::KVSlice& s : ps::SliceKVPairs(kvs, val_size, placement)) {
    keys += s.kvs.keys.size();
    vals += s.kvs.vals.size();
  }
  if (keys != kvs.keys.size() || vals != kvs.vals.size()) std::abort();
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 it parses; at
// thousands of inputs a second that is all the output and most of the time.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::FuzzMessage in = ps::fuzz::ParseFuzzInput(data, size);
  ps::StatusOr<ps::Message> msg = ps::Decode(in.header.data(), in.header.size(),
                                             in.frames, [](int) { return 0; });
  if (!msg.ok()) return 0;
  for (int val_type : {ps::pb::FLOAT, ps::pb::DOUBLE, ps::pb::INT32,
                       ps::pb::UINT64, ps::pb::INT8}) {
    size_t val_size = ps::DataTypeSize(val_type);
    for (bool with_vals : {true, false}) {
      ps::StatusOr<ps::detail::RawKVPairs> kvs =
          ps::DecodeKVPairs(msg.value(), with_vals, val_type, val_size);
      if (!kvs.ok()) continue;
      if (!ps::CheckKVPairs(kvs.value(), val_size, with_vals).ok()) {
        std::abort();
      }
      if (with_vals) CheckSlices(kvs.value(), val_size);
    }
  }
  return 0;
}
