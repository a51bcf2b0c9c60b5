// What ps-lite's ps/internal/utils.h gives its users: glog's LOG and CHECK
// macros, LL (an always-printed log line), DISALLOW_COPY_AND_ASSIGN, and the
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

// A log line printed whatever the log level (ps-lite's LL).
#ifndef LL
#define LL LOG(ERROR)
#endif

#ifndef DISALLOW_COPY_AND_ASSIGN
#define DISALLOW_COPY_AND_ASSIGN(T) \
  T(const T&) = delete;             \
  void operator=(const T&) = delete
#endif

#endif  // PS_INTERNAL_UTILS_H_
