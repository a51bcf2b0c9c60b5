// Writes the seed corpora of the fuzz targets: real messages as the library
// frames them (controls as the postoffice fills them, KV requests and
// responses through SliceKVPairs + AddKVFrames), encoded with EncodeHeader,
// in the layout of fuzz_input.h. Run from the checkout:
//   build-fuzz/tests/fuzz/fuzz_seeds tests/fuzz/corpus
// writes corpus/fuzz_decode/* (every message), corpus/fuzz_kv_pairs/* (the
// data messages), corpus/fuzz_open/* (each sealed) and corpus/fuzz_codecs/*
// (a segment of each codec as its encoder writes it, and values to round
// trip).
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "kv/codecs.h"
#include "kv/slicer.h"
#include "van/codec.h"
#include "van/seal.h"

namespace ps {
namespace {

struct Seed {
  std::string name;
  Message msg;
  bool data;  // a KV message (also a seed of fuzz_kv_pairs)
};

pb::NodeInfo Node(pb::NodeRole role, int id, int rank, int port) {
  pb::NodeInfo n;
  n.set_role(role);
  n.set_id(id);
  n.set_rank(rank);
  n.set_host("127.0.0.1");
  n.set_port(port);
  n.set_requested_rank(-1);
  return n;
}

Message Control(pb::Command cmd, int sender, int recver, bool request) {
  Message m;
  m.meta.mutable_control()->set_cmd(cmd);
  m.meta.set_sender(sender);
  m.meta.set_recver(recver);
  m.meta.set_request(request);
  return m;
}

void AddControls(std::vector<Seed>* seeds) {
  Message hello = Control(pb::ADD_NODE, 0, 1, true);
  pb::NodeInfo me = Node(pb::WORKER, 0, -1, 40001);
  me.set_shm_domain("host-a");
  me.mutable_shm_probe()->set_pid(1234);
  me.mutable_shm_probe()->set_region(1);
  me.mutable_shm_probe()->set_region_bytes(4096);
  *hello.meta.mutable_control()->add_node() = me;
  seeds->push_back({"add_node_request", hello, false});

  Message table = Control(pb::ADD_NODE, 1, 9, false);
  *table.meta.mutable_control()->add_node() = Node(pb::SCHEDULER, 1, 0, 40000);
  *table.meta.mutable_control()->add_node() = Node(pb::SERVER, 8, 0, 40002);
  *table.meta.mutable_control()->add_node() = Node(pb::SERVER, 10, 1, 40003);
  *table.meta.mutable_control()->add_node() = Node(pb::WORKER, 9, 0, 40004);
  *table.meta.mutable_control()->add_node() = Node(pb::WORKER, 11, 1, 40005);
  seeds->push_back({"add_node_response", table, false});

  Message reject = Control(pb::ADD_NODE, 1, 0, false);
  reject.meta.mutable_control()->set_error("rank 0 requested twice");
  reject.meta.mutable_control()->set_error_code(3);
  seeds->push_back({"add_node_rejected", reject, false});

  Message barrier = Control(pb::BARRIER, 9, 1, true);
  barrier.meta.mutable_control()->set_barrier_group(7);
  seeds->push_back({"barrier_request", barrier, false});
  Message released = Control(pb::BARRIER, 1, 9, false);
  released.meta.mutable_control()->set_barrier_group(7);
  seeds->push_back({"barrier_response", released, false});
  Message failed_barrier = released;
  failed_barrier.meta.mutable_control()->set_error("server 0 died");
  failed_barrier.meta.mutable_control()->set_error_code(8);
  seeds->push_back({"barrier_failed", failed_barrier, false});

  seeds->push_back({"heartbeat", Control(pb::HEARTBEAT, 9, 1, true), false});
  seeds->push_back(
      {"heartbeat_answer", Control(pb::HEARTBEAT, 1, 9, false), false});
  seeds->push_back({"terminate", Control(pb::TERMINATE, 9, 1, true), false});
  seeds->push_back({"ack", Control(pb::ACK, 1, 9, false), false});

  Message dead = Control(pb::NODE_FAILED, 1, 9, false);
  *dead.meta.mutable_control()->add_node() = Node(pb::SERVER, 8, 0, 40002);
  dead.meta.mutable_control()->set_error("no heartbeat for 2000 ms");
  seeds->push_back({"node_failed", dead, false});
  seeds->push_back({"shm_ready", Control(pb::SHM_READY, 8, 9, true), false});

  // Restarts: a worker's successor announced to the members, their answer,
  // the table it gets (with the nodes dead by then), and a member's report
  // to a restarted scheduler.
  Message joined = Control(pb::NODE_JOINED, 1, 8, true);
  *joined.meta.mutable_control()->add_node() = Node(pb::WORKER, 11, 1, 40009);
  seeds->push_back({"node_joined", joined, false});
  Message joined_answer = Control(pb::NODE_JOINED, 8, 1, false);
  *joined_answer.meta.mutable_control()->add_node() =
      Node(pb::WORKER, 11, 1, 40009);
  seeds->push_back({"node_joined_answer", joined_answer, false});
  Message rejoin_table = table;
  rejoin_table.meta.mutable_control()->set_rejoin(true);
  rejoin_table.meta.mutable_control()->add_dead(10);
  seeds->push_back({"add_node_rejoin", rejoin_table, false});
  Message report = Control(pb::ADD_NODE, 9, 1, true);
  *report.meta.mutable_control()->add_node() = Node(pb::WORKER, 9, 0, 40004);
  report.meta.mutable_control()->set_rejoin(true);
  report.meta.mutable_control()->set_num_servers(2);
  report.meta.mutable_control()->set_num_workers(2);
  seeds->push_back({"member_report", report, false});
}

// A KV request from worker 9 as KVWorkerCore frames it, sliced for two
// servers (the slice of server `s`).
Message Request(const detail::RawKVPairs& kvs, bool push, bool pull,
                int val_type, int s, int ts) {
  size_t val_size = DataTypeSize(val_type);
  std::vector<KVSlice> slices =
      SliceKVPairs(kvs, val_size, Placement::EvenKeys(2, 1000));
  Message m;
  m.meta.set_app_id(0);
  m.meta.set_customer_id(0);
  m.meta.set_timestamp(ts);
  m.meta.set_request(true);
  m.meta.set_push(push);
  m.meta.set_pull(pull);
  m.meta.set_sender(9);
  m.meta.set_recver(8 + 2 * s);
  AddKVFrames(slices[s].kvs, push, val_type, &m);
  return m;
}

// The server's answer to a pull: same keys, values (+ lens).
Message Response(const detail::RawKVPairs& kvs, int val_type, int ts) {
  Message m;
  m.meta.set_timestamp(ts);
  m.meta.set_request(false);
  m.meta.set_pull(true);
  m.meta.set_sender(8);
  m.meta.set_recver(9);
  AddKVFrames(kvs, true, val_type, &m);
  return m;
}

template <typename V>
detail::RawKVPairs Pairs(std::vector<Key> keys, size_t per_key,
                         std::vector<int> lens = {}) {
  detail::RawKVPairs kvs;
  kvs.keys = SArray<Key>(keys);
  size_t count = per_key * keys.size();
  if (!lens.empty()) {
    count = 0;
    for (int l : lens) count += static_cast<size_t>(l);
    kvs.lens = SArray<int>(lens);
  }
  SArray<V> vals(count);
  for (size_t i = 0; i < count; ++i) vals[i] = static_cast<V>(i + 1);
  kvs.vals = SArray<char>(vals);
  return kvs;
}

void AddData(std::vector<Seed>* seeds) {
  struct Case {
    const char* name;
    int val_type;
    detail::RawKVPairs kvs;
  };
  std::vector<Case> cases = {
      {"float_uniform", pb::FLOAT, Pairs<float>({1, 3, 700, 999}, 2)},
      {"float_lens", pb::FLOAT, Pairs<float>({2, 5, 600}, 0, {1, 0, 3})},
      {"double_uniform", pb::DOUBLE, Pairs<double>({4, 800}, 1)},
      {"int32_lens", pb::INT32, Pairs<int32_t>({10, 11, 900}, 0, {2, 1, 2})},
      {"uint64_uniform", pb::UINT64, Pairs<uint64_t>({0, 999}, 1)},
      {"int8_uniform", pb::INT8, Pairs<int8_t>({6, 7, 501}, 3)},
  };
  int ts = 0;
  for (const Case& c : cases) {
    std::string n = c.name;
    for (int s = 0; s < 2; ++s) {
      std::string side = "_server" + std::to_string(s);
      seeds->push_back({"push_" + n + side,
                        Request(c.kvs, true, false, c.val_type, s, ++ts),
                        true});
      seeds->push_back({"pull_" + n + side,
                        Request(c.kvs, false, true, c.val_type, s, ++ts),
                        true});
    }
    seeds->push_back({"pushpull_" + n,
                      Request(c.kvs, true, true, c.val_type, 0, ++ts), true});
    seeds->push_back(
        {"pull_answer_" + n, Response(c.kvs, c.val_type, ++ts), true});
  }
  // A push answer (no frames), and an empty request.
  Message ack;
  ack.meta.set_push(true);
  ack.meta.set_sender(8);
  ack.meta.set_recver(9);
  ack.meta.set_timestamp(++ts);
  seeds->push_back({"push_answer", ack, true});
  seeds->push_back(
      {"empty_push",
       Request(Pairs<float>({}, 0), true, false, pb::FLOAT, 0, ++ts), true});

  // Values sent by reference, and a pull naming where the answer goes: the
  // targets allow no shared memory, so these exercise the refusals.
  Message shared = Request(cases[0].kvs, true, false, pb::FLOAT, 0, ++ts);
  pb::SharedRef* ref = shared.meta.add_shared();
  ref->set_frame(1);
  ref->set_pid(4321);
  ref->set_region(2);
  ref->set_fd(5);
  ref->set_region_bytes(1 << 20);
  ref->set_offset(4096);
  ref->set_nonce(0x5eed);
  shared.data[1] = SArray<char>();  // the bytes stay in the region
  seeds->push_back({"push_shared_ref", shared, true});
  Message into = Request(cases[0].kvs, false, true, pb::FLOAT, 0, ++ts);
  *into.meta.mutable_reply_into() = *ref;
  into.meta.mutable_reply_into()->set_bytes(16);
  seeds->push_back({"pull_reply_into", into, true});
}

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

// fuzz_codecs: per codec, n values (signed, some equal, a zero, growing
// magnitudes) encoded (decode-<codec>-<n>), and the same values to round
// trip (trip-<codec>-<n>); 3000 values reach topk's sampled threshold.
int WriteCodecSeeds(const std::string& dir) {
  struct Case {
    const char* name;
    Codec::Kind kind;
    uint8_t ratio;  // (ratio + 1) / 256
  };
  const Case cases[] = {
      {"none", Codec::kNone, 0},        {"fp16", Codec::kFp16, 0},
      {"bf16", Codec::kBf16, 0},        {"topk", Codec::kTopK, 2},
      {"randomk", Codec::kRandomK, 63}, {"onebit", Codec::kOneBit, 0},
  };
  int written = 0;
  for (const Case& c : cases) {
    for (size_t n : {size_t{9}, size_t{3000}}) {
      std::vector<float> v(n);
      for (size_t j = 0; j < n; ++j) {
        v[j] = static_cast<float>(j % 7 == 3 ? 0.0 : (j % 5) * 0.37 + j / 64.0);
        if (j % 3 == 1) v[j] = -v[j];
      }
      fuzz::CodecInput in;
      in.kind = c.kind;
      in.count = n;
      in.ratio = c.ratio;
      in.seed = 7;
      Codec codec;
      codec.kind = c.kind;
      codec.ratio = (c.ratio + 1) / 256.0;
      std::string seg(SegmentBytes(codec, n), '\0');
      std::vector<float> r = v;
      std::mt19937_64 rng(in.seed);
      SegmentScratch scratch;
      char* p = &seg[0];
      PutSegment(codec, v.data(), r.data(), n, &rng, &scratch, &p);
      const std::string suffix = std::string(c.name) + "-" + std::to_string(n);
      in.mode = 0;
      in.rest = seg;
      if (!WriteFile(dir + "/fuzz_codecs/decode-" + suffix,
                     fuzz::SerializeCodecInput(in))) {
        return -1;
      }
      in.mode = 1;
      in.rest.assign(reinterpret_cast<const char*>(v.data()), 4 * n);
      if (!WriteFile(dir + "/fuzz_codecs/trip-" + suffix,
                     fuzz::SerializeCodecInput(in))) {
        return -1;
      }
      written += 2;
    }
  }
  return written;
}

int WriteSeeds(const std::string& dir) {
  std::vector<Seed> seeds;
  AddControls(&seeds);
  AddData(&seeds);
  int written = 0;
  for (Seed& s : seeds) {
    std::string header = EncodeHeader(&s.msg);
    if (s.name == "push_shared_ref") {
      // EncodeHeader sized frame 1 as sent (empty); the reference stands for
      // the 16 bytes it names.
      s.msg.meta.set_data_size(1, 16);
      header = s.msg.meta.SerializeAsString();
    }
    std::string bytes = fuzz::SerializeFuzzInput(header, s.msg.data);
    for (const char* target : {"fuzz_decode", "fuzz_kv_pairs"}) {
      if (std::string(target) == "fuzz_kv_pairs" && !s.data) continue;
      if (!WriteFile(dir + "/" + target + "/" + s.name, bytes)) return 1;
      ++written;
    }
    // fuzz_open: the same message sealed, as a job with a key sends it.
    seal::Sealer sealer(fuzz::kFuzzSealKey);
    std::vector<std::string> plain = {header};
    for (const SArray<char>& f : s.msg.data)
      plain.emplace_back(f.data(), f.size());
    const auto frames = static_cast<uint32_t>(plain.size());
    size_t chunks = 0;
    for (const std::string& p : plain) chunks += seal::Chunks(p.size());
    uint64_t seq = sealer.Begin(chunks);
    std::vector<SArray<char>> sealed;
    for (uint32_t i = 0; i < frames; ++i) {
      SArray<char> out(seal::SealedBytes(plain[i].size()));
      sealer.Seal(seq, i, frames, plain[i].data(), plain[i].size(), out.data());
      seq += seal::Chunks(plain[i].size());
      sealed.push_back(out);
    }
    std::string sealed_header(sealed[0].data(), sealed[0].size());
    sealed.erase(sealed.begin());
    const std::string path = dir + "/fuzz_open/" + s.name;
    if (!WriteFile(path, fuzz::SerializeFuzzInput(sealed_header, sealed))) {
      return 1;
    }
    ++written;
    if (frames == 1) continue;
    // And streamed, as a van sends a message of seal::kStreamBytes or more:
    // the header sealed alone, then each data frame's chunks as records.
    seal::Sealer streamer(fuzz::kFuzzSealKey);
    seq = streamer.Begin(chunks);
    std::string streamed_header(seal::SealedBytes(header.size()), '\0');
    streamer.Seal(seq, 0, 1, header.data(), header.size(), &streamed_header[0]);
    seq += seal::Chunks(header.size());
    std::vector<SArray<char>> records;
    for (uint32_t i = 1; i < frames; ++i) {
      const auto n = static_cast<uint32_t>(seal::Chunks(plain[i].size()));
      for (uint32_t c = 0; c < n; ++c) {
        const size_t bytes = seal::ChunkBytes(plain[i].size(), c);
        SArray<char> record(seal::kSeqBytes + bytes + seal::kTagBytes);
        streamer.SealChunk(seq++, i, frames, c, n,
                           plain[i].data() + c * seal::kChunkBytes, bytes,
                           record.data());
        records.push_back(record);
      }
    }
    if (!WriteFile(path + "_streamed",
                   fuzz::SerializeFuzzInput(streamed_header, records))) {
      return 1;
    }
    ++written;
  }
  const int codec_seeds = WriteCodecSeeds(dir);
  if (codec_seeds < 0) return 1;
  written += codec_seeds;
  std::printf("fuzz_seeds: wrote %d files under %s\n", written, dir.c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  return ps::WriteSeeds(argv[1]);
}
