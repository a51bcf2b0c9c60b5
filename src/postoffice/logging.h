// Where a node's log lines go. glog writes log files only when the user asks
// for them: a log directory (GLOG_log_dir, --log_dir), GLOG_logtostderr or
// --logtostderr given either way, or --alsologtostderr; otherwise every line
// goes to stderr, and a job leaves no files in /tmp.
#ifndef PS_POSTOFFICE_LOGGING_H_
#define PS_POSTOFFICE_LOGGING_H_

#include <glog/logging.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ps {

// Makes stderr glog's default destination unless the user asked for files
// (above). Runs when the program starts, and again when a node starts
// (after the program parsed its command line, which may name --log_dir);
// changes --logtostderr's default only, never a value the user set.
void DefaultLogsToStderr();

// Tells the person running the job `line`: on stderr as "ps: LINE", and
// in glog's log files at `severity` when it writes any.
void Tell(google::LogSeverity severity, const std::string& line);

// `ms` milliseconds as the lines about long waits say them: "10.0 s".
std::string Seconds(int64_t ms);

// Whole milliseconds from `t` to `now` (negative if now is earlier).
inline int64_t MsSince(std::chrono::steady_clock::time_point t,
                       std::chrono::steady_clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
}

}  // namespace ps

#endif  // PS_POSTOFFICE_LOGGING_H_
