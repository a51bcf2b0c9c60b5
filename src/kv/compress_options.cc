// The codecs' and the compression options' text (ps/compress.h): Codec and
// CompressOptions parsed from and written as "PUSH[,pull=PULL][,shared]".
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ps/compress.h"

namespace ps {

StatusOr<Codec> Codec::Parse(const std::string& text) {
  Codec c;
  const std::string accepted =
      "; accepted: none, fp16, bf16, onebit, topk:R, randomk:R (0 < R <= 1)";
  if (text == "none" || text.empty()) return c;
  if (text == "fp16") c.kind = kFp16;
  if (text == "bf16") c.kind = kBf16;
  if (text == "onebit") c.kind = kOneBit;
  if (c.kind != kNone) return c;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (colon == std::string::npos || (name != "topk" && name != "randomk")) {
    return Status::InvalidArgument("unknown codec '" + text + "'" + accepted);
  }
  const std::string r = text.substr(colon + 1);
  char* end = nullptr;
  c.ratio = std::strtod(r.c_str(), &end);
  if (r.empty() || end != r.c_str() + r.size() || !(c.ratio > 0) ||
      c.ratio > 1) {
    return Status::InvalidArgument("codec '" + text + "': ratio '" + r +
                                   "' is not in (0, 1]");
  }
  c.kind = name == "topk" ? kTopK : kRandomK;
  return c;
}

std::string Codec::ToString() const {
  auto ratio_text = [this] {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", ratio);
    return std::string(buf);
  };
  switch (kind) {
    case kNone:
      return "none";
    case kFp16:
      return "fp16";
    case kBf16:
      return "bf16";
    case kTopK:
      return "topk:" + ratio_text();
    case kRandomK:
      return "randomk:" + ratio_text();
    case kOneBit:
      return "onebit";
  }
  return "?";
}

StatusOr<CompressOptions> CompressOptions::Parse(const std::string& text) {
  CompressOptions o;
  size_t begin = 0;
  bool first = true;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(begin, comma - begin);
    begin = comma + 1;
    if (item.rfind("pull=", 0) == 0) {
      StatusOr<Codec> c = Codec::Parse(item.substr(5));
      if (!c.ok()) return c.status();
      o.pull = *c;
    } else if (item == "shared") {
      o.compress_shared = true;
    } else if (first) {
      StatusOr<Codec> c = Codec::Parse(item);
      if (!c.ok()) return c.status();
      o.push = *c;
    } else {
      return Status::InvalidArgument(
          "compression '" + text + "': unknown part '" + item +
          "' (accepted: CODEC[,pull=CODEC][,shared])");
    }
    first = false;
  }
  return o;
}

StatusOr<CompressOptions> CompressOptions::FromEnv() {
  const char* v = std::getenv("PS_COMPRESS");
  if (v == nullptr) return CompressOptions();
  StatusOr<CompressOptions> o = Parse(v);
  if (!o.ok()) {
    return Status::InvalidArgument(std::string("PS_COMPRESS='") + v +
                                   "': " + o.status().message());
  }
  return o;
}

bool CompressOptions::any() const {
  if (push.kind != Codec::kNone || pull.kind != Codec::kNone) return true;
  for (const RangeCodec& r : push_ranges) {
    if (r.push.kind != Codec::kNone) return true;
  }
  return false;
}

std::string CompressOptions::ToString() const {
  std::string s = push.ToString();
  if (pull.kind != Codec::kNone) s += ",pull=" + pull.ToString();
  if (compress_shared) s += ",shared";
  return s;
}

}  // namespace ps
