// The option table (src/postoffice/options.def) against what is made from
// it and what documents it: docs/environment.md, the --ps_* flags and their
// help, Config's defaults, the parser and its errors, and the options the
// other docs name.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "postoffice/logging.h"
#include "ps/config.h"

namespace ps {
namespace {

using Env = std::map<std::string, std::string>;

std::string ReadSourceFile(const std::string& path) {
  std::ifstream in(std::string(PS_SOURCE_DIR) + "/" + path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A job of 2 servers (so that PS_REPLICAS=1 is valid) and 1 worker.
Env BaseEnv() {
  return {{"DMLC_ROLE", "worker"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "1"}};
}

// Every field of a Config, for comparing two.
std::string Fields(const Config& c) {
  return c.ToString() + " verbose=" + std::to_string(c.verbose) +
         " port_range=" + std::to_string(c.port_range_lo) + "-" +
         std::to_string(c.port_range_hi);
}

std::string FieldsOf(const Env& env) {
  StatusOr<Config> c = Config::FromEnv(env);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? Fields(*c) : "";
}

bool IsNumber(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

TEST(Options, EnvironmentDocIsGenerated) {
  std::string committed = ReadSourceFile("docs/environment.md");
  std::string generated = ConfigOptionsMarkdown();
  if (committed == generated) return;
  std::istringstream a(committed), b(generated);
  std::string la, lb;
  int line = 1;
  while (std::getline(a, la) && std::getline(b, lb) && la == lb) ++line;
  ADD_FAILURE() << "docs/environment.md differs from the table at line " << line
                << ":\n  file:  " << la << "\n  table: " << lb
                << "\nRun: cmake --build build --target environment_md";
}

TEST(Options, EveryRowIsWellFormed) {
  std::set<std::string> variables, flags;
  for (const ConfigOption& o : ConfigOptions()) {
    SCOPED_TRACE(o.variable);
    EXPECT_TRUE(variables.insert(o.variable).second) << "twice";
    if (o.flag != nullptr) {
      EXPECT_TRUE(flags.insert(o.flag).second);
    }
    EXPECT_TRUE(std::regex_match(o.variable, std::regex("(DMLC|PS)_[A-Z_]+")));
    EXPECT_NE(std::string(o.doc), "");
    EXPECT_NE(std::string(o.values), "");
    if (o.alias_of != nullptr) {
      EXPECT_EQ(o.flag, nullptr);
      EXPECT_TRUE(variables.count(o.alias_of)) << "main name comes first";
    }
    std::string d = o.default_value;
    if (o.type != ConfigOption::kText && IsNumber(d)) {
      EXPECT_LE(o.lo, std::stoll(d));
      EXPECT_LE(std::stoll(d), o.hi);
    }
    if (o.type == ConfigOption::kText) {
      EXPECT_EQ(o.lo, 0);
    } else if (o.type == ConfigOption::kInt) {
      EXPECT_LE(o.hi, 2147483647);
    }
  }
}

// The --ps_* flags are the table's: each row's flag exists with its type,
// "not set" as its default and the row's variable and doc in its help; no
// --ps_* flag is outside the table.
TEST(Options, FlagsAreTheTables) {
  std::map<std::string, const ConfigOption*> by_flag;
  for (const ConfigOption& o : ConfigOptions()) {
    if (o.flag != nullptr) by_flag[o.flag] = &o;
  }
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  size_t seen = 0;
  for (const auto& f : all) {
    if (f.name.rfind("ps_", 0) != 0) continue;
    SCOPED_TRACE(f.name);
    auto it = by_flag.find(f.name);
    ASSERT_NE(it, by_flag.end()) << "--" << f.name << " is not in the table";
    const ConfigOption& o = *it->second;
    ++seen;
    const char* type = o.type == ConfigOption::kText  ? "string"
                       : o.type == ConfigOption::kInt ? "int32"
                                                      : "int64";
    EXPECT_EQ(f.type, type);
    EXPECT_EQ(f.default_value, o.type == ConfigOption::kText ? "" : "-1");
    EXPECT_NE(f.description.find(std::string("overrides ") + o.variable),
              std::string::npos)
        << f.description;
    EXPECT_NE(f.description.find(o.doc), std::string::npos) << f.description;
  }
  EXPECT_EQ(seen, by_flag.size());
}

// A documented default, set explicitly, changes nothing; another value of
// the option does (DMLC_LOCAL only checks PS_SHM): the default is Config's.
TEST(Options, DocumentedDefaultsAreTheDefaults) {
  const std::string base = FieldsOf(BaseEnv());
  for (const ConfigOption& o : ConfigOptions()) {
    std::string d = o.default_value;
    if (d == "required" || d == "unset") continue;
    SCOPED_TRACE(o.variable);
    Env env = BaseEnv();
    env[o.variable] = d;
    EXPECT_EQ(FieldsOf(env), base);
    if (o.type == ConfigOption::kText ||
        o.variable == std::string("DMLC_LOCAL"))
      continue;
    int64_t v = std::stoll(d);
    env[o.variable] = std::to_string(v + 1 <= o.hi ? v + 1 : v - 1);
    EXPECT_NE(FieldsOf(env), base);
  }
}

TEST(Options, RequiredOptionsAreRequired) {
  for (const ConfigOption& o : ConfigOptions()) {
    Env env = BaseEnv();
    bool required = std::string(o.default_value) == "required";
    EXPECT_EQ(env.count(o.variable), required ? 1u : 0u) << o.variable;
    if (!required) continue;
    env.erase(o.variable);
    EXPECT_EQ(
        Config::FromEnv(env).status().message(),
        std::string(o.variable) + " is not set (expected " + o.values + ")");
  }
}

// Each row's variable and flag are read, and a bad value is named with the
// row's words.
TEST(Options, EveryOptionIsReadAndNamedInItsErrors) {
  const std::string base = FieldsOf(BaseEnv());
  for (const ConfigOption& o : ConfigOptions()) {
    SCOPED_TRACE(o.variable);
    const bool text = o.type == ConfigOption::kText;
    Env env = BaseEnv();
    env[o.variable] = "x";
    StatusOr<Config> c = Config::FromEnv(env);
    // A secret (PS_JOB_TOKEN) is named without its value.
    const bool secret = std::string(o.variable) == "PS_JOB_TOKEN";
    std::string named = std::string(o.variable) + (secret ? " (" : "='x'");
    if (!text) {
      EXPECT_EQ(c.status().message(), named + " is not " + o.values);
    } else if (!c.ok()) {
      EXPECT_EQ(c.status().message().rfind(named, 0), 0u) << c.status();
    } else {
      EXPECT_NE(Fields(*c), base);
    }
    if (o.flag == nullptr) continue;
    gflags::FlagSaver restore_flags_at_exit;
    const char* bad = text ? "x" : "-5";
    ASSERT_FALSE(gflags::SetCommandLineOption(o.flag, bad).empty());
    c = Config::FromEnvAndFlags(BaseEnv());
    named = std::string("--") + o.flag +
            (secret ? std::string(" (") : "='" + std::string(bad) + "'");
    if (!text) {
      EXPECT_EQ(c.status().message(), named + " is not " + o.values);
    } else if (!c.ok()) {
      EXPECT_EQ(c.status().message().rfind(named, 0), 0u) << c.status();
    } else {
      EXPECT_NE(Fields(*c), base);
    }
  }
}

TEST(Options, HelpListsEveryOption) {
  std::string help = ConfigOptionsHelp();
  for (const ConfigOption& o : ConfigOptions()) {
    std::string head = std::string("\n") + o.variable;
    if (o.flag != nullptr) head += std::string(", --") + o.flag;
    if (o.alias_of != nullptr)
      head += std::string(" (") + o.alias_of + " wins)";
    EXPECT_NE(help.find(head + "\n"), std::string::npos) << o.variable;
  }
}

// Every DMLC_*/PS_* name the other docs give is an option, or one of the
// variables docs/environment.md lists as not a node option.
TEST(Options, OtherDocsNameOnlyOptions) {
  std::set<std::string> known;
  for (const ConfigOption& o : ConfigOptions()) known.insert(o.variable);
  const std::string md = ConfigOptionsMarkdown();
  const std::string not_options =
      md.substr(md.find("## What is not a node option"));
  std::vector<std::string> docs = {"README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(
           std::string(PS_SOURCE_DIR) + "/docs")) {
    std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".md" && name != "environment.md") {
      docs.push_back("docs/" + name);
    }
  }
  const std::regex name("\\b(DMLC|PS)_[A-Z0-9_]*[A-Z0-9]\\b");
  for (const std::string& doc : docs) {
    std::string text = ReadSourceFile(doc);
    for (std::sregex_iterator it(text.begin(), text.end(), name), end;
         it != end; ++it) {
      std::string n = it->str();
      if (known.count(n)) continue;
      EXPECT_NE(not_options.find("`" + n), std::string::npos)
          << doc << " names " << n
          << ", which is neither an option of src/postoffice/options.def nor "
             "listed in docs/environment.md as not a node option";
    }
  }
}

// glog writes to stderr unless the user asks for files: a log directory,
// or --logtostderr set either way (the flag is the user's then).
TEST(Logging, StderrUnlessFilesAreAskedFor) {
  if (std::getenv("GLOG_logtostderr") != nullptr ||
      std::getenv("GLOG_log_dir") != nullptr) {
    GTEST_SKIP() << "the environment chooses glog's destination";
  }
  gflags::FlagSaver restore_flags_at_exit;
  EXPECT_TRUE(FLAGS_logtostderr) << "from the start";
  EXPECT_EQ(gflags::GetCommandLineFlagInfoOrDie("logtostderr").default_value,
            "true");
  gflags::SetCommandLineOption("log_dir", testing::TempDir().c_str());
  DefaultLogsToStderr();
  EXPECT_FALSE(FLAGS_logtostderr) << "files in --log_dir";
  gflags::SetCommandLineOption("log_dir", "");
  DefaultLogsToStderr();
  EXPECT_TRUE(FLAGS_logtostderr);
  gflags::SetCommandLineOption("logtostderr", "false");
  DefaultLogsToStderr();
  EXPECT_FALSE(FLAGS_logtostderr) << "the user's choice stays";
}

}  // namespace
}  // namespace ps
