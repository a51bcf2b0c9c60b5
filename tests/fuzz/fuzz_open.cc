// libFuzzer target: the receive path of a job with a key, on any bytes: the
// sealing token (seal::JobKey::AcceptHello), then the frames opened in place
// (seal::Opener::Open) and, if they open, decoded (ps::Decode); and the same
// bytes as a streamed message: the header opened alone, its plan
// (ps::StreamedFrames, every message with data streamed), then each frame a
// record (seal::Opener::OpenChunk) opened into the frames it plans, and
// decoded. None may abort or read out of bounds; an opened frame lies within
// its sealed bytes. The seeds (fuzz_seeds) are real messages sealed with
// kFuzzSealKey, whole and streamed. The same bytes are also a session's
// HELLO (seal::JobKey::AcceptOffer) and a script for the sender's stream
// state (DriveStream), checked against a model of what it must keep.
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "van/codec.h"
#include "van/seal.h"
#include "van/stream.h"

namespace {

// `in` as a streamed message: its header alone, then its frames as the
// records of the data frames its header plans.
void OpenStreamed(ps::fuzz::FuzzMessage* in) {
  ps::seal::Opener opener(ps::fuzz::kFuzzSealKey);
  ps::seal::Opener::Frame header = {&in->header[0], in->header.size()};
  if (!opener.Open(&header, 1).ok()) return;
  ps::pb::Meta meta;
  if (!meta.ParseFromArray(header.data, static_cast<int>(header.bytes))) return;
  ps::StatusOr<std::vector<size_t>> plan =
      ps::StreamedFrames(meta, 0, 15, size_t{1} << 24);
  if (!plan.ok() || plan->empty()) return;
  const auto frames = static_cast<uint32_t>(plan->size() + 1);
  std::vector<ps::SArray<char>> opened;
  size_t record = 0;
  for (uint32_t i = 0; i < plan->size(); ++i) {
    ps::SArray<char> frame((*plan)[i]);
    const auto chunks = static_cast<uint32_t>(ps::seal::Chunks(frame.size()));
    for (uint32_t c = 0; c < chunks; ++c, ++record) {
      if (record >= in->frames.size()) return;
      ps::SArray<char>& r = in->frames[record];
      const size_t bytes = ps::seal::ChunkBytes(frame.size(), c);
      if (!opener.OpenChunk(r.data(), r.size(), i + 1, frames, c, chunks, bytes)
               .ok()) {
        return;
      }
      if (bytes > 0) {
        std::memcpy(frame.data() + c * ps::seal::kChunkBytes,
                    r.data() + ps::seal::kSeqBytes, bytes);
      }
    }
    opened.push_back(frame);
  }
  (void)ps::Decode(std::move(meta), opened, nullptr);
}

// The sender's stream state (van/stream.h) driven by the input's bytes, as
// a hostile receiver could answer: messages added and sent, ACKs, RESETs
// and WELCOMEs quoting any session and number, ticks. Checked against a
// model: a WELCOME leaves exactly the messages not sent at or below its
// number in the session it quotes (all sent ones for no quote), in the
// order they were added; nothing else is ever let go but by an ACK of the
// current session.
void DriveStream(const uint8_t* data, size_t size) {
  using Clock = ps::OutStream::Clock;
  struct Model {
    int id;
    std::vector<std::pair<std::string, uint64_t>> sent;
  };
  ps::OutStream out;
  std::vector<Model> model;
  Clock::time_point now{};
  int next_id = 0, session = 0;
  uint64_t seq = 1;
  auto name = [](int s) { return "s" + std::to_string(s); };
  out.Offer(name(session), now);
  auto check = [&] {
    if (out.size() != model.size()) std::abort();
  };
  for (size_t i = 0; i + 1 < size && i < 512; i += 2) {
    const uint8_t op = data[i] % 6, arg = data[i + 1];
    now += std::chrono::milliseconds(arg * 20);
    if (op == 0) {  // a message added, sent now if the session is open
      ps::OutStream::Item* item =
          out.Add({std::to_string(next_id), ps::Message(), {}, {}});
      model.push_back({next_id++, {}});
      if (out.state() == ps::OutStream::State::kOpen) {
        out.Sent(item, seq, now);
        model.back().sent.emplace_back(name(session), seq++);
      }
    } else if (op == 1 && out.state() == ps::OutStream::State::kOpen) {
      const uint64_t taken = arg % (seq + 1);
      out.Ack(taken, now);
      while (!model.empty() && !model.front().sent.empty() &&
             model.front().sent.back().first == name(session) &&
             model.front().sent.back().second <= taken) {
        model.erase(model.begin());
      }
    } else if (op == 2) {  // a new session offered
      out.Offer(name(++session), now);
      seq = 1;
    } else if (op == 3 && out.state() == ps::OutStream::State::kOffering) {
      const std::string quoted = arg & 1 ? name(arg / 2 % (session + 1)) : "";
      const uint64_t taken = arg / 4;
      size_t lost = 0;
      std::vector<ps::OutStream::Item*> again =
          out.Welcome(quoted, taken, now, &lost);
      std::vector<Model> kept;
      for (const Model& m : model) {
        bool settled = quoted.empty() ? !m.sent.empty() : false;
        for (const auto& s : m.sent) {
          if (!quoted.empty() && s.first == quoted && s.second <= taken) {
            settled = true;
          }
        }
        if (!settled) kept.push_back(m);
      }
      model = kept;
      if (again.size() != model.size()) std::abort();
      for (size_t k = 0; k < again.size(); ++k) {
        if (again[k]->header != std::to_string(model[k].id)) std::abort();
        out.Sent(again[k], seq, now);
        model[k].sent.emplace_back(name(session), seq++);
      }
    } else if (op == 4) {
      (void)out.Tick(now);
    }
    check();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ps::seal::JobKey job(std::string(ps::seal::kKeyBytes, 'j'));
  static const ps::seal::KeyPair own = ps::seal::JobKey::NewKeyPair();
  ps::fuzz::FuzzMessage in = ps::fuzz::ParseFuzzInput(data, size);
  (void)job.AcceptHello(own, in.header.substr(0, 2 * ps::seal::kKeyBytes));
  (void)job.AcceptOffer(own, in.header.substr(0, ps::seal::kHelloBytes));
  DriveStream(data, size);
  ps::fuzz::FuzzMessage streamed = in;
  OpenStreamed(&streamed);

  ps::seal::Opener opener(ps::fuzz::kFuzzSealKey);
  std::vector<ps::seal::Opener::Frame> frames;
  frames.push_back({&in.header[0], in.header.size()});
  for (ps::SArray<char>& f : in.frames) frames.push_back({f.data(), f.size()});
  std::vector<ps::seal::Opener::Frame> sealed = frames;
  if (!opener.Open(frames.data(), frames.size()).ok()) return 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].data < sealed[i].data ||
        frames[i].data + frames[i].bytes > sealed[i].data + sealed[i].bytes) {
      std::abort();
    }
  }
  std::vector<ps::SArray<char>> opened;
  for (size_t i = 1; i < frames.size(); ++i) {
    ps::SArray<char> f(frames[i].bytes);
    if (f.size() > 0) std::memcpy(f.data(), frames[i].data, f.size());
    opened.push_back(f);
  }
  (void)ps::Decode(frames[0].data, frames[0].bytes, opened, nullptr);
  return 0;
}
