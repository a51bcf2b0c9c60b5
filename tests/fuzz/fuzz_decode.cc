// libFuzzer target: ps::Decode (src/van/codec.h) on any header and frames.
// Decode must never abort or read out of bounds; a message it accepts must
// satisfy what the rest of the library relies on (one type and size per
// frame, sizes a whole number of elements, each frame aligned for its type).
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdlib>
#include <functional>

#include "fuzz_input.h"
#include "van/codec.h"

namespace {

void CheckAccepted(const ps::Message& msg) {
  const ps::pb::Meta& m = msg.meta;
  if (static_cast<size_t>(m.data_type_size()) != msg.data.size() ||
      static_cast<size_t>(m.data_size_size()) != msg.data.size()) {
    std::abort();
  }
  for (size_t i = 0; i < msg.data.size(); ++i) {
    size_t type_size = ps::DataTypeSize(m.data_type(static_cast<int>(i)));
    const ps::SArray<char>& f = msg.data[i];
    if (type_size == 0 || f.size() != m.data_size(static_cast<int>(i)) ||
        f.size() % type_size != 0 ||
        reinterpret_cast<uintptr_t>(f.data()) % type_size != 0) {
      std::abort();
    }
  }
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
  // No function, and one that allows no shared memory: both must refuse
  // every shared reference without touching /proc.
  auto no_pid = [](int) { return 0; };
  for (const std::function<int(int)>& shared_pid :
       {std::function<int(int)>(), std::function<int(int)>(no_pid)}) {
    ps::StatusOr<ps::Message> msg =
        ps::Decode(in.header.data(), in.header.size(), in.frames, shared_pid);
    if (msg.ok()) CheckAccepted(msg.value());
  }
  return 0;
}
