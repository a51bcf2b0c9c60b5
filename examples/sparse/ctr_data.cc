// The generator and the Criteo reader of sparse_ctr (ctr_data.h).
#include "ctr_data.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace ctr {

namespace {

// splitmix64's finalizer (Steele et al. 2014).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small counter-based stream of uniforms: each sample its own.
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix(state_ += 0x9e3779b97f4a7c15ull); }
  // In (0, 1).
  double Uniform() {
    return (static_cast<double>(Next() >> 11) + 0.5) / 9007199254740992.0;
  }

 private:
  uint64_t state_;
};

// A standard normal as a pure function of `h` (Box-Muller).
double NormalOf(uint64_t h) {
  Rng r(h);
  const double u1 = r.Uniform(), u2 = r.Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Criteo's (Kaggle display advertising) cardinalities of C1..C26 and the
// fraction of empty values of I1..I13, C1..C26, rounded.
constexpr uint64_t kCriteoVocab[kCategoricalFields] = {
    1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
    93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
    2173,  4,    7046547,  18,      15,  286181, 105,     142572};
constexpr double kCriteoMissing[kFields] = {
    0.45, 0.0,  0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04,
    0.45, 0.04, 0.77, 0.22,  // I1..I13
    0.0,  0.0,  0.03, 0.03, 0.0,  0.12, 0.0,  0.0, 0.0,
    0.03, 0.0,  0.03, 0.0,  0.0,  0.0,  0.03, 0.0, 0.0,
    0.44, 0.44, 0.03, 0.76, 0.0,  0.03, 0.44, 0.44};  // C1..C26

}  // namespace

uint64_t FeatureId(int field, uint64_t value) {
  return Mix(Mix(static_cast<uint64_t>(field) + 0x5ca1ab1eull) ^ value);
}

uint64_t BiasId() { return FeatureId(255, 0); }

uint64_t CountBucket(int64_t x) {
  if (x < 0) return 41;
  const uint64_t b =
      static_cast<uint64_t>(std::log2(1.0 + static_cast<double>(x)));
  return std::min<uint64_t>(b, 40);
}

Generator::Generator(const GeneratorOptions& options) : options_(options) {
  for (int f = 0; f < kCategoricalFields; ++f) {
    const double v =
        std::max(2.0, std::round(kCriteoVocab[f] * options.vocab_scale));
    vocab_.push_back(static_cast<uint64_t>(v));
    zipf_a_.push_back(options.zipf == 1.0
                          ? std::log(v + 1)
                          : std::pow(v + 1, 1 - options.zipf) - 1);
  }
  missing_.assign(kCriteoMissing, kCriteoMissing + kFields);
  // Counts: P(X > x) = (1 + x)^-a, a in [0.3, 1.5] by field.
  for (int f = 0; f < kCountFields; ++f) tail_.push_back(0.3 + 0.1 * f);
}

void Generator::Draw(uint64_t stream, uint64_t index, Samples* out) const {
  Rng rng(Mix(Mix(options_.seed ^ Mix(stream)) + index));
  const uint64_t weight_seed = Mix(options_.seed + 0x77);
  double logit = options_.bias;
  for (int f = 0; f < kFields; ++f) {
    const bool missing = rng.Uniform() < missing_[f];
    const double u = rng.Uniform();
    uint64_t value;
    bool planted;  // whether the id has a non-zero weight
    if (missing) {
      value = kMissing;
      planted = true;
    } else if (f < kCountFields) {
      const double x = std::floor(std::pow(u, -1.0 / tail_[f]) - 1);
      value = CountBucket(static_cast<int64_t>(std::min(x, 1e15)));
      planted = true;
    } else {
      const int c = f - kCountFields;
      const double s = options_.zipf, a = zipf_a_[c];
      // The continuous Zipf's inverse CDF on [1, V + 1).
      const double x =
          s == 1.0 ? std::exp(u * a) : std::pow(1 + u * a, 1 / (1 - s));
      value = std::clamp<uint64_t>(static_cast<uint64_t>(x), 1, vocab_[c]);
      planted = value <= static_cast<uint64_t>(options_.head);
    }
    const uint64_t id = FeatureId(f, value);
    out->ids.push_back(id);
    if (planted) logit += options_.weight_scale * NormalOf(id ^ weight_seed);
  }
  const double p = 1 / (1 + std::exp(-logit));
  out->labels.push_back(rng.Uniform() < p ? 1.0f : 0.0f);
  out->logit.push_back(static_cast<float>(logit));
}

CriteoReader::~CriteoReader() {
  if (file_ != nullptr) std::fclose(file_);
}

ps::Status CriteoReader::Open(const std::string& path) {
  path_ = path;
  file_ = std::fopen(path.c_str(), "r");
  if (file_ == nullptr) {
    return ps::Status::IOError("'" + path + "': " + std::strerror(errno));
  }
  return ps::Status::OK();
}

ps::Status CriteoReader::Read(size_t n, Samples* out, size_t* got) {
  *got = 0;
  char* buf = nullptr;
  size_t cap = 0;
  ps::Status st;
  while (*got < n) {
    const ssize_t len = getline(&buf, &cap, file_);
    if (len < 0) break;
    ++line_;
    std::string text(buf, static_cast<size_t>(len));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
      text.pop_back();
    st = ParseLine(text, out);
    if (!st.ok()) break;
    ++*got;
  }
  std::free(buf);
  if (st.ok() && std::ferror(file_)) {
    st = ps::Status::IOError("'" + path_ + "': read error after line " +
                             std::to_string(line_));
  }
  return st;
}

ps::Status CriteoReader::ParseLine(const std::string& text,
                                   Samples* out) const {
  std::vector<std::string> cols;
  size_t start = 0;
  while (true) {
    const size_t tab = text.find('\t', start);
    cols.push_back(
        text.substr(start, tab == std::string::npos ? tab : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  const std::string where =
      "'" + path_ + "' line " + std::to_string(line_) + ": ";
  if (cols.size() != 1 + kFields) {
    return ps::Status::InvalidArgument(
        where + std::to_string(cols.size()) +
        " tab-separated fields, expected 40 (label, I1..I13, C1..C26)");
  }
  if (cols[0] != "0" && cols[0] != "1") {
    return ps::Status::InvalidArgument(where + "label '" + cols[0] +
                                       "' is not 0 or 1");
  }
  std::vector<uint64_t> ids(kFields);
  for (int f = 0; f < kFields; ++f) {
    const std::string& c = cols[1 + f];
    uint64_t value = kMissing;
    if (!c.empty()) {
      const bool count = f < kCountFields;
      char* end = nullptr;
      errno = 0;
      if (count) {
        const long long x = std::strtoll(c.c_str(), &end, 10);
        value = CountBucket(x);
      } else {
        value = std::strtoull(c.c_str(), &end, 16);
      }
      if (errno != 0 || end != c.c_str() + c.size() ||
          (c[0] == '-' && !count) ||
          std::isspace(static_cast<unsigned char>(c[0]))) {
        const std::string name =
            count ? "I" + std::to_string(f + 1)
                  : "C" + std::to_string(f - kCountFields + 1);
        return ps::Status::InvalidArgument(
            where + name + " '" + c + "' is not " +
            (count ? "an integer" : "a hex string of at most 16 digits"));
      }
    }
    ids[f] = FeatureId(f, value);
  }
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  out->labels.push_back(cols[0] == "1" ? 1.0f : 0.0f);
  return ps::Status::OK();
}

ps::StatusOr<uint64_t> CountLines(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return ps::Status::IOError("'" + path + "': " + std::strerror(errno));
  }
  uint64_t lines = 0;
  char buf[1 << 16];
  char last = '\n';
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    lines += static_cast<uint64_t>(std::count(buf, buf + n, '\n'));
    last = buf[n - 1];
  }
  std::fclose(f);
  return lines + (last != '\n');
}

}  // namespace ctr
