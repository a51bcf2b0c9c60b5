// ReadSecretKey: the job's secret key from a key file (PS_KEY_FILE);
// ReadSecretKeyFromFd: the same from an inherited descriptor (PS_KEY_FD).
#ifndef PS_POSTOFFICE_KEY_FILE_H_
#define PS_POSTOFFICE_KEY_FILE_H_

#include <string>

#include "ps/status.h"

namespace ps {

// A key file is a small regular file (at most kMaxKeyFileBytes) whose first
// line is a Z85 job key (32 bytes in 40 characters; trailing spaces and a
// '\r' are dropped). Anything else, a device, a pipe or a directory
// included, is refused without reading it: InvalidArgument naming `name`
// (e.g. "PS_KEY_FILE='/dev/zero'") and what is wrong.
inline constexpr long kMaxKeyFileBytes = 4096;
StatusOr<std::string> ReadSecretKey(const std::string& name,
                                    const std::string& path);

// The key from open descriptor `fd`, which holds what a key file holds: a
// regular file (a memfd, say) of at most kMaxKeyFileBytes, read from its
// start without moving its offset (other processes may share it), or a
// pipe, read up to its first newline (at most kMaxKeyFileBytes, within
// kKeyPipeTimeoutMs). The descriptor is closed once read, so a process
// reads it once and its children never inherit it. A closed descriptor, a
// socket, a device, a larger file or a pipe that stays empty is refused:
// InvalidArgument naming `name` (e.g. "PS_KEY_FD='7'") and what is wrong.
inline constexpr int kKeyPipeTimeoutMs = 10000;
StatusOr<std::string> ReadSecretKeyFromFd(const std::string& name, int fd);

}  // namespace ps

#endif  // PS_POSTOFFICE_KEY_FILE_H_
