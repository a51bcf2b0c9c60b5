// ps_options: the node options of src/postoffice/options.def.
//   ps_options                  every option: variable, flag, values, default
//   ps_options --markdown       docs/environment.md (--out FILE writes it)
//   ps_options --check [--ps_*] the configuration this environment and these
//                               flags give a node, or the error (exit 1)
#include <gflags/gflags.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "ps/config.h"

DEFINE_bool(markdown, false, "print docs/environment.md");
DEFINE_string(out, "", "with --markdown: write it to this file");
DEFINE_bool(check, false,
            "print the configuration the environment and the --ps_* flags "
            "give, or the error");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "lists the node options (DMLC_*/PS_* variables and their --ps_* "
      "flags); --markdown: docs/environment.md; --check: the configuration "
      "they give");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "ps_options: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  if (FLAGS_check) {
    ps::StatusOr<ps::Config> config = ps::Config::FromEnvAndFlags();
    if (!config.ok()) {
      std::fprintf(stderr, "ps_options: %s\n",
                   config.status().message().c_str());
      return 1;
    }
    std::cout << config->ToString() << "\n";
    return 0;
  }
  if (!FLAGS_markdown) {
    std::cout << ps::ConfigOptionsHelp();
    return 0;
  }
  if (FLAGS_out.empty()) {
    std::cout << ps::ConfigOptionsMarkdown();
    return 0;
  }
  std::ofstream out(FLAGS_out, std::ios::binary | std::ios::trunc);
  out << ps::ConfigOptionsMarkdown();
  out.close();
  if (!out) {
    std::fprintf(stderr, "ps_options: cannot write --out='%s'\n",
                 FLAGS_out.c_str());
    return 1;
  }
  return 0;
}
