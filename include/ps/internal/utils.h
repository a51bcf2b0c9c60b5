// What ps-lite's ps/internal/utils.h gives its users: glog's LOG and CHECK
// macros (ps-lite's come from its bundled dmlc/logging.h), LL (an
// always-printed log line), LG, GetEnv, DISALLOW_COPY_AND_ASSIGN, and the
// standard headers ps-lite's ps.h brings in, so that ps-lite programs that
// lean on them compile unchanged.
#ifndef PS_INTERNAL_UTILS_H_
#define PS_INTERNAL_UTILS_H_

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ps/internal/env.h"

// A log line printed whatever the log level (ps-lite's LL).
#ifndef LL
#define LL LOG(ERROR)
#endif

// An info log line (dmlc/logging.h's LG).
#ifndef LG
#define LG LOG(INFO)
#endif

namespace ps {

// The value of `key` (Environment::find: set from code, else the process
// environment's), converted as V(value); `default_val` when unset.
template <typename V>
inline V GetEnv(const char* key, V default_val) {
  const char* val = Environment::Get()->find(key);
  return val == nullptr ? default_val : V(val);
}

// The same for an int: atoi(value) (0 for a value that is not a number).
inline int GetEnv(const char* key, int default_val) {
  const char* val = Environment::Get()->find(key);
  return val == nullptr ? default_val : std::atoi(val);
}

}  // namespace ps

#ifndef DISALLOW_COPY_AND_ASSIGN
#define DISALLOW_COPY_AND_ASSIGN(T) \
  T(const T&) = delete;             \
  void operator=(const T&) = delete
#endif

#endif  // PS_INTERNAL_UTILS_H_
