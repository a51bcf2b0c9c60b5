#include "postoffice/logging.h"

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>

namespace ps {

void DefaultLogsToStderr() {
  if (std::getenv("GLOG_logtostderr") != nullptr) return;  // the user's
  gflags::CommandLineFlagInfo info;
  if (!gflags::GetCommandLineFlagInfo("logtostderr", &info) ||
      !info.is_default) {
    return;  // set by the program or on its command line
  }
  const bool files = !FLAGS_log_dir.empty() || FLAGS_alsologtostderr;
  if (FLAGS_logtostderr == !files) return;  // as it should be: no write
  gflags::SetCommandLineOptionWithMode("logtostderr", files ? "false" : "true",
                                       gflags::SET_FLAGS_DEFAULT);
}

namespace {
// Before main: lines logged before a node starts go to stderr too.
[[maybe_unused]] const bool kDefaultLogsToStderr =
    (DefaultLogsToStderr(), true);
}  // namespace

void Tell(google::LogSeverity severity, const std::string& line) {
  // With --logtostderr glog would print it a second time.
  if (!FLAGS_logtostderr) {
    google::LogMessage(__FILE__, __LINE__, severity).stream() << line;
  }
  std::fprintf(stderr, "ps: %s\n", line.c_str());
}

std::string Seconds(int64_t ms) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.1f s", static_cast<double>(ms) / 1000);
  return s;
}

}  // namespace ps
