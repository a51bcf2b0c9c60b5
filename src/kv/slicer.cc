// KV checks, slicing and frame layout.
#include "kv/slicer.h"

#include <string>

namespace ps {

Status CheckKVPairs(const detail::RawKVPairs& kvs, size_t val_size,
                    bool with_vals, bool keys_known) {
  size_t n = kvs.keys.size();
  for (size_t i = keys_known ? n : 1; i < n; ++i) {
    if (kvs.keys[i] <= kvs.keys[i - 1]) {
      return Status::InvalidArgument(
          "keys must be sorted ascending and unique: key[" +
          std::to_string(i - 1) + "]=" + std::to_string(kvs.keys[i - 1]) +
          ", key[" + std::to_string(i) + "]=" + std::to_string(kvs.keys[i]));
    }
  }
  if (!with_vals) return Status::OK();
  if (kvs.vals.size() % val_size != 0) {
    return Status::InvalidArgument(
        std::to_string(kvs.vals.size()) + " value bytes are not a whole " +
        "number of " + std::to_string(val_size) + "-byte values");
  }
  size_t count = kvs.vals.size() / val_size;
  if (!kvs.lens.empty()) {
    if (kvs.lens.size() != n) {
      return Status::InvalidArgument(std::to_string(kvs.lens.size()) +
                                     " lens for " + std::to_string(n) +
                                     " keys");
    }
    size_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if (kvs.lens[i] < 0) {
        return Status::InvalidArgument("lens[" + std::to_string(i) +
                                       "]=" + std::to_string(kvs.lens[i]) +
                                       " is negative");
      }
      sum += static_cast<size_t>(kvs.lens[i]);
    }
    if (sum != count) {
      return Status::InvalidArgument("lens sum to " + std::to_string(sum) +
                                     " but there are " + std::to_string(count) +
                                     " values");
    }
  } else if ((n == 0 && count != 0) || (n != 0 && count % n != 0)) {
    return Status::InvalidArgument(std::to_string(count) +
                                   " values do not divide evenly over " +
                                   std::to_string(n) + " keys");
  }
  return Status::OK();
}

std::vector<KVSlice> SliceKVPairs(const detail::RawKVPairs& kvs,
                                  size_t val_size, const Placement& placement) {
  size_t n = kvs.keys.size();
  std::vector<size_t> cut = placement.Slice(kvs.keys.data(), n);
  // Value offsets (in bytes) at each cut.
  std::vector<size_t> off(cut.size(), 0);
  if (!kvs.lens.empty()) {
    size_t acc = 0, i = 0;
    for (size_t s = 0; s < cut.size(); ++s) {
      for (; i < cut[s]; ++i) acc += static_cast<size_t>(kvs.lens[i]);
      off[s] = acc * val_size;
    }
  } else {
    size_t per_key = n == 0 ? 0 : kvs.vals.size() / n;  // bytes per key
    for (size_t s = 0; s < cut.size(); ++s) off[s] = cut[s] * per_key;
  }
  std::vector<KVSlice> slices(placement.num_servers());
  for (int s = 0; s < placement.num_servers(); ++s) {
    KVSlice& slice = slices[s];
    slice.touched = cut[s + 1] > cut[s];
    if (!slice.touched) continue;
    slice.kvs.keys = kvs.keys.segment(cut[s], cut[s + 1]);
    if (!kvs.vals.empty())
      slice.kvs.vals = kvs.vals.segment(off[s], off[s + 1]);
    if (!kvs.lens.empty())
      slice.kvs.lens = kvs.lens.segment(cut[s], cut[s + 1]);
    slice.kvs.priority = kvs.priority;
  }
  return slices;
}

void AddKVFrames(const detail::RawKVPairs& kvs, bool with_vals, int val_type,
                 Message* msg, bool keys_asked) {
  if (keys_asked) {
    msg->meta.set_keys_asked(true);
  } else {
    msg->AddData(SArray<char>(kvs.keys), pb::UINT64);
  }
  if (with_vals) msg->AddData(kvs.vals, static_cast<pb::DataType>(val_type));
  if (!kvs.lens.empty()) msg->AddData(SArray<char>(kvs.lens), pb::INT32);
  msg->meta.set_val_type(val_type);
  msg->meta.set_priority(kvs.priority);
}

Message ReplicaCopy(const KVMeta& req, const detail::RawKVPairs& kvs,
                    int val_type, int rank, int replica) {
  Message copy;
  pb::Meta& m = copy.meta;
  m.set_app_id(req.app_id);
  m.set_customer_id(req.customer_id);
  m.set_timestamp(req.timestamp);
  m.set_request(true);
  m.set_push(true);
  m.set_head(req.cmd);
  m.set_priority(req.priority);
  m.set_recver(replica);
  m.set_shard(rank);
  m.set_origin(req.sender);
  detail::RawKVPairs own;
  own.keys.CopyFrom(kvs.keys);
  own.vals.CopyFrom(kvs.vals);
  own.lens.CopyFrom(kvs.lens);
  own.priority = kvs.priority;
  AddKVFrames(own, true, val_type, &copy);
  return copy;
}

StatusOr<detail::RawKVPairs> DecodeKVPairs(const Message& msg, bool with_vals,
                                           int val_type, size_t val_size,
                                           const SArray<Key>* asked) {
  const bool keys_asked = msg.meta.keys_asked();
  if (keys_asked && asked == nullptr) {
    return Status::Corruption("keys_asked where no keys were asked");
  }
  const size_t keys_frames = keys_asked ? 0 : 1;
  size_t want = keys_frames + (with_vals ? 1 : 0);
  size_t got = msg.data.size();
  if (got != want && got != want + 1) {
    return Status::Corruption("expected " + std::to_string(want) + " or " +
                              std::to_string(want + 1) + " data frames, got " +
                              std::to_string(got));
  }
  detail::RawKVPairs kvs;
  if (keys_asked) {
    kvs.keys = *asked;
  } else if (msg.meta.data_type(0) != pb::UINT64) {
    return Status::Corruption("keys frame has data type " +
                              std::to_string(msg.meta.data_type(0)));
  } else {
    kvs.keys = SArray<Key>(msg.data[0]);
  }
  if (with_vals) {
    const size_t v = keys_frames;
    if (msg.meta.data_type(v) != val_type) {
      return Status::Corruption(
          "values of data type " + std::to_string(msg.meta.data_type(v)) +
          " where " + std::to_string(val_type) + " is expected");
    }
    kvs.vals = msg.data[v];
  }
  if (got == want + 1) {
    if (msg.meta.data_type(want) != pb::INT32) {
      return Status::Corruption("lens frame has data type " +
                                std::to_string(msg.meta.data_type(want)));
    }
    kvs.lens = SArray<int>(msg.data[want]);
  }
  kvs.priority = msg.meta.priority();
  Status st = CheckKVPairs(kvs, val_size, with_vals, keys_asked);
  if (!st.ok()) return Status::Corruption(st.message());
  return kvs;
}

}  // namespace ps
