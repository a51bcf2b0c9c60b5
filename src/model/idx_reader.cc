// IDX parsing and gzip decompression with zlib (see idx_reader.h).
#include "model/idx_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

namespace ps {
namespace model {
namespace {

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

}  // namespace

StatusOr<std::vector<uint8_t>> ReadFileMaybeGzip(const std::string& path) {
  // gzread passes a file without the gzip magic through unchanged, so one
  // path serves both raw and compressed files.
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) {
    return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  }
  std::vector<uint8_t> out;
  constexpr unsigned kChunk = 1 << 20;
  for (;;) {
    const size_t old = out.size();
    out.resize(old + kChunk);
    const int got = gzread(f.get(), out.data() + old, kChunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f.get(), &err);
      return Status::IOError(path + ": gzip: " + msg);
    }
    out.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  // A gzip stream cut short reads as end of file; zlib reports it here.
  int err = Z_OK;
  const char* msg = gzerror(f.get(), &err);
  if (err != Z_OK) return Status::IOError(path + ": gzip: " + msg);
  return out;
}

StatusOr<IdxArray> ReadIdx(const std::string& path, uint32_t magic) {
  auto bytes_or = ReadFileMaybeGzip(path);
  if (!bytes_or.ok()) return bytes_or.status();
  const std::vector<uint8_t>& bytes = *bytes_or;
  if (bytes.size() < 4) {
    return Status::Corruption(path +
                              ": truncated: " + std::to_string(bytes.size()) +
                              " bytes, too short for an IDX magic number");
  }
  const uint32_t got_magic = BigEndian32(bytes.data());
  if (got_magic != magic) {
    return Status::Corruption(path + ": bad magic " + Hex32(got_magic) +
                              ", expected " + Hex32(magic));
  }
  const size_t ndims = magic & 0xff;
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    return Status::Corruption(path + ": truncated: header needs " +
                              std::to_string(header) + " bytes, file has " +
                              std::to_string(bytes.size()));
  }
  IdxArray out;
  std::ostringstream shape;
  size_t payload = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const uint32_t d = BigEndian32(bytes.data() + 4 + 4 * i);
    out.dims.push_back(d);
    payload *= d;
    shape << (i ? "x" : "") << d;
  }
  const size_t have = bytes.size() - header;
  if (have != payload) {
    return Status::Corruption(
        path + ": " + (have < payload ? "truncated" : "trailing bytes") +
        ": header says " + shape.str() + " = " + std::to_string(payload) +
        " bytes of " + (ndims == 1 ? "labels" : "pixels") + ", file has " +
        std::to_string(have));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header),
                  bytes.end());
  return out;
}

}  // namespace model
}  // namespace ps
