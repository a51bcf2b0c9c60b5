// Reader for the IDX files of MNIST and Fashion-MNIST, raw or gzipped (told
// apart by the gzip magic 0x1f8b). Every check (magic, dimensions, sizes) gives
// a Status whose message names the file and what is wrong.
#ifndef PS_MODEL_IDX_READER_H_
#define PS_MODEL_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ps/status.h"

namespace ps {
namespace model {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dims
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dim

// An IDX array of unsigned bytes: dims (e.g. {60000, 28, 28}) and the
// row-major payload.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads the whole file (decompressing gzip) into memory. NotFound when it
// cannot be opened, IOError on a read or gzip error.
StatusOr<std::vector<uint8_t>> ReadFileMaybeGzip(const std::string& path);

// Reads an IDX file and checks that its magic is `magic` and that the payload
// is exactly the product of its dimensions (Corruption otherwise).
StatusOr<IdxArray> ReadIdx(const std::string& path, uint32_t magic);

}  // namespace model
}  // namespace ps

#endif  // PS_MODEL_IDX_READER_H_
