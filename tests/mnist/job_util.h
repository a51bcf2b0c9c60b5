// What the end-to-end suites of tests/mnist share: running a command (the
// tracker and its job), reading files and the job's output, and finding the
// job's processes in /proc (to kill or freeze one from outside).
#ifndef PS_TESTS_MNIST_JOB_UTIL_H_
#define PS_TESTS_MNIST_JOB_UTIL_H_

#include <dirent.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

namespace mnist_test {

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr
};

// Runs `cmd` through sh with stderr joined to stdout.
inline Result Shell(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// Worker 0's "final: test accuracy N%" as printed ("none": no such line).
inline std::string FinalAccuracyText(const std::string& out) {
  std::smatch m;
  std::regex re(R"(\[worker 0\] final: test accuracy ([0-9.]+)%)");
  return std::regex_search(out, m, re) ? m[1].str() : "none";
}
// The same as a number (-1: no such line).
inline double FinalAccuracy(const std::string& out) {
  std::string text = FinalAccuracyText(out);
  return text == "none" ? -1.0 : std::stod(text);
}

// The processes whose environment holds every one of `vars` (KEY=VALUE)
// and, unless parent < 0, whose parent is `parent`.
inline std::vector<int> ProcessesWith(const std::vector<std::string>& vars,
                                      int parent = -1) {
  std::vector<int> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string dir = "/proc/" + std::string(e->d_name);
    if (parent >= 0) {
      // pid (comm) state ppid ...: comm may hold spaces, so after the
      // last ')'.
      std::string stat = ReadBytes(dir + "/stat");
      const size_t close = stat.rfind(')');
      int ppid = -1;
      if (close == std::string::npos ||
          std::sscanf(stat.c_str() + close + 1, " %*c %d", &ppid) != 1 ||
          ppid != parent) {
        continue;
      }
    }
    const std::string env = ReadBytes(dir + "/environ");
    std::vector<std::string> entries;
    for (size_t at = 0; at < env.size();) {
      size_t end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      entries.push_back(env.substr(at, end - at));
      at = end + 1;
    }
    if (std::all_of(vars.begin(), vars.end(), [&](const std::string& v) {
          return std::find(entries.begin(), entries.end(), v) != entries.end();
        })) {
      found.push_back(pid);
    }
  }
  closedir(proc);
  return found;
}

}  // namespace mnist_test

#endif  // PS_TESTS_MNIST_JOB_UTIL_H_
