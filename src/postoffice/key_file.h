// ReadSecretKey: the job's CurveZMQ secret key from a key file (PS_KEY_FILE).
#ifndef PS_POSTOFFICE_KEY_FILE_H_
#define PS_POSTOFFICE_KEY_FILE_H_

#include <string>

#include "ps/status.h"

namespace ps {

// A key file is a small regular file (at most kMaxKeyFileBytes) whose first
// line is a Z85 CurveZMQ secret key (40 characters; trailing spaces and a
// '\r' are dropped). Anything else, a device, a pipe or a directory
// included, is refused without reading it: InvalidArgument naming `name`
// (e.g. "PS_KEY_FILE='/dev/zero'") and what is wrong.
inline constexpr long kMaxKeyFileBytes = 4096;
StatusOr<std::string> ReadSecretKey(const std::string& name,
                                    const std::string& path);

}  // namespace ps

#endif  // PS_POSTOFFICE_KEY_FILE_H_
