// ReadBearerToken: the token a scrape of /metrics must present
// (PS_METRICS_TOKEN_FILE), from a file checked as a key file is
// (postoffice/key_file.h): a small regular file, read once.
#ifndef PS_SRC_METRICS_TOKEN_FILE_H_
#define PS_SRC_METRICS_TOKEN_FILE_H_

#include <string>

#include "ps/status.h"

namespace ps {

// A token file is a regular file of at most kMaxTokenFileBytes whose first
// line is the token: 16 to 256 printable ASCII characters without spaces
// (trailing spaces and a '\r' are dropped; Prometheus's credentials_file
// reads the same file). Anything else, a device, a FIFO or a directory
// included, is refused without reading it: InvalidArgument naming `name`
// (e.g. "PS_METRICS_TOKEN_FILE='/dev/zero'") and what is wrong, never the
// token.
inline constexpr long kMaxTokenFileBytes = 4096;
StatusOr<std::string> ReadBearerToken(const std::string& name,
                                      const std::string& path);

}  // namespace ps

#endif  // PS_SRC_METRICS_TOKEN_FILE_H_
