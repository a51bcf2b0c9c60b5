// ConfigOptions and the two listings made from it: the plain text
// `ps_options` prints and docs/environment.md.
#include "postoffice/options.h"

#include <sstream>
#include <string>
#include <vector>

#include "ps/config.h"

namespace ps {

namespace {

// "integer in [lo, hi]" or "text".
std::string TypeOf(const ConfigOption& o) {
  if (o.type == ConfigOption::kText) return "text";
  return "integer in [" + std::to_string(o.lo) + ", " + std::to_string(o.hi) +
         "]";
}

// "required", "unset" or "default D".
std::string DefaultOf(const ConfigOption& o) {
  std::string d = o.default_value;
  return d == "required" || d == "unset" ? d : "default " + d;
}

// `text` in lines of at most 76 characters (longer words stay whole),
// each indented by 4 and ended by a newline.
std::string Wrap(const std::string& text) {
  std::istringstream words(text);
  std::string out, line, word;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > 72) {
      out += "    " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += "    " + line + "\n";
  return out;
}

// Markdown table cells: no '|' and no line break.
std::string Cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch == '\n' ? ' ' : ch;
  }
  return out;
}

const char kMarkdownIntro[] = R"(# Environment and flags

<!-- Generated from src/postoffice/options.def by `ps_options --markdown`;
do not edit: edit the table there, then run
`cmake --build build --target environment_md`. The unit test
Options.EnvironmentDocIsGenerated fails while this file differs. -->

A node reads its configuration once, when it is made (`ps::Start`, or
`Config::FromEnvAndFlags`), from the environment variables below and the
`--ps_*` gflags that override them. Each option takes

1. its flag, when the program parsed or set it (a text flag that is not
   empty, a number flag that is not -1);
2. else its variable, from `ps::Environment::Init` or else the process
   environment;
3. else its default ("required": the node does not start without it).

`--ps_interface` also wins over `DMLC_NODE_HOST`. ps-lite's names (the rows
without a flag that say so) are read too; where both names are set, ours
wins. Python's `ps.start()` reads the environment only. A bad value stops
the node with an error that names the variable or flag and the value:
`DMLC_NUM_SERVER='0' is not a positive integer`, `--ps_num_servers='0' is
not a positive integer`.

`ps_options` (build/src/ps_options) prints this list; `ps_options --check
[--ps_* flags]` prints the configuration that this environment and these
flags give, or the error.

| variable | flag | type | default | meaning |
| --- | --- | --- | --- | --- |
)";

const char kMarkdownOutro[] = R"(
## What is not a node option

- **A program's own flags** (`mnist_dist --epochs`, `--batch_size`,
  `--on_worker_failure`, ...; `mnist_local`'s; the benchmarks') configure
  that program, not its node: `PROGRAM --help` lists them, and the `--ps_*`
  flags with them (their help lines come from the same table as this page).
- **The launcher's variables**: tracker/launch.py sets `DMLC_ROLE`,
  `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`, `DMLC_NUM_SERVER`,
  `DMLC_NUM_WORKER`, `DMLC_NODE_HOST`, `PS_RANK`, `PS_KEY_FD` (or
  `PS_KEY_FILE`) and `PS_MAX_RESTARTS` (above) for each process it
  starts, `PS_METRICS_PORT=0` (above) with `--metrics DIR` (and
  `PS_METRICS_TOKEN_FILE` with `--metrics-token-file FILE`),
  and `PS_RESTART_COUNT=k` in a process's k-th restart: the
  library does not read that one; a program may. `PS_LAUNCH_SCHEDULER_NODE`,
  `PS_LAUNCH_NODE_ADDRS` and `PS_LAUNCH_WORKER_PROCESSES` pass between
  launch.py's own processes.
  `launch.py --help` lists its options.
- **The build's**: `PS_BUILD_DIR` and `PS_CMAKE_ARGS` (pip's build backend,
  python/ps_build_backend.py) and the `PS_*` CMake options (README), with
  `PS_PSLITE_SOURCE_DIR` (a ps-lite checkout whose own tests the suite
  runs, docs/pslite.md) and `PS_PLOT_PYTHON` (a Python with matplotlib for
  the tests that draw plots; default /usr/bin/python3).
- **The scripts' and tests'**: `PS_FUZZ_SECONDS` (scripts/test.sh),
  `PS_PYTHON_DEPS` and `PS_CLUSTER_DEPS` (scripts/install_deps.sh),
  `PS_PYTHONPATH` (where the Python tests and benchmarks find the built
  module), `PS_LOCAL_TIMEOUT` and `PS_LOCAL_WORKER_PROCESSES`
  (tests/pslite/local.sh), `PS_ALLOW_MISSING_PROMETHEUS`
  (tests/tracker/test_metrics.py skips, instead of failing, without
  Debian's prometheus), `PS_UPDATE_GOLDEN` (tests/core/protocol_sim_test.cc
  writes the scenarios' outputs into their files instead of checking them).
- **Programs' choices**: `PS_COMPRESS` (compression on the wire,
  docs/compression.md) is read by mnist_dist (when `--compress` is not
  given) and by the Python module, not by the node: a C++ program adds a
  `ps::Compressor` itself.
- **Code**: `PS_VLOG` is ps-lite's logging macro (ps/internal/postoffice.h).
- **Logging** (glog): a node logs to stderr; it writes log files only when
  asked to, by `GLOG_log_dir=DIR` or `--log_dir=DIR` (files in DIR) or by
  `GLOG_logtostderr=0` or `--logtostderr=false` (files where glog puts them:
  `$TMPDIR`, else /tmp). glog's other variables and flags (`GLOG_v`,
  `--minloglevel`, ...) work as glog documents them.
)";

}  // namespace

const std::vector<ConfigOption>& ConfigOptions() {
  static const std::vector<ConfigOption> options(std::begin(kConfigOptions),
                                                 std::end(kConfigOptions));
  return options;
}

std::string ConfigOptionsHelp() {
  std::ostringstream os;
  os << "Node options: each is an environment variable, and most have a\n"
        "--ps_* flag that wins over it (docs/environment.md says more).\n";
  for (const ConfigOption& o : kConfigOptions) {
    os << "\n" << o.variable;
    if (o.flag != nullptr) os << ", --" << o.flag;
    if (o.alias_of != nullptr) os << " (" << o.alias_of << " wins)";
    std::string type = TypeOf(o);
    if (o.type == ConfigOption::kText) type += ": " + std::string(o.values);
    os << "\n" << Wrap(type + "; " + DefaultOf(o)) << Wrap(o.doc);
  }
  return os.str();
}

std::string ConfigOptionsMarkdown() {
  std::ostringstream os;
  os << kMarkdownIntro;
  for (const ConfigOption& o : kConfigOptions) {
    std::string meaning = o.doc;
    if (o.alias_of != nullptr) {
      meaning += std::string(" (`") + o.alias_of + "` wins)";
    }
    std::string type = TypeOf(o);
    if (o.type == ConfigOption::kText) type += ": " + std::string(o.values);
    os << "| `" << o.variable << "` | "
       << (o.flag != nullptr ? "`--" + std::string(o.flag) + "`" : "-") << " | "
       << Cell(type) << " | " << Cell(o.default_value) << " | " << Cell(meaning)
       << " |\n";
  }
  os << kMarkdownOutro;
  return os.str();
}

}  // namespace ps
