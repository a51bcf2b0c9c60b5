// A Compressor's state (compress_state.h): its changes per key, on a
// server (claims, the views answered from) and on a worker (residuals, the
// views answers apply to), and the residuals as checkpoint bytes.
//
// The checkpoint form: uint64 count of keys, then per key in key order
// (uint64 key, uint64 n, n floats), little-endian.
#include "kv/compress_state.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ps {

bool Compressor::Feedback::TakeClaims(const Id3& request, Claims* claimed) {
  auto it = claims.find(request);
  if (it == claims.end()) return false;
  *claimed = std::move(it->second);
  claims.erase(it);
  return true;
}

void Compressor::Feedback::StoreClaims(const Id3& request, Claims claimed) {
  while (claims.size() >= kMaxClaims) claims.erase(claims.begin());
  claims[request] = std::move(claimed);
}

// A delta pull: what changed since the worker's view, with that view's
// error feedback (what is not sent stays in weights - view); the view then
// moves by exactly what the worker will add. Whole values (raw) replace it.
void Compressor::Feedback::PutAnswer(const Id3& view_id, const KeyCodec& kc,
                                     const float* v, size_t len,
                                     Scratch* scratch, char** p) {
  View& w = peer_views[view_id];
  const uint64_t base = kc.delta ? w.version : 0;
  char* at = *p;
  if (kc.delta) {
    std::vector<float>& r = scratch->delta;
    r.resize(len);
    for (size_t j = 0; j < len; ++j) r[j] = v[j] - w.values[j];
    PutSegment(kc.codec, v, r.data(), len, &rng, &scratch->segment, p);
    scratch->sent.resize(len);
    Reader back(at, static_cast<size_t>(*p - at));
    CHECK(GetSegment(kc.codec.kind, len, &back, scratch->sent.data()).ok());
    for (size_t j = 0; j < len; ++j) w.values[j] += scratch->sent[j];
  } else {
    PutSegment(kc.codec, v, nullptr, len, &rng, &scratch->segment, p);
    w.values.assign(v, v + len);
    // A view of non-finite values is never built on: whole next time.
    if (!std::all_of(v, v + len, [](float x) { return std::isfinite(x); })) {
      w.values.clear();
    }
  }
  w.version = next_version++;
  ++(kc.delta ? pulls.delta_keys : pulls.whole_keys);
  Append<uint64_t>(&versions_out, base);
  Append<uint64_t>(&versions_out, w.version);
}

// Error feedback: the key's residual becomes what is to be sent
// (residual + v), and after the send what was not sent of it.
void Compressor::Feedback::PutPush(uint64_t key, const Codec& c, const float* v,
                                   size_t len, Scratch* scratch, char** p) {
  std::vector<float>& res = residual[key];
  if (res.size() != len) res.assign(len, 0.0f);
  for (size_t j = 0; j < len; ++j) res[j] += v[j];
  PutSegment(c, v, res.data(), len, &rng, &scratch->segment, p);
}

Status Compressor::Feedback::CheckDelta(
    uint64_t key, const std::pair<uint64_t, uint64_t>* versions, size_t len,
    const std::string& where) {
  auto it = versions == nullptr ? views.end() : views.find(key);
  if (it != views.end() && it->second.version == versions->first &&
      it->second.values.size() == len) {
    return Status::OK();
  }
  return Status::Corruption(
      "a delta from version " +
      (versions == nullptr ? "?" : std::to_string(versions->first)) +
      " of a view at version " +
      (it == views.end() ? "none" : std::to_string(it->second.version)) +
      where);
}

void Compressor::Feedback::ApplyAnswer(uint64_t key, bool delta, size_t len,
                                       uint64_t version, float* o) {
  View& view = views[key];
  if (delta) {
    for (size_t j = 0; j < len; ++j) view.values[j] += o[j];
    if (len > 0) std::memcpy(o, view.values.data(), 4 * len);
  } else {
    view.values.assign(o, o + len);
  }
  view.version = version;
}

std::string Compressor::SaveState() const {
  MutexLock lock(&feedback_->mu);
  std::string s;
  auto put = [&s](const void* p, size_t n) {
    s.append(static_cast<const char*>(p), n);
  };
  const uint64_t n = feedback_->residual.size();
  put(&n, 8);
  // In key order, so that the same state gives the same bytes.
  std::vector<uint64_t> keys;
  for (const auto& kv : feedback_->residual) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  for (uint64_t key : keys) {
    const std::vector<float>& r = feedback_->residual.at(key);
    const uint64_t len = r.size();
    put(&key, 8);
    put(&len, 8);
    put(r.data(), 4 * r.size());
  }
  return s;
}

Status Compressor::RestoreState(const std::string& state) {
  if (state.empty()) {  // nothing kept (a job that compressed nothing)
    MutexLock lock(&feedback_->mu);
    feedback_->residual.clear();
    return Status::OK();
  }
  Reader in(state.data(), state.size());
  uint64_t n;
  if (!in.Get(&n)) return Status::Corruption("compression state: too short");
  std::unordered_map<uint64_t, std::vector<float>> residual;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t key, len;
    if (!in.Get(&key) || !in.Get(&len) || len > in.left() / 4) {
      return Status::Corruption("compression state: entry " +
                                std::to_string(i) + " of " + std::to_string(n) +
                                " cut short");
    }
    std::vector<float>& r = residual[key];
    r.resize(len);
    if (len > 0) std::memcpy(r.data(), in.Take(4 * len), 4 * len);
  }
  if (in.left() != 0) {
    return Status::Corruption(
        "compression state: " + std::to_string(in.left()) + " bytes too many");
  }
  MutexLock lock(&feedback_->mu);
  feedback_->residual = std::move(residual);
  return Status::OK();
}

Compressor::PullCounts Compressor::pull_counts() const {
  MutexLock lock(&feedback_->mu);
  return feedback_->pulls;
}

std::vector<float> Compressor::Residual(uint64_t key) const {
  MutexLock lock(&feedback_->mu);
  auto it = feedback_->residual.find(key);
  return it == feedback_->residual.end() ? std::vector<float>() : it->second;
}

}  // namespace ps
