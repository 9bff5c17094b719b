// launch: the kernelrl command line. See README.md for every subcommand.
#include "launch/commands.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* usage =
    "usage:\n"
    "  launch CONFIG [--run-dir DIR] [--log-level LEVEL]   run the experiment CONFIG describes\n"
    "  launch check CONFIG                                 validate CONFIG, print it resolved\n"
    "  launch export RUN_DIR --jsonl                       print every sample as one JSON line\n"
    "  launch version                                      versions of kernelrl and LibTorch\n"
    "LEVEL: trace, debug, info, warn, error, off (default: [cluster] log_level)\n";

int bad(const std::string& msg) {
  std::fprintf(stderr, "launch: %s\n%s", msg.c_str(), usage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return bad("missing CONFIG or subcommand");
  const std::string& cmd = args[0];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  if (cmd == "version") return kernelrl::cmd_version();
  if (cmd == "check") {
    if (args.size() != 2) return bad("check takes exactly one CONFIG");
    return kernelrl::cmd_check(args[1]);
  }
  if (cmd == "export") {
    if (args.size() != 3 || args[2] != "--jsonl") return bad("usage: launch export RUN_DIR --jsonl");
    return kernelrl::cmd_export(args[1]);
  }
  std::string config = cmd, run_dir, level;
  for (size_t i = 1; i < args.size(); ++i) {
    if ((args[i] == "--run-dir" || args[i] == "--log-level") && i + 1 < args.size()) {
      (args[i] == "--run-dir" ? run_dir : level) = args[i + 1];
      ++i;
    } else {
      return bad("unknown argument \"" + args[i] + "\"");
    }
  }
  return kernelrl::cmd_run(config, run_dir, level);
}
